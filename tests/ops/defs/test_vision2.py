"""MaxUnpool and DeformConv: shapes, errors, and numerics against ONNX Runtime (and onnx's
reference evaluator for MaxUnpool's output_shape, which the node tests define)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

from metadef.core.errors import ShapeError
from metadef.testing.onnx_cases import assert_same, check_model, infer_text, one_node_model, run_metadef
from metadef.testing.oracle import run_onnxruntime

RNG = np.random.default_rng(22)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


# ------------------------------------------------------------------------------ MaxUnpool


def test_maxunpool_shapes_and_errors() -> None:
    assert infer_text("MaxUnpool", ["f32[n,3,h,w]", "i64[n,3,h,w]"],
                      {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}) == \
        ["f32[n,3,h*2 - 1,w*2 - 1]"]
    assert infer_text("MaxUnpool", ["f32[n,3,h,w]", "i64[n,3,h,w]", "i64[4]"],
                      {"kernel_shape": [2, 2]}, [None, None, [2, 3, 9, 9]]) == ["f32[2,3,9,9]"]
    with pytest.raises(ShapeError, match="one axis per kernel axis"):
        infer_text("MaxUnpool", ["f32[n,3,h]", "i64[n,3,h]"], {"kernel_shape": [2, 2]})
    with pytest.raises(ShapeError, match="strides must hold 2 values"):
        infer_text("MaxUnpool", ["f32[n,3,h,w]", "i64[n,3,h,w]"],
                   {"kernel_shape": [2, 2], "strides": [2]})


def _pooled(shape: tuple[int, ...], attrs: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """A MaxPool's values and indices on ONNX Runtime: MaxUnpool's natural inputs."""
    x = rand(*shape)
    m = one_node_model("MaxPool", {"x": x}, n_out=2, opset=12, **attrs)
    got = run_onnxruntime(m, {"x": x})
    return got["out0"], got["out1"]


@pytest.mark.parametrize(("shape", "attrs"), [
    ((2, 3, 8, 6), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ((1, 2, 9, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((2, 2, 9), {"kernel_shape": [3], "strides": [3]}),
])
def test_maxunpool_matches_onnxruntime(shape: tuple[int, ...], attrs: dict[str, Any]) -> None:
    values, index = _pooled(shape, attrs)
    feeds = {"x": values, "i": index}
    check_model(one_node_model("MaxUnpool", feeds, opset=22, **attrs), feeds)


def test_maxunpool_output_shape_pads_at_the_end() -> None:
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2]}
    values, index = _pooled((1, 2, 6, 4), attrs)
    feeds = {"x": values, "i": index}
    m = one_node_model("MaxUnpool", feeds, {"shape": np.array([1, 2, 7, 5], np.int64)},
                       opset=22, **attrs)
    got = run_metadef(m, feeds)
    assert_same(got, ReferenceEvaluator(m).run(None, feeds))
    assert got[0].shape == (1, 2, 7, 5) and not got[0][:, :, 6:].any()


def test_maxunpool_refuses_an_index_outside_the_unpooled_tensor() -> None:
    from metadef.core.errors import BackendError

    feeds = {"x": np.ones((1, 1, 2), np.float32), "i": np.array([[[1, 4]]], np.int64)}
    m = one_node_model("MaxUnpool", feeds, opset=22, kernel_shape=[2], strides=[2])
    with pytest.raises(BackendError, match="index 4 is outside the 4 elements"):
        run_metadef(m, feeds)


# ----------------------------------------------------------------------------- DeformConv


def test_deform_conv_shapes_and_errors() -> None:
    assert infer_text("DeformConv", ["f32[n,4,h,w]", "f32[6,2,3,3]", "f32[n,36,p,q]"],
                      {"group": 2, "offset_group": 2}) == ["f32[n,6,p,q]"]
    with pytest.raises(ShapeError, match="times group"):
        infer_text("DeformConv", ["f32[n,4,h,w]", "f32[6,3,3,3]", "f32[n,18,p,q]"])
    with pytest.raises(ShapeError, match=r"offset_group \* prod\(kernel_shape\) \* 2 = 18"):
        infer_text("DeformConv", ["f32[n,4,h,w]", "f32[6,4,3,3]", "f32[n,16,p,q]"])


def _out(size: int, kernel: int, stride: int, pad: int, dilation: int) -> int:
    return (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1


@pytest.mark.parametrize(("attrs", "extras"), [
    ({"kernel_shape": [3, 3]}, ()),
    ({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}, ("bias",)),
    ({"kernel_shape": [2, 3], "dilations": [2, 1], "group": 2, "offset_group": 2}, ("bias", "mask")),
    ({"kernel_shape": [3, 2], "pads": [1, 0, 1, 0], "offset_group": 4}, ("mask",)),
])
def test_deform_conv_matches_onnxruntime(attrs: dict[str, Any], extras: tuple[str, ...]) -> None:
    n, c, oc, h, w = 2, 4, 6, 7, 8
    kh, kw = attrs["kernel_shape"]
    group, og = attrs.get("group", 1), attrs.get("offset_group", 1)
    pads, strides = attrs.get("pads", [0] * 4), attrs.get("strides", [1, 1])
    dil = attrs.get("dilations", [1, 1])
    oh, ow = _out(h, kh, strides[0], pads[0], dil[0]), _out(w, kw, strides[1], pads[1], dil[1])
    feeds = {"x": rand(n, c, h, w), "w": rand(oc, c // group, kh, kw),
             "offset": rand(n, og * kh * kw * 2, oh, ow) * 1.5}
    inputs = ["x", "w", "offset", "", ""]
    if "bias" in extras:
        feeds["b"], inputs[3] = rand(oc), "b"
    if "mask" in extras:
        feeds["mask"], inputs[4] = RNG.uniform(0, 1, (n, og * kh * kw, oh, ow)).astype(np.float32), "mask"
    m = one_node_model("DeformConv", feeds, inputs=inputs, opset=22, **attrs)
    check_model(m, feeds, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_conformance() -> None:
    from metadef.testing.conformance import format_report, run_cases

    report = run_cases(op=("MaxUnpool", "DeformConv"))
    assert not report.failures() and report.totals()["unsupported"] == 0, format_report(report)
