"""Cast and CastLike to and from string tensors against ONNX Runtime, on the reference and x86
backends: numbers print as ONNX Runtime prints them (``%.8g``, ``NaN``, ``INF``, decimal
integers, ``1``/``0``), text reads as it reads it (C's ``strtod``, ``std::stoll`` /
``std::stoull`` with wrapping), text it refuses fails with a typed error naming the node and
the text; float16 and bfloat16 print and read back exactly (every value), float32 to within one
unit in the last place (eight digits are ONNX Runtime's choice, not enough for all float32)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import metadef as md
from metadef.core.errors import BackendError
from metadef.ir import GraphBuilder
from metadef.ops.defs.cast_e8m0 import to_float8e8m0
from metadef.ops.defs.cast_string import format_numbers, parse_floats
from metadef.shape import parse_type
from metadef.testing.onnx_cases import infer_text, one_node_model
from metadef.testing.oracle import run_onnxruntime

TARGETS = ["reference", pytest.param("x86", marks=pytest.mark.jit)]
T = TensorProto


def S(*items: str) -> np.ndarray:
    """A string tensor (a numpy object array of str)."""
    return np.array(items, dtype=object)


def chain(x: np.ndarray, *steps: int, opset: int = 21, **attrs: Any) -> onnx.ModelProto:
    """Casts of ``x`` to each type of ``steps`` in turn (the first with ``attrs``): how a type
    numpy cannot hand ONNX Runtime (bfloat16, float8, int4) gets in or out of a string."""
    names = ["x", *(f"c{i}" for i in range(len(steps) - 1)), "out0"]
    nodes = [helper.make_node("Cast", [a], [b], to=to, name=f"cast{i}", **(attrs if i == 0 else {}))
             for i, (a, b, to) in enumerate(zip(names, names[1:], steps))]
    elem = T.STRING if x.dtype == object else helper.np_dtype_to_tensor_dtype(x.dtype)
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", elem, x.shape)],
                              [helper.make_empty_tensor_value_info("out0")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def run(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], target: str) -> np.ndarray:
    got = md.compile(md.import_onnx(model), target=target).run(dict(feeds))
    return got[model.graph.output[0].name]


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    """Same shape and dtype; text equal, numbers equal bit for bit up to NaN's payload."""
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    if want.dtype == object:
        assert all(type(s) is str for s in got.reshape(-1).tolist())
        assert got.tolist() == want.tolist()
    elif want.dtype.kind == "f":
        assert np.array_equal(got, want, equal_nan=True), (got, want)
        assert np.array_equal(np.signbit(got) | np.isnan(got), np.signbit(want) | np.isnan(want))
    else:
        assert np.array_equal(got, want), (got, want)


def check(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], target: str) -> np.ndarray:
    """metadef on ``target`` gives what ONNX Runtime gives; returns that."""
    want = np.asarray(run_onnxruntime(model, feeds)[model.graph.output[0].name])
    assert_same(run(model, feeds, target), want)
    return want


# ------------------------------------------------------------------------- numbers to text

EDGES = [0.1, 1e-7, 3.0, 1e20, np.nan, np.inf, -np.inf, -0.0, 0.0, 1 / 3, 123456789.0, 1e-45, 3.4028235e38,
         12345.678, -2.5e-5, 1e16, 1e17, 100.0, 1e7, 1e8, 1e-4, 1e-5, 5e-324, 1.7976931348623157e308, 0.5,
         1.00000005, 12345678.5, 2.0 ** -20, -1e-300]


def float_values(dt: Any, count: int = 200) -> np.ndarray:
    """The edge values in ``dt`` and random bit patterns of it (NaNs, denormals included)."""
    bits = np.random.default_rng(0).integers(0, 2 ** 63, count, dtype=np.int64)
    random = bits.astype({8: np.uint64, 4: np.uint32, 2: np.uint16}[np.dtype(dt).itemsize]).view(dt)
    with np.errstate(over="ignore"):
        return np.concatenate([np.array(EDGES).astype(dt), random])


def int_values(dt: Any) -> np.ndarray:
    info = np.iinfo(dt)
    random = np.random.default_rng(1).integers(info.min, info.max, 50, dtype=dt, endpoint=True)
    return np.concatenate([np.array([info.min, info.max, 0, 7, info.max // 3], dt), random])


NUMBERS = {
    **{np.dtype(dt).name: float_values(dt) for dt in (np.float32, np.float64, np.float16)},
    **{np.dtype(dt).name: int_values(dt) for dt in (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32,
                                                    np.int64, np.uint64)},
    "bool": np.array([True, False, True]),
}


@pytest.mark.parametrize("name", sorted(NUMBERS))
@pytest.mark.parametrize("target", TARGETS)
def test_numbers_print_as_onnxruntime_prints_them(name: str, target: str) -> None:
    x = NUMBERS[name].reshape(-1, 1)
    check(one_node_model("Cast", {"x": x}, to=T.STRING), {"x": x}, target)


def test_the_text_of_edge_values() -> None:
    got = format_numbers(np.array([0.1, 1e-7, 3.0, 1e20, np.nan, np.inf, -np.inf, -0.0], np.float32))
    assert got.tolist() == ["0.1", "1e-07", "3", "1e+20", "NaN", "INF", "-INF", "-0"]
    assert format_numbers(np.array([1 / 3, 12345678.5])).tolist() == ["0.33333333", "12345678"]  # eight digits, even
    assert format_numbers(np.array([-np.nan], np.float64)).tolist() == ["NaN"]


NARROW = {"bfloat16": T.BFLOAT16, "float8e4m3fn": T.FLOAT8E4M3FN, "float8e5m2": T.FLOAT8E5M2,
          "float8e4m3fnuz": T.FLOAT8E4M3FNUZ, "float8e5m2fnuz": T.FLOAT8E5M2FNUZ}


@pytest.mark.parametrize("name", sorted(NARROW))
@pytest.mark.parametrize("target", TARGETS)
def test_narrow_floats_print_as_onnxruntime_prints_them(name: str, target: str) -> None:
    x = np.array([0.1, 3.0, -1.5, 2.0, 1e-7, 448.0, 1e6, np.nan, np.inf, -np.inf, -0.0, 0.3, 57344.0], np.float32)
    check(chain(x, NARROW[name], T.STRING), {"x": x}, target)


@pytest.mark.parametrize("code, values", [(T.INT4, [-8, 7, 3, 0, -1, 5]), (T.UINT4, [15, 7, 3, 0, 1, 5])],
                         ids=["int4", "uint4"])
@pytest.mark.parametrize("target", TARGETS)
def test_int4_prints_in_decimal(code: int, values: list[int], target: str) -> None:
    x = np.array(values, np.int32)
    check(chain(x, code, T.STRING), {"x": x}, target)


# ------------------------------------------------------------------------- text to numbers

FLOAT_TEXTS = ["3.14", " 1e3", "1e3 ", "\t\n-2.5", "INF", "-inf", "+INF", "Infinity", "infinit", "NaN", "-nan",
               "nan(123)", "+5", "0x10", "0x1.8p1", "-0X.8P-3", "1_000", "1,5", "3abc", ".5", "5.", "-.5e-3", "1e50",
               "1e-50", "1e-40", "1e-45", "1e-46", "1E8", "0b101", "00012", "1e", "1e+", "\v5", "\f5\r",
               "3.4028235e38", "3.4028236e38", "0.1", "16777217", "65520", "65519.99", "1.00048828125", "-0",
               "0x1p-1074", "0x1.8p-1023", "2.2250738585072013e-308", "0e-500", "0x.8", "0x", "0x.p1", "0x1p", "1.e5",
               "1..5", "1.7976931348623157e308", "0x1.fffffffffffff7p1023", "1\x002", "0.00000" + "0" * 400 + "1e400"]


@pytest.mark.parametrize("to", [T.FLOAT, T.DOUBLE, T.FLOAT16], ids=["float32", "float64", "float16"])
@pytest.mark.parametrize("target", TARGETS)
def test_text_reads_as_floats_as_onnxruntime_reads_it(to: int, target: str) -> None:
    x = S(*FLOAT_TEXTS)
    check(one_node_model("Cast", {"x": x}, to=to), {"x": x}, target)


NARROW_TEXTS = ["0.1", "1.00390625", "1.01171875", "65504", "1e6", "-1e6", "nan", "inf", "-inf", "2.5", "0.0078125",
                "500", "448", "1e-8", "-0", "240.5"]


@pytest.mark.parametrize("name, saturate", [(name, 1) for name in sorted(NARROW)]
                         + [(name, 0) for name in sorted(NARROW) if name.startswith("float8")])
def test_text_reads_as_narrow_floats_through_float32(name: str, saturate: int) -> None:
    # (Not e5m2 without saturation above its range: ONNX Runtime's float-to-e5m2 makes NaN of
    # 57344 < |x| < 65536 where metadef's numeric Cast, as ml_dtypes, makes inf.)
    x = S(*(t for t in NARROW_TEXTS if not (name == "float8e5m2" and not saturate and t == "65504")))
    check(chain(x, NARROW[name], T.FLOAT, saturate=saturate), {"x": x}, "reference")


SIGNED_TEXTS = ["5", " +5", "-5", "3.9", "-3.9", "1e3", "0x10", "200", "-129", "256", "-1", "65536", "2147483648",
                "9223372036854775807", "-9223372036854775808", "12abc", " 7 ", "0", "-0", "007", "0" * 30 + "42"]
UNSIGNED_TEXTS = [*SIGNED_TEXTS, "9223372036854775808", "18446744073709551615", "-18446744073709551615",
                  "-9223372036854775809"]
INTEGERS = {"int8": T.INT8, "uint8": T.UINT8, "int16": T.INT16, "uint16": T.UINT16, "int32": T.INT32,
            "uint32": T.UINT32, "int64": T.INT64, "uint64": T.UINT64, "bool": T.BOOL}


@pytest.mark.parametrize("name", sorted(INTEGERS))
@pytest.mark.parametrize("target", TARGETS)
def test_text_reads_as_integers_as_onnxruntime_reads_it(name: str, target: str) -> None:
    x = S(*(SIGNED_TEXTS if name.startswith("int") else UNSIGNED_TEXTS)).reshape(-1, 1)
    check(one_node_model("Cast", {"x": x}, to=INTEGERS[name]), {"x": x}, target)


@pytest.mark.parametrize("code, texts", [(T.INT4, ["3", "-8", "7", "0", "-1", " 5", "7x", "-0", "100", "-100"]),
                                         (T.UINT4, ["3", "15", "0", " 5", "7x", "100"])], ids=["int4", "uint4"])
@pytest.mark.parametrize("target", TARGETS)
def test_text_reads_as_int4_through_a_float(code: int, texts: list[str], target: str) -> None:
    # (integral text only: ONNX Runtime rounds a fraction half away from zero where metadef's
    # numeric float-to-int4 Cast truncates.)
    x = S(*texts)
    check(chain(x, code, T.INT32), {"x": x}, target)


def test_text_reads_as_float8e8m0_by_round_mode() -> None:
    """ONNX Runtime has no float8e8m0 Cast: the text reads as float32 and rounds as a float32 does."""
    x = S("3", "0.3", "1e30", "-2", "nan")
    for mode in ("up", "down", "nearest"):
        got = run(chain(x, T.FLOAT8E8M0, opset=24, round_mode=mode), {"x": x}, "reference")
        want = to_float8e8m0(np.array([3, 0.3, 1e30, -2, np.nan], np.float32), mode, saturate=True)
        assert got.view(np.uint8).tolist() == want.view(np.uint8).tolist()


# -------------------------------------------------------------------------------- refusals

REFUSED = [("abc", T.FLOAT), ("", T.DOUBLE), (" ", T.FLOAT16), ("1e400", T.FLOAT), ("-0x1p1024", T.DOUBLE),
           ("1e-310", T.DOUBLE), ("1e-400", T.FLOAT), ("-", T.INT32), ("true", T.BOOL), (".e5", T.FLOAT),
           ("9223372036854775808", T.INT64), ("18446744073709551616", T.UINT64), ("\u0663", T.INT8),
           ("\u00a05", T.FLOAT), ("in", T.FLOAT)]


@pytest.mark.parametrize("text, to", REFUSED, ids=[f"{t!r}-{to}" for t, to in REFUSED])
@pytest.mark.parametrize("target", TARGETS)
def test_text_onnxruntime_refuses_fails_naming_the_node_and_the_text(text: str, to: int, target: str) -> None:
    x = S("1", text)
    model = one_node_model("Cast", {"x": x}, to=to, name="my_cast")
    with pytest.raises(Exception, match="Cast node"):
        run_onnxruntime(model, {"x": x})
    with pytest.raises(BackendError, match=rf"Cast node my_cast: Cast from string to \w+: element 1 of the "
                                           rf"string tensor \[2\], {re.escape(repr(text))}, is "):
        run(model, {"x": x}, target)


# ------------------------------------------------------------------------------ round trips


def test_every_float16_and_bfloat16_prints_and_reads_back_as_itself() -> None:
    bits = np.arange(2 ** 16, dtype=np.uint16)
    for dt, code in ((np.float16, T.FLOAT16), (ml_dtypes.bfloat16, T.BFLOAT16)):
        x = bits.view(dt)
        text = format_numbers(x)
        x32 = x.astype(np.float32)
        assert text.tolist() == run_onnxruntime(chain(x32, code, T.STRING), {"x": x32})["out0"].tolist()
        back = parse_floats(text).astype(np.float32).astype(dt)
        nan = np.isnan(x32)
        assert np.array_equal(back.view(np.uint16)[~nan], bits[~nan])
        assert np.isnan(back[nan].astype(np.float32)).all()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(width=32), min_size=1, max_size=40))
def test_float32_prints_as_onnxruntime_and_reads_back_within_one_ulp(values: list[float]) -> None:
    x = np.array(values, np.float32)
    text = format_numbers(x)
    assert text.tolist() == run_onnxruntime(one_node_model("Cast", {"x": x}, to=T.STRING), {"x": x})["out0"].tolist()
    back = parse_floats(text).astype(np.float32)
    assert_same(back, run_onnxruntime(one_node_model("Cast", {"x": text}, to=T.FLOAT), {"x": text})["out0"])
    finite = np.isfinite(x)
    with np.errstate(over="ignore"):  # (the spacing at float32's largest value is inf)
        ulp = np.spacing(np.abs(x[finite]))
    assert np.all(np.abs(back[finite].astype(np.float64) - x[finite]) <= ulp)
    assert np.array_equal(back[~finite], x[~finite], equal_nan=True)


# -------------------------------------------------------------- text to text, CastLike, types


@pytest.mark.parametrize("target", TARGETS)
def test_text_to_text_is_a_copy(target: str) -> None:
    x = S("é", "", " 1e3", "abc")
    got = check(one_node_model("Cast", {"x": x}, to=T.STRING), {"x": x}, target)
    assert got.tolist() == x.tolist()
    check(one_node_model("CastLike", {"x": x, "like": S("")}), {"x": x, "like": S("")}, target)


CAST_LIKE = {
    "to-string": (np.array([0.1, np.inf, -0.0], np.float32), S("")),
    "from-string-to-int16": (S("7", " -3", "40000"), np.array([0], np.int16)),
    "from-string-to-float64": (S("0.1", "-INF", "0x1p-3"), np.array([0.0])),
    "from-string-to-bool": (S("0", "2", "-0"), np.array([True])),
    "bool-to-string": (np.array([[True, False]]), S("x")),
}


@pytest.mark.parametrize("name", sorted(CAST_LIKE))
@pytest.mark.parametrize("target", TARGETS)
def test_cast_like_casts_to_and_from_strings(name: str, target: str) -> None:
    x, like = CAST_LIKE[name]
    check(one_node_model("CastLike", {"x": x, "like": like}), {"x": x, "like": like}, target)


@pytest.mark.parametrize("target", TARGETS)
def test_cast_like_refuses_text_naming_the_node(target: str) -> None:
    x, like = S("12", "twelve"), np.array([0], np.int32)
    model = one_node_model("CastLike", {"x": x, "like": like}, name="my_cast_like")
    with pytest.raises(BackendError, match=r"CastLike node my_cast_like: Cast from string to int32: element 1 .*'twe"):
        run(model, {"x": x, "like": like}, target)


def test_types_admit_strings_on_either_side() -> None:
    assert infer_text("Cast", ["str[n,2]"], {"to": T.FLOAT}) == ["f32[n,2]"]
    assert infer_text("Cast", ["f16[3]"], {"to": T.STRING}) == ["str[3]"]
    assert infer_text("Cast", ["str[3]"], {"to": T.STRING, "saturate": 0, "round_mode": "down"}) == ["str[3]"]
    assert infer_text("CastLike", ["str[n]", "i8[]"]) == ["i8[n]"]
    assert infer_text("CastLike", ["bf16[2]", "str[1]"]) == ["str[2]"]


@pytest.mark.parametrize("target", TARGETS)
def test_saturate_and_round_mode_do_not_touch_text(target: str) -> None:
    """ONNX Runtime refuses saturate=0 but for float8 targets; metadef lets it be where it means nothing."""
    x = np.array([0.1, 448.5, 1e6], np.float32)
    model = one_node_model("Cast", {"x": x}, to=T.STRING, saturate=0, round_mode="down", opset=24)
    assert run(model, {"x": x}, target).tolist() == ["0.1", "448.5", "1000000"]


@pytest.mark.parametrize("target", TARGETS)
def test_a_string_constant_cast_to_a_shape_reshapes(target: str) -> None:
    """The constant folds (text read as ONNX Runtime reads it, not as Python's int()); shape
    inference does not take the text for dims."""
    b = GraphBuilder("reshape")
    x = b.input("x", parse_type("f32[6]"))
    shape, = b.node("Cast", [b.const("text", S("2.5", " 3x"))], {"to": T.INT64}, name="to_shape")
    b.output(*b.node("Reshape", [x, shape], name="reshape"))
    graph = b.build()
    assert not any(n.op == "Cast" for n in md.optimize(graph).nodes)
    got = md.compile(graph, target=target).run({"x": np.arange(6, dtype=np.float32)})
    (y,) = got.values()
    assert y.shape == (2, 3) and y.tolist() == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.jit
def test_x86_runs_string_casts_on_their_reference_kernel() -> None:
    b = GraphBuilder("casts")
    x = b.input("x", parse_type("f32[n]"))
    text, = b.node("Cast", [x], {"to": T.STRING}, name="print")
    back, = b.node("Cast", [text], {"to": T.FLOAT}, name="read")
    b.output(back, *b.node("Relu", [back], name="relu"))
    sess = md.compile(b.build(), target="x86", cache=False)
    plan = {p.node: p for p in sess.executable.plan}
    assert all(plan[n].kind == "reference" and "string tensors" in plan[n].reason for n in ("print", "read"))
    got = sess.run({"x": np.array([0.1, -2.0, np.inf], np.float32)})
    assert [g.tolist() for g in got.values()] == [[np.float32(0.1), -2.0, np.inf], [np.float32(0.1), 0.0, np.inf]]
