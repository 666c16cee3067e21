"""A batched product of two activations by our micro-kernel: ``md_bmm`` (attention's
``Q Kᵀ`` and ``P V``).

For each batch item ``i``::

    y[i] = alpha * a[i] @ b[i]          (b[i] read as [k, n], or with trans_b as [n, k])

Unlike ``md_gemm``, whose weights are packed once, ``b`` changes every run: each item's ``b``
is packed here, scaled by ``alpha``, into the panels :func:`~.native_gemm.gemm_panel` columns
wide that ``md_gemm``'s tile reads (``[ceil(n/width), k, width]``, zero-padded), in a buffer
on the thread's stack (at most :data:`BMM_STACK_FLOATS`; the lowering checks the size), then
the rows of ``a`` pass in tiles of :func:`~.native_gemm.gemm_row_tiles` rows. BERT's heads
(a 128 x 64 by 64 x 128 product, and 128 x 128 by 128 x 64) pack 8 K floats each, which
costs little next to their 1-2 MFLOP; OpenBLAS packs as much, and its kernels are the AVX2 ones
where ``OPENBLAS_CORETYPE`` holds it to Haswell. Task ``task`` of ``tasks`` takes its share
of the batch items.

Example:
    >>> import ctypes, numpy as np
    >>> from metadef.codegen.native import ENTRY, native_function
    >>> a = np.arange(6, dtype=np.float32).reshape(1, 2, 3); b = np.ones((1, 4, 3), np.float32)
    >>> y = np.empty((1, 2, 4), np.float32)
    >>> args = (ctypes.c_void_p * 3)(a.ctypes.data, b.ctypes.data, y.ctypes.data)
    >>> dims = bmm_dims(1, 2, 4, 3, trans_b=True, alpha=0.5)
    >>> ENTRY(native_function("md_bmm"))(args, (ctypes.c_int64 * len(dims))(*dims))
    >>> y[0].tolist()
    [[1.5, 1.5, 1.5, 1.5], [6.0, 6.0, 6.0, 6.0]]
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable

from llvmlite import ir

from metadef.codegen.native_gemm import gemm_panel, gemm_row_tiles
from metadef.codegen.native_ir import F32, I64, PTR, V8, _arg, _define, _elem, _float_bits, _loop, _share, _smin, _splat
from metadef.codegen.native_tile import _row_tiles, _tile, _transpose8

BMM_DIMS = ("batch", "m", "n", "k", "trans_b", "alpha", "a_batch", "b_batch", "y_batch", "task", "tasks",
            "heads", "a_head", "b_head", "y_head", "lda", "ldb", "ldy")
"""The dims of ``md_bmm``: args are ``[a [batch, m, k], b [batch, k, n] (trans_b: [batch, n,
k]), y [batch, m, n]]``; ``alpha``: float32 bits. Item ``i`` is head ``i % heads`` of group
``i // heads``: its matrices start ``(i // heads) * *_batch + (i % heads) * *_head`` floats in
(``*_batch`` 0: the same matrix for every group), their rows ``lda``, ``ldb``, ``ldy`` floats
apart (attention with the heads after the sequence: ``[b, s, h, d]`` read in place)."""

BMM_STACK_FLOATS = 1 << 15
"""The most floats of packed ``b`` one batch item may take (128 KB on the thread's stack):
``ceil(n / width) * width * k``, see :func:`bmm_packed_floats`."""


def bmm_packed_floats(n: int, k: int) -> int:
    """The floats ``md_bmm`` packs one item's ``b [k, n]`` into.

    Example:
        >>> bmm_packed_floats(128, 64) <= BMM_STACK_FLOATS
        True
    """
    width = gemm_panel()
    return -(-n // width) * width * k


def bmm_dims(batch: int, m: int, n: int, k: int, *, trans_b: bool = False, alpha: float = 1.0,
             strides: tuple[int, int, int] | None = None, heads: int = 1,
             head_strides: tuple[int, int, int] = (0, 0, 0), rows: tuple[int, int, int] | None = None,
             task: int = 0, tasks: int = 1) -> tuple[int, ...]:
    """The dims of one ``md_bmm`` call (see :data:`BMM_DIMS`); ``strides``: the floats between
    groups of ``heads`` items of ``a``, ``b`` and ``y`` (default: the items packed one after
    another), ``head_strides`` between the heads of a group; ``rows``: the floats between rows
    (default: dense).

    Example:
        >>> bmm_dims(12, 128, 128, 64, trans_b=True)[:5]
        (12, 128, 128, 64, 1)
        >>> bmm_dims(12, 128, 128, 64, trans_b=True, strides=(0, 0, 0), heads=12, head_strides=(64, 64, 16384),
        ...          rows=(768, 768, 128))[-7:]
        (12, 64, 64, 16384, 768, 768, 128)
    """
    a_batch, b_batch, y_batch = strides or (m * k, k * n, m * n)
    lda, ldb, ldy = rows or (k, k if trans_b else n, n)
    alpha_bits = struct.unpack("<I", struct.pack("<f", alpha))[0]
    values = {"batch": batch, "m": m, "n": n, "k": k, "trans_b": int(trans_b), "alpha": alpha_bits,
              "a_batch": a_batch, "b_batch": b_batch, "y_batch": y_batch, "task": task, "tasks": tasks,
              "heads": heads, "a_head": head_strides[0], "b_head": head_strides[1], "y_head": head_strides[2],
              "lda": lda, "ldb": ldb, "ldy": ldy}
    return tuple(values[d] for d in BMM_DIMS)


def _bmm(module: ir.Module) -> None:
    width, sizes = gemm_panel(), gemm_row_tiles()
    tiles = {mr: _tile(module, f"md_bmm_tile{mr}", mr, column_bias=True, width=width) for mr in sizes}
    b, args, dims = _define(module, "md_bmm")
    a, bm, y = (_arg(b, args, i, PTR) for i in range(3))
    d = {name: _arg(b, dims, i, I64) for i, name in enumerate(BMM_DIMS)}
    m, n, k, alpha = d["m"], d["n"], d["k"], _float_bits(b, d["alpha"])
    transposed = b.icmp_signed("!=", d["trans_b"], I64(0))
    buffer = b.alloca(F32, size=I64(BMM_STACK_FLOATS))
    buffer.align = 64
    packed = b.bitcast(buffer, PTR)
    zeros = b.alloca(ir.ArrayType(F32, width))
    b.store(ir.Constant(ir.ArrayType(F32, width), [0.0] * width), zeros)
    panels = b.sdiv(b.add(n, I64(width - 1)), I64(width))
    first, last = _share(b, d["batch"], d)
    null = ir.Constant(PTR, None)
    unbounded = (F32(-math.inf), F32(math.inf))

    def column_base(col: ir.Value) -> ir.Value:  # where column col of b's [k, n] view starts, packed
        return b.add(b.mul(b.sdiv(col, I64(width)), b.mul(k, I64(width))), b.srem(col, I64(width)))

    def pad(col: ir.Value) -> None:  # the last panel's columns past n: zeros, once for every item
        base = column_base(col)
        _loop(b, I64(0), k, lambda kk: b.store(F32(0.0), _elem(b, packed, b.add(base, b.mul(kk, I64(width))))))

    _loop(b, n, b.mul(panels, I64(width)), pad)

    lda, ldb, ldy = d["lda"], d["ldb"], d["ldy"]

    def item(i: ir.Value) -> None:
        group, head = b.sdiv(i, d["heads"]), b.srem(i, d["heads"])

        def at(name: str) -> ir.Value:
            return b.add(b.mul(group, d[f"{name}_batch"]), b.mul(head, d[f"{name}_head"]))
        ai, bi, yi = _elem(b, a, at("a")), _elem(b, bm, at("b")), _elem(b, y, at("y"))

        def pack_column(col: ir.Value, at: Callable[[ir.Value], ir.Value]) -> None:
            """Column ``col`` into its panel, element by element (``at(kk)``: its step kk in ``b``)."""
            base = column_base(col)

            def step(kk: ir.Value) -> None:
                value = b.fmul(b.load(_elem(b, bi, at(kk)), typ=F32), alpha)
                b.store(value, _elem(b, packed, b.add(base, b.mul(kk, I64(width)))))
            _loop(b, I64(0), k, step)

        def pack_rows() -> None:  # b [k, n]: each panel's rows are contiguous pieces of b's rows
            vector = ir.VectorType(F32, width)
            scale = _splat(b, alpha, width)
            whole = b.sdiv(n, I64(width))

            def panel_rows(q: ir.Value) -> None:
                def row(kk: ir.Value) -> None:
                    piece = b.load(_elem(b, bi, b.add(b.mul(kk, ldb), b.mul(q, I64(width)))), typ=vector, align=4)
                    at = _elem(b, packed, b.mul(b.add(b.mul(q, k), kk), I64(width)))
                    b.store(b.fmul(piece, scale), b.bitcast(at, vector.as_pointer()), align=4)
                _loop(b, I64(0), k, row)
            _loop(b, I64(0), whole, panel_rows)
            # a last narrower panel, column by column
            _loop(b, b.mul(whole, I64(width)), n, lambda col: pack_column(col, lambda kk: b.add(b.mul(kk, ldb), col)))

        def pack_blocks() -> None:  # b [n, k] (trans_b): 8 x 8 blocks transposed in registers
            scale = _splat(b, alpha)

            def columns(cb: ir.Value) -> None:
                col0 = b.mul(cb, I64(8))
                base = column_base(col0)

                def block(kb: ir.Value) -> None:
                    kk0 = b.mul(kb, I64(8))
                    rows = [b.load(_elem(b, bi, b.add(b.mul(b.add(col0, I64(r)), ldb), kk0)), typ=V8, align=4)
                            for r in range(8)]
                    for i, piece in enumerate(_transpose8(b, rows)):
                        at = _elem(b, packed, b.add(base, b.mul(b.add(kk0, I64(i)), I64(width))))
                        b.store(b.fmul(piece, scale), b.bitcast(at, V8.as_pointer()), align=4)
                _loop(b, I64(0), b.sdiv(k, I64(8)), block)

                def step(kk: ir.Value) -> None:  # the last few steps of k, element by element
                    for r in range(8):
                        value = b.fmul(b.load(_elem(b, bi, b.add(b.mul(b.add(col0, I64(r)), ldb), kk)), typ=F32),
                                       alpha)
                        b.store(value, _elem(b, packed, b.add(b.add(base, I64(r)), b.mul(kk, I64(width)))))
                _loop(b, b.mul(b.sdiv(k, I64(8)), I64(8)), k, step)
            _loop(b, I64(0), b.sdiv(n, I64(8)), columns)
            _loop(b, b.mul(b.sdiv(n, I64(8)), I64(8)), n,  # the last few columns, one by one
                  lambda col: pack_column(col, lambda kk: b.add(b.mul(col, ldb), kk)))

        with b.if_else(transposed) as (then, otherwise):
            with then:
                pack_blocks()
            with otherwise:
                pack_rows()

        def panel(q: ir.Value) -> None:
            j0 = b.mul(q, I64(width))
            cols = _smin(b, I64(width), b.sub(n, j0))
            wq = _elem(b, packed, b.mul(q, b.mul(k, I64(width))))

            def rows_from(r0: ir.Value, mr: int) -> None:
                b.call(tiles[mr], [wq, I64(width), _elem(b, ai, b.mul(r0, lda)), lda, I64(1), k,
                                   _elem(b, yi, b.add(b.mul(r0, ldy), j0)), ldy, null, b.bitcast(zeros, PTR), I64(mr),
                                   cols, *unbounded])

            _row_tiles(b, m, sizes, rows_from)

        _loop(b, I64(0), panels, panel)

    _loop(b, first, last, item)
    b.ret_void()


__all__ = ["BMM_DIMS", "BMM_STACK_FLOATS", "bmm_dims", "bmm_packed_floats"]
