"""``refine_types``: recorded types made as precise as inference now is.

An importer records a size it cannot know yet as a fresh symbol (``slice_0``: a Slice whose
starts a shape computation gives). Once a pass folds that computation into constants, the
node's rule infers the size itself (``2``), and every type built on the fresh symbol is
behind. This sweep re-infers each node, in order, and takes the inferred type wherever the
recorded one differs only in dims made of such value-dependent symbols (symbols that no graph
input's shape has) or has no known rank; any other difference is left for the verifier to report. The graph is
copied only when something changes; the one given is never edited.

Example:
    >>> from metadef.ir import parse_graph
    >>> g = parse_graph('''graph g(%x: f32[n,6]) -> (%y) {
    ...   %s: i64[1] = const [2]
    ...   %e: i64[1] = const [5]
    ...   %a: i64[1] = const [1]
    ...   %y: f32[n,k] = Slice(%x, %s, %e, %a) @slice
    ...   return %y }''')
    >>> str(refine_types(g).outputs[0].type), str(g.outputs[0].type)
    ('f32[n,3]', 'f32[n,k]')
"""

from __future__ import annotations

from metadef.core.errors import MetadefError
from metadef.ir import Graph
from metadef.ir.values import ShapeValues
from metadef.ops import infer_types
from metadef.shape import ShapeEnv, TensorType
from metadef.shape.expr import free_symbols


def _refines(recorded: TensorType, inferred: TensorType, known: set[str]) -> bool:
    """Whether ``inferred`` is ``recorded`` with some value-dependent dims (or an unknown
    rank) made precise: sizes of the graph's inputs, not symbols of this inference."""
    if recorded.dtype is not inferred.dtype or inferred.shape is None or str(recorded) == str(inferred) \
            or any(not isinstance(d, int) and not free_symbols(d) <= known for d in inferred.shape):
        return False
    if recorded.shape is None:
        return True
    return len(recorded.shape) == len(inferred.shape) and all(
        str(a) == str(b) or (not isinstance(a, int) and not free_symbols(a) <= known)
        for a, b in zip(recorded.shape, inferred.shape))


def _sweep(graph: Graph, known: set[str], apply: bool) -> int:
    """Re-infer every node in order; count the outputs whose type refines (and, with
    ``apply``, take the refined type at once, so the nodes after it see it)."""
    tracked = ShapeValues()
    scratch = ShapeEnv(dict(graph.env.symbols))
    count = 0
    for node in graph.nodes:
        try:
            got = infer_types(node.metaop, node.name, [None if v is None else v.type for v in node.inputs],
                              node.attrs, [tracked.known(v) for v in node.inputs], scratch, len(node.outputs))
        except MetadefError:
            got = []
        for o, t in zip(node.outputs, got):
            if o.type is not None and t is not None and _refines(o.type, t, known):
                count += 1
                if apply:
                    o.type = t
        tracked.record(node.metaop, node.inputs, node.attrs, node.outputs)
    return count


MAX_SWEEPS = 4
"""A refined size can refine the sizes computed from it: sweeps until none changes, at most this many."""


def refine_types(graph: Graph) -> Graph:
    """``graph``, or a copy with its value-dependent dims refined where inference now knows
    them (see the module doc)."""
    known = {s for v in graph.inputs if v.type is not None and v.type.shape is not None
             for d in v.type.shape if not isinstance(d, int) for s in free_symbols(d)}
    if all(v.type is None or (v.type.shape is not None and all(
            isinstance(d, int) or free_symbols(d) <= known for d in v.type.shape)) for v in graph.values()):
        return graph  # nothing value-dependent to refine (BERT, the CNNs): no sweep
    if not _sweep(graph, known, apply=False):
        return graph
    copy = graph.clone()
    for _ in range(MAX_SWEEPS):
        if not _sweep(copy, known, apply=True):
            break
    return copy


__all__ = ["MAX_SWEEPS", "refine_types"]
