"""A node's semantics as a program of index expressions, for its input types: what the
analyses (:mod:`.samples`) and fusion's cost estimates (:mod:`metadef.passes.recompute`) read.

Example:
    >>> from metadef.ir import parse_graph
    >>> g = parse_graph("graph g(%x: f32[n]) -> (%y) { %y: f32[n] = Relu(%x) return %y }")
    >>> str(program_of(g.nodes[0]))
    'Y[...] = max(X[...], 0)'
"""

from __future__ import annotations

from metadef.core.errors import MetadefError
from metadef.ir import Node
from metadef.ops.interface import resolve_attrs
from metadef.ops.semantic_tree import Program


def program_of(node: Node) -> Program | None:
    """The node's semantics instantiated for its inputs' shapes (and the constant inputs its op
    reads); None where it has none (an opaque op) or they do not instantiate for these types."""
    op = node.metaop
    shapes = [None if v is None or v.type is None else v.type.shape for v in node.inputs]
    values = [v.const if v is not None and i in op.reads else None for i, v in enumerate(node.inputs)]
    try:
        found = op.semantics.instantiate(resolve_attrs(op.name, f"(node {node.name})", op.attrs, node.attrs),
                                         shapes, values)
    except (MetadefError, KeyError, TypeError, ValueError):
        return None
    return None if found is None else found[0]


__all__ = ["program_of"]
