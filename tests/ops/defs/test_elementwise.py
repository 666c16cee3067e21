"""Elementwise family: shape inference, errors, old-opset adapters, numerics against ORT."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

import metadef as md
from metadef.backends.reference import run_node
from metadef.core.errors import DTypeError, ShapeError, UnsupportedOpError
from metadef.ops import get_op
from metadef.shape import TensorType, parse_type
from metadef.testing.onnx_cases import check_model, infer_text, one_node_model, run_metadef

RNG = np.random.default_rng(0)


def infer(op: str, types: list[str | None], attrs: dict | None = None) -> list[str]:
    return infer_text(op, types, attrs, node="/e/node")


one_node = one_node_model


check_ort = check_model


# ------------------------------------------------------------------ shapes and dtypes


def test_broadcast_shapes_are_symbolic() -> None:
    assert infer("Add", ["f32[batch,1,8]", "f32[3,1]"]) == ["f32[batch,3,8]"]
    assert infer("Div", ["i32[batch,seq]", "i32[]"]) == ["i32[batch,seq]"]
    assert infer("Less", ["f16[batch,4]", "f16[4]"]) == ["b8[batch,4]"]
    assert infer("Equal", ["b8[n]", "b8[n]"]) == ["b8[n]"]
    assert infer("Where", ["b8[batch,1]", "f32[1,seq]", "f32[]"]) == ["f32[batch,seq]"]
    assert infer("Max", ["i64[a,1]", "i64[3]", "i64[]"]) == ["i64[a,3]"]
    assert infer("Mean", ["f32[n]"]) == ["f32[n]"]
    assert infer("BitShift", ["u8[n,2]", "u8[2]"], {"direction": "LEFT"}) == ["u8[n,2]"]
    assert infer("Mod", ["i64[n]", "i64[1]"], {"fmod": 1}) == ["i64[n]"]


def test_unary_and_mixed_dtypes() -> None:
    assert infer("Sqrt", ["bf16[batch,seq]"]) == ["bf16[batch,seq]"]
    assert infer("IsNaN", ["f16[n]"]) == ["b8[n]"]
    assert infer("IsInf", ["f32[n,m]"], {"detect_negative": 0}) == ["b8[n,m]"]
    assert infer("Pow", ["f32[n,3]", "i64[3]"]) == ["f32[n,3]"]
    assert infer("Pow", ["i32[n]", "f32[]"]) == ["i32[n]"]
    assert infer("Cast", ["f32[batch,3]"], {"to": onnx.TensorProto.FLOAT8E4M3FN}) == \
        ["f8e4m3fn[batch,3]"]
    assert infer("Cast", ["i4[n]"], {"to": onnx.TensorProto.FLOAT}) == ["f32[n]"]
    assert infer("CastLike", ["f32[batch]", "bf16[]"]) == ["bf16[batch]"]
    assert infer("Identity", ["u16[n]"]) == ["u16[n]"]
    assert infer("BitwiseNot", ["i8[n]"]) == ["i8[n]"]


def test_unbroadcastable_shapes_name_node_and_constraint() -> None:
    with pytest.raises(ShapeError, match=r"(?s)Add \(node /e/node\).*\[batch,3\] and \[4\] cannot "
                                         r"broadcast"):
        infer("Add", ["f32[batch,3]", "f32[4]"])
    with pytest.raises(ShapeError, match=r"BitShift \(node /e/node\).*cannot broadcast"):
        infer("BitShift", ["u8[3]", "u8[4]"], {"direction": "LEFT"})


def test_constraint_errors() -> None:
    with pytest.raises(ShapeError, match=r"BitShift \(node /e/node\).*direction must be LEFT or "
                                         r"RIGHT, got 'UP'"):
        infer("BitShift", ["u8[3]", "u8[3]"], {"direction": "UP"})
    with pytest.raises(DTypeError, match=r"op Pow \(node /e/node\): input 0 \(X\) has dtype int8"):
        infer("Pow", ["i8[3]", "i8[3]"])
    with pytest.raises(DTypeError, match=r"earlier input of type T is float32"):
        infer("Add", ["f32[3]", "f16[3]"])
    with pytest.raises(ShapeError, match=r"op Cast \(node /e/node\).*round_mode='sideways' must be one of"):
        infer("Cast", ["f32[3]"], {"to": onnx.TensorProto.FLOAT8E8M0, "round_mode": "sideways"})
    with pytest.raises(DTypeError, match=r"Not \(node /e/node\).*must be one of \{bool\}"):
        infer("Not", ["f32[3]"])


# ------------------------------------------------------------------ semantics text


def test_semantics_are_index_expressions() -> None:
    for name in ("Add", "Div", "Pow", "Mod", "Max", "Sum", "Equal", "Where", "Cast", "BitShift",
                 "BitwiseNot", "IsInf", "Erf", "Round"):
        assert not get_op(name).semantics.opaque, name
    for name in ("BitwiseAnd", "CastLike"):  # no bitwise operators; dtype from a tensor
        assert get_op(name).semantics.opaque, name
    prog, _ = get_op("Mean").semantics.instantiate({}, [(2,), (2,), (2,)])
    assert str(prog) == "Y[...] = (data_0[...] + data_1[...] + data_2[...]) / 3"


def test_run_node_variadic_and_cast() -> None:
    a, b = np.array([1, 5, -3], np.int32), np.array([[2], [0]], np.int32)
    (y,) = run_node(get_op("Max"), {}, [a, b], [parse_type("i32[2,3]")])
    assert y.tolist() == [[2, 5, 2], [1, 5, 0]]
    x = np.array([1e6, -1e6, np.nan, 1.0], np.float32)
    (sat,) = run_node(get_op("Cast"), {"to": 17, "saturate": 1, "round_mode": "up"}, [x],
                      [TensorType(md.core.dtypes.FLOAT8E4M3FN, (4,))])
    assert sat.astype(np.float32)[[0, 1, 3]].tolist() == [448.0, -448.0, 1.0]
    assert np.isnan(sat.astype(np.float32)[2])


# ------------------------------------------------------------------ numerics against ORT


def _ints(dtype: Any, shape: tuple[int, ...], lo: int = -20, hi: int = 20) -> np.ndarray:
    return RNG.integers(lo, hi, shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int8])
def test_integer_div_truncates_like_ort(dtype: Any) -> None:
    a, b = _ints(dtype, (4, 5)), _ints(dtype, (5,), 1, 7) * np.array([1, -1, 1, -1, 1], dtype)
    check_ort(one_node("Div", {"a": a, "b": b}), {"a": a, "b": b})


@pytest.mark.parametrize(("fmod", "dtype"), [(0, np.int32), (0, np.int64), (1, np.int32),
                                             (1, np.int64), (1, np.float32), (1, np.float64)])
def test_mod_like_ort(fmod: int, dtype: Any) -> None:  # ORT takes fmod=0 floats from opset 28
    a = _ints(dtype, (3, 6), -50, 50) if np.dtype(dtype).kind == "i" else \
        RNG.uniform(-50, 50, (3, 6)).astype(dtype)
    b = np.array([3, -3, 7, -7, 4, 11], dtype) if np.dtype(dtype).kind == "i" else \
        np.array([3.3, -3.3, 0.7, -0.7, 4.0, 11.5], dtype)
    check_ort(one_node("Mod", {"a": a, "b": b}, fmod=fmod), {"a": a, "b": b})


@settings(max_examples=200, deadline=None)
@given(st.floats(width=32, allow_nan=False, allow_infinity=False),
       st.floats(width=32, allow_nan=False, allow_infinity=False).filter(lambda v: v != 0))
def test_fmod_matches_numpy(a: float, b: float) -> None:
    x, y = np.array([a], np.float32), np.array([b], np.float32)
    (got,) = run_node(get_op("Mod"), {"fmod": 1}, [x, y], [parse_type("f32[1]")])
    np.testing.assert_array_equal(got, np.fmod(x, y))


@pytest.mark.parametrize(("x_dtype", "y_dtype"), [(np.float32, np.int64), (np.int64, np.float32),
                                                  (np.int32, np.int32), (np.float32, np.int32)])
def test_pow_mixed_types_like_ort(x_dtype: Any, y_dtype: Any) -> None:
    x = np.array([[1, 2, 3], [4, 5, 6]], x_dtype)
    y = np.array([2, 3, 0], y_dtype)
    check_ort(one_node("Pow", {"x": x, "y": y}, opset=15), {"x": x, "y": y})


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint32, np.uint64])
def test_bitshift_like_ort(direction: str, dtype: Any) -> None:
    x = np.array([0, 1, 7, 200, 255, 16], dtype)
    y = np.array([0, 1, 3, 2, 7, 4], dtype)
    check_ort(one_node("BitShift", {"x": x, "y": y}, opset=11, direction=direction),
              {"x": x, "y": y})


def test_bitwise_like_ort() -> None:
    a, b = _ints(np.int16, (3, 4), -300, 300), _ints(np.int16, (4,), -300, 300)
    for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor"):
        check_ort(one_node(op, {"a": a, "b": b}, opset=18), {"a": a, "b": b})
    u = np.array([0, 1, 254, 255], np.uint8)
    check_ort(one_node("BitwiseNot", {"u": u}, opset=18), {"u": u})


@pytest.mark.parametrize("op", ["Abs", "Neg", "Sign", "Floor", "Ceil", "Round", "Reciprocal",
                                "Sqrt", "Exp", "Log", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan",
                                "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Erf"])
def test_unary_math_like_ort(op: str) -> None:
    x = np.array([[-2.5, -1.5, -0.5, 0.0], [0.5, 1.5, 2.5, 0.25]], np.float32)
    if op in ("Sqrt", "Log", "Acosh"):
        x = np.abs(x) + 1.0
    if op in ("Asin", "Acos", "Atanh"):
        x = x / 3
    check_ort(one_node(op, {"x": x}, opset=13 if op != "Round" else 11), {"x": x}, rtol=1e-5)


def test_comparisons_logic_and_where_like_ort() -> None:
    a, b = _ints(np.int64, (2, 3, 4), -3, 3), _ints(np.int64, (3, 1), -3, 3)
    for op in ("Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"):
        check_ort(one_node(op, {"a": a, "b": b}, opset=16), {"a": a, "b": b})
    p, q = a > 0, b < 1
    for op in ("And", "Or", "Xor"):
        check_ort(one_node(op, {"p": p, "q": q}), {"p": p, "q": q})
    x, y = a.astype(np.float32), b.astype(np.float32)
    check_ort(one_node("Where", {"p": p, "x": x, "y": y}), {"p": p, "x": x, "y": y})


@pytest.mark.parametrize("attrs", [{}, {"detect_negative": 0}, {"detect_positive": 0},
                                   {"detect_negative": 0, "detect_positive": 0}])
def test_isinf_like_ort(attrs: dict) -> None:
    x = np.array([np.inf, -np.inf, np.nan, 1.0, -2.0], np.float32)
    check_ort(one_node("IsInf", {"x": x}, opset=10, **attrs), {"x": x})
    check_ort(one_node("IsNaN", {"x": x}, opset=9), {"x": x})


@pytest.mark.parametrize("opset", [8, 13])
def test_variadic_like_ort(opset: int) -> None:
    feeds = {"a": RNG.normal(size=(2, 3)).astype(np.float32),
             "b": RNG.normal(size=(3,)).astype(np.float32),
             "c": RNG.normal(size=(1, 1)).astype(np.float32)}
    for op in ("Max", "Min", "Sum", "Mean"):
        check_ort(one_node(op, feeds, opset=opset), feeds)


@pytest.mark.parametrize("to", [onnx.TensorProto.FLOAT16, onnx.TensorProto.INT32,
                                onnx.TensorProto.BOOL, onnx.TensorProto.UINT8,
                                onnx.TensorProto.DOUBLE, onnx.TensorProto.INT8])
@pytest.mark.parametrize("opset", [9, 13, 21])
def test_cast_like_ort(to: int, opset: int) -> None:
    x = np.array([[0.0, 1.5, -2.0, 3.25], [100.0, 7.0, 0.5, 2.0]], np.float32)
    check_ort(one_node("Cast", {"x": x}, opset=opset, to=to), {"x": x})
    target = np.zeros((), helper.tensor_dtype_to_np_dtype(to))
    check_ort(one_node("CastLike", {"x": x}, {"t": target}, opset=max(opset, 15)), {"x": x})


def test_cast_float8_saturates_like_onnx() -> None:
    x = np.array([1e6, -1e6, 0.3, np.inf], np.float32)
    for sat, want in ((1, [448, -448, 0.3125, 448]), (0, [np.nan, np.nan, 0.3125, np.nan])):
        model = one_node("Cast", {"x": x}, opset=19, to=onnx.TensorProto.FLOAT8E4M3FN,
                         saturate=sat)
        (got,) = run_metadef(model, {"x": x})
        assert got.dtype == ml_dtypes.float8_e4m3fn
        np.testing.assert_array_equal(got.astype(np.float32), np.array(want, np.float32))


# ------------------------------------------------------------------ old opsets


def test_opset6_broadcast_attr_is_numpy_broadcasting() -> None:
    a, b = RNG.normal(size=(2, 3)).astype(np.float32), RNG.normal(size=(3,)).astype(np.float32)
    model = one_node("Add", {"a": a, "b": b}, opset=6, broadcast=1)
    np.testing.assert_allclose(run_metadef(model, {"a": a, "b": b})[0], a + b)
    model = one_node("Mul", {"a": a}, {"b": b}, opset=1, broadcast=1, consumed_inputs=[0])
    np.testing.assert_allclose(run_metadef(model, {"a": a})[0], a * b)


def test_opset6_broadcast_axis_aligns_b_at_that_axis() -> None:
    a, b = RNG.normal(size=(2, 3, 4, 5)).astype(np.float32), RNG.normal(size=(3, 4)).astype(np.float32)
    model = one_node("Sub", {"a": a, "b": b}, opset=6, broadcast=1, axis=1)
    np.testing.assert_allclose(run_metadef(model, {"a": a, "b": b})[0], a - b[:, :, None])
    m, c = a[0, 0, :2, :3].copy(), RNG.normal(size=(2,)).astype(np.float32)  # axis=0: c is a column
    model = one_node("Add", {"m": m}, {"c": c}, opset=6, broadcast=1, axis=0)
    np.testing.assert_allclose(run_metadef(model, {"m": m})[0], m + c[:, None])


def test_opset6_broadcast_axis_that_does_not_fit_is_refused_by_name() -> None:
    a, b = np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32)
    with pytest.raises(UnsupportedOpError, match=r"legacy broadcasting .* with axis=1"):
        md.import_onnx(one_node("Sub", {"a": a, "b": b}, opset=6, broadcast=1, axis=1))


def test_opset1_cast_names_its_target() -> None:
    x = np.array([1.5, -2.5], np.float32)
    (y,) = run_metadef(one_node("Cast", {"x": x}, opset=1, to="INT32"), {"x": x})
    assert y.dtype == np.int32 and y.tolist() == [1, -2]


def test_opset6_unary_with_consumed_inputs() -> None:
    x = np.array([1.0, 4.0], np.float32)
    model = one_node("Sqrt", {"x": x}, opset=1, consumed_inputs=[0])
    np.testing.assert_allclose(run_metadef(model, {"x": x})[0], [1.0, 2.0])


# ------------------------------------------------------------------ the ONNX node tests

ELEMENTWISE_OPS = [
    "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Exp", "Log", "Neg", "Abs", "Floor", "Ceil",
    "Round", "Reciprocal", "Sign", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh",
    "Asinh", "Acosh", "Atanh", "Erf", "Min", "Max", "Sum", "Mean", "Mod", "Equal", "Less",
    "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And", "Or", "Xor", "IsNaN", "IsInf",
    "Where", "Cast", "CastLike", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor",
    "BitwiseNot", "Identity",
]


@pytest.mark.slow
def test_onnx_node_tests_pass() -> None:
    from metadef.testing.conformance import format_report, run_cases

    report = run_cases(op=ELEMENTWISE_OPS)
    assert not report.failures(), format_report(report)
