"""A depthwise convolution on pixel-major values: ``md_depthwise_rows`` (see :mod:`.native`).

A pixel-major value (:class:`metadef.backends.x86.native.PixelRows`) holds each pixel's ``c``
channels in one row, ``ld`` floats from the next pixel's (``[n, h*w, ld]``): the layout the
pointwise convs around a depthwise conv (MobileNet's blocks) compute in as plain products, with
no transposes. ``md_depthwise_rows`` reads and writes that layout, for each image, output pixel
``(oy, ox)`` and channel ``ch``::

    y[i, oy*ow + ox, ch] = clip(bias[ch] + sum_{r,s} w[r*k + s, ch] * x[i, iy*w + ix, ch], lo, hi)
    with iy = oy*sh - pt + r, ix = ox*sw - pl + s (taps outside the image read zeros)

vectorized along the channels (:func:`.native_tile.tile_lanes` of them a vector), which every
tap shares. A unit is an output row's run of channels of one image: its outputs whose windows
lie inside the row go in blocks of :func:`pixels_per_block` kept in registers (then 4, 2 and
1 for the last few), each tap loading one vector of weights (``[k*k, cpad]``, packed by
:func:`pack_depthwise_rows`) for the block; at stride 1 the block's input vectors move down
one a tap (``count + k - 1`` loads a row of taps, not ``count * k``). The outputs near the
left and right edges go one by one over the window's columns inside the row, and the window's
rows outside the image are skipped: no test per tap. ``md_depthwise_rows3`` has the taps of a
3x3 window written out. A last run of fewer channels than a vector goes one output at a time
through masked loads and stores, so no row is read or written past its ``c`` channels (the
blocks' code again for it doubled LLVM's time: 319 against 159 ms). Task ``task`` of ``tasks``
takes its share of the units.

One core (Zen 4, AVX-512; ``md_depthwise_rows3`` against the NCHW routine on the same values,
Relu6, best of 5 x 300 calls): MobileNetV2's 14x14 and 7x7 planes 0.80-1.41x its time (384
channels at 14x14: 25.9 against 24.0 us; 960 at 7x7: 18.4 against 17.8), 56x56 1.17x,
112x112 at stride 2 1.31x; with AVX2 0.83-1.45x.

Example:
    >>> import ctypes, numpy as np
    >>> from metadef.codegen.native import ENTRY, native_function
    >>> x = np.ones((1, 9, 3), np.float32)  # one 3x3 image, 3 channels, pixel-major
    >>> w = pack_depthwise_rows(np.ones((3, 1, 3, 3), np.float32)); b = np.zeros(w.shape[1], np.float32)
    >>> y = np.empty((1, 9, 3), np.float32)
    >>> args = (ctypes.c_void_p * 4)(x.ctypes.data, w.ctypes.data, b.ctypes.data, y.ctypes.data)
    >>> dims = depthwise_rows_dims(1, 3, (3, 3), (3, 3), 3, (1, 1), (1, 1))
    >>> ENTRY(native_function("md_depthwise_rows"))(args, (ctypes.c_int64 * len(dims))(*dims))
    >>> y[0, :, 0].reshape(3, 3).tolist()
    [[4.0, 6.0, 4.0], [6.0, 9.0, 6.0], [4.0, 6.0, 4.0]]
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable

import numpy as np
from llvmlite import ir

from metadef.codegen.native_ir import (
    F32,
    I64,
    PTR,
    _arg,
    _bounded,
    _carried,
    _define,
    _elem,
    _float_bits,
    _loop,
    _merged,
    _share,
    _smax,
    _smin,
    _splat,
)
from metadef.codegen.native_tile import tile_lanes

DWROWS_DIMS = ("n", "c", "h", "w", "oh", "ow", "k", "sh", "sw", "pt", "pl", "ldx", "ldy", "cpad", "lo", "hi", "task",
               "tasks")
"""The dims of ``md_depthwise_rows``: args are ``[x [n, h*w, ldx], w [k*k, cpad], bias [cpad], y
[n, oh*ow, ldy]]`` (the weights and bias zero-padded to ``cpad``, a multiple of the vector);
``lo``, ``hi``: the bounds as float32 bits."""

DWROWS_ROUTINES = ("md_depthwise_rows", "md_depthwise_rows3")
"""The routine for any window, and the one for 3x3 windows (its taps written out)."""


def dwrows_routine(k: int) -> str:
    """The routine for a ``k x k`` window.

    Example:
        >>> dwrows_routine(3), dwrows_routine(5)
        ('md_depthwise_rows3', 'md_depthwise_rows')
    """
    return f"md_depthwise_rows{k}" if f"md_depthwise_rows{k}" in DWROWS_ROUTINES else "md_depthwise_rows"


def pixels_per_block() -> int:
    """Output pixels a block keeps in registers, each tap's weights loaded once for them: 8
    with AVX-512's 32 registers, 6 with AVX2's 16 (at stride 1 a block also holds its window's
    input vectors: 2 x 6 + 1 registers).

    Example:
        >>> pixels_per_block() in (6, 8)
        True
    """
    return 8 if tile_lanes() == 16 else 6


def pack_depthwise_rows(w: np.ndarray) -> np.ndarray:
    """A depthwise conv's weights ``[c, 1, k, k]`` as ``md_depthwise_rows`` reads them: ``[k*k,
    cpad]``, tap by tap, the channels zero-padded to a multiple of the vector, 64-byte aligned.

    Example:
        >>> pack_depthwise_rows(np.arange(18, dtype=np.float32).reshape(2, 1, 3, 3))[:2, :2].tolist()
        [[0.0, 9.0], [1.0, 10.0]]
    """
    from metadef.codegen.native_gemm import aligned_empty

    c, k = w.shape[0], w.shape[-1]
    cpad = padded_channels(c)
    out = aligned_empty((k * k, cpad))
    out[:, c:] = 0
    out[:, :c] = np.asarray(w, np.float32).reshape(c, k * k).T
    return out


def padded_channels(c: int) -> int:
    """``c`` rounded up to a whole vector (the packed weights' and bias's length).

    Example:
        >>> padded_channels(1) == tile_lanes()
        True
    """
    lanes = tile_lanes()
    return -(-c // lanes) * lanes


def _bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def depthwise_rows_dims(n: int, c: int, hw: tuple[int, int], out_hw: tuple[int, int], k: int,
                        strides: tuple[int, int], begin: tuple[int, int], *, lo: float = -math.inf,
                        hi: float = math.inf, ldx: int | None = None, ldy: int | None = None, task: int = 0,
                        tasks: int = 1) -> tuple[int, ...]:
    """The dims of one ``md_depthwise_rows`` call (see :data:`DWROWS_DIMS`; ``begin``: the
    padding before each axis; ``ldx``, ``ldy`` default to ``c``).

    Example:
        >>> depthwise_rows_dims(1, 96, (14, 14), (7, 7), 3, (2, 2), (0, 0))[:8]
        (1, 96, 14, 14, 7, 7, 3, 2)
    """
    values = {"n": n, "c": c, "h": hw[0], "w": hw[1], "oh": out_hw[0], "ow": out_hw[1], "k": k, "sh": strides[0],
              "sw": strides[1], "pt": begin[0], "pl": begin[1], "ldx": c if ldx is None else ldx,
              "ldy": c if ldy is None else ldy, "cpad": padded_channels(c), "lo": _bits(lo), "hi": _bits(hi),
              "task": task, "tasks": tasks}
    return tuple(values[d] for d in DWROWS_DIMS)


def _unrolled(b: ir.IRBuilder, start: ir.Value, stop: ir.Value, init: list[ir.Value],
              body: Callable[[ir.Value, list[ir.Value]], list[ir.Value]], trips: int | None) -> list[ir.Value]:
    """:func:`_carried`, or with ``trips`` (``stop``'s most) known here: written out, each step
    ``j`` taken where ``start <= j < stop`` (no test where those are the constants 0 and
    ``trips``)."""
    if trips is None:
        return _carried(b, start, stop, init, body)
    values = init
    whole = isinstance(start, ir.Constant) and start.constant == 0 and isinstance(stop, ir.Constant) \
        and stop.constant == trips
    for j in range(trips):
        if whole:
            values = body(I64(j), values)
            continue
        pre = b.block
        taken = b.and_(b.icmp_signed("<=", start, I64(j)), b.icmp_signed(">", stop, I64(j)))
        step, done = b.append_basic_block("step"), b.append_basic_block("step_done")
        b.cbranch(taken, step, done)
        b.position_at_end(step)
        new = body(I64(j), values)
        end = b.block
        b.branch(done)
        b.position_at_end(done)
        values = _merged(b, values, pre, new, end)
    return values


def _depthwise_rows(module: ir.Module, window: int | None = None) -> None:
    """``md_depthwise_rows`` (any ``k``), or with ``window`` its variant for that ``k`` alone,
    the taps written out (``md_depthwise_rows3``: the three-trip loops' branches cost 1.4-1.5x
    on MobileNetV2's 14x14 and 7x7 planes)."""
    lanes = tile_lanes()
    vector = ir.VectorType(F32, lanes)
    mask_type = ir.VectorType(ir.IntType(1), lanes)
    suffix = f"v{lanes}f32.p0"
    masked_load = module.globals.get(f"llvm.masked.load.{suffix}") or ir.Function(
        module, ir.FunctionType(vector, [PTR, ir.IntType(32), mask_type, vector]), f"llvm.masked.load.{suffix}")
    masked_store = module.globals.get(f"llvm.masked.store.{suffix}") or ir.Function(
        module, ir.FunctionType(ir.VoidType(), [vector, PTR, ir.IntType(32), mask_type]), f"llvm.masked.store.{suffix}")
    fma = module.globals.get(f"llvm.fma.v{lanes}f32") or ir.Function(
        module, ir.FunctionType(vector, [vector] * 3), f"llvm.fma.v{lanes}f32")
    b, args, dims = _define(module, "md_depthwise_rows" if window is None else f"md_depthwise_rows{window}")
    x, w, bias, y = (_arg(b, args, i, PTR) for i in range(4))
    d = {name: _arg(b, dims, i, I64) for i, name in enumerate(DWROWS_DIMS)}
    c, h, wd, oh, ow, k = d["c"], d["h"], d["w"], d["oh"], d["ow"], d["k"] if window is None else I64(window)
    sh, sw, pt, pl, ldx, ldy, cpad = d["sh"], d["sw"], d["pt"], d["pl"], d["ldx"], d["ldy"], d["cpad"]
    lo, hi = _splat(b, _float_bits(b, d["lo"]), lanes), _splat(b, _float_bits(b, d["hi"]), lanes)
    zero = ir.Constant(vector, [0.0] * lanes)
    runs = b.sdiv(cpad, I64(lanes))
    first, last = _share(b, b.mul(b.mul(d["n"], oh), runs), d)
    lane_ids = ir.Constant(ir.VectorType(I64, lanes), list(range(lanes)))
    size = pixels_per_block()
    opaque = ir.InlineAsm(ir.FunctionType(I64, [I64]), "", "=r,0")
    # the output pixels whose taps all fall inside a row: [inner_lo, inner_hi)
    inner_lo = _smin(b, ow, b.sdiv(b.add(pl, b.sub(sw, I64(1))), sw))
    room = b.sub(b.add(wd, pl), k)  # (the last tap column's start, at most this)
    inner_hi = b.select(b.icmp_signed("<", room, I64(0)), inner_lo,
                        _smax(b, inner_lo, _smin(b, ow, b.add(b.sdiv(room, sw), I64(1)))))

    def unit(u: ir.Value) -> None:
        row, run = b.sdiv(u, runs), b.srem(u, runs)
        image, oy = b.sdiv(row, oh), b.srem(row, oh)
        c0 = b.mul(run, I64(lanes))
        mask = b.icmp_signed("<", lane_ids, _splat(b, b.sub(c, c0), lanes))
        xi = _elem(b, x, b.add(b.mul(b.mul(image, b.mul(h, wd)), ldx), c0))
        yi = _elem(b, y, b.add(b.mul(b.add(b.mul(image, oh), oy), b.mul(ow, ldy)), c0))
        beta = b.load(_elem(b, bias, c0), typ=vector, align=4)
        iy0 = b.sub(b.mul(oy, sh), pt)
        r_lo, r_hi = _smax(b, I64(0), b.sub(I64(0), iy0)), _smin(b, k, b.sub(h, iy0))

        def pixels(ox0: ir.Value, count: int, masked: bool, clamped: bool) -> None:
            """Outputs ``ox0 .. ox0 + count`` of the row: every tap of the window (the taps of
            one output, ``clamped``: only those inside the row)."""
            ix0 = b.sub(b.mul(ox0, sw), pl)
            s_lo = _smax(b, I64(0), b.sub(I64(0), ix0)) if clamped else I64(0)
            s_hi = _smin(b, k, b.sub(wd, ix0)) if clamped else k
            # the pixel stride hidden from LLVM's loop analysis for this block: else each of the
            # block's (pixel, tap) addresses becomes an induction variable of the loop over
            # blocks, 40-odd of them spilled and stepped in memory every block (2x the time)
            pitch = b.call(opaque, [ldx])
            offsets = [b.mul(I64(p), b.mul(sw, pitch)) for p in range(count)]

            def load(at: ir.Value) -> ir.Value:
                if masked:
                    return b.call(masked_load, [at, ir.IntType(32)(4), mask, zero])
                return b.load(at, typ=vector, align=4)

            def tap_row(r: ir.Value, acc: list[ir.Value]) -> list[ir.Value]:
                line = _elem(b, xi, b.mul(b.add(b.mul(b.add(iy0, r), wd), ix0), pitch))
                taps = _elem(b, w, b.add(b.mul(b.mul(r, k), cpad), c0))

                def tap(s: ir.Value, acc: list[ir.Value]) -> list[ir.Value]:
                    wv = b.load(_elem(b, taps, b.mul(s, cpad)), typ=vector, align=4)
                    at = _elem(b, line, b.mul(s, pitch))
                    return [b.call(fma, [load(_elem(b, at, offsets[p])), wv, acc[p]]) for p in range(count)]

                if clamped or count == 1:
                    return _unrolled(b, s_lo, s_hi, acc, tap, window)
                # stride 1: output p's tap s reads the input of output p + 1's tap s - 1, so the
                # window's vectors move down one a tap, one new vector loaded (count + k - 1
                # loads a row of taps, not count * k)
                with b.if_else(b.icmp_signed("==", sw, I64(1))) as (unit_stride, strided):
                    with unit_stride:
                        first = [load(_elem(b, line, offsets[p])) for p in range(count)]

                        def shift(s: ir.Value, state: list[ir.Value]) -> list[ir.Value]:
                            sums, window = state[:count], state[count:]
                            wv = b.load(_elem(b, taps, b.mul(s, cpad)), typ=vector, align=4)
                            sums = [b.call(fma, [window[p], wv, sums[p]]) for p in range(count)]
                            new = load(_elem(b, line, b.mul(b.add(s, I64(count)), pitch)))
                            return [*sums, *window[1:], new]

                        state = _unrolled(b, I64(0), b.sub(k, I64(1)) if window is None else I64(window - 1),
                                          [*acc, *first], shift, None if window is None else window - 1)
                        wv = b.load(_elem(b, taps, b.mul(b.sub(k, I64(1)), cpad)), typ=vector, align=4)
                        moved = [b.call(fma, [state[count + p], wv, state[p]]) for p in range(count)]
                        moved_end = b.block
                    with strided:
                        spread = _unrolled(b, I64(0), k, acc, tap, window)
                        spread_end = b.block
                return _merged(b, moved, moved_end, spread, spread_end)

            acc = _unrolled(b, r_lo, r_hi, [beta] * count, tap_row, window)
            for p in range(count):
                at = _elem(b, yi, b.mul(b.add(ox0, I64(p)), ldy))
                value = _bounded(b, acc[p], lo, hi)
                if masked:
                    b.call(masked_store, [value, at, ir.IntType(32)(4), mask])
                else:
                    b.store(value, at, align=4)

        def whole_row(masked: bool) -> None:
            _loop(b, I64(0), inner_lo, lambda ox: pixels(ox, 1, masked, True))
            inner = b.sdiv(b.sub(inner_hi, inner_lo), I64(size))
            _loop(b, I64(0), inner, lambda i: pixels(b.add(inner_lo, b.mul(i, I64(size))), size, masked, False))
            at = b.add(inner_lo, b.mul(inner, I64(size)))
            left = b.sub(inner_hi, at)
            for count in (4, 2, 1):  # (the run's last few outputs, fewer than a block: each size at most once)
                fits = b.icmp_signed(">=", left, I64(count))
                with b.if_then(fits):
                    pixels(at, count, masked, False)
                taken = b.select(fits, I64(count), I64(0))
                at, left = b.add(at, taken), b.sub(left, taken)
            _loop(b, inner_hi, ow, lambda ox: pixels(ox, 1, masked, True))

        with b.if_else(b.icmp_signed("<=", b.add(c0, I64(lanes)), c)) as (full, part):
            with full:
                whole_row(False)
            with part:  # (a run short of a vector: one output at a time, its taps inside; half the code)
                _loop(b, I64(0), ow, lambda ox: pixels(ox, 1, True, True))

    _loop(b, first, last, unit)
    b.ret_void()


__all__ = ["DWROWS_DIMS", "DWROWS_ROUTINES", "depthwise_rows_dims", "dwrows_routine", "pack_depthwise_rows",
           "padded_channels", "pixels_per_block"]
