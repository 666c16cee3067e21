"""The register-tiled micro-kernel our products share (``md_gemm``, ``md_conv1x1``,
``md_conv1x1t``, ``md_bmm``: see :mod:`.native_gemm` and :mod:`.native_bmm`).

A tile is a block of ``mr`` rows x ``width`` columns of the output, summed over the depth in
registers: each step broadcasts one scalar a row and multiplies it into the row's vectors
(FMAs), then the bias, a residual and the bounds are applied before one store (row by row,
or column by column for a transposed output). :func:`_tile` builds it as an internal LLVM
function that the routines inline; :func:`_row_tiles` walks the rows of a product in tiles.

The tile's vectors are as wide as the host allows (:func:`tile_lanes`): on this project's Zen 5
machines a 512-bit FMA does twice the work of a 256-bit one in the same time (a loop of
independent FMAs: 245 against 122 GFLOP/s on one core), so the AVX2 tile was capped at half the
core's peak. The conv kernels' packed layouts are the same either way; ``md_gemm``'s panels
are twice as wide with AVX-512.

Example:
    >>> tile_lanes() in (8, 16) and NR == 16
    True
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from metadef.codegen.host import host_target
from metadef.codegen.native_ir import F32, I32, I64, PTR, V8, _bounded, _elem, _if, _loop, _splat

MR, NR = 6, 16
"""The AVX2 register tile: output channels x pixels (two 8-float vectors a channel); with
AVX-512 the routines' tiles are :func:`.native_gemm.conv1x1_rows` x
:func:`.native_gemm.conv1x1_width` and :func:`.native_gemm.gemm_row_tiles` x
:func:`.native_gemm.gemm_panel`."""


AHEAD_LOCALITY = 2
"""The cache a tile's ``ahead`` lines are asked into: L2 (``prefetcht1``), not L1. Asked for
hundreds of steps before they are read, into L1 each request held one of the core's few L1
miss buffers for a trip to memory, and the tile's own loads queued behind them; a panel of
weights asked ahead (96 KB for BERT's) would also push the current one out of L1. ResNet-50
at batch 8 on one core (Zen 4, the ratio to ORT measured in one process, four processes
each): 0.90-0.97 -> 0.886-0.893; ``md_conv1x1`` 256 -> 64 channels over 56x56 from memory
1.26-1.28 -> 1.02-1.08 ms (best of 40); ``md_gemm``, weights from memory, unchanged."""


def tile_lanes() -> int:
    """The floats in one vector of the micro-kernel on this host: 16 (a tile row is one 512-bit
    register) where the CPU has AVX-512, else 8 (a row is two 256-bit halves). The packed
    conv kernels' layouts do not depend on it (a row of their tile is :data:`NR` floats either
    way); ``md_gemm``'s panels do (:func:`.native_gemm.gemm_panel`).

    Example:
        >>> tile_lanes() in (8, 16)
        True
    """
    return 16 if host_target().has("avx512f") else 8


def _fma(module: ir.Module, lanes: int = 8) -> ir.Function:
    name = f"llvm.fma.v{lanes}f32"
    found = module.globals.get(name)
    vector = ir.VectorType(F32, lanes)
    return found if found is not None else ir.Function(module, ir.FunctionType(vector, [vector] * 3), name)


def _tile(module: ir.Module, name: str, mr: int, column_bias: bool, transposed: bool = False,
          width: int = NR, ahead: tuple[int, ...] = ()) -> ir.Function:
    """``tile(v, v_step, s, s_row, s_step, depth, y, y_row, res, bias, rows, cols, lo, hi)``: an
    ``mr`` x 16 block of ``y`` = the sum over ``depth`` steps of a broadcast scalar of ``s`` (row
    ``r``: ``s[r*s_row + k*s_step]``) times the 16 floats at ``v + k*v_step``; then the bias (a
    float per row, or with ``column_bias`` 16 per column), the residual ``res`` (rows ``y_row``
    apart; null: none) and the bounds, and one store of the first ``rows`` rows and ``cols``
    columns. ``transposed``: ``y`` (and ``res``) hold the block column by column, element
    ``(r, c)`` at ``c*y_row + r`` (a pointwise conv's NCHW output with pixels as the rows):
    stored element by element, which costs little next to the ``depth`` steps before it.

    A row of the block is :func:`tile_lanes`-wide vectors (one 512-bit register with AVX-512,
    two 256-bit ones without); a tile of few rows splits its steps over several sets of
    accumulators, so that at least 8 chains of FMAs are in flight (two FMA units, four cycles
    each), summed before the last few steps. ``ahead``: two more arguments, a pointer and a
    step in floats (see :func:`_ahead`): each depth step ``k`` also asks for the cache lines at
    ``ahead + k*step + e`` for each ``e`` in ``ahead`` (float offsets)."""
    lanes = tile_lanes()
    per, vector = width // lanes, ir.VectorType(F32, lanes)
    fma = _fma(module, lanes)
    params = [PTR, I64, PTR, I64, I64, I64, PTR, I64, PTR, PTR, I64, I64, F32, F32] + ([PTR, I64] if ahead else [])
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), params), name)
    fn.linkage = "internal"
    fn.attributes.add("alwaysinline")
    for i in (0, 2, 6, 8, 9):
        fn.args[i].add_attribute("noalias")
    v, v_step, s, s_row, s_step, depth, y, y_row, res, bias, rows, cols, lo, hi = fn.args[:14]
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    zero = ir.Constant(vector, [0.0] * lanes)
    _prefetch_block(module, b, y, y_row, res, mr, transposed, width)

    def steps(first: ir.Value, last: ir.Value, sets: list[list[list[ir.Value]]]) -> list[list[list[ir.Value]]]:
        """k from ``first`` to ``last`` (a multiple of ``len(sets)`` apart), step ``j`` of each
        round into accumulator set ``j``: the sets' chains of FMAs are independent."""
        pre = b.block
        head, after = b.append_basic_block("k"), b.append_basic_block("k_done")
        b.cbranch(b.icmp_signed("<", first, last), head, after)
        b.position_at_end(head)
        k = b.phi(I64)
        k.add_incoming(first, pre)
        phis = [[[b.phi(vector) for _ in range(per)] for _ in range(mr)] for _ in sets]
        for phi_set, init in zip(phis, sets):
            for phi_row, init_row in zip(phi_set, init):
                for phi, value in zip(phi_row, init_row):
                    phi.add_incoming(value, pre)
        new = []
        for j, acc in enumerate(phis):
            kj = b.add(k, I64(j))
            for e in ahead:
                _prefetch(module, b, _elem(b, fn.args[14], b.add(b.mul(kj, fn.args[15]), I64(e))), write=False,
                          locality=AHEAD_LOCALITY)
            src = _elem(b, v, b.mul(kj, v_step))
            vs = [b.load(_elem(b, src, I64(lanes * h)), typ=vector, align=4) for h in range(per)]
            scalars = _elem(b, s, b.mul(kj, s_step))
            rows_now = []
            for r in range(mr):
                a = _splat(b, b.load(_elem(b, scalars, b.mul(I64(r), s_row)), typ=F32), lanes)
                rows_now.append([b.call(fma, [a, vs[h], acc[r][h]]) for h in range(per)])
            new.append(rows_now)
        k1 = b.add(k, I64(len(sets)))
        k.add_incoming(k1, b.block)
        for phi_set, new_set in zip(phis, new):
            for phi_row, new_row in zip(phi_set, new_set):
                for phi, value in zip(phi_row, new_row):
                    phi.add_incoming(value, b.block)
        body = b.block
        b.cbranch(b.icmp_signed("<", k1, last), head, after)
        b.position_at_end(after)
        out = []
        for init, new_set in zip(sets, new):
            out_set = []
            for init_row, new_row in zip(init, new_set):
                row = []
                for value, updated in zip(init_row, new_row):
                    phi = b.phi(vector)
                    phi.add_incoming(value, pre)
                    phi.add_incoming(updated, body)
                    row.append(phi)
                out_set.append(row)
            out.append(out_set)
        return out

    # few rows give few chains of FMAs: latency-bound (a GEMV); they run several sets of
    # chains over interleaved steps, summed before the last few steps
    zeros = [[zero] * per for _ in range(mr)]
    ways = max(1, 8 // (mr * per))
    if ways == 1:
        final = steps(I64(0), depth, [zeros])[0]
    else:
        main = b.mul(b.sdiv(depth, I64(ways)), I64(ways))
        parts = steps(I64(0), main, [zeros] * ways)
        total = [[parts[0][r][h] for h in range(per)] for r in range(mr)]
        for part in parts[1:]:
            total = [[b.fadd(total[r][h], part[r][h]) for h in range(per)] for r in range(mr)]
        final = steps(main, depth, [total])[0]
    low, high = _splat(b, lo, lanes), _splat(b, hi, lanes)
    with_res = b.icmp_signed("!=", b.ptrtoint(res, I64), I64(0))
    whole = b.icmp_signed("==", cols, I64(width))
    memcpy = module.declare_intrinsic("llvm.memcpy", [PTR, PTR, I64])
    with b.goto_entry_block():
        spill = b.alloca(vector, size=per)
    betas = [b.load(_elem(b, bias, I64(lanes * h)), typ=vector, align=4) for h in range(per)] if column_bias else None
    if transposed:
        assert betas is not None
        rows_out = [_eighths(b, [b.fadd(final[r][h], betas[h]) for h in range(per)]) for r in range(mr)]
        _store_columns(module, b, rows_out, y, y_row, res, with_res, rows, cols, (_splat(b, lo), _splat(b, hi)))
        b.ret_void()
        return fn
    for r in range(mr):
        def store(r: int = r) -> None:
            offset = b.mul(I64(r), y_row)
            beta = betas or [_splat(b, b.load(_elem(b, bias, I64(r)), typ=F32), lanes)] * per
            out = [b.fadd(final[r][h], beta[h]) for h in range(per)]

            def plus_residual() -> None:  # a residual is read only where there is one
                with b.if_else(whole) as (full, part):
                    with full:
                        for h in range(per):
                            at = b.add(offset, I64(lanes * h))
                            total = b.fadd(out[h], b.load(_elem(b, res, at), typ=vector, align=4))
                            b.store(_bounded(b, total, low, high), _elem(b, y, at), align=4)
                    with part:  # a last, narrower block of columns: the residual's row through the stack too
                        size = b.mul(cols, I64(4))
                        for h in range(per):
                            b.store(zero, b.gep(spill, [I64(h)]), align=4)
                        b.call(memcpy, [b.bitcast(spill, PTR), _elem(b, res, offset), size, ir.IntType(1)(0)])
                        for h in range(per):
                            total = b.fadd(out[h], b.load(b.gep(spill, [I64(h)]), typ=vector, align=4))
                            b.store(_bounded(b, total, low, high), b.gep(spill, [I64(h)]), align=4)
                        b.call(memcpy, [_elem(b, y, offset), b.bitcast(spill, PTR), size, ir.IntType(1)(0)])

            def alone() -> None:
                with b.if_else(whole) as (full, part):
                    with full:
                        for h in range(per):
                            b.store(_bounded(b, out[h], low, high), _elem(b, y, b.add(offset, I64(lanes * h))),
                                    align=4)
                    with part:  # a last, narrower block of columns: through 16 floats on the stack
                        for h in range(per):
                            b.store(_bounded(b, out[h], low, high), b.gep(spill, [I64(h)]), align=4)
                        b.call(memcpy, [_elem(b, y, offset), b.bitcast(spill, PTR), b.mul(cols, I64(4)),
                                        ir.IntType(1)(0)])

            with b.if_else(with_res) as (then, otherwise):
                with then:
                    plus_residual()
                with otherwise:
                    alone()
        _if(b, b.icmp_signed("<", I64(r), rows), store)
    b.ret_void()
    return fn


def _eighths(b: ir.IRBuilder, row: list[ir.Value]) -> list[ir.Value]:
    """A tile row as 8-float vectors, whatever its vectors' width."""
    lanes = ir.VectorType(I32, 8)
    return [piece for v in row for piece in (
        [v] if v.type.count == 8 else
        [b.shuffle_vector(v, v, ir.Constant(lanes, list(range(8 * h, 8 * h + 8)))) for h in range(v.type.count // 8)])]


def _prefetch(module: ir.Module, b: ir.IRBuilder, at: ir.Value, write: bool, locality: int = 3) -> None:
    fn = module.globals.get("llvm.prefetch.p0") or ir.Function(
        module, ir.FunctionType(ir.VoidType(), [PTR, I32, I32, I32]), "llvm.prefetch.p0")
    b.call(fn, [at, I32(int(write)), I32(locality), I32(1)])


def _ahead(b: ir.IRBuilder, following: ir.Value, tile: ir.Value, depth: ir.Value, width: int
           ) -> tuple[ir.Value, ir.Value]:
    """The ``ahead`` arguments of a tile (built with ``ahead=(0,)``) that is the ``tile``-th to
    pass over a weight panel of ``depth`` x ``width`` floats whose next panel starts at
    ``following``: the first ``width / 16`` tiles each ask for their share of the next
    panel's cache lines, one line a depth step; the rest ask for nothing new (step 0). With
    weights out of cache (a model's, read once a run), the next panel is then in cache when
    its first tile starts instead of coming from memory line by line (BERT's products at 128
    rows: 190-200 -> 215-230 GFLOP/s)."""
    early = b.icmp_signed("<", tile, I64(width // 16))
    start = b.select(early, b.mul(tile, b.mul(depth, I64(16))), I64(0))
    return _elem(b, following, start), b.select(early, I64(16), I64(0))


def _prefetch_block(module: ir.Module, b: ir.IRBuilder, y: ir.Value, y_row: ir.Value, res: ir.Value, mr: int,
                    transposed: bool, width: int = NR) -> None:
    """Ask for the cache lines of the block's output (to write) and residual (to read; the
    output's again when there is none) before the tile's steps: the stores at its end then
    find them in cache instead of waiting on memory, since a tile's lines lie in up to 16 rows
    that the hardware prefetchers do not follow."""
    fn = module.globals.get("llvm.prefetch.p0") or ir.Function(
        module, ir.FunctionType(ir.VoidType(), [PTR, I32, I32, I32]), "llvm.prefetch.p0")
    source = b.select(b.icmp_signed("!=", b.ptrtoint(res, I64), I64(0)), res, y)
    lines = [(c, 0) for c in range(width)] + [(c, mr - 1) for c in range(width)] if transposed else \
        [(r, e) for r in range(mr) for e in (*range(0, width, NR), width - 1)]
    for line, within in lines:
        at = b.add(b.mul(I64(line), y_row), I64(within))
        b.call(fn, [_elem(b, y, at), I32(1), I32(3), I32(1)])
        b.call(fn, [_elem(b, source, at), I32(0), I32(3), I32(1)])


def _store_columns(module: ir.Module, b: ir.IRBuilder, out: list[list[ir.Value]], y: ir.Value, y_col: ir.Value,
                   res: ir.Value, with_res: ir.Value, rows: ir.Value, cols: ir.Value,
                   bounds: tuple[ir.Value, ir.Value]) -> None:
    """A transposed tile (``out``: its rows, 8-float pieces of its columns, bias added) to ``y``, element
    ``(r, c)`` at ``c*y_col + r``: each half of 8 columns transposed in registers, then one
    masked store of a column's ``rows`` elements per column below ``cols`` (the residual read
    through the same mask and added first, when ``with_res``). No branches: code that LLVM
    compiles in a tenth of the time of element-by-element stores."""
    mask_type = ir.VectorType(ir.IntType(1), 8)
    load = module.globals.get("llvm.masked.load.v8f32.p0") or ir.Function(
        module, ir.FunctionType(V8, [PTR, I32, mask_type, V8]), "llvm.masked.load.v8f32.p0")
    store = module.globals.get("llvm.masked.store.v8f32.p0") or ir.Function(
        module, ir.FunctionType(ir.VoidType(), [V8, PTR, I32, mask_type]), "llvm.masked.store.v8f32.p0")
    zero = ir.Constant(V8, [0.0] * 8)
    lanes = b.icmp_signed("<", ir.Constant(ir.VectorType(I64, 8), list(range(8))), _splat(b, rows))
    source = b.select(with_res, res, y)  # (y itself when there is no residual: a valid read, then dropped)
    for h in range(len(out[0])):
        columns = _transpose8(b, [out[r][h] if r < len(out) else zero for r in range(8)])
        for j, column in enumerate(columns):
            c = 8 * h + j
            mask = b.and_(lanes, _splat(b, b.icmp_signed("<", I64(c), cols)))
            at = b.mul(I64(c), y_col)
            earlier = b.call(load, [_elem(b, source, at), I32(4), mask, zero])
            total = b.fadd(column, b.select(with_res, earlier, zero))
            b.call(store, [_bounded(b, total, *bounds), _elem(b, y, at), I32(4), mask])


_UNPACK = ([0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15])
_PAIRS = ([0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15])
_HALVES = ([0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15])


def _transpose8(b: ir.IRBuilder, rows: list[ir.Value]) -> list[ir.Value]:
    """The 8 columns of an 8 x 8 block held as 8 row vectors (three rounds of shuffles)."""
    def mix(u: ir.Value, v: ir.Value, mask: list[int]) -> ir.Value:
        return b.shuffle_vector(u, v, ir.Constant(ir.VectorType(I32, 8), mask))
    t = [mix(rows[2 * i], rows[2 * i + 1], _UNPACK[h]) for i in range(4) for h in range(2)]  # t0..t7
    u = [mix(t[4 * g + h], t[4 * g + h + 2], _PAIRS[q]) for g in range(2) for h in range(2) for q in range(2)]
    # u[4g + 2h + q]: rows 4g.., columns 2h + q and 2h + q + 4
    return [mix(u[j % 4], u[4 + j % 4], _HALVES[j // 4]) for j in range(8)]


def _row_tiles(b: ir.IRBuilder, m: ir.Value, sizes: tuple[int, ...],
               rows_from: Callable[[ir.Value, int], None], pairs: bool = False) -> None:
    """``rows_from(r0, mr)`` over rows ``[0, m)``: tiles of ``sizes[0]`` rows, then the last
    rows (fewer) by the smaller tiles, each at most once (``sizes`` halve down to 1).
    ``pairs`` (sizes 12, 8, ...): 16 to 19 rows go as two 8s and the rest, not 12, 4 and the
    rest: the 4-row tile, a quarter of the rows, has 8 chains of FMAs, too few to hide a weight
    panel's reads from memory (Winograd's products of 16 tiles, their weights out of cache, one
    core, 16 products of 512 x 512: 0.89-0.96 -> 0.73-0.80 ms; with more rows the 4-row tile's
    share is small and in cache the split measured alike)."""
    top = sizes[0]
    full = b.sdiv(m, I64(top))
    two = pairs and sizes[:2] == (12, 8)
    if two:
        rest = b.sub(m, b.mul(full, I64(top)))
        swap = b.and_(b.and_(b.icmp_signed(">=", rest, I64(4)), b.icmp_signed("<", rest, I64(8))),
                      b.icmp_signed("==", full, I64(1)))
        full = b.sub(full, b.zext(swap, I64))
    _loop(b, I64(0), full, lambda i: rows_from(b.mul(i, I64(top)), top))
    r0 = b.mul(full, I64(top))
    rest = b.sub(m, r0)
    for mr in sizes[1:]:
        if two and mr == 8:  # (up to two 8s, one call site)
            count, start = b.sdiv(rest, I64(mr)), r0
            _loop(b, I64(0), count, lambda i, start=start: rows_from(b.add(start, b.mul(i, I64(8))), 8))
            taken = b.mul(count, I64(mr))
        else:
            with b.if_then(b.icmp_signed(">=", rest, I64(mr))):
                rows_from(r0, mr)
            taken = b.select(b.icmp_signed(">=", rest, I64(mr)), I64(mr), I64(0))
        r0, rest = b.add(r0, taken), b.sub(rest, taken)


__all__ = ["MR", "NR", "tile_lanes"]
