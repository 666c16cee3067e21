"""Winograd F(m x m, 3x3) for 3x3 stride-1 convs (see :mod:`.native`), in the phases a program
runs per image: ``md_winograd_in`` and ``md_winograd_out`` for ``m = 2`` (4x4 input tiles: 16
products, 2.25x fewer multiplications than the direct conv), ``md_winograd4_in`` and
``md_winograd4_out`` for ``m = 4`` (6x6 tiles: 36 products, 4x fewer, a larger rounding error:
about 10x the direct conv's in float32, against the same for ``m = 2``).

The input is zero-padded to whole tiles and each ``a x a`` tile (``a = m + 2``) becomes
``V = Bᵀ d B``: ``a²`` values, laid out ``[a², C, tiles]``, the planes :data:`WINOGRAD_SKEW`
floats apart; the ``a²`` products ``M[e] = U[e] V[e]`` (``[K, C] x [C, tiles]``) run between
the phases; each ``M`` tile becomes the ``m x m`` output ``Aᵀ M A`` (+ bias, bounded), written in
place or, where the output is not whole tiles, into whole tiles and cropped. The layout is
:func:`winograd_plan`'s. The weights' transform ``U = G g Gᵀ`` is numpy's, once, at bind time
(:func:`winograd_matrices` gives ``G`` too).

Both phases go a vector of tiles at a time, by hand (they compile without LLVM's vectorizers):
a row of tiles is read as a few wide loads whose lanes are picked apart (tile ``t``'s column
``j`` is lane ``m t + j``), and, for ``m = 4``, each output row's ``m`` vectors are interleaved
back into one contiguous store.

Example:
    >>> winograd_workspace(64, 64, 56, 56) > winograd_workspace(64, 64, 56, 56, m=4)
    True
    >>> [len(rows) for rows in winograd_matrices(4)]
    [6, 6, 4]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from llvmlite import ir

from metadef.codegen.native_conv import _pad_plane
from metadef.codegen.native_ir import (
    F32,
    I32,
    I64,
    PTR,
    _arg,
    _bounded,
    _define,
    _elem,
    _float_bits,
    _if,
    _internal,
    _load_if,
    _loop,
    _share,
    _smax,
    _smin,
    _splat,
)

WINOGRAD_DIMS = ("n", "c", "h", "w", "k", "oh", "ow", "pt", "pl", "has_bias", "lo", "hi")
"""The shape dims of a Winograd conv (see :data:`WINOGRAD_TASK_DIMS`): ``n`` images share the
workspace (:func:`winograd_workspace` floats), their tiles side by side in each plane of V and
M, so that each product covers them all; the weights ``u`` are transformed, ``[a², K, C]``;
``lo`` and ``hi`` (float32 bits) bound the output (Relu, Clip), as the output transform stores
it."""

WINOGRAD_TASK_DIMS = (*WINOGRAD_DIMS, "image", "task", "tasks")
"""The dims of the phases: each call transforms one image, ``image`` of the ``n`` (its input
and output pointers are that image's)."""

WINOGRAD_SIZES = (2, 4)
"""The output tiles (``m``) there are routines for."""

_F2 = (((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1)),
       ((1, 0, 0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0, 0, 1)),
       ((1, 1, 1, 0), (0, 1, -1, -1)))
# Lavin and Gray's F(4x4, 3x3), interpolation points 0, 1, -1, 2, -2 (and infinity)
_F4 = (((4, 0, -5, 0, 1, 0), (0, -4, -4, 1, 1, 0), (0, 4, -4, -1, 1, 0), (0, -2, -1, 2, 1, 0),
        (0, 2, -1, -2, 1, 0), (0, 4, 0, -5, 0, 1)),
       ((1 / 4, 0, 0), (-1 / 6, -1 / 6, -1 / 6), (-1 / 6, 1 / 6, -1 / 6), (1 / 24, 1 / 12, 1 / 6),
        (1 / 24, -1 / 12, 1 / 6), (0, 0, 1)),
       ((1, 1, 1, 1, 1, 0), (0, 1, -1, 2, -2, 0), (0, 1, 1, 4, 4, 0), (0, 1, -1, 8, -8, 1)))
_MATRICES = {2: _F2, 4: _F4}

WINOGRAD_SKEW = 16
"""Floats between one transformed element's plane and the next, past their ``C x tiles`` (or
``K x tiles``) values: the ``a²`` planes a tile's values go to (and its products come from)
would otherwise lie a multiple of 4 KiB apart for many shapes (ResNet's 56x56 with 64
channels: 196 KiB), all in one set of the L1 cache."""

TILE_LANES = {2: (16, 8, 4), 4: (4,)}
"""The tiles a step of either phase takes at once, by ``m`` (the widest a row has, then
fewer); with ``m = 2`` a row of fewer tiles than the last goes one tile at a time, F(4x4)
needs rows of at least 4 tiles (:func:`winograd_fits`). Each width is its own copy of the
transform, and F(4x4)'s are large: steps of 8 and 4 tiles and a scalar path took LLVM 0.7 s
for the two phases, 4 alone 0.26 s, for 0.06 ms more of ResNet-50's 56x56 layers a conv
(rows of 14 tiles) and the same or less on its 28x28 and 14x14 ones."""


def winograd_matrices(m: int) -> tuple[tuple[tuple[float, ...], ...], ...]:
    """``(Bᵀ, G, Aᵀ)`` of F(m x m, 3x3): ``[a, a]``, ``[a, 3]`` and ``[m, a]`` for ``a = m + 2``.

    Example:
        >>> winograd_matrices(2)[2]
        ((1, 1, 1, 0), (0, 1, -1, -1))
    """
    if m not in _MATRICES:
        raise ValueError(f"Winograd F({m}x{m}, 3x3): only m in {WINOGRAD_SIZES} has routines")
    return _MATRICES[m]


def phase_routine(m: int, phase: str) -> str:
    """The native routine of a phase (``"in"`` or ``"out"``) of F(m x m, 3x3).

    Example:
        >>> phase_routine(2, "in"), phase_routine(4, "out")
        ('md_winograd_in', 'md_winograd4_out')
    """
    return f"md_winograd{'' if m == 2 else m}_{phase}"


def winograd_fits(m: int, ow: int) -> bool:
    """Whether F(m x m, 3x3)'s routines take rows of ``ow`` output pixels: any with ``m = 2``;
    at least 4 tiles (13 pixels) with ``m = 4`` (:data:`TILE_LANES`).

    Example:
        >>> winograd_fits(4, 14), winograd_fits(4, 7), winograd_fits(2, 1)
        (True, False, True)
    """
    return m == 2 or -(-ow // m) >= min(TILE_LANES[m])


class WinogradPlan(NamedTuple):
    """The workspace of a Winograd conv of ``images`` images, in floats: V (``a²`` planes of
    ``[C, images x tiles]``, ``v_stride`` apart; later one image's whole output tiles) from 0,
    then M (``a²`` planes of ``[K, images x tiles]``, ``m_stride`` apart; first one image
    padded) from ``m_offset``."""

    tiles: int
    v_stride: int
    m_stride: int
    m_offset: int
    floats: int


def winograd_plan(c: int, k: int, oh: int, ow: int, m: int = 2, images: int = 1) -> WinogradPlan:
    """The workspace layout the Winograd routines use for ``images`` images at once (see
    :class:`WinogradPlan`; ``tiles``: one image's).

    Example:
        >>> winograd_plan(64, 64, 56, 56)[:3]  # tiles, then 64 * 784 + 16 floats per plane
        (784, 50192, 50192)
        >>> winograd_plan(64, 64, 56, 56, m=4).tiles, winograd_plan(64, 64, 56, 56, m=4, images=2).v_stride
        (196, 25104)
    """
    a, th, tw = m + 2, -(-oh // m), -(-ow // m)
    tiles = th * tw
    v_stride, m_stride = c * images * tiles + WINOGRAD_SKEW, k * images * tiles + WINOGRAD_SKEW
    m_offset = max(a * a * v_stride, m * m * k * tiles)
    return WinogradPlan(tiles, v_stride, m_stride, m_offset,
                        m_offset + max(a * a * m_stride, c * (m * th + 2) * (m * tw + 2)))


def winograd_workspace(c: int, k: int, oh: int, ow: int, m: int = 2, images: int = 1) -> int:
    """The floats of a Winograd conv's workspace (one image): two regions, the
    first for V (then the whole output tiles, once V is read), the second for the padded image
    (then M, once the image is transformed).

    Example:
        >>> winograd_workspace(1, 1, 2, 2)
        544
    """
    return winograd_plan(c, k, oh, ow, m, images).floats


def _combine(b: ir.IRBuilder, coefficients: tuple[float, ...], values: list[ir.Value]) -> ir.Value:
    """``sum_i coefficients[i] * values[i]``: zero terms skipped, ±1 as adds and subtractions
    (scalars or vectors: a coefficient is splat to the values' lanes)."""
    total: ir.Value | None = None
    for coefficient, value in zip(coefficients, values):
        if coefficient == 0:
            continue
        if abs(coefficient) == 1:
            term = value
        else:
            factor = F32(float(abs(coefficient)))
            lanes = value.type.count if isinstance(value.type, ir.VectorType) else 0
            term = b.fmul(value, _splat(b, factor, lanes) if lanes else factor)
        if total is None:
            total = term if coefficient > 0 else b.fneg(term)
        else:
            total = b.fadd(total, term) if coefficient > 0 else b.fsub(total, term)
    assert total is not None
    return total


def _picked(b: ir.IRBuilder, wide: ir.Value, lanes: int, stride: int, first: int) -> ir.Value:
    """Lanes ``first, first + stride, ...`` of ``wide``: a vector of ``lanes``."""
    picks = ir.Constant(ir.VectorType(I32, lanes), [first + stride * i for i in range(lanes)])
    return b.shuffle_vector(wide, ir.Constant(wide.type, ir.Undefined), picks)


def _interleaved(b: ir.IRBuilder, vectors: list[ir.Value]) -> ir.Value:
    """One vector of ``len(vectors) * L`` lanes: lane ``l * len(vectors) + j`` from lane ``l``
    of ``vectors[j]`` (each of ``L`` lanes; their count a power of two)."""
    lanes, parts = vectors[0].type.count, list(vectors)
    while len(parts) > 1:  # concatenate pairwise, then one shuffle puts the lanes in order
        width = parts[0].type.count
        parts = [b.shuffle_vector(parts[i], parts[i + 1], ir.Constant(ir.VectorType(I32, 2 * width),
                                                                    list(range(2 * width))))
                 for i in range(0, len(parts), 2)]
    whole, count = parts[0], len(vectors)
    order = [j * lanes + lane for lane in range(lanes) for j in range(count)]
    return b.shuffle_vector(whole, ir.Constant(whole.type, ir.Undefined), ir.Constant(ir.VectorType(I32, len(order)),
                                                                                       order))


def _by_steps(b: ir.IRBuilder, tw: ir.Value, widths: tuple[int, ...], step: Callable[[int, ir.Value], None],
              scalar: Callable[[ir.Value], None] | None) -> None:
    """A row of ``tw`` tiles: ``widths[0]`` tiles a step where the row has that many, else the
    next width, ...; a row narrower than the last width one tile at a time (``scalar``; None:
    no such row comes, :func:`winograd_fits`). The last step
    ends at ``tw``, overlapping the one before (tiles are independent: the overlap writes the
    same values again), so each width's step is emitted once."""
    def by(lanes: int) -> None:
        steps = b.sdiv(b.add(tw, I64(lanes - 1)), I64(lanes))
        _loop(b, I64(0), steps, lambda i: step(lanes, _smin(b, b.mul(i, I64(lanes)), b.sub(tw, I64(lanes)))))

    def widest(options: tuple[int, ...]) -> None:
        if not options:
            if scalar is not None:
                _loop(b, I64(0), tw, scalar)
            return
        with b.if_else(b.icmp_signed(">=", tw, I64(options[0]))) as (enough, fewer):
            with enough:
                by(options[0])
            with fewer:
                widest(options[1:])
    widest(widths)


def _row_in(module: ir.Module, m: int) -> ir.Function:
    """One row of tiles in: ``in(p, v, tw, wp, v_stride)`` transforms the ``m + 2`` padded image
    rows at ``p`` into ``v[e * v_stride + tx]``."""
    bt = winograd_matrices(m)[0]
    a = m + 2
    row_in, b = _internal(module, f"{phase_routine(m, 'in')}_row", [PTR, PTR, I64, I64, I64], (0, 1))
    p, v, tw, wp, v_stride = row_in.args

    def transform(rows: list[list[ir.Value]], tx: ir.Value) -> None:
        t = [[_combine(b, bt[r], [rows[i][j] for i in range(a)]) for j in range(a)] for r in range(a)]
        for r in range(a):
            for col in range(a):
                b.store(_combine(b, bt[col], t[r]), _elem(b, v, b.add(b.mul(I64(r * a + col), v_stride), tx)),
                        align=4)

    def tile_in(tx: ir.Value) -> None:
        left = _elem(b, p, b.mul(tx, I64(m)))
        transform([[b.load(_elem(b, left, b.add(b.mul(I64(i), wp), I64(j))), typ=F32) for j in range(a)]
                   for i in range(a)], tx)

    # L tiles at once: tile tx + l's column j is at m (tx + l) + j of a padded row: lane
    # m l + j of an m L-float load at m tx (columns j < m), lane m l + j - 2 of one at
    # m tx + 2 (columns m, m + 1). The last read, m (tx + L) + 1, is inside the padded row of
    # m tw + 2 floats while tx + L <= tw.
    def gathered(lanes: int, tx: ir.Value) -> None:
        wide = ir.VectorType(F32, m * lanes)
        left = _elem(b, p, b.mul(tx, I64(m)))
        rows = []
        for i in range(a):
            line = _elem(b, left, b.mul(I64(i), wp))
            loads = [b.load(_elem(b, line, I64(shift)), typ=wide, align=4) for shift in (0, 2)]
            rows.append([_picked(b, loads[0], lanes, m, j) if j < m else _picked(b, loads[1], lanes, m, j - 2)
                         for j in range(a)])
        transform(rows, tx)

    _by_steps(b, tw, TILE_LANES[m], gathered, tile_in if m == 2 else None)
    b.ret_void()
    return row_in


def _row_out(module: ir.Module, m: int) -> ir.Function:
    """One row of tiles out: ``out(m, o, tw, o_row, m_stride, bias, lo, hi)`` turns
    ``m[e * m_stride + tx]`` into ``m`` output rows at ``o``."""
    at = winograd_matrices(m)[2]
    a = m + 2
    row_out, b = _internal(module, f"{phase_routine(m, 'out')}_row", [PTR, PTR, I64, I64, I64, F32, F32, F32], (0, 1))
    m_row, o, tw, o_row, m_stride, beta, lo, hi = row_out.args

    def tile_out(tx: ir.Value) -> None:
        tile = [[b.load(_elem(b, m_row, b.add(b.mul(I64(r * a + col), m_stride), tx)), typ=F32)
                 for col in range(a)] for r in range(a)]
        s = [[_combine(b, at[i], [tile[r][j] for r in range(a)]) for j in range(a)] for i in range(m)]
        corner = _elem(b, o, b.mul(tx, I64(m)))
        for i in range(m):
            for j in range(m):
                value = b.fadd(_combine(b, at[j], s[i]), beta)
                b.store(_bounded(b, value, lo, hi), _elem(b, corner, b.add(b.mul(I64(i), o_row), I64(j))))

    # L tiles at once (m = 4): each plane's L values are contiguous; an output row's m vectors
    # of L tiles interleave into the m L floats it stores from m tx (the last, m (tx + L) - 1,
    # inside the row of m tw floats while tx + L <= tw)
    def vectors_out(lanes: int, tx: ir.Value) -> None:
        vector = ir.VectorType(F32, lanes)
        tile = [[b.load(_elem(b, m_row, b.add(b.mul(I64(r * a + col), m_stride), tx)), typ=vector, align=4)
                 for col in range(a)] for r in range(a)]
        s = [[_combine(b, at[i], [tile[r][j] for r in range(a)]) for j in range(a)] for i in range(m)]
        shift, low, high = (_splat(b, value, lanes) for value in (beta, lo, hi))
        corner = _elem(b, o, b.mul(tx, I64(m)))
        for i in range(m):
            outs = [_bounded(b, b.fadd(_combine(b, at[j], s[i]), shift), low, high) for j in range(m)]
            b.store(_interleaved(b, outs), b.bitcast(_elem(b, corner, b.mul(I64(i), o_row)),
                                                    ir.VectorType(F32, m * lanes).as_pointer()), align=4)

    _by_steps(b, tw, TILE_LANES[m], vectors_out, tile_out if m == 2 else None)
    b.ret_void()
    return row_out


class _WinogradLayout:
    """Tiles, strides and the workspace's regions of one image (see :func:`winograd_workspace`):
    V (then the whole output tiles), and the padded image (then M)."""

    def __init__(self, b: ir.IRBuilder, d: dict[str, ir.Value], work: ir.Value, m: int) -> None:
        self.m = m
        a = m + 2
        self.th = b.sdiv(b.add(d["oh"], I64(m - 1)), I64(m))
        self.tw = b.sdiv(b.add(d["ow"], I64(m - 1)), I64(m))
        self.tiles = b.mul(self.th, self.tw)
        self.row = b.mul(d["n"], self.tiles)  # a plane's row: the tiles of every image
        self.first = b.mul(d["image"], self.tiles)  # where this image's tiles start in a row
        self.hp, self.wp = b.add(b.mul(self.th, I64(m)), I64(2)), b.add(b.mul(self.tw, I64(m)), I64(2))
        self.plane, self.out_plane = b.mul(d["h"], d["w"]), b.mul(d["oh"], d["ow"])
        self.padded_plane = b.mul(self.hp, self.wp)
        skew = I64(WINOGRAD_SKEW)  # (the layout of winograd_plan)
        self.v_stride, self.m_stride = b.add(b.mul(d["c"], self.row), skew), b.add(b.mul(d["k"], self.row), skew)
        self.v_base = self.o_base = work  # the output tiles once V is read
        self.m_base = self.p_base = _elem(b, work, _smax(b, b.mul(I64(a * a), self.v_stride),
                                                         b.mul(I64(m * m), b.mul(d["k"], self.tiles))))
        self.direct = b.and_(b.icmp_signed("==", b.srem(d["oh"], I64(m)), I64(0)),
                             b.icmp_signed("==", b.srem(d["ow"], I64(m)), I64(0)))
        self.o_row = b.select(self.direct, d["ow"], b.mul(self.tw, I64(m)))


def _winograd_in(b: ir.IRBuilder, module: ir.Module, row_in: ir.Function, d: dict[str, ir.Value],
                 lay: _WinogradLayout, xn: ir.Value, first: ir.Value, last: ir.Value) -> None:
    """Channels ``[first, last)`` of one image: zero-padded to whole tiles, then ``V = Bᵀ d B``."""
    def channel(c: ir.Value) -> None:
        pc = _elem(b, lay.p_base, b.mul(c, lay.padded_plane))
        _pad_plane(b, module, _elem(b, xn, b.mul(c, lay.plane)), pc, d["h"], d["w"], d["pt"], d["pl"],
                   lay.hp, lay.wp)

        def tile_row(ty: ir.Value) -> None:
            top = _elem(b, pc, b.mul(b.mul(ty, I64(lay.m)), lay.wp))
            v = _elem(b, lay.v_base, b.add(b.add(b.mul(c, lay.row), lay.first), b.mul(ty, lay.tw)))
            b.call(row_in, [top, v, lay.tw, lay.wp, lay.v_stride])
        _loop(b, I64(0), lay.th, tile_row)
    _loop(b, first, last, channel)


def _winograd_out(b: ir.IRBuilder, module: ir.Module, row_out: ir.Function, d: dict[str, ir.Value],
                  lay: _WinogradLayout, yn: ir.Value, bias: ir.Value, first: ir.Value, last: ir.Value) -> None:
    """Output channels ``[first, last)`` of one image: each ``M`` tile becomes ``Aᵀ m A`` (+ bias)."""
    has_bias = b.icmp_signed("!=", d["has_bias"], I64(0))
    lo, hi = _float_bits(b, d["lo"]), _float_bits(b, d["hi"])

    def out_channel(k: ir.Value) -> None:
        beta = _load_if(b, has_bias, lambda: _elem(b, bias, k), F32(0.0))
        yk = _elem(b, yn, b.mul(k, lay.out_plane))
        dst = b.select(lay.direct, yk, _elem(b, lay.o_base, b.mul(k, b.mul(lay.tiles, I64(lay.m * lay.m)))))

        def tile_row(ty: ir.Value) -> None:
            first_tile = _elem(b, lay.m_base, b.add(b.add(b.mul(k, lay.row), lay.first), b.mul(ty, lay.tw)))
            b.call(row_out, [first_tile, _elem(b, dst, b.mul(b.mul(ty, I64(lay.m)), lay.o_row)), lay.tw, lay.o_row,
                             lay.m_stride, beta, lo, hi])
        _loop(b, I64(0), lay.th, tile_row)

        def crop() -> None:
            def row(r: ir.Value) -> None:
                b.call(module.declare_intrinsic("llvm.memcpy", [PTR, PTR, I64]),
                       [_elem(b, yk, b.mul(r, d["ow"])), _elem(b, dst, b.mul(r, lay.o_row)),
                        b.mul(d["ow"], I64(4)), ir.IntType(1)(0)])
            _loop(b, I64(0), d["oh"], row)
        _if(b, b.not_(lay.direct), crop)
    _loop(b, first, last, out_channel)


def _winograd_phases(module: ir.Module, phases: tuple[str, ...] = ("in", "out"), m: int = 2) -> None:
    """The phases of F(m x m, 3x3) (``phases``: which to build here; see the module doc):
    :func:`phase_routine` ``(m, "in")`` (args ``[x, work]``: task ``task`` of ``tasks`` pads
    and transforms its share of one image's channels into V) and ``(m, "out")`` (args ``[work,
    y, bias]``: its share of the output channels from M); dims :data:`WINOGRAD_TASK_DIMS`,
    ``n`` is 1."""
    for phase in phases:
        b, args, dims = _define(module, phase_routine(m, phase))
        d = {name: _arg(b, dims, i, I64) for i, name in enumerate(WINOGRAD_TASK_DIMS)}
        if phase == "in":
            x, work = _arg(b, args, 0, PTR), _arg(b, args, 1, PTR)
            first, last = _share(b, d["c"], d)
            _winograd_in(b, module, _row_in(module, m), d, _WinogradLayout(b, d, work, m), x, first, last)
        else:
            work, y, bias = (_arg(b, args, i, PTR) for i in range(3))
            first, last = _share(b, d["k"], d)
            _winograd_out(b, module, _row_out(module, m), d, _WinogradLayout(b, d, work, m), y, bias, first, last)
        b.ret_void()


__all__ = ["TILE_LANES", "WINOGRAD_DIMS", "WINOGRAD_SIZES", "WINOGRAD_SKEW", "WINOGRAD_TASK_DIMS", "WinogradPlan",
           "phase_routine", "winograd_fits", "winograd_matrices", "winograd_plan", "winograd_workspace"]
