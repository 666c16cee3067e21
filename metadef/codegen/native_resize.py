"""Linear and cubic resizing of planes by hand (see :mod:`.native`): ``md_resize2d``.

For each plane ``p`` of ``x [planes, h, w]`` and each output row ``oy``, the row's taps (input
rows ``r[oy, k]``, weights ``a[oy, k]``) are blended into one row of ``w`` floats on the stack,
a vector loop::

    t[j] = sum_k a[oy, k] * x[p, r[oy, k], j]

then each output column takes its taps of that row (input columns ``c[ox, k]``, weights
``b[ox, k]``)::

    y[p, oy, ox] = sum_k b[ox, k] * t[c[ox, k]]

The tables come from the reference's own interpolation (``metadef.ops.defs.nn_resize.axis_taps``:
every coordinate mode, linear or cubic, edge-clamped), so the routine only does arithmetic;
in float32, where the reference sums in float64. Two and four taps have loops of their own (a
constant count, unrolled); any other count loops over them. Task ``task`` of ``tasks`` takes its
share of the ``planes x oh`` output rows.

Example:
    >>> import ctypes, numpy as np
    >>> from metadef.codegen.native import ENTRY, native_function
    >>> x = np.array([[[0.0, 4.0]]], np.float32); y = np.empty((1, 1, 4), np.float32)
    >>> rows, rw = np.zeros((1, 2), np.int32), np.array([[1.0, 0.0]], np.float32)
    >>> cols = np.array([[0, 0], [0, 1], [0, 1], [1, 1]], np.int32)
    >>> cw = np.array([[1, 0], [0.75, 0.25], [0.25, 0.75], [0, 1]], np.float32)
    >>> arrays = [x, y, rows, rw, cols, cw]
    >>> args = (ctypes.c_void_p * 6)(*[a.ctypes.data for a in arrays])
    >>> dims = resize2d_dims(1, 1, 2, 1, 4, 2)
    >>> ENTRY(native_function("md_resize2d"))(args, (ctypes.c_int64 * len(dims))(*dims))
    >>> y.tolist()
    [[[0.0, 1.0, 3.0, 4.0]]]
"""

from __future__ import annotations

from llvmlite import ir

from metadef.codegen.native_ir import F32, I32, I64, PTR, _arg, _define, _elem, _if, _loop, _share

RESIZE2D_DIMS = ("planes", "h", "w", "oh", "ow", "taps", "task", "tasks")
"""The dims of ``md_resize2d``: args are ``[x [planes, h, w], y [planes, oh, ow], row indices
(int32 [oh, taps]), row weights (float32 [oh, taps]), column indices (int32 [ow, taps]),
column weights (float32 [ow, taps])]``."""

ROW_FLOATS = 16384
"""The longest input row the routine blends on its stack (64 KB); wider planes go elsewhere."""


def resize2d_dims(planes: int, h: int, w: int, oh: int, ow: int, taps: int, task: int = 0,
                  tasks: int = 1) -> tuple[int, ...]:
    """The dims of one ``md_resize2d`` call.

    Example:
        >>> resize2d_dims(512, 56, 56, 112, 112, 2)
        (512, 56, 56, 112, 112, 2, 0, 1)
    """
    return planes, h, w, oh, ow, taps, task, tasks


def _resize2d(module: ir.Module) -> None:
    b, args, dims = _define(module, "md_resize2d")
    x, y, rows, row_w, cols, col_w = (_arg(b, args, i, PTR) for i in range(6))
    d = {name: _arg(b, dims, i, I64) for i, name in enumerate(RESIZE2D_DIMS)}
    w, oh, ow, taps = d["w"], d["oh"], d["ow"], d["taps"]
    blend = b.alloca(F32, size=w)
    total = b.alloca(F32)
    first, last = _share(b, b.mul(d["planes"], oh), d)

    def index(table: ir.Value, at: ir.Value) -> ir.Value:
        return b.sext(b.load(b.gep(table, [at], source_etype=I32), typ=I32), I64)

    def row(u: ir.Value) -> None:
        plane, oy = b.sdiv(u, oh), b.srem(u, oh)
        src = _elem(b, x, b.mul(plane, b.mul(d["h"], w)))
        dst = _elem(b, y, b.mul(u, ow))
        base = b.mul(oy, taps)

        def tap_row(k: ir.Value) -> tuple[ir.Value, ir.Value]:
            at = b.add(base, k)
            return _elem(b, src, b.mul(index(rows, at), w)), b.load(_elem(b, row_w, at), typ=F32)

        line, weight = tap_row(I64(0))
        _loop(b, I64(0), w, lambda j: b.store(b.fmul(weight, b.load(_elem(b, line, j), typ=F32)), _elem(b, blend, j)))

        def add_row(k: ir.Value) -> None:
            line, weight = tap_row(k)

            def one(j: ir.Value) -> None:
                at = _elem(b, blend, j)
                b.store(b.fadd(b.load(at, typ=F32), b.fmul(weight, b.load(_elem(b, line, j), typ=F32))), at)

            _loop(b, I64(0), w, one)

        _loop(b, I64(1), taps, add_row)

        def column_taps(count: int) -> None:  # a constant count: the loop over columns vectorizes
            def column(ox: ir.Value) -> None:
                at = b.mul(ox, I64(count))
                acc = F32(0.0)
                for k in range(count):
                    tap = b.add(at, I64(k))
                    value = b.load(_elem(b, blend, index(cols, tap)), typ=F32)
                    acc = b.fadd(acc, b.fmul(b.load(_elem(b, col_w, tap), typ=F32), value))
                b.store(acc, _elem(b, dst, ox))

            _loop(b, I64(0), ow, column)

        def any_taps() -> None:
            def column(ox: ir.Value) -> None:
                at = b.mul(ox, taps)
                b.store(F32(0.0), total)

                def tap(k: ir.Value) -> None:
                    value = b.load(_elem(b, blend, index(cols, b.add(at, k))), typ=F32)
                    term = b.fmul(b.load(_elem(b, col_w, b.add(at, k)), typ=F32), value)
                    b.store(b.fadd(b.load(total, typ=F32), term), total)

                _loop(b, I64(0), taps, tap)
                b.store(b.load(total, typ=F32), _elem(b, dst, ox))

            _loop(b, I64(0), ow, column)

        two, four = b.icmp_signed("==", taps, I64(2)), b.icmp_signed("==", taps, I64(4))
        _if(b, two, lambda: column_taps(2))
        _if(b, four, lambda: column_taps(4))
        _if(b, b.not_(b.or_(two, four)), any_taps)

    _loop(b, first, last, row)
    b.ret_void()


__all__ = ["RESIZE2D_DIMS", "ROW_FLOATS", "resize2d_dims"]
