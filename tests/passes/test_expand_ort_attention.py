"""``expand_ort_attention``: ONNX Runtime's ``com.microsoft::Attention`` (its transformers
optimizer's) and ``QAttention`` (the same after ``quantize_dynamic``) become three projections
and ``ai.metadef::Attention``, agreeing with ONNX Runtime; what it cannot expand stays, with the
reason."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import metadef as md
from metadef.rewrite import DecisionLog
from metadef.testing.oracle import ort_exact_int8

RNG = np.random.default_rng(61)
BATCH, SEQ, HIDDEN, HEADS = 2, 6, 32, 4


def _model(quantized: bool, mask: str, **attrs: object) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    feeds: dict[str, np.ndarray] = {}
    consts: dict[str, np.ndarray] = {"bias": RNG.standard_normal(3 * HIDDEN).astype(np.float32) * 0.1}
    if quantized:
        feeds["x"] = RNG.integers(0, 256, (BATCH, SEQ, HIDDEN)).astype(np.uint8)
        feeds["sx"], feeds["zx"] = np.array(0.02, np.float32), np.array(125, np.uint8)
        consts["w"] = ort_exact_int8(RNG, (HIDDEN, 3 * HIDDEN))
        consts["sw"] = RNG.uniform(0.002, 0.006, 3 * HIDDEN).astype(np.float32)
        consts["zw"] = np.zeros(3 * HIDDEN, np.int8)
        names = ["x", "w", "bias", "sx", "sw", "", "zx", "zw"]
        at = 5
    else:
        feeds["x"] = RNG.standard_normal((BATCH, SEQ, HIDDEN)).astype(np.float32)
        consts["w"] = RNG.standard_normal((HIDDEN, 3 * HIDDEN)).astype(np.float32) * 0.2
        names = ["x", "w", "bias"]
        at = 3
    if mask == "2d":
        feeds["mask"] = np.array([[1, 1, 1, 1, 0, 0], [1] * SEQ], np.int32)
    elif mask == "lengths":
        feeds["mask"] = np.array([4, SEQ], np.int32)
    if mask:  # (mask_index: QAttention's input 5, Attention's input 3)
        names = [*names[:at], "mask", *names[at + 1:]]
    node = helper.make_node("QAttention" if quantized else "Attention", names, ["y"], domain="com.microsoft",
                            num_heads=HEADS, **attrs)
    inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for k, v in feeds.items()]
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [onnx.numpy_helper.from_array(v, k) for k, v in consts.items()])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets), feeds


@pytest.mark.parametrize("quantized", [False, True])
@pytest.mark.parametrize("mask", ["", "2d", "lengths"])
def test_ort_attention_becomes_projections_and_our_attention(quantized: bool, mask: str) -> None:
    model, feeds = _model(quantized, mask)
    graph = md.optimize(md.import_onnx(model), level="moderate")
    ops = [n.qualop for n in graph.nodes]
    assert "ai.metadef::Attention" in ops and not any(o.endswith("Attention") and "metadef" not in o for o in ops)
    assert ops.count("com.microsoft::MatMulIntegerToFloat" if quantized else "MatMul") == 3, ops
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    for target in ("reference", "x86"):
        got = next(iter(md.compile(graph, target=target).run(feeds).values()))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_an_ort_attention_it_cannot_expand_stays_with_the_reason() -> None:
    model, feeds = _model(False, "", unidirectional=1)
    log = DecisionLog()
    graph = md.optimize(md.import_onnx(model), level="moderate", log=log)
    assert "com.microsoft::Attention" in [n.qualop for n in graph.nodes]
    refused = [line for line in log.lines() if line.startswith("refused expand_ort_attention")]
    assert refused and "only the plain form" in refused[0], log.lines()
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(next(iter(md.compile(graph, target="x86").run(feeds).values())), want,
                               rtol=1e-4, atol=1e-5)
