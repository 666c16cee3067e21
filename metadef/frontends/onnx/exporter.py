"""ONNX export: a metadef Graph back to a ModelProto that ONNX Runtime (and Netron) open.

Symbolic dims become ``dim_param`` (a compound expression is written as its text, e.g.
``batch*2``); constants become initializers.

Subgraphs of ops that capture outer values (``If``: see :mod:`metadef.ops.defs.control`) go
back to ONNX's form: the branch inputs that receive captured values are dropped from the
GraphProto and every read of them is renamed to the outer value's name, so the branch reads
the enclosing scope by name as ONNX Runtime expects. Names stay unique across the whole model
(a subgraph value whose name is taken outside gets a suffix), and a branch output that its
branch does not compute (a captured value, a constant, a repeat) goes out through an Identity.

Example:
    >>> import metadef as md, onnx
    >>> g = md.import_onnx(md.zoo.build("mlp"))
    >>> m = to_onnx(g)
    >>> onnx.checker.check_model(m)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from metadef.core.errors import FormatError
from metadef.ir import Graph, Node, Value
from metadef.ops.defs.loops import NUM_CAPTURED, node_captured_start
from metadef.shape import TensorType

IR_VERSION = 8
# Meta-ops hold each op in its newest form (e.g. reduction axes as an input, from opset 18),
# so an exported model declares at least the opset whose forms the IR uses.
IR_OPSET = 21


def _value_info(v: Value, name: str | None = None) -> onnx.ValueInfoProto:
    t: TensorType | None = v.type
    name = v.name if name is None else name
    if t is None:
        return helper.make_empty_tensor_value_info(name)
    shape = None if t.shape is None else [d if isinstance(d, int) else str(d) for d in t.shape]
    return helper.make_tensor_value_info(name, t.dtype.onnx, shape)


def _attr(name: str, value: Any) -> onnx.AttributeProto:
    if isinstance(value, onnx.GraphProto):  # a subgraph, already converted by _graph_proto
        return helper.make_attribute(name, value)
    if isinstance(value, np.ndarray):
        return helper.make_attribute(name, numpy_helper.from_array(value))
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, list) and value and isinstance(value[0], np.ndarray):
        return helper.make_attribute(name, [numpy_helper.from_array(v) for v in value])
    if isinstance(value, list) and not value:
        # An empty list has no inferable kind for onnx.helper; metadef stores only ints lists empty.
        return helper.make_attribute(name, [], attr_type=onnx.AttributeProto.INTS)
    return helper.make_attribute(name, value)


class _Names:
    """Exported names: one per value, unique across the model (ONNX subgraphs share one scope)."""

    def __init__(self, taken: set[str]) -> None:
        self.taken = taken
        self.of: dict[int, str] = {}

    def claim(self, v: Value, name: str | None = None) -> str:
        base = name = v.name if name is None else name
        k = 0
        while name in self.taken:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        self.of[id(v)] = name
        return name


def _node_attrs(n: Node, names: _Names) -> list[onnx.AttributeProto]:
    start = node_captured_start(n.metaop, n.attrs, len(n.inputs))
    outer = [] if start is None else [names.of[id(v)] for v in n.inputs[start:]]
    out = []
    for k, v in n.attrs.items():
        if v is None or k == NUM_CAPTURED:  # metadef's own count, implied by the subgraph in ONNX
            continue
        if isinstance(v, Graph):  # control flow reads ``outer`` by name; a fused body stands alone
            v = _graph_proto(v, outer, names.taken) if start is not None else _graph_proto(v)
        out.append(_attr(k, v))
    return out


def _graph_proto(graph: Graph, captured: list[str] | None = None,
                 taken: set[str] | None = None) -> onnx.GraphProto:
    """The graph as a GraphProto. For a subgraph, ``captured`` names the outer values its last
    ``len(captured)`` inputs receive, and ``taken`` holds the names used outside."""
    sub = captured is not None
    names = _Names(taken if taken is not None else set())
    formal = graph.inputs[:len(graph.inputs) - len(captured)] if sub else graph.inputs
    for v, outer in zip(graph.inputs[len(formal):], captured or []):
        names.of[id(v)] = outer
    for v in [*formal, *graph.constants] + [o for n in graph.nodes for o in n.outputs]:
        if id(v) not in names.of:
            names.claim(v)
    initializers = [numpy_helper.from_array(np.asarray(v.const), names.of[id(v)]) for v in graph.constants]
    nodes = []
    for n in graph.nodes:
        start = node_captured_start(n.metaop, n.attrs, len(n.inputs))  # captured values are read by name, not passed
        node = helper.make_node(
            n.op, [("" if v is None else names.of[id(v)]) for v in n.inputs[:start]],
            [names.of[id(o)] for o in n.outputs], name=n.name, domain=n.domain or "")
        node.attribute.extend(_node_attrs(n, names))
        nodes.append(node)
    outputs = []
    computed = {id(o) for n in graph.nodes for o in n.outputs}
    for v in graph.outputs:
        name = names.of[id(v)]
        if sub and (id(v) not in computed or any(o.name == name for o in outputs)):
            name = names.claim(Value(f"{name}_out", v.type))
            nodes.append(helper.make_node("Identity", [names.of[id(v)]], [name], name=name))
        outputs.append(_value_info(v, name))
    inputs = [_value_info(v, names.of[id(v)]) for v in formal]
    value_info = [_value_info(o, names.of[id(o)]) for n in graph.nodes for o in n.outputs
                  if o.type is not None and all(o is not g for g in graph.outputs)]
    return helper.make_graph(nodes, graph.name, inputs, outputs, initializers, value_info=value_info)


def _domains(graph: Graph) -> set[str]:
    """Every op domain the graph and its nested bodies use."""
    found: set[str] = set()
    for n in graph.nodes:
        if n.domain not in ("", "ai.onnx"):
            found.add(n.domain)
        for a in n.attrs.values():
            if isinstance(a, Graph):
                found |= _domains(a)
    return found


def to_onnx(graph: Graph) -> onnx.ModelProto:
    """The graph as a ModelProto (see the module doc). Fused groups export as ``ai.metadef``
    nodes with their body as a graph attribute: Netron shows them; ONNX Runtime cannot run them."""
    g = _graph_proto(graph)
    versions = dict(graph.opset)
    versions[""] = max(versions.get("", IR_OPSET), IR_OPSET)
    for domain in _domains(graph):
        versions.setdefault(domain, 1)
    opsets = [helper.make_opsetid(d, v) for d, v in sorted(versions.items())]
    model = helper.make_model(g, opset_imports=opsets, producer_name="metadef", ir_version=IR_VERSION)
    for k, v in graph.metadata.items():
        if isinstance(v, str):
            model.metadata_props.add(key=k, value=v)
    return model


def export_onnx(graph: Graph, path: str | os.PathLike) -> Path:
    """Write the graph as an .onnx file (atomically: a temporary file, then a rename).

    Example:
        >>> import metadef as md, tempfile, os
        >>> g = md.import_onnx(md.zoo.build("mlp"))
        >>> p = md.export_onnx(g, os.path.join(tempfile.mkdtemp(), "mlp.onnx"))
        >>> p.name
        'mlp.onnx'
    """
    target = Path(path)
    model = to_onnx(graph)
    data = model.SerializeToString()
    if len(data) > 2**31 - 1:
        raise FormatError(f"graph {graph.name} is over 2 GB; ONNX needs external data for it")
    tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    return target


__all__ = ["export_onnx", "to_onnx"]
