"""A 3x3 depthwise convolution with its padding and activation handled in place (see :mod:`.native`).

``md_depthwise`` computes, for each image and channel (a plane) its own 3x3 filter::

    y[p, oy, ox] = clip(bias[c] + sum_{r,s} w[c, r, s] * x[p, oy*sh - pt + r, ox*sw - pl + s], lo, hi)

with taps outside the image reading zeros. A plane padded by one pixel before each axis, of
stride 1 (at least 9 wide, the output its size) or 2 (at least 16 wide, halving it), is read in
place (:func:`_direct`: MobileNetV2's depthwise convs and ResNet-50's max pool), as is one of 7
outputs a row (:func:`_narrow`: 7 wide at stride 1, 14 at stride 2). Any other plane
is copied into a zero-padded plane on
the stack (tens of KiB: it stays in L1 or L2, unlike a padded copy of the whole tensor; small
planes alternate between two such copies, the next plane copied before this one is computed,
see :data:`DOUBLE_FLOATS`), then
each output row is computed from three padded lines with the nine taps unrolled and one
store, 8 outputs at a time in vectors for strides 1 and 2, the row's last few outputs in one
more vector step (ending at the row's end, or through a mask in a row shorter than 8: a 7x7
plane takes 7 vector steps, not 49 scalar outputs;
see :func:`stack_floats` for the size; the lowering keeps it small). For a horizontal stride
of 2 the padded lines are deinterleaved as they are copied (even columns, then odd), so each
tap is one contiguous load instead of two loads and a shuffle. Task
``task`` of ``tasks`` takes its share of the planes.

Example:
    >>> import ctypes, math, numpy as np
    >>> from metadef.codegen.native import ENTRY, native_function
    >>> x = np.ones((1, 1, 3, 3), np.float32); w = np.ones((1, 9), np.float32); b = np.zeros(1, np.float32)
    >>> y = np.empty((1, 1, 3, 3), np.float32)
    >>> args = (ctypes.c_void_p * 4)(x.ctypes.data, w.ctypes.data, b.ctypes.data, y.ctypes.data)
    >>> dims = depthwise_dims(1, 1, (3, 3), (3, 3), (1, 1), (1, 1))
    >>> ENTRY(native_function("md_depthwise"))(args, (ctypes.c_int64 * len(dims))(*dims))
    >>> y[0, 0].tolist()
    [[4.0, 6.0, 4.0], [6.0, 9.0, 6.0], [4.0, 6.0, 4.0]]
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import Any

from llvmlite import ir

from metadef.codegen import native_inplace
from metadef.codegen.native_inplace import EVENS, LANES, NARROW, ODD, _direct, _has_nan, _narrow, _pool_max
from metadef.codegen.native_ir import (
    F32,
    I32,
    I64,
    PTR,
    V8,
    _arg,
    _bounded,
    _define,
    _elem,
    _float_bits,
    _if,
    _internal,
    _loop,
    _smax,
    _smin,
    _splat,
)

DEPTHWISE_DIMS = ("planes", "c", "h", "w", "oh", "ow", "sh", "sw", "pt", "pl", "lo", "hi", "task", "tasks")
"""The dims of ``md_depthwise`` (a 3x3 kernel, dilation 1; ``md_depthwise{k}``: k x k): args are
``[x, w [c, k * k], bias [c], y]``; ``lo`` and ``hi`` are float32 bits (``-inf`` / ``inf`` for no
bound)."""


def _bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def depthwise_dims(n: int, c: int, hw: tuple[int, int], out_hw: tuple[int, int], strides: tuple[int, int],
                   begin: tuple[int, int], *, lo: float = -math.inf, hi: float = math.inf, task: int = 0,
                   tasks: int = 1) -> tuple[int, ...]:
    """The dims of one ``md_depthwise`` call (see :data:`DEPTHWISE_DIMS`; ``begin``: the pads
    before each spatial axis).

    Example:
        >>> depthwise_dims(1, 32, (112, 112), (112, 112), (1, 1), (1, 1))[:6]
        (32, 32, 112, 112, 112, 112)
    """
    values = {"planes": n * c, "c": c, "h": hw[0], "w": hw[1], "oh": out_hw[0], "ow": out_hw[1],
              "sh": strides[0], "sw": strides[1], "pt": begin[0], "pl": begin[1], "lo": _bits(lo), "hi": _bits(hi),
              "task": task, "tasks": tasks}
    return tuple(values[d] for d in DEPTHWISE_DIMS)


DOUBLE_FLOATS = 8192
"""Padded planes up to this many floats (32 KiB) get a second copy on the stack: the walk
copies the next plane while it computes this one (see ``_depthwise``)."""






def _interior(module: ir.Module, stride: int | None, pool: bool = False, k: int = 3, exact: bool = True
              ) -> ir.Function:
    """``plane(y, padded, span, w, beta, lo, hi, oh, ow, sh, sw, half)``: every output row of one
    plane from the padded plane (lines ``span`` floats apart), the ``k x k`` taps loaded once and
    unrolled. Strides 1 and 2 take 8 outputs a step in vectors, a row's last few in one masked
    step; for stride 2 the lines are deinterleaved (even columns, then the odd ones from
    ``half`` on), so every tap is one contiguous load. Other strides go one output at a time.
    ``pool``: the maximum of the taps' inputs and ``beta`` instead (``w`` unread; ``beta`` is
    -inf for a pool, which changes no maximum); ``exact`` False: by ``vmaxps`` alone (for
    planes without NaN), not with a blend that passes NaN on."""
    name = f"md_{'mp' if pool else 'dw'}{'' if k == 3 else k}_plane{stride or 'n'}{'' if exact else '_fast'}"
    fn, b = _internal(module, name, [PTR, PTR, I64, PTR, F32, F32, F32, I64, I64, I64, I64, I64], (0,))
    y_plane, padded, span, w, beta, lo, hi, oh, ow, sh, sw, half = fn.args
    taps = [] if pool else [b.load(_elem(b, w, I64(t)), typ=F32) for t in range(k * k)]
    step = I64(stride) if stride else sw
    row: dict[str, Any] = {}  # the output row being built: its output and three input lines

    def one(o: ir.Value) -> None:
        base = b.mul(o, step)
        values = [b.load(_elem(b, row["lines"][r], b.add(base, I64(s))), typ=F32) for r in range(k) for s in range(k)]
        if pool:
            acc = _pool_max(b, values, exact)
        else:
            acc = beta
            for tap, v in zip(taps, values):
                acc = b.fadd(acc, b.fmul(tap, v, flags=["contract"]), flags=["contract"])
        b.store(_bounded(b, acc, lo, hi), _elem(b, row["y"], o))

    def for_each_row(body: Callable[[], None]) -> None:
        def at(oy: ir.Value) -> None:
            row["y"] = _elem(b, y_plane, b.mul(oy, ow))
            # (a vector from this row's start stays in the plane: a short row may spill into
            # the next ones, which are computed after it and write their own values)
            row["room"] = b.icmp_signed("<=", b.add(b.mul(oy, ow), I64(8)), b.mul(oh, ow))
            row["lines"] = [_elem(b, padded, b.mul(b.add(b.mul(oy, sh), I64(r)), span)) for r in range(k)]
            body()
        _loop(b, I64(0), oh, at)

    if stride is None:
        for_each_row(lambda: _loop(b, I64(0), ow, one))
        b.ret_void()
        return fn
    fma = ir.Function(module, ir.FunctionType(V8, [V8, V8, V8]), "llvm.fma.v8f32") \
        if "llvm.fma.v8f32" not in module.globals else module.globals["llvm.fma.v8f32"]
    wide = [_splat(b, t) for t in taps]
    low, high, start = _splat(b, lo), _splat(b, hi), _splat(b, beta)
    blocks = b.sdiv(ow, I64(8))
    tail = b.sub(ow, b.mul(blocks, I64(8)))
    lanes = b.icmp_signed("<", LANES, _splat(b, tail))

    def eight(block: ir.Value, masked: bool = False, at_output: ir.Value | None = None) -> None:
        o = b.mul(block, I64(8)) if at_output is None else at_output
        base = b.mul(o, step)
        values = []
        for r in range(k):
            for s in range(k):
                at = _elem(b, row["lines"][r], b.add(base, I64(s)))
                if stride == 2:  # the line is deinterleaved: column 2o + s is E[o + s // 2] or O[o + s // 2]
                    at = _elem(b, row["lines"][r], b.add(b.add(o, half) if s % 2 else o, I64(s // 2)))
                values.append(b.load(at, typ=V8, align=4))
        if pool:
            acc = _pool_max(b, values, exact)
        else:
            acc = start
            for tap, v in zip(wide, values):
                acc = b.call(fma, [tap, v, acc])
        result = _bounded(b, acc, low, high)
        if not masked:
            b.store(result, _elem(b, row["y"], o), align=4)
            return
        name = "llvm.masked.store.v8f32.p0"
        store = module.globals.get(name) or ir.Function(
            module, ir.FunctionType(ir.VoidType(), [V8, PTR, I32, ir.VectorType(ir.IntType(1), 8)]), name)
        b.call(store, [result, _elem(b, row["y"], o), I32(4), lanes])

    def full_row() -> None:
        _loop(b, I64(0), blocks, eight)
        # the last few outputs: a row of 8 or more ends with one more whole vector step, the
        # 8 outputs ending at the row's end (overlapping the last block, which it writes
        # again); a shorter row with one whole step too where it stays in the plane, else
        # (the plane's last rows) one stored through a mask, slow on AMD cores (the reads stay
        # in the padded plane, whose lines and end have a vector's reach of slack)
        with b.if_then(b.icmp_signed(">", tail, I64(0))), \
                b.if_else(b.icmp_signed(">=", ow, I64(8))) as (wide_row, short_row):
            with wide_row:
                eight(blocks, at_output=b.sub(ow, I64(8)))
            with short_row, b.if_else(row["room"]) as (room, last_rows):
                with room:
                    eight(blocks)
                with last_rows:
                    eight(blocks, True)

    if ROW_GROUP.get(k, 1) == 1:
        for_each_row(full_row)
        b.ret_void()
        return fn
    group = ROW_GROUP[k]
    with b.if_else(b.and_(b.and_(b.icmp_signed("==", sh, I64(stride)), b.icmp_signed(">=", ow, I64(8))),
                          b.icmp_signed(">=", oh, I64(group)))) as (grouped, singly):
        with grouped:
            vectors = b.sdiv(b.add(ow, I64(7)), I64(8))

            def rows_at(oy0: ir.Value) -> None:
                def pair(p: ir.Value) -> None:
                    # vectors 2p and 2p + 1 of the row, the second ending at the row's end where
                    # it would pass it and the first 8 outputs before the second (an odd count:
                    # the last pair overlaps the one before; a row of 8-15: its two overlap)
                    second = _smin(b, b.add(b.mul(p, I64(16)), I64(8)), b.sub(ow, I64(8)))
                    first = _smax(b, _smin(b, b.mul(p, I64(16)), b.sub(second, I64(8))), I64(0))
                    _rows_of_eight(b, oy0, [first, second])

                _loop(b, I64(0), b.sdiv(b.add(vectors, I64(1)), I64(2)), pair)

            def _rows_of_eight(b: ir.IRBuilder, oy0: ir.Value, starts: list[ir.Value]) -> None:
                # ``group`` output rows of ``len(starts)`` vectors at once: each input line loaded
                # once for every row it feeds, each tap for every vector, one accumulator each
                # (a 7x7 window's 49 taps on one accumulator waited on the FMA's latency: 1.5-1.9x
                # ONNX Runtime's time)
                # (a pool is separable: each line's maximum over the window's width first, then
                # each output row's over its lines: 2 (k - 1) maxima an output, not k * k)
                accs = [[start] * group for _ in starts]
                lines: list[list[list[ir.Value]]] = [[[] for _ in range(group)] for _ in starts]
                for line in range((group - 1) * stride + k):
                    first = _elem(b, padded, b.mul(b.add(b.mul(oy0, I64(stride)), I64(line)), span))
                    uses = [(i, line - i * stride) for i in range(group) if 0 <= line - i * stride < k]
                    for col, o in enumerate(starts):
                        across = []
                        for s in range(k):
                            at = b.add(b.add(o, half) if s % 2 else o, I64(s // 2)) if stride == 2 else \
                                b.add(o, I64(s))
                            v = b.load(_elem(b, first, at), typ=V8, align=4)
                            if pool:
                                across.append(v)
                                continue
                            for i, r in uses:
                                accs[col][i] = b.call(fma, [wide[k * r + s], v, accs[col][i]])
                        if pool and uses:  # (the line's maximum across the window, for each row it feeds)
                            widest = _pool_max(b, across, exact)
                            for i, _ in uses:
                                lines[col][i].append(widest)
                if pool:  # (beta is -inf: each output row's maximum over its lines' maxima)
                    accs = [[_pool_max(b, maxima, exact) for maxima in column] for column in lines]
                for o, column in zip(starts, accs):
                    for i, acc in enumerate(column):
                        out = _elem(b, y_plane, b.add(b.mul(b.add(oy0, I64(i)), ow), o))
                        b.store(_bounded(b, acc, low, high), out, align=4)

            _loop(b, I64(0), b.sdiv(oh, I64(group)), lambda g: rows_at(b.mul(g, I64(group))))
            # the last few rows: one more group ending at the plane's last row (it computes
            # again rows the last group wrote)
            _if(b, b.icmp_signed("!=", b.srem(oh, I64(group)), I64(0)), lambda: rows_at(b.sub(oh, I64(group))))
        with singly:
            for_each_row(full_row)
    b.ret_void()
    return fn


ROW_GROUP = {5: 4, 7: 4}
"""Output rows a step of the vector walks computes by window side (3x3: one row of one vector; the
larger windows: 4 rows of two vectors, 8 accumulators). One core, ms for 8 images against
single rows: 7x7 over 96 planes of 56x56 9.3 -> 4.3 (4 rows of one vector: 6.1, 6 rows: 5.0,
6 rows of two: 4.7, 3 rows of two: 4.4); 5x5 over 240 planes of 28x28 2.0-2.6 (4 rows of one)
-> 1.3-1.7."""


def _by_stride(b: ir.IRBuilder, sw: ir.Value, rows: dict[int | None, ir.Function], call: list[ir.Value]) -> None:
    """Call the row loop made for stride ``sw`` (the generic one for strides other than 1, 2)."""
    after = b.append_basic_block("done")
    cases = {s: b.append_basic_block(f"stride{s or 'n'}") for s in rows}
    switch = b.switch(sw, cases[None])
    for s, block in cases.items():
        if s is not None:
            switch.add_case(I64(s), block)
        b.position_at_end(block)
        b.call(rows[s], call)
        b.branch(after)
    b.position_at_end(after)


def _deinterleave(b: ir.IRBuilder, line: ir.Value, src: ir.Value, width: ir.Value, pl: ir.Value,
                  half: ir.Value, room: ir.Value, fill: ir.Value) -> None:
    """Input row ``src`` into padded ``line`` deinterleaved: padded column ``j = c + pl`` goes
    to ``line[j // 2]`` when even, ``line[half + j // 2]`` when odd; 16 columns a step, the
    last few in one more such step where ``room`` (16 floats from there are inside the
    plane), its columns past the row replaced by ``fill`` (they land in the padding), else
    one at a time."""
    odd = b.icmp_signed("!=", b.and_(pl, I64(1)), I64(0))

    def sixteen(k: ir.Value, rest: ir.Value | None = None) -> None:
        c0 = b.mul(k, I64(16))
        v = [b.load(_elem(b, src, b.add(c0, I64(i))), typ=V8, align=4) for i in (0, 8)]
        if rest is not None:  # columns c0 + i for i >= rest are past the row
            v = [b.select(b.icmp_signed("<", b.add(LANES, _splat(b, I64(i))), _splat(b, rest)), x, _splat(b, fill))
                 for i, x in zip((0, 8), v)]
        q = b.ashr(b.add(c0, pl), I64(1))
        # an odd pl moves the even input columns to odd padded ones
        to_even = b.select(odd, b.add(q, half), q)
        to_odd = b.select(odd, b.add(q, I64(1)), b.add(q, half))
        for lanes, at in ((EVENS, to_even), (ODD, to_odd)):
            b.store(b.shuffle_vector(v[0], v[1], lanes), b.bitcast(_elem(b, line, at), V8.as_pointer()), align=4)

    blocks = b.sdiv(width, I64(16))
    _loop(b, I64(0), blocks, sixteen)

    def one(c: ir.Value) -> None:
        j = b.add(c, pl)
        at = b.add(b.mul(b.and_(j, I64(1)), half), b.ashr(j, I64(1)))
        b.store(b.load(_elem(b, src, c), typ=F32), _elem(b, line, at))

    rest = b.sub(width, b.mul(blocks, I64(16)))
    with b.if_then(b.icmp_signed(">", rest, I64(0))), b.if_else(room) as (whole, singly):
        with whole:
            sixteen(blocks, rest)
        with singly:
            _loop(b, b.mul(blocks, I64(16)), width, one)


def _copy(b: ir.IRBuilder, dst: ir.Value, src: ir.Value, width: ir.Value, room: ir.Value, fill: ir.Value) -> None:
    """``width`` floats from ``src`` to ``dst``, 8 a step, inline (a call of memcpy per row
    costs more than the copy itself on small planes: 7 floats). The last few: where ``room``
    (the 8 floats from there are inside the plane), one whole load, its lanes past the row
    replaced by ``fill`` (the padding's value), and one whole store (``dst``'s line has a
    vector's reach of padding after the row); else a masked load and store, which AMD cores
    run slowly (a 7x7 plane used to take 14 of them)."""
    blocks = b.sdiv(width, I64(8))

    def eight(k: ir.Value) -> None:
        at = b.mul(k, I64(8))
        b.store(b.load(_elem(b, src, at), typ=V8, align=4), b.bitcast(_elem(b, dst, at), V8.as_pointer()), align=4)

    _loop(b, I64(0), blocks, eight)
    at = b.mul(blocks, I64(8))
    lanes = b.icmp_signed("<", LANES, _splat(b, b.sub(width, at)))
    module = b.module
    mask = ir.VectorType(ir.IntType(1), 8)
    load = module.globals.get("llvm.masked.load.v8f32.p0") or ir.Function(
        module, ir.FunctionType(V8, [PTR, I32, mask, V8]), "llvm.masked.load.v8f32.p0")
    store = module.globals.get("llvm.masked.store.v8f32.p0") or ir.Function(
        module, ir.FunctionType(ir.VoidType(), [V8, PTR, I32, mask]), "llvm.masked.store.v8f32.p0")

    def rest() -> None:
        with b.if_else(room) as (whole, masked):
            with whole:
                v = b.load(_elem(b, src, at), typ=V8, align=4)
                b.store(b.select(lanes, v, _splat(b, fill)), b.bitcast(_elem(b, dst, at), V8.as_pointer()), align=4)
            with masked:
                v = b.call(load, [_elem(b, src, at), I32(4), lanes, ir.Constant(V8, ir.Undefined)])
                b.call(store, [v, _elem(b, dst, at), I32(4), lanes])

    _if(b, b.icmp_signed("<", at, width), rest)


def in_place(hw: tuple[int, int], out_hw: tuple[int, int], strides: tuple[int, int], begin: tuple[int, int]) -> bool:
    """Whether ``md_depthwise`` / ``md_maxpool3x3`` read planes of these shapes in place (no
    padded copy): one pixel of padding before each axis and, at stride 1, the output the
    input's size (at least 9 wide), at stride 2 half of it (at least 16 wide), or the 7- and
    14-wide planes of :data:`NARROW` (at least 2 output rows). Where it holds, the routine's
    ``_inplace1`` or ``_inplace2`` variant (by the stride), without the padded walk and the
    other stride, computes the same (``md_maxpool3x3``: 490 ms of LLVM here; its variants
    ~60-100 each).

    Example:
        >>> in_place((112, 112), (56, 56), (2, 2), (1, 1)), in_place((9, 9), (9, 9), (1, 1), (0, 0))
        (True, False)
    """
    (h, w), (oh, ow) = hw, out_hw
    same = strides == (1, 1) and (oh, ow) == (h, w)
    halved = strides == (2, 2) and (2 * oh, 2 * ow) == (h, w)
    narrow = ((same and w == NARROW[1]) or (halved and w == NARROW[2])) and oh >= 2
    return begin == (1, 1) and ((same and w >= 9) or (halved and w >= 16) or narrow)


def _depthwise(module: ir.Module, pool: bool = False, only_in_place: int | None = None, k: int = 3) -> None:
    """``md_depthwise``, or with ``pool`` ``md_maxpool3x3``: the same walk over padded planes
    (padded with -inf, not zeros), each output the maximum of its window; ``w`` and ``bias``
    are not read (null). ``only_in_place``: a stride, for the variant ``..._inplace{stride}``
    that computes planes :func:`in_place` holds for at that stride, and nothing else. ``k``:
    the window's side, for :func:`depthwise_routine`'s larger ones (the padded walk only)."""
    name = maxpool_routine(k) if pool else depthwise_routine(k)
    name += f"_inplace{only_in_place}" if only_in_place else ""
    fast = None
    if pool and k != 3:
        # a wide pool's planes without NaN (all, nearly always) take maxima by vmaxps in the
        # vector walks; a plane with a NaN the exact maxima, one output at a time but at stride
        # 2 (whose padded lines are deinterleaved: 504 -> 402 ms of LLVM)
        fast = {s: _interior(module, s, pool, k, exact=False) for s in (1, 2, None)}
        exact = _interior(module, None, pool, k)
        rows = {1: exact, 2: _interior(module, 2, pool, k), None: exact}
    else:
        rows = {} if only_in_place else {s: _interior(module, s, pool, k) for s in (1, 2, None)}
    b, args, dims = _define(module, name)
    x, w, bias, y = (_arg(b, args, i, PTR) for i in range(4))
    d = {name: _arg(b, dims, i, I64) for i, name in enumerate(DEPTHWISE_DIMS)}
    lo, hi = _float_bits(b, d["lo"]), _float_bits(b, d["hi"])
    first_plane = b.sdiv(b.mul(d["planes"], d["task"]), d["tasks"])
    last_plane = b.sdiv(b.mul(d["planes"], b.add(d["task"], I64(1))), d["tasks"])
    sh, sw, pt, pl, height, width = d["sh"], d["sw"], d["pt"], d["pl"], d["h"], d["w"]
    oh, ow = d["oh"], d["ow"]
    direct_first = k == 3 and (native_inplace.DIRECT or only_in_place)
    if direct_first:
        strides = (only_in_place,) if only_in_place else (1, 2)
        directs = {st: _direct(module, st, pool) for st in strides}
        fill_value = F32(-math.inf) if pool else F32(0.0)

        def eq(a: ir.Value, v: ir.Value) -> ir.Value:
            return b.icmp_signed("==", a, v)

        same = b.and_(b.and_(eq(sh, I64(1)), eq(sw, I64(1))), b.and_(eq(oh, height), eq(ow, width)))
        halved = b.and_(b.and_(eq(sh, I64(2)), eq(sw, I64(2))),
                        b.and_(eq(b.mul(oh, I64(2)), height), eq(b.mul(ow, I64(2)), width)))
        # (stride 1: the first vector and the last, each with an edge, are two; stride 2: 16 columns from 0)
        narrow = b.and_(b.or_(b.and_(same, eq(width, I64(NARROW[1]))), b.and_(halved, eq(width, I64(NARROW[2])))),
                        b.icmp_signed(">=", oh, I64(2)))
        same = b.and_(same, b.icmp_signed(">=", width, I64(9)))
        halved = b.and_(halved, b.icmp_signed(">=", width, I64(16)))
        direct = b.and_(b.and_(eq(pt, I64(1)), eq(pl, I64(1))), b.or_(b.or_(same, halved), narrow))
        narrows = {st: _narrow(module, st, pool) for st in strides}
        done = b.append_basic_block("direct_done")
        rest = b.append_basic_block("padded")
        go = b.append_basic_block("direct")
        b.cbranch(direct, go, rest)
        b.position_at_end(go)
        line_floats = b.add(width, I64(40))
        fill_line = b.alloca(F32, size=line_floats)
        wide_fill = _splat(b, fill_value)
        _loop(b, I64(0), b.sdiv(line_floats, I64(8)),
              lambda k: b.store(wide_fill, b.bitcast(_elem(b, fill_line, b.mul(k, I64(8))), V8.as_pointer()),
                                align=4))

        def direct_plane(p: ir.Value) -> None:
            channel = b.srem(p, d["c"])
            beta = F32(-math.inf) if pool else b.load(_elem(b, bias, channel), typ=F32)
            call = [_elem(b, y, b.mul(p, b.mul(oh, ow))), _elem(b, x, b.mul(p, b.mul(height, width))), width,
                    _elem(b, w, b.mul(channel, I64(9))), beta, lo, hi, oh, ow, height, fill_line]
            thin = [call[0], call[1], call[3], beta, lo, hi, oh, height, fill_line]
            if only_in_place:
                with b.if_else(narrow) as (few, many):
                    with few:
                        b.call(narrows[only_in_place], thin)
                    with many:
                        b.call(directs[only_in_place], call)
                return
            with b.if_else(narrow) as (few, many):
                with few, b.if_else(eq(sh, I64(1))) as (one, two):
                    with one:
                        b.call(narrows[1], thin)
                    with two:
                        b.call(narrows[2], thin)
                with many, b.if_else(eq(sh, I64(1))) as (one, two):
                    with one:
                        b.call(directs[1], call)
                    with two:
                        b.call(directs[2], call)

        _loop(b, first_plane, last_plane, direct_plane)
        b.branch(done)
        b.position_at_end(rest)
        if only_in_place:  # (the lowering calls it for such planes only)
            b.branch(done)
            b.position_at_end(done)
            b.ret_void()
            return
    # one padded plane on the stack, zeros around the image: as wide and tall as every read
    # of the outputs needs (plus 8 floats: a vector's reach)
    reach = _smax(b, b.add(b.mul(b.sub(d["ow"], I64(1)), sw), I64(k)), b.add(pl, width))
    half = b.add(b.sdiv(b.add(reach, I64(1)), I64(2)), I64(8))  # (stride 2: E[0, half), O[half, span))
    span = b.mul(half, I64(2))
    tall = _smax(b, b.add(b.mul(b.sub(d["oh"], I64(1)), sh), I64(k)), b.add(pt, height))
    plane_floats = b.add(b.mul(span, tall), I64(24))
    # a small plane has two padded copies, a plane apart plus a line of 16 floats (so the
    # copies' addresses do not alias 4 KiB apart): plane p + 1 is copied before plane p is
    # computed, so the copy's stores have left the store buffer when their lines are read
    # (a 7x7 plane read right after its copy had most of its loads wait on stores they
    # straddle: 2.5 ns an output, against 0.6 on large planes)
    double = b.icmp_signed("<=", plane_floats, I64(DOUBLE_FLOATS))
    distance = b.add(plane_floats, I64(16))
    padded = b.alloca(F32, size=b.add(distance, b.select(double, plane_floats, I64(0))))
    second = _elem(b, padded, distance)
    padded_bytes = b.mul(b.add(distance, b.select(double, plane_floats, I64(0))), I64(4))
    if pool:  # -inf around the image (and in the slack), 8 floats a step
        fill = _splat(b, F32(-math.inf))
        _loop(b, I64(0), b.sdiv(padded_bytes, I64(32)),  # (the last few slack floats stay unread)
              lambda k: b.store(fill, b.bitcast(_elem(b, padded, b.mul(k, I64(8))), V8.as_pointer()), align=4))
    else:
        b.call(module.declare_intrinsic("llvm.memset", [PTR, I64]),
               [padded, ir.IntType(8)(0), padded_bytes, ir.IntType(1)(0)])

    def copy_plane(p: ir.Value, into: ir.Value) -> None:
        xp = _elem(b, x, b.mul(p, b.mul(height, width)))
        plane_size = b.mul(height, width)

        def copy(r: ir.Value) -> None:
            line, src = _elem(b, into, b.mul(b.add(r, pt), span)), _elem(b, xp, b.mul(r, width))
            # a whole vector (16 floats when deinterleaving) from the row's last block start
            # stays in the plane
            tail_at = b.add(b.mul(r, width), b.mul(b.sdiv(width, I64(8)), I64(8)))
            room = b.icmp_signed("<=", b.add(tail_at, I64(8)), plane_size)
            tail16 = b.add(b.mul(r, width), b.mul(b.sdiv(width, I64(16)), I64(16)))
            room16 = b.icmp_signed("<=", b.add(tail16, I64(16)), plane_size)
            fill = F32(-math.inf) if pool else F32(0.0)
            _if(b, b.icmp_signed("!=", sw, I64(2)), lambda: _copy(b, _elem(b, line, pl), src, width, room, fill))
            _if(b, b.icmp_signed("==", sw, I64(2)),
                lambda: _deinterleave(b, line, src, width, pl, half, room16, fill))

        _loop(b, I64(0), height, copy)

    def compute_plane(p: ir.Value, source: ir.Value) -> None:
        channel = b.srem(p, d["c"])
        yp = _elem(b, y, b.mul(p, b.mul(d["oh"], d["ow"])))
        wc = _elem(b, w, b.mul(channel, I64(k * k)))
        beta = F32(-math.inf) if pool else b.load(_elem(b, bias, channel), typ=F32)
        call = [yp, source, span, wc, beta, lo, hi, d["oh"], d["ow"], sh, sw, half]
        if fast is None:
            _by_stride(b, sw, rows, call)
            return
        with b.if_else(_has_nan(b, source, b.mul(span, tall))) as (some, none):
            with some:
                _by_stride(b, sw, rows, call)
            with none:
                _by_stride(b, sw, fast, call)

    def ahead(p: ir.Value) -> None:  # the next plane's copy, then this one's outputs
        _if(b, b.icmp_signed("<", b.add(p, I64(1)), last_plane),
            lambda: copy_plane(b.add(p, I64(1)), b.select(_even(b, p, first_plane), second, padded)))
        compute_plane(p, b.select(_even(b, p, first_plane), padded, second))

    def in_place(p: ir.Value) -> None:
        copy_plane(p, padded)
        compute_plane(p, padded)

    with b.if_else(double) as (small, large):
        with small:
            _if(b, b.icmp_signed("<", first_plane, last_plane), lambda: copy_plane(first_plane, padded))
            _loop(b, first_plane, last_plane, ahead)
        with large:
            _loop(b, first_plane, last_plane, in_place)
    if direct_first:
        b.branch(done)
        b.position_at_end(done)
    b.ret_void()


def _even(b: ir.IRBuilder, p: ir.Value, first: ir.Value) -> ir.Value:
    """Whether plane ``p`` is an even number of planes after ``first`` (it uses the first copy)."""
    return b.icmp_signed("==", b.and_(b.sub(p, first), I64(1)), I64(0))


def stack_floats(hw: tuple[int, int], out_hw: tuple[int, int], strides: tuple[int, int],
                 begin: tuple[int, int], k: int = 3) -> int:
    """The floats of the padded plane ``md_depthwise`` (``k``: its window's side) keeps on its
    stack for these shapes.

    Example:
        >>> stack_floats((56, 56), (56, 56), (1, 1), (1, 1)), stack_floats((56, 56), (56, 56), (1, 1), (3, 3), 7)
        (4316, 4860)
    """
    reach = max((out_hw[1] - 1) * strides[1] + k, begin[1] + hw[1])
    span = 2 * ((reach + 1) // 2 + 8)
    return span * max((out_hw[0] - 1) * strides[0] + k, begin[0] + hw[0]) + 24


DEPTHWISE_KERNELS = (3, 5, 7)
"""The window sides of depthwise convs the routines of :func:`depthwise_routine` compute."""


def depthwise_routine(k: int) -> str:
    """The routine computing a ``k x k`` depthwise conv (``k`` in :data:`DEPTHWISE_KERNELS`):
    ``md_depthwise`` for 3x3 (with its in-place variants), ``md_depthwise{k}`` for the larger
    windows of EfficientNet and MobileNetV3 (5x5) and ConvNeXt (7x7), the padded walk only.

    Example:
        >>> depthwise_routine(3), depthwise_routine(7)
        ('md_depthwise', 'md_depthwise7')
    """
    return "md_depthwise" if k == 3 else f"md_depthwise{k}"


def maxpool_routine(k: int) -> str:
    """The routine computing a ``k x k`` max pool (``k`` in :data:`DEPTHWISE_KERNELS`), the
    depthwise walk taking maxima: ``md_maxpool3x3`` (with its in-place variants),
    ``md_maxpool5x5`` (YOLO's SPPF), ``md_maxpool7x7``.

    Example:
        >>> maxpool_routine(5)
        'md_maxpool5x5'
    """
    return f"md_maxpool{k}x{k}"


__all__ = ["DEPTHWISE_DIMS", "DEPTHWISE_KERNELS", "depthwise_dims", "depthwise_routine", "maxpool_routine",
           "stack_floats"]
