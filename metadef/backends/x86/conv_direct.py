"""Convolutions read in place from a padded copy of their input (``md_conv_direct``, see
:mod:`metadef.codegen.native_direct`), where that measures faster than an im2col and its
product.

An im2col writes ``kh * kw / stride**2`` times the input in columns, then the product reads
them again: for ResNet-50's 7x7 stem 12 times its input, for a stride-2 3x3 conv 2.25 times.
The direct conv reads each output pixel's taps from the padded input, a few cache lines per
input channel and kernel row, into the same register tile as the product (pixels as its
rows, a panel of output channels as its columns), with the weights packed as for
``md_conv1x1t``. It is raced, per shape, against the im2col path the conv would take
otherwise (one image, after :meth:`~metadef.backends.x86.conv1x1.WeightProduct.choice`).

Example:
    >>> DIRECT, IM2COL
    ('direct', 'im2col')
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from metadef.backends.x86 import conv1x1
from metadef.backends.x86.conv1x1 import OWN_T, WeightProduct
from metadef.backends.x86.native import (
    NULL,
    PARALLEL_ELEMENTS,
    Arg,
    Call,
    NativeStep,
    Shape,
    binding_threads,
    known_choice,
    measured_choice,
    sequence,
    timed_call,
)
from metadef.codegen.native import PAD2D_DIMS, native_function
from metadef.codegen.native_direct import direct_band, direct_dims, direct_slack
from metadef.codegen.native_gemm import gemm_panel

DIRECT = "direct"
IM2COL = "im2col"
ROUTINES = ("md_conv_direct", "md_pad2d")
"""The routines a direct conv calls."""
PARALLEL_PRODUCT = 1 << 20
"""A direct conv splits across threads from this many multiply-adds."""
PREFER: str | None = None
"""Set to ``DIRECT`` or ``IM2COL`` to take that way for every conv it can run without
measuring (tests; benchmarks that compare them). While
:data:`metadef.backends.x86.conv1x1.PREFER` forces a product kind, convs keep their im2col."""


def direct_possible(product: WeightProduct, kernel: tuple[int, ...], win: Any) -> bool:
    """Whether ``md_conv_direct`` can run this conv: 2-D, one stride for both axes, no
    dilation, and a bias the kernel can read a panel of channels at a time."""
    return (len(kernel) == 2 and len(set(win.strides)) == 1 and tuple(win.dilations) == (1, 1)
            and product.rows_possible)


def _padded(sx: Shape, kernel: tuple[int, ...], stride: int, begin: list[int], out_hw: tuple[int, int]
            ) -> tuple[int, int]:
    _, _, h, w = sx
    return (max(h + begin[0], (out_hw[0] - 1) * stride + kernel[0]),
            max(w + begin[1], (out_hw[1] - 1) * stride + kernel[1]))


def pad_call(x: Arg, out: Arg, planes: int, hw: tuple[int, int], begin: Sequence[int],
             padded_hw: tuple[int, int], what: str, split: bool = True) -> Call:
    """``md_pad2d`` of ``planes`` planes of ``hw`` into ``padded_hw`` ones (``begin``: the pads
    before each axis), split over the planes across threads where ``split`` and it pays.

    Example:
        >>> pad_call(Arg("in", 0), Arg("scratch", 0), 3, (4, 4), (1, 1), (6, 6), "pad").dims[:3]
        (3, 4, 4)
    """
    values = {"planes": planes, "h": hw[0], "w": hw[1], "pt": begin[0], "pl": begin[1], "hp": padded_hw[0],
              "wp": padded_hw[1], "task": 0, "tasks": 1}

    def tasks(count: int) -> list[tuple[int, ...]] | None:
        if count < 2 or planes < count or planes * padded_hw[0] * padded_hw[1] < PARALLEL_ELEMENTS:
            return None
        return [tuple({**values, "task": t, "tasks": count}[d] for d in PAD2D_DIMS) for t in range(count)]

    return Call(native_function("md_pad2d"), (x, out), tuple(values[d] for d in PAD2D_DIMS), what,
                tasks if split else None)


def direct_step(product: WeightProduct, sx: Shape, kernel: tuple[int, ...], win: Any, begin: list[int],
                out_hw: tuple[int, int], x: Arg, residual: Arg | None, out: Arg, im2col_kind: str,
                im2col_call: Callable[[np.ndarray, np.ndarray], Callable[[], None]]) -> NativeStep | None:
    """The conv as a padded copy of its input and ``md_conv_direct`` when that measures faster
    on one image than its im2col (``im2col_call(x, columns)``: one image's) then the product of
    ``im2col_kind``; else None."""
    if not direct_possible(product, kernel, win) or PREFER == IM2COL or (conv1x1.PREFER is not None and PREFER is None):
        return None
    n, c, h, w = sx
    stride = int(win.strides[0])
    hp, wp = _padded(sx, kernel, stride, begin, out_hw)
    cout, (lo, hi) = product.cout, product.bounds
    dims = {"residual": product.residual, "lo": lo, "hi": hi}
    shape = (c, h, w, *kernel, stride, *begin, *out_hw)
    key = ("direct conv", *shape, cout, product.residual, lo, hi, im2col_kind)
    names = (DIRECT, IM2COL)
    choice = PREFER or known_choice(key, names)
    if choice is None:
        choice = measured_choice(key, _timers(product, sx, kernel, stride, begin, out_hw, (hp, wp), im2col_kind,
                                              im2col_call))[0]
    if choice != DIRECT:
        return None
    packed, zeros = product.packed(OWN_T)
    bias = product.bias_arg if product.bias_arg is not NULL and cout % gemm_panel() == 0 \
        else Arg("addr", zeros.ctypes.data)
    units = n * -(-cout // gemm_panel()) * -(-out_hw[0] // direct_band(c, wp, kernel[0], stride, out_hw[0]))

    def tasks(count: int) -> list[tuple[int, ...]] | None:
        if count < 2 or units < count or n * cout * product.depth * out_hw[0] * out_hw[1] < PARALLEL_PRODUCT:
            return None
        return [direct_dims(n, c, cout, (hp, wp), out_hw, kernel[:2], stride, **dims, task=t, tasks=count)
                for t in range(count)]

    epilogue = " + epilogue" if residual is not None or product.bounds != (-np.inf, np.inf) else ""
    weights, res = Arg("addr", packed.ctypes.data), residual if residual is not None else NULL
    threads = max(1, binding_threads())
    if n > 1 and n >= threads:  # each image padded, then convolved, on one thread; images side by side
        one = 4 * (c * hp * wp + direct_slack(stride))
        calls = []
        for i in range(n):
            j, at = i % threads, 4 * i * cout * out_hw[0] * out_hw[1]
            buffer = Arg("scratch", 0).at(j * one)
            calls.append(sequence([
                pad_call(x.at(4 * i * c * h * w), buffer, c, (h, w), begin, (hp, wp), "conv2d pad", split=False),
                Call(native_function("md_conv_direct"), (buffer, weights, bias, res.at(at), out.at(at)),
                     direct_dims(1, c, cout, (hp, wp), out_hw, kernel[:2], stride, **dims),
                     "conv2d direct own kernel" + epilogue)], joins=j > 0))
        return NativeStep(tuple(calls), (threads * one,), product.keep())
    padded = Arg("scratch", 0)
    calls = [pad_call(x, padded, n * c, (h, w), begin, (hp, wp), "conv2d pad"),
             Call(native_function("md_conv_direct"), (padded, weights, bias, res, out),
                  direct_dims(n, c, cout, (hp, wp), out_hw, kernel[:2], stride, **dims),
                  "conv2d direct own kernel" + epilogue, tasks)]
    return NativeStep(tuple(calls), (4 * (n * c * hp * wp + direct_slack(stride)),), product.keep())


def _timers(product: WeightProduct, sx: Shape, kernel: tuple[int, ...], stride: int, begin: list[int],
            out_hw: tuple[int, int], padded: tuple[int, int], im2col_kind: str,
            im2col_call: Callable[[np.ndarray, np.ndarray], Callable[[], None]]) -> dict[str, Callable[[], Any]]:
    """One image each way, on arrays of ones (the race's arrays kept by the closures)."""
    _, c, h, w = sx
    (hp, wp), pixels, cout = padded, out_hw[0] * out_hw[1], product.cout
    lo, hi = product.bounds
    x = np.ones((c, h, w), np.float32)
    xp = np.ones(c * hp * wp + direct_slack(stride), np.float32)
    panel = gemm_panel()
    weights = np.ones((-(-cout // panel), product.depth, panel), np.float32)
    bias = np.ones(weights.shape[0] * panel, np.float32)
    y = np.ones((cout, pixels), np.float32)
    res = np.ones((cout, pixels), np.float32)
    pad = timed_call(native_function("md_pad2d"), [x.ctypes.data, xp.ctypes.data],
                     (c, h, w, begin[0], begin[1], hp, wp, 0, 1))
    direct = timed_call(native_function("md_conv_direct"), [
        xp.ctypes.data, weights.ctypes.data, bias.ctypes.data, res.ctypes.data if product.residual else 0,
        y.ctypes.data], direct_dims(1, c, cout, (hp, wp), out_hw, kernel[:2], stride, residual=product.residual,
                                    lo=lo, hi=hi))
    columns = np.ones((product.depth, pixels), np.float32)
    im2col = im2col_call(x, columns)
    products, arrays = product.timers(pixels, kinds=(im2col_kind,))
    product_run = products[im2col_kind]
    keep = (x, xp, weights, bias, y, res, columns, arrays)
    return {DIRECT: lambda: (pad(), direct(), keep),
            IM2COL: lambda: (im2col(), product_run(), keep)}


__all__ = ["DIRECT", "IM2COL", "ROUTINES", "direct_possible", "direct_step", "pad_call"]
