"""Table look-ups of 8-bit values by hand (see :mod:`.native`): ``md_lookup``.

``y[i] = table[x[i] ^ flip]`` for ``count`` 8-bit ``x`` (``flip`` 128 for int8, whose ``-128``
is entry 0; 0 for uint8) and a 256-entry table of 1, 2, 4 or 8-byte elements: what
``ai.metadef::Lookup`` does (:mod:`metadef.passes.tabulate` makes them). A table of bytes (an
8-bit result: a quantized activation) on a host with AVX512-VBMI takes 64 elements at a time:
the table in four 512-bit registers, two ``vpermi2b`` (each looks 64 bytes up in 128 entries)
and a blend on each index's top bit; the rest, and other hosts, one element at a time.
Task ``task`` of ``tasks`` takes its share of the elements (in blocks of 64).

Example:
    >>> import ctypes, numpy as np
    >>> from metadef.codegen.native import ENTRY, native_function
    >>> x = np.array([-128, -1, 0, 127], np.int8)
    >>> table, y = np.arange(256, dtype=np.float32) * 2, np.empty(4, np.float32)
    >>> args = (ctypes.c_void_p * 3)(x.ctypes.data, table.ctypes.data, y.ctypes.data)
    >>> dims = lookup_dims(4, 4, signed=True)
    >>> ENTRY(native_function("md_lookup"))(args, (ctypes.c_int64 * len(dims))(*dims))
    >>> y.tolist()
    [0.0, 254.0, 256.0, 510.0]
"""

from __future__ import annotations

from llvmlite import ir

from metadef.codegen.host import host_target
from metadef.codegen.native_ir import I32, I64, PTR, _arg, _define, _if, _loop, _share

I8 = ir.IntType(8)
V64 = ir.VectorType(I8, 64)

LOOKUP_DIMS = ("count", "itemsize", "flip", "task", "tasks")
"""The dims of ``md_lookup``: args are ``[x (8-bit) [count], table [256], y [count]]``;
``itemsize`` the table's element size in bytes (1, 2, 4 or 8); ``flip`` 128 for int8 ``x``,
else 0."""

BLOCK = 64
"""Elements a task's share is rounded to (one vector of bytes)."""


def lookup_dims(count: int, itemsize: int, *, signed: bool, task: int = 0, tasks: int = 1) -> tuple[int, ...]:
    """The dims of one ``md_lookup`` call.

    Example:
        >>> lookup_dims(1000, 1, signed=False)
        (1000, 1, 0, 0, 1)
    """
    return count, itemsize, 128 if signed else 0, task, tasks


def _by_bytes(b: ir.IRBuilder, x: ir.Value, table: ir.Value, y: ir.Value, flip: ir.Value, first: ir.Value,
              last: ir.Value, width: int) -> None:
    """Elements ``[first, last)`` one at a time, the table's elements ``width`` bytes."""
    element = ir.IntType(8 * width)

    def one(i: ir.Value) -> None:
        index = b.xor(b.zext(b.load(b.gep(x, [i], source_etype=I8), typ=I8), I64), flip)
        value = b.load(b.gep(table, [index], source_etype=element), typ=element)
        b.store(value, b.gep(y, [i], source_etype=element))

    _loop(b, first, last, one)


def _bytes_vbmi(module: ir.Module, b: ir.IRBuilder, x: ir.Value, table: ir.Value, y: ir.Value, flip: ir.Value,
                first: ir.Value, last: ir.Value) -> ir.Value:
    """Whole blocks of 64 from ``first`` by ``vpermi2b``; returns where they end."""
    permute = module.globals.get("llvm.x86.avx512.vpermi2var.qi.512") or ir.Function(
        module, ir.FunctionType(V64, [V64, V64, V64]), "llvm.x86.avx512.vpermi2var.qi.512")
    quarters = [b.load(b.gep(table, [I64(64 * q)], source_etype=I8), typ=V64, align=1) for q in range(4)]
    flips = b.trunc(flip, I8)
    flip_vector = b.shuffle_vector(b.insert_element(ir.Constant(V64, ir.Undefined), flips, I32(0)),
                                   ir.Constant(V64, ir.Undefined), ir.Constant(ir.VectorType(I32, 64), [0] * 64))
    blocks = b.sdiv(b.sub(last, first), I64(64))

    def block(j: ir.Value) -> None:
        at = b.add(first, b.mul(j, I64(64)))
        index = b.xor(b.load(b.gep(x, [at], source_etype=I8), typ=V64, align=1), flip_vector)
        low = b.call(permute, [quarters[0], index, quarters[1]])
        high = b.call(permute, [quarters[2], index, quarters[3]])
        top = b.icmp_signed("<", index, ir.Constant(V64, [0] * 64))  # (bit 7 set: entries 128-255)
        b.store(b.select(top, high, low), b.gep(y, [at], source_etype=I8), align=1)

    _loop(b, I64(0), blocks, block)
    return b.add(first, b.mul(blocks, I64(64)))


def _lookup(module: ir.Module) -> None:
    b, args, dims = _define(module, "md_lookup")
    x, table, y = (_arg(b, args, i, PTR) for i in range(3))
    d = {name: _arg(b, dims, i, I64) for i, name in enumerate(LOOKUP_DIMS)}
    count, itemsize, flip = d["count"], d["itemsize"], d["flip"]
    blocks = b.sdiv(b.add(count, I64(BLOCK - 1)), I64(BLOCK))
    first, last = (b.mul(v, I64(BLOCK)) for v in _share(b, blocks, d))
    last = b.select(b.icmp_signed("<", last, count), last, count)
    vbmi = host_target().has("avx512vbmi")
    for width in (1, 2, 4, 8):
        def run(width: int = width) -> None:
            start = _bytes_vbmi(module, b, x, table, y, flip, first, last) if width == 1 and vbmi else first
            _by_bytes(b, x, table, y, flip, start, last, width)
        _if(b, b.icmp_signed("==", itemsize, I64(width)), run)
    b.ret_void()


__all__ = ["BLOCK", "LOOKUP_DIMS", "lookup_dims"]
