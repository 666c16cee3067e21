"""The native convolution routines (see :mod:`.native`): im2col + sgemm, Winograd F(2x2, 3x3),
col2im (ConvTranspose's scatter of sgemm's columns), and the zero padding the generated
depthwise kernels read.

Example:
    >>> winograd_workspace(64, 64, 56, 56) > 0
    True
"""

from __future__ import annotations

from typing import NamedTuple

from llvmlite import ir

from metadef.codegen.native_ir import (
    _SGEMM,
    CBLAS_NO_TRANS,
    CBLAS_ROW_MAJOR,
    F32,
    I32,
    I64,
    PTR,
    _arg,
    _bounded,
    _Callee,
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
    _zero,
)

CONV2D_DIMS = ("n", "c", "h", "w", "k", "oh", "ow", "kh", "kw", "sh", "sw", "dh", "dw", "pt", "pl",
               "group", "has_bias")
"""The dims of ``md_conv2d``: args are ``[x, w, y, workspace, cblas_sgemm, bias]``."""

WINOGRAD_DIMS = ("n", "c", "h", "w", "k", "oh", "ow", "pt", "pl", "has_bias", "lo", "hi")
"""The shape dims of a Winograd F(2x2, 3x3) conv (see :data:`WINOGRAD_TASK_DIMS`); its
workspace is :func:`winograd_workspace` floats and its weights ``u`` are transformed, ``[16, K, C]``;
``lo`` and ``hi`` (float32 bits) bound the output (Relu, Clip), as the output transform stores it."""

WINOGRAD_TASK_DIMS = (*WINOGRAD_DIMS, "task", "tasks")
"""The dims of ``md_winograd_in`` and ``md_winograd_out`` (one image: ``n`` is 1)."""

IM2COL_DIMS = ("c", "h", "w", "oh", "ow", "kh", "kw", "sh", "sw", "dh", "dw", "pt", "pl", "y0", "task", "tasks")
"""The dims of ``md_im2col_task``: args are ``[x, col]``; the columns of output rows ``[y0, y0 +
oh)`` (a band of the image: 0 and all its rows for the whole); task ``task`` of ``tasks`` fills
the rows of its share of the channels (one image, one group)."""

PAD2D_DIMS = ("planes", "h", "w", "pt", "pl", "hp", "wp", "task", "tasks")
"""The dims of ``md_pad2d``: args are ``[x, padded]``; task ``task`` of ``tasks`` pads its share
of the planes."""


GATHER_LANES = 16
"""Outputs a step of im2col's stride-2 rows: two 16-float loads, their even lanes kept."""


def _lanes_of(b: ir.IRBuilder, pair: ir.Value, odd: bool) -> ir.Value:
    """The even (or odd) lanes of ``pair``, a vector of ``2 L`` floats: a vector of ``L``."""
    lanes = pair.type.count // 2
    picks = ir.Constant(ir.VectorType(I32, lanes), [2 * i + int(odd) for i in range(lanes)])
    return b.shuffle_vector(pair, ir.Constant(pair.type, ir.Undefined), picks)


def _strided_row(b: ir.IRBuilder, module: ir.Module, src: ir.Value, dst: ir.Value, lo: ir.Value, hi: ir.Value,
                 sw: ir.Value) -> None:
    """``dst[q] = src[q * sw]`` for ``q`` in ``[lo, hi)``: a memcpy at stride 1; at stride 2
    (strided convs, the stems) :data:`GATHER_LANES` outputs a step from one 32-float load, the
    even lanes shuffled out, while the load stays inside the row (its last lane is at most
    ``src[2 hi - 3]``), then one by one; other strides one by one."""
    one, two = b.icmp_signed("==", sw, I64(1)), b.icmp_signed("==", sw, I64(2))
    n = GATHER_LANES
    wide = ir.VectorType(F32, 2 * n)

    def scalar(start: ir.Value) -> None:
        def copy(q: ir.Value) -> None:
            b.store(b.load(_elem(b, src, b.mul(q, sw)), typ=F32), _elem(b, dst, q))
        _loop(b, start, hi, copy)

    with b.if_else(one) as (contiguous, strided):
        with contiguous:
            b.call(module.declare_intrinsic("llvm.memcpy", [PTR, PTR, I64]),
                   [_elem(b, dst, lo), _elem(b, src, lo), b.mul(b.sub(hi, lo), I64(4)), ir.IntType(1)(0)])
        with strided:
            # whole steps while q + n < hi (so 2 (q + n) - 1 <= 2 hi - 3 is read, inside the row)
            steps = b.select(two, b.sdiv(_smax(b, b.sub(b.sub(hi, lo), I64(1)), I64(0)), I64(n)), I64(0))

            def step(i: ir.Value) -> None:
                q = b.add(lo, b.mul(i, I64(n)))
                pair = b.load(_elem(b, src, b.mul(q, I64(2))), typ=wide, align=4)
                b.store(_lanes_of(b, pair, odd=False), _elem(b, dst, q), align=4)
            _loop(b, I64(0), steps, step)
            scalar(b.add(lo, b.mul(steps, I64(n))))


def _im2col(module: ir.Module) -> ir.Function:
    """``col[(c*kh + r)*kw + s, y*ow + x] = X[c, (y0 + y)*sh - pt + r*dh, x*sw - pl + s*dw]`` (0
    outside) for the ``oh`` output rows from ``y0``."""
    names = ("cg", "h", "w", "oh", "ow", "kh", "kw", "sh", "sw", "dh", "dw", "pt", "pl", "y0")
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, PTR, *(I64 for _ in names)]), "md_im2col")
    fn.linkage = "internal"
    fn.args[0].add_attribute("noalias")
    fn.args[1].add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    x, col = fn.args[0], fn.args[1]
    d = dict(zip(names, fn.args[2:]))
    pixels = b.mul(d["oh"], d["ow"])
    plane = b.mul(d["h"], d["w"])

    def channel(c: ir.Value) -> None:
        xc = _elem(b, x, b.mul(c, plane))

        def tap_row(r: ir.Value) -> None:
            def tap(s: ir.Value) -> None:
                row = b.add(b.mul(b.add(b.mul(c, d["kh"]), r), d["kw"]), s)
                shift = b.sub(b.mul(s, d["dw"]), d["pl"])  # iw = x*sw + shift
                # lo: the first x with x*sw + shift >= 0; hi: one past the last with < w
                need = b.sub(I64(0), shift)
                lo = b.select(b.icmp_signed("<=", need, I64(0)), I64(0),
                              b.sdiv(b.add(need, b.sub(d["sw"], I64(1))), d["sw"]))
                lo = _smin(b, lo, d["ow"])
                top = b.sub(b.sub(d["w"], I64(1)), shift)
                hi = b.select(b.icmp_signed("<", top, I64(0)), I64(0), b.add(b.sdiv(top, d["sw"]), I64(1)))
                hi = _smax(b, _smin(b, hi, d["ow"]), lo)
                base = _elem(b, col, b.mul(row, pixels))

                def out_row(y: ir.Value) -> None:
                    ih = b.add(b.sub(b.mul(b.add(y, d["y0"]), d["sh"]), d["pt"]), b.mul(r, d["dh"]))
                    dst = _elem(b, base, b.mul(y, d["ow"]))
                    inside = b.and_(b.icmp_signed(">=", ih, I64(0)), b.icmp_signed("<", ih, d["h"]))
                    with b.if_else(inside) as (then, otherwise):
                        with then:
                            src = _elem(b, xc, b.add(b.mul(ih, d["w"]), shift))
                            _zero(b, module, dst, I64(0), lo)

                            _strided_row(b, module, src, dst, lo, hi, d["sw"])
                            _zero(b, module, dst, hi, d["ow"])
                        with otherwise:
                            _zero(b, module, dst, I64(0), d["ow"])

                _loop(b, I64(0), d["oh"], out_row)
            _loop(b, I64(0), d["kw"], tap)
        _loop(b, I64(0), d["kh"], tap_row)

    _loop(b, I64(0), d["cg"], channel)
    b.ret_void()
    return fn


def _im2col_task(module: ir.Module) -> None:
    """``md_im2col_task``: the im2col of one image, channels ``[c*t/T, c*(t+1)/T)`` (so that the
    tasks of a parallel group fill disjoint rows of the columns)."""
    im2col = _im2col(module)
    b, args, dims = _define(module, "md_im2col_task")
    x, col = _arg(b, args, 0, PTR), _arg(b, args, 1, PTR)
    d = {name: _arg(b, dims, i, I64) for i, name in enumerate(IM2COL_DIMS)}
    first = b.sdiv(b.mul(d["c"], d["task"]), d["tasks"])
    last = b.sdiv(b.mul(d["c"], b.add(d["task"], I64(1))), d["tasks"])
    rows = b.mul(first, b.mul(b.mul(d["kh"], d["kw"]), b.mul(d["oh"], d["ow"])))
    b.call(im2col, [_elem(b, x, b.mul(first, b.mul(d["h"], d["w"]))), _elem(b, col, rows), b.sub(last, first),
                    *(d[k] for k in ("h", "w", "oh", "ow", "kh", "kw", "sh", "sw", "dh", "dw", "pt", "pl", "y0"))])
    b.ret_void()


def _conv2d(module: ir.Module, im2col: ir.Function) -> None:
    b, args, dims = _define(module, "md_conv2d")
    x, w, y, work, fn, bias = (_arg(b, args, i, PTR) for i in range(6))
    d = {name: _arg(b, dims, i, I64) for i, name in enumerate(CONV2D_DIMS)}
    callee = _Callee(fn, _SGEMM)
    cg = b.sdiv(d["c"], d["group"])
    kg = b.sdiv(d["k"], d["group"])
    taps = b.mul(d["kh"], d["kw"])
    depth = b.mul(cg, taps)
    pixels = b.mul(d["oh"], d["ow"])
    plane = b.mul(d["h"], d["w"])
    ones = [b.icmp_signed("==", d[k], I64(1)) for k in ("kh", "kw", "sh", "sw")]
    zeros = [b.icmp_signed("==", d[k], I64(0)) for k in ("pt", "pl")]
    direct = ones[0]
    for flag in [*ones[1:], *zeros]:
        direct = b.and_(direct, flag)
    has_bias = b.icmp_signed("!=", d["has_bias"], I64(0))

    def image(n: ir.Value) -> None:
        def group(g: ir.Value) -> None:
            xg = _elem(b, x, b.mul(b.add(b.mul(n, d["c"]), b.mul(g, cg)), plane))
            yg = _elem(b, y, b.mul(b.add(b.mul(n, d["k"]), b.mul(g, kg)), pixels))
            with b.if_then(b.not_(direct)):
                b.call(im2col, [xg, work, cg, d["h"], d["w"], d["oh"], d["ow"], d["kh"], d["kw"],
                                d["sh"], d["sw"], d["dh"], d["dw"], d["pt"], d["pl"], I64(0)])
            cols = b.select(direct, xg, work)

            def fill() -> None:
                def channel(k: ir.Value) -> None:
                    value = b.load(_elem(b, bias, b.add(b.mul(g, kg), k)), typ=F32)
                    row = _elem(b, yg, b.mul(k, pixels))

                    def pixel(p: ir.Value) -> None:
                        b.store(value, _elem(b, row, p))
                    _loop(b, I64(0), pixels, pixel)
                _loop(b, I64(0), kg, channel)

            _if(b, has_bias, fill)
            b.call(callee, [I32(CBLAS_ROW_MAJOR), I32(CBLAS_NO_TRANS), I32(CBLAS_NO_TRANS), kg, pixels, depth,
                            F32(1.0), _elem(b, w, b.mul(b.mul(g, kg), depth)), depth, cols, pixels,
                            b.select(has_bias, F32(1.0), F32(0.0)), yg, pixels])
        _loop(b, I64(0), d["group"], group)

    _loop(b, I64(0), d["n"], image)
    b.ret_void()


COL2IM_DIMS = ("c", "kh", "kw", "h", "w", "oh", "ow", "sh", "sw", "dh", "dw", "bh", "bw", "has_bias",
               "task", "tasks")
"""The dims of ``md_col2im(cols, bias, y)``: ``cols`` is ``[c, kh, kw, h, w]`` (ConvTranspose's
``W^T X`` for one image), ``y`` ``[c, oh, ow]``: ``y[c, iy*sh + ki*dh - bh, ix*sw + kj*dw - bw]``
sums ``cols[c, ki, kj, iy, ix]`` over the taps that land inside, plus ``bias[c]`` when
``has_bias``. Task ``task`` of ``tasks`` does its share of the channels."""


def _col2im(module: ir.Module) -> None:
    b, args, dims = _define(module, "md_col2im")
    cols, bias, y = (_arg(b, args, i, PTR) for i in range(3))
    d = {name: _arg(b, dims, i, I64) for i, name in enumerate(COL2IM_DIMS)}
    plane, taps = b.mul(d["oh"], d["ow"]), b.mul(d["kh"], d["kw"])
    pixels = b.mul(d["h"], d["w"])
    first, last = _share(b, d["c"], d)

    def bounds(k: ir.Value, dil: str, begin: str, stride: str, size: str, out: str) -> tuple[ir.Value, ir.Value]:
        """The inputs ``i`` in ``[lo, hi)`` whose ``i*stride + k*dil - begin`` lies in ``[0, out)``."""
        off = b.sub(b.mul(k, d[dil]), d[begin])
        need = b.sub(I64(0), off)  # i*stride >= -off
        lo = b.select(b.icmp_signed("<=", need, I64(0)), I64(0),
                      b.sdiv(b.add(need, b.sub(d[stride], I64(1))), d[stride]))
        room = b.sub(b.sub(d[out], I64(1)), off)  # i*stride <= out - 1 - off
        hi = b.select(b.icmp_signed("<", room, I64(0)), I64(0), b.add(b.sdiv(room, d[stride]), I64(1)))
        return lo, _smax(b, lo, _smin(b, hi, d[size]))

    def channel(c: ir.Value) -> None:
        yc = _elem(b, y, b.mul(c, plane))
        start = _load_if(b, b.icmp_signed("!=", d["has_bias"], I64(0)), lambda: _elem(b, bias, c), F32(0.0))

        def fill(i: ir.Value) -> None:
            b.store(start, _elem(b, yc, i))

        _loop(b, I64(0), plane, fill)

        def tap(t: ir.Value) -> None:
            ki, kj = b.sdiv(t, d["kw"]), b.srem(t, d["kw"])
            src = _elem(b, cols, b.mul(b.add(b.mul(c, taps), t), pixels))
            y0, y1 = bounds(ki, "dh", "bh", "sh", "h", "oh")
            x0, x1 = bounds(kj, "dw", "bw", "sw", "w", "ow")
            ox0 = b.sub(b.mul(kj, d["dw"]), d["bw"])

            def row(iy: ir.Value) -> None:
                oy = b.sub(b.add(b.mul(iy, d["sh"]), b.mul(ki, d["dh"])), d["bh"])
                src_row, dst_row = _elem(b, src, b.mul(iy, d["w"])), _elem(b, yc, b.mul(oy, d["ow"]))

                def add(ix: ir.Value) -> None:
                    at = _elem(b, dst_row, b.add(b.mul(ix, d["sw"]), ox0))
                    b.store(b.fadd(b.load(at, typ=F32), b.load(_elem(b, src_row, ix), typ=F32)), at)

                _loop(b, x0, x1, add)

            _loop(b, y0, y1, row)

        _loop(b, I64(0), taps, tap)

    _loop(b, first, last, channel)
    b.ret_void()


def _pad_plane(b: ir.IRBuilder, module: ir.Module, src: ir.Value, dst: ir.Value, h: ir.Value, w: ir.Value,
               pt: ir.Value, pl: ir.Value, hp: ir.Value, wp: ir.Value) -> None:
    """``dst[hp, wp]`` = ``src[h, w]`` placed at ``(pt, pl)`` among zeros."""
    _zero(b, module, dst, I64(0), b.mul(pt, wp))

    def row(r: ir.Value) -> None:
        line = _elem(b, dst, b.mul(b.add(r, pt), wp))
        _zero(b, module, line, I64(0), pl)
        b.call(module.declare_intrinsic("llvm.memcpy", [PTR, PTR, I64]),
               [_elem(b, line, pl), _elem(b, src, b.mul(r, w)), b.mul(w, I64(4)), ir.IntType(1)(0)])
        _zero(b, module, line, b.add(pl, w), wp)
    _loop(b, I64(0), h, row)
    _zero(b, module, dst, b.mul(b.add(pt, h), wp), b.mul(hp, wp))


WINOGRAD_BT = ((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1))
"""``Bᵀ`` of Winograd F(2x2, 3x3): the input transform ``V = Bᵀ d B`` of a 4x4 tile ``d``."""

WINOGRAD_AT = ((1, 1, 1, 0), (0, 1, -1, -1))
"""``Aᵀ``: the output transform ``Aᵀ M A`` of a product tile into 2x2 outputs."""

WINOGRAD_M = 2
"""The output tile's size (``m`` of F(m x m, 3x3)); input tiles are ``m + 2`` wide. F(4x4, 3x3)
(4x fewer multiplications, against 2.25x) measured no faster on ResNet-50's shapes here: its
6x6 transforms, which LLVM vectorizes poorly over a plane's few tiles per row, ate the saving."""


WINOGRAD_SKEW = 16
"""Floats between one transformed element's plane and the next, past their ``C x tiles`` (or
``K x tiles``) values: the ``a²`` planes a tile's values go to (and its products come from)
would otherwise lie a multiple of 4 KiB apart for many shapes (ResNet's 56x56 with 64
channels: 196 KiB), all in one set of the L1 cache."""


class WinogradPlan(NamedTuple):
    """The workspace of one image's Winograd conv, in floats: V (``a²`` planes of
    ``[C, tiles]``, ``v_stride`` apart; later the whole output tiles) from 0, then M (``a²``
    planes of ``[K, tiles]``, ``m_stride`` apart; first the padded image) from ``m_offset``."""

    tiles: int
    v_stride: int
    m_stride: int
    m_offset: int
    floats: int


def winograd_plan(c: int, k: int, oh: int, ow: int) -> WinogradPlan:
    """The workspace layout the Winograd routines use (see :class:`WinogradPlan`).

    Example:
        >>> winograd_plan(64, 64, 56, 56)[:3]  # tiles, then 64 * 784 + 16 floats per plane
        (784, 50192, 50192)
    """
    m = WINOGRAD_M
    a, th, tw = m + 2, -(-oh // m), -(-ow // m)
    tiles = th * tw
    v_stride, m_stride = c * tiles + WINOGRAD_SKEW, k * tiles + WINOGRAD_SKEW
    m_offset = max(a * a * v_stride, m * m * k * tiles)
    return WinogradPlan(tiles, v_stride, m_stride, m_offset,
                        m_offset + max(a * a * m_stride, c * (m * th + 2) * (m * tw + 2)))


def winograd_workspace(c: int, k: int, oh: int, ow: int) -> int:
    """The floats of a Winograd conv's workspace (one image): two regions, the
    first for V (then the whole output tiles, once V is read), the second for the padded image
    (then M, once the image is transformed).

    Example:
        >>> winograd_workspace(1, 1, 2, 2)
        544
    """
    return winograd_plan(c, k, oh, ow).floats


def _combine(b: ir.IRBuilder, coefficients: tuple[int, ...], values: list[ir.Value]) -> ir.Value:
    """``sum_i coefficients[i] * values[i]``: zero terms skipped, ±1 as adds and subtractions."""
    total: ir.Value | None = None
    for coefficient, value in zip(coefficients, values):
        if coefficient == 0:
            continue
        term = value if abs(coefficient) == 1 else b.fmul(value, F32(float(abs(coefficient))))
        if total is None:
            total = term if coefficient > 0 else b.fneg(term)
        else:
            total = b.fadd(total, term) if coefficient > 0 else b.fsub(total, term)
    assert total is not None
    return total


def _winograd_rows(module: ir.Module) -> tuple[ir.Function, ir.Function]:
    """One row of tiles each way: ``in(p, v, tw, wp, v_stride)`` transforms the ``m + 2`` padded
    image rows at ``p`` into ``v[e * v_stride + tx]``; ``out(m, o, tw, o_row, m_stride, bias)``
    turns ``m[e * m_stride + tx]`` into ``m`` output rows at ``o``. Separate functions with
    ``noalias`` pointers, so the tile loops vectorize."""
    bt, at, m = WINOGRAD_BT, WINOGRAD_AT, WINOGRAD_M
    a = m + 2
    row_in, b = _internal(module, "md_winograd_in_row", [PTR, PTR, I64, I64, I64], (0, 1))
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

    # tiles a vector at once: tile tx's columns 2tx .. 2tx+3 are the even and odd lanes of
    # loads of 2 L floats at 2tx and 2tx+2 (the last read, 2tx+2L+1, is inside the padded row
    # of 2 tw + 2 floats while tx + L <= tw). A row of tw >= L tiles goes L at a time, its last
    # step ending at tw (overlapping the one before: tiles are independent, so the overlap
    # writes the same values again): 16 lanes from 16 tiles, 8 from 8, 4 from 4; fewer tiles
    # one at a time. No loop is left for LLVM's vectorizer (md_winograd_in compiles without it).
    assert m == 2, "the gathered tiles assume F(2x2, 3x3)"

    def gathered(lanes: int, tx: ir.Value) -> None:
        wide = ir.VectorType(F32, 2 * lanes)
        left = _elem(b, p, b.mul(tx, I64(m)))
        rows = []
        for i in range(a):
            line = _elem(b, left, b.mul(I64(i), wp))
            pairs = [b.load(_elem(b, line, I64(shift)), typ=wide, align=4) for shift in (0, 2)]
            rows.append([_lanes_of(b, pairs[j // 2], odd=j % 2 == 1) for j in range(a)])
        transform(rows, tx)

    def by(lanes: int) -> None:
        steps = b.sdiv(tw, I64(lanes))
        _loop(b, I64(0), steps, lambda step: gathered(lanes, b.mul(step, I64(lanes))))
        _if(b, b.icmp_signed("!=", b.srem(tw, I64(lanes)), I64(0)), lambda: gathered(lanes, b.sub(tw, I64(lanes))))

    def widest(options: list[int]) -> None:
        if not options:
            _loop(b, I64(0), tw, tile_in)
            return
        with b.if_else(b.icmp_signed(">=", tw, I64(options[0]))) as (enough, fewer):
            with enough:
                by(options[0])
            with fewer:
                widest(options[1:])
    widest([GATHER_LANES, 8, 4])
    b.ret_void()

    row_out, b = _internal(module, "md_winograd_out_row", [PTR, PTR, I64, I64, I64, F32, F32, F32], (0, 1))
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
    _loop(b, I64(0), tw, tile_out)
    b.ret_void()
    return row_in, row_out


class _WinogradLayout:
    """Tiles, strides and the workspace's regions of one image (see :func:`winograd_workspace`):
    V (then the whole output tiles), and the padded image (then M)."""

    def __init__(self, b: ir.IRBuilder, d: dict[str, ir.Value], work: ir.Value) -> None:
        m = self.m = WINOGRAD_M
        a = m + 2
        self.th = b.sdiv(b.add(d["oh"], I64(m - 1)), I64(m))
        self.tw = b.sdiv(b.add(d["ow"], I64(m - 1)), I64(m))
        self.tiles = b.mul(self.th, self.tw)
        self.hp, self.wp = b.add(b.mul(self.th, I64(m)), I64(2)), b.add(b.mul(self.tw, I64(m)), I64(2))
        self.plane, self.out_plane = b.mul(d["h"], d["w"]), b.mul(d["oh"], d["ow"])
        self.padded_plane = b.mul(self.hp, self.wp)
        skew = I64(WINOGRAD_SKEW)  # (the layout of winograd_plan)
        self.v_stride, self.m_stride = b.add(b.mul(d["c"], self.tiles), skew), b.add(b.mul(d["k"], self.tiles), skew)
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
            b.call(row_in, [top, _elem(b, lay.v_base, b.add(b.mul(c, lay.tiles), b.mul(ty, lay.tw))), lay.tw,
                            lay.wp, lay.v_stride])
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
            first_tile = _elem(b, lay.m_base, b.add(b.mul(k, lay.tiles), b.mul(ty, lay.tw)))
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


def _winograd_phases(module: ir.Module, phases: tuple[str, ...] = ("in", "out")) -> None:
    """A 3x3 stride-1 conv as Winograd F(2x2, 3x3), in the phases a program runs per image:
    the input is zero-padded to whole tiles and each 4x4 tile becomes ``V = Bᵀ d B`` (16 values,
    laid out ``[16, C, tiles]``, the planes :data:`WINOGRAD_SKEW` floats apart); 16 products
    ``M[e] = U[e] V[e]`` (``[K, C] x [C, tiles]``, between the phases); each ``M`` tile becomes
    the 2x2 output ``Aᵀ m A`` (+ bias), written in place or, for odd output sizes, into whole
    tiles and cropped. The tile loops have no conditions, so LLVM vectorizes them. 2.25x fewer
    multiplications than the direct conv; the layout is :func:`winograd_plan`'s.

    ``md_winograd_in`` (args ``[x, work]``: task ``task`` of ``tasks`` pads and transforms its
    share of one image's channels into V) and ``md_winograd_out`` (args ``[work, y, bias]``: its
    share of the output channels from M), each in its own module (``phases``: which to build
    here; the output transform compiles without LLVM's vectorizers at the same speed); dims
    :data:`WINOGRAD_TASK_DIMS`, ``n`` is 1."""
    row_in, row_out = _winograd_rows(module)
    for phase in phases:
        b, args, dims = _define(module, f"md_winograd_{phase}")
        d = {name: _arg(b, dims, i, I64) for i, name in enumerate(WINOGRAD_TASK_DIMS)}
        if phase == "in":
            x, work = _arg(b, args, 0, PTR), _arg(b, args, 1, PTR)
            first, last = _share(b, d["c"], d)
            _winograd_in(b, module, row_in, d, _WinogradLayout(b, d, work), x, first, last)
        else:
            work, y, bias = (_arg(b, args, i, PTR) for i in range(3))
            first, last = _share(b, d["k"], d)
            _winograd_out(b, module, row_out, d, _WinogradLayout(b, d, work), y, bias, first, last)
        b.ret_void()


def _pad2d(module: ir.Module) -> None:
    b, args, dims = _define(module, "md_pad2d")
    x, out = _arg(b, args, 0, PTR), _arg(b, args, 1, PTR)
    d = {name: _arg(b, dims, i, I64) for i, name in enumerate(PAD2D_DIMS)}
    plane, padded = b.mul(d["h"], d["w"]), b.mul(d["hp"], d["wp"])

    def one(p: ir.Value) -> None:
        src, dst = _elem(b, x, b.mul(p, plane)), _elem(b, out, b.mul(p, padded))
        _zero(b, module, dst, I64(0), b.mul(d["pt"], d["wp"]))

        def row(r: ir.Value) -> None:
            line = _elem(b, dst, b.mul(b.add(r, d["pt"]), d["wp"]))
            _zero(b, module, line, I64(0), d["pl"])
            b.call(module.declare_intrinsic("llvm.memcpy", [PTR, PTR, I64]),
                   [_elem(b, line, d["pl"]), _elem(b, src, b.mul(r, d["w"])), b.mul(d["w"], I64(4)),
                    ir.IntType(1)(0)])
            _zero(b, module, line, b.add(d["pl"], d["w"]), d["wp"])
        _loop(b, I64(0), d["h"], row)
        _zero(b, module, dst, b.mul(b.add(d["pt"], d["h"]), d["wp"]), padded)

    first = b.sdiv(b.mul(d["planes"], d["task"]), d["tasks"])
    last = b.sdiv(b.mul(d["planes"], b.add(d["task"], I64(1))), d["tasks"])
    _loop(b, first, last, one)
    b.ret_void()


__all__ = ["COL2IM_DIMS", "CONV2D_DIMS", "IM2COL_DIMS", "PAD2D_DIMS", "WINOGRAD_DIMS", "WINOGRAD_TASK_DIMS",
           "winograd_workspace"]
