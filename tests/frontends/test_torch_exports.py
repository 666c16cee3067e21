"""Models as PyTorch's exporter writes them, through every optimization level and both targets.

``nn.MultiheadAttention`` exported by the TorchScript exporter computes its reshape targets at
run time (``Shape -> Slice -> Concat -> Reshape``), with a Slice whose starts come from that
computation: the importer records fresh sizes there, folding makes them known, and the types
must follow (``metadef.passes.refine_types``) or the x86 compile's type check refuses the
graph. The same export bakes the traced sequence length into one Reshape: another length is
an InputError naming that Reshape, on the reference backend as on x86 (no out-of-bounds view).
A small segmentation decoder with a symbolic image size runs on x86 as one native program.
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


class _SmallUNet(torch.nn.Module):
    """Conv-BN-ReLU blocks, a max-pool, a ConvTranspose and a nearest 2x upsampling joined by
    a channel Slice, an Add and a skip Concat: the shape of a segmentation model's decoder."""

    def __init__(self) -> None:
        super().__init__()

        def block(i: int, o: int) -> torch.nn.Module:
            return torch.nn.Sequential(torch.nn.Conv2d(i, o, 3, padding=1), torch.nn.BatchNorm2d(o), torch.nn.ReLU())

        self.down, self.bottom = block(3, 8), block(8, 16)
        self.up = torch.nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.decode, self.out = block(16, 8), torch.nn.Conv2d(8, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = self.down(x)
        bottom = self.bottom(torch.nn.functional.max_pool2d(skip, 2))
        nearest = torch.nn.functional.interpolate(bottom, scale_factor=2.0, mode="nearest")[:, :8]
        return self.out(self.decode(torch.cat([skip, self.up(bottom) + nearest], 1)))


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("level", ["none", "aggressive"])
def test_a_segmentation_decoder_with_a_symbolic_image_size_runs_as_one_native_program(level: str) -> None:
    torch.manual_seed(0)
    buffer = io.BytesIO()
    torch.onnx.export(_SmallUNet().eval(), (torch.randn(1, 3, 32, 32),), buffer, input_names=["x"],
                      output_names=["y"], dynamic_axes={"x": {0: "n", 2: "h", 3: "w"}}, opset_version=17,
                      dynamo=False)
    model = onnx.load_from_string(buffer.getvalue())
    sess = md.compile(md.optimize(md.import_onnx(model), level=level), target="x86")
    assert not any(p.fallback for p in sess.executable.plan), sess.executable.summary()
    oracle = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for shape in ((1, 3, 32, 32), (2, 3, 48, 64)):
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(sess.run({"x": x})["y"], oracle.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
        program = sess.executable.programs.bound({"n": shape[0], "h": shape[2], "w": shape[3]})
        try:
            assert program.python_steps == 0, program.python_reasons
        finally:
            sess.executable.programs.give_back(program)
