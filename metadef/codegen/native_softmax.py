"""Softmax by hand, for attention and for Softmax / LogSoftmax nodes (see :mod:`.native`):
``md_softmax_rows`` and ``md_log_softmax_rows``.

For each row ``r`` of each item ``i`` of scores ``s [items, rows, n]``::

    p[i, r] = softmax(s[i, r] + mask row)      (over the n columns)

or, in ``md_log_softmax_rows`` (no mask), ``log(softmax(...))`` as ``x - max - log(sum)`` (no
``e`` stored).

the mask row (when there is one) at ``mask + (i / heads) * m_outer + (i % heads) * m_head + r *
m_row`` (strides 0 where the mask broadcasts: BERT's ``[batch, 1, 1, n]`` is ``m_outer = n``,
``m_head = m_row = 0``). A row goes in three passes over 16-float vectors while it sits in L1:
its maximum, then ``e = exp(x - max)`` stored and summed, then ``e / sum`` (one division a row);
the last ``n % 16`` columns one by one. ``exp`` is Cephes' polynomial (as the generated kernels'
``md_expf``) for arguments at most 0 (:func:`_exp`). The generated softmax kernel computes
``exp`` twice an element (once for the sum, once for the output), with the general ``exp``:
~1.05 ns an element on one Zen 4 core (BERT's 12 x 128 x 128), here ~0.4. Task ``task`` of
``tasks`` takes its share of the ``items x rows`` rows.

Example:
    >>> import ctypes, numpy as np
    >>> from metadef.codegen.native import ENTRY, native_function
    >>> s = np.array([[[0.0, 0.0], [1.0, 3.0]]], np.float32); p = np.empty_like(s)
    >>> args = (ctypes.c_void_p * 3)(s.ctypes.data, None, p.ctypes.data)
    >>> dims = softmax_dims(1, 1, 2, 2)
    >>> ENTRY(native_function("md_softmax_rows"))(args, (ctypes.c_int64 * len(dims))(*dims))
    >>> [[round(float(v), 4) for v in row] for row in p[0]]
    [[0.5, 0.5], [0.1192, 0.8808]]
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from metadef.codegen.mathlib import EXP_POLY, LN2_HI, LN2_LO, LOG2E, ROUND_MAGIC
from metadef.codegen.native_ir import F32, I32, I64, PTR, _arg, _define, _elem, _if, _loop, _share, _splat

SOFTMAX_DIMS = ("items", "heads", "rows", "n", "m_outer", "m_head", "m_row", "has_mask", "task", "tasks")
"""The dims of ``md_softmax_rows`` (and ``md_log_softmax_rows``, which takes no mask): args are
``[s [items, rows, n], mask or null, p [items, rows, n]]``; the mask's strides as in the module
doc."""

LANES = 16


def softmax_dims(items: int, heads: int, rows: int, n: int, *, mask: tuple[int, int, int] | None = None,
                 task: int = 0, tasks: int = 1) -> tuple[int, ...]:
    """The dims of one ``md_softmax_rows`` call; ``mask``: its ``(m_outer, m_head, m_row)``
    strides in floats (None: no mask).

    Example:
        >>> softmax_dims(96, 12, 128, 128, mask=(128, 0, 0))
        (96, 12, 128, 128, 128, 0, 0, 1, 0, 1)
    """
    m_outer, m_head, m_row = mask or (0, 0, 0)
    values = {"items": items, "heads": heads, "rows": rows, "n": n, "m_outer": m_outer, "m_head": m_head,
              "m_row": m_row, "has_mask": int(mask is not None), "task": task, "tasks": tasks}
    return tuple(values[d] for d in SOFTMAX_DIMS)


def _intrinsic(module: ir.Module, name: str, typ: ir.Type, arity: int) -> ir.Function:
    suffix = f"v{typ.count}f32" if isinstance(typ, ir.VectorType) else "f32"
    full = f"llvm.{name}.{suffix}"
    existing = module.globals.get(full)
    return existing if existing is not None else ir.Function(module, ir.FunctionType(typ, [typ] * arity), full)


def _exp(b: ir.IRBuilder, module: ir.Module, x: ir.Value) -> ir.Value:
    """``exp(x)`` lane by lane (or of a scalar) for ``x <= 0`` (a softmax's shifted scores), as
    the generated kernels' ``md_expf`` computes it (:mod:`.mathlib`: ``n`` rounded by the magic
    number, ``r`` by Cody and Waite, a degree-6 polynomial) but with ``2**n`` added to the
    polynomial's exponent bits (every result is normal): 0 below -87 (where ``exp`` is under
    1.7e-38: ``exp(-inf)`` is 0, as a masked score needs); NaN stays NaN."""
    typ = x.type
    lanes = typ.count if isinstance(typ, ir.VectorType) else 0
    ints = ir.VectorType(I32, lanes) if lanes else I32

    def c(value: float) -> ir.Value:
        return _splat(b, F32(value), lanes) if lanes else F32(value)

    fma = _intrinsic(module, "fmuladd", typ, 3)
    under = b.fcmp_ordered("<", x, c(-87.0))
    y = b.select(under, c(-87.0), x)
    rounded = b.call(fma, [y, c(LOG2E), c(ROUND_MAGIC)])
    n = b.fsub(rounded, c(ROUND_MAGIC))
    r = b.call(fma, [n, c(-LN2_HI), y])
    r = b.call(fma, [n, c(-LN2_LO), r])
    p = c(EXP_POLY[0])
    for coefficient in EXP_POLY[1:]:
        p = b.call(fma, [p, r, c(coefficient)])
    shift = _splat(b, I32(23), lanes) if lanes else I32(23)
    e = b.bitcast(b.add(b.bitcast(p, ints), b.shl(b.bitcast(rounded, ints), shift)), typ)
    return b.select(under, c(0.0), e)


def _reduce(b: ir.IRBuilder, v: ir.Value, combine: Callable[[ir.Value, ir.Value], ir.Value]) -> ir.Value:
    """``v``'s lanes combined pairwise, halves then quarters...: 4 steps for 16 lanes, not a
    chain of 15 (a row's two reductions were its main cost)."""
    while v.type.count > 1:
        half = v.type.count // 2
        picks = [ir.Constant(ir.VectorType(I32, half), list(range(start, start + half))) for start in (0, half)]
        low, high = (b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), pick) for pick in picks)
        v = combine(low, high)
    return b.extract_element(v, I32(0))


def _larger(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """``max(x, y)`` as one compare and select (x86's ``max``): a NaN may be dropped here, but
    the row's sum of ``exp(x - max)`` takes it, so the whole row comes out NaN as numpy's does."""
    return b.select(b.fcmp_ordered(">", x, y), x, y)


def _softmax_rows(module: ir.Module, log: bool = False) -> None:
    """``md_softmax_rows`` (two bodies, with or without a mask, chosen once a call, so a row's
    loops test no flag) or, with ``log``, ``md_log_softmax_rows`` (one body, no mask; a routine
    of its own, so a graph with no LogSoftmax never compiles it); the maximum on four
    accumulators and the sum on two (one accumulator made each pass a chain of dependent
    compares or adds)."""
    b, args, dims = _define(module, "md_log_softmax_rows" if log else "md_softmax_rows")
    s, mask, p = (_arg(b, args, i, PTR) for i in range(3))
    d = {name: _arg(b, dims, i, I64) for i, name in enumerate(SOFTMAX_DIMS)}
    n = d["n"]
    vector = ir.VectorType(F32, LANES)
    vectors = b.sdiv(n, I64(LANES))
    quads = b.sdiv(vectors, I64(4))
    whole = b.mul(vectors, I64(LANES))
    best = [b.alloca(vector) for _ in range(4)]
    total = [b.alloca(vector) for _ in range(2)]
    best1, total1 = b.alloca(F32), b.alloca(F32)
    logf = module.globals.get("logf") or ir.Function(module, ir.FunctionType(F32, [F32]), "logf")
    first, last = _share(b, b.mul(d["items"], d["rows"]), d)
    zero_v = ir.Constant(vector, [0.0] * LANES)

    def rows(masked: bool, log: bool) -> None:
        def row(u: ir.Value) -> None:
            item, r = b.sdiv(u, d["rows"]), b.srem(u, d["rows"])
            x, y = _elem(b, s, b.mul(u, n)), _elem(b, p, b.mul(u, n))
            at = b.add(b.add(b.mul(b.sdiv(item, d["heads"]), d["m_outer"]),
                             b.mul(b.srem(item, d["heads"]), d["m_head"])), b.mul(r, d["m_row"]))
            m = _elem(b, mask, at) if masked else None

            def value(j: ir.Value, typ: ir.Type) -> ir.Value:
                v = b.load(_elem(b, x, j), typ=typ, align=4)
                return v if m is None else b.fadd(v, b.load(_elem(b, m, j), typ=typ, align=4))

            def vector_at(q: ir.Value) -> ir.Value:
                return value(b.mul(q, I64(LANES)), vector)

            def keep_larger(acc: ir.Value, v: ir.Value) -> None:
                b.store(_larger(b, b.load(acc, typ=v.type), v), acc)

            for acc in best:
                b.store(ir.Constant(vector, [float("-inf")] * LANES), acc)
            b.store(F32(float("-inf")), best1)
            _loop(b, I64(0), quads, lambda q: [keep_larger(acc, vector_at(b.add(b.mul(q, I64(4)), I64(i))))
                                               for i, acc in enumerate(best)])
            _loop(b, b.mul(quads, I64(4)), vectors, lambda q: keep_larger(best[0], vector_at(q)))
            _loop(b, whole, n, lambda j: keep_larger(best1, value(j, F32)))
            pairs = [_larger(b, b.load(best[i], typ=vector), b.load(best[i + 2], typ=vector)) for i in (0, 1)]
            top = _larger(b, b.load(best1, typ=F32), _reduce(b, _larger(b, *pairs), lambda u, v: _larger(b, u, v)))
            top_v = _splat(b, top, LANES)

            def add_exp(acc: ir.Value, j: ir.Value, typ: ir.Type, shift: ir.Value) -> None:
                e = _exp(b, module, b.fsub(value(j, typ), shift))
                if not log:
                    b.store(e, b.bitcast(_elem(b, y, j), typ.as_pointer()), align=4)
                b.store(b.fadd(b.load(acc, typ=typ), e), acc)

            for acc in total:
                b.store(zero_v, acc)
            b.store(F32(0.0), total1)
            pairs_end = b.mul(b.sdiv(vectors, I64(2)), I64(2))
            _loop(b, I64(0), b.sdiv(vectors, I64(2)), lambda q: [
                add_exp(acc, b.mul(b.add(b.mul(q, I64(2)), I64(i)), I64(LANES)), vector, top_v)
                for i, acc in enumerate(total)])
            _loop(b, pairs_end, vectors, lambda q: add_exp(total[0], b.mul(q, I64(LANES)), vector, top_v))
            _loop(b, whole, n, lambda j: add_exp(total1, j, F32, top))
            sums = b.fadd(b.load(total[0], typ=vector), b.load(total[1], typ=vector))
            whole_sum = b.fadd(b.load(total1, typ=F32), _reduce(b, sums, b.fadd))
            if log:  # log(softmax) = x - (max + log(sum))
                shift = b.fadd(top, b.call(logf, [whole_sum]))
                shift_v = _splat(b, shift, LANES)
                _loop(b, I64(0), vectors, lambda q: b.store(
                    b.fsub(vector_at(q), shift_v), b.bitcast(_elem(b, y, b.mul(q, I64(LANES))), vector.as_pointer()),
                    align=4))
                _loop(b, whole, n, lambda j: b.store(b.fsub(value(j, F32), shift), _elem(b, y, j)))
                return
            scale = b.fdiv(F32(1.0), whole_sum)
            scale_v = _splat(b, scale, LANES)

            def normalize_vector(q: ir.Value) -> None:
                at = b.bitcast(_elem(b, y, b.mul(q, I64(LANES))), vector.as_pointer())
                b.store(b.fmul(b.load(at, typ=vector, align=4), scale_v), at, align=4)

            _loop(b, I64(0), vectors, normalize_vector)
            _loop(b, whole, n, lambda j: b.store(b.fmul(b.load(_elem(b, y, j), typ=F32), scale), _elem(b, y, j)))

        _loop(b, first, last, row)

    nonempty = b.icmp_signed(">", n, I64(0))
    if log:
        _if(b, nonempty, lambda: rows(False, True))
    else:
        has_mask = b.icmp_signed("!=", d["has_mask"], I64(0))
        _if(b, b.and_(nonempty, has_mask), lambda: rows(True, False))
        _if(b, b.and_(nonempty, b.not_(has_mask)), lambda: rows(False, False))
    b.ret_void()


def _log_softmax_rows(module: ir.Module) -> None:
    _softmax_rows(module, log=True)


__all__ = ["SOFTMAX_DIMS", "softmax_dims"]
