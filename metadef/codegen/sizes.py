"""Sizes a generated kernel reads from the shapes it is given.

A kernel's dims are run-time arguments, each solved from the concrete shape of an input or
output (:class:`metadef.codegen.kernel.Kernel`). A dim that is one symbol (``n``) binds
directly; a dim built from symbols that some shape gives (``n*4``) is computed from them;
:func:`abstract_sizes` makes every other dim (built from sizes no shape gives) a size of its
own.
"""

from __future__ import annotations

from metadef.ir.graph import Graph
from metadef.ops import Role
from metadef.shape import Dim, TensorType, free_symbols, sym


def plain_symbol(d: Dim) -> str | None:
    """The name of ``d`` when it is one symbol (``n``), else None (``4``, ``2*h``)."""
    atom = None if isinstance(d, int) else d.as_atom()
    return atom.key[1] if atom is not None and atom.key[0] == "sym" else None


def abstract_sizes(body: Graph) -> Graph:
    """``body``, or a copy of it in which every dim built from sizes that no input or output
    shape gives is a fresh symbol (``_size0``, ...; one per distinct expression). A strided
    conv's epilogue sees ``floor((h - 1)/2) + 1`` but no ``h``: the kernel cannot solve for
    ``h``, yet all it needs is the value of that dim, which the shapes it is given carry.

    Example:
        >>> from metadef.ir import parse_graph
        >>> g = parse_graph("graph g(%x: f32[n,floor((h - 1)/2) + 1]) -> (%y) { %y: f32[n,floor((h - 1)/2) + 1] "
        ...                 "= Relu(%x) return %y }")
        >>> str(abstract_sizes(g).inputs[0].type)
        'f32[n,_size0]'
    """
    bound = {name for v in (*body.inputs, *body.outputs) if v.type is not None and v.type.shape is not None
             for d in v.type.shape if (name := plain_symbol(d)) is not None}
    fresh: dict[str, Dim] = {}

    def size(d: Dim) -> Dim:
        if isinstance(d, int) or plain_symbol(d) is not None or free_symbols(d) <= bound:
            return d
        return fresh.setdefault(str(d), sym(f"_size{len(fresh)}"))

    shapes = [tuple(size(d) for d in v.type.shape) if v.type is not None and v.type.shape is not None else None
              for v in body.values()]
    if not fresh:
        return body
    copy = body.clone()
    for v, shape in zip(copy.values(), shapes):
        if shape is not None:
            v.type = TensorType(v.type.dtype, shape)
    return copy


def flat_form(body: Graph) -> Graph | None:
    """A copy of ``body`` in which every tensor is flat (one run-time size, ``_size``), where
    that changes nothing but the number of kernels and the loop nest's shape: every node is
    elementwise (with or without broadcasting), every value a scalar or of the first output's
    shape (of rank 2 or more), and no tensor's values are compiled in; else None. The kernel
    then takes operands of any one shape (:class:`~metadef.codegen.kernel.Kernel` flattens
    them): ResNet-50's Relu epilogues over ``[n, 64, 112, 112]`` ... ``[n, 512, 7, 7]`` are one
    kernel, not eight (each ~35 ms of LLVM), and one loop over a whole tensor vectorizes where
    rows of 7 floats did not.

    Example:
        >>> from metadef.ir import parse_graph
        >>> g = parse_graph("graph g(%x: f32[n,64,7,7]) -> (%y) { %y: f32[n,64,7,7] = Relu(%x) return %y }")
        >>> str(flat_form(g).inputs[0].type)
        'f32[_size]'
    """
    if not body.outputs or body.outputs[0].type is None or body.outputs[0].type.shape is None:
        return None
    shape = tuple(body.outputs[0].type.shape)
    if len(shape) < 2:
        return None
    for node in body.nodes:
        if node.metaop.role not in (Role.ELEMENTWISE, Role.BROADCAST):
            return None
    for v in body.values():
        if v.type is None or v.type.shape is None:
            return None
        if len(v.type.shape) and (tuple(v.type.shape) != shape or v.const is not None):
            return None  # (a broadcast, or a tensor whose values are compiled in)
    copy = body.clone()
    for v in copy.values():
        if v.type is not None and v.type.shape is not None and len(v.type.shape):
            v.type = TensorType(v.type.dtype, (sym("_size"),))
    return copy


__all__ = ["abstract_sizes", "flat_form", "plain_symbol"]
