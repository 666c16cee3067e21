"""Vision and geometry ops: GridSample, AffineGrid, RoiAlign, NonMaxSuppression, Col2Im,
CenterCropPad, Unique and Det.

Each samples, scatters or selects at positions computed from input *values* (grid
coordinates, boxes, scores), so each carries a vectorized numpy reference and is opaque;
Python loops run only over boxes and regions of interest. Sizes given by constant inputs
(AffineGrid's size, Col2Im's image shape, CenterCropPad's shape) are read; data-dependent
counts (selected boxes, unique values) are fresh symbols.

Example:
    >>> from metadef.testing.onnx_cases import infer_text
    >>> infer_text("GridSample", ["f32[n,3,h,w]", "f32[n,7,9,2]"])
    ['f32[n,3,7,9]']
    >>> infer_text("AffineGrid", ["f32[n,2,3]", "i64[4]"], {}, [None, [2, 3, 16, 24]])
    ['f32[n,16,24,2]']
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import numpy as np

from metadef.ops.defs.shape_values import axes_of, axis_of, input_dims
from metadef.ops.infer import InferContext
from metadef.ops.interface import float_, int_, ints, string
from metadef.ops.metaop import metaop
from metadef.ops.strategy import Role
from metadef.shape import Decision, Dim, equal

# --- GridSample -------------------------------------------------------------------------

GRID_MODES = {"linear": "linear", "bilinear": "linear", "cubic": "cubic", "bicubic": "cubic",
              "nearest": "nearest"}
PADDING_MODES = ("zeros", "border", "reflection")


def _grid_sample_rule(ctx: InferContext) -> list[Any]:
    if ctx.attrs["mode"] not in GRID_MODES:
        ctx.fail(f"mode {ctx.attrs['mode']!r} is not one of linear, cubic, nearest")
    if ctx.attrs["padding_mode"] not in PADDING_MODES:
        ctx.fail(f"padding_mode {ctx.attrs['padding_mode']!r} is not one of {', '.join(PADDING_MODES)}")
    x, g = ctx.shape(0), ctx.shape(1)
    if x is None or g is None:
        return [None]
    if len(x) < 3 or len(g) != len(x) or (isinstance(g[-1], int) and g[-1] != len(x) - 2):
        ctx.fail(f"grid must have shape [N, *out, {len(x) - 2}] for a rank-{len(x)} input, "
                 f"got {list(g)}")
    if equal(x[0], g[0]) is Decision.FALSE:
        ctx.fail(f"the batch dims differ: X has {x[0]}, grid has {g[0]}")
    return [(x[0], x[1], *g[1:-1])]


def _reflect(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Reflects coordinates at the borders [lo, hi] until they lie inside."""
    span = hi - lo
    if span <= 0:
        return np.full_like(x, lo)
    below, above = lo - x, x - hi
    dx = np.where(x < lo, below, above)
    n = np.trunc(dx / span)
    r = dx - n * span
    even = n % 2 == 0
    inside_low = np.where(even, lo + r, hi - r)    # reflected off the low border
    inside_high = np.where(even, hi - r, lo + r)   # reflected off the high border
    return np.where(x < lo, inside_low, np.where(x > hi, inside_high, x))


def _cubic_weights(t: np.ndarray) -> list[np.ndarray]:
    """Keys' cubic convolution weights (alpha -0.75) of taps -1, 0, 1, 2 at offset t."""
    a = -0.75

    def near(d: np.ndarray) -> np.ndarray:
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d: np.ndarray) -> np.ndarray:
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _grid_sample_reference(inputs: list, attrs: Mapping[str, Any]) -> np.ndarray:
    x, grid = inputs
    mode, padding = GRID_MODES[attrs["mode"]], attrs["padding_mode"]
    align = bool(attrs["align_corners"])
    dims = x.shape[2:]
    coords = grid[..., ::-1].astype(np.float64)  # grid lists (x, y, ...): reverse to dim order
    taps: list[list[tuple[np.ndarray, np.ndarray]]] = []  # per dim: (index, weight) pairs
    for d, size in enumerate(dims):
        c = coords[..., d]
        c = (c + 1) / 2 * (size - 1) if align else ((c + 1) * size - 1) / 2
        lo, hi = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
        if mode == "nearest":
            c = np.rint(c)
        if padding == "border":
            c = np.where((c < lo) | (c > hi), np.clip(c, 0, size - 1), c)
        elif padding == "reflection":
            c = _reflect(c, lo, hi)
        if mode == "nearest":
            taps.append([(c.astype(np.int64), np.ones_like(c))])
            continue
        base = np.floor(c)
        t = c - base
        weights = [1 - t, t] if mode == "linear" else _cubic_weights(t)
        first = 0 if mode == "linear" else -1
        taps.append([(base.astype(np.int64) + first + k, w) for k, w in enumerate(weights)])
    n = np.arange(x.shape[0]).reshape((-1,) + (1,) * (grid.ndim - 2))
    out = np.zeros((x.shape[0], *grid.shape[1:-1], x.shape[1]), np.float64)
    for combo in itertools.product(*taps):
        weight = np.prod([w for _, w in combo], axis=0)
        index, valid = [], np.ones(weight.shape, bool)
        for d, (i, _) in enumerate(combo):
            if padding == "reflection":
                i = np.trunc(_reflect(i.astype(np.float64), *((0.0, dims[d] - 1.0) if align
                                      else (-0.5, dims[d] - 0.5)))).astype(np.int64)
            valid &= (i >= 0) & (i < dims[d])
            index.append(np.clip(i, 0, dims[d] - 1))
        picked = np.moveaxis(x, 1, -1)[(n, *index)]  # [N, *out, C]
        if padding == "zeros":
            picked = np.where(valid[..., None], picked, 0)
        out += (weight[..., None] * picked)
    return np.moveaxis(out, -1, 1).astype(x.dtype)


GridSample = metaop(
    "GridSample", inputs=("X: T1", "grid: T2"), outputs=("Y: T1",),
    types="T1 in {numeric}; T2 in {float}",
    attrs={"align_corners": int_(0), "mode": string("linear"), "padding_mode": string("zeros")},
    rule=_grid_sample_rule, reference=_grid_sample_reference, role=Role.OPAQUE,
    since=(16, 20, 22),
    doc="Samples X at the normalized coordinates of grid ([-1, 1] spans the input), "
        "interpolating nearest, (bi/tri)linear or cubic; out-of-range reads by padding_mode.",
)


# --- AffineGrid -------------------------------------------------------------------------


def _affine_grid_rule(ctx: InferContext) -> list[Any]:
    theta, size_shape = ctx.shape(0), ctx.shape(1)
    size = input_dims(ctx.values, 1)
    if size_shape is not None and (len(size_shape) != 1 or (size_shape[0] not in (4, 5)
                                   and isinstance(size_shape[0], int))):
        ctx.fail(f"size must hold 4 (N, C, H, W) or 5 (N, C, D, H, W) values, got shape "
                 f"{list(size_shape)}")
    n = len(size) if size is not None else size_shape[0] if size_shape else None
    if not isinstance(n, int):
        return [None]
    if theta is not None and (len(theta) != 3 or theta[1:] != (n - 2, n - 1)):
        ctx.fail(f"theta must have shape [N, {n - 2}, {n - 1}] for a {n - 2}-D grid, "
                 f"got {list(theta)}")
    spatial = tuple(size[2:]) if size is not None else tuple(ctx.fresh("grid") for _ in range(n - 2))
    batch = theta[0] if theta is not None else size[0] if size is not None else ctx.fresh("batch")
    return [(batch, *spatial, n - 2)]


def _affine_grid_reference(inputs: list, attrs: Mapping[str, Any]) -> np.ndarray:
    theta, size = inputs[0], [int(v) for v in inputs[1]]
    spatial = size[2:]
    if attrs["align_corners"]:
        axes = [np.linspace(-1.0, 1.0, s) for s in spatial]
    else:
        axes = [(2 * np.arange(s) + 1) / s - 1 for s in spatial]
    mesh = np.meshgrid(*axes, indexing="ij")  # in dim order (D, H, W)
    homogeneous = np.stack([*mesh[::-1], np.ones(spatial)], axis=-1)  # (x, y, [z,] 1)
    return np.einsum("nij,...j->n...i", theta.astype(np.float64), homogeneous).astype(theta.dtype)


AffineGrid = metaop(
    "AffineGrid", inputs=("theta: T1", "size: int64"), outputs=("grid: T1",),
    types="T1 in {float}", attrs={"align_corners": int_(0)}, rule=_affine_grid_rule,
    reference=_affine_grid_reference, role=Role.OPAQUE, reads=(1,), since=(20,),
    doc="The sampling grid [N, *spatial, 2 or 3] of the affine maps theta applied to the "
        "normalized coordinates of an image of shape size, for GridSample.",
)


# --- RoiAlign ---------------------------------------------------------------------------


def _roi_align_rule(ctx: InferContext) -> list[Any]:
    if ctx.attrs["mode"] not in ("avg", "max"):
        ctx.fail(f"mode {ctx.attrs['mode']!r} is not avg or max")
    x, rois = ctx.shape(0), ctx.shape(1)
    if x is not None and len(x) != 4:
        ctx.fail(f"X must have rank 4 [N, C, H, W], got rank {len(x)}")
    if rois is not None and (len(rois) != 2 or (isinstance(rois[1], int) and rois[1] != 4)):
        ctx.fail(f"rois must have shape [num_rois, 4], got {list(rois)}")
    num = rois[0] if rois is not None else ctx.fresh("rois")
    channels = x[1] if x is not None else ctx.fresh("channels")
    return [(num, channels, ctx.attrs["output_height"], ctx.attrs["output_width"])]


def _bilinear_taps(pos: np.ndarray, size: int) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
    """The two indices and weights RoiAlign reads at positions ``pos`` of a dim of ``size``,
    and a mask of the positions inside [-1, size]."""
    inside = (pos >= -1.0) & (pos <= size)
    p = np.maximum(pos, 0.0)
    low = np.floor(p).astype(np.int64)
    at_end = low >= size - 1
    low = np.where(at_end, size - 1, low)
    high = np.where(at_end, size - 1, low + 1)
    frac = np.where(at_end, 0.0, p - low)
    return [low, high], [1 - frac, frac], inside


def _roi_align_reference(inputs: list, attrs: Mapping[str, Any]) -> np.ndarray:
    x, rois, batch = inputs
    height, width = x.shape[2:]
    ph, pw, ratio = attrs["output_height"], attrs["output_width"], attrs["sampling_ratio"]
    half = attrs["coordinate_transformation_mode"] == "half_pixel"
    out = np.zeros((rois.shape[0], x.shape[1], ph, pw), np.float64)
    for r, (box, b) in enumerate(zip(rois.astype(np.float64), batch)):
        x1, y1, x2, y2 = box * attrs["spatial_scale"] - (0.5 if half else 0.0)
        roi_w, roi_h = (x2 - x1, y2 - y1) if half else (max(x2 - x1, 1.0), max(y2 - y1, 1.0))
        grid_h = ratio if ratio > 0 else int(np.ceil(roi_h / ph))
        grid_w = ratio if ratio > 0 else int(np.ceil(roi_w / pw))
        ys = y1 + (np.arange(ph)[:, None] + (np.arange(grid_h) + 0.5) / grid_h) * roi_h / ph
        xs = x1 + (np.arange(pw)[:, None] + (np.arange(grid_w) + 0.5) / grid_w) * roi_w / pw
        yi, yw, y_in = _bilinear_taps(ys, height)  # each [ph, grid_h]
        xi, xw, x_in = _bilinear_taps(xs, width)   # each [pw, grid_w]
        keep = (y_in[:, :, None, None] & x_in[None, None]).astype(np.float64)
        image = x[int(b)].astype(np.float64)
        # terms[c, ph, gh, pw, gw] of the four corners
        terms = [image[:, yi[a][:, :, None, None], xi[c][None, None]]
                 * (yw[a][:, :, None, None] * xw[c][None, None] * keep)
                 for a in (0, 1) for c in (0, 1)]
        if attrs["mode"] == "avg":
            out[r] = sum(terms).sum(axis=(2, 4)) / max(grid_h * grid_w, 1)
        else:
            out[r] = np.maximum.reduce(terms).max(axis=(2, 4))
    return out.astype(x.dtype)


RoiAlign = metaop(
    "RoiAlign", inputs=("X: T1", "rois: T1", "batch_indices: T2"), outputs=("Y: T1",),
    types="T1 in {float}; T2 in {int64}",
    attrs={"coordinate_transformation_mode": string("half_pixel"), "mode": string("avg"),
           "output_height": int_(1), "output_width": int_(1), "sampling_ratio": int_(0),
           "spatial_scale": float_(1.0)},
    rule=_roi_align_rule, reference=_roi_align_reference, role=Role.OPAQUE, since=(10, 16, 22),
    doc="Pools each region of interest to output_height x output_width bins, averaging (or "
        "taking the max of) bilinear samples on a regular grid in each bin.",
)


# --- NonMaxSuppression ------------------------------------------------------------------


def _nms_rule(ctx: InferContext) -> list[Any]:
    boxes, scores = ctx.shape(0), ctx.shape(1)
    if boxes is not None and (len(boxes) != 3 or (isinstance(boxes[2], int) and boxes[2] != 4)):
        ctx.fail(f"boxes must have shape [batch, boxes, 4], got {list(boxes)}")
    if scores is not None and len(scores) != 3:
        ctx.fail(f"scores must have shape [batch, classes, boxes], got {list(scores)}")
    if boxes is not None and scores is not None and equal(boxes[1], scores[2]) is Decision.FALSE:
        ctx.fail(f"boxes hold {boxes[1]} boxes but scores score {scores[2]}")
    return [(ctx.fresh("selected"), 3)]


def _corners(boxes: np.ndarray, center: bool) -> np.ndarray:
    """Boxes as (y_min, x_min, y_max, x_max), from corners in either order or from centers."""
    if center:
        cx, cy, w, h = np.moveaxis(boxes, -1, 0)
        return np.stack([cy - h / 2, cx - w / 2, cy + h / 2, cx + w / 2], axis=-1)
    y1, x1, y2, x2 = np.moveaxis(boxes, -1, 0)
    return np.stack([np.minimum(y1, y2), np.minimum(x1, x2), np.maximum(y1, y2),
                     np.maximum(x1, x2)], axis=-1)


def _iou(b: np.ndarray) -> np.ndarray:
    """The pairwise intersection over union of boxes [n, 4] (0 where they do not overlap)."""
    lo = np.maximum(b[:, None, :2], b[None, :, :2])
    hi = np.minimum(b[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(hi - lo, 0, None), axis=-1)
    area = np.prod(b[:, 2:] - b[:, :2], axis=-1)
    union = area[:, None] + area[None, :] - inter
    ok = (inter > 0) & (area[:, None] > 0) & (area[None, :] > 0) & (union > 0)
    return np.where(ok, inter / np.where(ok, union, 1), 0.0)


def _first(inputs: list, i: int, default: float) -> float:
    v = inputs[i] if len(inputs) > i and inputs[i] is not None else None
    return default if v is None or v.size == 0 else float(v.reshape(-1)[0])


def _nms_reference(inputs: list, attrs: Mapping[str, Any]) -> np.ndarray:
    boxes, scores = inputs[0].astype(np.float64), inputs[1].astype(np.float64)
    limit = max(int(_first(inputs, 2, 0)), 0)
    iou_threshold, score_threshold = _first(inputs, 3, 0.0), _first(inputs, 4, -np.inf)
    has_score_threshold = len(inputs) > 4 and inputs[4] is not None and inputs[4].size > 0
    selected = []
    for b in range(boxes.shape[0]):
        iou = _iou(_corners(boxes[b], bool(attrs["center_point_box"])))
        for c in range(scores.shape[1]):
            s = scores[b, c]
            order = np.argsort(-s, kind="stable")  # highest score first; ties: lower index
            if has_score_threshold:
                order = order[s[order] > score_threshold]
            kept: list[int] = []
            for i in order:  # the greedy pass: one box at a time
                if len(kept) >= limit:
                    break
                if not kept or not (iou[i, kept] > iou_threshold).any():
                    kept.append(int(i))
            selected += [(b, c, i) for i in kept]
    return np.array(selected, np.int64).reshape(-1, 3)


NonMaxSuppression = metaop(
    "NonMaxSuppression",
    inputs=("boxes: float32", "scores: float32", "max_output_boxes_per_class?: int64",
            "iou_threshold?: float32", "score_threshold?: float32"),
    outputs=("selected_indices: int64",), attrs={"center_point_box": int_(0)},
    rule=_nms_rule, reference=_nms_reference, role=Role.OPAQUE, since=(10, 11),
    doc="Greedily keeps the highest-scoring boxes of each batch and class that overlap no "
        "kept box by more than iou_threshold: rows (batch, class, box).",
)


# --- Col2Im -----------------------------------------------------------------------------


def _col2im_rule(ctx: InferContext) -> list[Any]:
    x = ctx.shape(0)
    image, block = input_dims(ctx.values, 1), input_dims(ctx.values, 2)
    if x is not None and len(x) != 3:
        ctx.fail(f"input must have rank 3 [N, C * prod(block_shape), L], got rank {len(x)}")
    n_dims = len(image) if image is not None else ctx.shape(1)[0] if ctx.shape(1) else None
    if not isinstance(n_dims, int):
        return [None]
    channels: Dim = ctx.fresh("channels")
    if block is not None and x is not None and all(isinstance(k, int) for k in block):
        per = int(np.prod(block))
        if isinstance(x[1], int):
            if x[1] % per:
                ctx.fail(f"input dim 1 ({x[1]}) is not a multiple of prod(block_shape) = {per}")
            channels = x[1] // per
    spatial = tuple(image) if image is not None else tuple(ctx.fresh("image") for _ in range(n_dims))
    return [(x[0] if x is not None else ctx.fresh("batch"), channels, *spatial)]


def _col2im_reference(inputs: list, attrs: Mapping[str, Any]) -> np.ndarray:
    x, image, block = inputs[0], [int(v) for v in inputs[1]], [int(v) for v in inputs[2]]
    d = len(image)
    dil, stride = attrs["dilations"] or [1] * d, attrs["strides"] or [1] * d
    pads = attrs["pads"] or [0] * (2 * d)
    counts = [(image[k] + pads[k] + pads[k + d] - dil[k] * (block[k] - 1) - 1) // stride[k] + 1
              for k in range(d)]
    n, c = x.shape[0], x.shape[1] // int(np.prod(block))
    values = x.reshape(n, c, -1)  # over (block offsets..., block places...), row-major
    shape = (*block, *counts)
    valid, target = np.ones(shape, bool), np.zeros(shape, np.int64)
    for k in range(d):  # image position k = offset * dilation + place * stride - pad
        offset = np.arange(block[k]).reshape([-1 if j == k else 1 for j in range(2 * d)])
        place = np.arange(counts[k]).reshape([-1 if j == d + k else 1 for j in range(2 * d)])
        pos = offset * dil[k] + place * stride[k] - pads[k]
        valid &= (pos >= 0) & (pos < image[k])
        target = target * image[k] + pos
    out = np.zeros((n, c, int(np.prod(image))), np.float64)
    np.add.at(out, (slice(None), slice(None), target[valid]), values[:, :, valid.reshape(-1)])
    return out.reshape(n, c, *image).astype(x.dtype)


Col2Im = metaop(
    "Col2Im", inputs=("input", "image_shape: int64", "block_shape: int64"), outputs=("output",),
    attrs={"dilations": ints(), "pads": ints(), "strides": ints()}, rule=_col2im_rule,
    reference=_col2im_reference, role=Role.OPAQUE, reads=(1, 2), since=(18,),
    doc="Sums sliding blocks [N, C * prod(block_shape), L] back into images "
        "[N, C, *image_shape] (the inverse of im2col; overlaps add up).",
)


# --- CenterCropPad ----------------------------------------------------------------------


def _center_crop_pad_rule(ctx: InferContext) -> list[Any]:
    s, want = ctx.shape(0), input_dims(ctx.values, 1)
    if s is None:
        return [None]
    axes = axes_of(ctx, ctx.attrs["axes"], len(s)) if ctx.attrs["axes"] else list(range(len(s)))
    n = ctx.shape(1)[0] if ctx.shape(1) else None
    if isinstance(n, int) and n != len(axes):
        ctx.fail(f"shape has {n} entries but {len(axes)} axes are cropped or padded")
    out = list(s)
    for k, a in enumerate(axes):
        out[a] = want[k] if want is not None else ctx.fresh("crop")
    return [tuple(out)]


def _center_crop_pad_reference(inputs: list, attrs: Mapping[str, Any]) -> np.ndarray:
    x, shape = inputs[0], [int(v) for v in inputs[1]]
    axes = [a % x.ndim for a in attrs["axes"]] if attrs["axes"] else list(range(x.ndim))
    source, target, out_shape = [slice(None)] * x.ndim, [slice(None)] * x.ndim, list(x.shape)
    for a, want in zip(axes, shape):
        have = x.shape[a]
        lo = abs(have - want) // 2  # the extra element of an odd difference goes to the end
        if want < have:
            source[a] = slice(lo, lo + want)
        elif want > have:
            target[a] = slice(lo, lo + have)
        out_shape[a] = want
    out = np.full(out_shape, "" if x.dtype == object else 0, x.dtype)  # strings pad with "", as Pad does
    out[tuple(target)] = x[tuple(source)]
    return out


CenterCropPad = metaop(
    "CenterCropPad", inputs=("input_data", "shape: Tind"), outputs=("output_data",),
    types="T in {all, string}; Tind in {int32, int64}", attrs={"axes": ints()},
    rule=_center_crop_pad_rule, reference=_center_crop_pad_reference, role=Role.INJECTIVE,
    reads=(1,), since=(18,),
    doc="Crops (or zero-pads; strings pad with empty ones) the given axes to shape around their centre.",
)


# --- Unique, Det ------------------------------------------------------------------------


def _unique_rule(ctx: InferContext) -> list[Any]:
    s, axis = ctx.shape(0), ctx.attrs["axis"]
    count = ctx.fresh("unique")
    if s is None:
        y = None if axis is not None else (count,)
        return [y, (count,), (ctx.fresh("inverse"),), (count,)]
    if axis is None:
        return [(count,), (count,), (int(np.prod(s)) if all(isinstance(d, int) for d in s)
                                     else ctx.fresh("size"),), (count,)]
    a = axis_of(ctx, axis, len(s))
    return [(*s[:a], count, *s[a + 1:]), (count,), (s[a],), (count,)]


def _unique_reference(inputs: list, attrs: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    x, axis = inputs[0], attrs["axis"]
    y, first, inverse, counts = np.unique(x, True, True, True, axis=axis)
    if not attrs["sorted"]:  # in order of first occurrence
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        first, counts, inverse = first[order], counts[order], rank[inverse.reshape(-1)]
        y = np.take(x if axis is not None else x.reshape(-1), first, axis=axis or 0)
    return (y, first.astype(np.int64), inverse.reshape(-1).astype(np.int64),
            counts.astype(np.int64))


Unique = metaop(
    "Unique", inputs=("X",), outputs=("Y", "indices: int64", "inverse_indices: int64",
                                      "counts: int64"),
    types="T in {all, string}", attrs={"axis": int_(), "sorted": int_(1)}, rule=_unique_rule,
    reference=_unique_reference, role=Role.OPAQUE, since=(11,),
    doc="The distinct elements (or slices along axis), sorted or in order of first "
        "occurrence, with their first indices, the inverse map and their counts.",
)


def _det_rule(ctx: InferContext) -> list[Any]:
    s = ctx.shape(0)
    if s is None:
        return [None]
    if len(s) < 2 or equal(s[-1], s[-2]) is Decision.FALSE:
        ctx.fail(f"the input must be square matrices [..., M, M], got {list(s)}")
    return [tuple(s[:-2])]


Det = metaop(
    "Det", inputs=("X",), outputs=("Y",), types="T in {float}", rule=_det_rule,
    reference=lambda xs, a: np.asarray(np.linalg.det(xs[0].astype(np.float64))).astype(xs[0].dtype),
    role=Role.OPAQUE, since=(11, 22), doc="The determinant of each square matrix in the batch.",
)

__all__ = ["AffineGrid", "CenterCropPad", "Col2Im", "Det", "GridSample", "NonMaxSuppression",
           "RoiAlign", "Unique"]
