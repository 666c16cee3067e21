"""TopK along rows by hand (see :mod:`.native`): ``md_topk_rows``.

For each row of ``x [rows, n]`` (float32) the ``k`` largest (or smallest) elements and their
positions, in TopK's order: by value, ties by the lower position; NaN counts as larger than
everything (after the infinities) and NaNs among themselves by position, as the reference's
stable sort orders them (so ``largest`` takes NaNs first and ``smallest`` last). A row is read
once, keeping its best ``k`` so far in a sorted list on the stack: an element enters only when
it beats the list's last, and the list shifts to make room (for random data about ``k log(n /
k)`` entries a row). Task ``task`` of ``tasks`` takes its share of the rows.

Example:
    >>> import ctypes, numpy as np
    >>> from metadef.codegen.native import ENTRY, native_function
    >>> x = np.array([[3.0, 1.0, 3.0, 7.0]], np.float32)
    >>> values, index = np.empty((1, 2), np.float32), np.empty((1, 2), np.int64)
    >>> args = (ctypes.c_void_p * 3)(x.ctypes.data, values.ctypes.data, index.ctypes.data)
    >>> dims = topk_dims(1, 4, 2, largest=True)
    >>> ENTRY(native_function("md_topk_rows"))(args, (ctypes.c_int64 * len(dims))(*dims))
    >>> values.tolist(), index.tolist()
    ([[7.0, 3.0]], [[3, 0]])
"""

from __future__ import annotations

from llvmlite import ir

from metadef.codegen.native_ir import F32, I64, PTR, _arg, _define, _elem, _if, _loop, _share

TOPK_DIMS = ("rows", "n", "k", "largest", "task", "tasks")
"""The dims of ``md_topk_rows``: args are ``[x [rows, n], values [rows, k], indices (int64)
[rows, k]]``; ``largest`` 1 or 0."""

MAX_K = 256
"""The most elements a row's list holds (on the stack); a larger K runs elsewhere."""


def topk_dims(rows: int, n: int, k: int, *, largest: bool, task: int = 0, tasks: int = 1) -> tuple[int, ...]:
    """The dims of one ``md_topk_rows`` call.

    Example:
        >>> topk_dims(64, 1000, 5, largest=True)
        (64, 1000, 5, 1, 0, 1)
    """
    return rows, n, k, int(largest), task, tasks


def _topk_rows(module: ir.Module) -> None:
    """The routine: a body for largest and one for smallest (chosen once a call); each row
    first fills its list with its first ``k`` elements, then lets in only what beats the
    list's last (one load and a compare an element for the rest)."""
    b, args, dims = _define(module, "md_topk_rows")
    x, values, indices = (_arg(b, args, i, PTR) for i in range(3))
    d = {name: _arg(b, dims, i, I64) for i, name in enumerate(TOPK_DIMS)}
    n, k = d["n"], d["k"]
    keys = b.alloca(F32, size=I64(MAX_K))
    places = b.alloca(I64, size=I64(MAX_K))
    hole = b.alloca(I64)
    first, last = _share(b, d["rows"], d)

    def rows(largest: bool) -> None:
        def beats(a: ir.Value, c: ir.Value) -> ir.Value:
            """Whether key ``a`` goes before key ``c`` (ties: neither): larger; a NaN before
            any number when ``largest`` (the largest of all), after any when not (the last)."""
            a_nan, c_nan = b.fcmp_unordered("uno", a, a), b.fcmp_unordered("uno", c, c)
            nan = b.and_(a_nan, b.not_(c_nan)) if largest else b.and_(c_nan, b.not_(a_nan))
            return b.or_(nan, b.fcmp_ordered(">", a, c))

        def insert(key: ir.Value, j: ir.Value, start: ir.Value) -> None:
            """``key`` (element ``j``) into the sorted list, from position ``start`` up."""
            b.store(start, hole)
            head, body, done = (b.append_basic_block(name) for name in ("shift", "shift_body", "shifted"))
            b.branch(head)
            b.position_at_end(head)
            p = b.load(hole, typ=I64)
            above = b.sub(p, I64(1))
            with b.if_else(b.icmp_signed(">", p, I64(0))) as (then, otherwise):
                with then:
                    moves_then = beats(key, b.load(b.gep(keys, [above], source_etype=F32), typ=F32))
                    then_block = b.block
                with otherwise:
                    otherwise_block = b.block
            moves = b.phi(ir.IntType(1))
            moves.add_incoming(moves_then, then_block)
            moves.add_incoming(ir.Constant(ir.IntType(1), 0), otherwise_block)
            b.cbranch(moves, body, done)
            b.position_at_end(body)
            b.store(b.load(b.gep(keys, [above], source_etype=F32), typ=F32), b.gep(keys, [p], source_etype=F32))
            b.store(b.load(b.gep(places, [above], source_etype=I64), typ=I64), b.gep(places, [p], source_etype=I64))
            b.store(above, hole)
            b.branch(head)
            b.position_at_end(done)
            p = b.load(hole, typ=I64)
            b.store(key, b.gep(keys, [p], source_etype=F32))
            b.store(j, b.gep(places, [p], source_etype=I64))

        def row(r: ir.Value) -> None:
            src = _elem(b, x, b.mul(r, n))

            def key_of(j: ir.Value) -> ir.Value:  # (smallest: the largest of -v; a NaN stays one)
                v = b.load(_elem(b, src, j), typ=F32)
                return v if largest else b.fneg(v)

            _loop(b, I64(0), k, lambda j: insert(key_of(j), j, j))  # the first k, sorted as they come
            end = b.gep(keys, [b.sub(k, I64(1))], source_etype=F32)

            def rest(j: ir.Value) -> None:
                key = key_of(j)
                _if(b, beats(key, b.load(end, typ=F32)), lambda: insert(key, j, b.sub(k, I64(1))))

            _loop(b, k, n, rest)

            def out(i: ir.Value) -> None:
                place = b.load(b.gep(places, [i], source_etype=I64), typ=I64)
                at = b.add(b.mul(r, k), i)
                b.store(b.load(_elem(b, src, place), typ=F32), _elem(b, values, at))
                b.store(place, b.gep(indices, [at], source_etype=I64))

            _loop(b, I64(0), k, out)

        _loop(b, first, last, row)

    fits = b.and_(b.icmp_signed(">", k, I64(0)), b.and_(b.icmp_signed("<=", k, n), b.icmp_signed("<=", k, I64(MAX_K))))
    largest = b.icmp_signed("!=", d["largest"], I64(0))
    _if(b, b.and_(fits, largest), lambda: rows(True))
    _if(b, b.and_(fits, b.not_(largest)), lambda: rows(False))
    b.ret_void()


__all__ = ["MAX_K", "TOPK_DIMS", "topk_dims"]
