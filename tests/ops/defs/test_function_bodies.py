"""What ONNX's own function bodies (the ``_expanded`` node tests) rely on beyond the letter of
the op specs: ``Range`` taking one-element 1-D tensors as its scalars (AffineGrid's body builds
them with Slice and Unsqueeze), as ONNX Runtime accepts."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from metadef.core.errors import ShapeError
from metadef.testing.onnx_cases import check_model, infer_text, one_node_model


@pytest.mark.parametrize(("start", "limit", "delta"), [
    (np.array([2], np.int64), np.array([11], np.int64), np.array([3], np.int64)),
    (np.array(1.5, np.float32), np.array([-2.0], np.float32), np.array([-0.5], np.float32)),
    (np.array([4], np.int32), np.array(4, np.int32), np.array(1, np.int32)),
])
def test_range_takes_one_element_tensors(start: np.ndarray, limit: np.ndarray, delta: np.ndarray) -> None:
    feeds = {"start": start, "limit": limit, "delta": delta}
    check_model(one_node_model("Range", feeds, opset=11), feeds)


def test_range_one_element_shapes_and_errors() -> None:
    consts: list[Any] = [np.array([0]), np.array([7]), np.array([2])]
    assert infer_text("Range", ["i64[1]", "i64[1]", "i64[1]"], values=consts) == ["i64[4]"]
    assert infer_text("Range", ["i64[]", "i64[n]", "i64[]"])[0].startswith("i64[range")
    with pytest.raises(ShapeError, match=r"input 1 must be a scalar \(or a one-element 1-D tensor\), got shape \[2\]"):
        infer_text("Range", ["i64[]", "i64[2]", "i64[]"])
    with pytest.raises(ShapeError, match="got shape \\[1,1\\]"):
        infer_text("Range", ["i64[1,1]", "i64[]", "i64[]"])


@pytest.mark.slow
def test_affine_grid_function_bodies_pass() -> None:
    from metadef.testing.conformance import format_report, run_cases

    report = run_cases(op="AffineGrid", pattern="_expanded")
    assert report.totals()["pass"] == report.totals()["total"] == 4, format_report(report)
