"""Gathers and scatters at index values by hand (see :mod:`.native`): GatherElements,
ScatterElements, GatherND and ScatterND.

Each routine walks the positions of its indices in order and moves one *unit* per position
between a *far* buffer, addressed through the index, and a *near* one, read or written in
order: a gather copies from the far data to the near output, a scatter from the near updates
into the far output (which its caller first filled with a copy of the data). How a unit moves
is the call's *mode* (:func:`element_mode`): plain bytes (one load and store for a unit of
one element of 1, 2, 4 or 8 bytes, else ``memcpy``), or ``dst = op(dst, src)`` element by
element for ScatterND's and ScatterElements' reductions, which only ``md_scatter_elements_reduce``
and ``md_scatter_nd_reduce`` take (:func:`scatter_routine`): a graph without them compiles none
of their code. The common cases (int64 or int32 indices, 4- or 8-byte elements, whole slices)
each have a loop of their own, chosen once a call; the rest switch on the mode per unit.

- ``md_gather_elements(data, indices, out, status)`` and ``md_scatter_elements(updates,
  indices, out, status)`` (:data:`ELEMENTS_DIMS`): one element per position of the indices,
  which are walked as up to :data:`MAX_LEVELS` nested loops (:func:`elements_dims` merges the
  dims that are one block): the far element of position ``(i0, ..., ir)`` lies at
  ``sum(i_d * stride_d) + index * axis_stride`` bytes (the axis' own stride counted 0).
- ``md_gather_nd(data, indices, out, status)`` and ``md_scatter_nd(updates, indices, out,
  status)`` (:data:`ND_DIMS`, then a (size, byte stride) pair per indexed axis): per batch and
  query, the ``depth`` int64 indices pick the far unit (a slice of ``unit`` elements).

Every index is checked; a negative one counts from the end. An index out of range moves
nothing (a gather writes zeros instead) and is reported in the int64 status words:
``status[0] = 1``, ``status[1] = the index`` and, for the ND routines, ``status[2] = the
indexed axis`` (counted from the first indexed one), which the caller reads after the run.
Positions are visited in the order of the indices, so a scatter's repeated index keeps the
last update (numpy's assignment does the same) and a reduction combines them in that order.

Example:
    >>> import ctypes, numpy as np
    >>> from metadef.codegen.native import ENTRY, native_function
    >>> data = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32)
    >>> index = np.array([[2, 0], [-1, 1]], np.int64)
    >>> out, status = np.empty((2, 2), np.float32), np.zeros(2, np.int64)
    >>> dims = elements_dims(data.shape, index.shape, 1, 4, 8, element_mode(data.dtype))
    >>> args = [a.ctypes.data for a in (data, index, out, status)]
    >>> ENTRY(native_function("md_gather_elements"))((ctypes.c_void_p * 4)(*args), (ctypes.c_int64 * len(dims))(*dims))
    >>> out.tolist(), status.tolist()
    ([[3.0, 1.0], [6.0, 5.0]], [0, 0])
    >>> index[0, 0] = 3  # out of range: a zero, and the status says which index
    >>> ENTRY(native_function("md_gather_elements"))((ctypes.c_void_p * 4)(*args), (ctypes.c_int64 * len(dims))(*dims))
    >>> out.tolist(), status.tolist()
    ([[0.0, 1.0], [6.0, 5.0]], [1, 3])
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import numpy as np
from llvmlite import ir

from metadef.codegen.native_ir import I64, PTR, _arg, _define, _if, _loop

MAX_LEVELS = 6
"""The most loops an elements routine nests (after merging); more runs elsewhere."""

ELEMENTS_DIMS = ("axis_size", "axis_stride", "index_bytes", "itemsize", "mode",
                 *(f"{name}{k}" for k in range(MAX_LEVELS) for name in ("count", "stride")))
"""The dims of ``md_gather_elements`` / ``md_scatter_elements``: the indexed axis' size and
byte stride in the far buffer, the indices' width (4 or 8), the element's bytes, the mode,
then per loop (outermost first) its count and its byte stride in the far buffer."""

ND_DIMS = ("batch", "queries", "depth", "unit", "unit_bytes", "mode", "batch_bytes")
"""The dims of ``md_gather_nd`` / ``md_scatter_nd`` before their ``depth`` (size, byte stride)
pairs: ``batch`` blocks of ``batch_bytes`` in the far buffer, each with ``queries`` index
tuples of ``depth`` int64 indices (``indices [batch, queries, depth]``, the near buffer
``[batch, queries, unit]``); a unit is ``unit`` elements, ``unit_bytes`` bytes."""

SCATTER_ROUTINES = ("md_gather_elements", "md_scatter_elements", "md_scatter_elements_reduce", "md_gather_nd",
                    "md_scatter_nd", "md_scatter_nd_reduce")
"""The routines of this module."""

REDUCTIONS = ("add", "mul", "max", "min")
"""The reductions the routines combine with (besides ``none``, a copy)."""

REDUCED_TYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int32), np.dtype(np.int64))
"""The element types they combine."""

VECTOR_BYTES = 32
"""A reduction combines units this many bytes at a time (AVX2's vectors), the rest one by one."""

_COPIES = {1: 1, 2: 2, 4: 3, 8: 4}  # a one-element unit of this many bytes -> its mode (mode 0: memcpy)
_FIRST_REDUCTION = 8

COPY_MODES = (0, *_COPIES.values())
"""The modes of the plain routines: copies."""
REDUCTION_MODES = tuple(_FIRST_REDUCTION + k for k in range(len(REDUCTIONS) * len(REDUCED_TYPES)))
"""The modes of ``md_scatter_elements_reduce`` and ``md_scatter_nd_reduce``: reductions."""


def element_mode(dtype: np.dtype, reduction: str = "none", unit: int = 1) -> int | None:
    """The mode moving a unit of ``unit`` elements of ``dtype`` (``reduction``: how a scatter
    combines it with what is there), or None when the routines cannot.

    Example:
        >>> element_mode(np.dtype(np.float32)), element_mode(np.dtype(np.float32), unit=768)
        (3, 0)
        >>> element_mode(np.dtype(np.int64), "max"), element_mode(np.dtype(np.uint8), "add")
        (19, None)
    """
    dtype = np.dtype(dtype)
    if reduction == "none":
        return _COPIES.get(dtype.itemsize, 0) if unit == 1 else 0
    if reduction not in REDUCTIONS or dtype not in REDUCED_TYPES:
        return None
    return _FIRST_REDUCTION + REDUCTIONS.index(reduction) * len(REDUCED_TYPES) + REDUCED_TYPES.index(dtype)


def scatter_routine(nd: bool, reduction: str) -> str:
    """The routine of a ScatterND (``nd``) or ScatterElements with ``reduction``.

    Example:
        >>> scatter_routine(True, "none"), scatter_routine(False, "add")
        ('md_scatter_nd', 'md_scatter_elements_reduce')
    """
    return f"md_scatter_{'nd' if nd else 'elements'}" + ("" if reduction == "none" else "_reduce")


def elements_dims(data: Sequence[int], indices: Sequence[int], axis: int, itemsize: int, index_bytes: int,
                  mode: int) -> tuple[int, ...] | None:
    """The dims of an elements routine over ``data`` (the far buffer's shape) and
    ``indices`` along ``axis``, or None when the loops do not fit in :data:`MAX_LEVELS`. The
    indices may be smaller than the data on the other axes (never larger: the caller checks).

    Example:
        >>> elements_dims((64, 1000), (64, 100), 1, 4, 8, 3)[:9]
        (1000, 4, 8, 4, 3, 1, 0, 1, 0)
        >>> elements_dims((64, 1000), (64, 100), 1, 4, 8, 3)[-4:]  # 64 rows of 4000 bytes, 100 at stride 0
        (64, 4000, 100, 0)
    """
    strides = [math.prod(data[d + 1:]) * itemsize for d in range(len(data))]
    levels: list[tuple[int, int]] = []
    for d, count in enumerate(indices):
        stride = 0 if d == axis else strides[d]
        if count == 1:
            continue
        if levels and levels[-1][1] == count * stride:  # one block with the loop outside it
            levels[-1] = (levels[-1][0] * count, stride)
        else:
            levels.append((count, stride))
    if len(levels) > MAX_LEVELS:
        return None
    levels = [(1, 0)] * (MAX_LEVELS - len(levels)) + levels
    return (data[axis], strides[axis], index_bytes, itemsize, mode, *(v for level in levels for v in level))


def nd_dims(batch: int, queries: int, unit: int, itemsize: int, mode: int, batch_bytes: int,
            axes: Sequence[tuple[int, int]]) -> tuple[int, ...]:
    """The dims of an ND routine; ``axes``: each indexed axis' (size, byte stride).

    Example:
        >>> nd_dims(8, 16, 768, 4, 0, 128 * 768 * 4, [(128, 768 * 4)])
        (8, 16, 1, 768, 3072, 0, 393216, 128, 3072)
    """
    return (batch, queries, len(axes), unit, unit * itemsize, mode, batch_bytes, *(v for axis in axes for v in axis))


def _memcpy(b: ir.IRBuilder, dst: ir.Value, src: ir.Value, count: ir.Value) -> None:
    b.call(b.module.declare_intrinsic("llvm.memcpy", [PTR, PTR, I64]), [dst, src, count, ir.IntType(1)(0)])


def _combine(b: ir.IRBuilder, op: str, dtype: np.dtype, a: ir.Value, u: ir.Value) -> ir.Value:
    """``op(a, u)`` as numpy computes it: integers wrap; a NaN wins max and min (``maximum``)."""
    if dtype.kind == "f":
        if op in ("add", "mul"):
            return b.fadd(a, u) if op == "add" else b.fmul(a, u)
        keep = b.or_(b.fcmp_ordered(">=" if op == "max" else "<=", a, u), b.fcmp_unordered("uno", a, a))
        return b.select(keep, a, u)
    if op in ("add", "mul"):
        return b.add(a, u) if op == "add" else b.mul(a, u)
    return b.select(b.icmp_signed(">=" if op == "max" else "<=", a, u), a, u)


def _move(b: ir.IRBuilder, mode: int, dst: ir.Value, src: ir.Value, unit: ir.Value, unit_bytes: ir.Value) -> None:
    """Move one unit from ``src`` to ``dst`` as ``mode`` (a constant) says."""
    if mode == 0:
        _memcpy(b, dst, src, unit_bytes)
        return
    size = next((size for size, code in _COPIES.items() if code == mode), None)
    if size is not None:  # a one-element unit: one load and one store
        b.store(b.load(src, typ=ir.IntType(8 * size)), dst)
        return
    which, of = divmod(mode - _FIRST_REDUCTION, len(REDUCED_TYPES))
    op, dtype = REDUCTIONS[which], REDUCED_TYPES[of]
    typ = (ir.FloatType() if dtype.itemsize == 4 else ir.DoubleType()) if dtype.kind == "f" \
        else ir.IntType(8 * dtype.itemsize)
    lanes = VECTOR_BYTES // dtype.itemsize

    def one(e: ir.Value, width: int = 1) -> None:  # (elements e.. e + width - 1; unaligned)
        loaded = typ if width == 1 else ir.VectorType(typ, width)
        to, at = b.gep(dst, [e], source_etype=typ), b.gep(src, [e], source_etype=typ)
        a, u = b.load(to, typ=loaded, align=dtype.itemsize), b.load(at, typ=loaded, align=dtype.itemsize)
        b.store(_combine(b, op, dtype, a, u), to, align=dtype.itemsize)

    chunks = b.sdiv(unit, I64(lanes))  # whole vectors by hand (the routines skip LLVM's vectorizers), then the rest
    _loop(b, I64(0), chunks, lambda c: one(b.mul(c, I64(lanes)), lanes))
    _loop(b, b.mul(chunks, I64(lanes)), unit, one)


def _put(b: ir.IRBuilder, mode: ir.Value | int, dst: ir.Value, src: ir.Value, unit: ir.Value,
         unit_bytes: ir.Value, modes: Sequence[int]) -> None:
    """Move one unit from ``src`` to ``dst`` as ``mode`` says: a constant, or a value
    switched on (one branch a unit, always the same way in a call) among ``modes`` (any
    other: the first)."""
    if isinstance(mode, int):
        _move(b, mode, dst, src, unit, unit_bytes)
        return
    done = b.append_basic_block("put_done")
    blocks = {code: b.append_basic_block(f"put_mode{code}") for code in modes}
    switch = b.switch(mode, blocks[modes[0]])
    for code, block in blocks.items():
        if code != modes[0]:
            switch.add_case(I64(code), block)
        b.position_at_end(block)
        _move(b, code, dst, src, unit, unit_bytes)
        b.branch(done)
    b.position_at_end(done)


def _specialized(b: ir.IRBuilder, keys: Sequence[ir.Value], fast: Sequence[tuple[int, ...]],
                 build: Callable[[tuple[int, ...] | None], None]) -> None:
    """``build(values)`` for the first of ``fast`` that ``keys`` (call-wide dims) equal, else
    ``build(None)`` (the general body): the common cases' loops carry no per-element dispatch
    (GatherElements of [64, 1000] by [64, 100] int64 indices: 17.7 -> 6-9 us a call)."""
    matched = ir.IntType(1)(0)
    for values in fast:
        hit = b.and_(b.not_(matched), functools.reduce(b.and_, (b.icmp_signed("==", k, I64(v))
                                                                for k, v in zip(keys, values))))
        _if(b, hit, functools.partial(build, values))
        matched = b.or_(matched, hit)
    _if(b, b.not_(matched), lambda: build(None))


def _checked(b: ir.IRBuilder, raw: ir.Value, size: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(the index ``raw`` counted from the end when negative, whether it lies in ``[0, size)``)."""
    index = b.select(b.icmp_signed("<", raw, I64(0)), b.add(raw, size), raw)
    return index, b.and_(b.icmp_signed(">=", index, I64(0)), b.icmp_signed("<", index, size))


def _reporter(module: ir.Module, words: int, zero: bool) -> ir.Function:
    """``report(status, here, bytes, *words)``: ``status = [1, *words]``, an index out of range
    (the caller raises after the run), and with ``zero`` ``bytes`` zeros at ``here``: a cold
    function of its own, so that an unrolled loop does not copy it."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, PTR, I64, *[I64] * words]), "md_out_of_range")
    fn.linkage = "internal"
    fn.attributes.add("noinline")
    fn.attributes.add("cold")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    status, here, count, *values = fn.args
    if zero:
        b.call(module.declare_intrinsic("llvm.memset", [PTR, I64]), [here, ir.IntType(8)(0), count, ir.IntType(1)(0)])
    for k, word in enumerate((I64(1), *values)):
        b.store(word, b.gep(status, [I64(k)], source_etype=I64))
    b.ret_void()
    return fn


def _elements(module: ir.Module, name: str, scatter: bool, modes: Sequence[int] = COPY_MODES) -> None:
    b, args, dims = _define(module, name)
    near_in, indices, out, status = (_arg(b, args, i, PTR) for i in range(4))
    d = {key: _arg(b, dims, i, I64) for i, key in enumerate(ELEMENTS_DIMS)}
    far, near = (out, near_in) if scatter else (near_in, out)
    byte, i32 = ir.IntType(8), ir.IntType(32)
    report = _reporter(module, 1, zero=not scatter)
    counts = [d[f"count{k}"] for k in range(MAX_LEVELS)]
    strides = [d[f"stride{k}"] for k in range(MAX_LEVELS)]

    def index_at(p: ir.Value, width: int | None) -> ir.Value:
        if width is not None:
            typ = I64 if width == 8 else i32
            raw = b.load(b.gep(indices, [p], source_etype=typ), typ=typ)
            return raw if width == 8 else b.sext(raw, I64)
        with b.if_else(b.icmp_signed("==", d["index_bytes"], I64(8))) as (as_i64, as_i32):
            with as_i64:
                v64, in64 = index_at(p, 8), b.block
            with as_i32:
                v32, in32 = index_at(p, 4), b.block
        raw = b.phi(I64)
        raw.add_incoming(v64, in64)
        raw.add_incoming(v32, in32)
        return raw

    def walk(spec: tuple[int, ...] | None) -> None:
        width, mode = spec if spec is not None else (None, d["mode"])

        def element(offset: ir.Value, p: ir.Value) -> None:
            raw = index_at(p, width)
            index, inside = _checked(b, raw, d["axis_size"])
            there = b.gep(far, [b.add(offset, b.mul(index, d["axis_stride"]))], source_etype=byte)
            here = b.gep(near, [b.mul(p, d["itemsize"])], source_etype=byte)
            with b.if_else(inside) as (good, bad):
                with good:
                    _put(b, mode, *((there, here) if scatter else (here, there)), I64(1), d["itemsize"], modes)
                with bad:
                    b.call(report, [status, here, d["itemsize"], raw])

        _walk(b, counts, strides, element)

    fast = [(width, _COPIES[size]) for width in (8, 4) for size in (4, 8)] if modes == COPY_MODES else []
    _specialized(b, (d["index_bytes"], d["mode"]), fast, walk)
    b.ret_void()


def _walk(b: ir.IRBuilder, counts: Sequence[ir.Value], strides: Sequence[ir.Value],
          body: Callable[[ir.Value, ir.Value], None]) -> None:
    """``body(far offset, position)`` for every position of the nested loops, in order."""

    def level(k: int, offset: ir.Value, position: ir.Value) -> None:
        if k == len(counts):
            body(offset, position)
            return
        _loop(b, I64(0), counts[k], lambda j: level(k + 1, b.add(offset, b.mul(j, strides[k])),
                                                     b.add(b.mul(position, counts[k]), j)))

    level(0, I64(0), I64(0))


def _nd(module: ir.Module, name: str, scatter: bool, modes: Sequence[int] = COPY_MODES) -> None:
    b, args, dims = _define(module, name)
    near_in, indices, out, status = (_arg(b, args, i, PTR) for i in range(4))
    d = {key: _arg(b, dims, i, I64) for i, key in enumerate(ND_DIMS)}
    far, near = (out, near_in) if scatter else (near_in, out)
    byte, flag = ir.IntType(8), ir.IntType(1)
    memset = module.declare_intrinsic("llvm.memset", [PTR, I64])
    report = _reporter(module, 2, zero=False)
    offset, fits = b.alloca(I64), b.alloca(flag)

    def locate(n: ir.Value, at: ir.Value) -> None:
        """``offset``: batch ``n``'s unit picked by index tuple ``at``; ``fits``: all in range."""
        b.store(b.mul(n, d["batch_bytes"]), offset)
        b.store(flag(1), fits)

        def axis(j: ir.Value) -> None:
            raw = b.load(b.gep(indices, [b.add(b.mul(at, d["depth"]), j)], source_etype=I64), typ=I64)
            pair = b.add(I64(len(ND_DIMS)), b.mul(j, I64(2)))
            size = b.load(b.gep(dims, [pair], source_etype=I64), typ=I64)
            stride = b.load(b.gep(dims, [b.add(pair, I64(1))], source_etype=I64), typ=I64)
            index, inside = _checked(b, raw, size)
            with b.if_else(inside) as (good, bad):
                with good:
                    b.store(b.add(b.load(offset, typ=I64), b.mul(index, stride)), offset)
                with bad:
                    b.store(flag(0), fits)
                    b.call(report, [status, status, I64(0), raw, j])

        _loop(b, I64(0), d["depth"], axis)

    def walk(spec: tuple[int, ...] | None) -> None:
        mode = spec[0] if spec is not None else d["mode"]

        def batch(n: ir.Value) -> None:
            def query(q: ir.Value) -> None:
                at = b.add(b.mul(n, d["queries"]), q)
                locate(n, at)
                there = b.gep(far, [b.load(offset, typ=I64)], source_etype=byte)
                here = b.gep(near, [b.mul(at, d["unit_bytes"])], source_etype=byte)
                with b.if_else(b.load(fits, typ=flag)) as (good, bad):
                    with good:
                        _put(b, mode, *((there, here) if scatter else (here, there)), d["unit"], d["unit_bytes"],
                             modes)
                    with bad:
                        if not scatter:
                            b.call(memset, [here, byte(0), d["unit_bytes"], flag(0)])

            _loop(b, I64(0), d["queries"], query)

        _loop(b, I64(0), d["batch"], batch)

    _specialized(b, (d["mode"],), [(0,), (_COPIES[4],), (_COPIES[8],)] if modes == COPY_MODES else [], walk)
    b.ret_void()


SCATTER_BUILDERS: dict[str, Callable[[ir.Module], None]] = {
    "md_gather_elements": functools.partial(_elements, name="md_gather_elements", scatter=False),
    "md_scatter_elements": functools.partial(_elements, name="md_scatter_elements", scatter=True),
    "md_scatter_elements_reduce": functools.partial(_elements, name="md_scatter_elements_reduce", scatter=True,
                                                    modes=REDUCTION_MODES),
    "md_gather_nd": functools.partial(_nd, name="md_gather_nd", scatter=False),
    "md_scatter_nd": functools.partial(_nd, name="md_scatter_nd", scatter=True),
    "md_scatter_nd_reduce": functools.partial(_nd, name="md_scatter_nd_reduce", scatter=True, modes=REDUCTION_MODES),
}
"""The routines' builders, by name (:data:`~metadef.codegen.native.ROUTINES` takes them)."""


__all__ = ["COPY_MODES", "ELEMENTS_DIMS", "MAX_LEVELS", "ND_DIMS", "REDUCED_TYPES", "REDUCTIONS", "REDUCTION_MODES",
           "SCATTER_BUILDERS", "SCATTER_ROUTINES", "VECTOR_BYTES", "element_mode", "elements_dims", "nd_dims",
           "scatter_routine"]
