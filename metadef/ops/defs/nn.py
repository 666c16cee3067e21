"""Convolutions and block rearrangements: Conv, ConvTranspose, DepthToSpace, SpaceToDepth.

Conv is an index expression generated per node from its rank, group and window;
its shapes come from the 1-D/2-D/3-D window rule of :mod:`.nn_pool`. ConvTranspose is opaque
(a vectorized col2im). The pools live in :mod:`.nn_pool`, the normalizations in
:mod:`.nn_norm`, Resize and Upsample in :mod:`.nn_resize`.

Example:
    >>> from metadef.ops import get_op, infer_types
    >>> from metadef.shape import parse_type
    >>> x, w = parse_type("f32[batch,3,224,224]"), parse_type("f32[64,3,7,7]")
    >>> y, = infer_types(get_op("Conv"), "/conv1", [x, w], {"strides": [2, 2], "pads": [3] * 4})
    >>> str(y)
    'f32[batch,64,112,112]'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from metadef.core.errors import AttributeError_
from metadef.ops.defs import nn_norm, nn_resize  # noqa: F401  (registers the norms, Resize)
from metadef.ops.defs.nn_pool import WINDOW_ATTRS, window, window_infer
from metadef.ops.infer import InferContext
from metadef.ops.interface import REQUIRED, int_, ints, string
from metadef.ops.metaop import metaop
from metadef.ops.strategy import Role
from metadef.shape import Dim

# ------------------------------------------------------------------------------------ Conv


def _conv_infer(ctx: InferContext) -> list[Any]:
    return window_infer(ctx, ctx.attrs.get("kernel_shape"), weight=True)


def conv_semantics(attrs: Mapping[str, Any], shapes: Sequence[Sequence[Dim] | None],
                   ) -> tuple[str, dict[str, Any]]:
    """``Y[n, k, p..] = B[k] + sum[c, r..] X[n, c, p*S + r*D - B..] * W[k, c, r..]``; with
    groups the channels split as ``k = g*KG + kk`` and ``c -> g*CG + c``."""
    x, w = shapes[0], shapes[1]
    has_bias = len(shapes) > 2 and shapes[2] is not None
    nd = len(x) - 2
    win = window(attrs, x[2:], w[2:])
    params = win.params()
    ps = ", ".join(f"p{i}" for i in range(nd))
    rs = ", ".join(f"r{i}" for i in range(nd))
    reads = ", ".join(f"p{i}*S{i} + r{i}*D{i} - B{i}" for i in range(nd))
    group = attrs.get("group") or 1
    if group == 1:
        k, ch = "k", "c"
    else:
        k, ch = "g*KG + kk", "g*CG + c"
        params.update({"KG": w[0] // group, "CG": w[1]})
    bias = f"B[{k}] + " if has_bias else ""
    return f"Y[n, {k}, {ps}] = {bias}sum[c, {rs}] X[n, {ch}, {reads}] * W[{k}, c, {rs}]", params


Conv = metaop(
    "Conv",
    inputs=("X", "W", "B?"), outputs=("Y",),
    attrs={**WINDOW_ATTRS, "group": int_(1)},
    types="T in {float}",
    rule=_conv_infer, semantics=conv_semantics,
    role=Role.CONTRACTION, layouts=("NCHW",), parallel=("n", "k"),
    since=(1, 11, 22),
    doc="N-D convolution (1-3 spatial axes), grouped and depthwise, with auto_pad.",
)


# --------------------------------------------------------------------------- ConvTranspose


def _per_axis(attrs: Mapping[str, Any], name: str, nd: int, default: int) -> tuple[int, ...]:
    value = attrs.get(name)
    if value is None:
        return (default,) * nd
    if len(value) != nd:
        raise AttributeError_(f"ConvTranspose: attribute {name}={list(value)} needs {nd} "
                              "values, one per spatial axis")
    return tuple(value)


def transpose_geometry(attrs: Mapping[str, Any], spatial: Sequence[Dim], kernel: Sequence[Dim],
                       ) -> tuple[list[Dim], list[Dim], list[Dim]]:
    """(pads before, pads after, output sizes) of a ConvTranspose.

    The full output is ``s*(H-1) + output_padding + d*(k-1) + 1``; pads crop it. With
    ``output_shape`` or SAME_* auto_pad the pads are derived (the odd one after for
    SAME_UPPER, before otherwise); a negative total means zeros appended at the end.
    """
    nd = len(spatial)
    strides = _per_axis(attrs, "strides", nd, 1)
    dilations = _per_axis(attrs, "dilations", nd, 1)
    extra = _per_axis(attrs, "output_padding", nd, 0)
    full = [s * (h - 1) + e + d * (k - 1) + 1
            for h, k, s, d, e in zip(spatial, kernel, strides, dilations, extra)]
    auto_pad = attrs.get("auto_pad") or "NOTSET"
    wanted = attrs.get("output_shape")
    if wanted is not None:
        wanted = tuple(wanted)[-nd:]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        wanted = tuple(h * s for h, s in zip(spatial, strides))
    elif auto_pad not in ("NOTSET", "VALID"):
        raise AttributeError_(f"ConvTranspose: auto_pad={auto_pad!r} is not one of NOTSET, "
                              "SAME_UPPER, SAME_LOWER, VALID")
    if wanted is None:
        pads = (0,) * (2 * nd) if auto_pad == "VALID" else _per_axis(attrs, "pads", 2 * nd, 0)
        begin, end = list(pads[:nd]), list(pads[nd:])
        return begin, end, [f - b - e for f, b, e in zip(full, begin, end)]
    begin, end = [], []
    for f, out in zip(full, wanted):
        total = f - out
        if isinstance(total, int) and total < 0:
            begin.append(0)
            end.append(total)
            continue
        small = total // 2
        begin.append(small if auto_pad == "SAME_UPPER" else total - small)
        end.append(total - small if auto_pad == "SAME_UPPER" else small)
    return begin, end, list(wanted)


def _convtranspose_infer(ctx: InferContext) -> list[Any]:
    x, w = ctx.shape(0), ctx.shape(1)
    if x is None or w is None:
        return [None]
    nd = len(x) - 2
    if len(w) != nd + 2:
        ctx.fail(f"W must have rank {nd + 2} like X, got rank {len(w)}")
    kernel = tuple(ctx.attrs.get("kernel_shape") or w[2:])
    try:
        _, _, out = transpose_geometry(ctx.attrs, x[2:], kernel)
    except AttributeError_ as e:
        ctx.fail(str(e))
    return [(x[0], w[1] * ctx.attrs["group"], *out)]


def convtranspose_reference(inputs: list[np.ndarray | None], attrs: Mapping[str, Any],
                            ) -> np.ndarray:
    """Opaque: a scatter of input pixels (not a comprehension over the output). Computed as
    one einsum to columns, then col2im: one strided add per kernel offset, then a crop."""
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    n, c, *spatial = x.shape
    g = attrs["group"]
    kernel = w.shape[2:]
    nd = len(spatial)
    strides = _per_axis(attrs, "strides", nd, 1)
    dilations = _per_axis(attrs, "dilations", nd, 1)
    begin, end, out = transpose_geometry(attrs, spatial, kernel)
    work = np.float32 if x.dtype.itemsize < 4 else x.dtype
    xg = x.astype(work).reshape(n, g, c // g, *spatial)
    wg = w.astype(work).reshape(g, c // g, w.shape[1], *kernel)
    sp, kr = "xyz"[:nd], "uvw"[:nd]
    cols = np.einsum(f"ngc{sp},gck{kr}->ngk{kr}{sp}", xg, wg)
    size = [b_ + o + max(0, -e) for b_, o, e in zip(begin, out, end)]
    full_len = [s * (h - 1) + d * (k - 1) + 1
                for h, k, s, d in zip(spatial, kernel, strides, dilations)]
    size = [max(a, f) for a, f in zip(size, full_len)]
    full = np.zeros((n, g, w.shape[1], *size), work)
    for offset in np.ndindex(*kernel):
        window = tuple(slice(r * d, r * d + s * (h - 1) + 1, s)
                       for r, d, s, h in zip(offset, dilations, strides, spatial))
        full[(Ellipsis, *window)] += cols[(slice(None),) * 3 + offset]
    y = full[(Ellipsis, *(slice(b_, b_ + o) for b_, o in zip(begin, out)))]
    y = y.reshape(n, g * w.shape[1], *out)
    if b is not None:
        y = y + b.astype(work).reshape(-1, *(1,) * nd)
    return y.astype(x.dtype)


ConvTranspose = metaop(
    "ConvTranspose",
    inputs=("X", "W", "B?"), outputs=("Y",),
    attrs={**WINDOW_ATTRS, "group": int_(1), "output_padding": ints(), "output_shape": ints()},
    types="T in {float}",
    rule=_convtranspose_infer, reference=convtranspose_reference,
    role=Role.CONTRACTION, layouts=("NCHW",), parallel=("n", "k"),
    since=(1, 11, 22),
    doc="The gradient of Conv with respect to its input (a.k.a. deconvolution).",
)


# ------------------------------------------------------------ DepthToSpace, SpaceToDepth

DEPTH_TO_SPACE_RULE = """
rule depth_to_space_type_infer:
  input: tensor<N, C, H, W; T>
  output: tensor<N, C / (blocksize*blocksize), H*blocksize, W*blocksize; T>
  where require C % (blocksize*blocksize) == 0
"""

SPACE_TO_DEPTH_RULE = """
rule space_to_depth_type_infer:
  input: tensor<N, C, H, W; T>
  output: tensor<N, C*blocksize*blocksize, H / blocksize, W / blocksize; T>
  where require H % blocksize == 0
        require W % blocksize == 0
"""


def _block_mode(attrs: Mapping[str, Any]) -> str:
    mode = attrs.get("mode") or "DCR"
    if mode not in ("DCR", "CRD"):
        raise AttributeError_(f"mode={mode!r} must be DCR (depth-column-row) or CRD")
    return mode


def depth_to_space_semantics(attrs: Mapping[str, Any], shapes: Sequence[Sequence[Dim] | None],
                             ) -> tuple[str, dict[str, Any]]:
    """DCR reads channel ``(i*BS + j)*CC + c``, CRD ``(c*BS + i)*BS + j``, for output pixel
    ``(h*BS + i, w*BS + j)`` of output channel ``c``."""
    bs = attrs["blocksize"]
    channel = "i*BS*CC + j*CC + c" if _block_mode(attrs) == "DCR" else "c*BS*BS + i*BS + j"
    return (f"output[n, c, h*BS + i, w*BS + j] = input[n, {channel}, h, w]",
            {"BS": bs, "CC": shapes[0][1] // (bs * bs)})


def space_to_depth_semantics(attrs: Mapping[str, Any], shapes: Sequence[Sequence[Dim] | None],
                             ) -> tuple[str, dict[str, Any]]:
    """The inverse of DepthToSpace (same modes)."""
    channel = "i*BS*CI + j*CI + c" if _block_mode(attrs) == "DCR" else "c*BS*BS + i*BS + j"
    return (f"output[n, {channel}, h, w] = input[n, c, h*BS + i, w*BS + j]",
            {"BS": attrs["blocksize"], "CI": shapes[0][1]})


DepthToSpace = metaop(
    "DepthToSpace", inputs=("input",), outputs=("output",),
    attrs={"blocksize": int_(REQUIRED), "mode": string("DCR")},
    types="T in {numeric, bool, string}", rule=DEPTH_TO_SPACE_RULE,
    semantics=depth_to_space_semantics, role=Role.INJECTIVE, layouts=("NCHW",),
    parallel=("n", "c"), since=(1, 11, 13, 28),
)

SpaceToDepth = metaop(
    "SpaceToDepth", inputs=("input",), outputs=("output",),
    attrs={"blocksize": int_(REQUIRED), "mode": string("DCR")},
    types="T in {numeric, bool, string}", rule=SPACE_TO_DEPTH_RULE,
    semantics=space_to_depth_semantics, role=Role.INJECTIVE, layouts=("NCHW",),
    parallel=("n", "c"), since=(1, 13, 28),
)

__all__ = ["Conv", "ConvTranspose", "DepthToSpace", "SpaceToDepth", "conv_semantics",
           "convtranspose_reference", "transpose_geometry"]
