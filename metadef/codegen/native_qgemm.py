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
fit in int32 for ``k`` below 65793); on a host with AVX2 only, each is four ``vpmaddwd`` of the
bytes widened to 16 bits (:func:`_dot_avx2`), as exact, and the 512-bit vectors are pairs of
256-bit ones. Activations that are int8 (``flip``) are read as
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
from metadef.codegen.native_ir import (
    F32,
    I32,
    I64,
    PTR,
    _arg,
    _carried,
    _define,
    _elem,
    _float_bits,
    _loop,
    _merged,
    _share,
    _splat,
)
from metadef.codegen.native_tile import _row_tiles

QGEMM_DIMS = ("m", "n", "k", "lda", "ldy", "zy", "lo", "hi", "flip", "task", "tasks")
"""The dims of ``md_qgemm``: args are ``[a [m, k] (8-bit, rows lda bytes apart), packed weights,
corr (int32) [ceil(n/32)*32], mult (float32) [ceil(n/32)*32], y [m, n] (8-bit, rows ldy apart)]``;
``zy``, ``lo``, ``hi``: float32 bits (the output's zero point and saturation range); ``flip``:
1 where ``a`` is int8."""

QGEMMF_DIMS = ("m", "n", "k", "lda", "ldy", "lo", "hi", "flip", "wide", "task", "tasks")
"""The dims of ``md_qgemmf`` (float32 output): args are ``[a [m, k] (8-bit, rows lda bytes apart),
packed weights, base (int32), colsum (int32), w_scale (float32), bias (float32), rowterm
(int32) (these five [ceil(n/32)*32]), a_scale (float32 [1]), a_zero_point (8-bit [1]), y [m, n]
(float32, rows ldy floats apart)]``; ``lo``, ``hi``: float32 bits (a clip); ``flip``: 1 where
``a`` is int8; ``wide``: 1 where each sum also takes ``rowterm[j]`` times the row's byte sum
(uint8 weights whose zero point leaves them outside int8 are packed as ``W - 128``, and
``(128 - zero point) * sum_k a[i, k]`` restores them; ``colsum`` then holds
``sum_k (W - 128) + k * rowterm``)."""

QGEMM_PANEL = 32
"""The columns of a weight panel (and of the tile): two 512-bit registers of int32 sums."""

QGEMM_ROW_TILES = (12, 8, 4, 2, 1)
"""The row counts of the tiles, largest first (``md_qgemm``'s on any host, ``md_qconv``'s with
AVX512-VNNI: :func:`qconv_row_tiles`)."""

MAX_DEPTH = 65792
"""The largest ``k`` whose int32 sums cannot overflow (255 * 128 * k < 2**31)."""

V16I = ir.VectorType(I32, 16)
V16F = ir.VectorType(F32, 16)
V16B = ir.VectorType(ir.IntType(8), 16)
I8 = ir.IntType(8)


def qconv_row_tiles() -> tuple[int, ...]:
    """The row (output channel) counts of ``md_qconv``'s tiles on this host, largest first:
    :data:`QGEMM_ROW_TILES` with AVX512-VNNI; with AVX2, where a row of 32 pixels is four 256-bit
    accumulators and each step widens the pixels' bytes (:func:`_dot_avx2`), 4, 2, 1
    (measured on Zen 3, one core: a 3x3 conv of 64 channels over 56x56 19 -> 38 GMAC/s,
    128 over 28x28 19 -> 30, against 12-row tiles). ``md_qgemm``'s tiles stay 12 rows: its
    broadcast operand is the activations, its widened one the weights, shared by 12 rows
    (BERT's 128 x 768 x 768: 46 GMAC/s, 42 with 4 rows, 35 with 2; a host with 40-60 % steal
    time, so within its noise).

    Example:
        >>> qconv_row_tiles()[-1]
        1
    """
    return QGEMM_ROW_TILES if has_vnni() else (4, 2, 1)


def int8_isa(has: Callable[[str], bool] | None = None) -> str | None:
    """The instruction set the quantized routines use on a CPU with the features ``has`` says
    it has (default: this host's; a :class:`metadef.DeviceProfile`'s ``has`` reads the same
    names): ``"AVX512-VNNI"`` (one ``vpdpbusd`` per four products a lane), ``"AVX2"`` (see
    :func:`has_int8_products`), or None, where they do not run.

    Example:
        >>> int8_isa(lambda f: f == "avx2"), int8_isa(lambda f: False)
        ('AVX2', None)
    """
    has = has or host_target().has
    if has("avx512vnni") and has("avx512bw"):
        return "AVX512-VNNI"
    return "AVX2" if has("avx2") else None


def has_vnni() -> bool:
    """Whether this host has AVX512-VNNI (``md_qgemm``'s products are then one ``vpdpbusd``).

    Example:
        >>> isinstance(has_vnni(), bool)
        True
    """
    return int8_isa() == "AVX512-VNNI"


def has_int8_products() -> bool:
    """Whether the quantized routines (``md_qgemm``, ``md_qgemmf``, ``md_qconv``...) run on this
    host: with AVX512-VNNI, or with AVX2, where each 256-bit half of a ``vpdpbusd`` is two
    ``vpmaddwd`` of the bytes widened to 16 bits (exact, like VNNI; ONNX Runtime's AVX2 kernel
    sums byte pairs with ``vpmaddubsw`` in saturating int16 instead).

    Example:
        >>> has_vnni() <= has_int8_products()
        True
    """
    return int8_isa() is not None


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


def qgemmf_dims(m: int, n: int, k: int, *, lo: float = -np.inf, hi: float = np.inf, lda: int | None = None,
                ldy: int | None = None, flip: bool = False, wide: bool = False, task: int = 0,
                tasks: int = 1) -> tuple[int, ...]:
    """The dims of one ``md_qgemmf`` call (see :data:`QGEMMF_DIMS`; ``lda`` defaults to ``k``,
    ``ldy`` to ``n``).

    Example:
        >>> qgemmf_dims(128, 768, 768)[:5]
        (128, 768, 768, 768, 768)
    """
    values = {"m": m, "n": n, "k": k, "lda": k if lda is None else lda, "ldy": n if ldy is None else ldy,
              "lo": _bits(lo), "hi": _bits(hi), "flip": int(flip), "wide": int(wide), "task": task, "tasks": tasks}
    return tuple(values[d] for d in QGEMMF_DIMS)


def _dot(module: ir.Module) -> ir.Function:
    """``dot(acc, u, s)``: ``acc`` plus, in each of 16 int32 lanes, the lane's 4 unsigned bytes of
    ``u`` times its 4 signed bytes of ``s``: ``vpdpbusd`` with AVX512-VNNI, else
    :func:`_dot_avx2`."""
    name = "llvm.x86.avx512.vpdpbusd.512" if has_vnni() else "md_dpbusd_avx2"
    found = module.globals.get(name)
    if found is not None:
        return found
    fn = ir.Function(module, ir.FunctionType(V16I, [V16I] * 3), name)
    if not has_vnni():
        _dot_avx2(module, fn)
    return fn


def _dot_avx2(module: ir.Module, fn: ir.Function) -> None:
    """``vpdpbusd`` on AVX2, exactly, a 256-bit half at a time: the unsigned bytes at even and
    odd places widened to 16 bits (a mask, a shift), the signed ones too (two arithmetic
    shifts), and ``vpmaddwd`` of each pair of halves (two products of at most 255 * 128 a
    lane, no saturation) added to the accumulator."""
    fn.linkage = "internal"
    fn.attributes.add("alwaysinline")
    v8i, v16h = ir.VectorType(I32, 8), ir.VectorType(ir.IntType(16), 16)
    madd = _intrinsic(module, "llvm.x86.avx2.pmadd.wd", ir.FunctionType(v8i, [v16h, v16h]))
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    acc, u, s = fn.args
    eight, low = ir.Constant(v16h, [8] * 16), ir.Constant(v16h, [0xFF] * 16)
    halves = []
    for h in range(2):
        lanes = ir.Constant(ir.VectorType(I32, 8), list(range(8 * h, 8 * h + 8)))
        uh, sh = (b.bitcast(b.shuffle_vector(v, v, lanes), v16h) for v in (u, s))
        total = b.shuffle_vector(acc, acc, lanes)
        even = b.call(madd, [b.and_(uh, low), b.ashr(b.shl(sh, eight), eight)])
        odd = b.call(madd, [b.lshr(uh, eight), b.ashr(sh, eight)])
        halves.append(b.add(total, b.add(even, odd)))
    b.ret(b.shuffle_vector(halves[0], halves[1], ir.Constant(V16I, list(range(16)))))


def _intrinsic(module: ir.Module, name: str, typ: ir.FunctionType) -> ir.Function:
    found = module.globals.get(name)
    return found if found is not None else ir.Function(module, typ, name)


def _depth_loop(b: ir.IRBuilder, steps: ir.Value, start: list[ir.Value],
                step: Callable[[ir.Value, list[ir.Value]], list[ir.Value]]) -> list[ir.Value]:
    """Accumulators (of ``start``'s types: int32 x 16 for the tiles, the correction in them so
    that the stores add nothing) over depth steps ``[0, steps)``: ``step(s, accs)`` gives their
    next values."""
    return _carried(b, I64(0), steps, start, step)


class _Requantizer:
    """The stores of a tile: ``clip(rint(float32(acc) * mult) + zy, lo, hi)`` as bytes (``acc``
    began at the correction; ``rint`` in the default rounding mode, to nearest even),
    16 lanes at a time, the last panel's or block's under a mask of its ``cols``."""

    def __init__(self, module: ir.Module, b: ir.IRBuilder, zy: ir.Value, lo: ir.Value, hi: ir.Value,
                 cols: ir.Value) -> None:
        self.b = b
        self.rint = _intrinsic(module, "llvm.lrint.v16i32.v16f32", ir.FunctionType(V16I, [V16F]))
        self.masked = _intrinsic(module, "llvm.masked.store.v16i8.p0",
                                 ir.FunctionType(ir.VoidType(), [V16B, PTR, I32, ir.VectorType(ir.IntType(1), 16)]))
        # clip(rint(v) + zy, lo, hi) as rint(clip(v, lo - zy, hi - zy)) + zy (the bounds are whole
        # numbers): one conversion to int32, and no value too large to convert
        self.zy = _splat(b, b.fptosi(zy, I32), 16)
        self.lo, self.hi = (_splat(b, b.fsub(v, zy), 16) for v in (lo, hi))
        lanes = ir.Constant(V16I, list(range(16)))
        self.whole = b.icmp_signed(">=", cols, I64(QGEMM_PANEL))
        self.masks = [b.icmp_signed("<", lanes, _splat(b, b.trunc(b.sub(cols, I64(16 * h)), I32), 16))
                      for h in range(2)]
        self.lanes = [[b.icmp_signed("<", I64(16 * h + j), cols) for j in range(16)] for h in range(2)]

    def store(self, acc: ir.Value, mult: ir.Value, at: ir.Value, half: int, stride: ir.Value | None = None) -> None:
        b = self.b
        v = b.fmul(b.sitofp(acc, V16F), mult)
        v = b.select(b.fcmp_ordered("<", v, self.lo), self.lo, v)
        v = b.select(b.fcmp_ordered(">", v, self.hi), self.hi, v)
        q = b.trunc(b.add(b.call(self.rint, [v]), self.zy), V16B)
        if stride is not None:  # (lane j to at + j * stride: a column of the output)
            for j in range(16):
                with b.if_then(self.lanes[half][j]):
                    b.store(b.extract_element(q, I32(j)), b.gep(at, [b.mul(I64(j), stride)], source_etype=I8))
            return
        with b.if_else(self.whole) as (full, part):
            with full:
                b.store(q, at, align=1)
            with part:
                b.call(self.masked, [q, at, I32(1), self.masks[half]])


def _qtile(module: ir.Module, mr: int, transposed: bool = False, floats: bool = False) -> ir.Function:
    """``tile(a, lda, w, steps, tail, corr, mult, y, ldy, cols, zy, lo, hi, flip)``: rows
    ``[0, mr)`` x the panel's 32 columns: ``steps`` full depth steps of 4, then (``tail`` > 0)
    the last ``tail`` depths, requantized and stored (the first ``cols`` columns).

    ``floats`` (``md_qgemmf``'s tile, three more params ``rowterm, k, wide``): ``zy`` is a
    pointer to the panel's 32 float32 biases and the stores are ``clip(float32(acc + rowsum *
    rowterm) * mult + bias, lo, hi)`` in float32 (``ldy`` in floats; ``rowsum``: the row's
    bytes summed where ``wide``, else 0).

    ``transposed`` (``md_qconvt``'s tile): ``a`` is ``md_qpack``'s layout, a row's 4 bytes of a
    depth step at ``a + 4 r + s * lda``, and the tile is stored transposed, ``y[r, j]`` at
    ``y + r + j * ldy``; no tail, no flip (``md_qpack`` pads the depth and flips the bytes)."""
    params = [PTR, I64, PTR, I64, I64, PTR, PTR, PTR, I64, I64, PTR if floats else F32, F32, F32, I64]
    params += [PTR, I64, I64] if floats else []
    name = f"md_q{'convt' if transposed else 'gemmf' if floats else 'gemm'}_tile{mr}"
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), params), name)
    fn.linkage = "internal"
    fn.attributes.add("alwaysinline")
    a, lda, w, steps, tail, _, _, _, _, _, _, _, _, flip = fn.args[:14]
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    dot = _dot(module)
    rows = [b.gep(a, [b.mul(I64(r), I64(4) if transposed else lda)], source_etype=I8) for r in range(mr)]
    step_bytes = lda if transposed else I64(4)

    def word_at(r: int, offset: ir.Value) -> ir.Value:
        at = b.gep(rows[r], [offset], source_etype=I8)
        return b.load(at, typ=I32, align=1)

    corr = fn.args[5]
    start = [b.load(b.gep(corr, [I64(16 * h)], source_etype=I32), typ=V16I, align=4) for h in range(2)] * mr

    def depth_loop(flipped: bool) -> list[ir.Value]:
        def step(s: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
            panel = b.gep(w, [b.mul(s, I64(4 * QGEMM_PANEL))], source_etype=I8)
            halves = [b.load(b.gep(panel, [I64(64 * h)], source_etype=I8), typ=V16I, align=64) for h in range(2)]
            new = []
            for r in range(mr):
                word = word_at(r, b.mul(s, step_bytes))
                if flipped:
                    word = b.xor(word, I32(-0x7F7F7F80))  # 0x80808080
                v = _splat(b, word, 16)
                new += [b.call(dot, [accs[2 * r + h], v, halves[h]]) for h in range(2)]
            return new

        return _depth_loop(b, steps, start, step)

    if transposed:
        return _stored(module, b, fn, depth_loop(False), mr, transposed)
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
    final = _merged(b, accs, before, tailed, inside)
    if floats:
        return _stored_floats(module, b, fn, final, mr, _row_sums(module, b, rows, mr, *fn.args[15:17], flip))
    return _stored(module, b, fn, final, mr, transposed)


def _sad(module: ir.Module) -> ir.Function:
    """``vpsadbw`` of 64 bytes (8 sums of 8 absolute differences, int64): one 512-bit one with
    AVX-512, else two 256-bit ones."""
    v64b, v8q = ir.VectorType(I8, 64), ir.VectorType(I64, 8)
    if has_vnni():
        return _intrinsic(module, "llvm.x86.avx512.psad.bw.512", ir.FunctionType(v8q, [v64b, v64b]))
    found = module.globals.get("md_psadbw_avx2")
    if found is not None:
        return found
    v32b, v4q = ir.VectorType(I8, 32), ir.VectorType(I64, 4)
    half = _intrinsic(module, "llvm.x86.avx2.psad.bw", ir.FunctionType(v4q, [v32b, v32b]))
    fn = ir.Function(module, ir.FunctionType(v8q, [v64b, v64b]), "md_psadbw_avx2")
    fn.linkage = "internal"
    fn.attributes.add("alwaysinline")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    parts = []
    for h in range(2):
        lanes = ir.Constant(ir.VectorType(I32, 32), list(range(32 * h, 32 * h + 32)))
        parts.append(b.call(half, [b.shuffle_vector(v, v, lanes) for v in fn.args]))
    b.ret(b.shuffle_vector(parts[0], parts[1], ir.Constant(ir.VectorType(I32, 8), list(range(8)))))
    return fn


def _row_sums(module: ir.Module, b: ir.IRBuilder, rows: list[ir.Value], mr: int, k: ir.Value, wide: ir.Value,
              flip: ir.Value) -> list[ir.Value]:
    """Each row's ``k`` bytes summed (as read: int8 ones + 128), 64 a ``vpsadbw``; 0 unless ``wide``."""
    v64b = ir.VectorType(I8, 64)
    bits = ir.VectorType(ir.IntType(1), 64)
    v8q = ir.VectorType(I64, 8)
    load = _intrinsic(module, "llvm.masked.load.v64i8.p0", ir.FunctionType(v64b, [PTR, I32, bits, v64b]))
    sad = _sad(module)
    total = _intrinsic(module, "llvm.vector.reduce.add.v8i64", ir.FunctionType(I64, [v8q]))
    flipped = _splat(b, b.trunc(b.mul(flip, I64(0x80)), I8), 64)
    zero = ir.Constant(v64b, [0] * 64)
    pre = b.block
    masked = has_vnni()  # (AVX-512BW's byte-masked loads; without, a masked load is 64 branches)
    with b.if_then(b.icmp_signed("!=", wide, I64(0))):  # (every row's chunks in one loop, sums in registers)
        chunks = b.sdiv(b.add(k, I64(63)), I64(64)) if masked else b.sdiv(k, I64(64))

        def step(j: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
            left = b.sub(k, b.mul(j, I64(64)))
            ones = b.select(b.icmp_signed(">=", left, I64(64)), I64(-1), b.sub(b.shl(I64(1), left), I64(1)))
            lanes = b.bitcast(ones, bits)
            new = []
            for r in range(mr):  # (lanes past k load as the flip mask: 0 once flipped)
                at = b.gep(rows[r], [b.mul(j, I64(64))], source_etype=I8)
                v = b.call(load, [at, I32(1), lanes, flipped]) if masked else b.load(at, typ=v64b, align=1)
                new.append(b.add(accs[r], b.call(sad, [b.xor(v, flipped), zero])))
            return new

        summed = _depth_loop(b, chunks, [ir.Constant(v8q, [0] * 8)] * mr, step)
        sums = [b.trunc(b.call(total, [v]), I32) for v in summed]
        if not masked:  # the last k % 64 bytes one by one
            done = b.mul(chunks, I64(64))

            def byte(i: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
                return [b.add(acc, b.zext(b.xor(b.load(b.gep(rows[r], [b.add(done, i)], source_etype=I8), typ=I8),
                                                b.trunc(b.mul(flip, I64(0x80)), I8)), I32))
                        for r, acc in enumerate(accs)]

            sums = _depth_loop(b, b.sub(k, done), sums, byte)
        inside = b.block
    out = []
    for value in sums:
        phi = b.phi(I32)
        phi.add_incoming(I32(0), pre)
        phi.add_incoming(value, inside)
        out.append(phi)
    return out


def _stored_floats(module: ir.Module, b: ir.IRBuilder, fn: ir.Function, final: list[ir.Value], mr: int,
                   row_sums: list[ir.Value]) -> ir.Function:
    """``md_qgemmf``'s stores: ``clip(float32(acc + rowsum * rowterm) * mult + bias, lo, hi)``, two
    roundings as the reference's (no fused multiply-add), 16 floats at a time, the last panel's
    under a mask."""
    mult, y, ldy, cols, bias, lo, hi = fn.args[6:13]
    rowterm = fn.args[14]
    masked = _intrinsic(module, "llvm.masked.store.v16f32.p0",
                        ir.FunctionType(ir.VoidType(), [V16F, PTR, I32, ir.VectorType(ir.IntType(1), 16)]))
    lo, hi = _splat(b, lo, 16), _splat(b, hi, 16)
    whole = b.icmp_signed(">=", cols, I64(QGEMM_PANEL))
    lanes = ir.Constant(V16I, list(range(16)))
    for h in range(2):
        f = b.load(b.gep(mult, [I64(16 * h)], source_etype=F32), typ=V16F, align=4)
        add = b.load(b.gep(bias, [I64(16 * h)], source_etype=F32), typ=V16F, align=4)
        term = b.load(b.gep(rowterm, [I64(16 * h)], source_etype=I32), typ=V16I, align=4)
        mask = b.icmp_signed("<", lanes, _splat(b, b.trunc(b.sub(cols, I64(16 * h)), I32), 16))
        for r in range(mr):
            acc = b.add(final[2 * r + h], b.mul(_splat(b, row_sums[r], 16), term))
            v = b.fadd(b.fmul(b.sitofp(acc, V16F), f), add)
            v = b.select(b.fcmp_ordered("<", v, lo), lo, v)
            v = b.select(b.fcmp_ordered(">", v, hi), hi, v)
            at = b.gep(y, [b.add(b.mul(I64(r), ldy), I64(16 * h))], source_etype=F32)
            with b.if_else(whole) as (full, part):
                with full:
                    b.store(v, at, align=4)
                with part:
                    b.call(masked, [v, at, I32(4), mask])
    b.ret_void()
    return fn


def _stored(module: ir.Module, b: ir.IRBuilder, fn: ir.Function, final: list[ir.Value], mr: int,
            transposed: bool) -> ir.Function:
    """The tile's requantizing stores (see :func:`_qtile`), and its return."""
    mult, y, ldy, cols, zy, lo, hi = fn.args[6:13]
    out = _Requantizer(module, b, zy, lo, hi, cols)
    for h in range(2):
        f = b.load(b.gep(mult, [I64(16 * h)], source_etype=F32), typ=V16F, align=4)
        for r in range(mr):
            if transposed:
                at = b.gep(y, [b.add(I64(r), b.mul(I64(16 * h), ldy))], source_etype=I8)
                out.store(final[2 * r + h], f, at, h, stride=ldy)
            else:
                out.store(final[2 * r + h], f, b.gep(y, [b.add(b.mul(I64(r), ldy), I64(16 * h))], source_etype=I8), h)
    b.ret_void()
    return fn


def _geometry(b: ir.IRBuilder, d: dict[str, ir.Value]) -> tuple[ir.Value, ...]:
    """A product's full depth steps of 4, the depths after them, the steps with those, and this
    task's panels ``[first, last)``."""
    k = d["k"]
    panels = b.sdiv(b.add(d["n"], I64(QGEMM_PANEL - 1)), I64(QGEMM_PANEL))
    return (b.sdiv(k, I64(4)), b.srem(k, I64(4)), b.sdiv(b.add(k, I64(3)), I64(4)), *_share(b, panels, d))


def _qgemm(module: ir.Module) -> None:
    tiles = {mr: _qtile(module, mr) for mr in QGEMM_ROW_TILES}
    b, args, dims = _define(module, "md_qgemm")
    a, w, corr, mult, y = (_arg(b, args, i, PTR) for i in range(5))
    d = {name: _arg(b, dims, i, I64) for i, name in enumerate(QGEMM_DIMS)}
    m, n, lda, ldy = d["m"], d["n"], d["lda"], d["ldy"]
    zy, lo, hi = (_float_bits(b, d[name]) for name in ("zy", "lo", "hi"))
    steps, tail, depth, first, last = _geometry(b, d)

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


def _qgemmf(module: ir.Module) -> None:
    tiles = {mr: _qtile(module, mr, floats=True) for mr in QGEMM_ROW_TILES}
    b, args, dims = _define(module, "md_qgemmf")
    a, w, base, colsum, scale, bias, rowterm, a_scale, a_zero, y = (_arg(b, args, i, PTR) for i in range(10))
    d = {name: _arg(b, dims, i, I64) for i, name in enumerate(QGEMMF_DIMS)}
    m, n, k, lda, ldy = d["m"], d["n"], d["k"], d["lda"], d["ldy"]
    lo, hi = (_float_bits(b, d[name]) for name in ("lo", "hi"))
    flipped = b.icmp_signed("!=", d["flip"], I64(0))
    byte = b.load(a_zero, typ=I8)
    # the activations' zero point as md_qgemm's bytes read it: int8 ones shifted by 128
    za = b.select(flipped, b.add(b.sext(byte, I32), I32(128)), b.zext(byte, I32))
    za, sa = _splat(b, za, 16), _splat(b, b.load(a_scale, typ=F32), 16)
    stack = b.alloca(I32, size=I64(2 * QGEMM_PANEL))
    stack.align = 64
    corr = b.bitcast(stack, PTR)  # 32 int32, then 32 float32
    mult = b.gep(corr, [I64(4 * QGEMM_PANEL)], source_etype=I8)
    steps, tail, depth, first, last = _geometry(b, d)

    def panel(q: ir.Value) -> None:
        j0 = b.mul(q, I64(QGEMM_PANEL))
        for h in range(2):  # this run's correction (base - za * colsum) and multiplier (a_scale * w_scale)
            at = b.add(j0, I64(16 * h))
            start = b.load(b.gep(base, [at], source_etype=I32), typ=V16I, align=4)
            sums = b.load(b.gep(colsum, [at], source_etype=I32), typ=V16I, align=4)
            to = b.bitcast(b.gep(corr, [I64(16 * h)], source_etype=I32), V16I.as_pointer())
            b.store(b.sub(start, b.mul(za, sums)), to, align=4)
            ws = b.load(_elem(b, scale, at), typ=V16F, align=4)
            b.store(b.fmul(sa, ws), b.bitcast(_elem(b, mult, I64(16 * h)), V16F.as_pointer()), align=4)
        cols = b.sub(n, j0)
        wq = b.gep(w, [b.mul(q, b.mul(depth, I64(4 * QGEMM_PANEL)))], source_etype=I8)
        bq = _elem(b, bias, j0)

        def rows_from(r0: ir.Value, mr: int) -> None:
            at = b.gep(y, [b.add(b.mul(r0, ldy), j0)], source_etype=F32)
            b.call(tiles[mr], [b.gep(a, [b.mul(r0, lda)], source_etype=I8), lda, wq, steps, tail, corr, mult, at, ldy,
                               cols, bq, lo, hi, d["flip"], b.gep(rowterm, [j0], source_etype=I32), k, d["wide"]])

        _row_tiles(b, m, QGEMM_ROW_TILES, rows_from)

    _loop(b, first, last, panel)
    b.ret_void()


__all__ = ["MAX_DEPTH", "QGEMMF_DIMS", "QGEMM_DIMS", "QGEMM_PANEL", "QGEMM_ROW_TILES", "has_int8_products", "has_vnni",
           "pack_qgemm_weights", "qconv_row_tiles", "qgemm_dims", "qgemmf_dims"]
