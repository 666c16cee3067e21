"""3x3 depthwise convs and max pools that read their planes in place (see
:mod:`.native_depthwise`, whose ``md_depthwise`` and ``md_maxpool3x3`` call these per plane):
:func:`_direct` for planes at least 9 wide (stride 1) or 16 (stride 2), :func:`_narrow` for
planes of 7 outputs a row. The fill (zeros, or -inf for a pool) stands for the padding, shifted
into the vectors in registers, so that no plane is copied and no load leaves it.

Example:
    >>> NARROW
    {1: 7, 2: 14}
"""

from __future__ import annotations

from llvmlite import ir

from metadef.codegen.native_ir import F32, I32, I64, PTR, V8, _bounded, _elem, _if, _internal, _loop, _splat

LANES = ir.Constant(ir.VectorType(I64, 8), list(range(8)))

ODD = ir.Constant(ir.VectorType(I32, 8), [1, 3, 5, 7, 9, 11, 13, 15])
EVENS = ir.Constant(ir.VectorType(I32, 8), [0, 2, 4, 6, 8, 10, 12, 14])


def _pool_max(b: ir.IRBuilder, values: list[ir.Value], exact: bool = True) -> ir.Value:
    """The maximum of ``values`` (NaN if one is, with ``exact``; else ``vmaxps`` alone, for
    values known to hold none), taken pairwise: a tree ``log2(n)`` maxima deep where a chain
    was ``n`` (the chain's latency, not the loads, set a max pool's pace). With ``exact``, each
    pair of inputs is also compared unordered (NaN in either) and the flags or-ed up the tree;
    where one is set the result is NaN: a 3x3 window's maximum in 8 ``vmaxps``, 5 compares, 5
    ors and a blend (a chain of ``llvm.maximum``, which also orders -0 below +0, took 9 x 7-8
    with AVX-512, its compares moved to mask registers one by one)."""
    level: list[tuple[ir.Value, ir.Value | None]] = [(v, None) for v in values]
    while len(level) > 1:
        pairs = [(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        joined = []
        for (x, fx), (y, fy) in pairs:
            larger = b.select(b.fcmp_ordered(">", x, y), x, y)  # (one vmaxps: y where either is NaN)
            if not exact:
                joined.append((larger, None))
                continue
            # a raw value is covered by a compare of the pair it first joins; a pair's maxima
            # by the flags below them
            flags = [f for f in (fx, fy) if f is not None]
            if fx is None or fy is None:
                flags.append(b.fcmp_unordered("uno", x, y))
            flag = flags[0]
            for f in flags[1:]:
                flag = b.or_(flag, f)
            joined.append((larger, flag))
        level = joined + level[2 * len(pairs):]
    value, flag = level[0]
    if flag is None:
        return value
    return b.select(flag, ir.Constant(value.type, float("nan")) if value.type == F32 else
                    ir.Constant(value.type, [float("nan")] * value.type.count), value)


def _has_nan(b: ir.IRBuilder, plane: ir.Value, count: ir.Value) -> ir.Value:
    """Whether the ``count`` floats from ``plane`` (and up to 7 more, readable) hold a NaN."""
    seen = b.alloca(ir.IntType(1))
    b.store(ir.IntType(1)(0), seen)

    def eight(k: ir.Value) -> None:
        v = b.load(_elem(b, plane, b.mul(k, I64(8))), typ=V8, align=4)
        lanes = b.bitcast(b.fcmp_unordered("uno", v, v), ir.IntType(8))
        b.store(b.or_(b.load(seen), b.icmp_unsigned("!=", lanes, ir.IntType(8)(0))), seen)

    _loop(b, I64(0), b.sdiv(b.add(count, I64(7)), I64(8)), eight)
    return b.load(seen)


DIRECT = True
"""Planes with one pixel of padding before each axis, stride 1 (same size, at least 9 wide) or 2
(half, at least 16 wide), or of 7 outputs a row (:func:`_narrow`), are read in place
(:func:`_direct`); False keeps every plane on the padded copy (tests, comparisons)."""


def _direct(module: ir.Module, stride: int, pool: bool = False) -> ir.Function:
    """``plane(y, x, width, w, beta, lo, hi, oh, ow, h, fill_line)``: every output row of one plane
    read straight from the input plane ``x`` (no padded copy), for one pixel of padding before
    each axis and none after that the outputs read (stride 1: ``oh, ow = h, width``; stride 2:
    ``2*oh, 2*ow = h, width``). A tap row above or below the plane reads
    ``fill_line`` (the padding's value); the column before a row (and for stride 1 the one
    after it) comes in as the fill, shifted into the vector in registers: the copy of the whole
    plane into a padded one was a quarter of a stride-1 plane's time and more than half of a
    stride-2 one's (``perf``, MobileNetV2's 96 x 112x112 stride 2). Stride 1 goes a column of
    vectors at a time down the plane, each input row's three loads carried to the next two
    output rows in registers (384 x 14x14 0.027 -> 0.020 ms, 192 x 28x28 0.053 -> 0.040, rows
    across: 9 loads an output vector); stride 2 loads 16 consecutive inputs a tap row and takes
    their even and odd columns apart in registers.
    ``width`` is at least 9 for stride 1 (a first and a last vector, which may overlap), 16
    for stride 2."""
    fn, b = _internal(module, f"md_{'mp' if pool else 'dw'}_direct{stride}",
                      [PTR, PTR, I64, PTR, F32, F32, F32, I64, I64, I64, PTR], (0,))
    y_plane, x_plane, width, w, beta, lo, hi, oh, ow, h, fill_line = fn.args
    taps = [] if pool else [_splat(b, b.load(_elem(b, w, I64(t)), typ=F32)) for t in range(9)]
    low, high, start = _splat(b, lo), _splat(b, hi), _splat(b, beta)
    fma = module.globals.get("llvm.fma.v8f32") or ir.Function(module, ir.FunctionType(V8, [V8, V8, V8]),
                                                               "llvm.fma.v8f32")
    fill = b.load(fill_line, typ=V8, align=4)
    blocks = b.sdiv(ow, I64(8))
    exact = b.icmp_signed("==", b.mul(blocks, I64(8)), ow)
    shift_in = ir.Constant(ir.VectorType(I32, 8), [7, 8, 9, 10, 11, 12, 13, 14])  # (b's lane 7, then a's 0..6)
    shift_out = ir.Constant(ir.VectorType(I32, 8), [1, 2, 3, 4, 5, 6, 7, 8])  # (a's 1..7, then b's 0)

    def load(at: ir.Value) -> ir.Value:
        return b.load(at, typ=V8, align=4)

    def row_of(iy: ir.Value) -> ir.Value:
        """Input row ``iy``'s first column (the fill line's for a row outside the plane)."""
        inside = b.and_(b.icmp_signed(">=", iy, I64(0)), b.icmp_signed("<", iy, h))
        return b.select(inside, _elem(b, x_plane, b.mul(iy, width)), _elem(b, fill_line, I64(8)))

    def output(rows: list[list[ir.Value]]) -> ir.Value:
        if pool:  # (beta is -inf: the window's maximum alone)
            return _pool_max(b, [v for values in rows for v in values])
        acc = start
        for r, values in enumerate(rows):
            for t, v in enumerate(values):
                acc = b.call(fma, [taps[3 * r + t], v, acc])
        return acc

    def store(acc: ir.Value, at: ir.Value) -> None:
        b.store(_bounded(b, acc, low, high), b.bitcast(_elem(b, y_plane, at), V8.as_pointer()), align=4)

    if stride == 2:
        def row_at(oy: ir.Value) -> None:
            rows = [row_of(b.add(b.mul(oy, I64(2)), I64(r - 1))) for r in range(3)]

            def eight(o: ir.Value, left: bool = False) -> None:
                # columns 2o - 1, 2o, 2o + 1 (+ 2 lane): 16 from 2o, evens and odds, the odds moved on
                at, taps_in = b.mul(o, I64(2)), []
                for row in rows:
                    first, second = load(_elem(b, row, at)), load(_elem(b, row, b.add(at, I64(8))))
                    evens, odds = b.shuffle_vector(first, second, EVENS), b.shuffle_vector(first, second, ODD)
                    prev = fill if left else b.insert_element(
                        ir.Constant(V8, ir.Undefined), b.load(_elem(b, row, b.sub(at, I64(1))), typ=F32), I32(7))
                    taps_in.append([b.shuffle_vector(prev, odds, shift_in), evens, odds])
                store(output(taps_in), b.add(b.mul(oy, ow), o))

            eight(I64(0), left=True)  # (2o + 15 < width for every vector: none needs the fill after)
            _loop(b, I64(1), blocks, lambda k: eight(b.mul(k, I64(8))))
            _if(b, b.not_(exact), lambda: eight(b.sub(ow, I64(8))))

        _loop(b, I64(0), oh, row_at)
        b.ret_void()
        return fn

    # stride 1: a column of vectors at a time, down the plane, each input row's three loads made
    # once and carried to the next two output rows in registers (3 loads an output vector, not 9);
    # the vector at o reads columns o - 1 .. o + 8: the first needs the fill before the row, the
    # one ending at the row's end (the last block, or one overlapping it) the fill after it
    def taps_of(iy: ir.Value, o: ir.Value, edge: str) -> list[ir.Value]:
        row = row_of(iy)
        mid = load(_elem(b, row, o))
        before = b.shuffle_vector(fill, mid, shift_in) if edge == "left" else load(_elem(b, row, b.sub(o, I64(1))))
        after = b.shuffle_vector(mid, fill, shift_out) if edge == "right" else load(_elem(b, row, b.add(o, I64(1))))
        return [before, mid, after]

    def column(o: ir.Value, edge: str = "") -> None:
        pre = b.block
        first = taps_of(I64(0), o, edge)
        head, done = b.append_basic_block("column"), b.append_basic_block("column_done")
        b.branch(head)
        b.position_at_end(head)
        oy = b.phi(I64)
        oy.add_incoming(I64(0), pre)
        carried = [[b.phi(V8) for _ in range(3)] for _ in range(2)]
        for phis, init in zip(carried, ([fill, fill, fill], first)):
            for phi, v in zip(phis, init):
                phi.add_incoming(v, pre)
        rows = [*carried, taps_of(b.add(oy, I64(1)), o, edge)]
        store(output(rows), b.add(b.mul(oy, ow), o))
        following = b.add(oy, I64(1))
        oy.add_incoming(following, b.block)
        for phis, values in zip(carried, rows[1:]):
            for phi, v in zip(phis, values):
                phi.add_incoming(v, b.block)
        b.cbranch(b.icmp_signed("<", following, oh), head, done)
        b.position_at_end(done)

    column(I64(0), "left")
    _loop(b, I64(1), b.select(exact, b.sub(blocks, I64(1)), blocks), lambda k: column(b.mul(k, I64(8))))
    column(b.sub(ow, I64(8)), "right")
    b.ret_void()
    return fn


NARROW = {1: 7, 2: 14}
"""The input width a narrow plane read in place has at each stride: 7x7 outputs (MobileNetV2's
last blocks, 14 -> 7 at stride 2)."""


def _narrow(module: ir.Module, stride: int, pool: bool = False) -> ir.Function:
    """``plane(y, x, w, beta, lo, hi, oh, h, fill_line)``: :func:`_direct` for a plane of 7
    outputs a row (:data:`NARROW` columns in: 7 at stride 1, 14 at stride 2), one vector of 8
    an output row: each tap row's columns from -1 on in one load (two at stride 2) at a fixed
    offset from the row, the first row's and the last one's shifted in registers so that no
    load leaves the plane; the column before the row comes in as the fill. A row's vector
    spills one output into the next row, which is written after it; the last row's is stored
    as the plane's last 8 outputs, the row before's last one in front (in place of a masked
    store, slow on AMD cores). The output rows go in one loop, each input row's taps made
    once and carried over to the next output rows in registers (MobileNetV2's 960 x 7x7 planes
    0.042 -> 0.017 ms, its 576 x 14x14 stride 2 0.046 -> 0.019 ms)."""
    width = NARROW[stride]
    fn, b = _internal(module, f"md_{'mp' if pool else 'dw'}_narrow{stride}",
                      [PTR, PTR, PTR, F32, F32, F32, I64, I64, PTR], (0,))
    y_plane, x_plane, w, beta, lo, hi, oh, h, fill_line = fn.args
    taps = [] if pool else [_splat(b, b.load(_elem(b, w, I64(t)), typ=F32)) for t in range(9)]
    low, high, start = _splat(b, lo), _splat(b, hi), _splat(b, beta)
    fma = module.globals.get("llvm.fma.v8f32") or ir.Function(module, ir.FunctionType(V8, [V8, V8, V8]),
                                                               "llvm.fma.v8f32")
    fill = b.load(fill_line, typ=V8, align=4)
    first_lane = b.icmp_signed("==", LANES, _splat(b, I64(0)))
    mask = ir.VectorType(I32, 8)

    def pick(a: ir.Value, c: ir.Value, lanes: list[int]) -> ir.Value:
        return b.shuffle_vector(a, c, ir.Constant(mask, lanes))

    def load(at: ir.Value) -> ir.Value:
        return b.load(at, typ=V8, align=4)

    def columns(iy: ir.Value) -> list[ir.Value]:
        """Input row ``iy``'s columns -1 .. 8 * stride - 2 in vectors of 8 (those past the row
        unread but by lanes past the outputs), the fill for a row outside the plane."""
        row = _elem(b, x_plane, b.mul(iy, I64(width)))
        inside = b.and_(b.icmp_signed(">=", iy, I64(0)), b.icmp_signed("<", iy, h))
        top = b.icmp_signed("==", iy, I64(0))
        bottom = b.icmp_signed("==", iy, b.sub(h, I64(1)))
        safe = b.select(inside, row, _elem(b, fill_line, I64(16)))  # (a pointer every load may read from)
        # (no load leaves the plane: the first row's is read from its start and shifted right,
        # stride 2's last row's second half ends at the row's end and is shifted left)
        first = load(_elem(b, safe, b.select(top, I64(0), I64(-1))))
        vectors = [b.select(top, pick(fill, first, [7, 8, 9, 10, 11, 12, 13, 14]), first)]
        if stride == 2:  # columns 7 .. 14
            second = load(_elem(b, safe, b.select(top, I64(8), b.select(bottom, I64(6), I64(7)))))
            vectors.append(b.select(top, pick(first, second, [7, 8, 9, 10, 11, 12, 13, 14]),
                                    b.select(bottom, pick(second, fill, [1, 2, 3, 4, 5, 6, 7, 8]), second)))
        return [b.select(inside, v, fill) for v in vectors]

    def tap_values(iy: ir.Value) -> list[ir.Value]:
        """Input row ``iy``'s three taps' inputs for every output of a row."""
        vectors = columns(iy)
        if stride == 1:  # lane i: columns i - 1, i, i + 1 (column 7 is past the row: the fill)
            v = vectors[0]
            return [b.select(first_lane, fill, v), pick(v, fill, [1, 2, 3, 4, 5, 6, 7, 8]),
                    pick(v, fill, [2, 3, 4, 5, 6, 7, 8, 8])]
        # lane i: columns 2i - 1, 2i, 2i + 1
        evens = pick(vectors[0], vectors[1], [0, 2, 4, 6, 8, 10, 12, 14])
        odds = pick(vectors[0], vectors[1], [1, 3, 5, 7, 9, 11, 13, 15])
        return [b.select(first_lane, fill, evens), odds, pick(evens, fill, [1, 2, 3, 4, 5, 6, 7, 8])]

    def result(rows: list[list[ir.Value]]) -> ir.Value:
        if pool:  # (beta is -inf: the window's maximum alone)
            return _bounded(b, _pool_max(b, [v for values in rows for v in values]), low, high)
        acc = start
        for r, values in enumerate(rows):
            for s, v in enumerate(values):
                acc = b.call(fma, [taps[3 * r + s], v, acc])
        return _bounded(b, acc, low, high)

    def store(v: ir.Value, at: ir.Value) -> None:
        b.store(v, b.bitcast(_elem(b, y_plane, at), V8.as_pointer()), align=4)

    # output rows in one loop, each input row's taps made once: the rows shared with the next
    # output row (stride 1: two; stride 2: one) carried over in registers
    carried = 2 if stride == 1 else 1
    outside = [fill, fill, fill]  # (the row above the plane)
    start_rows = [outside, tap_values(I64(0))] if stride == 1 else [outside]
    pre = b.block
    head, done = b.append_basic_block("rows"), b.append_basic_block("rows_done")
    b.branch(head)
    b.position_at_end(head)
    oy = b.phi(I64)
    oy.add_incoming(I64(0), pre)
    phis = [[b.phi(V8) for _ in range(3)] for _ in range(carried)]
    for row_phis, init in zip(phis, start_rows):
        for phi, value in zip(row_phis, init):
            phi.add_incoming(value, pre)
    fresh = [tap_values(b.add(b.mul(oy, I64(stride)), I64(k + carried - 1))) for k in range(3 - carried)]
    rows = [*phis, *fresh]
    value = result(rows)
    last = b.icmp_signed("==", oy, b.sub(oh, I64(1)))
    with b.if_else(last) as (final, inner):
        with inner:
            store(value, b.mul(oy, I64(7)))
        with final:  # the plane's last 8 outputs, the row before's last one (just stored) in front
            end = b.sub(b.mul(oh, I64(7)), I64(8))
            before = b.load(_elem(b, y_plane, end), typ=F32)
            store(pick(b.insert_element(ir.Constant(V8, ir.Undefined), before, I32(7)), value,
                       [7, 8, 9, 10, 11, 12, 13, 14]), end)
    following = b.add(oy, I64(1))
    oy.add_incoming(following, b.block)
    for row_phis, value_row in zip(phis, rows[3 - carried:]):
        for phi, v in zip(row_phis, value_row):
            phi.add_incoming(v, b.block)
    b.cbranch(b.icmp_signed("<", following, oh), head, done)
    b.position_at_end(done)
    b.ret_void()
    return fn


__all__ = ["DIRECT", "EVENS", "LANES", "NARROW", "ODD"]
