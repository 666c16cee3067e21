"""Sliding windows: the geometry Conv and the pools share, and the pooling ops.

The window geometry (strides, dilations, pads from ``pads`` or ``auto_pad``, ``ceil_mode``)
is computed once here; shapes come from one type-rule template instantiated for 1-D, 2-D and
3-D windows, called from a Python rule with the pads as params. Every pool is an index
expression over the window, with out-of-range reads filled (``-inf`` for max, 0 for sums).

Example:
    >>> from metadef.ops import get_op, infer_types
    >>> from metadef.shape import parse_type
    >>> y, indices = infer_types(get_op("MaxPool"), "/pool", [parse_type("f32[b,64,h,w]")],
    ...                          {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]})
    >>> str(y), indices.dtype.name
    ('f32[b,64,floor((h - 1)/2) + 1,floor((w - 1)/2) + 1]', 'int64')
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from metadef.core.errors import AttributeError_
from metadef.ops.infer import InferContext
from metadef.ops.interface import REQUIRED, int_, ints, string
from metadef.ops.metaop import metaop
from metadef.ops.strategy import Role
from metadef.ops.typerule import TypeRule, compile_rule
from metadef.shape import Dim, ceildiv, max_

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
WINDOW_ATTRS = {"auto_pad": string("NOTSET"), "kernel_shape": ints(), "pads": ints(),
                "strides": ints(), "dilations": ints()}


# ------------------------------------------------------------------------ window geometry


@dataclass(frozen=True)
class Window:
    """Per spatial axis: kernel size, stride, dilation, pad before and pad after."""

    kernel: tuple[Dim, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    begin: tuple[Dim, ...]
    end: tuple[Dim, ...]

    def params(self) -> dict[str, Any]:
        """``K0, S0, D0, B0, ...`` for the index expressions."""
        out: dict[str, Any] = {}
        for i, (k, s, d, b) in enumerate(zip(self.kernel, self.strides, self.dilations, self.begin)):
            out.update({f"K{i}": k, f"S{i}": s, f"D{i}": d, f"B{i}": b})
        return out


def _per_axis(attrs: Mapping[str, Any], name: str, nd: int, default: int) -> tuple[int, ...]:
    value = attrs.get(name)
    if value is None:
        return (default,) * nd
    if len(value) != nd:
        raise AttributeError_(f"attribute {name}={list(value)} needs {nd} values, one per "
                              f"spatial axis")
    return tuple(value)


def window(attrs: Mapping[str, Any], spatial: Sequence[Dim], kernel: Sequence[Dim], *,
           clamp: bool = True) -> Window:
    """The window geometry of a node over input ``spatial`` dims.

    SAME_* pads total ``(ceil(H/s) - 1)*s + d*(k-1) + 1 - H``, the extra one going after
    (UPPER) or before (LOWER). ``clamp=False`` keeps a negative total (shape inference:
    the output size is then still ``ceil(H/s)``, as a simpler expression).
    """
    nd = len(spatial)
    strides = _per_axis(attrs, "strides", nd, 1)
    dilations = _per_axis(attrs, "dilations", nd, 1)
    auto_pad = attrs.get("auto_pad") or "NOTSET"
    if auto_pad not in AUTO_PADS:
        raise AttributeError_(f"auto_pad={auto_pad!r} is not one of {', '.join(AUTO_PADS)}")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for h, k, s, d in zip(spatial, kernel, strides, dilations):
            total = (ceildiv(h, s) - 1) * s + d * (k - 1) + 1 - h
            total = max_(total, 0) if clamp else total
            small = total // 2
            begin.append(small if auto_pad == "SAME_UPPER" else total - small)
            end.append(total - small if auto_pad == "SAME_UPPER" else small)
        return Window(tuple(kernel), strides, dilations, tuple(begin), tuple(end))
    pads = (0,) * (2 * nd) if auto_pad == "VALID" else _per_axis(attrs, "pads", 2 * nd, 0)
    return Window(tuple(kernel), strides, dilations, pads[:nd], pads[nd:])


def output_size(h: Dim, win: Window, i: int, ceil_mode: bool) -> Dim:
    """Output positions along axis ``i``; in ceil mode the last window starts inside the
    input or its left padding."""
    span = h + win.begin[i] + win.end[i] - win.dilations[i] * (win.kernel[i] - 1) - 1
    s = win.strides[i]
    if not ceil_mode:
        return span // s + 1
    out = ceildiv(span, s) + 1
    late = (out - 1) * s - h - win.begin[i]
    return out - 1 if isinstance(late, int) and late >= 0 else out


@functools.cache
def window_rule(nd: int, *, weight: bool, indices: bool = False) -> TypeRule:
    """The type rule of a windowed op over ``nd`` spatial axes (Conv with ``weight``, pools
    without; ``indices`` adds MaxPool's int64 output). Params: ``PAD{i}`` (both sides),
    ``CEIL{i}`` (stride - 1 in ceil mode, else 0), ``S{i}``, ``D{i}``, and for pools ``R{i}``.
    """
    hs = ", ".join(f"H{i}" for i in range(nd))
    ps = ", ".join(f"P{i}" for i in range(nd))
    lines = [f"rule {'conv' if weight else 'pool'}{nd}d_type_infer:",
             f"  x: tensor<N, C, {hs}; T>"]
    if weight:
        lines += [f"  w: tensor<K, CG, {', '.join(f'R{i}' for i in range(nd))}; T>",
                  "  b?: tensor<K; T>", f"  y: tensor<N, K, {ps}; T>"]
    else:
        lines += [f"  y: tensor<N, C, {ps}; T>"]
        lines += [f"  indices: tensor<N, C, {ps}; int64>"] if indices else []
    lines.append("  where")
    lines += [f"    P{i} = (H{i} + PAD{i} - D{i}*(R{i} - 1) - 1 + CEIL{i}) / S{i} + 1"
              for i in range(nd)]
    lines += ["    require C == CG * group", "    require K % group == 0"] if weight else []
    return compile_rule("\n".join(lines))


def window_infer(ctx: InferContext, kernel: Sequence[Dim] | None, *, weight: bool,
                 indices: bool = False, ceil_mode: bool = False) -> list[Any]:
    """Run :func:`window_rule` for a node; ``kernel`` None takes it from the weight."""
    shape = ctx.shape(0)
    if shape is None:
        return [None] * (2 if indices else 1)
    nd = len(shape) - 2
    if nd < 1 or nd > 3:
        ctx.fail(f"the input must have rank 3, 4 or 5 (N, C and 1-3 spatial dims), "
                 f"got rank {len(shape)}")
    w_shape = ctx.shape(1) if weight else None
    if kernel is None:
        if w_shape is None:
            return [None]
        kernel = tuple(w_shape[2:])
    if len(kernel) != nd:
        ctx.fail(f"kernel_shape {list(kernel)} has {len(kernel)} dims but the input has "
                 f"{nd} spatial dims")
    try:
        win = window(ctx.attrs, shape[2:], kernel, clamp=False)
    except AttributeError_ as e:
        ctx.fail(str(e))
    params: dict[str, Any] = {}
    for i in range(nd):
        params.update({f"PAD{i}": win.begin[i] + win.end[i], f"S{i}": win.strides[i],
                       f"D{i}": win.dilations[i],
                       f"CEIL{i}": win.strides[i] - 1 if ceil_mode else 0})
        if not weight or ctx.attrs.get("kernel_shape") is not None:
            params[f"R{i}"] = kernel[i]
    outs = window_rule(nd, weight=weight, indices=indices)(ctx, params)
    if ceil_mode:  # the last window must start inside the input or its left padding
        sizes = tuple(output_size(h, win, i, True) for i, h in enumerate(shape[2:]))
        outs = [o if o is None else o.with_shape(o.shape[:2] + sizes) for o in outs]
    return outs


# ----------------------------------------------------------------------------- the pools


def _pool_infer(ctx: InferContext) -> list[Any]:
    kernel = ctx.attrs["kernel_shape"]
    return window_infer(ctx, kernel, weight=False, indices=len(ctx.op.outputs) > 1,
                        ceil_mode=bool(ctx.attrs.get("ceil_mode")))


def _pool_geometry(attrs: Mapping[str, Any], shapes: Sequence[Sequence[Dim] | None],
                   ) -> tuple[Window, dict[str, Any], str, str, str]:
    """The window, its params, and the text pieces ``p0, p1``, ``r0:K0, r1:K1`` and the
    input access ``X[n, c, p0*S0 + r0*D0 - B0, ...]``."""
    x = shapes[0]
    nd = len(x) - 2
    win = window(attrs, x[2:], attrs["kernel_shape"])
    outs = ", ".join(f"p{i}" for i in range(nd))
    bounds = ", ".join(f"r{i}:K{i}" for i in range(nd))
    reads = ", ".join(f"p{i}*S{i} + r{i}*D{i} - B{i}" for i in range(nd))
    return win, win.params(), outs, bounds, f"X[n, c, {reads}]"


def _flat_index(nd: int, column_major: bool) -> str:
    """MaxPool's Indices: the flat position of ``X[n, c, h0, ...]`` (``h_i`` read as values),
    with the spatial axes in row-major or column-major order."""
    axes = list(range(nd))[::-1] if column_major else list(range(nd))
    text = "(n*C + c)"
    for i in axes:
        text = f"({text}*H{i} + (p{i}*S{i} + r{i}*D{i} - B{i}))"
    return text


def maxpool_semantics(attrs: Mapping[str, Any], shapes: Sequence[Sequence[Dim] | None],
                      ) -> tuple[str, dict[str, Any]]:
    """``Y = max over the window`` (padding reads -inf) and ``Indices`` = the flat index of
    the first maximum, found as the least flat index whose value equals the maximum."""
    _win, params, outs, bounds, read = _pool_geometry(attrs, shapes)
    x = shapes[0]
    nd = len(x) - 2
    flat = _flat_index(nd, attrs.get("storage_order") == 1)
    params.update({"C": x[1], "BIG": 2 ** 62, **{f"H{i}": h for i, h in enumerate(x[2:])}})
    text = (f"Y[n, c, {outs}] = max[{bounds}] fill({read}, -inf)\n"
            f"Indices[n, c, {outs}] = min[{bounds}] where(inbounds({read}) > 0 and "
            f"fill({read}, -inf) == Y[n, c, {outs}], {flat}, BIG)")
    return text, params


def averagepool_semantics(attrs: Mapping[str, Any], shapes: Sequence[Sequence[Dim] | None],
                          ) -> tuple[str, dict[str, Any]]:
    """The window sum over the count of the cells read: cells of the input only, or
    (``count_include_pad``) cells inside the padded input."""
    win, params, outs, bounds, read = _pool_geometry(attrs, shapes)
    if attrs.get("count_include_pad"):
        nd = len(win.kernel)
        params.update({f"E{i}": h + win.begin[i] + win.end[i]
                       for i, h in enumerate(shapes[0][2:])})
        count = " * ".join(f"(sum[r{i}:K{i}] where(p{i}*S{i} + r{i}*D{i} < E{i}, 1, 0))"
                           for i in range(nd))
    else:
        count = f"(sum[{bounds}] inbounds({read}))"
    return f"Y[n, c, {outs}] = (sum[{bounds}] {read}) / ({count})", params


def lppool_semantics(attrs: Mapping[str, Any], shapes: Sequence[Sequence[Dim] | None],
                     ) -> tuple[str, dict[str, Any]]:
    """``(sum over the window of |x|**p) ** (1/p)``; padding reads 0."""
    _win, params, outs, bounds, read = _pool_geometry(attrs, shapes)
    params["P"] = attrs["p"]
    return f"Y[n, c, {outs}] = (sum[{bounds}] abs({read}) ** P) ** (1.0 / P)", params


_POOL_HINTS = {"role": Role.REDUCTION, "layouts": ("NCHW",), "parallel": ("n", "c")}

MaxPool = metaop(
    "MaxPool", inputs=("X",), outputs=("Y", "Indices?: int64"),
    attrs={**WINDOW_ATTRS, "kernel_shape": ints(REQUIRED), "ceil_mode": int_(0),
           "storage_order": int_(0)},
    types="T in {float, int8, uint8}", rule=_pool_infer, semantics=maxpool_semantics,
    since=(1, 8, 10, 11, 12, 22), **_POOL_HINTS,
    doc="Max over each window; Indices holds the flat index of the first maximum.",
)

AveragePool = metaop(
    "AveragePool", inputs=("X",), outputs=("Y",),
    attrs={**WINDOW_ATTRS, "kernel_shape": ints(REQUIRED), "ceil_mode": int_(0),
           "count_include_pad": int_(0)},
    types="T in {float}", rule=_pool_infer, semantics=averagepool_semantics,
    since=(1, 7, 10, 11, 19, 22), **_POOL_HINTS,
)


def _lppool_adapt(opset: int, attrs: dict[str, Any], n_inputs: int,
                  ) -> tuple[dict[str, Any], dict[int, Any]]:
    """LpPool-1 and GlobalLpPool-1 took ``p`` as a float; later versions as an int."""
    p = attrs.get("p")
    if isinstance(p, float):
        if p != int(p):
            raise AttributeError_(f"LpPool/GlobalLpPool: p={p} must be a whole number")
        attrs = {**attrs, "p": int(p)}
    return attrs, {}


LpPool = metaop(
    "LpPool", inputs=("X",), outputs=("Y",),
    attrs={**WINDOW_ATTRS, "kernel_shape": ints(REQUIRED), "ceil_mode": int_(0), "p": int_(2)},
    types="T in {float}", rule=_pool_infer, semantics=lppool_semantics,
    adapt=_lppool_adapt, since=(1, 2, 11, 18, 22), **_POOL_HINTS,
)


# ------------------------------------------------------------------------- global pools


def _global_infer(ctx: InferContext) -> list[Any]:
    shape = ctx.shape(0)
    if shape is not None and len(shape) < 2:
        ctx.fail(f"the input must have rank >= 2 (N, C, spatial...), got rank {len(shape)}")
    return [None if shape is None else tuple(shape[:2]) + (1,) * (len(shape) - 2)]


def _global(body: str) -> Any:
    """Semantics ``Y[n, c, o0, ...] = <body over X[n, c, h0, ...]>`` for a node's rank
    (``o_i`` are the kept axes of extent 1); ``{h}`` in ``body`` names the spatial vars."""
    def semantics(attrs: Mapping[str, Any], shapes: Sequence[Sequence[Dim] | None]) -> Any:
        nd = len(shapes[0]) - 2
        keep = "".join(f", o{i}" for i in range(nd))
        hs = ", ".join(f"h{i}" for i in range(nd))
        text = body.format(h=hs, x=f"X[n, c{''.join(f', h{i}' for i in range(nd))}]")
        return f"Y[n, c{keep}] = {text}", {"P": attrs.get("p", 2)}
    return semantics


GlobalAveragePool = metaop(
    "GlobalAveragePool", inputs=("X",), outputs=("Y",), types="T in {float}",
    rule=_global_infer, semantics=_global("mean[{h}] {x}"), since=(1, 22), **_POOL_HINTS,
)
GlobalMaxPool = metaop(
    "GlobalMaxPool", inputs=("X",), outputs=("Y",), types="T in {float}",
    rule=_global_infer, semantics=_global("max[{h}] {x}"), since=(1, 22), **_POOL_HINTS,
)
GlobalLpPool = metaop(
    "GlobalLpPool", inputs=("X",), outputs=("Y",), attrs={"p": int_(2)}, types="T in {float}",
    rule=_global_infer, semantics=_global("(sum[{h}] abs({x}) ** P) ** (1.0 / P)"),
    adapt=_lppool_adapt, since=(1, 2, 22), **_POOL_HINTS,
)

__all__ = ["AUTO_PADS", "WINDOW_ATTRS", "Window", "output_size", "window", "window_infer",
           "window_rule"]
