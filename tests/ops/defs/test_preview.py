"""FlexAttention (domain ``ai.onnx.preview``): shapes, errors, and numerics against onnx's
reference evaluator (ONNX Runtime does not implement it) on inputs the node tests do not use,
including modifier subgraphs and one that reads a value of the enclosing graph."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from metadef.core.errors import ShapeError
from metadef.ops import get_op, infer_types
from metadef.ops.defs.preview import DOMAIN
from metadef.shape import parse_type
from metadef.testing.onnx_cases import assert_same, run_metadef

RNG = np.random.default_rng(1701)


def infer(types: Sequence[str], attrs: Mapping[str, Any] | None = None) -> list[str]:
    ins = [parse_type(t) for t in types]
    return [str(t) for t in infer_types(get_op("FlexAttention", DOMAIN), "/flex", ins, dict(attrs or {}))]


def modifier(name: str, body: str, elem: int = TensorProto.FLOAT, reads: Sequence[str] = (),
             consts: Mapping[str, np.ndarray] | None = None) -> onnx.GraphProto:
    """A modifier subgraph ``x -> y`` from one-node ``body`` text ``"Op"`` or ``"Op:attr=v"``
    reading ``x`` and then ``reads`` (outer values or its own ``consts``)."""
    op, _, attr = body.partition(":")
    attrs = {k: float(v) for k, v in (attr.split("="),)} if attr else {}
    node = helper.make_node(op, ["x", *reads], ["y"], **attrs)
    return helper.make_graph(
        [node], name, [helper.make_tensor_value_info("x", elem, ["B", "H", "L", "S"])],
        [helper.make_tensor_value_info("y", elem, ["B", "H", "L", "S"])],
        [numpy_helper.from_array(a, n) for n, a in (consts or {}).items()])


def flex_model(feeds: Mapping[str, np.ndarray], **attrs: Any) -> onnx.ModelProto:
    node = helper.make_node("FlexAttention", ["q", "k", "v"], ["y"], domain=DOMAIN, **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in feeds.items()],
        [helper.make_empty_tensor_value_info("y")])
    return helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 26), helper.make_opsetid(DOMAIN, 1)])


def qkv(q_heads: int = 4, kv_heads: int = 4, q_len: int = 5, kv_len: int = 7, size: int = 8,
        v_size: int = 6, dtype: Any = np.float32) -> dict[str, np.ndarray]:
    return {"q": RNG.standard_normal((2, q_heads, q_len, size)).astype(dtype),
            "k": RNG.standard_normal((2, kv_heads, kv_len, size)).astype(dtype),
            "v": RNG.standard_normal((2, kv_heads, kv_len, v_size)).astype(dtype)}


def check_reference(m: onnx.ModelProto, feeds: Mapping[str, np.ndarray], tol: float = 1e-5) -> None:
    want = ReferenceEvaluator(m).run(None, dict(feeds))
    assert_same(run_metadef(m, feeds), [np.asarray(w) for w in want], rtol=tol, atol=tol)


def test_flex_attention_shapes_and_errors() -> None:
    assert infer(["f32[b,8,s,64]", "f32[b,8,t,64]", "f32[b,8,t,16]"]) == ["f32[b,8,s,16]"]
    with pytest.raises(ShapeError, match="must be 4-D"):
        infer(["f32[b,s,64]", "f32[b,t,64]", "f32[b,t,64]"])
    with pytest.raises(ShapeError, match="same head size, got 64 and 32"):
        infer(["f32[b,8,s,64]", "f32[b,8,t,32]", "f32[b,8,t,64]"])
    with pytest.raises(ShapeError, match="6 query heads must be a multiple of the 4"):
        infer(["f32[b,6,s,64]", "f32[b,4,t,64]", "f32[b,4,t,64]"])
    with pytest.raises(ShapeError, match="softmax_precision=7"):
        infer(["f32[b,8,s,64]", "f32[b,8,t,64]", "f32[b,8,t,64]"], {"softmax_precision": 7})


@pytest.mark.parametrize(("shape", "attrs", "dtype", "tol"), [
    ({}, {"scale": 0.05}, np.float32, 1e-5),
    ({"q_heads": 6, "kv_heads": 2}, {}, np.float32, 1e-5),
    ({"kv_heads": 1, "v_size": 3, "q_len": 1}, {}, np.float64, 1e-10),
    ({"q_heads": 4, "kv_heads": 2}, {}, np.float16, 2e-3),
    ({}, {"softmax_precision": TensorProto.DOUBLE}, np.float32, 1e-5),
])
def test_flex_attention_matches_the_reference(shape: dict[str, int], attrs: dict[str, Any],
                                              dtype: Any, tol: float) -> None:
    feeds = qkv(dtype=dtype, **shape)
    check_reference(flex_model(feeds, **attrs), feeds, tol)


@pytest.mark.parametrize(("score_mod", "prob_mod"), [
    ("Tanh", None),                          # a soft cap of 1
    (None, "Sqrt"),                          # probabilities that no longer sum to 1
    ("Mul:alpha=0", "Neg"),                  # constant folded inside: Mul by its own const
])
def test_flex_attention_modifiers_match_the_reference(score_mod: str | None, prob_mod: str | None) -> None:
    feeds = qkv(q_heads=4, kv_heads=2)
    attrs: dict[str, Any] = {}
    for key, body in (("score_mod", score_mod), ("prob_mod", prob_mod)):
        if body is None:
            continue
        if body.startswith("Mul"):
            attrs[key] = modifier(key, "Mul", reads=["half"], consts={"half": np.float32(0.5)})
        else:
            attrs[key] = modifier(key, body)
    check_reference(flex_model(feeds, **attrs), feeds)


def test_flex_attention_score_mod_reads_an_outer_value() -> None:
    """A relative-position bias held by the enclosing graph, added to the scores."""
    feeds = qkv(q_len=3, kv_len=4)
    bias = RNG.standard_normal((3, 4)).astype(np.float32)
    m = flex_model(feeds, score_mod=modifier("bias", "Add", reads=["rel_bias"]))
    m.graph.initializer.append(numpy_helper.from_array(bias, "rel_bias"))
    y, = run_metadef(m, feeds)
    q, k, v = feeds["q"], feeds["k"], feeds["v"]
    scores = q @ k.swapaxes(-1, -2) / np.sqrt(8) + bias
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    np.testing.assert_allclose(y, probs / probs.sum(-1, keepdims=True) @ v, rtol=1e-5, atol=1e-6)


def test_flex_attention_refuses_a_modifier_of_the_wrong_dtype() -> None:
    feeds = qkv()
    m = flex_model(feeds, score_mod=modifier("f64", "Neg", elem=TensorProto.DOUBLE))
    with pytest.raises(ShapeError, match=r"score_mod takes f64\[B,H,L,S\], but the scores are f32\[2,4,5,7\]"):
        run_metadef(m, feeds)


@pytest.mark.slow
def test_conformance() -> None:
    from metadef.testing.conformance import format_report, run_cases

    report = run_cases(op="FlexAttention", pattern=r"^(?!.*_expanded)")
    assert not report.failures() and report.totals()["unsupported"] == 0, format_report(report)
