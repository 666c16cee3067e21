"""``eliminate_common_subexpressions``: compute each distinct expression once.

Two constants with the same dtype, shape and bytes become one (``merge_duplicate_constant``;
bytes are hashed, a sample first and the whole array on a sample collision, then compared).
Then, in topological order, a node with the same op, domain, attributes (defaults filled in)
and inputs as an earlier node is replaced by it (``merge_duplicate_node``). Commutative
operands are not reordered. The result is deterministic: the first occurrence is kept.

Example:
    >>> from metadef.ir import parse_graph
    >>> from metadef.passes.base import PassContext
    >>> g = parse_graph('''graph g(%x: f32[n]) -> (%y) {
    ...   %c1: f32[] = const [2.0]
    ...   %c2: f32[] = const [2.0]
    ...   %a: f32[n] = Mul(%x, %c1) @mul1
    ...   %b: f32[n] = Mul(%x, %c2) @mul2
    ...   %y: f32[n] = Add(%a, %b) @add
    ...   return %y
    ... }''')
    >>> ctx = PassContext()
    >>> [n.op for n in eliminate_common_subexpressions(g, ctx).nodes]
    ['Mul', 'Add']
    >>> ctx.log.lines()
    ['taken merge_duplicate_constant at c2 (c2, c1)', 'taken merge_duplicate_node at mul2 (mul2, mul1)']
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable
from typing import Any

import numpy as np

from metadef.core.errors import MetadefError
from metadef.ir import Graph, Node, Value
from metadef.ops.interface import resolve_attrs
from metadef.passes.base import PassContext
from metadef.rewrite import GraphEditor

SAMPLE_BYTES = 1 << 16
PASS = "eliminate_common_subexpressions"


def _raw(a: np.ndarray) -> np.ndarray:
    """The array's bytes as a flat uint8 array (a view when it is contiguous)."""
    flat = np.ascontiguousarray(a).reshape(-1)
    return flat.view(np.uint8)


def _digest(data: np.ndarray) -> str:
    return hashlib.blake2b(data.tobytes(), digest_size=16).hexdigest()


def _constant_key(a: np.ndarray, full: bool) -> tuple[Hashable, ...]:
    raw = _raw(a)
    body = raw if full or raw.size <= 2 * SAMPLE_BYTES else np.concatenate(
        [raw[:SAMPLE_BYTES], raw[-SAMPLE_BYTES:]])
    return (a.dtype.str, tuple(a.shape), raw.size, _digest(body))


def _merge_constants(ed: GraphEditor, ctx: PassContext) -> None:
    """Make every reader of a constant equal to an earlier one read the earlier one."""
    groups: dict[tuple[Hashable, ...], list[Value]] = {}
    for c in ed.graph.constants:
        if c.const is not None and c.const.dtype != object and not ed.is_output(c):
            groups.setdefault(_constant_key(c.const, full=False), []).append(c)
    for group in groups.values():
        if len(group) < 2:
            continue
        firsts: dict[tuple[Hashable, ...], Value] = {}
        for c in group:
            key = _constant_key(c.const, full=True)
            first = firsts.setdefault(key, c)
            if first is not c and np.array_equal(_raw(first.const), _raw(c.const)):
                ed.replace_uses(c, first)
                ctx.log.record(PASS, "merge_duplicate_constant", c.name, [c.name, first.name], True)


def _attr_key(value: Any) -> Hashable:
    """A hashable, value-based form of an attribute value (None: not comparable)."""
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, tuple(value.shape), _digest(_raw(value)))
    if isinstance(value, (list, tuple)):
        items = tuple(_attr_key(v) for v in value)
        return None if any(i is None for i in items) else ("seq", items)
    if hasattr(value, "nodes") and hasattr(value, "inputs"):
        return None  # a subgraph: never merged
    if isinstance(value, (int, float, str, bool)) or value is None:
        return (type(value).__name__, value)
    return None


def _node_key(node: Node) -> Hashable | None:
    if not node.metaop.pure:  # two random draws are two different values
        return None
    try:
        attrs = resolve_attrs(node.op, f"(node {node.name})", node.metaop.attrs, node.attrs)
    except MetadefError:
        return None
    items = []
    for k in sorted(attrs):
        key = _attr_key(attrs[k])
        if key is None and attrs[k] is not None:
            return None
        items.append((k, key))
    inputs = tuple(None if v is None else id(v) for v in node.inputs)
    return (node.domain or "", node.op, tuple(items), inputs, len(node.outputs))


def _merge_nodes(ed: GraphEditor, ctx: PassContext) -> None:
    """Replace each node equal to an earlier one by the earlier one (topological order); the
    replaced node is left unused, and ``finish`` drops it."""
    seen: dict[Hashable, Node] = {}
    for node in list(ed.graph.nodes):
        key = _node_key(node)
        if key is None:
            continue
        first = seen.setdefault(key, node)
        if first is node:
            continue
        for old, new in zip(node.outputs, first.outputs):
            ed.replace_uses(old, new)
        ctx.log.record(PASS, "merge_duplicate_node", node.name, [node.name, first.name], True)


def eliminate_common_subexpressions(graph: Graph, ctx: PassContext) -> Graph:
    """A new graph where equal constants and equal nodes appear once (see the module doc).
    ``merge_duplicate_constant`` / ``merge_duplicate_node`` in ``ctx.options.disabled`` skip a step."""
    ed = GraphEditor(graph.clone())
    if "merge_duplicate_constant" not in ctx.options.disabled:
        _merge_constants(ed, ctx)
    if "merge_duplicate_node" not in ctx.options.disabled:
        _merge_nodes(ed, ctx)
    return ed.finish()


__all__ = ["eliminate_common_subexpressions"]
