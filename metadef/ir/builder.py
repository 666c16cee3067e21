"""``GraphBuilder``: the one way to make a graph, used by frontends, passes and tests.

Node outputs get their types from the meta-op's shape rule as they are added, so a graph
built here is typed throughout; a rule failure raises at the node that caused it.

Example:
    >>> import numpy as np
    >>> from metadef.shape import parse_type
    >>> b = GraphBuilder("mlp")
    >>> x = b.input("x", parse_type("f32[batch,4]"))
    >>> w = b.const("w", np.ones((4, 2), np.float32))
    >>> y, = b.node("MatMul", [x, w], name="/fc/MatMul")
    >>> str(y.type)
    'f32[batch,2]'
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from metadef.core.dtypes import from_numpy
from metadef.core.errors import GraphError
from metadef.ir.graph import Graph, Node, Value
from metadef.ir.values import ShapeValues
from metadef.ops import get_op, infer_types
from metadef.shape import ShapeEnv, TensorType


class GraphBuilder:
    """Collects inputs, constants and nodes, then ``build()`` returns the Graph."""

    def __init__(self, name: str = "main", *, opset: dict[str, int] | None = None,
                 env: ShapeEnv | None = None, infer: bool = True) -> None:
        self.name = name
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self.nodes: list[Node] = []
        self.constants: list[Value] = []
        self.opset = dict(opset or {"": 21})
        self.env = env or ShapeEnv()
        self.infer = infer
        self.metadata: dict[str, Any] = {}
        self._names: set[str] = set()
        self.shape_values = ShapeValues()
        self._counter = 0

    def _unique(self, hint: str) -> str:
        name = hint
        while name in self._names:
            self._counter += 1
            name = f"{hint}_{self._counter}"
        self._names.add(name)
        return name

    def input(self, name: str, type: TensorType) -> Value:
        """Declare a graph input; its symbolic dims join the graph's symbols."""
        if name in self._names:
            raise GraphError(f"graph {self.name}: value name {name!r} is used twice")
        self._names.add(name)
        for s in type.free_symbols:
            self.env.declare(s)
        v = Value(name, type)
        self.inputs.append(v)
        return v

    def const(self, name: str, data: np.ndarray | Any) -> Value:
        """A constant (weights); the array is kept as given (no copy)."""
        arr = data if isinstance(data, np.ndarray) else np.asarray(data)
        v = Value(self._unique(name), TensorType(from_numpy(arr.dtype), tuple(int(d) for d in arr.shape)), arr)
        self.constants.append(v)
        return v

    def node(self, op: str, inputs: Sequence[Value | None], attrs: dict[str, Any] | None = None, *,
             name: str = "", domain: str = "", outputs: Sequence[str] | int | None = None,
             types: Sequence[TensorType | None] | None = None) -> tuple[Value, ...]:
        """Add a node and return its output values.

        ``outputs`` gives output names (or a count; default: as many as the op declares,
        without its optional ones). ``types`` overrides inference (for importers that already
        know them); otherwise the meta-op's rule infers them now.
        """
        meta = get_op(op, domain)
        attrs = dict(attrs or {})
        node_name = self._unique(name or f"{op}_{len(self.nodes)}")
        if outputs is None or isinstance(outputs, int):
            count = outputs if isinstance(outputs, int) else sum(not p.optional for p in meta.outputs) or 1
            out_names = [self._unique(f"{node_name}_out{i}" if count > 1 else f"{node_name}_out") for i in range(count)]
        else:
            out_names = [self._unique(n) for n in outputs]
        if types is None and self.infer:
            in_types = [None if v is None else v.type for v in inputs]
            values = [self.shape_values.known(v) for v in inputs]
            types = infer_types(meta, node_name, in_types, attrs, values, self.env, len(out_names))
        outs = tuple(Value(n, None if types is None else types[i]) for i, n in enumerate(out_names))
        if types is not None and self.infer:
            self.shape_values.record(meta, inputs, attrs, outs)
        node = Node(op, tuple(inputs), outs, attrs, node_name, domain)
        for o in outs:
            o.producer = node
        self.nodes.append(node)
        return outs

    def output(self, *values: Value) -> None:
        """Mark values as graph outputs, in order."""
        self.outputs.extend(values)

    def build(self) -> Graph:
        """The finished graph."""
        g = Graph(self.name, self.inputs, self.outputs, self.nodes, self.constants, self.opset,
                  self.env, self.metadata)
        return g


__all__ = ["GraphBuilder"]
