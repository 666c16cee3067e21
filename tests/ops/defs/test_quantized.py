"""Quantized ops: shape inference, errors, the expressions, numerics against ONNX Runtime."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import metadef.ops.defs.quantized as quantized
from metadef.core.errors import ShapeError
from metadef.ops import get_op
from metadef.testing.onnx_cases import check_model, infer_text, one_node_model, run_metadef

OPS = ["QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger",
       "ConvInteger", "QLinearMatMul", "QLinearConv"]
QUANT = [np.uint8, np.int8]


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def ints(r: np.random.Generator, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    info = np.iinfo(dtype)
    return r.integers(info.min, int(info.max) + 1, size=shape).astype(dtype)


def weights(r: np.random.Generator, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    """int8 weights in 7 bits: ONNX Runtime's u8 x s8 kernels (AVX2 ``vpmaddubsw``) saturate
    pairs of products to int16, which full-range weights overflow (metadef computes the
    exact int32 sums, like ONNX's reference)."""
    if dtype is np.int8:
        return r.integers(-64, 64, size=shape).astype(np.int8)
    return ints(r, dtype, shape)


# ------------------------------------------------------------------------ shape inference

def test_registered() -> None:
    for op in OPS:
        assert get_op(op) is getattr(quantized, op)


def test_quantize_shapes() -> None:
    assert infer_text("QuantizeLinear", ["f32[n,3,h]", "f32[3]", "i8[3]"]) == ["i8[n,3,h]"]
    assert infer_text("QuantizeLinear", ["f32[n,8]", "f32[]"]) == ["u8[n,8]"]
    assert infer_text("QuantizeLinear", ["f32[n,8]", "f32[]"], {"output_dtype": 5}) == ["i16[n,8]"]
    assert infer_text("QuantizeLinear", ["f32[4,n]", "f32[2,n]"],
                      {"axis": 0, "block_size": 2, "output_dtype": 3}) == ["i8[4,n]"]
    assert infer_text("DequantizeLinear", ["i8[b,3]", "f16[3]", "i8[3]"]) == ["f16[b,3]"]
    assert infer_text("DequantizeLinear", ["u4[b,3]", "f32[]"], {"output_dtype": 16}) == ["bf16[b,3]"]
    assert infer_text("DynamicQuantizeLinear", ["f32[b,k]"]) == ["u8[b,k]", "f32[]", "u8[]"]


def test_contraction_shapes() -> None:
    assert infer_text("MatMulInteger", ["u8[b,m,k]", "i8[k,7]", "u8[]", "i8[7]"]) == ["i32[b,m,7]"]
    assert infer_text("QLinearMatMul", ["i8[b,m,16]", "f32[]", "i8[]", "u8[16,4]", "f32[4]",
                                        "u8[4]", "f32[]", "u8[]"]) == ["u8[b,m,4]"]
    assert infer_text("ConvInteger", ["u8[n,3,h,w]", "i8[8,3,3,3]", "u8[]", "i8[8]"],
                      {"pads": [1, 1, 1, 1]}) == ["i32[n,8,h,w]"]
    assert infer_text("QLinearConv", ["u8[n,4,10,10]", "f32[]", "u8[]", "i8[6,2,3,3]", "f32[6]",
                                      "i8[6]", "f32[]", "i8[]", "i32[6]"],
                      {"strides": [2, 2], "group": 2}) == ["i8[n,6,4,4]"]


# ------------------------------------------------------------------------------- errors

def test_errors() -> None:
    with pytest.raises(ShapeError, match="per-axis scale needs one value per element of axis 1"):
        infer_text("QuantizeLinear", ["f32[2,3]", "f32[4]", "u8[4]"])
    with pytest.raises(ShapeError, match="output_dtype int8 disagrees with the zero point"):
        infer_text("QuantizeLinear", ["f32[2,3]", "f32[]", "u8[]"], {"output_dtype": 3})
    with pytest.raises(ShapeError, match="blocked scale must have shape"):
        infer_text("DequantizeLinear", ["i8[4,6]", "f32[4,2]"], {"axis": 1, "block_size": 2})
    with pytest.raises(ShapeError, match=r"op MatMulInteger .* expects K to agree: got 3"):
        infer_text("MatMulInteger", ["u8[2,3]", "u8[4,5]"])
    with pytest.raises(ShapeError, match=r"input 4 \(w_scale\) must be a scalar or a 1-D tensor of 6"):
        infer_text("QLinearConv", ["u8[1,3,5,5]", "f32[]", "u8[]", "u8[6,3,3,3]", "f32[5]",
                                   "u8[]", "f32[]", "u8[]"])
    with pytest.raises(ShapeError, match=r"input 2 \(x_zero_point\) must be a scalar"):
        infer_text("ConvInteger", ["u8[1,3,5,5]", "u8[6,3,3,3]", "u8[3]"])


# -------------------------------------------------------------------------- expressions

def test_expressions() -> None:
    text, params = quantized.qlinear_matmul_semantics(
        {}, [(2, 4), (), (), (4, 3), (3,), (3,), (), ()],
        [None] * 7 + [np.zeros((), np.int8)])
    assert "sum[k] (cast_int32(A[..., m, k]) - cast_int32(A_zero_point[]))" in text
    assert "B_scale[n]" in text and params == {"LO": -128.0, "HI": 127.0}
    text, _ = quantized.conv_integer_semantics({"pads": (1, 1)}, [(1, 2, 5), (3, 2, 3), (), (3,)])
    assert "fill(X[n, c, p0*S0 + r0*D0 - B0], X_zero_point[])" in text
    assert "W_zero_point[k]" in text
    # blocked quantization and a zero point not known before running: the reference runs
    attrs = {"axis": 1, "block_size": 2, "output_dtype": 0, "saturate": 1, "precision": 0}
    assert quantized.quantize_semantics(attrs, [(2, 4), (2, 2)], [None, None]) is None


def test_qlinear_matmul_reference_matches_expression() -> None:
    r = rng(9)
    a, b = ints(r, np.uint8, (4, 6)), ints(r, np.int8, (6, 3))
    ins = [a, np.float32(0.1), np.uint8(3), b, r.uniform(0.01, 0.1, 3).astype(np.float32),
           ints(r, np.int8, (3,)), np.float32(2.0), np.uint8(100)]
    model = one_node_model("QLinearMatMul", {}, dict(zip("abcdefgh", ins)), opset=21)
    assert np.array_equal(run_metadef(model, {})[0], quantized.qlinear_matmul_reference(ins, {}))


def test_round_half_to_even_and_saturation() -> None:
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 300.0, -300.0, 127.5], np.float32)
    y = quantized.quantize_reference([x, np.float32(1), np.int8(0)],
                                     {"axis": 1, "block_size": 0, "output_dtype": 0,
                                      "saturate": 1, "precision": 0})
    assert y.tolist() == [0, 2, 2, 0, -2, 127, -128, 127]
    f8 = quantized.quantize_reference([np.array([1e6, -1e6], np.float32), np.float32(1),
                                       np.zeros(1, ml_dtypes.float8_e4m3fn)],
                                      {"axis": 0, "block_size": 0, "output_dtype": 0,
                                       "saturate": 1, "precision": 0})
    assert f8.astype(np.float32).tolist() == [448.0, -448.0]


# ------------------------------------------------------------ numerics vs ONNX Runtime

@pytest.mark.parametrize("dtype", QUANT)
@pytest.mark.parametrize("per_axis", [False, True])
def test_quantize_dequantize_vs_ort(dtype: type, per_axis: bool) -> None:
    r = rng(1 + per_axis)
    x = (r.standard_normal((2, 5, 7)) * 40).astype(np.float32)
    x[0, 0, :3] = [0.5, 1.5, 2.5]  # ties round to even
    shape = (5,) if per_axis else ()
    scale = r.uniform(0.05, 0.5, shape).astype(np.float32)
    scale[...] = np.where(np.arange(np.size(scale)).reshape(shape) == 0, 1.0, scale)
    zero = ints(r, dtype, shape)
    for opset in (13, 21):
        m = one_node_model("QuantizeLinear", {"x": x}, {"s": scale, "z": zero}, opset=opset)
        check_model(m, {"x": x})
    q = ints(r, dtype, x.shape)
    m = one_node_model("DequantizeLinear", {"q": q}, {"s": scale, "z": zero}, opset=21)
    check_model(m, {"q": q})


def test_blocked_vs_ort() -> None:
    r = rng(3)
    x = (r.standard_normal((3, 8)) * 10).astype(np.float32)
    scale = r.uniform(0.1, 1.0, (3, 2)).astype(np.float32)
    zero = ints(r, np.int8, (3, 2))
    m = one_node_model("QuantizeLinear", {"x": x}, {"s": scale, "z": zero}, opset=21,
                       axis=1, block_size=4)
    check_model(m, {"x": x})
    q = ints(r, np.uint8, (3, 8))
    m = one_node_model("DequantizeLinear", {"q": q}, {"s": scale, "z": zero.astype(np.uint8)},
                       opset=21, axis=1, block_size=4)
    check_model(m, {"q": q})


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dynamic_quantize_vs_ort(seed: int) -> None:
    x = (rng(seed).standard_normal((3, 11)) * (seed + 1) + seed - 1).astype(np.float32)
    check_model(one_node_model("DynamicQuantizeLinear", {"x": x}, n_out=3, opset=11), {"x": x})


@pytest.mark.parametrize("a_dtype,b_dtype", [(np.uint8, np.uint8), (np.uint8, np.int8)])
def test_matmul_integer_vs_ort(a_dtype: type, b_dtype: type) -> None:
    r = rng(4)
    a, b = ints(r, a_dtype, (2, 5, 9)), weights(r, b_dtype, (9, 6))
    consts = {"b": b, "za": ints(r, a_dtype, ()), "zb": ints(r, b_dtype, (6,))}
    check_model(one_node_model("MatMulInteger", {"a": a}, consts, opset=10), {"a": a})


@pytest.mark.parametrize("dtype", QUANT)
def test_qlinear_matmul_vs_ort(dtype: type) -> None:
    r = rng(5)
    a, b = ints(r, dtype, (3, 4, 16)), weights(r, dtype, (16, 5))
    consts = {"sa": np.float32(0.02), "za": ints(r, dtype, ()), "b": b,
              "sb": np.float32(0.03), "zb": ints(r, dtype, ()),
              "sy": np.float32(0.9), "zy": ints(r, dtype, ())}
    inputs = ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"]
    check_model(one_node_model("QLinearMatMul", {"a": a}, consts, inputs, opset=10), {"a": a})


@pytest.mark.parametrize("x_dtype,w_dtype", [(np.uint8, np.uint8), (np.uint8, np.int8)])
def test_conv_integer_vs_ort(x_dtype: type, w_dtype: type) -> None:
    r = rng(6)
    x, w = ints(r, x_dtype, (2, 3, 7, 6)), weights(r, w_dtype, (4, 3, 3, 3))
    consts = {"w": w, "zx": ints(r, x_dtype, ()), "zw": ints(r, w_dtype, ())}
    m = one_node_model("ConvInteger", {"x": x}, consts, opset=10, pads=[1, 0, 1, 2],
                       strides=[2, 1])
    check_model(m, {"x": x})


@pytest.mark.parametrize("dtype", QUANT)
@pytest.mark.parametrize("per_channel", [False, True])
def test_qlinear_conv_vs_ort(dtype: type, per_channel: bool) -> None:
    r = rng(7 + per_channel)
    x, w = ints(r, dtype, (1, 4, 8, 8)), weights(r, np.int8, (6, 2, 3, 3))
    shape = (6,) if per_channel else ()
    consts = {"sx": np.float32(0.05), "zx": ints(r, dtype, ()), "w": w,
              "sw": r.uniform(0.01, 0.05, shape).astype(np.float32), "zw": np.zeros(shape, np.int8),
              "sy": np.float32(1.7), "zy": ints(r, dtype, ()),
              "bias": r.integers(-500, 500, 6).astype(np.int32)}
    inputs = ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy", "bias"]
    m = one_node_model("QLinearConv", {"x": x}, consts, inputs, opset=10, pads=[1, 1, 1, 1],
                       group=2, strides=[1, 2])
    check_model(m, {"x": x})


# --------------------------------------------------------------------------- conformance

@pytest.mark.slow
def test_conformance() -> None:
    from metadef.testing.conformance import format_report, run_cases

    report = run_cases(op=OPS)
    assert not report.failures(), format_report(report)
    assert report.totals()["pass"] == 45, format_report(report)
