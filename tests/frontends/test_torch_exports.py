"""Models as PyTorch's exporter writes them, through every optimization level and both targets.

``nn.MultiheadAttention`` exported by the TorchScript exporter computes its reshape targets at
run time (``Shape -> Slice -> Concat -> Reshape``), with a Slice whose starts come from that
computation: the importer records fresh sizes there, folding makes them known, and the types
must follow (``metadef.passes.refine_types``) or the x86 compile's type check refuses the
graph. The same export bakes the traced sequence length into one Reshape: another length is
an InputError naming that Reshape, on the reference backend as on x86 (no out-of-bounds view).
"""

from __future__ import annotations

import io

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import metadef as md
from metadef.core.errors import InputError, MetadefError

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")


class _Encoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(50, 32)
        self.norm = torch.nn.LayerNorm(32)
        self.attention = torch.nn.MultiheadAttention(32, 4, batch_first=True)
        self.head = torch.nn.Linear(32, 10)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.embed(ids))
        return self.head(x + self.attention(x, x, x, need_weights=False)[0])


@pytest.fixture(scope="module")
def exported() -> onnx.ModelProto:
    torch.manual_seed(0)
    buffer = io.BytesIO()
    torch.onnx.export(_Encoder().eval(), (torch.randint(0, 50, (2, 6)),), buffer, input_names=["ids"],
                      output_names=["logits"], dynamic_axes={"ids": {0: "b", 1: "s"}}, opset_version=17,
                      dynamo=False)
    return onnx.load_from_string(buffer.getvalue())


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("target", ["reference", "x86"])
@pytest.mark.parametrize("level", ["none", "safe", "moderate", "aggressive"])
def test_multihead_attention_as_torch_exports_it(exported: onnx.ModelProto, level: str, target: str) -> None:
    sess = md.compile(md.optimize(md.import_onnx(exported), level=level), target=target)
    oracle = ort.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch in (1, 3):  # the traced sequence length, any batch
        ids = np.random.default_rng(batch).integers(0, 50, (batch, 6)).astype(np.int64)
        np.testing.assert_allclose(sess.run({"ids": ids})["logits"], oracle.run(None, {"ids": ids})[0],
                                   rtol=1e-4, atol=1e-5)
    if target == "x86" and level != "none":
        assert not any(p.fallback for p in sess.executable.plan), sess.executable.summary()
    with pytest.raises((InputError, MetadefError), match=r"Reshape|reshape"):
        sess.run({"ids": np.zeros((2, 5), np.int64)})  # another length: the baked-in Reshape refuses
