"""Samples computed on their own: the batch symbol along which a graph may run in pieces.

A graph is *separable* along a symbol ``s`` when its outputs for a batch are its outputs for
each sample (or each slice of samples) stacked: every computation reads only its own
sample's elements along axis 0. A backend may then run a batch of 8 as 8 runs of one, or 4
of two, whose intermediates stay in cache (MobileNetV2's at batch 8 do not: 46 MB), keeping
each run's weights hot instead of its activations; which way is faster it measures.

:func:`separable_symbol` decides it from the graph alone, conservatively:

- every value that carries ``s`` (inputs, node outputs, through fused bodies) has it once,
  as its plain first dim (``[s, 3, 224, 224]``, not ``[s*seq, 768]``), and a node that reads
  such a value makes only such values;
- each node reading one is per-sample by its semantics: in every statement of its index
  expression the first output index is a variable that indexes axis 0 of every batched
  tensor it reads and nothing else of it (``Y[n,k,p,q] = sum[c,r,s] X[n,c,...] * W[k,c,r,s]``),
  or both start with ``...`` over the same rank (elementwise with broadcasting); a view
  (Reshape, Flatten) is per-sample by the shape rule alone; anything else (opaque ops, a
  reduction over axis 0, a Gather along it, ``Shape``) is not.

Example:
    >>> import numpy as np
    >>> from metadef.ir import parse_graph
    >>> g = parse_graph('''graph g(%x: f32[n,3,8,8]) -> (%y) {
    ...   %w: f32[4,3,1,1] = const
    ...   %c: f32[n,4,8,8] = Conv(%x, %w) @conv
    ...   %r: f32[n,4,8,8] = Relu(%c) @relu
    ...   %y: f32[n,256] = Flatten(%r) @flat
    ...   return %y }''', constants={"w": np.ones((4, 3, 1, 1), np.float32)})
    >>> separable_symbol(g)
    'n'
    >>> g = parse_graph('''graph g(%x: f32[n,4]) -> (%y) {
    ...   %y: f32[n,4] = Softmax(%x) {axis=0} @softmax_over_the_batch
    ...   return %y }''')
    >>> separable_symbol(g) is None
    True
"""

from __future__ import annotations

from collections.abc import Sequence

from metadef.analysis.programs import program_of
from metadef.ir import Graph, Node, Value
from metadef.ops.numpy_eval.run import tensor_names
from metadef.ops.semantic_tree import Access, Affine, EllipsisIndex
from metadef.shape import free_symbols, sym

VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})
"""Ops that only reshape (row-major): per-sample whenever their input and output carry the
symbol as their first dim (then each sample's elements stay its own)."""


def separable_symbol(graph: Graph) -> str | None:
    """The symbol along which ``graph`` computes each sample on its own (see the module doc),
    or None. Every graph output carries it as its first dim; an input may lack it (it is
    then read whole by every piece)."""
    outputs = [v.type.shape for v in graph.outputs if v.type is not None and v.type.shape is not None]
    if not outputs or len(outputs) != len(graph.outputs) or any(not shape for shape in outputs):
        return None
    firsts = {shape[0] for shape in outputs}
    if len(firsts) != 1:
        return None
    first = firsts.pop()
    names = free_symbols(first)
    if len(names) != 1:
        return None
    s = next(iter(names))
    return s if first == sym(s) and _separable(graph, s) else None


def _batched(v: Value | None, s: str) -> bool | None:
    """True: ``v`` carries ``s`` as its plain first dim only; False: it does not carry ``s``;
    None: it carries it some other way (or has no known shape)."""
    if v is None:
        return False
    if v.type is None or v.type.shape is None:
        return None
    shape = v.type.shape
    where = [i for i, d in enumerate(shape) if s in free_symbols(d)]
    if not where:
        return False
    return True if where == [0] and shape[0] == sym(s) else None


def _separable(graph: Graph, s: str) -> bool:
    if any(_batched(v, s) is None for v in graph.inputs):
        return False
    return all(_node_separable(n, s) for n in graph.nodes)


def _node_separable(node: Node, s: str) -> bool:
    ins = [_batched(v, s) for v in node.inputs]
    outs = [_batched(v, s) for v in node.outputs]
    if None in ins or None in outs:
        return False
    if not any(ins):
        return not any(outs)  # (a node that makes batched values from nothing batched: not per-sample)
    if not all(outs):
        return False
    body = node.attrs.get("body")
    if isinstance(body, Graph):  # a fused group: its body's nodes, each per-sample
        return all(_node_separable(n, s) for n in body.nodes)
    if node.op in VIEW_OPS and node.domain in ("", "ai.onnx"):
        return True
    return _semantics_separable(node, ins)


def _semantics_separable(node: Node, batched: Sequence[bool]) -> bool:
    op = node.metaop
    shapes = [None if v is None or v.type is None else v.type.shape for v in node.inputs]
    program = program_of(node)
    if program is None:
        return False
    inputs = tensor_names(op, len(node.inputs))
    batched_names = {name for name, b in zip(inputs, batched) if b}
    ranks = {name: len(shape) for name, shape in zip(inputs, shapes) if shape is not None}
    for name, v in zip(tensor_names(op, len(node.outputs), outputs=True), node.outputs):
        if v.type is not None and v.type.shape is not None:
            ranks[name] = len(v.type.shape)
    for st in program.statements:
        accesses = [a for a in st.rhs.accesses() if a.tensor in ranks]
        if st.lhs.tensor not in ranks:  # a temporary: its rank from its statement's accesses
            ranks[st.lhs.tensor] = len(st.lhs.indices) - _ellipses(st.lhs) + max(
                (_ellipsis_length(a, ranks) for a in accesses), default=0) * _ellipses(st.lhs)
        for access in accesses:
            if access.tensor in batched_names and not _reads_own_sample(access, st.lhs, ranks):
                return False
        if any(a.tensor in batched_names for a in accesses):
            batched_names.add(st.lhs.tensor)  # a temporary made from batched tensors is batched
    return True


def _ellipses(access: Access) -> int:
    return sum(isinstance(i, EllipsisIndex) for i in access.indices)


def _ellipsis_length(access: Access, ranks: dict[str, int]) -> int:
    """How many dims the ``...`` of ``access`` stands for (0 without one)."""
    return ranks[access.tensor] - (len(access.indices) - 1) if _ellipses(access) else 0


def _axis0(access: Access, ranks: dict[str, int]) -> tuple[Affine | EllipsisIndex | None, list[object]]:
    """The index of the access's axis 0 (a ``...`` that stands for no dims skipped) and the rest."""
    indices = list(access.indices)
    if indices and isinstance(indices[0], EllipsisIndex) and _ellipsis_length(access, ranks) == 0:
        indices = indices[1:]
    return (indices[0] if indices else None), indices[1:]


def _reads_own_sample(access: Access, lhs: Access, ranks: dict[str, int]) -> bool:
    """Whether ``access`` (of a batched tensor) reads the element of the written element's own
    sample: its axis-0 index is the variable of the written one's, used nowhere else in it; or
    both start with ``...`` standing for as many dims (broadcasting aligns the ellipses from
    the right, so axis 0 meets axis 0)."""
    lead, _ = _axis0(lhs, ranks)
    first, rest = _axis0(access, ranks)
    if isinstance(lead, EllipsisIndex) or isinstance(first, EllipsisIndex):
        return (isinstance(lead, EllipsisIndex) and isinstance(first, EllipsisIndex)
                and _ellipsis_length(access, ranks) == _ellipsis_length(lhs, ranks))
    if not isinstance(lead, Affine) or not isinstance(first, Affine):
        return False
    var = lead.var_name
    if var is None or first.var_name != var:
        return False
    return all(var not in index.variables for index in rest if isinstance(index, Affine))


__all__ = ["VIEW_OPS", "separable_symbol"]
