"""The ``com.microsoft`` contrib ops: symbolic shape inference, error texts, and numerics
against ONNX Runtime (which implements them on CPU) on one-node models."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper

import metadef.ops.defs.microsoft  # noqa: F401  (registers the ops)
from metadef.core.errors import ShapeError
from metadef.ops import get_op, infer_types
from metadef.ops.defs.microsoft import DOMAIN
from metadef.shape import parse_type
from metadef.testing.onnx_cases import check_model
from metadef.testing.oracle import ort_exact_int8

RNG = np.random.default_rng(11)


def infer(op: str, types: Sequence[str | None], attrs: Mapping[str, Any] | None = None,
          n_outputs: int | None = None) -> list[str]:
    ins = [None if t is None else parse_type(t) for t in types]
    return [str(t) for t in infer_types(get_op(op, DOMAIN), "/n", ins, dict(attrs or {}),
                                        n_outputs=n_outputs)]


def ms_model(op: str, feeds: Mapping[str, np.ndarray], inputs: Sequence[str], n_out: int = 1,
             **attrs: Any) -> onnx.ModelProto:
    """One com.microsoft node reading ``inputs`` ("" skips an optional one) from ``feeds``."""
    outs = [f"out{i}" for i in range(n_out)]
    node = helper.make_node(op, list(inputs), outs, domain=DOMAIN, **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in feeds.items()],
        [helper.make_empty_tensor_value_info(o) for o in outs])
    return helper.make_model(graph, ir_version=8, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


# --------------------------------------------------------------------------- Gelu family


def test_gelu_family_shapes_and_errors() -> None:
    assert infer("Gelu", ["f32[b,s,64]"]) == ["f32[b,s,64]"]
    assert infer("QuickGelu", ["f16[b,8]"], {"alpha": 1.5}) == ["f16[b,8]"]
    assert infer("FastGelu", ["f32[b,s,64]", "f32[64]"]) == ["f32[b,s,64]"]
    assert infer("BiasGelu", ["f32[b,s,64]", "f32[64]"]) == ["f32[b,s,64]"]
    with pytest.raises(ShapeError, match="bias must be 1-D with X's last dimension"):
        infer("BiasGelu", ["f32[b,s,64]", "f32[32]"])


@pytest.mark.parametrize(("op", "with_bias", "attrs"), [
    ("Gelu", False, {}), ("FastGelu", False, {}), ("FastGelu", True, {}),
    ("BiasGelu", True, {}), ("QuickGelu", False, {}), ("QuickGelu", False, {"alpha": 1.3}),
])
def test_gelu_family_matches_onnxruntime(op: str, with_bias: bool, attrs: dict[str, Any]) -> None:
    feeds = {"x": rand(2, 5, 16) * 3}
    if with_bias:
        feeds["b"] = rand(16)
    check_model(ms_model(op, feeds, list(feeds), **attrs), feeds, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------- SkipLayerNormalization


def test_skip_layer_norm_shapes_and_errors() -> None:
    assert infer("SkipLayerNormalization", ["f32[b,s,64]", "f32[b,s,64]", "f32[64]"],
                 n_outputs=4) == ["f32[b,s,64]", "f32[b,s,1]", "f32[b,s,1]", "f32[b,s,64]"]
    with pytest.raises(ShapeError, match="Gamma must be 1-D of the hidden size 64"):
        infer("SkipLayerNormalization", ["f32[b,s,64]", "f32[b,s,64]", "f32[32]"])


@pytest.mark.parametrize(("skip_shape", "extra"), [
    ((2, 3, 8), ()), ((2, 3, 8), ("beta", "bias")), ((1, 3, 8), ("beta",)), ((3, 8), ("bias",)),
])
def test_skip_layer_norm_matches_onnxruntime(skip_shape: tuple[int, ...], extra: tuple[str, ...]) -> None:
    feeds = {"x": rand(2, 3, 8), "skip": rand(*skip_shape), "gamma": rand(8)}
    names = ["x", "skip", "gamma", "beta" if "beta" in extra else "", "bias" if "bias" in extra else ""]
    for n in extra:
        feeds[n] = rand(8)
    while not names[-1]:
        names.pop()
    model = ms_model("SkipLayerNormalization", feeds, names, n_out=4, epsilon=1e-5)
    check_model(model, feeds, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------- FusedMatMul


def test_fused_matmul_shapes_and_errors() -> None:
    assert infer("FusedMatMul", ["f32[b,k,m]", "f32[b,n,k]"], {"transA": 1, "transB": 1}) == ["f32[b,m,n]"]
    assert infer("FusedMatMul", ["f32[m,b,k]", "f32[b,k,n]"], {"transBatchA": 1}) == ["f32[b,m,n]"]
    with pytest.raises(ShapeError, match="contracted sizes differ"):
        infer("FusedMatMul", ["f32[m,4]", "f32[5,n]"])


@pytest.mark.parametrize("attrs", [
    {}, {"alpha": 0.5, "transA": 1}, {"transB": 1}, {"transBatchA": 1},
    {"transBatchA": 1, "transA": 1, "transBatchB": 1, "transB": 1, "alpha": 2.0},
])
def test_fused_matmul_matches_onnxruntime(attrs: dict[str, int | float]) -> None:
    m, k, n, b = 3, 4, 5, 2
    a_log, b_log = [b, m, k], [b, k, n]
    if attrs.get("transA"):
        a_log[-2:] = a_log[-1], a_log[-2]
    if attrs.get("transB"):
        b_log[-2:] = b_log[-1], b_log[-2]
    a_shape = [a_log[1], a_log[0], a_log[2]] if attrs.get("transBatchA") else a_log
    b_shape = [b_log[1], b_log[0], b_log[2]] if attrs.get("transBatchB") else b_log
    feeds = {"a": rand(*a_shape), "b": rand(*b_shape)}
    check_model(ms_model("FusedMatMul", feeds, ["a", "b"], **attrs), feeds, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------ Attention


def test_attention_shapes_and_errors() -> None:
    assert infer("Attention", ["f32[b,s,32]", "f32[32,96]", "f32[96]", None, "f32[2,b,4,p,8]"],
                 {"num_heads": 4}, n_outputs=2) == ["f32[b,s,32]", "f32[2,b,4,p + s,8]"]
    assert infer("Attention", ["f32[b,s,32]", "f32[32,80]"],
                 {"num_heads": 4, "qkv_hidden_sizes": (32, 32, 16)}) == ["f32[b,s,16]"]
    for mask in ("i32[b,s,s]", "i32[4]"):  # 3-D, and 1-D [2*batch] start/end positions
        with pytest.raises(ShapeError, match=r"mask_index of shape .* is not supported"):
            infer("Attention", ["f32[2,s,32]", "f32[32,96]", "f32[96]", mask], {"num_heads": 4})
    with pytest.raises(ShapeError, match="attribute do_rotary=1 is not supported"):
        infer("Attention", ["f32[b,s,32]", "f32[32,96]"], {"num_heads": 4, "do_rotary": 1})


def _attention_case(mask: str, past: bool, **attrs: Any) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    batch, seq, hidden, heads, past_len = 2, 4, 16, 2, 3
    sizes = attrs.get("qkv_hidden_sizes", (hidden,) * 3)
    feeds = {"x": rand(batch, seq, hidden), "w": rand(hidden, sum(sizes)) * 0.3, "bias": rand(sum(sizes))}
    total = seq + (past_len if past else 0)
    if mask == "2d":
        m = np.ones((batch, total), np.int32)
        m[0, -2:] = 0
        feeds["mask"] = m
    elif mask == "lengths":
        feeds["mask"] = np.array([total - 1, total], np.int32)
    if past:
        feeds["past"] = rand(2, batch, heads, past_len, hidden // heads)
    names = ["x", "w", "bias", "mask" if mask else "", "past" if past else ""]
    while not names[-1]:
        names.pop()
    return ms_model("Attention", feeds, names, n_out=2 if past else 1, num_heads=heads, **attrs), feeds


@pytest.mark.parametrize(("mask", "past", "attrs"), [
    ("", False, {}), ("2d", False, {}), ("lengths", False, {}), ("", False, {"unidirectional": 1}),
    ("2d", True, {"unidirectional": 1}), ("", False, {"scale": 0.1}),
    ("", False, {"qkv_hidden_sizes": (16, 16, 8)}),
])
def test_attention_matches_onnxruntime(mask: str, past: bool, attrs: dict[str, Any]) -> None:
    model, feeds = _attention_case(mask, past, **attrs)
    check_model(model, feeds, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_no_onnx_node_tests_for_contrib_ops() -> None:
    """ONNX ships no node test cases for com.microsoft ops (its ``Attention`` cases are the
    standard-domain op, not this one): the ORT comparisons above stand in."""
    from metadef.testing.conformance import run_cases

    report = run_cases(op=["FusedMatMul", "SkipLayerNormalization", "QuickGelu",
                           "FastGelu", "BiasGelu"])
    assert not report.failures()


# ----------------------------------------------------------------- MatMulIntegerToFloat


def test_matmul_integer_to_float_shapes_and_errors() -> None:
    assert infer("MatMulIntegerToFloat", ["u8[b,s,64]", "i8[64,32]", "f32[]", "f32[32]", "u8[]"]) == ["f32[b,s,32]"]
    assert infer("MatMulIntegerToFloat", ["i8[m,8]", "i8[8,4]", "f32[]", "f32[]", None, "i8[4]", "f32[4]"]) \
        == ["f32[m,4]"]
    with pytest.raises(ShapeError, match=r"b_scale must be one value or one per column of B \(32\), got shape \[16\]"):
        infer("MatMulIntegerToFloat", ["u8[b,64]", "i8[64,32]", "f32[]", "f32[16]"])
    with pytest.raises(ShapeError, match=r"a_scale must hold one value \(per tensor\), got shape \[3\]"):
        infer("MatMulIntegerToFloat", ["u8[b,64]", "i8[64,32]", "f32[3]", "f32[]"])


@pytest.mark.parametrize(("a_dtype", "per_column", "zero_points", "bias"), [
    (np.uint8, False, True, True), (np.uint8, True, True, False), (np.int8, True, False, True),
    (np.uint8, True, False, False),
])
def test_matmul_integer_to_float_is_onnxruntimes(a_dtype: type, per_column: bool, zero_points: bool,
                                                 bias: bool) -> None:
    info = np.iinfo(a_dtype)
    feeds = {"a": RNG.integers(info.min, info.max + 1, (2, 5, 40)).astype(a_dtype),
             "b": ort_exact_int8(RNG, (40, 24)),
             "sa": np.array(0.0173, np.float32),
             "sb": np.asarray(RNG.random(24 if per_column else ()) * 0.01 + 1e-3, np.float32)}
    names = ["a", "b", "sa", "sb", "", "", ""]
    if zero_points:
        feeds["za"] = np.array(131 if a_dtype == np.uint8 else -7, a_dtype)
        feeds["zb"] = np.zeros(24 if per_column else (), np.int8)
        names[4:6] = ["za", "zb"]
    if bias:
        feeds["bias"] = rand(24)
        names[6] = "bias"
    while not names[-1]:
        names.pop()
    check_model(ms_model("MatMulIntegerToFloat", feeds, names), feeds, rtol=0, atol=0)


# ---------------------------------------------------------------------------- QAttention


@pytest.mark.parametrize("mask", [False, True])
def test_qattention_is_onnxruntimes(mask: bool) -> None:
    """ORT's quantized Attention (what quantize_dynamic makes of an ORT-optimized transformer's
    Attention): the integer projection scaled to float, then attention; ORT's results."""
    batch, seq, hidden, heads = 2, 5, 16, 4
    feeds = {"x": RNG.integers(0, 256, (batch, seq, hidden)).astype(np.uint8),
             "w": ort_exact_int8(RNG, (hidden, 3 * hidden)),
             "bias": rand(3 * hidden), "sx": np.array(0.02, np.float32),
             "sw": np.array(0.004, np.float32), "zx": np.array(128, np.uint8), "zw": np.array(0, np.int8)}
    names = ["x", "w", "bias", "sx", "sw", "", "zx", "zw"]
    if mask:
        feeds["mask"] = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int32)
        names[5] = "mask"
    check_model(ms_model("QAttention", feeds, names, num_heads=heads), feeds, rtol=1e-4, atol=1e-5)
    assert infer("QAttention", ["u8[b,s,16]", "i8[16,48]", "f32[48]", "f32[]", "f32[]"], {"num_heads": 4},
                 n_outputs=2) == ["f32[b,s,16]", "f32[2,b,4,s,4]"]
