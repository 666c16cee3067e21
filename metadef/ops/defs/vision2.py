"""More vision ops: MaxUnpool and DeformConv.

- ``MaxUnpool`` scatters each value of a max-pooled tensor back to the flat position its
  ``I`` index names (MaxPool's ``Indices`` output) in a zero tensor of the unpooled size
  ``(in - 1) * stride - pad_begin - pad_end + kernel``; an ``output_shape`` input, when given,
  pads that result with zeros at the end of each axis (as ONNX's node tests expect).
- ``DeformConv`` is a convolution whose kernel taps sample the input at positions moved by
  learned fractional ``offset``s (bilinearly, zeros outside), optionally weighted by ``mask``.

Both read or write at positions given by input *values*, so both are opaque with a vectorized
numpy reference (Python loops run only over the 2^d interpolation corners).

Example:
    >>> from metadef.testing.onnx_cases import infer_text
    >>> infer_text("MaxUnpool", ["f32[n,3,h,w]", "i64[n,3,h,w]"], {"kernel_shape": [2, 2],
    ...            "strides": [2, 2]})
    ['f32[n,3,h*2,w*2]']
    >>> infer_text("DeformConv", ["f32[n,4,h,w]", "f32[8,4,3,3]", "f32[n,18,p,q]"])
    ['f32[n,8,p,q]']
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from metadef.core.errors import BackendError
from metadef.ops.defs.shape_values import fresh_dims, input_dims, product
from metadef.ops.infer import InferContext
from metadef.ops.interface import REQUIRED, int_, ints
from metadef.ops.metaop import metaop
from metadef.ops.strategy import Role
from metadef.shape import Decision, Dim, add, equal, mul, sub

Arrays = list[np.ndarray | None]


def _per_axis(attrs: Mapping[str, Any], name: str, nd: int, default: int) -> tuple[int, ...]:
    """An ints attribute with one value per spatial axis (``pads``: two), or its default."""
    value = attrs[name]
    count = 2 * nd if name == "pads" else nd
    return tuple(value) if value else (default,) * count


# ------------------------------------------------------------------------------ MaxUnpool


def _unpooled(x: Sequence[Dim], attrs: Mapping[str, Any]) -> tuple[Dim, ...]:
    """The spatial size MaxPool came from: ``(in - 1) * stride - pads + kernel``."""
    kernel = attrs["kernel_shape"]
    nd = len(kernel)
    strides, pads = _per_axis(attrs, "strides", nd, 1), _per_axis(attrs, "pads", nd, 0)
    return tuple(add(mul(sub(x[2 + i], 1), strides[i]), kernel[i] - pads[i] - pads[nd + i])
                 for i in range(nd))


def _maxunpool_rule(ctx: InferContext) -> list[Any]:
    x, kernel = ctx.shape(0), ctx.attrs["kernel_shape"]
    if x is not None and len(x) != len(kernel) + 2:
        ctx.fail(f"X must be [N, C] and one axis per kernel axis ({len(kernel)}), "
                 f"got rank {len(x)}")
    for name in ("strides", "pads"):
        given, want = ctx.attrs[name], (2 if name == "pads" else 1) * len(kernel)
        if given and len(given) != want:
            ctx.fail(f"{name} must hold {want} values, got {list(given)}")
    if ctx.has(2):
        shape = input_dims(ctx.values, 2)
        if shape is not None:
            return [shape]
        n = ctx.shape(2)[0] if ctx.shape(2) else None
        return [fresh_dims(ctx, n if isinstance(n, int) else None, "unpooled")]
    return [None if x is None else (x[0], x[1], *_unpooled(x, ctx.attrs))]


def _maxunpool_reference(inputs: Arrays, attrs: Mapping[str, Any]) -> np.ndarray:
    x, index, output_shape = inputs[0], inputs[1], inputs[2] if len(inputs) > 2 else None
    unpooled = (*x.shape[:2], *_unpooled(x.shape, attrs))
    flat = np.zeros(int(np.prod(unpooled)), x.dtype)
    index = index.reshape(-1)
    bad = (index < 0) | (index >= flat.size)
    if bad.any():
        raise BackendError(f"MaxUnpool: index {int(index[bad][0])} is outside the {flat.size} "
                           f"elements of the unpooled tensor {list(unpooled)}")
    flat[index] = x.reshape(-1)
    if output_shape is None:
        return flat.reshape(unpooled)
    out = np.zeros(tuple(int(d) for d in output_shape), x.dtype)
    out[tuple(slice(0, d) for d in unpooled)] = flat.reshape(unpooled)
    return out


MaxUnpool = metaop(
    "MaxUnpool", inputs=("X: T1", "I: T2", "output_shape?: T2"), outputs=("output: T1",),
    attrs={"kernel_shape": ints(REQUIRED), "pads": ints(None), "strides": ints(None)},
    types="T1 in {float}; T2 in {int64}", rule=_maxunpool_rule,
    reference=_maxunpool_reference, role=Role.OPAQUE, reads=(2,), since=(9, 11, 22),
    doc="The inverse of MaxPool: each value of X written at the flat position I names in a "
        "zero tensor of the unpooled size (padded to output_shape when given).",
)


# ----------------------------------------------------------------------------- DeformConv


def _deform_conv_rule(ctx: InferContext) -> list[Any]:
    x, w, offset = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    if x is None or w is None or offset is None:
        return [None]
    nd = len(x) - 2
    if nd < 1 or len(w) != len(x) or len(offset) != len(x):
        ctx.fail(f"X, W and offset must have the same rank >= 3, got ranks {len(x)}, {len(w)} "
                 f"and {len(offset)}")
    group, offset_group = ctx.attrs["group"], ctx.attrs["offset_group"]
    if equal(mul(w[1], group), x[1], ctx.env) is Decision.FALSE:
        ctx.fail(f"W's input channels ({w[1]}) times group ({group}) must be X's channels "
                 f"({x[1]})")
    kernel = tuple(ctx.attrs["kernel_shape"] or w[2:])
    taps = mul(mul(product(kernel), nd), offset_group)
    if equal(offset[1], taps, ctx.env) is Decision.FALSE:
        ctx.fail(f"offset must have offset_group * prod(kernel_shape) * {nd} = {taps} "
                 f"channels, got {offset[1]}")
    return [(x[0], w[0], *offset[2:])]


def _sample_positions(offset: np.ndarray, attrs: Mapping[str, Any], kernel: Sequence[int],
                      groups: int) -> np.ndarray:
    """Where each tap reads, ``[d, n, offset_group, tap, *out]``: the tap's place in the
    strided, dilated, padded window, moved by its offset."""
    nd, out = len(kernel), offset.shape[2:]
    strides, dilations = _per_axis(attrs, "strides", nd, 1), _per_axis(attrs, "dilations", nd, 1)
    pads = _per_axis(attrs, "pads", nd, 0)
    moved = offset.reshape(offset.shape[0], groups, -1, nd, *out).astype(np.float64)
    taps = np.indices(kernel).reshape(nd, -1)  # [d, tap]
    where = np.indices(out)  # [d, *out]
    start = [where[d] * strides[d] - pads[d] for d in range(nd)]
    return np.stack([start[d] + (taps[d] * dilations[d]).reshape(-1, *[1] * nd) + moved[:, :, :, d]
                     for d in range(nd)])


def _bilinear(x: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """``x [n, offset_group, channels, *spatial]`` read at fractional positions ``pos
    [d, n, offset_group, tap, *out]``, interpolating (bi/tri)linearly, zeros outside:
    ``[n, offset_group, tap, *out, channels]``."""
    nd, spatial = pos.shape[0], x.shape[3:]
    low = np.floor(pos).astype(np.int64)
    frac = pos - low
    n, g = np.ogrid[:pos.shape[1], :pos.shape[2]]
    lead = (n.reshape(-1, *[1] * (pos.ndim - 2)), g.reshape(1, -1, *[1] * (pos.ndim - 3)))
    out = np.zeros((*pos.shape[1:], x.shape[2]), np.float64)
    for corner in itertools.product((0, 1), repeat=nd):
        index = [low[d] + corner[d] for d in range(nd)]
        weight = np.prod([frac[d] if corner[d] else 1 - frac[d] for d in range(nd)], axis=0)
        inside = np.all([(i >= 0) & (i < s) for i, s in zip(index, spatial)], axis=0)
        clipped = tuple(np.clip(i, 0, s - 1) for i, s in zip(index, spatial))
        out += (weight * inside)[..., None] * x[(*lead, slice(None), *clipped)]
    return out


def _deform_conv_reference(inputs: Arrays, attrs: Mapping[str, Any]) -> np.ndarray:
    x, w, offset = inputs[0], inputs[1], inputs[2]
    bias, mask = (inputs[3] if len(inputs) > 3 else None), (inputs[4] if len(inputs) > 4 else None)
    n, channels, nd = x.shape[0], x.shape[1], x.ndim - 2
    kernel, out = tuple(attrs["kernel_shape"] or w.shape[2:]), offset.shape[2:]
    og, group = attrs["offset_group"], attrs["group"]
    pos = _sample_positions(offset, attrs, kernel, og)
    grouped = x.astype(np.float64).reshape(n, og, channels // og, *x.shape[2:])
    sampled = _bilinear(grouped, pos)  # [n, og, tap, *out, channels/og]
    if mask is not None:
        sampled *= mask.reshape(n, og, -1, *out).astype(np.float64)[..., None]
    columns = np.moveaxis(sampled, -1, 2).reshape(n, group, channels // group, -1, *out)
    weights = w.astype(np.float64).reshape(group, w.shape[0] // group, w.shape[1], -1)
    y = np.einsum("ngct...,goct->ngo...", columns, weights).reshape(n, w.shape[0], *out)
    if bias is not None:
        y += bias.reshape(-1, *[1] * nd)
    return y.astype(x.dtype)


DeformConv = metaop(
    "DeformConv", inputs=("X", "W", "offset", "B?", "mask?"), outputs=("Y",),
    attrs={"dilations": ints(None), "group": int_(1), "kernel_shape": ints(None),
           "offset_group": int_(1), "pads": ints(None), "strides": ints(None)},
    types="T in {float}", rule=_deform_conv_rule, reference=_deform_conv_reference,
    role=Role.OPAQUE, since=(19, 22),
    doc="Convolution whose taps read X at positions moved by offset (bilinear, zeros "
        "outside), each scaled by mask; offset and mask are per offset_group, tap and "
        "output position.",
)

__all__ = ["DeformConv", "MaxUnpool"]
