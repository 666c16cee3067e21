"""Quantized convolutions (see :mod:`.native`): ``md_qpack`` and ``md_qconv``.

``md_qpack`` packs one image's taps (im2col) for the 8-bit dot products, four tap rows
interleaved a byte each per pixel (``[ceil(q/4), p32, 4]``); ``md_qconv`` runs the conv's
output channels over blocks of 32 packed pixels with :mod:`.native_qgemm`'s depth loop and
requantizing stores.

Example:
    >>> qconv_units(64, 3136)  # (98 blocks of 32 pixels, times two chunks of at most 48 channels)
    196
"""

from __future__ import annotations

from llvmlite import ir

from metadef.codegen.host import host_target
from metadef.codegen.native_gemm import _bits
from metadef.codegen.native_ir import F32, I32, I64, PTR, _arg, _define, _elem, _float_bits, _loop, _share, _splat
from metadef.codegen.native_qgemm import (
    I8,
    QGEMM_PANEL,
    QGEMM_ROW_TILES,
    V16I,
    _depth_loop,
    _dot,
    _intrinsic,
    _qtile,
    _Requantizer,
    qconv_row_tiles,
)
from metadef.codegen.native_tile import _row_tiles

QPACK_DIMS = ("c", "h", "w", "kh", "kw", "sh", "sw", "dh", "dw", "pt", "pl", "oh", "ow", "p32", "fill", "flip",
              "task", "tasks")
"""The dims of ``md_qpack``: args are ``[x [c, h, w] (one image, 8-bit), xp [ceil(q/4), p32, 4]]``
with ``q = c*kh*kw`` rows of taps (``(c, dy, dx)`` in that order) and ``p32`` the output pixels
``oh*ow`` rounded up to :data:`QGEMM_PANEL`; a tap outside the image reads ``fill`` (the
activations' zero point, a byte; -1: the byte at a third arg, a zero point computed at run
time), pixels past ``oh*ow`` and rows past ``q`` are 0; ``flip``: 1
where the activations are int8 (each byte's sign bit flipped, as ``md_qgemm``'s ``a``). Task
``task`` of ``tasks`` takes its share of the groups of 4 rows."""

QCONV_DIMS = ("rows", "depth", "p", "p32", "zy", "lo", "hi", "task", "tasks")
"""The dims of ``md_qconv``: args are ``[xp (see QPACK_DIMS), weights [rows, ceil(depth/4)*4] (int8,
zero-padded), corr (int32) [rows], mult (float32) [rows], y [rows, p] (one image's output
channels, 8-bit)]``; ``zy``, ``lo``, ``hi`` float32 bits. Task ``task`` of ``tasks`` takes its
share of the (block of 32 pixels, chunk of :data:`QCONV_CHUNK` rows) units."""

QCONVI_DIMS = ("rows", "depth", "p", "p32", "flip", "task", "tasks")
"""The dims of ``md_qconvi`` (ConvInteger: the int32 sums themselves): args are ``[xp, weights
(as md_qconv's), rowsum (int32) [rows] (each channel's weights summed), x_zero_point (8-bit [1]),
y [rows, p] (int32)]``; the correction ``-x_zero_point * rowsum`` is made at run time; ``flip``:
1 where the activations are int8 (``md_qpack`` flipped them)."""

QCONV_CHUNK = 48
"""Output channels a unit of ``md_qconv`` computes over one block of pixels (four 12-row tiles):
the block's packed input stays in L1 while they pass."""


def qpack_dims(c: int, h: int, w: int, kernel: tuple[int, int], strides: tuple[int, int], dilations: tuple[int, int],
               begin: tuple[int, int], out_hw: tuple[int, int], *, fill: int | None, flip: bool, task: int = 0,
               tasks: int = 1) -> tuple[int, ...]:
    """The dims of one ``md_qpack`` call (see :data:`QPACK_DIMS`; ``fill`` None: read at run time).

    Example:
        >>> qpack_dims(64, 56, 56, (3, 3), (1, 1), (1, 1), (1, 1), (56, 56), fill=0, flip=False)[-5:]
        (3136, 0, 0, 0, 1)
    """
    p = out_hw[0] * out_hw[1]
    values = {"c": c, "h": h, "w": w, "kh": kernel[0], "kw": kernel[1], "sh": strides[0], "sw": strides[1],
              "dh": dilations[0], "dw": dilations[1], "pt": begin[0], "pl": begin[1], "oh": out_hw[0],
              "ow": out_hw[1], "p32": -(-p // QGEMM_PANEL) * QGEMM_PANEL, "fill": -1 if fill is None else fill & 0xFF,
              "flip": int(flip),
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


def qconvi_dims(rows: int, depth: int, p: int, *, flip: bool, task: int = 0, tasks: int = 1) -> tuple[int, ...]:
    """The dims of one ``md_qconvi`` call (see :data:`QCONVI_DIMS`).

    Example:
        >>> qconvi_dims(64, 576, 3136, flip=False)[:5]
        (64, 576, 3136, 3136, 0)
    """
    values = {"rows": rows, "depth": depth, "p": p, "p32": -(-p // QGEMM_PANEL) * QGEMM_PANEL, "flip": int(flip),
              "task": task, "tasks": tasks}
    return tuple(values[d] for d in QCONVI_DIMS)


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


class ByteWindows:
    """64-byte loads and stores under a span of lanes where AVX-512BW's byte masks are missing
    (without them LLVM makes a masked load or store of bytes 64 branches, and a 64-lane i1 mask
    64 inserts): a load wholly inside its buffer is one load and a blend by two constant byte
    ramps, the rest (a window over the buffer's ends) goes through the stack; a store is whole
    vectors, or its first bytes copied from the stack."""

    def __init__(self, module: ir.Module, b: ir.IRBuilder) -> None:
        self.b = b
        self.v64b = ir.VectorType(I8, 64)
        self.memcpy = module.declare_intrinsic("llvm.memcpy", [PTR, PTR, I64])
        with b.goto_entry_block():
            self.spill = b.alloca(I8, size=I64(256))
            self.spill.align = 64
        self.ramps = module.globals.get("md_byte_ramps")
        if self.ramps is None:  # 64 x 0, 128 x 0xFF, 64 x 0
            ramp = ir.ArrayType(I8, 256)
            self.ramps = ir.GlobalVariable(module, ramp, "md_byte_ramps")
            self.ramps.global_constant, self.ramps.linkage = True, "internal"
            self.ramps.initializer = ir.Constant(ramp, [0] * 64 + [-1] * 128 + [0] * 64)

    def _clamped(self, v: ir.Value) -> ir.Value:
        b = self.b
        v = b.select(b.icmp_signed("<", v, I64(0)), I64(0), v)
        return b.select(b.icmp_signed(">", v, I64(64)), I64(64), v)

    def load(self, base: ir.Value, size: ir.Value, at: ir.Value, inside: ir.Value, lo: ir.Value, hi: ir.Value,
             passthru: ir.Value) -> ir.Value:
        """The 64 bytes at ``at``: lanes ``[lo, hi)`` (any i64s; clamped to [0, 64]) read where
        ``inside``, the others ``passthru``; ``[base, base + size)`` is the buffer ``at`` is in."""
        b, v64b = self.b, self.v64b
        offset = b.sub(b.ptrtoint(at, I64), b.ptrtoint(base, I64))
        safe = b.and_(inside, b.and_(b.icmp_signed(">=", offset, I64(0)),
                                     b.icmp_signed("<=", b.add(offset, I64(64)), size)))
        lo, hi = self._clamped(lo), self._clamped(hi)
        with b.if_else(safe) as (plain, copied):
            with plain:
                v = b.load(at, typ=v64b, align=1)
                keep = b.and_(b.load(b.gep(self.ramps, [b.sub(I64(64), lo)], source_etype=I8), typ=v64b, align=1),
                              b.load(b.gep(self.ramps, [b.sub(I64(192), hi)], source_etype=I8), typ=v64b, align=1))
                fast = b.or_(b.and_(v, keep), b.and_(passthru, b.xor(keep, ir.Constant(v64b, [-1] * 64))))
                fast_end = b.block
            with copied:
                b.store(passthru, b.bitcast(self.spill, v64b.as_pointer()), align=64)
                with b.if_then(b.and_(inside, b.icmp_signed(">", hi, lo))):
                    b.call(self.memcpy, [b.gep(self.spill, [lo], source_etype=I8), b.gep(at, [lo], source_etype=I8),
                                         b.sub(hi, lo), ir.IntType(1)(0)])
                slow, slow_end = b.load(self.spill, typ=v64b, align=64), b.block
        got = b.phi(v64b)
        got.add_incoming(fast, fast_end)
        got.add_incoming(slow, slow_end)
        return got

    def store(self, vectors: list[ir.Value], dst: ir.Value, count: ir.Value) -> None:
        """The first ``count`` (> 0) of the bytes of ``vectors`` (up to four of 64) at ``dst``."""
        b, v64b = self.b, self.v64b
        with b.if_else(b.icmp_signed(">=", count, I64(64 * len(vectors)))) as (whole, part):
            with whole:
                for q, v in enumerate(vectors):
                    b.store(v, b.bitcast(b.gep(dst, [I64(64 * q)], source_etype=I8), v64b.as_pointer()), align=1)
            with part:
                for q, v in enumerate(vectors):
                    b.store(v, b.bitcast(b.gep(self.spill, [I64(64 * q)], source_etype=I8), v64b.as_pointer()),
                            align=64)
                b.call(self.memcpy, [dst, self.spill, count, ir.IntType(1)(0)])


def _chunk(b: ir.IRBuilder, v: ir.Value, c: int) -> ir.Value:
    """Bytes ``[16 c, 16 c + 16)`` of a 64-byte vector."""
    return b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, 16), list(range(16 * c, 16 * c + 16))))


def _joined(b: ir.IRBuilder, xs: list[ir.Value]) -> ir.Value:
    """Four 16-byte vectors as one of 64."""
    halves = [b.shuffle_vector(xs[i], xs[i + 1], ir.Constant(ir.VectorType(I32, 32), list(range(32))))
              for i in (0, 2)]
    return b.shuffle_vector(*halves, ir.Constant(ir.VectorType(I32, 64), list(range(64))))


def _unpack(b: ir.IRBuilder, x: ir.Value, y: ir.Value, high: bool, words: bool) -> ir.Value:
    """``punpck{l,h}{bw,wd}`` of two 16-byte vectors."""
    if words:
        v8h, v16b = ir.VectorType(ir.IntType(16), 8), ir.VectorType(I8, 16)
        lanes = [4 * high + i // 2 + 8 * (i % 2) for i in range(8)]
        return b.bitcast(b.shuffle_vector(b.bitcast(x, v8h), b.bitcast(y, v8h),
                                          ir.Constant(ir.VectorType(I32, 8), lanes)), v16b)
    lanes = [8 * high + i // 2 + 16 * (i % 2) for i in range(16)]
    return b.shuffle_vector(x, y, ir.Constant(ir.VectorType(I32, 16), lanes))


def interleaved(b: ir.IRBuilder, taps: list[ir.Value]) -> list[ir.Value]:
    """Four taps' 64 pixels (64-byte vectors) as 4 x 64 bytes, pixel ``j``'s 4 at ``4 j + t``, by
    the 16-byte unpacks AVX2 has (a 64-byte shuffle of bytes across its lanes is 64 inserts
    there)."""
    out = []
    for q4 in range(4):
        c = [_chunk(b, t, q4) for t in taps]
        ab = [_unpack(b, c[0], c[1], high, False) for high in (False, True)]
        cd = [_unpack(b, c[2], c[3], high, False) for high in (False, True)]
        out.append(_joined(b, [_unpack(b, ab[h], cd[h], high, True) for h in (0, 1) for high in (False, True)]))
    return out


def even_bytes(b: ir.IRBuilder, first: ir.Value, second: ir.Value, wide: bool) -> ir.Value:
    """The even bytes of 128 (``first`` then ``second``, 64 each): one shuffle with AVX-512
    (``wide``), else 16 at a time (see :func:`interleaved`)."""
    if wide:
        return b.shuffle_vector(first, second, ir.Constant(ir.VectorType(I32, 64), [2 * i for i in range(64)]))
    lanes = ir.Constant(ir.VectorType(I32, 16), [2 * i for i in range(16)])
    return _joined(b, [b.shuffle_vector(_chunk(b, v, 2 * i), _chunk(b, v, 2 * i + 1), lanes)
                       for v in (first, second) for i in (0, 1)])


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
    slot = b.alloca(I8)
    b.store(b.trunc(d["fill"], I8), slot)
    with b.if_then(b.icmp_signed("<", d["fill"], I64(0))):  # (a zero point computed at run time)
        b.store(b.load(_arg(b, args, 2, PTR), typ=I8), slot)
    fill = b.xor(b.load(slot, typ=I8), mask)
    row_bytes = b.mul(d["p32"], I64(4))
    ow, sw = d["ow"], d["sw"]
    v64b, bit64 = ir.VectorType(I8, 64), ir.VectorType(ir.IntType(1), 64)
    load64 = _intrinsic(module, "llvm.masked.load.v64i8.p0", ir.FunctionType(v64b, [PTR, I32, bit64, v64b]))
    store64 = _intrinsic(module, "llvm.masked.store.v64i8.p0",
                         ir.FunctionType(ir.VoidType(), [v64b, PTR, I32, bit64]))
    flips = _splat(b, mask, 64)
    # (without AVX-512BW's byte masks: windows of the image, see ByteWindows)
    windows = None if host_target().has("avx512bw") else ByteWindows(module, b)
    image_bytes = b.mul(d["c"], b.mul(d["h"], d["w"]))

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
                        if windows is None:
                            parts = [b.call(load64, [b.gep(at, [I64(64 * i)], source_etype=I8), I32(1),
                                                     b.select(inside, m, none), passthru])
                                     for i, m in enumerate(masks)]
                        else:
                            parts = [windows.load(x, image_bytes, b.gep(at, [I64(64 * i)], source_etype=I8), inside,
                                                  b.sub(I64(-64 * i), start),
                                                  b.sub(b.sub(d["w"], start), I64(64 * i)), passthru)
                                     for i in range(stride)]
                        got.append(b.xor(parts[0] if stride == 1 else even_bytes(b, *parts, wide=windows is None),
                                         flips))
                    dst = b.gep(base, [b.mul(b.add(b.mul(oy, ow), ox0), I64(4))], source_etype=I8)
                    if windows is None:
                        pairs = [b.shuffle_vector(got[2 * i], got[2 * i + 1], ir.Constant(
                            ir.VectorType(I32, 64), [32 * half + j // 2 + 64 * (j % 2) for j in range(64)]))
                            for i in range(2) for half in range(2)]  # (a b pairs, then c d pairs; pixels 0-31, 32-63)
                        out = []
                        for q4 in range(4):  # (pixels 16 q4 + i: bytes 4 i + t)
                            h = q4 // 2
                            lanes = [2 * (16 * (q4 % 2) + i) + t % 2 + 64 * (t // 2)
                                     for i in range(16) for t in range(4)]
                            out.append(b.shuffle_vector(pairs[h], pairs[2 + h],
                                                        ir.Constant(ir.VectorType(I32, 64), lanes)))
                    else:
                        out = interleaved(b, got)
                    if windows is None:
                        for q4, v in enumerate(out):
                            b.call(store64, [v, b.gep(dst, [I64(64 * q4)], source_etype=I8), I32(1), stores[q4]])
                        return
                    windows.store(out, dst, b.mul(left, I64(4)))  # (the row's pixels: 4 bytes each)

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


def _qconv_tile(module: ir.Module, mr: int, ints: bool = False) -> ir.Function:
    """``tile(xp, p32, w, wrow, steps, corr, mult, y, p, cols, zy, lo, hi)``: output channels
    ``[0, mr)`` x 32 pixels: ``steps`` depth steps of 4 (the block's 32 pixels x 4 bytes from
    ``xp``, rows ``p32 * 4`` bytes apart; each channel's 4 weights broadcast), requantized with
    the channel's correction and multiplier, the first ``cols`` pixels stored (``ints``: the
    int32 sums from the correction, ``mult``, ``zy``, ``lo``, ``hi`` unused)."""
    params = [PTR, I64, PTR, I64, I64, PTR, PTR, PTR, I64, I64, F32, F32, F32]
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), params), f"md_qconv{'i' if ints else ''}_tile{mr}")
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

    start = [_splat(b, b.load(b.gep(corr, [I64(r)], source_etype=I32), typ=I32), 16) for r in range(mr) for _ in "ab"]
    final = _depth_loop(b, steps, start, step)
    if ints:
        return _stored_ints(module, b, final, mr, y, p, cols)
    out = _Requantizer(module, b, zy, lo, hi, cols)
    for r in range(mr):
        f = _splat(b, b.load(b.gep(mult, [I64(r)], source_etype=F32), typ=F32), 16)
        for h in range(2):
            out.store(final[2 * r + h], f, b.gep(y, [b.add(b.mul(I64(r), p), I64(16 * h))], source_etype=I8), h)
    b.ret_void()
    return fn


def _stored_ints(module: ir.Module, b: ir.IRBuilder, final: list[ir.Value], mr: int, y: ir.Value, p: ir.Value,
                 cols: ir.Value) -> ir.Function:
    """``md_qconvi``'s stores: the int32 sums, 16 at a time, the last block's under a mask."""
    masked = _intrinsic(module, "llvm.masked.store.v16i32.p0",
                        ir.FunctionType(ir.VoidType(), [V16I, PTR, I32, ir.VectorType(ir.IntType(1), 16)]))
    whole = b.icmp_signed(">=", cols, I64(QGEMM_PANEL))
    lanes = ir.Constant(V16I, list(range(16)))
    for h in range(2):
        mask = b.icmp_signed("<", lanes, _splat(b, b.trunc(b.sub(cols, I64(16 * h)), I32), 16))
        for r in range(mr):
            at = b.gep(y, [b.add(b.mul(I64(r), p), I64(16 * h))], source_etype=I32)
            with b.if_else(whole) as (full, part):
                with full:
                    b.store(final[2 * r + h], b.bitcast(at, V16I.as_pointer()), align=4)
                with part:
                    b.call(masked, [final[2 * r + h], at, I32(4), mask])
    b.ret_void()
    return b.function


def _qconv(module: ir.Module, ints: bool = False) -> None:
    tiles = {mr: _qconv_tile(module, mr, ints) for mr in qconv_row_tiles()}
    b, args, dims = _define(module, "md_qconvi" if ints else "md_qconv")
    xp, w, corr, mult, y = (_arg(b, args, i, PTR) for i in range(5))
    d = {name: _arg(b, dims, i, I64) for i, name in enumerate(QCONVI_DIMS if ints else QCONV_DIMS)}
    rows, p, p32 = d["rows"], d["p"], d["p32"]
    if ints:  # this run's correction, -x_zero_point * rowsum (md_qpack read int8 activations + 128)
        zy = lo = hi = F32(0.0)
        byte = b.load(mult, typ=I8)
        flipped = b.icmp_signed("!=", d["flip"], I64(0))
        za = b.select(flipped, b.add(b.sext(byte, I32), I32(128)), b.zext(byte, I32))
        sums, corr = corr, b.alloca(I32, size=rows)
        _loop(b, I64(0), rows, lambda r: b.store(b.mul(b.sub(I32(0), za), b.load(b.gep(sums, [r], source_etype=I32),
                                                                               typ=I32)),
                                                 b.gep(corr, [r], source_etype=I32)))
        corr = b.bitcast(corr, PTR)
    else:
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
                               b.gep(y, [b.add(b.mul(r, p), j0)], source_etype=I32 if ints else I8), p, cols, zy,
                               lo, hi])

        _row_tiles(b, count, qconv_row_tiles(), rows_from)

    _loop(b, first, last, unit)
    b.ret_void()



def _qconvt(module: ir.Module) -> None:
    """``md_qconvt``: ``md_qconv`` with the pixels as the tile's rows (``md_qgemm``'s tile over
    ``md_qpack``'s layout, 32 output channels a panel, stored transposed): a small plane (7 x 7
    is 49 pixels, not two blocks of 32) wastes no lanes. Args as ``md_qconv``'s, but the weights
    are ``md_qgemm``'s panels of ``[depth, rows]`` and ``corr`` / ``mult`` are padded to a
    multiple of 32; tasks share the panels."""
    tiles = {mr: _qtile(module, mr, transposed=True) for mr in QGEMM_ROW_TILES}
    b, args, dims = _define(module, "md_qconvt")
    xp, w, corr, mult, y = (_arg(b, args, i, PTR) for i in range(5))
    d = {name: _arg(b, dims, i, I64) for i, name in enumerate(QCONV_DIMS)}
    rows, p, p32 = d["rows"], d["p"], d["p32"]
    zy, lo, hi = (_float_bits(b, d[name]) for name in ("zy", "lo", "hi"))
    steps = b.sdiv(b.add(d["depth"], I64(3)), I64(4))
    step_bytes = b.mul(p32, I64(4))
    first, last = _share(b, b.sdiv(b.add(rows, I64(QGEMM_PANEL - 1)), I64(QGEMM_PANEL)), d)

    def panel(q: ir.Value) -> None:
        j0 = b.mul(q, I64(QGEMM_PANEL))
        wq = b.gep(w, [b.mul(q, b.mul(steps, I64(4 * QGEMM_PANEL)))], source_etype=I8)
        cq, mq = b.gep(corr, [j0], source_etype=I32), _elem(b, mult, j0)

        def pixels_from(r0: ir.Value, mr: int) -> None:
            at = b.gep(y, [b.add(b.mul(j0, p), r0)], source_etype=I8)
            b.call(tiles[mr], [b.gep(xp, [b.mul(r0, I64(4))], source_etype=I8), step_bytes, wq, steps, I64(0), cq, mq,
                               at, p, b.sub(rows, j0), zy, lo, hi, I64(0)])

        _row_tiles(b, p, QGEMM_ROW_TILES, pixels_from)

    _loop(b, first, last, panel)
    b.ret_void()


__all__ = ["ByteWindows", "QCONVI_DIMS", "QCONV_CHUNK", "QCONV_DIMS", "QPACK_DIMS", "even_bytes", "interleaved",
           "lanes_between", "qconv_dims", "qconv_units", "qconvi_dims", "qpack_dims"]
