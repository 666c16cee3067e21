"""The torch peer of ``metadef bench --vs torch``: the zoo models run with torch ops and agree
with ONNX Runtime; an op without a rule, and a missing torch, say so."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper

import metadef as md
from metadef.frontends.torch_peer import SUPPORTED_MODELS, torch_module
from metadef.testing.oracle import run_onnxruntime

pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")

TOLERANCE = {"mlp": 1e-5, "resnet50": 1e-4, "mobilenetv2": 1e-4, "bert": 1e-4}  # max |err| / max |ORT output|


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in ("resnet50", "bert") else n
                                  for n in SUPPORTED_MODELS])
def test_zoo_models_agree_with_onnxruntime(name: str) -> None:
    proto = md.zoo.build(name)
    feeds = md.zoo.describe(name).example_inputs(batch=2, **({"seq": 16} if name == "bert" else {}))
    got = torch_module(proto, threads=1).run(feeds)
    want = run_onnxruntime(proto, feeds)
    assert list(got) == list(want)
    for key, expected in want.items():
        assert got[key].shape == expected.shape and got[key].dtype == expected.dtype
        scale = float(np.abs(expected).max()) or 1.0
        assert float(np.abs(got[key] - expected).max()) <= TOLERANCE[name] * scale, key


def test_an_op_without_a_rule_is_named() -> None:
    node = helper.make_node("Celu", ["x"], ["y"], name="act")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    with pytest.raises(md.UnsupportedOpError, match=r"op Celu \(node act\) has no rule"):
        torch_module(helper.make_model(graph))


def test_without_torch_the_error_says_what_to_install() -> None:
    code = ("import sys; sys.modules['torch'] = None\n"
            "import metadef as md\n"
            "from metadef.frontends.torch_peer import torch_module\n"
            "try:\n    torch_module(md.zoo.build('mlp'))\n"
            "except md.MetadefError as e:\n    print(type(e).__name__, e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.startswith("BackendError") and "pip install torch==2.13.0" in done.stdout
