"""Our own GEMM micro-kernel for pointwise (1x1) convolutions, with the epilogue fused at store.

``md_conv1x1`` computes, for each image ``i``, output channel ``r`` and pixel ``j``::

    y[i, r, j] = clip(sum_k W[r, k] * x[i, k, j] + bias[r] (+ res[i, r, j]), lo, hi)

``x`` is read in place (``[n, cin, p]``: NCHW with the pixels flattened), so a pointwise conv
needs no packing of its input and no workspace; the weights are packed once, at bind time, in
panels of :data:`MR` output channels (``[ceil(cout / MR), cin, MR]``, zero-padded; see
:func:`pack_conv1x1_weights`). The register tile is :data:`MR` channels x :data:`NR` pixels (12
AVX2 accumulators), and the bias, the residual add and the activation (Relu is ``lo = 0``,
Clip any bounds) are applied in registers before the one store: no second pass over the
output as a separate epilogue kernel would make. A last partial block of pixels is computed as
the block ending at ``p`` (overlapping the previous one, which writes the same values), so
``p >= NR`` is required.

The blocks are walked pixels-outer (``order = 0``: one ``cin x NR`` panel of ``x`` stays in L1
while every weight panel passes) or channels-outer (``order = 1``: one weight panel stays while
the pixels pass, for convs whose weights outweigh their input); task ``task`` of ``tasks`` takes
its share of the outer blocks of all images, so a call splits across threads.

Example:
    >>> import ctypes, numpy as np
    >>> from metadef.codegen.native import ENTRY, native_function
    >>> x = np.arange(2 * 16, dtype=np.float32).reshape(1, 2, 16)
    >>> w = np.array([[1.0, 2.0]], np.float32)
    >>> y = np.empty((1, 1, 16), np.float32)
    >>> packed, bias = pack_conv1x1_weights(w), np.zeros(1, np.float32)
    >>> args = (ctypes.c_void_p * 5)(x.ctypes.data, packed.ctypes.data, bias.ctypes.data, None, y.ctypes.data)
    >>> dims = conv1x1_dims(1, 2, 1, 16)
    >>> ENTRY(native_function("md_conv1x1"))(args, (ctypes.c_int64 * len(dims))(*dims))
    >>> bool(np.array_equal(y[0, 0], w[0] @ x[0]))
    True
"""

from __future__ import annotations

import math
import struct

import numpy as np
from llvmlite import ir

from metadef.codegen.native_ir import F32, I32, I64, PTR, _arg, _define, _elem, _float_bits, _if, _loop

MR, NR = 6, 16
"""The register tile: output channels x pixels (two 8-float vectors a channel)."""

CONV1X1_DIMS = ("n", "cin", "cout", "p", "has_res", "lo", "hi", "order", "task", "tasks")
"""The dims of ``md_conv1x1``: args are ``[x, packed weights, bias, residual or null, y]``;
``lo`` and ``hi`` are float32 bits (``-inf`` / ``inf`` for no bound)."""

V8 = ir.VectorType(F32, 8)


def pack_conv1x1_weights(w: np.ndarray) -> np.ndarray:
    """``W [cout, cin, (1, 1)]`` in the panels ``md_conv1x1`` reads: ``[ceil(cout/MR), cin, MR]``.

    Example:
        >>> pack_conv1x1_weights(np.ones((7, 3), np.float32)).shape
        (2, 3, 6)
    """
    cout, cin = w.shape[0], int(np.prod(w.shape[1:]))
    panels = -(-cout // MR)
    padded = np.zeros((panels * MR, cin), np.float32)
    padded[:cout] = w.reshape(cout, cin)
    return np.ascontiguousarray(padded.reshape(panels, MR, cin).transpose(0, 2, 1))


def _bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def conv1x1_dims(n: int, cin: int, cout: int, p: int, *, residual: bool = False, lo: float = -math.inf,
                 hi: float = math.inf, order: int = 0, task: int = 0, tasks: int = 1) -> tuple[int, ...]:
    """The dims of one ``md_conv1x1`` call (see :data:`CONV1X1_DIMS`).

    Example:
        >>> conv1x1_dims(1, 16, 96, 12544)[:4]
        (1, 16, 96, 12544)
    """
    values = {"n": n, "cin": cin, "cout": cout, "p": p, "has_res": int(residual), "lo": _bits(lo),
              "hi": _bits(hi), "order": order, "task": task, "tasks": tasks}
    return tuple(values[d] for d in CONV1X1_DIMS)


def _splat(b: ir.IRBuilder, value: ir.Value) -> ir.Value:
    v = b.insert_element(ir.Constant(V8, ir.Undefined), value, I32(0))
    return b.shuffle_vector(v, ir.Constant(V8, ir.Undefined), ir.Constant(ir.VectorType(I32, 8), [0] * 8))


def _tile(module: ir.Module) -> ir.Function:
    """``tile(x, p, w, cin, y, res, bias, rows, lo, hi)``: one MR x NR block of the output."""
    fma = ir.Function(module, ir.FunctionType(V8, [V8, V8, V8]), "llvm.fma.v8f32")
    params = [PTR, I64, PTR, I64, PTR, PTR, PTR, I64, F32, F32]
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), params), "md_conv1x1_tile")
    fn.linkage = "internal"
    fn.attributes.add("alwaysinline")
    for i in (0, 2, 4, 5, 6):
        fn.args[i].add_attribute("noalias")
    x, p, w, cin, y, res, bias, rows, lo, hi = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    zero = ir.Constant(V8, [0.0] * 8)
    pre = b.block
    head = b.append_basic_block("k")
    done = b.append_basic_block("store")
    b.cbranch(b.icmp_signed("<", I64(0), cin), head, done)
    b.position_at_end(head)
    k = b.phi(I64)
    k.add_incoming(I64(0), pre)
    acc = [[b.phi(V8) for _ in range(2)] for _ in range(MR)]
    for row in acc:
        for a in row:
            a.add_incoming(zero, pre)
    src = _elem(b, x, b.mul(k, p))
    xs = [b.load(_elem(b, src, I64(8 * h)), typ=V8, align=4) for h in range(2)]
    panel = _elem(b, w, b.mul(k, I64(MR)))
    nxt = []
    for r in range(MR):
        a = _splat(b, b.load(_elem(b, panel, I64(r)), typ=F32))
        nxt.append([b.call(fma, [a, xs[h], acc[r][h]]) for h in range(2)])
    k1 = b.add(k, I64(1))
    k.add_incoming(k1, b.block)
    for r in range(MR):
        for h in range(2):
            acc[r][h].add_incoming(nxt[r][h], b.block)
    b.cbranch(b.icmp_signed("<", k1, cin), head, done)
    b.position_at_end(done)
    final = [[b.phi(V8) for _ in range(2)] for _ in range(MR)]
    for r in range(MR):
        for h in range(2):
            final[r][h].add_incoming(zero, pre)
            final[r][h].add_incoming(nxt[r][h], head)
    low, high = _splat(b, lo), _splat(b, hi)
    with_res = b.icmp_signed("!=", b.ptrtoint(res, I64), I64(0))
    for r in range(MR):
        def store(r: int = r) -> None:
            offset = b.mul(I64(r), p)
            beta = _splat(b, b.load(_elem(b, bias, I64(r)), typ=F32))
            for h in range(2):
                at = b.add(offset, I64(8 * h))
                v = b.fadd(final[r][h], beta)
                v = b.fadd(v, b.select(with_res, b.load(_elem(b, res, at), typ=V8, align=4), zero))
                v = b.select(b.fcmp_ordered("<", v, low), low, v)
                v = b.select(b.fcmp_ordered(">", v, high), high, v)
                b.store(v, _elem(b, y, at), align=4)
        _if(b, b.icmp_signed("<", I64(r), rows), store)
    b.ret_void()
    return fn


def _conv1x1(module: ir.Module) -> None:
    tile = _tile(module)
    b, args, dims = _define(module, "md_conv1x1")
    x, w, bias, res, y = (_arg(b, args, i, PTR) for i in range(5))
    d = {name: _arg(b, dims, i, I64) for i, name in enumerate(CONV1X1_DIMS)}
    lo, hi = _float_bits(b, d["lo"]), _float_bits(b, d["hi"])
    has_res = b.icmp_signed("!=", d["has_res"], I64(0))
    p, cin, cout = d["p"], d["cin"], d["cout"]
    col_blocks = b.sdiv(b.add(p, I64(NR - 1)), I64(NR))
    row_blocks = b.sdiv(b.add(cout, I64(MR - 1)), I64(MR))
    pixels_outer = b.icmp_signed("==", d["order"], I64(0))
    outer = b.select(pixels_outer, col_blocks, row_blocks)
    inner = b.select(pixels_outer, row_blocks, col_blocks)
    units = b.mul(d["n"], outer)
    first = b.sdiv(b.mul(units, d["task"]), d["tasks"])
    last = b.sdiv(b.mul(units, b.add(d["task"], I64(1))), d["tasks"])
    null = ir.Constant(PTR, None)

    def unit(u: ir.Value) -> None:
        image = b.sdiv(u, outer)
        block = b.srem(u, outer)
        xi = _elem(b, x, b.mul(image, b.mul(cin, p)))
        yi = b.mul(image, b.mul(cout, p))

        def one(v: ir.Value) -> None:
            cb = b.select(pixels_outer, block, v)
            rb = b.select(pixels_outer, v, block)
            j0 = b.mul(cb, I64(NR))
            j0 = b.select(b.icmp_signed(">", b.add(j0, I64(NR)), p), b.sub(p, I64(NR)), j0)
            r0 = b.mul(rb, I64(MR))
            at = b.add(yi, b.add(b.mul(r0, p), j0))
            rows = b.sub(cout, r0)
            b.call(tile, [_elem(b, xi, j0), p, _elem(b, w, b.mul(rb, b.mul(cin, I64(MR)))), cin,
                          _elem(b, y, at), b.select(has_res, _elem(b, res, at), null),
                          _elem(b, bias, r0), rows, lo, hi])

        _loop(b, I64(0), inner, one)

    _if(b, b.icmp_signed(">=", p, I64(NR)), lambda: _loop(b, first, last, unit))
    b.ret_void()


__all__ = ["CONV1X1_DIMS", "MR", "NR", "conv1x1_dims", "pack_conv1x1_weights"]
