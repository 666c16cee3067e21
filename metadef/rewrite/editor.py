"""``GraphEditor``: a pass's private working copy of a graph, with use-def bookkeeping.

A pass never edits the graph it is given: it edits a clone through an editor and returns
``editor.finish()``, a new graph (dead nodes and constants dropped, nodes in topological
order). New nodes are typed by their meta-op's shape rule as they are added.

Example:
    >>> from metadef.ir import parse_graph, print_graph
    >>> g = parse_graph('''graph g(%x: f32[n]) -> (%y) {
    ...   %i: f32[n] = Identity(%x)
    ...   %y: f32[n] = Relu(%i)
    ...   return %y
    ... }''')
    >>> ed = GraphEditor(g.clone())
    >>> ed.replace_uses(ed.graph.value("i"), ed.graph.inputs[0])
    >>> [n.op for n in ed.finish().nodes]
    ['Relu']
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

import numpy as np

from metadef.core.dtypes import from_numpy
from metadef.core.errors import GraphError
from metadef.ir import Graph, Node, Value
from metadef.ops import get_op, infer_types
from metadef.shape import TensorType


class GraphEditor:
    """Edits one graph in place; construct it on a clone (``GraphEditor(graph.clone())``)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self._users: dict[int, list[Node]] | None = None
        self._names = {v.name for v in graph.values()} | {n.name for n in graph.nodes}
        self._dead: set[int] = set()
        self._counter = 0

    # --- queries ---------------------------------------------------------------------------
    def _index(self) -> dict[int, list[Node]]:
        if self._users is None:
            users: dict[int, list[Node]] = {}
            for n in self.graph.nodes:
                if id(n) in self._dead:
                    continue
                for v in n.inputs:
                    if v is not None:
                        users.setdefault(id(v), []).append(n)
            self._users = users
        return self._users

    def users(self, v: Value) -> list[Node]:
        """The live nodes that read ``v``."""
        return list(self._index().get(id(v), ()))

    def is_output(self, v: Value) -> bool:
        return any(o is v for o in self.graph.outputs)

    def num_uses(self, v: Value) -> int:
        """How many places read ``v``: node inputs plus graph outputs."""
        return len(self._index().get(id(v), ())) + sum(o is v for o in self.graph.outputs)

    def is_dead(self, node: Node) -> bool:
        return id(node) in self._dead

    def live_nodes(self) -> list[Node]:
        return [n for n in self.graph.nodes if id(n) not in self._dead]

    # --- edits -----------------------------------------------------------------------------
    def unique(self, hint: str) -> str:
        """A value or node name not used yet in this graph."""
        name = hint
        while name in self._names:
            self._counter += 1
            name = f"{hint}_{self._counter}"
        self._names.add(name)
        return name

    def const(self, hint: str, data: Any) -> Value:
        """Add a constant (weights, folded values)."""
        arr = np.asarray(data)
        v = Value(self.unique(hint), TensorType(from_numpy(arr.dtype), tuple(int(d) for d in arr.shape)), arr)
        self.graph.constants.append(v)
        return v

    def add(self, op: str, inputs: Sequence[Value | None], attrs: dict[str, Any] | None = None, *,
            name: str, domain: str = "", n_outputs: int | None = None,
            types: Sequence[TensorType] | None = None, meta: dict[str, Any] | None = None) -> tuple[Value, ...]:
        """Add a node (typed by its shape rule unless ``types`` is given); returns its outputs."""
        metaop = get_op(op, domain)
        attrs = dict(attrs or {})
        node_name = self.unique(name)
        count = n_outputs or sum(not p.optional for p in metaop.outputs) or 1
        if types is None:
            types = infer_types(metaop, node_name, [None if v is None else v.type for v in inputs], attrs,
                                [None if v is None else v.const for v in inputs], self.graph.env, count)
        outs = tuple(Value(self.unique(f"{node_name}_out{i}" if count > 1 else f"{node_name}_out"), types[i])
                     for i in range(count))
        node = Node(op, tuple(inputs), outs, attrs, node_name, domain, dict(meta or {}))
        for o in outs:
            o.producer = node
        self.graph.nodes.append(node)
        if self._users is not None:
            for v in inputs:
                if v is not None:
                    self._users.setdefault(id(v), []).append(node)
        return outs

    def replace_uses(self, old: Value, new: Value) -> None:
        """Make every reader of ``old`` read ``new``. A graph output keeps its name: ``new``
        takes it over when it is a fresh node output, else an Identity carries the name."""
        if old is new:
            return
        if old.type is not None and new.type is not None and old.type.dtype is not new.type.dtype:
            raise GraphError(f"cannot replace %{old.name} ({old.type}) by %{new.name} ({new.type}): "
                             "dtypes differ")
        for node in self.users(old):
            node.inputs = tuple(new if v is old else v for v in node.inputs)
        users = self._index()
        users.setdefault(id(new), []).extend(users.pop(id(old), []))
        if self.is_output(old):
            self._keep_output_name(old, new)

    def _keep_output_name(self, old: Value, new: Value) -> None:
        fresh = new.producer is not None and not self.is_output(new) and new.const is None \
            and all(v is not new for v in self.graph.inputs)
        if fresh:
            old_name = old.name
            old.name = self.unique(f"{old_name}_replaced")
            new.name = old_name
            carrier = new
        else:
            carrier, = self.add("Identity", [new], name=f"{old.name}_keep", types=[old.type])
            old_name = old.name
            old.name = self.unique(f"{old_name}_replaced")
            carrier.name = old_name
        self.graph.outputs = [carrier if o is old else o for o in self.graph.outputs]

    def remove(self, node: Node) -> None:
        """Drop a node (its outputs must be unused by then)."""
        self._dead.add(id(node))
        self._users = None

    # --- result ----------------------------------------------------------------------------
    def finish(self) -> Graph:
        """The edited graph: dead code gone, constants pruned, nodes in topological order."""
        g = self.graph
        live = _live_nodes(g, self._dead)
        g.nodes = _toposort(g, [n for n in g.nodes if id(n) in live])
        used = {id(v) for n in g.nodes for v in n.inputs if v is not None} | {id(v) for v in g.outputs}
        g.constants = [c for c in g.constants if id(c) in used]
        self._users = None
        self._dead = set()
        return g


def _live_nodes(g: Graph, dead: set[int]) -> set[int]:
    """Nodes that some graph output depends on (and that were not removed)."""
    live: set[int] = set()
    stack = [v.producer for v in g.outputs if v.producer is not None]
    while stack:
        n = stack.pop()
        if id(n) in live or id(n) in dead:
            continue
        live.add(id(n))
        stack.extend(v.producer for v in n.inputs if v is not None and v.producer is not None)
    return live


def _toposort(g: Graph, nodes: list[Node]) -> list[Node]:
    """Kahn's algorithm, stable: among ready nodes the one listed first goes first."""
    position = {id(n): i for i, n in enumerate(nodes)}
    waiting: dict[int, int] = {}
    readers: dict[int, list[Node]] = {}
    for n in nodes:
        deps = {id(v.producer) for v in n.inputs
                if v is not None and v.producer is not None and id(v.producer) in position}
        waiting[id(n)] = len(deps)
        for d in deps:
            readers.setdefault(d, []).append(n)
    ready = [(position[id(n)], n) for n in nodes if waiting[id(n)] == 0]
    heapq.heapify(ready)
    out: list[Node] = []
    while ready:
        _, n = heapq.heappop(ready)
        out.append(n)
        for r in readers.get(id(n), ()):
            waiting[id(r)] -= 1
            if waiting[id(r)] == 0:
                heapq.heappush(ready, (position[id(r)], r))
    if len(out) != len(nodes):
        stuck = [n.name for n in nodes if waiting[id(n)] > 0][:5]
        raise GraphError(f"graph {g.name} has a cycle through nodes {stuck}")
    return out


__all__ = ["GraphEditor"]
