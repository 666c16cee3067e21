"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss: shapes, errors, ORT numerics."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from metadef.core.errors import ShapeError
from metadef.testing.onnx_cases import check_model, infer_text, one_node_model

RNG = np.random.default_rng(23)
LOSSES = ("NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss")


def test_loss_shapes() -> None:
    for op in LOSSES:
        assert infer_text(op, ["f32[n,7,h,w]", "i64[n,h,w]"], {"reduction": "none"},
                          n_outputs=1) == ["f32[n,h,w]"]
        assert infer_text(op, ["f16[n,7]", "i32[n]", "f16[7]"], {"reduction": "sum"},
                          n_outputs=1) == ["f16[]"]
    assert infer_text("SoftmaxCrossEntropyLoss", ["f64[4,3,2]", "i64[4,2]"], {},
                      n_outputs=2) == ["f64[]", "f64[4,3,2]"]


def test_loss_errors_name_the_constraint() -> None:
    with pytest.raises(ShapeError, match="target must be shaped like the input"):
        infer_text("NegativeLogLikelihoodLoss", ["f32[4,7,5]", "i64[4,6]"])
    with pytest.raises(ShapeError, match="weight must be 1-D with one entry per class"):
        infer_text("SoftmaxCrossEntropyLoss", ["f32[4,7]", "i64[4]", "f32[6]"])
    with pytest.raises(ShapeError, match="reduction='avg' is not one of none, sum, mean"):
        infer_text("SoftmaxCrossEntropyLoss", ["f32[4,7]", "i64[4]"], {"reduction": "avg"})
    with pytest.raises(ShapeError, match="rank >= 2"):
        infer_text("NegativeLogLikelihoodLoss", ["f32[7]", "i64[]"])


def _case(shape: tuple[int, ...], weighted: bool, ignore: int | None) -> dict[str, np.ndarray]:
    classes = shape[1]
    target = RNG.integers(0, classes, (shape[0], *shape[2:])).astype(np.int64)
    if ignore is not None:
        target.reshape(-1)[::3] = ignore  # some positions ignored, some out of [0, C)
    feeds = {"x": RNG.standard_normal(shape).astype(np.float32), "t": target}
    if weighted:
        feeds["w"] = RNG.uniform(0.1, 2.0, classes).astype(np.float32)
    return feeds


@pytest.mark.parametrize("op", LOSSES)
@pytest.mark.parametrize(("shape", "weighted", "ignore", "reduction"), [
    ((6, 5), False, None, "mean"),
    ((6, 5), True, None, "sum"),
    ((3, 4, 7), True, 2, "mean"),
    ((3, 4, 7), False, -3, "none"),
    ((2, 6, 3, 4), True, 11, "none"),
    ((2, 6, 3, 4), False, 0, "mean"),
    ((5, 3, 2, 2, 2), True, None, "mean"),
])
def test_loss_matches_onnxruntime(op: str, shape: tuple[int, ...], weighted: bool,
                                  ignore: int | None, reduction: str) -> None:
    feeds = _case(shape, weighted, ignore)
    if op == "NegativeLogLikelihoodLoss":  # its input is a log-probability
        x = feeds["x"]
        feeds["x"] = (x - np.log(np.exp(x).sum(axis=1, keepdims=True))).astype(np.float32)
    attrs: dict[str, Any] = {"reduction": reduction}
    if ignore is not None:
        attrs["ignore_index"] = ignore
    n_out = 2 if op == "SoftmaxCrossEntropyLoss" else 1
    model = one_node_model(op, feeds, n_out=n_out, opset=13, **attrs)
    check_model(model, feeds, rtol=1e-5, atol=1e-5)


def test_sce_in_float64_and_int32_labels() -> None:
    feeds = {"x": RNG.standard_normal((4, 9, 3)), "t": RNG.integers(0, 9, (4, 3)).astype(np.int32)}
    model = one_node_model("SoftmaxCrossEntropyLoss", feeds, n_out=2, opset=13, reduction="sum")
    check_model(model, feeds, rtol=1e-9, atol=1e-9)


def test_loss_refuses_a_target_outside_the_classes() -> None:
    from metadef.core.errors import BackendError
    from metadef.testing.onnx_cases import run_metadef

    feeds = {"x": np.zeros((2, 3), np.float32), "t": np.array([0, 5], np.int64)}
    model = one_node_model("NegativeLogLikelihoodLoss", feeds, opset=13)
    with pytest.raises(BackendError, match="target 5 is outside the 3 classes"):
        run_metadef(model, feeds)


@pytest.mark.slow
def test_conformance() -> None:
    from metadef.testing.conformance import format_report, run_cases

    report = run_cases(op=LOSSES)
    assert not report.failures() and report.totals()["unsupported"] == 0, format_report(report)
