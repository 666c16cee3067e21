"""ONNX export: a metadef Graph back to a ModelProto that ONNX Runtime (and Netron) open.

Symbolic dims become ``dim_param`` (a compound expression is written as its text, e.g.
``batch*2``); constants become initializers.

Subgraphs of ops that capture outer values (``If``: see :mod:`metadef.ops.defs.control`) go
back to ONNX's form: the branch inputs that receive captured values are dropped from the
GraphProto and every read of them is renamed to the outer value's name, so the branch reads
the enclosing scope by name as ONNX Runtime expects. Names stay unique across the whole model
(a subgraph value whose name is taken outside gets a suffix), and a branch output that its
branch does not compute (a captured value, a constant, a repeat) goes out through an Identity.

Fused groups and metadef's own ops (``ai.metadef``) go out as model-local functions of standard
ops (:mod:`~metadef.frontends.onnx.export_functions`), so ONNX Runtime runs an optimized graph;
weights of a loaded .mdef stored quantized go out as their stored integers plus
``DequantizeLinear`` (:mod:`~metadef.frontends.onnx.export_quantized`). The opset is at least
21 (blocked ``DequantizeLinear``); a model holding INT4 initializers declares IR version 10.

Example:
    >>> import metadef as md, onnx
    >>> g = md.import_onnx(md.zoo.build("mlp"))
    >>> m = to_onnx(g)
    >>> onnx.checker.check_model(m)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from metadef.core.errors import FormatError, UnsupportedOpError
from metadef.frontends.onnx.export_functions import FUSED_DOMAIN, FunctionLibrary, attribute_proto
from metadef.frontends.onnx.export_quantized import Exported, Namer, stored_weight
from metadef.ir import Graph, Node, Value
from metadef.ops.defs.loops import BATCHED, NUM_CAPTURED, node_captured_start
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


def _node_attrs(n: Node, names: _Names, lib: FunctionLibrary | None) -> list[onnx.AttributeProto]:
    start = node_captured_start(n.metaop, n.attrs, len(n.inputs))
    outer = [] if start is None else [names.of[id(v)] for v in n.inputs[start:]]
    out = []
    for k, v in n.attrs.items():
        if v is None or k == NUM_CAPTURED:  # metadef's own count, implied by the subgraph in ONNX
            continue
        if k == BATCHED:  # metadef's mark of opset 8's batched Scan, which later opsets cannot say
            if v:
                raise UnsupportedOpError(f"node {n.name} is a Scan of the batched form of opsets below 9, "
                                         f"which opset {IR_OPSET} (what this exporter writes) has no form of; "
                                         "export the source model with opset 9 or later")
            continue
        if isinstance(v, Graph):  # control flow reads ``outer`` by name; a fused body stands alone
            v = _graph_proto(v, outer, names.taken, lib) if start is not None else _graph_proto(v, lib=lib)
        out.append(attribute_proto(k, v))
    return out


StoredWeights = Callable[[Value, str, Namer], Exported | None]
"""A constant's stored form: (initializers, nodes that compute it), or None to export it plain."""


def _initializers(graph: Graph, names: _Names,
                  weights: StoredWeights | None) -> tuple[list[onnx.TensorProto], list[onnx.NodeProto]]:
    """The graph's constants as initializers, with the nodes that dequantize stored ones."""
    def namer(wanted: str) -> str:
        return names.claim(Value(wanted))

    initializers: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []
    for v in graph.constants:
        stored = None if weights is None else weights(v, names.of[id(v)], namer)
        if stored is None:
            initializers.append(numpy_helper.from_array(np.asarray(v.const), names.of[id(v)]))
        else:
            initializers += stored[0]
            nodes += stored[1]
    return initializers, nodes


def _graph_proto(graph: Graph, captured: list[str] | None = None,
                 taken: set[str] | None = None, lib: FunctionLibrary | None = None,
                 weights: StoredWeights | None = None) -> onnx.GraphProto:
    """The graph as a GraphProto. For a subgraph, ``captured`` names the outer values its last
    ``len(captured)`` inputs receive, and ``taken`` holds the names used outside. ``lib``
    turns ops ONNX Runtime does not know into local function calls; ``weights`` gives a
    constant's stored (quantized) form."""
    sub = captured is not None
    names = _Names(taken if taken is not None else set())
    formal = graph.inputs[:len(graph.inputs) - len(captured)] if sub else graph.inputs
    for v, outer in zip(graph.inputs[len(formal):], captured or []):
        names.of[id(v)] = outer
    for v in [*formal, *graph.constants] + [o for n in graph.nodes for o in n.outputs]:
        if id(v) not in names.of:
            names.claim(v)
    initializers, nodes = _initializers(graph, names, weights)
    for n in graph.nodes:
        start = node_captured_start(n.metaop, n.attrs, len(n.inputs))  # captured values are read by name, not passed
        inputs = [("" if v is None else names.of[id(v)]) for v in n.inputs[:start]]
        outputs = [names.of[id(o)] for o in n.outputs]
        node = None if lib is None else lib.call_node(n, inputs, outputs)
        if node is None:
            node = helper.make_node(n.op, inputs, outputs, name=n.name, domain=n.domain or "")
            node.attribute.extend(_node_attrs(n, names, lib))
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


def _source_of(graph: Graph | Any, source: Any) -> tuple[Graph, Any]:
    """(graph, .mdef file) of what export was given: a Graph, or a loaded Model (md.load)."""
    if not isinstance(graph, Graph) and hasattr(graph, "graph") and hasattr(graph, "file"):
        return graph.graph, source if source is not None else graph.file
    if source is None:  # a graph of a loaded model: its constants know their file
        source = next((f for f in (getattr(v, "file", None) for v in graph.constants) if f is not None), None)
    return graph, source


def to_onnx(graph: Graph | Any, *, source: Any = None, functions: bool = True) -> onnx.ModelProto:
    """The graph as a ModelProto (see the module doc).

    Fused groups and metadef's own ops become model-local functions of standard ops
    (:mod:`metadef.frontends.onnx.export_functions`), so ONNX Runtime runs the model; with
    ``functions=False`` they stay ``ai.metadef`` nodes (Netron shows them, ONNX Runtime cannot
    run them). ``graph`` may be a loaded model (``md.load``), or ``source`` the ``MdefFile``
    the graph came from: weights stored quantized there export as their stored integers plus
    ``DequantizeLinear`` (:mod:`metadef.frontends.onnx.export_quantized`).

    Example:
        >>> import metadef as md, onnx
        >>> g = md.optimize(md.import_onnx(md.zoo.build("mlp")), level="aggressive")
        >>> m = to_onnx(g)
        >>> sorted({f.domain for f in m.functions})
        ['ai.metadef.fused']
    """
    graph, source = _source_of(graph, source)
    versions = dict(graph.opset)
    versions[""] = max(versions.get("", IR_OPSET), IR_OPSET)
    lib = FunctionLibrary(versions) if functions else None
    weights = None if source is None else partial(stored_weight, source)
    g = _graph_proto(graph, lib=lib, weights=weights)
    for domain in _domains(graph):
        versions.setdefault(domain, 1)
    if lib is not None and lib.functions:
        versions.setdefault(FUSED_DOMAIN, 1)
    opsets = [helper.make_opsetid(d, v) for d, v in sorted(versions.items())]
    # INT4 tensors need IR version 10 (the one that goes with opset 21)
    ir = 10 if any(t.data_type == onnx.TensorProto.INT4 for t in g.initializer) else IR_VERSION
    model = helper.make_model(g, opset_imports=opsets, producer_name="metadef", ir_version=ir,
                              functions=[] if lib is None else lib.functions)
    for k, v in graph.metadata.items():
        if isinstance(v, str):
            model.metadata_props.add(key=k, value=v)
    return model


def export_onnx(graph: Graph | Any, path: str | os.PathLike, *, source: Any = None,
                functions: bool = True) -> Path:
    """Write the graph as an .onnx file (atomically: a temporary file, then a rename).

    ``graph`` may also be a loaded model (``md.load``): its quantized weights then export in
    their stored form (``source`` names the ``MdefFile`` for a bare graph); ``functions``: see
    :func:`to_onnx`.

    Example:
        >>> import metadef as md, tempfile, os
        >>> g = md.import_onnx(md.zoo.build("mlp"))
        >>> p = md.export_onnx(g, os.path.join(tempfile.mkdtemp(), "mlp.onnx"))
        >>> p.name
        'mlp.onnx'
    """
    target = Path(path)
    model = to_onnx(graph, source=source, functions=functions)
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
