"""Winograd F(m x m, 3x3) on pixel-major values: the transforms vectorized along the channels.

:mod:`.native_winograd` transforms NCHW planes a vector of tiles at a time and lays V out
``[a², C, tiles]``; our products take the tiles as their rows (``md_gemm``), so each of the
``a²`` planes was transposed before its product (ResNet-50: 36 transposes a conv) and the output
transform read M back as ``[a², K, tiles]``. Between pixel-major values
(:class:`metadef.backends.x86.native.PixelRows`: each pixel's channels one row) the transforms
take a vector of channels at a time instead, and V and M are laid out as the products read and
write them:

- ``md_winograd_rows_in`` / ``md_winograd4_rows_in``: each ``a x a`` input tile (zeros outside
  the image, past the pads ``pt`` and ``pl``) becomes ``V = Bᵀ d B``, stored as row ``t`` (the
  tile) of each plane ``e``: ``v[e * v_plane + t * ldv + c]``; the products' ``x``, read in
  place.
- ``md_winograd_rows_out`` / ``md_winograd4_rows_out``: ``m[e * m_plane + t * ldm + k]`` (the
  products' output rows) becomes the ``m x m`` pixels ``Aᵀ M A`` + bias, bounded to ``[lo,
  hi]``, stored pixel-major (``ldy`` floats a pixel), those past the output's edge left out.

Tiles run over all ``n`` images (tile ``t``: image ``t // tiles``), shared out among the tasks;
each tile goes through its channels ``L`` at a time (:func:`.native_tile.tile_lanes`), so ``c``
and ``k`` must be multiples of ``L``. A tile's pixels outside the image are read at a pixel
inside and zeroed (a select a vector), its outputs past the output's edge skipped: one path
for every tile (a second, unchecked one for the tiles inside measured ~10 % faster on 56x56
planes, for 70 ms more of LLVM).

Example:
    >>> rows_routine(2, "in"), rows_routine(4, "out")
    ('md_winograd_rows_in', 'md_winograd4_rows_out')
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from metadef.codegen.native_ir import (
    F32,
    I64,
    PTR,
    _arg,
    _bounded,
    _define,
    _elem,
    _float_bits,
    _if,
    _loop,
    _share,
    _splat,
)
from metadef.codegen.native_tile import tile_lanes
from metadef.codegen.native_winograd import WINOGRAD_SIZES, _combine, winograd_matrices

WINOGRAD_ROWS_DIMS = ("n", "c", "h", "w", "k", "oh", "ow", "pt", "pl", "ldx", "ldv", "v_plane", "ldm", "m_plane",
                      "ldy", "lo", "hi", "task", "tasks")
"""The dims of both phases: ``n`` images of ``c`` channels, ``h x w`` in (rows of ``ldx``
floats), ``k`` channels ``oh x ow`` out (rows of ``ldy``), the pads before each axis; V's rows
``ldv`` floats and its planes ``v_plane`` apart, M's ``ldm`` and ``m_plane``; ``lo`` and ``hi``
(float32 bits) bound the output; task ``task`` of ``tasks`` takes its share of the tiles."""


def rows_routine(m: int, phase: str) -> str:
    """The routine of a phase (``"in"`` or ``"out"``) of F(m x m, 3x3) on pixel-major values.

    Example:
        >>> rows_routine(4, "in")
        'md_winograd4_rows_in'
    """
    return f"md_winograd{'' if m == 2 else m}_rows_{phase}"


WINOGRAD_ROWS_ROUTINES = tuple(rows_routine(m, phase) for m in WINOGRAD_SIZES for phase in ("in", "out"))


def _grid(b: ir.IRBuilder, d: dict[str, ir.Value], m: int) -> tuple[ir.Value, ir.Value]:
    """The tiles of a row of one image's output, and of the whole image."""
    tw = b.sdiv(b.add(d["ow"], I64(m - 1)), I64(m))
    return tw, b.mul(b.sdiv(b.add(d["oh"], I64(m - 1)), I64(m)), tw)


class _Tile:
    """Tile ``t`` of all images' tiles: its image, and its first output pixel's row and column."""

    def __init__(self, b: ir.IRBuilder, d: dict[str, ir.Value], m: int, t: ir.Value) -> None:
        tw, tiles = _grid(b, d, m)
        self.image, within = b.sdiv(t, tiles), b.srem(t, tiles)
        self.y0, self.x0 = b.mul(b.sdiv(within, tw), I64(m)), b.mul(b.srem(within, tw), I64(m))


def _tile_count(b: ir.IRBuilder, d: dict[str, ir.Value], m: int) -> ir.Value:
    return b.mul(d["n"], _grid(b, d, m)[1])


def _inside(b: ir.IRBuilder, first: ir.Value, count: int, extent: ir.Value) -> ir.Value:
    """``0 <= first`` and ``first + count <= extent``."""
    return b.and_(b.icmp_signed(">=", first, I64(0)), b.icmp_signed("<=", b.add(first, I64(count)), extent))


def _channels(b: ir.IRBuilder, count: ir.Value, lanes: int, body: Callable[[ir.Value], None]) -> None:
    """``body(c0)`` for ``c0 = 0, lanes, ...`` below ``count`` (a multiple of ``lanes``)."""
    _loop(b, I64(0), b.sdiv(count, I64(lanes)), lambda i: body(b.mul(i, I64(lanes))))


def _rows_in(module: ir.Module, m: int) -> None:
    bt, a, lanes = winograd_matrices(m)[0], m + 2, tile_lanes()
    vector = ir.VectorType(F32, lanes)
    zero = ir.Constant(vector, [0.0] * lanes)
    b, args, dims = _define(module, rows_routine(m, "in"))
    d = {name: _arg(b, dims, i, I64) for i, name in enumerate(WINOGRAD_ROWS_DIMS)}
    x, v = _arg(b, args, 0, PTR), _arg(b, args, 1, PTR)
    first, last = _share(b, _tile_count(b, d, m), d)

    def transform(pixels: list[list[ir.Value]], row: ir.Value, c0: ir.Value) -> None:
        t = [[_combine(b, bt[r], [pixels[i][j] for i in range(a)]) for j in range(a)] for r in range(a)]
        for r in range(a):
            for col in range(a):
                at = b.add(b.mul(I64(r * a + col), d["v_plane"]), c0)
                b.store(_combine(b, bt[col], t[r]), b.bitcast(_elem(b, row, at), vector.as_pointer()), align=4)

    def tile(t: ir.Value) -> None:
        where = _Tile(b, d, m, t)
        top, left = b.sub(where.y0, d["pt"]), b.sub(where.x0, d["pl"])
        image = _elem(b, x, b.mul(where.image, b.mul(b.mul(d["h"], d["w"]), d["ldx"])))
        row = _elem(b, v, b.mul(t, d["ldv"]))
        # rows and columns clamped into the image, their values zero where outside
        ys, xs = [b.add(top, I64(i)) for i in range(a)], [b.add(left, I64(j)) for j in range(a)]
        y_in, x_in = [_inside(b, y, 1, d["h"]) for y in ys], [_inside(b, x_, 1, d["w"]) for x_ in xs]
        ys = [b.select(ok, y, I64(0)) for ok, y in zip(y_in, ys)]
        xs = [b.select(ok, x_, I64(0)) for ok, x_ in zip(x_in, xs)]
        steps = [[b.mul(b.add(b.mul(ys[i], d["w"]), xs[j]), d["ldx"]) for j in range(a)] for i in range(a)]
        keep = [[b.and_(y_in[i], x_in[j]) for j in range(a)] for i in range(a)]

        def channels(c0: ir.Value) -> None:
            at = _elem(b, image, c0)
            transform([[b.select(keep[i][j], b.load(b.bitcast(_elem(b, at, steps[i][j]), vector.as_pointer()),
                                                    typ=vector, align=4), zero)
                        for j in range(a)] for i in range(a)], row, c0)
        _channels(b, d["c"], lanes, channels)

    _loop(b, first, last, tile)
    b.ret_void()


def _rows_out(module: ir.Module, m: int) -> None:
    at_, a, lanes = winograd_matrices(m)[2], m + 2, tile_lanes()
    vector = ir.VectorType(F32, lanes)
    b, args, dims = _define(module, rows_routine(m, "out"))
    d = {name: _arg(b, dims, i, I64) for i, name in enumerate(WINOGRAD_ROWS_DIMS)}
    mm, y, bias = (_arg(b, args, i, PTR) for i in range(3))
    low, high = (_splat(b, _float_bits(b, d[name]), lanes) for name in ("lo", "hi"))
    first, last = _share(b, _tile_count(b, d, m), d)

    def tile(t: ir.Value) -> None:
        where = _Tile(b, d, m, t)
        row = _elem(b, mm, b.mul(t, d["ldm"]))
        image = _elem(b, y, b.mul(where.image, b.mul(b.mul(d["oh"], d["ow"]), d["ldy"])))
        corner = _elem(b, image, b.mul(b.add(b.mul(where.y0, d["ow"]), where.x0), d["ldy"]))
        steps = [[b.mul(b.add(b.mul(I64(i), d["ow"]), I64(j)), d["ldy"]) for j in range(m)] for i in range(m)]

        def pixels(k0: ir.Value) -> list[list[ir.Value]]:
            tile_m = [[b.load(b.bitcast(_elem(b, row, b.add(b.mul(I64(r * a + col), d["m_plane"]), k0)),
                                        vector.as_pointer()), typ=vector, align=4) for col in range(a)]
                      for r in range(a)]
            s = [[_combine(b, at_[i], [tile_m[r][j] for r in range(a)]) for j in range(a)] for i in range(m)]
            beta = b.load(b.bitcast(_elem(b, bias, k0), vector.as_pointer()), typ=vector, align=4)
            return [[_bounded(b, b.fadd(_combine(b, at_[j], s[i]), beta), low, high) for j in range(m)]
                    for i in range(m)]

        def store(value: ir.Value, i: int, j: int, k0: ir.Value) -> None:
            b.store(value, b.bitcast(_elem(b, corner, b.add(steps[i][j], k0)), vector.as_pointer()), align=4)

        # (the pixels past the output's last row or column left out)
        fits = [[b.and_(b.icmp_signed("<", b.add(where.y0, I64(i)), d["oh"]),
                        b.icmp_signed("<", b.add(where.x0, I64(j)), d["ow"])) for j in range(m)] for i in range(m)]

        def channels(k0: ir.Value) -> None:
            out = pixels(k0)
            for i in range(m):
                for j in range(m):
                    _if(b, fits[i][j], lambda i=i, j=j: store(out[i][j], i, j, k0))
        _channels(b, d["k"], lanes, channels)

    _loop(b, first, last, tile)
    b.ret_void()


def winograd_rows_phase(module: ir.Module, name: str) -> None:
    """Build routine ``name`` (one of :data:`WINOGRAD_ROWS_ROUTINES`) into ``module``: args ``[x,
    v]`` for an input phase, ``[m, y, bias]`` for an output phase (``bias``: ``k`` floats,
    zeros for none); dims :data:`WINOGRAD_ROWS_DIMS`.

    Example:
        >>> module = ir.Module("m")
        >>> winograd_rows_phase(module, "md_winograd4_rows_out")
        >>> [f.name for f in module.functions if not f.is_declaration]
        ['md_winograd4_rows_out']
    """
    for m in WINOGRAD_SIZES:
        if name == rows_routine(m, "in"):
            return _rows_in(module, m)
        if name == rows_routine(m, "out"):
            return _rows_out(module, m)
    raise ValueError(f"no Winograd pixel-rows routine {name!r}")


__all__ = ["WINOGRAD_ROWS_DIMS", "WINOGRAD_ROWS_ROUTINES", "rows_routine", "winograd_rows_phase"]
