"""Convolutions, pools, normalizations, block moves and Resize: shapes, errors, ORT numerics."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from metadef.core.errors import ShapeError
from metadef.ops import get_op, infer_types
from metadef.shape import parse_type
from metadef.testing.onnx_cases import check_model, one_node_model

OPS = ["Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
       "LpPool", "GlobalLpPool", "BatchNormalization", "InstanceNormalization",
       "LayerNormalization", "GroupNormalization", "LRN", "MeanVarianceNormalization",
       "LpNormalization", "DepthToSpace", "SpaceToDepth", "Resize", "Upsample"]
_ONNX_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
               np.dtype(np.uint8): TensorProto.UINT8, np.dtype(np.int64): TensorProto.INT64}


def infer(op: str, types: list[str | None], attrs: dict | None = None, values: list | None = None,
          n_outputs: int | None = None) -> list[str]:
    ins = [None if t is None else parse_type(t) for t in types]
    out = infer_types(get_op(op), "/nn/node", ins, attrs or {}, values or (), n_outputs=n_outputs)
    return [str(t) for t in out]


def check_against_ort(op: str, feeds: dict[str, np.ndarray], consts: dict | None = None,
                      inputs: list[str] | None = None, n_out: int = 1, rtol: float = 1e-5,
                      opset: int = 21, **attrs) -> None:
    """One-node model: feeds are graph inputs, consts initializers; every output compared."""
    model = one_node_model(op, feeds, consts, inputs, n_out, opset, output_prefix="y", **attrs)
    check_model(model, feeds, rtol=rtol, atol=1e-5)


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + 7 * len(shape)).standard_normal(shape).astype(np.float32)


# ----------------------------------------------------------------------- shape inference


def test_conv_shapes_symbolic() -> None:
    stem = {"strides": [2, 2], "pads": [3, 3, 3, 3]}
    assert infer("Conv", ["f32[batch,3,224,224]", "f32[64,3,7,7]"], stem) == \
        ["f32[batch,64,112,112]"]
    assert infer("Conv", ["f32[b,3,h,w]", "f32[8,3,3,3]", "f32[8]"], {"pads": [1] * 4}) == \
        ["f32[b,8,h,w]"]
    same = {"auto_pad": "SAME_UPPER", "strides": [2, 2], "kernel_shape": [3, 3]}
    assert infer("Conv", ["f32[b,3,h,w]", "f32[8,3,3,3]"], same) == \
        ["f32[b,8,ceil(h/2),ceil(w/2)]"]
    assert infer("Conv", ["f32[n,32,t]", "f32[32,1,5]"], {"group": 32, "dilations": [2]}) == \
        ["f32[n,32,t - 8]"]
    assert infer("Conv", ["f32[1,4,d,6,6]", "f32[2,4,3,3,3]"], {"auto_pad": "VALID"}) == \
        ["f32[1,2,d - 2,4,4]"]


def test_conv_errors_name_node_and_constraint() -> None:
    with pytest.raises(ShapeError, match=r"/nn/node.*constraint C == CG \* group failed"):
        infer("Conv", ["f32[1,6,8,8]", "f32[4,4,3,3]"], {"group": 2})
    with pytest.raises(ShapeError, match=r"expects R1 to agree: got 5 \(a parameter\) and 3"):
        infer("Conv", ["f32[1,3,8,8]", "f32[4,3,3,3]"], {"kernel_shape": [3, 5]})
    with pytest.raises(ShapeError, match="rank 3, 4 or 5"):
        infer("Conv", ["f32[1,3]", "f32[4,3]"])


def test_pool_shapes_ceil_mode_and_indices() -> None:
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}
    assert infer("MaxPool", ["f32[1,1,4,4]"], attrs, n_outputs=2) == \
        ["f32[1,1,2,2]", "i64[1,1,2,2]"]
    # the last window would start in the right padding: dropped
    attrs = {"kernel_shape": [1, 1], "strides": [2, 2], "ceil_mode": 1}
    assert infer("MaxPool", ["f32[1,1,2,2]"], attrs, n_outputs=1) == ["f32[1,1,1,1]"]
    assert infer("AveragePool", ["f32[b,c,h,w]"], {"kernel_shape": [2, 2], "strides": [2, 2]}) \
        == ["f32[b,c,floor(h/2),floor(w/2)]"]
    assert infer("GlobalAveragePool", ["f32[b,c,h,w,d]"]) == ["f32[b,c,1,1,1]"]
    with pytest.raises(ShapeError, match=r"/nn/node.*kernel_shape \[3\] has 1 dims"):
        infer("MaxPool", ["f32[1,1,4,4]"], {"kernel_shape": [3]})


def test_norm_shapes() -> None:
    assert infer("LayerNormalization", ["f32[b,s,8]", "f32[8]"], {"axis": -1}, n_outputs=3) == \
        ["f32[b,s,8]", "f32[b,s,1]", "f32[b,s,1]"]
    assert infer("GroupNormalization", ["f32[b,8,h,w]", "f32[8]", "f32[8]"],
                 {"num_groups": 4}) == ["f32[b,8,h,w]"]
    with pytest.raises(ShapeError, match="must split into num_groups=3"):
        infer("GroupNormalization", ["f32[b,8,h,w]", "f32[8]", "f32[8]"], {"num_groups": 3})
    bn = ["f32[b,3,h,w]", "f32[3]", "f32[3]", "f32[3]", "f32[3]"]
    assert infer("BatchNormalization", bn, n_outputs=1) == ["f32[b,3,h,w]"]
    assert infer("BatchNormalization", bn, {"training_mode": 1}, n_outputs=3) == \
        ["f32[b,3,h,w]", "f32[3]", "f32[3]"]


def test_block_and_resize_shapes() -> None:
    assert infer("DepthToSpace", ["f32[b,8,h,w]"], {"blocksize": 2}) == ["f32[b,2,h*2,w*2]"]
    assert infer("SpaceToDepth", ["f32[b,2,h,w]"], {"blocksize": 2}) == \
        ["f32[b,8,floor(h/2),floor(w/2)]"]
    with pytest.raises(ShapeError, match=r"constraint C % \(blocksize\*blocksize\) == 0"):
        infer("DepthToSpace", ["f32[1,6,2,2]"], {"blocksize": 2})
    sizes = np.array([5, 7], np.int64)
    assert infer("Resize", ["f32[b,3,4,4]", None, None, "i64[2]"], {"axes": [2, 3]},
                 [None, None, None, sizes]) == ["f32[b,3,5,7]"]
    unknown = infer("Resize", ["f32[b,3,4,4]", None, "f32[4]"])
    assert unknown[0].startswith("f32[")  # fresh symbols where the scales are not constant
    with pytest.raises(ShapeError, match="mode='bicubic' is not one of"):
        infer("Resize", ["f32[1,1,4,4]", None, "f32[4]"], {"mode": "bicubic"})


# ----------------------------------------------------------------------- numerics vs ORT


@pytest.mark.parametrize("x,w,attrs", [
    ((2, 4, 9, 8), (6, 2, 3, 3), {"group": 2, "strides": [2, 1], "pads": [1, 0, 2, 1]}),
    ((1, 6, 7, 7), (6, 1, 3, 3), {"group": 6, "dilations": [2, 2], "pads": [2, 1, 2, 3]}),
    ((1, 2, 7, 6), (4, 2, 2, 3), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 5, 6, 7), (3, 2, 2, 3, 2), {"strides": [1, 2, 2], "auto_pad": "SAME_UPPER"}),
    ((2, 3, 11), (4, 3, 4), {"pads": [2, 1], "strides": [3]}),
])
def test_conv_matches_ort(x: tuple, w: tuple, attrs: dict) -> None:
    check_against_ort("Conv", {"x": rand(*x), "w": rand(*w, seed=1),
                               "b": rand(w[0], seed=2)}, **attrs)


@pytest.mark.parametrize("x,w,attrs", [
    ((1, 4, 3, 4), (4, 3, 3, 2), {"group": 2, "strides": [2, 3], "dilations": [2, 1],
                                  "output_padding": [1, 0], "pads": [1, 0, 0, 1]}),
    ((2, 2, 5), (2, 3, 3), {"strides": [2], "auto_pad": "SAME_LOWER"}),
    ((1, 1, 3, 3), (1, 2, 3, 3), {"strides": [3, 2], "output_shape": [9, 6]}),
])
def test_convtranspose_matches_ort(x: tuple, w: tuple, attrs: dict) -> None:
    check_against_ort("ConvTranspose", {"x": rand(*x), "w": rand(*w, seed=1)}, **attrs)


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1, "pads": [1, 0, 0, 1]},
    {"kernel_shape": [2, 3], "dilations": [2, 1], "storage_order": 1},
    {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
])
def test_maxpool_with_indices_matches_ort(attrs: dict) -> None:
    check_against_ort("MaxPool", {"x": rand(2, 3, 7, 8)}, n_out=2, **attrs)


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1, "pads": [1, 1, 1, 1],
     "count_include_pad": 1},
    {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1, "count_include_pad": 0,
     "pads": [0, 1, 1, 0]},
    {"kernel_shape": [2, 2], "dilations": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1},
])
def test_averagepool_matches_ort(attrs: dict) -> None:
    check_against_ort("AveragePool", {"x": rand(1, 2, 7, 8)}, **attrs)


def test_lp_pools_match_ort() -> None:
    x = rand(1, 2, 6, 7)
    check_against_ort("LpPool", {"x": x}, kernel_shape=[3, 2], p=3, pads=[1, 0, 1, 1],
                      strides=[2, 1])
    check_against_ort("GlobalLpPool", {"x": x}, p=3)
    check_against_ort("GlobalMaxPool", {"x": rand(2, 3, 4)})


def test_normalizations_match_ort() -> None:
    x = rand(2, 6, 5, 4)
    check_against_ort("InstanceNormalization", {"x": x, "s": rand(6, seed=1),
                                                "b": rand(6, seed=2)}, epsilon=1e-3)
    check_against_ort("GroupNormalization", {"x": x, "s": rand(6, seed=1), "b": rand(6, seed=2)},
                      num_groups=3)
    check_against_ort("LRN", {"x": x}, size=5, alpha=0.01, beta=0.6, bias=1.5)
    check_against_ort("MeanVarianceNormalization", {"x": x}, axes=[1, 3])
    check_against_ort("LpNormalization", {"x": x}, axis=1, p=1)
    stats = {"s": rand(6, seed=1), "b": rand(6, seed=2), "m": rand(6, seed=3),
             "v": np.abs(rand(6, seed=4))}
    check_against_ort("BatchNormalization", {"x": x, **stats}, epsilon=1e-3)


@pytest.mark.parametrize("axis", [1, -1, 0])
def test_layernorm_with_stats_outputs_matches_ort(axis: int) -> None:
    x = rand(3, 4, 5)
    rank_w = 3 - axis % 3
    check_against_ort("LayerNormalization", {"x": x, "w": rand(*x.shape[3 - rank_w:], seed=1),
                                             "b": rand(x.shape[-1], seed=2)},
                      n_out=3, axis=axis, epsilon=1e-3)


def test_block_moves_match_ort() -> None:
    x = rand(2, 8, 3, 4)
    for mode in ("DCR", "CRD"):
        check_against_ort("DepthToSpace", {"x": x}, blocksize=2, mode=mode)
    check_against_ort("SpaceToDepth", {"x": rand(2, 3, 4, 6)}, blocksize=2)


@pytest.mark.parametrize("attrs,scales,sizes", [
    # integral scale*length: with a fractional one ONNX's tests (our target) use the fractional
    # length in align_corners and ORT the integral one, so they disagree
    ({"mode": "cubic", "coordinate_transformation_mode": "align_corners"}, [1, 1, 1.5, 2.0], None),
    ({"mode": "linear", "antialias": 1}, None, [1, 2, 3, 5]),
    ({"mode": "cubic", "antialias": 1, "cubic_coeff_a": -0.5, "exclude_outside": 1},
     [1, 1, 0.5, 0.7], None),
    ({"mode": "nearest", "nearest_mode": "round_prefer_ceil",
      "coordinate_transformation_mode": "half_pixel_symmetric"}, [1, 1, 2.5, 1.5], None),
    ({"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"},
     None, [1, 2, 1, 9]),
    ({"mode": "nearest", "axes": [3, 2], "keep_aspect_ratio_policy": "not_smaller"},
     None, [5, 3]),
])
def test_resize_matches_ort(attrs: dict, scales: list | None, sizes: list | None) -> None:
    x = rand(1, 2, 6, 7)
    consts = {"scales": np.array(scales, np.float32)} if scales else \
        {"sizes": np.array(sizes, np.int64)}
    inputs = ["x", "", "scales"] if scales else ["x", "", "", "sizes"]
    check_against_ort("Resize", {"x": x}, consts, inputs=inputs, opset=19, rtol=1e-4, **attrs)


def test_resize_trilinear_and_uint8_match_ort() -> None:
    check_against_ort("Resize", {"x": rand(1, 1, 3, 4, 5)},
                      {"scales": np.array([1, 1, 2, 1.5, 0.8], np.float32)},
                      inputs=["x", "", "scales"], mode="linear", opset=19, rtol=1e-4)
    img = np.random.default_rng(0).integers(0, 255, (1, 3, 4, 4)).astype(np.uint8)
    check_against_ort("Resize", {"x": img}, {"scales": np.array([1, 1, 2, 2], np.float32)},
                      inputs=["x", "", "scales"], mode="nearest", opset=19)


def test_upsample_opset7_attribute_form_matches_ort() -> None:
    check_against_ort("Upsample", {"x": rand(1, 2, 3, 3)}, mode="nearest",
                      scales=[1.0, 1.0, 2.0, 3.0], opset=7)


@pytest.mark.slow
def test_conformance_nn() -> None:
    from metadef.testing.conformance import format_report, run_cases

    report = run_cases(op=OPS)
    assert not report.failures(), format_report(report)
