"""A depthwise conv between pixel-major values: its :class:`.native.PixelRows` form.

MobileNet's blocks run a pointwise conv, a depthwise conv and a pointwise conv. The pointwise
convs are plain products on pixel-major values (``md_gemm``, each pixel's channels a row), but
the depthwise conv's NCHW routine (``md_depthwise``) needed its input and output as planes, so
the values around it were transposed or the products ran on NCHW. ``md_depthwise_rows`` reads
and writes pixel rows (:mod:`metadef.codegen.native_dwrows`), so a depthwise conv runs as well
in either layout: its form costs a transpose only where its input and output differ
(:func:`metadef.backends.x86.layouts.agree` weighs that), and then makes it itself.

Example:
    >>> cost = form_cost(0, 0)
    >>> cost(frozenset()), cost(frozenset({("in", 0), ("out", 0)})), cost(frozenset({("in", 0)}))
    (0, 0, 1)
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from metadef.backends.x86.native import (
    PARALLEL_ELEMENTS,
    Arg,
    Call,
    NativeStep,
    PixelRows,
    pixel_stride,
    transpose_call,
)
from metadef.codegen.native import native_function
from metadef.codegen.native_dwrows import depthwise_rows_dims, dwrows_routine, pack_depthwise_rows, padded_channels
from metadef.codegen.native_tile import tile_lanes

Planes = tuple[tuple[int, int], tuple[int, int]]


def form_cost(x: int, out: int) -> Callable[[frozenset[tuple[str, int]]], int]:
    """The form's cost in transposes: one where input ``x`` and output ``out`` differ.

    Example:
        >>> form_cost(0, 0)(frozenset({("out", 0)}))
        1
    """
    return lambda args: int((("in", x) in args) != (("out", out) in args))


def depthwise_rows_form(base: NativeStep, weight: np.ndarray, bias: np.ndarray | None, x: Arg, bias_arg: Arg,
                        out: Arg, n: int, planes: Planes, strides: tuple[int, int], begin: tuple[int, int],
                        bounds: tuple[float, float]) -> PixelRows | None:
    """The pixel-rows form of a depthwise conv whose NCHW step is ``base`` (input ``x``, output
    ``out``, both whole step arguments; ``weight [c, 1, k, k]`` constant; ``bias``: its value
    where constant), or None where it has none: a bias read through its argument that is not a
    whole number of vectors long (the routine reads whole vectors of it).

    Example:
        >>> from metadef.backends.x86.native import NULL
        >>> base = NativeStep(())
        >>> form = depthwise_rows_form(base, np.ones((16, 1, 3, 3), np.float32), None, Arg("in", 0), NULL,
        ...                            Arg("out", 0), 1, ((7, 7), (7, 7)), (1, 1), (1, 1), (0.0, 6.0))
        >>> form.lower(frozenset()) is base, [c.what for c in form.lower(frozenset({("in", 0)})).calls]
        (True, ['depthwise 3x3 on pixel rows + bounds', 'depthwise output transpose'])
    """
    if x.kind != "in" or out.kind != "out" or x.offset or out.offset:
        return None
    c, k = weight.shape[0], weight.shape[-1]
    if bias is None and bias_arg.kind != "null" and c % tile_lanes():
        return None
    packed: list[np.ndarray] = []
    (hw, out_hw), (lo, hi) = planes, bounds
    ldx = ldy = pixel_stride(c)

    def lower(args: frozenset[tuple[str, int]]) -> NativeStep:
        reads, writes = ("in", x.index) in args, ("out", out.index) in args
        if not (reads or writes):
            return base
        if not packed:
            packed.append(pack_depthwise_rows(weight))
            padded = np.zeros(padded_channels(c), np.float32)
            if bias is not None:
                padded[:c] = np.asarray(bias, np.float32).reshape(-1)
            packed.append(padded)
        weights = Arg("addr", packed[0].ctypes.data)
        # a constant bias (or none) padded to whole vectors; one computed at run time read in place
        b = Arg("addr", packed[1].ctypes.data) if bias is not None or bias_arg.kind == "null" else bias_arg
        calls, used, source, target = [], 0, x, out
        work = Arg("scratch", 0)
        if not reads:  # (the planes as pixel rows first, in the workspace)
            calls.append(transpose_call(x, work, n, c, hw[0] * hw[1], "depthwise input transpose", ld=ldx))
            source, used = work, 4 * n * hw[0] * hw[1] * ldx
        if not writes:
            target = work.at(used)

        def dims(t: int, count: int) -> tuple[int, ...]:
            return depthwise_rows_dims(n, c, hw, out_hw, k, strides, begin, lo=lo, hi=hi, ldx=ldx, ldy=ldy, task=t,
                                       tasks=count)

        units = n * out_hw[0] * -(-c // tile_lanes())

        def tasks(count: int) -> list[tuple[int, ...]] | None:
            if count < 2 or units < count or n * c * out_hw[0] * out_hw[1] < PARALLEL_ELEMENTS:
                return None
            return [dims(t, count) for t in range(count)]

        bounded = " + bounds" if bounds != (-math.inf, math.inf) else ""
        calls.append(Call(native_function(dwrows_routine(k)), (source, weights, b, target), dims(0, 1),
                          f"depthwise {k}x{k} on pixel rows{bounded}", tasks))
        if not writes:  # (back to planes)
            p = out_hw[0] * out_hw[1]
            calls.append(transpose_call(target, out, n, p, c, "depthwise output transpose", xs=ldy))
            used += 4 * n * p * ldy
        return NativeStep(tuple(calls), (used,) if used else (), (*base.keep, *packed))

    return PixelRows((x.index,), None, out.index, lower, form_cost(x.index, out.index))


__all__ = ["depthwise_rows_form", "form_cost"]
