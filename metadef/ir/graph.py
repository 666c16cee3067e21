"""The graph IR: ``Graph``, ``Node`` and ``Value`` — six words to learn, like torch.fx.

A ``Value`` is an edge: a graph input, a constant (weights: ``value.const`` holds the array)
or a node output. A ``Node`` applies one meta-op (``node.op``, ``node.domain``) to input values
with attributes and produces output values. A ``Graph`` holds its inputs, outputs, constants
and nodes in topological order. Passes do not edit a graph they are given: they build a new
one (``graph.clone()`` copies the structure and shares the weight arrays).

Example:
    >>> from metadef.ir import GraphBuilder
    >>> from metadef.shape import parse_type
    >>> b = GraphBuilder("tiny")
    >>> x = b.input("x", parse_type("f32[batch,4]"))
    >>> y, = b.node("Relu", [x])
    >>> b.output(y)
    >>> g = b.build()
    >>> [n.op for n in g.nodes], [v.name for v in g.inputs]
    (['Relu'], ['x'])
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from metadef.core.errors import GraphError
from metadef.ir.printer import print_graph
from metadef.ops import MetaOp, get_op
from metadef.shape import ShapeEnv, TensorType


@dataclass(eq=False)
class Value:
    """An edge of the graph. ``const`` is set for weights and other compile-time constants."""

    name: str
    type: TensorType | None = None
    const: np.ndarray | None = None
    producer: Node | None = field(default=None, repr=False)

    @property
    def is_const(self) -> bool:
        return self.const is not None

    def __repr__(self) -> str:
        return f"Value(%{self.name}: {self.type})"


@dataclass(eq=False)
class Node:
    """One application of a meta-op. ``inputs`` may hold None for an omitted optional input.

    ``meta`` carries annotations that are not ONNX attributes, e.g. ``meta["no_fuse"] = True``
    excludes the node from fusion.
    """

    op: str
    inputs: tuple[Value | None, ...]
    outputs: tuple[Value, ...]
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    domain: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def metaop(self) -> MetaOp:
        """The node's meta-op from the registry."""
        return get_op(self.op, self.domain)

    @property
    def qualop(self) -> str:
        return f"{self.domain}::{self.op}" if self.domain not in ("", "ai.onnx") else self.op

    def __repr__(self) -> str:
        return f"Node({self.name or '?'}: {self.qualop})"


@dataclass(eq=False)
class Graph:
    """A dataflow graph in topological order (see the module doc)."""

    name: str
    inputs: list[Value]
    outputs: list[Value]
    nodes: list[Node]
    constants: list[Value] = field(default_factory=list)
    opset: dict[str, int] = field(default_factory=lambda: {"": 21})
    env: ShapeEnv = field(default_factory=ShapeEnv)
    metadata: dict[str, Any] = field(default_factory=dict)

    # --- traversal ---------------------------------------------------------------------
    def values(self) -> Iterator[Value]:
        """Every value once: inputs, constants, then node outputs in order."""
        seen: set[int] = set()
        for v in [*self.inputs, *self.constants] + [o for n in self.nodes for o in n.outputs]:
            if id(v) not in seen:
                seen.add(id(v))
                yield v

    def value(self, name: str) -> Value:
        """The value called ``name``; GraphError lists near names when there is none."""
        for v in self.values():
            if v.name == name:
                return v
        raise GraphError(f"graph {self.name} has no value {name!r}")

    def node(self, name: str) -> Node:
        """The node called ``name``."""
        for n in self.nodes:
            if n.name == name:
                return n
        raise GraphError(f"graph {self.name} has no node {name!r}")

    def consumers(self) -> dict[int, list[Node]]:
        """For each value id, the nodes that read it (graph outputs are not nodes)."""
        users: dict[int, list[Node]] = {}
        for n in self.nodes:
            for v in n.inputs:
                if v is not None:
                    users.setdefault(id(v), []).append(n)
        return users

    def op_counts(self) -> dict[str, int]:
        """How many nodes of each op the graph has."""
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.qualop] = counts.get(n.qualop, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def num_parameters(self) -> int:
        """Total number of elements held in constants."""
        return int(sum(v.const.size for v in self.constants if v.const is not None))

    # --- copying -----------------------------------------------------------------------
    def clone(self) -> Graph:
        """A structural copy: new Value and Node objects, shared constant arrays."""
        mapping: dict[int, Value] = {}

        def copy(v: Value | None) -> Value | None:
            if v is None:
                return None
            got = mapping.get(id(v))
            if got is None:
                got = Value(v.name, v.type, v.const)
                mapping[id(v)] = got
            return got

        inputs = [copy(v) for v in self.inputs]
        constants = [copy(v) for v in self.constants]
        nodes = []
        for n in self.nodes:
            attrs = {k: v.clone() if isinstance(v, Graph) else v for k, v in n.attrs.items()}
            new = Node(n.op, tuple(copy(v) for v in n.inputs), tuple(copy(v) for v in n.outputs),
                       attrs, n.name, n.domain, dict(n.meta))
            for o in new.outputs:
                o.producer = new
            nodes.append(new)
        outputs = [copy(v) for v in self.outputs]
        env = ShapeEnv(dict(self.env.symbols))
        return Graph(self.name, inputs, outputs, nodes, constants, dict(self.opset), env,
                     dict(self.metadata))

    def __str__(self) -> str:
        return print_graph(self)

    def __repr__(self) -> str:
        return (f"Graph({self.name}: {len(self.inputs)} inputs, {len(self.nodes)} nodes, "
                f"{len(self.outputs)} outputs)")


__all__ = ["Graph", "Node", "Value"]
