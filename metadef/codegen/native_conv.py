"""The native convolution routines (see :mod:`.native`): im2col + sgemm, col2im
(ConvTranspose's scatter of sgemm's columns), and the zero padding the generated depthwise
kernels read (Winograd's transforms: :mod:`.native_winograd`).

Example:
    >>> IM2COL_DIMS[:3]
    ('c', 'h', 'w')
"""

from __future__ import annotations

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
    _Callee,
    _define,
    _elem,
    _if,
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


__all__ = ["COL2IM_DIMS", "CONV2D_DIMS", "IM2COL_DIMS", "PAD2D_DIMS"]
