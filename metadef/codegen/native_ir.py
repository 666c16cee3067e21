"""Helpers for writing native routines with llvmlite's IR builder (see :mod:`.native`).

Loops, conditions, argument loads and element addresses in the kernels' calling convention
``void f(ptr args, ptr dims)``, the BLAS function types, and a callee for function pointers
loaded at run time.

Example:
    >>> from llvmlite import ir
    >>> module = ir.Module("example")
    >>> b, args, dims = _define(module, "noop")
    >>> _ = b.ret_void()
    >>> "define void" in str(module) and "noop" in str(module)
    True
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_TRANS = 101, 111, 112
I64, I32, F32 = ir.IntType(64), ir.IntType(32), ir.FloatType()
PTR = ir.PointerType()
V8 = ir.VectorType(F32, 8)
_FN = ir.FunctionType(ir.VoidType(), [PTR, PTR])
_SGEMM = ir.FunctionType(ir.VoidType(), [I32, I32, I32, I64, I64, I64, F32, PTR, I64, PTR, I64, F32, PTR, I64])
_SGEMV = ir.FunctionType(ir.VoidType(), [I32, I32, I64, I64, F32, PTR, I64, PTR, I64, F32, PTR, I64])


def _loop(b: ir.IRBuilder, start: ir.Value, stop: ir.Value, body: Callable[[ir.Value], None]) -> None:
    """``for i in [start, stop): body(i)`` (nothing when stop <= start)."""
    pre = b.block
    head = b.append_basic_block("loop")
    after = b.append_basic_block("after")
    b.cbranch(b.icmp_signed("<", start, stop), head, after)
    b.position_at_end(head)
    i = b.phi(I64)
    i.add_incoming(start, pre)
    body(i)
    nxt = b.add(i, I64(1))
    i.add_incoming(nxt, b.block)
    b.cbranch(b.icmp_signed("<", nxt, stop), head, after)
    b.position_at_end(after)


def _merged(b: ir.IRBuilder, first: list[ir.Value], first_block: ir.Block, second: list[ir.Value],
            second_block: ir.Block) -> list[ir.Value]:
    """Where two paths join: a phi for each pair, ``first`` from ``first_block``, ``second``
    from ``second_block``."""
    out = []
    for one, other in zip(first, second):
        phi = b.phi(one.type)
        phi.add_incoming(one, first_block)
        phi.add_incoming(other, second_block)
        out.append(phi)
    return out


def _carried(b: ir.IRBuilder, start: ir.Value, stop: ir.Value, init: list[ir.Value],
             body: Callable[[ir.Value, list[ir.Value]], list[ir.Value]]) -> list[ir.Value]:
    """``for i in [start, stop): values = body(i, values)``, ``values`` starting at ``init``."""
    pre = b.block
    head, after = b.append_basic_block("loop"), b.append_basic_block("after")
    b.cbranch(b.icmp_signed("<", start, stop), head, after)
    b.position_at_end(head)
    i = b.phi(I64)
    i.add_incoming(start, pre)
    phis = [b.phi(v.type) for v in init]
    for phi, v in zip(phis, init):
        phi.add_incoming(v, pre)
    new = body(i, phis)
    nxt = b.add(i, I64(1))
    i.add_incoming(nxt, b.block)
    for phi, v in zip(phis, new):
        phi.add_incoming(v, b.block)
    body_end = b.block
    b.cbranch(b.icmp_signed("<", nxt, stop), head, after)
    b.position_at_end(after)
    return _merged(b, init, pre, new, body_end)


def _if(b: ir.IRBuilder, cond: ir.Value, then: Callable[[], None]) -> None:
    yes = b.append_basic_block("then")
    after = b.append_basic_block("endif")
    b.cbranch(cond, yes, after)
    b.position_at_end(yes)
    then()
    b.branch(after)
    b.position_at_end(after)


def _load_if(b: ir.IRBuilder, cond: ir.Value, at: Callable[[], ir.Value], default: ir.Value) -> ir.Value:
    """The float at ``at()`` where ``cond`` holds, else ``default``; the load sits behind a
    branch, since a ``select`` of it would still load (from a null bias pointer: a crash)."""
    pre = b.block
    with b.if_then(cond):
        loaded, inside = b.load(at(), typ=F32), b.block
    value = b.phi(F32)
    value.add_incoming(default, pre)
    value.add_incoming(loaded, inside)
    return value


def _arg(b: ir.IRBuilder, base: ir.Value, i: int, typ: ir.Type) -> ir.Value:
    return b.load(b.gep(base, [I64(i)], source_etype=typ), typ=typ)


def _elem(b: ir.IRBuilder, base: ir.Value, index: ir.Value) -> ir.Value:
    return b.gep(base, [index], source_etype=F32)


def _float_bits(b: ir.IRBuilder, bits: ir.Value) -> ir.Value:
    return b.bitcast(b.trunc(bits, I32), F32)


def _smax(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed(">", x, y), x, y)


def _smin(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed("<", x, y), x, y)


def _share(b: ir.IRBuilder, extent: ir.Value, d: dict[str, ir.Value]) -> tuple[ir.Value, ir.Value]:
    """``[first, last)``: task ``d["task"]`` of ``d["tasks"]``'s share of ``extent`` units."""
    return (b.sdiv(b.mul(extent, d["task"]), d["tasks"]),
            b.sdiv(b.mul(extent, b.add(d["task"], I64(1))), d["tasks"]))


def _splat(b: ir.IRBuilder, value: ir.Value, lanes: int = 8) -> ir.Value:
    """``value`` in all ``lanes`` lanes of a vector of its type."""
    vector = ir.VectorType(value.type, lanes)
    v = b.insert_element(ir.Constant(vector, ir.Undefined), value, I32(0))
    return b.shuffle_vector(v, ir.Constant(vector, ir.Undefined), ir.Constant(ir.VectorType(I32, lanes), [0] * lanes))


def _bounded(b: ir.IRBuilder, v: ir.Value, lo: ir.Value, hi: ir.Value) -> ir.Value:
    """``min(max(v, lo), hi)`` (scalars or lane by lane), NaN kept, as numpy's clip."""
    v = b.select(b.fcmp_ordered("<", v, lo), lo, v)
    return b.select(b.fcmp_ordered(">", v, hi), hi, v)


def _define(module: ir.Module, name: str) -> tuple[ir.IRBuilder, ir.Value, ir.Value]:
    fn = ir.Function(module, _FN, name)
    fn.attributes.add("nounwind")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    return b, fn.args[0], fn.args[1]


class _Callee(ir.Value):
    """A function pointer loaded at run time, called with ``function_type`` (llvmlite's builder
    needs the callee's type, which an opaque pointer does not carry)."""

    def __init__(self, pointer: ir.Value, function_type: ir.FunctionType = _FN) -> None:
        self.pointer = pointer
        self.type = ir.PointerType()
        self.function_type = function_type

    def get_reference(self) -> str:
        return self.pointer.get_reference()

    def __str__(self) -> str:
        return str(self.pointer)


def _zero(b: ir.IRBuilder, module: ir.Module, base: ir.Value, start: ir.Value, stop: ir.Value) -> None:
    count = b.sub(stop, start)

    def clear() -> None:
        b.call(module.declare_intrinsic("llvm.memset", [PTR, I64]),
               [_elem(b, base, start), ir.IntType(8)(0), b.mul(count, I64(4)), ir.IntType(1)(0)])

    _if(b, b.icmp_signed(">", count, I64(0)), clear)


def _internal(module: ir.Module, name: str, params: list[ir.Type], noalias: tuple[int, ...]
              ) -> tuple[ir.Function, ir.IRBuilder]:
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), params), name)
    fn.linkage = "internal"
    for i in noalias:
        fn.args[i].add_attribute("noalias")
    return fn, ir.IRBuilder(fn.append_basic_block("entry"))


__all__ = ["CBLAS_NO_TRANS", "CBLAS_ROW_MAJOR", "CBLAS_TRANS", "F32", "I32", "I64", "PTR", "V8"]
