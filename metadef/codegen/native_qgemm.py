"""Quantized products on the CPU's 8-bit dot products (see :mod:`.native`): ``md_qgemm``.

``md_qgemm`` computes, for the 8-bit activations ``a [m, k]`` (rows ``lda`` bytes apart) and
constant int8 weights ``W [k, n]`` (packed once by :func:`pack_qgemm_weights`)::

    y[i, j] = clip(rint(float32(sum_k a[i, k] * W[k, j] + corr[j]) * mult[j]) + zy, lo, hi)

in int32 and then float32 exactly as ONNX Runtime requantizes (and our reference:
:func:`metadef.ops.defs.quantized.qlinear_matmul_reference`): ``corr`` (int32 a column) holds
what the activations' zero point takes away (``-za * sum_k W[k, j]``) and an int32 bias;
``mult`` (float32 a column) is ``a_scale * w_scale[j] / y_scale``; ``y`` is uint8 or int8, by
``lo`` and ``hi``. The products are ``vpdpbusd`` (AVX512-VNNI): four unsigned bytes of ``a``
times four signed bytes of ``W``, summed into an int32 lane, exactly (no saturation; the sums
fit in int32 for ``k`` below 65793). Activations that are int8 (``flip``) are read as
``a + 128`` (each byte's sign bit flipped), which ``corr`` accounts for.

The weights go in panels of :data:`QGEMM_PANEL` columns, each ``[ceil(k/4), 32, 4]``: a depth
step is two 512-bit loads (32 columns x 4 depths) and, per row of the tile, one broadcast of
four bytes of ``a`` and two ``vpdpbusd``. The tile is 12 rows (24 accumulators), the last rows
in smaller tiles. A depth not a multiple of 4 reads its last bytes as the 4 ending the row,
shifted (so a row is never read past its end; ``k >= 4``). Tasks split the panels.

Example:
    >>> import ctypes, numpy as np
    >>> from metadef.codegen.native import ENTRY, native_function
    >>> if has_vnni():
    ...     a = np.arange(2 * 8, dtype=np.uint8).reshape(2, 8)
    ...     w = np.ones((8, 3), np.int8)
    ...     packed, colsum = pack_qgemm_weights(w)
    ...     corr = np.zeros(QGEMM_PANEL, np.int32)
    ...     mult = np.ones(QGEMM_PANEL, np.float32)
    ...     y = np.empty((2, 3), np.uint8)
    ...     args = (ctypes.c_void_p * 5)(a.ctypes.data, packed.ctypes.data, corr.ctypes.data,
    ...                                  mult.ctypes.data, y.ctypes.data)
    ...     dims = qgemm_dims(2, 3, 8, lo=0, hi=255)
    ...     ENTRY(native_function("md_qgemm"))(args, (ctypes.c_int64 * len(dims))(*dims))
    ...     got = y.tolist()
    ... else:
    ...     got = [[28, 28, 28], [92, 92, 92]]
    >>> got
    [[28, 28, 28], [92, 92, 92]]
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from llvmlite import ir

from metadef.codegen.host import host_target
from metadef.codegen.native_gemm import _bits
from metadef.codegen.native_ir import F32, I32, I64, PTR, _arg, _define, _elem, _float_bits, _loop, _share, _splat
from metadef.codegen.native_tile import _row_tiles

QGEMM_DIMS = ("m", "n", "k", "lda", "ldy", "zy", "lo", "hi", "flip", "task", "tasks")
"""The dims of ``md_qgemm``: args are ``[a [m, k] (8-bit, rows lda bytes apart), packed weights,
corr (int32) [ceil(n/32)*32], mult (float32) [ceil(n/32)*32], y [m, n] (8-bit, rows ldy apart)]``;
``zy``, ``lo``, ``hi``: float32 bits (the output's zero point and saturation range); ``flip``:
1 where ``a`` is int8."""

QGEMM_PANEL = 32
"""The columns of a weight panel (and of the tile): two 512-bit registers of int32 sums."""

QGEMM_ROW_TILES = (12, 8, 4, 2, 1)
"""The row counts of the tiles, largest first."""

MAX_DEPTH = 65792
"""The largest ``k`` whose int32 sums cannot overflow (255 * 128 * k < 2**31)."""

V16I = ir.VectorType(I32, 16)
V16F = ir.VectorType(F32, 16)
V16B = ir.VectorType(ir.IntType(8), 16)
I8 = ir.IntType(8)


def has_vnni() -> bool:
    """Whether this host has AVX512-VNNI (``md_qgemm`` needs it).

    Example:
        >>> isinstance(has_vnni(), bool)
        True
    """
    target = host_target()
    return target.has("avx512vnni") and target.has("avx512bw")


def pack_qgemm_weights(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``W [k, n]`` (int8 values, any integer dtype) in ``md_qgemm``'s panels
    ``[ceil(n/32), ceil(k/4), 32, 4]`` (int8, zero-padded), and its column sums (int64 ``[n]``).

    Example:
        >>> packed, colsum = pack_qgemm_weights(np.ones((5, 3), np.int8))
        >>> packed.shape, colsum.tolist()
        ((1, 2, 32, 4), [5, 5, 5])
    """
    k, n = w.shape
    panels, depth = -(-n // QGEMM_PANEL), -(-k // 4)
    padded = np.zeros((depth * 4, panels * QGEMM_PANEL), np.int8)
    padded[:k, :n] = w
    raw = np.empty(panels * depth * QGEMM_PANEL * 4 + 64, np.uint8)  # (64-byte aligned: a depth
    start = -raw.ctypes.data % 64  # step's two loads are aligned)
    out = raw[start:start + panels * depth * QGEMM_PANEL * 4].view(np.int8).reshape(panels, depth, QGEMM_PANEL, 4)
    # each column's 4 consecutive depths as one int32, so that the transpose moves 4-byte items
    columns = np.ascontiguousarray(padded.T).view(np.int32).reshape(panels, QGEMM_PANEL, depth)
    out.view(np.int32).reshape(panels, depth, QGEMM_PANEL)[...] = columns.transpose(0, 2, 1)
    return out, np.asarray(w, np.int64).sum(axis=0)


def qgemm_dims(m: int, n: int, k: int, *, lo: float, hi: float, zy: float = 0.0, lda: int | None = None,
               ldy: int | None = None, flip: bool = False, task: int = 0, tasks: int = 1) -> tuple[int, ...]:
    """The dims of one ``md_qgemm`` call (see :data:`QGEMM_DIMS`; ``lda`` defaults to ``k``,
    ``ldy`` to ``n``).

    Example:
        >>> qgemm_dims(128, 768, 768, lo=0, hi=255)[:5]
        (128, 768, 768, 768, 768)
    """
    values = {"m": m, "n": n, "k": k, "lda": k if lda is None else lda, "ldy": n if ldy is None else ldy,
              "zy": _bits(zy), "lo": _bits(lo), "hi": _bits(hi), "flip": int(flip), "task": task, "tasks": tasks}
    return tuple(values[d] for d in QGEMM_DIMS)


def _dot(module: ir.Module) -> ir.Function:
    name = "llvm.x86.avx512.vpdpbusd.512"
    found = module.globals.get(name)
    return found if found is not None else ir.Function(module, ir.FunctionType(V16I, [V16I] * 3), name)


def _intrinsic(module: ir.Module, name: str, typ: ir.FunctionType) -> ir.Function:
    found = module.globals.get(name)
    return found if found is not None else ir.Function(module, typ, name)


def _depth_loop(b: ir.IRBuilder, steps: ir.Value, count: int,
                step: Callable[[ir.Value, list[ir.Value]], list[ir.Value]]) -> list[ir.Value]:
    """``count`` int32 accumulators (16 lanes) from zero over depth steps ``[0, steps)``:
    ``step(s, accs)`` gives their next values (zeros when there are no steps)."""
    zero = ir.Constant(V16I, [0] * 16)
    pre = b.block
    head, after = b.append_basic_block("steps"), b.append_basic_block("steps_done")
    b.cbranch(b.icmp_signed(">", steps, I64(0)), head, after)
    b.position_at_end(head)
    s = b.phi(I64)
    s.add_incoming(I64(0), pre)
    accs = [b.phi(V16I) for _ in range(count)]
    for acc in accs:
        acc.add_incoming(zero, pre)
    new = step(s, list(accs))
    nxt = b.add(s, I64(1))
    s.add_incoming(nxt, b.block)
    for acc, value in zip(accs, new):
        acc.add_incoming(value, b.block)
    latch = b.block
    b.cbranch(b.icmp_signed("<", nxt, steps), head, after)
    b.position_at_end(after)
    out = []
    for value in new:
        merged = b.phi(V16I)
        merged.add_incoming(zero, pre)
        merged.add_incoming(value, latch)
        out.append(merged)
    return out


class _Requantizer:
    """The stores of a tile: ``clip(rint(float32(acc + corr) * mult) + zy, lo, hi)`` as bytes,
    16 lanes at a time, the last panel's or block's under a mask of its ``cols``."""

    def __init__(self, module: ir.Module, b: ir.IRBuilder, zy: ir.Value, lo: ir.Value, hi: ir.Value,
                 cols: ir.Value) -> None:
        self.b = b
        self.roundeven = _intrinsic(module, "llvm.roundeven.v16f32", ir.FunctionType(V16F, [V16F]))
        self.masked = _intrinsic(module, "llvm.masked.store.v16i8.p0",
                                 ir.FunctionType(ir.VoidType(), [V16B, PTR, I32, ir.VectorType(ir.IntType(1), 16)]))
        self.zy, self.lo, self.hi = (_splat(b, v, 16) for v in (zy, lo, hi))
        lanes = ir.Constant(V16I, list(range(16)))
        self.whole = b.icmp_signed(">=", cols, I64(QGEMM_PANEL))
        self.masks = [b.icmp_signed("<", lanes, _splat(b, b.trunc(b.sub(cols, I64(16 * h)), I32), 16))
                      for h in range(2)]

    def store(self, acc: ir.Value, corr: ir.Value, mult: ir.Value, at: ir.Value, half: int) -> None:
        b = self.b
        v = b.fmul(b.sitofp(b.add(acc, corr), V16F), mult)
        v = b.fadd(b.call(self.roundeven, [v]), self.zy)
        v = b.select(b.fcmp_ordered("<", v, self.lo), self.lo, v)
        v = b.select(b.fcmp_ordered(">", v, self.hi), self.hi, v)
        q = b.trunc(b.fptosi(v, V16I), V16B)
        with b.if_else(self.whole) as (full, part):
            with full:
                b.store(q, at, align=1)
            with part:
                b.call(self.masked, [q, at, I32(1), self.masks[half]])


def _qtile(module: ir.Module, mr: int) -> ir.Function:
    """``tile(a, lda, w, steps, tail, corr, mult, y, ldy, cols, zy, lo, hi, flip)``: rows
    ``[0, mr)`` x the panel's 32 columns: ``steps`` full depth steps of 4, then (``tail`` > 0)
    the last ``tail`` depths, requantized and stored (the first ``cols`` columns)."""
    params = [PTR, I64, PTR, I64, I64, PTR, PTR, PTR, I64, I64, F32, F32, F32, I64]
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), params), f"md_qgemm_tile{mr}")
    fn.linkage = "internal"
    fn.attributes.add("alwaysinline")
    a, lda, w, steps, tail, corr, mult, y, ldy, cols, zy, lo, hi, flip = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    dot = _dot(module)
    rows = [b.gep(a, [b.mul(I64(r), lda)], source_etype=I8) for r in range(mr)]

    def word_at(r: int, offset: ir.Value) -> ir.Value:
        at = b.gep(rows[r], [offset], source_etype=I8)
        return b.load(at, typ=I32, align=1)

    def depth_loop(flipped: bool) -> list[ir.Value]:
        def step(s: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
            panel = b.gep(w, [b.mul(s, I64(4 * QGEMM_PANEL))], source_etype=I8)
            halves = [b.load(b.gep(panel, [I64(64 * h)], source_etype=I8), typ=V16I, align=64) for h in range(2)]
            new = []
            for r in range(mr):
                word = word_at(r, b.mul(s, I64(4)))
                if flipped:
                    word = b.xor(word, I32(-0x7F7F7F80))  # 0x80808080
                v = _splat(b, word, 16)
                new += [b.call(dot, [accs[2 * r + h], v, halves[h]]) for h in range(2)]
            return new

        return _depth_loop(b, steps, 2 * mr, step)

    pre = b.block
    then, other, joined = (b.append_basic_block(n) for n in ("signed", "unsigned", "summed"))
    b.cbranch(b.icmp_signed("!=", flip, I64(0)), then, other)
    sums: list[list[ir.Value]] = []
    ends = []
    for block, flipped in ((then, True), (other, False)):
        b.position_at_end(block)
        sums.append(depth_loop(flipped))
        ends.append(b.block)
        b.branch(joined)
    b.position_at_end(joined)
    accs = []
    for i in range(2 * mr):
        phi = b.phi(V16I)
        for got, end in zip(sums, ends):
            phi.add_incoming(got[i], end)
        accs.append(phi)
    del pre

    # the last depths: the 4 bytes ending the row, shifted down (the packed weights past k are 0)
    before = b.block
    with b.if_then(b.icmp_signed(">", tail, I64(0))):
        panel = b.gep(w, [b.mul(steps, I64(4 * QGEMM_PANEL))], source_etype=I8)
        halves = [b.load(b.gep(panel, [I64(64 * h)], source_etype=I8), typ=V16I, align=64) for h in range(2)]
        shift = b.trunc(b.mul(b.sub(I64(4), tail), I64(8)), I32)
        start = b.add(b.mul(steps, I64(4)), b.sub(tail, I64(4)))
        mask = b.select(b.icmp_signed("!=", flip, I64(0)), I32(-0x7F7F7F80), I32(0))
        tailed = []
        for r in range(mr):
            word = b.lshr(b.xor(word_at(r, start), mask), shift)
            v = _splat(b, word, 16)
            tailed += [b.call(dot, [accs[2 * r + h], v, halves[h]]) for h in range(2)]
        inside = b.block
    final = []
    for acc, value in zip(accs, tailed):
        phi = b.phi(V16I)
        phi.add_incoming(acc, before)
        phi.add_incoming(value, inside)
        final.append(phi)

    out = _Requantizer(module, b, zy, lo, hi, cols)
    for h in range(2):
        c = b.load(b.gep(corr, [I64(16 * h)], source_etype=I32), typ=V16I, align=4)
        f = b.load(b.gep(mult, [I64(16 * h)], source_etype=F32), typ=V16F, align=4)
        for r in range(mr):
            out.store(final[2 * r + h], c, f, b.gep(y, [b.add(b.mul(I64(r), ldy), I64(16 * h))], source_etype=I8), h)
    b.ret_void()
    return fn


def _qgemm(module: ir.Module) -> None:
    tiles = {mr: _qtile(module, mr) for mr in QGEMM_ROW_TILES}
    b, args, dims = _define(module, "md_qgemm")
    a, w, corr, mult, y = (_arg(b, args, i, PTR) for i in range(5))
    d = {name: _arg(b, dims, i, I64) for i, name in enumerate(QGEMM_DIMS)}
    m, n, k, lda, ldy = d["m"], d["n"], d["k"], d["lda"], d["ldy"]
    zy, lo, hi = (_float_bits(b, d[name]) for name in ("zy", "lo", "hi"))
    steps, tail = b.sdiv(k, I64(4)), b.srem(k, I64(4))
    depth = b.sdiv(b.add(k, I64(3)), I64(4))
    panels = b.sdiv(b.add(n, I64(QGEMM_PANEL - 1)), I64(QGEMM_PANEL))
    first, last = _share(b, panels, d)

    def panel(q: ir.Value) -> None:
        j0 = b.mul(q, I64(QGEMM_PANEL))
        cols = b.sub(n, j0)
        wq = b.gep(w, [b.mul(q, b.mul(depth, I64(4 * QGEMM_PANEL)))], source_etype=I8)
        cq, mq = b.gep(corr, [j0], source_etype=I32), _elem(b, mult, j0)

        def rows_from(r0: ir.Value, mr: int) -> None:
            at = b.gep(y, [b.add(b.mul(r0, ldy), j0)], source_etype=I8)
            b.call(tiles[mr], [b.gep(a, [b.mul(r0, lda)], source_etype=I8), lda, wq, steps, tail, cq, mq, at, ldy,
                               cols, zy, lo, hi, d["flip"]])

        _row_tiles(b, m, QGEMM_ROW_TILES, rows_from)

    _loop(b, first, last, panel)
    b.ret_void()




# ------------------------------------------------------------------ quantized convolutions

QPACK_DIMS = ("c", "h", "w", "kh", "kw", "sh", "sw", "dh", "dw", "pt", "pl", "oh", "ow", "p32", "fill", "flip",
              "task", "tasks")
"""The dims of ``md_qpack``: args are ``[x [c, h, w] (one image, 8-bit), xp [ceil(q/4), p32, 4]]``
with ``q = c*kh*kw`` rows of taps (``(c, dy, dx)`` in that order) and ``p32`` the output pixels
``oh*ow`` rounded up to :data:`QGEMM_PANEL`; a tap outside the image reads ``fill`` (the
activations' zero point, a byte), pixels past ``oh*ow`` and rows past ``q`` are 0; ``flip``: 1
where the activations are int8 (each byte's sign bit flipped, as ``md_qgemm``'s ``a``). Task
``task`` of ``tasks`` takes its share of the groups of 4 rows."""

QCONV_DIMS = ("rows", "depth", "p", "p32", "zy", "lo", "hi", "task", "tasks")
"""The dims of ``md_qconv``: args are ``[xp (see QPACK_DIMS), weights [rows, ceil(depth/4)*4] (int8,
zero-padded), corr (int32) [rows], mult (float32) [rows], y [rows, p] (one image's output
channels, 8-bit)]``; ``zy``, ``lo``, ``hi`` float32 bits. Task ``task`` of ``tasks`` takes its
share of the (block of 32 pixels, chunk of :data:`QCONV_CHUNK` rows) units."""

QCONV_CHUNK = 48
"""Output channels a unit of ``md_qconv`` computes over one block of pixels (four 12-row tiles):
the block's packed input stays in L1 while they pass."""


def qpack_dims(c: int, h: int, w: int, kernel: tuple[int, int], strides: tuple[int, int], dilations: tuple[int, int],
               begin: tuple[int, int], out_hw: tuple[int, int], *, fill: int, flip: bool, task: int = 0,
               tasks: int = 1) -> tuple[int, ...]:
    """The dims of one ``md_qpack`` call (see :data:`QPACK_DIMS`).

    Example:
        >>> qpack_dims(64, 56, 56, (3, 3), (1, 1), (1, 1), (1, 1), (56, 56), fill=0, flip=False)[-5:]
        (3136, 0, 0, 0, 1)
    """
    p = out_hw[0] * out_hw[1]
    values = {"c": c, "h": h, "w": w, "kh": kernel[0], "kw": kernel[1], "sh": strides[0], "sw": strides[1],
              "dh": dilations[0], "dw": dilations[1], "pt": begin[0], "pl": begin[1], "oh": out_hw[0],
              "ow": out_hw[1], "p32": -(-p // QGEMM_PANEL) * QGEMM_PANEL, "fill": fill & 0xFF, "flip": int(flip),
              "task": task, "tasks": tasks}
    return tuple(values[d] for d in QPACK_DIMS)


def qconv_dims(rows: int, depth: int, p: int, *, lo: float, hi: float, zy: float = 0.0, task: int = 0,
               tasks: int = 1) -> tuple[int, ...]:
    """The dims of one ``md_qconv`` call (see :data:`QCONV_DIMS`).

    Example:
        >>> qconv_dims(64, 576, 3136, lo=-128, hi=127)[:4]
        (64, 576, 3136, 3136)
    """
    values = {"rows": rows, "depth": depth, "p": p, "p32": -(-p // QGEMM_PANEL) * QGEMM_PANEL, "zy": _bits(zy),
              "lo": _bits(lo), "hi": _bits(hi), "task": task, "tasks": tasks}
    return tuple(values[d] for d in QCONV_DIMS)


def qconv_units(rows: int, p: int) -> int:
    """The units ``md_qconv`` shares out among tasks: blocks of pixels times chunks of rows."""
    return -(-p // QGEMM_PANEL) * -(-rows // QCONV_CHUNK)


def lanes_between(b: ir.IRBuilder, lo: ir.Value, hi: ir.Value) -> ir.Value:
    """The lanes ``[lo, hi)`` of 64 as a ``<64 x i1>`` mask (``lo``, ``hi``: any i64)."""
    def below(n: ir.Value) -> ir.Value:  # the lanes [0, n) as bits, n clamped to [0, 64]
        n = b.select(b.icmp_signed("<", n, I64(0)), I64(0), n)
        ones = b.sub(b.shl(I64(1), b.select(b.icmp_signed(">", n, I64(63)), I64(63), n)), I64(1))
        return b.select(b.icmp_signed(">", n, I64(63)), I64(-1), ones)

    return b.bitcast(b.and_(below(hi), b.xor(below(lo), I64(-1))), ir.VectorType(ir.IntType(1), 64))


def _qpack(module: ir.Module) -> None:
    """Each group of 4 tap rows, each output row ``oy``: blocks of 64 output pixels, each tap's
    64 bytes by one masked load (two at stride 2, the even bytes taken), the lanes outside the
    image (padding, the row's ends) the ``fill``, then interleaved (bytes ``4 j + t``) and
    stored as four 64-byte vectors under a mask of the row's pixels; other strides pixel by
    pixel. Rows past ``q`` are 0, and so are the pixels past ``oh * ow``."""
    b, args, dims = _define(module, "md_qpack")
    x, xp = _arg(b, args, 0, PTR), _arg(b, args, 1, PTR)
    d = {name: _arg(b, dims, i, I64) for i, name in enumerate(QPACK_DIMS)}
    taps = b.mul(d["kh"], d["kw"])
    q = b.mul(d["c"], taps)
    groups = b.sdiv(b.add(q, I64(3)), I64(4))
    first, last = _share(b, groups, d)
    mask = b.trunc(b.mul(d["flip"], I64(0x80)), I8)
    fill = b.xor(b.trunc(d["fill"], I8), mask)
    row_bytes = b.mul(d["p32"], I64(4))
    ow, sw = d["ow"], d["sw"]
    v64b, bit64 = ir.VectorType(I8, 64), ir.VectorType(ir.IntType(1), 64)
    load64 = _intrinsic(module, "llvm.masked.load.v64i8.p0", ir.FunctionType(v64b, [PTR, I32, bit64, v64b]))
    store64 = _intrinsic(module, "llvm.masked.store.v64i8.p0",
                         ir.FunctionType(ir.VoidType(), [v64b, PTR, I32, bit64]))
    flips = _splat(b, mask, 64)

    def span(lo: ir.Value, hi: ir.Value) -> ir.Value:
        return lanes_between(b, lo, hi)

    def group(g: ir.Value) -> None:
        base = b.gep(xp, [b.mul(g, row_bytes)], source_etype=I8)
        p_bytes = b.mul(b.mul(d["oh"], ow), I64(4))
        b.call(module.declare_intrinsic("llvm.memset", [PTR, I64]),  # (the pixels past oh * ow)
               [b.gep(base, [p_bytes], source_etype=I8), I8(0), b.sub(row_bytes, p_bytes), ir.IntType(1)(0)])
        tap = []
        for t in range(4):
            r = b.add(b.mul(g, I64(4)), I64(t))
            real = b.icmp_signed("<", r, q)
            rr = b.select(real, r, I64(0))
            c, rest = b.sdiv(rr, taps), b.srem(rr, taps)
            dy, dx = b.sdiv(rest, d["kw"]), b.srem(rest, d["kw"])
            plane = b.gep(x, [b.mul(c, b.mul(d["h"], d["w"]))], source_etype=I8)
            tap.append((real, plane, b.sub(b.mul(dy, d["dh"]), d["pt"]), b.sub(b.mul(dx, d["dw"]), d["pl"]),
                        b.select(real, fill, I8(0))))

        def row_taps(oy: ir.Value) -> list[tuple[ir.Value, ir.Value, ir.Value, ir.Value]]:
            """Per tap: whether output row ``oy`` reads a row of the image, and where it starts."""
            rows = []
            for real, plane, off_y, off_x, t_fill in tap:
                iy = b.add(b.mul(oy, d["sh"]), off_y)
                inside = b.and_(real, b.and_(b.icmp_signed(">=", iy, I64(0)), b.icmp_signed("<", iy, d["h"])))
                # (a row outside reads nothing: its loads are all masked off, from the plane's start)
                src = b.gep(plane, [b.select(inside, b.mul(iy, d["w"]), I64(0))], source_etype=I8)
                rows.append((inside, src, off_x, t_fill))
            return rows

        def vectors(stride: int) -> None:
            def block(k: ir.Value) -> None:  # (the masks of a block's loads and stores serve all its rows)
                ox0 = b.mul(k, I64(64))
                loads = []
                for _, _, _, off_x, t_fill in tap:
                    start = b.add(b.mul(ox0, I64(stride)), off_x)
                    loads.append((start, [span(b.sub(I64(-64 * i), start), b.sub(b.sub(d["w"], start), I64(64 * i)))
                                          for i in range(stride)], _splat(b, b.xor(t_fill, mask), 64)))
                left = b.sub(ow, ox0)
                stores = [span(I64(0), b.mul(b.sub(left, I64(16 * q4)), I64(4))) for q4 in range(4)]
                none = ir.Constant(bit64, [False] * 64)

                def out_row(oy: ir.Value) -> None:
                    got = []
                    for (inside, src, _, _), (start, masks, passthru) in zip(row_taps(oy), loads):
                        at = b.gep(src, [start], source_etype=I8)
                        parts = [b.call(load64, [b.gep(at, [I64(64 * i)], source_etype=I8), I32(1),
                                                 b.select(inside, m, none), passthru]) for i, m in enumerate(masks)]
                        v = parts[0] if stride == 1 else b.shuffle_vector(
                            parts[0], parts[1], ir.Constant(ir.VectorType(I32, 64), [2 * i for i in range(64)]))
                        got.append(b.xor(v, flips))
                    pairs = [b.shuffle_vector(got[2 * i], got[2 * i + 1], ir.Constant(
                        ir.VectorType(I32, 64), [32 * half + j // 2 + 64 * (j % 2) for j in range(64)]))
                        for i in range(2) for half in range(2)]  # (a b pairs, then c d pairs; pixels 0-31, 32-63)
                    dst = b.gep(base, [b.mul(b.add(b.mul(oy, ow), ox0), I64(4))], source_etype=I8)
                    for q4 in range(4):  # (pixels 16 q4 + i: bytes 4 i + t)
                        h = q4 // 2
                        v = b.shuffle_vector(pairs[h], pairs[2 + h], ir.Constant(ir.VectorType(I32, 64), [
                            2 * (16 * (q4 % 2) + i) + t % 2 + 64 * (t // 2) for i in range(16) for t in range(4)]))
                        b.call(store64, [v, b.gep(dst, [I64(64 * q4)], source_etype=I8), I32(1), stores[q4]])

                _loop(b, I64(0), d["oh"], out_row)

            _loop(b, I64(0), b.sdiv(b.add(ow, I64(63)), I64(64)), block)

        def scalars(oy: ir.Value) -> None:
            rows = row_taps(oy)
            dst = b.gep(base, [b.mul(b.mul(oy, ow), I64(4))], source_etype=I8)

            def pixel(ox: ir.Value) -> None:
                for t, (inside, src, off_x, t_fill) in enumerate(rows):
                    ix = b.add(b.mul(ox, sw), off_x)
                    ok = b.and_(inside, b.and_(b.icmp_signed(">=", ix, I64(0)), b.icmp_signed("<", ix, d["w"])))
                    v = b.load(b.gep(src, [b.select(ok, ix, I64(0))], source_etype=I8), typ=I8)
                    b.store(b.select(ok, b.xor(v, mask), t_fill),
                            b.gep(dst, [b.add(b.mul(ox, I64(4)), I64(t))], source_etype=I8))

            _loop(b, I64(0), ow, pixel)

        with b.if_else(b.icmp_signed("==", sw, I64(1))) as (one, other):
            with one:
                vectors(1)
            with other, b.if_else(b.icmp_signed("==", sw, I64(2))) as (two, rest):
                with two:
                    vectors(2)
                with rest:
                    _loop(b, I64(0), d["oh"], scalars)

    _loop(b, first, last, group)
    b.ret_void()


def _qconv_tile(module: ir.Module, mr: int) -> ir.Function:
    """``tile(xp, p32, w, wrow, steps, corr, mult, y, p, cols, zy, lo, hi)``: output channels
    ``[0, mr)`` x 32 pixels: ``steps`` depth steps of 4 (the block's 32 pixels x 4 bytes from
    ``xp``, rows ``p32 * 4`` bytes apart; each channel's 4 weights broadcast), requantized with
    the channel's correction and multiplier, the first ``cols`` pixels stored."""
    params = [PTR, I64, PTR, I64, I64, PTR, PTR, PTR, I64, I64, F32, F32, F32]
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), params), f"md_qconv_tile{mr}")
    fn.linkage = "internal"
    fn.attributes.add("alwaysinline")
    xp, p32, w, wrow, steps, corr, mult, y, p, cols, zy, lo, hi = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    dot = _dot(module)
    rows = [b.gep(w, [b.mul(I64(r), wrow)], source_etype=I8) for r in range(mr)]
    stride = b.mul(p32, I64(4))

    def step(s: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
        block = b.gep(xp, [b.mul(s, stride)], source_etype=I8)
        halves = [b.load(b.gep(block, [I64(64 * h)], source_etype=I8), typ=V16I, align=64) for h in range(2)]
        new = []
        for r in range(mr):
            word = b.load(b.gep(rows[r], [b.mul(s, I64(4))], source_etype=I8), typ=I32, align=4)
            v = _splat(b, word, 16)
            new += [b.call(dot, [accs[2 * r + h], halves[h], v]) for h in range(2)]
        return new

    final = _depth_loop(b, steps, 2 * mr, step)
    out = _Requantizer(module, b, zy, lo, hi, cols)
    for r in range(mr):
        c = _splat(b, b.load(b.gep(corr, [I64(r)], source_etype=I32), typ=I32), 16)
        f = _splat(b, b.load(b.gep(mult, [I64(r)], source_etype=F32), typ=F32), 16)
        for h in range(2):
            out.store(final[2 * r + h], c, f, b.gep(y, [b.add(b.mul(I64(r), p), I64(16 * h))], source_etype=I8), h)
    b.ret_void()
    return fn


def _qconv(module: ir.Module) -> None:
    tiles = {mr: _qconv_tile(module, mr) for mr in QGEMM_ROW_TILES}
    b, args, dims = _define(module, "md_qconv")
    xp, w, corr, mult, y = (_arg(b, args, i, PTR) for i in range(5))
    d = {name: _arg(b, dims, i, I64) for i, name in enumerate(QCONV_DIMS)}
    rows, p, p32 = d["rows"], d["p"], d["p32"]
    zy, lo, hi = (_float_bits(b, d[name]) for name in ("zy", "lo", "hi"))
    steps = b.sdiv(b.add(d["depth"], I64(3)), I64(4))
    wrow = b.mul(steps, I64(4))
    blocks = b.sdiv(p32, I64(QGEMM_PANEL))
    chunks = b.sdiv(b.add(rows, I64(QCONV_CHUNK - 1)), I64(QCONV_CHUNK))
    first, last = _share(b, b.mul(blocks, chunks), d)

    def unit(u: ir.Value) -> None:
        blk, chunk = b.sdiv(u, chunks), b.srem(u, chunks)
        j0 = b.mul(blk, I64(QGEMM_PANEL))
        cols = b.sub(p, j0)
        r_lo = b.mul(chunk, I64(QCONV_CHUNK))
        count = b.sub(rows, r_lo)
        count = b.select(b.icmp_signed(">", count, I64(QCONV_CHUNK)), I64(QCONV_CHUNK), count)
        xb = b.gep(xp, [b.mul(j0, I64(4))], source_etype=I8)

        def rows_from(r0: ir.Value, mr: int) -> None:
            r = b.add(r_lo, r0)
            b.call(tiles[mr], [xb, p32, b.gep(w, [b.mul(r, wrow)], source_etype=I8), wrow, steps,
                               b.gep(corr, [r], source_etype=I32), _elem(b, mult, r),
                               b.gep(y, [b.add(b.mul(r, p), j0)], source_etype=I8), p, cols, zy, lo, hi])

        _row_tiles(b, count, QGEMM_ROW_TILES, rows_from)

    _loop(b, first, last, unit)
    b.ret_void()


__all__ = ["MAX_DEPTH", "QCONV_CHUNK", "QCONV_DIMS", "QGEMM_DIMS", "QGEMM_PANEL", "QGEMM_ROW_TILES", "QPACK_DIMS",
           "has_vnni", "pack_qgemm_weights", "qconv_dims", "qconv_units", "qgemm_dims", "qpack_dims"]
