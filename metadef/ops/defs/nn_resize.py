"""Resize and Upsample: interpolation, one axis at a time.

Both are opaque (the source coordinate of an output cell is a float function of its index, not
an affine index): the reference resizes separably, one vectorized 1-D interpolation per axis
(gather the taps of every output position, weight them, sum). Shape inference reads the
``scales`` / ``sizes`` inputs, so constant ones give static shapes.

Example:
    >>> import numpy as np
    >>> from metadef.ops import get_op, infer_types
    >>> from metadef.shape import parse_type
    >>> y, = infer_types(get_op("Resize"), "/up", [parse_type("f32[b,3,h,w]"), None,
    ...                  parse_type("f32[4]")], {"mode": "nearest"},
    ...                  values=[None, None, np.array([1, 1, 2, 2], np.float32)])
    >>> str(y)
    'f32[b,3,h*2,w*2]'
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from metadef.core.errors import AttributeError_
from metadef.ops.infer import InferContext
from metadef.ops.interface import float_, int_, ints, string
from metadef.ops.metaop import metaop
from metadef.ops.strategy import Role
from metadef.shape import Dim

MODES = ("nearest", "linear", "cubic")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
TRANSFORMS = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
              "asymmetric", "tf_crop_and_resize")
POLICIES = ("stretch", "not_larger", "not_smaller")


def check_attrs(attrs: Mapping[str, Any]) -> None:
    """Every string attribute names a known choice, else AttributeError_ names it."""
    for name, choices in (("mode", MODES), ("nearest_mode", NEAREST_MODES),
                          ("coordinate_transformation_mode", TRANSFORMS),
                          ("keep_aspect_ratio_policy", POLICIES)):
        if attrs.get(name) is not None and attrs[name] not in choices:
            raise AttributeError_(f"Resize: {name}={attrs[name]!r} is not one of "
                                  f"{', '.join(choices)}")
    if attrs.get("antialias") and attrs.get("mode") == "nearest":
        raise AttributeError_("Resize: antialias=1 needs mode linear or cubic")


def resize_operands(inputs: Sequence[Any]) -> tuple[Any, Any, Any]:
    """(roi, scales, sizes) of a Resize's inputs (``X`` first); a 2-input node is the opset-10
    form ``(X, scales)``; empty tensors count as absent.

    Example:
        >>> resize_operands([None, np.zeros(0), np.ones(4)])[1:]
        (array([1., 1., 1., 1.]), None)
    """
    if len(inputs) == 2:
        picked = [None, inputs[1], None]
    else:
        picked = (list(inputs) + [None] * 4)[1:4]
    return tuple(None if v is None or np.size(v) == 0 else v for v in picked)  # type: ignore


def _axes(attrs: Mapping[str, Any], rank: int) -> list[int]:
    axes = attrs.get("axes")
    if axes is None:
        return list(range(rank))
    if any(not -rank <= a < rank for a in axes):
        raise AttributeError_(f"Resize: axes {list(axes)} out of range for rank {rank}")
    return [a % rank for a in axes]


def plan(shape: Sequence[int], attrs: Mapping[str, Any], scales: Any, sizes: Any,
         ) -> tuple[list[int], list[float], list[int]]:
    """(axes, scale per axis, output size per axis) for concrete dims."""
    rank = len(shape)
    axes = _axes(attrs, rank)
    if (scales is None) == (sizes is None):
        raise AttributeError_("Resize needs exactly one of scales and sizes")
    given = np.asarray(scales if sizes is None else sizes).reshape(-1).tolist()
    if len(given) != len(axes):
        raise AttributeError_(f"Resize: {'scales' if sizes is None else 'sizes'} has "
                              f"{len(given)} values for {len(axes)} axes")
    if sizes is None:
        scale = [float(s) for s in given]
        return axes, scale, [math.floor(shape[a] * s) for a, s in zip(axes, scale)]
    out = [int(s) for s in given]
    scale = [o / shape[a] for a, o in zip(axes, out)]
    policy = attrs.get("keep_aspect_ratio_policy") or "stretch"
    if policy != "stretch":
        one = min(scale) if policy == "not_larger" else max(scale)
        scale = [one] * len(axes)
        out = [int(one * shape[a] + 0.5) for a in axes]
    return axes, scale, out


# ------------------------------------------------------------------- shape inference


def _resize_infer(ctx: InferContext) -> list[Any]:
    x = ctx.shape(0)
    try:
        check_attrs(ctx.attrs)
        axes = None if x is None else _axes(ctx.attrs, len(x))
    except AttributeError_ as e:
        ctx.fail(str(e))
    if x is None:
        return [None]
    two = len(ctx.inputs) == 2
    which = 1 if two else 3 if ctx.has(3) and ctx.shape(3) != (0,) else 2
    if not ctx.has(which):
        ctx.fail("Resize needs a scales or a sizes input")
    value = ctx.value(which)
    out = list(x)
    if value is None:
        for a in axes:
            out[a] = ctx.fresh("resized")
        return [tuple(out)]
    given = np.asarray(value).reshape(-1).tolist()
    if len(given) != len(axes):
        ctx.fail(f"{'sizes' if which == 3 else 'scales'} has {len(given)} values for "
                 f"{len(axes)} axes")
    if which == 3 and all(isinstance(d, int) for d in x):
        _, _, sizes = plan(x, ctx.attrs, None, value)
        for a, s in zip(axes, sizes):
            out[a] = s
        return [tuple(out)]
    for a, g in zip(axes, given):
        out[a] = _scaled(x[a], g, which == 3, ctx)
    return [tuple(out)]


def _scaled(dim: Dim, given: float, is_size: bool, ctx: InferContext) -> Dim:
    policy = ctx.attrs.get("keep_aspect_ratio_policy") or "stretch"
    if is_size:
        return int(given) if policy == "stretch" else ctx.fresh("resized")
    if isinstance(dim, int):
        return math.floor(dim * given)
    return dim * int(given) if float(given).is_integer() else ctx.fresh("resized")


# ------------------------------------------------------------------------- reference


def _source(mode: str, out_n: int, scale: float, n_in: int, roi: tuple[float, float] | None,
            ) -> tuple[np.ndarray, np.ndarray | None]:
    """Source coordinate of every output index (and, for tf_crop_and_resize, which ones
    fall outside the input)."""
    y = np.arange(out_n, dtype=np.float64)
    length = scale * n_in
    if mode == "align_corners":
        return (np.zeros(out_n) if length == 1 else y * (n_in - 1) / (length - 1)), None
    if mode == "asymmetric":
        return y / scale, None
    if mode == "pytorch_half_pixel":
        return (np.full(out_n, -0.5) if length == 1 else (y + 0.5) / scale - 0.5), None
    if mode == "half_pixel_symmetric":
        offset = n_in / 2 * (1 - out_n / length)
        return offset + (y + 0.5) / scale - 0.5, None
    if mode == "tf_crop_and_resize":
        lo, hi = roi if roi is not None else (0.0, 1.0)
        if length == 1:
            x = np.full(out_n, (hi - lo) * (n_in - 1) / 2)
        else:
            x = y * (hi - lo) * (n_in - 1) / (length - 1)
        x = x + lo * (n_in - 1)
        return x, (x < 0) | (x > n_in - 1)
    return (y + 0.5) / scale - 0.5, None  # half_pixel


def _cubic(ratio: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic weights of the 4 taps around a point at ``ratio`` past the second."""
    def near(t: np.ndarray) -> np.ndarray:
        return ((a + 2) * t - (a + 3)) * t * t + 1

    def far(t: np.ndarray) -> np.ndarray:
        return ((a * t - 5 * a) * t + 8 * a) * t - 4 * a

    return np.stack([far(ratio + 1), near(ratio), near(1 - ratio), far(2 - ratio)], axis=1)


def _antialiased(ratio: np.ndarray, scale: float, support: int,
                 kernel: Any) -> np.ndarray:
    """A filter stretched by ``1/scale`` when downscaling, rows normalized to 1."""
    scale = min(scale, 1.0)
    start = int(np.floor(-support / scale) + 1)
    taps = np.arange(start, 2 - start)
    w = kernel(np.abs((taps[None, :] - ratio[:, None]) * scale))
    return w / w.sum(axis=1, keepdims=True)


def _coefficients(ratio: np.ndarray, scale: float, attrs: Mapping[str, Any]) -> np.ndarray:
    a = attrs["cubic_coeff_a"]
    if attrs["mode"] == "linear":
        if attrs["antialias"]:
            return _antialiased(ratio, scale, 1, lambda t: np.clip(1 - t, 0, 1))
        return np.stack([1 - ratio, ratio], axis=1)
    if attrs["antialias"]:
        def keys(t: np.ndarray) -> np.ndarray:
            t2, t3 = t * t, t * t * t
            return np.where(t <= 1, (a + 2) * t3 - (a + 3) * t2 + 1,
                            np.where(t < 2, a * t3 - 5 * a * t2 + 8 * a * t - 4 * a, 0.0))
        return _antialiased(ratio, scale, 2, keys)
    return _cubic(ratio, a)


def _taps(n_in: int, x: np.ndarray, scale: float, attrs: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """The input indices (edge-clamped) and weights of the taps of each source point ``x``,
    linear or cubic (taps dropped and the rest renormalized with ``exclude_outside``)."""
    floor = np.floor(x)
    exact = x == floor
    ratio = np.where(exact, 1.0, x - floor)
    coeffs = _coefficients(ratio, scale, attrs)
    taps = coeffs.shape[1]
    half = taps // 2
    start = floor.astype(np.int64) - np.where(exact, half, half - 1)
    idx = start[:, None] + np.arange(taps)[None, :]
    if attrs["exclude_outside"]:
        coeffs = np.where((idx < 0) | (idx >= n_in), 0.0, coeffs)
        total = coeffs.sum(axis=1, keepdims=True)
        coeffs = coeffs / np.where(total == 0, 1.0, total)
    return np.clip(idx, 0, n_in - 1), coeffs


def axis_taps(n_in: int, n_out: int, scale: float, attrs: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """For a linear or cubic Resize of an axis of ``n_in`` to ``n_out`` at ``scale`` (with no
    roi): each output index's input indices ``[n_out, taps]`` and weights (float64): the
    reference's own interpolation, for a backend that applies it natively.

    Example:
        >>> idx, w = axis_taps(2, 4, 2.0, {"mode": "linear", "antialias": 0, "exclude_outside": 0,
        ...                               "cubic_coeff_a": -0.75, "coordinate_transformation_mode": "half_pixel"})
        >>> idx.tolist(), w[1].tolist()
        ([[0, 0], [0, 1], [0, 1], [1, 1]], [0.75, 0.25])
    """
    src, _ = _source(attrs["coordinate_transformation_mode"], n_out, scale, n_in, None)
    return _taps(n_in, src, scale, attrs)


def _interpolate(data: np.ndarray, axis: int, x: np.ndarray, scale: float,
                 attrs: Mapping[str, Any]) -> np.ndarray:
    """Linear or cubic along ``axis``: the taps nearest each source point (:func:`_taps`),
    weighted and summed."""
    idx, coeffs = _taps(data.shape[axis], x, scale, attrs)
    gathered = np.take(data, idx, axis=axis)
    shape = (1,) * axis + coeffs.shape + (1,) * (data.ndim - axis - 1)
    return (gathered * coeffs.reshape(shape)).sum(axis=axis + 1)


def _nearest(data: np.ndarray, axis: int, x: np.ndarray, mode: str) -> np.ndarray:
    floor = np.floor(x)
    frac = x - floor
    up = {"round_prefer_floor": frac > 0.5, "round_prefer_ceil": frac >= 0.5,
          "floor": np.zeros_like(frac, bool), "ceil": frac > 0}[mode]
    idx = np.clip(floor.astype(np.int64) + up, 0, data.shape[axis] - 1)
    return np.take(data, idx, axis=axis)


def resize_reference(inputs: list[np.ndarray | None], attrs: Mapping[str, Any]) -> np.ndarray:
    """Opaque: separable interpolation, one vectorized pass per resized axis."""
    check_attrs(attrs)
    x = inputs[0]
    roi, scales, sizes = resize_operands(inputs)
    axes, scale, out = plan(x.shape, attrs, scales, sizes)
    roi_of = {}
    if roi is not None:
        flat = np.asarray(roi, np.float64).reshape(-1)  # starts of the axes, then their ends
        for i, a in enumerate(axes):
            roi_of[a] = (float(flat[i]), float(flat[i + len(axes)]))
    nearest = attrs["mode"] == "nearest"
    ctm = attrs["coordinate_transformation_mode"]
    y = x if nearest else x.astype(np.float64)
    for a, s, n in zip(axes, scale, out):
        if n == y.shape[a] and math.isclose(s, 1.0) and roi_of.get(a, (0.0, 1.0)) == (0.0, 1.0):
            continue
        src, outside = _source(ctm, n, s, y.shape[a], roi_of.get(a))
        y = _nearest(y, a, src, attrs["nearest_mode"]) if nearest else _interpolate(y, a, src, s, attrs)
        if outside is not None and outside.any():
            mask = outside.reshape((1,) * a + (n,) + (1,) * (y.ndim - a - 1))
            y = np.where(mask, attrs["extrapolation_value"], y)
    if x.dtype.kind in "iu":
        info = np.iinfo(x.dtype)
        y = np.clip(np.rint(y), info.min, info.max)
    return np.asarray(y).astype(x.dtype)


def _resize_adapt(opset: int, attrs: dict[str, Any], n_inputs: int,
                  ) -> tuple[dict[str, Any], dict[int, Any]]:
    """Resize-10 had only ``mode``: its coordinates are asymmetric, nearest rounds down."""
    if opset < 11:
        attrs = {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor",
                 **attrs}
    return attrs, {}


RESIZE_ATTRS = {
    "antialias": int_(0), "axes": ints(), "coordinate_transformation_mode": string("half_pixel"),
    "cubic_coeff_a": float_(-0.75), "exclude_outside": int_(0),
    "extrapolation_value": float_(0.0), "keep_aspect_ratio_policy": string("stretch"),
    "mode": string("nearest"), "nearest_mode": string("round_prefer_floor"),
}

Resize = metaop(
    "Resize",
    inputs=("X", "roi?: T2", "scales?: float32", "sizes?: int64"), outputs=("Y",),
    attrs=RESIZE_ATTRS,
    types="T in {numeric, bool}; T2 in {float}",
    rule=_resize_infer, reference=resize_reference, reads=(1, 2, 3),
    role=Role.INJECTIVE, layouts=("NCHW",), adapt=_resize_adapt,
    since=(10, 11, 13, 18, 19),
    doc="Nearest, (bi/tri)linear and cubic resizing; a 2-input node is Resize-10's (X, scales).",
)


# ---------------------------------------------------------------------------- Upsample


def _upsample_adapt(opset: int, attrs: dict[str, Any], n_inputs: int,
                    ) -> tuple[dict[str, Any], dict[int, Any]]:
    """Upsample-7 had ``scales`` as an attribute, Upsample-1 ``height_scale``/``width_scale``
    (NCHW) and mode ``bilinear``: both become the scales input."""
    attrs = dict(attrs)
    extra: dict[int, Any] = {}
    if "scales" in attrs:
        extra[1] = np.asarray(attrs.pop("scales"), np.float32)
    if "height_scale" in attrs or "width_scale" in attrs:
        extra[1] = np.asarray([1, 1, attrs.pop("height_scale", 1.0),
                               attrs.pop("width_scale", 1.0)], np.float32)
    if attrs.get("mode") == "bilinear":
        attrs["mode"] = "linear"
    return attrs, extra


def _upsample_infer(ctx: InferContext) -> list[Any]:
    if ctx.attrs["mode"] not in ("nearest", "linear"):
        ctx.fail(f"mode={ctx.attrs['mode']!r} must be nearest or linear")
    return _resize_infer(ctx)


def upsample_reference(inputs: list[np.ndarray | None], attrs: Mapping[str, Any]) -> np.ndarray:
    """Resize with asymmetric coordinates and nearest rounding down."""
    full = {**{k: s.default for k, s in RESIZE_ATTRS.items()}, "mode": attrs["mode"],
            "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    return resize_reference([inputs[0], None, inputs[1]], full)


Upsample = metaop(
    "Upsample", inputs=("X", "scales: float32"), outputs=("Y",),
    attrs={"mode": string("nearest")}, types="T in {numeric, bool}",
    rule=_upsample_infer, reference=upsample_reference, reads=(1,),
    role=Role.INJECTIVE, layouts=("NCHW",), adapt=_upsample_adapt, since=(1, 7, 9, 10),
    doc="Deprecated since opset 10: Resize with asymmetric coordinates.",
)

__all__ = ["MODES", "NEAREST_MODES", "POLICIES", "RESIZE_ATTRS", "TRANSFORMS", "axis_taps", "check_attrs",
           "plan", "resize_operands", "resize_reference", "upsample_reference"]
