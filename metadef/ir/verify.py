"""The verifier: always at hand, run after every pass in tests (``METADEF_VERIFY=1``).

It checks that the graph is well formed (every value defined once and before use, names
unique, outputs defined, each op registered with valid attributes and arity) and, with
``types=True``, that each node's recorded output types are what its shape rule infers.

Example:
    >>> from metadef.ir import GraphBuilder
    >>> from metadef.shape import parse_type
    >>> b = GraphBuilder("g")
    >>> x = b.input("x", parse_type("f32[2]"))
    >>> b.output(*b.node("Relu", [x]))
    >>> verify(b.build())   # returns None when all is well
"""

from __future__ import annotations

from metadef.core.errors import GraphError, MetadefError
from metadef.ir.graph import Graph
from metadef.ir.printer import format_node
from metadef.ir.values import ShapeValues
from metadef.ops import infer_types
from metadef.ops.interface import resolve_attrs
from metadef.shape import ShapeEnv, TensorType
from metadef.shape.expr import free_symbols


def _agrees(recorded: TensorType, inferred: TensorType, fresh: set[str]) -> bool:
    """Whether re-inference gives the recorded type, up to the symbols it made afresh (a size
    that depends on values, such as NonZero's count, or STFT's frames: a dim made of one stands
    for what the record holds)."""
    if str(recorded) == str(inferred):
        return True
    if recorded.dtype is not inferred.dtype or recorded.shape is None or inferred.shape is None \
            or len(recorded.shape) != len(inferred.shape):
        return False
    return all(str(a) == str(b) or not fresh.isdisjoint(free_symbols(b))
               for a, b in zip(recorded.shape, inferred.shape))


def problems(graph: Graph, *, types: bool = False) -> list[str]:
    """Every problem found, as sentences (empty when the graph is well formed)."""
    found: list[str] = []
    defined: set[int] = set()
    names: dict[str, str] = {}

    def define(v, where: str) -> None:
        if id(v) in defined:
            found.append(f"value %{v.name} is defined twice (again by {where})")
        defined.add(id(v))
        if v.name in names:
            found.append(f"value name %{v.name} is used by {names[v.name]} and by {where}")
        names[v.name] = where

    for v in graph.inputs:
        define(v, "a graph input")
    for v in graph.constants:
        define(v, "a constant")
        if v.const is None:
            found.append(f"constant %{v.name} has no data")
    node_names: set[str] = set()
    tracked = ShapeValues()
    scratch = ShapeEnv(dict(graph.env.symbols))  # fresh symbols of re-inference stay out of the graph
    for node in graph.nodes:
        where = f"node {node.name} ({node.qualop})"
        if node.name and node.name in node_names:
            found.append(f"node name {node.name!r} is used twice")
        node_names.add(node.name)
        for i, v in enumerate(node.inputs):
            if v is not None and id(v) not in defined:
                found.append(f"{where} reads %{v.name} (input {i}) before it is defined")
        try:
            meta = node.metaop
            resolve_attrs(meta.name, f"(node {node.name})", meta.attrs, node.attrs)
            if types:
                before = set(scratch.symbols)
                got = infer_types(meta, node.name, [None if v is None else v.type for v in node.inputs],
                                  node.attrs, [tracked.known(v) for v in node.inputs], scratch, len(node.outputs))
                fresh = set(scratch.symbols) - before
                tracked.record(meta, node.inputs, node.attrs, node.outputs)
                for o, t in zip(node.outputs, got):
                    if o.type is not None and not _agrees(o.type, t, fresh):
                        found.append(f"{where}: output %{o.name} is recorded as {o.type} "
                                     f"but its rule infers {t}")
        except MetadefError as e:
            found.append(f"{where}: {e}")
        for o in node.outputs:
            if o.producer is not node:
                found.append(f"{where}: output %{o.name} does not point back to its producer")
            define(o, where)
    for v in graph.outputs:
        if id(v) not in defined:
            found.append(f"graph output %{v.name} is not defined by any input, constant or node")
    return found


def verify(graph: Graph, *, types: bool = False, stage: str = "") -> None:
    """Raise GraphError listing every problem, with the text of the first offending node."""
    found = problems(graph, types=types)
    if not found:
        return
    after = f" after {stage}" if stage else ""
    listing = "\n".join(f"  - {p}" for p in found[:20])
    more = f"\n  ... and {len(found) - 20} more" if len(found) > 20 else ""
    first = next((n for n in graph.nodes if n.name and n.name in found[0]), None)
    context = f"\nat:\n  {format_node(first)}" if first is not None else ""
    raise GraphError(f"graph {graph.name} is malformed{after}:\n{listing}{more}{context}")


__all__ = ["problems", "verify"]
