"""ONNX export: a metadef Graph back to a ModelProto that ONNX Runtime (and Netron) open.

Symbolic dims become ``dim_param`` (a compound expression is written as its text, e.g.
``batch*2``); constants become initializers.

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
from metadef.ir import Graph, Value
from metadef.shape import TensorType

IR_VERSION = 8
# Meta-ops hold each op in its newest form (e.g. reduction axes as an input, from opset 18),
# so an exported model declares at least the opset whose forms the IR uses.
IR_OPSET = 21


def _value_info(v: Value) -> onnx.ValueInfoProto:
    t: TensorType | None = v.type
    if t is None:
        return helper.make_empty_tensor_value_info(v.name)
    shape = None if t.shape is None else [d if isinstance(d, int) else str(d) for d in t.shape]
    return helper.make_tensor_value_info(v.name, t.dtype.onnx, shape)


def _attr(name: str, value: Any) -> onnx.AttributeProto:
    if isinstance(value, Graph):  # a fused group's body, control flow: a nested GraphProto
        return helper.make_attribute(name, _graph_proto(value))
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


def _graph_proto(graph: Graph) -> onnx.GraphProto:
    initializers = [numpy_helper.from_array(np.asarray(v.const), v.name) for v in graph.constants]
    nodes = []
    for n in graph.nodes:
        node = helper.make_node(
            n.op, [("" if v is None else v.name) for v in n.inputs], [o.name for o in n.outputs],
            name=n.name, domain=n.domain or "")
        node.attribute.extend(_attr(k, v) for k, v in n.attrs.items() if v is not None)
        nodes.append(node)
    outputs = [_value_info(v) for v in graph.outputs]
    inputs = [_value_info(v) for v in graph.inputs]
    value_info = [_value_info(o) for n in graph.nodes for o in n.outputs
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
