"""A pointwise conv's step, and the pixel-rows form it offers the layout pass.

A pointwise conv runs on NCHW values as the fastest of :class:`.conv1x1.WeightProduct`'s ways
(OpenBLAS, ``md_conv1x1``, or a transpose and ``md_conv1x1t``). On pixel-major values
(:class:`.native.PixelRows`) it is one product, ``md_gemm`` with the pixels as its rows: no
transpose, no column-by-column stores. Where the winner on NCHW is the transposing kernel, the
form costs what it always did (a transpose for an input that is not pixel-major). Where
another way won, the form is offered only if the product on pixel rows outruns that winner by
:data:`PIXEL_ROWS_MARGIN` (measured once per shape, :func:`rows_pay`), and it counts NCHW as
one transpose's cost: the layout pass then keeps the values around such convs pixel-major
where its neighbours can read and write them so (MobileNetV2's 14x14 blocks, whose depthwise
convs run on pixel rows too: :mod:`.depthwise_rows`).

Example:
    >>> cost = rows_cost(0, 0, None)
    >>> cost(frozenset()), cost(frozenset({("in", 0), ("out", 0)})), cost(frozenset({("out", 0)}))
    (1, 0, 1)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from metadef.backends.x86.conv1x1 import BLAS, OWN_T, PRODUCT_ROUTINES, WeightProduct
from metadef.backends.x86.native import (
    Arg,
    Lowering,
    NativeStep,
    PixelRows,
    Shape,
    known_choice,
    measured_choice,
    needing,
    needs,
    pixel_stride,
    timed_call,
)
from metadef.codegen.native import native_function
from metadef.codegen.native_gemm import gemm_dims, gemm_panel

PIXEL_ROWS_MARGIN = 1.1
"""How much faster (time ratio) the product on pixel rows must measure than a pointwise conv's
winner on NCHW before the conv offers it: a depthwise conv between two such convs runs up to
1.4x slower on pixel rows (:mod:`metadef.codegen.native_dwrows`)."""

ENABLED = True
"""False: pointwise convs whose winner on NCHW is not ``md_conv1x1t`` offer no pixel-rows form
(benchmarks that compare the two in one process)."""

PIXEL_ROWS = "product on pixel rows"


def rows_cost(x: int, out: int, residual: int | None) -> Callable[[frozenset[tuple[str, int]]], int]:
    """The cost, in transposes, of a pointwise conv whose product on pixel rows outruns its
    winner on NCHW: nothing with its input and output pixel-major, one transpose's worth
    otherwise (a slower kernel, or a transpose), and one more for a residual in the other
    layout than the output.

    Example:
        >>> rows_cost(0, 0, 1)(frozenset({("in", 0), ("out", 0)}))  # (the residual, input 1, NCHW)
        1
    """
    def cost(args: frozenset[tuple[str, int]]) -> int:
        rows = ("in", x) in args and ("out", out) in args
        mismatch = residual is not None and (("in", residual) in args) != (("out", out) in args)
        return int(not rows) + int(mismatch)
    return cost


def rows_pay(product: WeightProduct, kind: str, p: int) -> bool:
    """Whether ``md_gemm`` on pixel rows (an image of ``p`` pixels, input and output
    pixel-major, the residual too) beats ``kind``, the winner on NCHW, by
    :data:`PIXEL_ROWS_MARGIN`: measured once per shape and remembered like the other choices.

    Example:
        >>> from metadef.backends.x86.native import NULL
        >>> w = np.ones((32, 16, 1, 1), np.float32)
        >>> rows_pay(WeightProduct(w, None, NULL, False, (0.0, 6.0)), BLAS, 49) in (True, False)
        True
    """
    cout, depth, (lo, hi) = product.cout, product.depth, product.bounds
    key = ("pixel rows pay", depth, cout, p, product.residual, lo, hi, kind, PIXEL_ROWS_MARGIN)
    names = (PIXEL_ROWS, kind)
    known = known_choice(key, names)
    if known is not None:
        return known == PIXEL_ROWS
    ldx, ldy = pixel_stride(depth), pixel_stride(cout)
    x, y, res = np.ones((p, ldx), np.float32), np.ones((p, ldy), np.float32), np.ones((p, ldy), np.float32)
    panel = gemm_panel()
    panels = np.ones((-(-cout // panel), depth, panel), np.float32)
    bias = np.ones(panels.shape[0] * panel, np.float32)
    pointers = [x.ctypes.data, panels.ctypes.data, bias.ctypes.data, y.ctypes.data,
                *([res.ctypes.data] if product.residual else [])]
    rows = timed_call(native_function("md_gemm"), pointers,
                      gemm_dims(p, cout, depth, lo=lo, hi=hi, lda=ldx, residual=product.residual, ldy=ldy))
    theirs, _arrays = product.timers(p, (), [kind])
    won = measured_choice(key, {PIXEL_ROWS: rows, kind: theirs[kind]}, {PIXEL_ROWS: PIXEL_ROWS_MARGIN})[0]
    return won == PIXEL_ROWS


def conv1x1_step(product: WeightProduct, x: Arg, residual: Arg | None, out: Arg, sx: Shape,
                 fallback: Callable[[], NativeStep | str] | None = None) -> NativeStep | None:
    """The step of a pointwise conv of input shape ``sx`` through our kernels, with its
    pixel-rows form where it has one (see the module doc); where OpenBLAS measures faster,
    ``fallback()``'s step with that form, else None.

    Example:
        >>> from metadef.backends.x86.native import NULL
        >>> product = WeightProduct(np.ones((32, 16, 1, 1), np.float32), None, NULL, False, (0.0, 6.0))
        >>> step = conv1x1_step(product, Arg("in", 0), None, Arg("out", 0), (1, 16, 7, 7), lambda: NativeStep(()))
        >>> step is None or step.rows is None or step.rows.writes == 0
        True
    """
    n, cin, h, w = sx
    if product.depth != cin or h * w == 0:
        return None
    kind = product.choice(h * w)

    def step(pixel_major: frozenset[tuple[str, int]] = frozenset(), way: str = kind) -> NativeStep:
        named = {"x": x, "residual": residual, "out": out}
        rows = [name for name, arg in named.items() if arg is not None and (arg.kind, arg.index) in pixel_major]
        calls, work = product.calls(way, n, h * w, x, residual, out, Arg("scratch", 0), "conv2d 1x1", rows=rows)
        return NativeStep(tuple(calls), (work,) if work else (), product.keep(), rows=form)

    plain = x.kind == "in" and out.kind == "out" and not x.offset and not out.offset \
        and (residual is None or (residual.kind == "in" and not residual.offset))
    res_index = None if residual is None else residual.index
    form = None
    if kind == OWN_T:
        if plain:
            form = PixelRows((x.index,), res_index, out.index, step)
        return step()
    base = step() if kind != BLAS else fallback() if fallback is not None else None
    if not isinstance(base, NativeStep):
        return None
    if not (ENABLED and plain and product.rows_possible and rows_pay(product, kind, h * w)):
        return base if kind != BLAS else None

    def lower(pixel_major: frozenset[tuple[str, int]]) -> NativeStep:
        return base if not pixel_major else step(pixel_major, OWN_T)

    form = PixelRows((x.index,), res_index, out.index, lower, rows_cost(x.index, out.index, res_index))
    return replace(base, rows=form)


def pointwise_lowering(attrs: Mapping[str, Any], weight: np.ndarray, x: Arg, bias: Arg, residual: Arg | None,
                       out: Arg, bounds: tuple[float, float], otherwise: Lowering,
                       bias_value: np.ndarray | None = None) -> Lowering:
    """A pointwise conv (``pointwise(...)`` holds) as our kernels' calls writing ``out`` (its
    epilogue: ``residual``, ``bounds``; ``bias_value``: the bias when constant), or
    ``otherwise`` where that does not pay.

    Example:
        >>> from metadef.backends.x86.native import NULL
        >>> lower = pointwise_lowering({}, np.ones((8, 4, 1, 1), np.float32), Arg("in", 0), NULL, None,
        ...                            Arg("out", 0), (0.0, 6.0), lambda *shapes: "otherwise")
        >>> isinstance(lower([(1, 4, 10, 10)], [(1, 8, 10, 10)], {}), (NativeStep, str))
        True
    """
    product = WeightProduct(weight, bias_value, bias, residual is not None, bounds)

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape], symbols: Mapping[str, int]
              ) -> NativeStep | str:
        sx = inputs[0]
        lowered: list[NativeStep | str] = []

        def fallback() -> NativeStep | str:  # (lowered once: conv1x1_step may have asked for it already)
            if not lowered:
                lowered.append(otherwise(inputs, outputs, symbols))
            return lowered[0]

        if sx is not None and len(sx) == 4:
            step = conv1x1_step(product, x, residual, out, sx, fallback)
            if step is not None:
                return step
        return fallback()

    return needing(lower, *needs(otherwise), *PRODUCT_ROUTINES)


__all__ = ["ENABLED", "PIXEL_ROWS", "PIXEL_ROWS_MARGIN", "conv1x1_step", "pointwise_lowering", "rows_cost", "rows_pay"]
