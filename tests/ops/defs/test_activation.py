"""Activations, Clip, Dropout and the Softmax family: shapes, errors, old opsets, numerics."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import metadef as md
from metadef.backends.reference import run_node
from metadef.core.errors import ShapeError, UnsupportedOpError
from metadef.ops import get_op
from metadef.shape import parse_type
from metadef.testing.onnx_cases import check_model, infer_text, one_node_model, run_metadef

RNG = np.random.default_rng(1)


def infer(op: str, types: list[str | None], attrs: dict | None = None) -> list[str]:
    return infer_text(op, types, attrs, node="/a/node")


one_node = one_node_model


check_ort = check_model


# ------------------------------------------------------------------ shapes and errors


def test_shapes_are_symbolic() -> None:
    x = "f32[batch,seq,64]"
    for op in ("Relu", "Gelu", "Softmax", "LogSoftmax", "Hardmax", "Clip", "Mish"):
        assert infer(op, [x]) == [x], op
    assert infer("Clip", ["i8[n,3]", "i8[]", None]) == ["i8[n,3]"]
    assert infer("PRelu", ["f32[batch,3,h,w]", "f32[3,1,1]"]) == ["f32[batch,3,h,w]"]
    assert infer("Dropout", ["f16[batch,8]", "f32[]", "b8[]"]) == ["f16[batch,8]", "b8[batch,8]"]
    assert infer("Softmax", ["bf16[b,4,s]"], {"axis": -3}) == ["bf16[b,4,s]"]


def test_axis_out_of_range_names_node_and_axis() -> None:
    with pytest.raises(ShapeError, match=r"(?s)op Softmax \(node /a/node\): inputs \[f32\[batch,8\]\]"
                                         r".*axis 2 is out of range for rank 2.*\[-2, 1\]"):
        infer("Softmax", ["f32[batch,8]"], {"axis": 2})
    with pytest.raises(ShapeError, match=r"Hardmax \(node /a/node\).*axis -3 is out of range"):
        infer("Hardmax", ["f32[batch,8]"], {"axis": -3})
    with pytest.raises(ShapeError, match=r"LogSoftmax \(node /a/node\).*rank >= 1"):
        infer("LogSoftmax", ["f32[]"])


def test_bad_gelu_approximation_is_named() -> None:
    with pytest.raises(ShapeError, match=r"Gelu \(node /a/node\).*approximate must be 'none' or "
                                         r"'tanh', got 'fast'"):
        infer("Gelu", ["f32[n]"], {"approximate": "fast"})


def test_softmax_is_a_three_statement_program() -> None:
    prog, _ = get_op("Softmax").semantics.instantiate({"axis": 1, "_coerce_2d": None},
                                                      [(2, 3, 4)])
    assert [s.name for s in prog.statements] == ["t_max", "t_sum", "Y"]
    assert str(prog.statements[0]) == "t_max[..., j0] = max[k0] X[..., k0, j0]"
    legacy, _ = get_op("LogSoftmax").semantics.instantiate({"axis": 1, "_coerce_2d": 1},
                                                           [(2, 3, 4)])
    assert str(legacy.statements[0]) == "t_max[...] = max[k0, k1] X[..., k0, k1]"
    assert not get_op("Hardmax").semantics.opaque
    assert get_op("Softmax").role.value == "reduction"


# ------------------------------------------------------------------ numerics against ORT

POINTWISE = [
    ("Relu", {}), ("LeakyRelu", {"alpha": 0.1}), ("Elu", {"alpha": 0.7}), ("Selu", {}),
    ("Celu", {"alpha": 1.5}), ("Sigmoid", {}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}),
    ("HardSwish", {}), ("Tanh", {}), ("Softplus", {}), ("Softsign", {}), ("Mish", {}),
    ("ThresholdedRelu", {"alpha": 0.5}), ("Shrink", {"lambd": 0.7, "bias": 0.2}),
    ("Gelu", {}), ("Gelu", {"approximate": "tanh"}),
]


# ORT has no float64 Celu, nor the float64 Erf that Gelu uses.
POINTWISE_CASES = [(op, attrs, dtype) for op, attrs in POINTWISE for dtype in (np.float32, np.float64)
                   if dtype == np.float32 or op not in ("Celu", "Gelu")]


@pytest.mark.parametrize(("op", "attrs", "dtype"), POINTWISE_CASES,
                         ids=[f"{o}{a}-{np.dtype(d).name}" for o, a, d in POINTWISE_CASES])
def test_pointwise_like_ort(op: str, attrs: dict, dtype: Any) -> None:
    x = np.concatenate([np.linspace(-6, 6, 25), [-1e-4, 1e-4, 30.0, -30.0]]).astype(dtype)
    opset = 20 if op == "Gelu" else 18
    check_ort(one_node(op, {"x": x.reshape(29, 1)}, opset=opset, **attrs), {"x": x.reshape(29, 1)})


@pytest.mark.parametrize("opset", [7, 9, 16])
def test_prelu_broadcasts_slope_like_ort(opset: int) -> None:
    x = RNG.normal(size=(2, 3, 4, 5)).astype(np.float32)
    slope = np.array([0.1, 0.2, 0.3], np.float32).reshape(3, 1, 1)
    check_ort(one_node("PRelu", {"x": x}, {"slope": slope}, opset=opset), {"x": x})


@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 4), (2, 3, 4, 5)])
def test_opset6_prelu_slope_of_c_values_is_per_channel(shape: tuple[int, ...]) -> None:
    x = RNG.normal(size=shape).astype(np.float32)
    slope = np.array([0.1, 0.2, 0.3], np.float32)
    (y,) = run_metadef(one_node("PRelu", {"x": x}, {"slope": slope}, opset=6), {"x": x})
    per_channel = slope.reshape(3, *[1] * (len(shape) - 2))
    np.testing.assert_allclose(y, np.where(x < 0, per_channel * x, x), rtol=1e-6)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axis", [None, 0, 1, -1, -2])
def test_softmax_family_axis_semantics_like_ort(op: str, opset: int, axis: int | None) -> None:
    x = RNG.normal(size=(2, 3, 4, 5)).astype(np.float32)
    x[0, 0, 0, :2] = 3.0  # a tie: Hardmax picks the first
    attrs = {} if axis is None else {"axis": axis}
    check_ort(one_node(op, {"x": x}, opset=opset, **attrs), {"x": x})


def test_softmax_large_numbers_and_float16() -> None:
    x = np.array([[1000.0, 1001.0, 1002.0], [-1e4, 0.0, 1e4]], np.float32)
    check_ort(one_node("Softmax", {"x": x}, opset=13), {"x": x})
    h = RNG.normal(size=(3, 7)).astype(np.float16)
    check_ort(one_node("LogSoftmax", {"h": h}, opset=13), {"h": h}, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize(("bounds", "opset"), [({"min": -0.5, "max": 0.5}, 6), ({"max": 0.2}, 6),
                                               ({}, 6), ({"min": -0.1}, 11)])
def test_clip_old_attribute_forms_like_ort(bounds: dict, opset: int) -> None:
    x = RNG.normal(size=(3, 4)).astype(np.float32)
    if opset >= 11:
        model = one_node("Clip", {"x": x}, {k: np.float32(v) for k, v in bounds.items()},
                         opset=opset)
    else:
        model = one_node("Clip", {"x": x}, opset=opset, **bounds)
    check_ort(model, {"x": x})


def test_clip_only_max_and_integers_like_ort() -> None:
    x = RNG.integers(-100, 100, (4, 5)).astype(np.int32)
    model = one_node("Clip", {"x": x}, {"hi": np.int32(7)}, inputs=["x", "", "hi"], opset=13)
    check_ort(model, {"x": x})
    model = one_node("Clip", {"x": x}, {"lo": np.int32(9), "hi": np.int32(3)}, opset=13)
    check_ort(model, {"x": x})  # min > max: everything becomes max


@pytest.mark.parametrize("opset", [7, 10, 13])
def test_dropout_is_identity_in_inference_like_ort(opset: int) -> None:
    # (ORT's opset-10 kernel leaves the inference mask all false; ONNX's reference and
    # ORT from opset 12 on give all true, as metadef does.)
    x = RNG.normal(size=(3, 4)).astype(np.float32)
    check_ort(one_node("Dropout", {"x": x}, opset=opset, ratio=0.3)
              if opset < 12 else one_node("Dropout", {"x": x}, {"r": np.float32(0.3)},
                                          opset=opset, n_out=2), {"x": x})


def test_dropout_training_mode_is_refused_clearly() -> None:
    x = np.ones((2, 3), np.float32)
    feeds = {"x": x, "t": np.array(True)}
    model = one_node("Dropout", feeds, {"r": np.float32(0.5)}, inputs=["x", "r", "t"], n_out=2)
    with pytest.raises(UnsupportedOpError, match=r"training_mode=true with ratio 0\.5.*inference"):
        run_metadef(model, feeds)
    y, mask = run_metadef(model, {"x": x, "t": np.array(False)})
    assert np.array_equal(y, x) and mask.dtype == np.bool_ and mask.all()
    const = one_node("Dropout", {"x": x}, {"t": np.array(True)}, inputs=["x", "", "t"])
    with pytest.raises(ShapeError, match=r"Dropout .*training_mode is the constant true"):
        md.import_onnx(const)


def test_dropout_opset6_default_is_training_and_refused() -> None:
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ShapeError, match="training_mode is the constant true"):
        md.import_onnx(one_node("Dropout", {"x": x}, opset=6))
    (y,) = run_metadef(one_node("Dropout", {"x": x}, opset=6, is_test=1), {"x": x})
    assert np.array_equal(y, x)


def test_run_node_hardmax_first_maximum() -> None:
    x = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]], np.float32)
    (y,) = run_node(get_op("Hardmax"), {"axis": -1, "_coerce_2d": None}, [x],
                    [parse_type("f32[2,3]")])
    assert y.tolist() == [[0, 1, 0], [1, 0, 0]]


# ------------------------------------------------------------------ the ONNX node tests

ACTIVATION_OPS = [
    "Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Celu", "Clip", "Sigmoid", "HardSigmoid",
    "HardSwish", "Tanh", "Gelu", "Softplus", "Softsign", "Mish", "ThresholdedRelu", "Shrink",
    "Softmax", "LogSoftmax", "Hardmax", "Dropout",
]


@pytest.mark.slow
def test_onnx_node_tests_pass() -> None:
    from metadef.testing.conformance import format_report, run_cases

    report = run_cases(op=ACTIVATION_OPS)
    assert not report.failures(), format_report(report)
