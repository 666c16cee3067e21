"""ONNX import: a ModelProto (or a path) to a typed metadef Graph.

Every node maps to a meta-op or the import fails, before anything is built, with one error
naming each unknown op, its domain, a node that uses it and how to register a meta-op for it.
Initializers and ``Constant`` nodes become constants; ``dim_param`` names become symbols; a
dim with neither value nor name gets a fresh symbol. Old-opset forms (attributes that later
became inputs) are converted by the op's own ``adapt`` hook; an adapter that takes ``types``
sees the input types, and may ask for an input to get trailing axes of size 1 (``TrailingAxes``:
pre-7 broadcasting with an explicit ``axis``), which an ``Unsqueeze`` gives it.

Subgraphs (``If`` branches) read outer values by name; metadef makes that explicit (see
:mod:`metadef.ops.defs.control`): the names a subgraph reads from enclosing scopes (nested
subgraphs included) are looked up in the scope that holds the node, appended to the node's
inputs as its ``captured`` values, and become the subgraph's trailing inputs, in the order of
first reading (the union over the node's subgraphs, taken in the order the meta-op declares
its graph attributes: ``then_branch`` first). A nested ``If`` captures from its branch,
which in turn captured from its parent, so the lookup chains to any depth. Each subgraph is
typed by the usual builder, in the outer graph's symbols. An op that declares no ``captured``
input (Loop and Scan until their meta-ops exist) fails with UnsupportedOpError.

Declared types are hints, not facts: a graph output's type or a ``value_info`` entry that
disagrees with inference (another dtype or rank, or another fixed size) is logged as a warning
on logger ``metadef.frontends.onnx`` naming the value and both types, and inference wins.
Symbolic sizes never disagree (exporters name them freely). Unused initializers and opset
imports are harmless; a graph output may be a graph input or an initializer.

Example:
    >>> import metadef as md
    >>> from metadef import zoo
    >>> g = md.import_onnx(zoo.build("mlp"))
    >>> [str(v.type) for v in g.outputs]
    ['f32[batch,10]']
"""

from __future__ import annotations

import collections
import functools
import inspect
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from metadef.core.dtypes import STRING, as_strings, from_onnx
from metadef.core.errors import FormatError, MetadefError, UnsupportedOpError
from metadef.frontends.onnx.gradient import gradient_rules
from metadef.frontends.onnx.io_structure import (
    assemble,
    check_hints,
    flatten,
    output_spec,
    specialize_input,
    specialized_value,
    structure_record,
)
from metadef.frontends.onnx.sequences import (
    Imported,
    ModelBuilder,
    NoneValue,
    SequenceNode,
    SequenceValue,
    sequence_rules,
)
from metadef.frontends.onnx.unroll import branch_structure, structured_rules
from metadef.ir import Graph, GraphBuilder, Value
from metadef.ir.structure import STRUCTURE_KEY, TENSOR, Spec, TensorSpec
from metadef.ops import REGISTER_HINT, REGISTRY, MetaOp, get_op
from metadef.ops.defs.control import CAPTURED, captured_start
from metadef.ops.defs.elementwise import TrailingAxes
from metadef.ops.defs.loops import NUM_CAPTURED, body_input_rules
from metadef.shape import Dim, ShapeEnv, TensorType

log = logging.getLogger("metadef.frontends.onnx")

_CONSTANT_FIELDS = ("value", "value_float", "value_floats", "value_int", "value_ints", "value_string",
                    "value_strings")
_GRAPH_KINDS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


def load_model(source: str | os.PathLike | bytes | onnx.ModelProto) -> onnx.ModelProto:
    """Read an ONNX model (with external data) from a path, bytes, or pass a proto through."""
    if isinstance(source, onnx.ModelProto):
        return source
    try:
        if isinstance(source, bytes):
            return onnx.load_from_string(source)
        path = Path(source)
        if not path.exists():
            raise FormatError(f"ONNX file {str(path)!r} does not exist")
        return onnx.load(str(path), load_external_data=True)
    except MetadefError:
        raise
    except Exception as e:  # protobuf's DecodeError and friends
        raise FormatError(f"cannot read ONNX model {str(source)[:200]!r}: {type(e).__name__}: {e}; "
                          "is it an .onnx file, complete and not truncated?") from e


def _type_of(vi: onnx.ValueInfoProto, env: ShapeEnv, where: str) -> TensorType:
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type"):
        raise UnsupportedOpError(f"{where} {vi.name!r} is a {vi.type.WhichOneof('value') or 'untyped value'}, "
                                 "not a tensor, a sequence or an optional: not supported")
    dt = from_onnx(tt.elem_type)
    if not tt.HasField("shape"):
        return TensorType(dt, None)
    dims: list[Dim] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.dim_param:
            dims.append(env.declare(d.dim_param))
        else:
            dims.append(env.fresh(f"{vi.name.replace('/', '_').strip('_') or 'dim'}"))
    return TensorType(dt, tuple(dims))


def _array(tensor: onnx.TensorProto) -> np.ndarray:
    """A TensorProto's data; a string tensor as an object array of ``str`` (decoded UTF-8)."""
    data = numpy_helper.to_array(tensor)
    return as_strings(data, f"string tensor {tensor.name!r}") if tensor.data_type == STRING.onnx else data


def _attr_value(attr: onnx.AttributeProto, where: str) -> Any:
    kind = attr.type
    if kind == onnx.AttributeProto.TENSOR:
        return _array(attr.t)
    if kind == onnx.AttributeProto.TENSORS:
        return [_array(t) for t in attr.tensors]
    if kind in _GRAPH_KINDS:
        raise UnsupportedOpError(f"{where}: attribute {attr.name!r} holds a subgraph, which is "
                                 "not supported here")
    if kind == onnx.AttributeProto.SPARSE_TENSOR:
        raise UnsupportedOpError(f"{where}: sparse tensor attribute {attr.name!r} is not supported")
    value = onnx.helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list):
        return tuple(v.decode() if isinstance(v, bytes) else v for v in value)
    return value


def _constant_array(node: onnx.NodeProto, where: str) -> np.ndarray:
    attrs = {a.name: _attr_value(a, where) for a in node.attribute}
    for name in _CONSTANT_FIELDS:
        if name in attrs:
            value = attrs[name]
            if name in ("value_float", "value_floats"):
                return np.asarray(value, dtype=np.float32)
            if name in ("value_int", "value_ints"):
                return np.asarray(value, dtype=np.int64)
            if name in ("value_string", "value_strings"):
                return as_strings(list(value)) if name == "value_strings" else as_strings([value]).reshape(())
            return value
    raise UnsupportedOpError(f"{where}: Constant with attributes {sorted(attrs)} is not supported "
                             "(sparse tensors are not supported)")


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs a node's attributes hold (If branches, Loop and Scan bodies)."""
    found: list[onnx.GraphProto] = []
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            found.append(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            found.extend(a.graphs)
    return found


def _unknown_ops(graph: onnx.GraphProto, missing: dict[tuple[str, str], str]) -> None:
    for i, node in enumerate(graph.node):
        if node.op_type in ("Constant", *sequence_rules) and node.domain in ("", "ai.onnx"):
            continue
        if (node.domain, node.op_type) in gradient_rules:
            continue
        if REGISTRY.get(node.op_type, node.domain) is None:
            missing.setdefault((node.domain or "ai.onnx", node.op_type), node.name or f"#{i}")
        for sub in _subgraphs(node):
            _unknown_ops(sub, missing)


def _check_ops(graph: onnx.GraphProto) -> None:
    missing: dict[tuple[str, str], str] = {}
    _unknown_ops(graph, missing)
    if missing:
        listing = "; ".join(f"op {op!r} of domain {dom!r} (node {where})"
                            for (dom, op), where in sorted(missing.items()))
        raise UnsupportedOpError(f"the model uses ops no meta-op covers: {listing}. To run it, "
                                 f"{REGISTER_HINT}")


def _opset_of(model: onnx.ModelProto) -> dict[str, int]:
    opset = {}
    for imp in model.opset_import:
        opset["" if imp.domain in ("", "ai.onnx") else imp.domain] = int(imp.version)
    opset.setdefault("", 21)
    return opset


def import_graph(model: onnx.ModelProto, name: str | None = None, *,
                 sequence_lengths: Mapping[str, int] | None = None,
                 optional_present: Mapping[str, bool] | None = None,
                 input_values: Mapping[str, Any] | None = None) -> Graph:
    """Convert a loaded ModelProto into a typed Graph (see ``import_onnx``)."""
    g = model.graph
    _check_ops(g)
    opset = _opset_of(model)
    lengths, present = dict(sequence_lengths or {}), dict(optional_present or {})
    fixed = dict(input_values or {})
    check_hints(g.input, lengths, present, fixed)
    b = ModelBuilder(name or g.name or "main", opset=opset)
    values: dict[str, Value | None] = {"": None}
    for init in g.initializer:
        try:
            values[init.name] = b.const(init.name, _array(init))
        except Exception as e:
            raise FormatError(f"initializer {init.name!r} cannot be read: {e}") from e
    in_specs, out_specs = [], []
    for vi in g.input:
        if vi.name in values:
            continue  # an initializer also listed as an input (older exporters)
        spec, flat = specialize_input(vi, lengths, present)  # a sequence: its items, as inputs
        in_specs.append((vi.name, spec))
        inputs = [b.input(f.name, _type_of(f, b.env, "graph input")) for f in flat]
        values[vi.name] = assemble(spec, iter(inputs))
        if isinstance(spec, TensorSpec):
            b.value_inputs[id(inputs[0])] = vi.name
        if vi.name in fixed:  # specialized on its value (guarded at run time): a constant inside
            fixed[vi.name] = specialized_value(vi, fixed[vi.name], inputs[0].type.dtype.numpy)
            values[vi.name] = b.const(f"{vi.name}.value", fixed[vi.name])
    for i, node in enumerate(g.node):
        _import_node(b, node, i, values, opset)
    for vi in g.output:
        if vi.name not in values or values[vi.name] is None:
            raise FormatError(f"graph output {vi.name!r} is not produced by any node, input or initializer")
        spec, flat = output_spec(vi, values[vi.name])
        out_specs.append((vi.name, spec))
        if isinstance(spec, TensorSpec):
            b.output(flat[0])
        else:  # a sequence's items, named out.0, out.1, ...
            b.output(*(b.node("Identity", [v], outputs=[f"{vi.name}.{k}"])[0] for k, v in enumerate(flat)))
    _check_declared([*g.output, *g.value_info], values, "graph")
    b.metadata.update({p.key: p.value for p in model.metadata_props})
    if (structure := structure_record(in_specs, out_specs, fixed)) is not None:
        b.metadata[STRUCTURE_KEY] = structure.to_json()
    b.metadata["producer"] = f"{model.producer_name} {model.producer_version}".strip()
    return b.build()


def _declared_text(vi: onnx.ValueInfoProto) -> str:
    """A declared ONNX type in metadef's text form, ``?`` for a dim with neither value nor name."""
    tt = vi.type.tensor_type
    try:
        name = from_onnx(tt.elem_type).short
    except MetadefError:
        name = f"elem_type {tt.elem_type}"
    if not tt.HasField("shape"):
        return name
    dims = [str(d.dim_value) if d.HasField("dim_value") else d.dim_param or "?" for d in tt.shape.dim]
    return f"{name}[{','.join(dims)}]"


def _disagrees(vi: onnx.ValueInfoProto, inferred: TensorType) -> bool:
    """Whether a declared type contradicts the inferred one: another dtype, another rank, or
    another fixed size on some axis (symbolic sizes on either side never contradict)."""
    tt = vi.type.tensor_type
    if tt.elem_type and (inferred.dtype.onnx != tt.elem_type):
        return True
    if not tt.HasField("shape") or inferred.shape is None:
        return False
    if len(tt.shape.dim) != len(inferred.shape):
        return True
    return any(d.HasField("dim_value") and isinstance(i, int) and d.dim_value != i
               for d, i in zip(tt.shape.dim, inferred.shape))


def _check_declared(declared: list[onnx.ValueInfoProto], values: dict[str, Value | None],
                    where: str) -> None:
    """Warn about each declared tensor type that inference contradicts; inference wins."""
    for vi in declared:
        value = values.get(vi.name)
        if not isinstance(value, Value) or value.type is None or not vi.type.HasField("tensor_type"):
            continue
        if _disagrees(vi, value.type):
            log.warning("%s value %r is declared %s but inference gives %s; using the inferred "
                        "type", where, vi.name, _declared_text(vi), value.type)


def _tensor(value: Value | SequenceValue, where: str) -> Value:
    """A value that must be a tensor: a sequence or an empty optional reaching here (a graph
    output, an op that takes tensors, a subgraph's capture) fails with UnsupportedOpError."""
    if isinstance(value, NoneValue):
        raise UnsupportedOpError(f"{where}: an empty Optional reaches a place that takes a tensor; "
                                 "metadef resolves optionals at import time, and only OptionalHasElement "
                                 "may read an empty one")
    if isinstance(value, SequenceValue):
        raise UnsupportedOpError(f"{where}: a sequence of {len(value)} tensors reaches a place that "
                                 "takes a tensor; metadef unrolls sequences at import time, and only "
                                 "sequence ops (SequenceAt, ConcatFromSequence, ...) may read them")
    return value


def _import_node(b: GraphBuilder, node: onnx.NodeProto, index: int,
                 values: dict[str, Value | None], opset: dict[str, int]) -> None:
    where = f"node {node.name or '#' + str(index)} ({node.op_type})"
    if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
        values[node.output[0]] = b.const(node.output[0], _constant_array(node, where))
        return
    attrs = {a.name: _attr_value(a, where) for a in node.attribute if a.type not in _GRAPH_KINDS}
    try:
        read = [values[n] for n in node.input]
    except KeyError as e:
        raise FormatError(f"{where} reads {e.args[0]!r}, which no earlier node, input or "
                          "initializer defines (is the graph topologically sorted?)") from None
    expand = gradient_rules.get((node.domain, node.op_type))
    if expand is not None:  # differentiated here, into ordinary nodes (see gradient.py)
        grads = expand(b, read, attrs, values, node.name or f"{node.op_type}_{index}", where)
        for n, v in zip(node.output, grads):
            if n:
                values[n] = b.node("Identity", [v], outputs=[n])[0]
        return
    rule = sequence_rules.get(node.op_type) or structured_rules.get(node.op_type) \
        if node.domain in ("", "ai.onnx") else None
    if rule is not None:
        graphs = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}
        seq_node = SequenceNode(b, read, attrs, node.name or f"{node.op_type}_{index}", where, graphs,
                                functools.partial(_inline, b, values, opset), values)
        results = rule(seq_node)
        if results is not None:  # else the node imports as usual (a Loop over tensors)
            for n, v in zip(node.output, results):
                # a tensor result (an item picked, a Concat) takes the node's output name
                values[n] = v if isinstance(v, SequenceValue) or not n else b.node("Identity", [v], outputs=[n])[0]
            return
    op = get_op(node.op_type, node.domain)
    inputs = [None if v is None else _tensor(v, where) for v in read]
    while inputs and inputs[-1] is None:
        inputs.pop()
    structure: list[Spec] | None = None  # an If whose branches give sequences: their tensors
    if _subgraphs(node):
        graphs, captured, specs = _import_subgraphs(b, node, op, where, values, opset)
        structure = branch_structure(b, inputs[0] if inputs else None, specs, where) if specs else None
        attrs.update(graphs)
        if NUM_CAPTURED in op.attrs:  # own variadic values, then the captured ones (Loop, Scan)
            fixed = sum(not p.variadic for p in op.inputs)
            inputs = [*inputs, *[None] * (fixed - len(inputs)), *captured]
            attrs[NUM_CAPTURED] = len(captured)
        else:
            inputs = [*inputs, *[None] * (captured_start(op) - len(inputs)), *captured]
    if op.adapt is not None:
        version = opset.get("" if node.domain in ("", "ai.onnx") else node.domain, 21)
        n_outputs = len([o for o in node.output])
        args = (version, attrs, len(inputs), n_outputs) if _takes_outputs(op.adapt) else (version, attrs, len(inputs))
        kwargs = {"types": [None if v is None else v.type for v in inputs]} if _takes_types(op.adapt) else {}
        attrs, extra = op.adapt(*args, **kwargs)
        for idx, data in sorted(extra.items()):
            label = f"{node.name or node.op_type}_{op.inputs[min(idx, len(op.inputs) - 1)].name}"
            if isinstance(data, TrailingAxes):  # an old-opset broadcast: align the input
                rank = inputs[idx].type.rank
                axes = b.const(f"{label}_axes", np.arange(rank, rank + data.count, dtype=np.int64))
                inputs[idx] = b.node("Unsqueeze", [inputs[idx], axes], name=f"{label}_aligned")[0]
                continue
            while len(inputs) < idx:
                inputs.append(None)
            const = b.const(label, np.asarray(data))
            if idx < len(inputs):
                inputs[idx] = const
            else:
                inputs.append(const)
    out_names = list(node.output)
    while out_names and out_names[-1] == "" and structure is None:
        out_names.pop()
    placeholder = [n or f"{node.name or node.op_type}_unused{k}" for k, n in enumerate(out_names)]
    if structure is not None:  # each sequence output as its items
        placeholder = [f"{p}.{k}" for p, spec in zip(placeholder, structure) for k in range(spec.count)] \
            if any(not isinstance(spec, TensorSpec) for spec in structure) else placeholder
    outs = b.node(node.op_type, inputs, attrs, name=node.name or f"{node.op_type}_{index}",
                  domain=node.domain if node.domain != "ai.onnx" else "", outputs=placeholder)
    grouped = outs if structure is None else [assemble(spec, it) for it in [iter(outs)] for spec in structure]
    for n, v in zip(out_names, grouped):
        if n:
            values[n] = v


def _inline(b: GraphBuilder, scope: Mapping[str, Imported | None], opset: dict[str, int],
            graph: onnx.GraphProto, bindings: list[Imported | None], label: str) -> list[Imported]:
    """Import a subgraph's nodes into ``b`` itself, its inputs bound to ``bindings`` and the
    names it reads from outside looked up in ``scope``; its outputs (tensors, sequences)."""
    values = collections.ChainMap({vi.name: v for vi, v in zip(graph.input, bindings)}, scope)
    for init in graph.initializer:
        values[init.name] = b.const(f"{label}/{init.name}", _array(init))
    for i, node in enumerate(graph.node):
        _import_node(b, node, i, values, opset)  # type: ignore[arg-type]
    for vi in graph.output:
        if values.get(vi.name) is None:
            raise FormatError(f"{label}: output {vi.name!r} is not produced by any node, input or initializer")
    return [values[vi.name] for vi in graph.output]


def _free_names(graph: onnx.GraphProto) -> list[str]:
    """The names a graph reads but does not define (through nested subgraphs too), in the order
    they are first read."""
    defined = {""} | {vi.name for vi in graph.input} | {t.name for t in graph.initializer}
    free: list[str] = []

    def read(name: str) -> None:
        if name not in defined and name not in free:
            free.append(name)

    for node in graph.node:
        for name in node.input:
            read(name)
        for sub in _subgraphs(node):
            for name in _free_names(sub):
                read(name)
        defined.update(node.output)
    for vi in graph.output:
        read(vi.name)
    return free


def _import_subgraphs(b: GraphBuilder, node: onnx.NodeProto, op: MetaOp, where: str,
                      values: dict[str, Value | None],
                      opset: dict[str, int]) -> tuple[dict[str, Graph], list[Value], dict[str, list[Spec]]]:
    """The node's graph attributes as typed Graphs, the outer values they capture and, for
    an If, the structure of each branch's outputs (a sequence output gives its items)."""
    start = captured_start(op)
    counted = NUM_CAPTURED in op.attrs  # Loop, Scan: the node's own inputs end with a variadic
    if (start is None and not counted) or any(a.type == onnx.AttributeProto.GRAPHS for a in node.attribute):
        held = ", ".join(repr(a.name) for a in node.attribute if a.type in _GRAPH_KINDS)
        raise UnsupportedOpError(f"{where}: attribute {held} holds a subgraph, but meta-op {op.qualname} "
                                 f"declares no variadic {CAPTURED!r} input to carry the values it reads "
                                 "from the enclosing graph; only If imports subgraphs so far (Loop and "
                                 "Scan are not supported yet)")
    if not counted and len(node.input) > start:
        raise FormatError(f"{where} has {len(node.input)} inputs; {op.qualname} takes {start} "
                          "besides the values its subgraphs capture")
    declared = list(op.attrs)  # the op's attribute order (then_branch first), not the proto's
    held = sorted((a for a in node.attribute if a.type == onnx.AttributeProto.GRAPH),
                  key=lambda a: declared.index(a.name) if a.name in declared else len(declared))
    names: list[str] = []
    for a in held:
        names += [n for n in _free_names(a.g) if n not in names]
    captured = []
    for n in names:
        if values.get(n) is None:
            raise FormatError(f"{where}: a subgraph reads {n!r}, which neither the subgraph nor "
                              "any enclosing graph defines before this node")
        captured.append(_tensor(values[n], f"{where}: captured value {n!r}"))
    own = [None if values.get(n) is None else values[n].type for n in node.input]
    rule = body_input_rules.get(op.name) if not op.domain else None
    plain = {a.name: _attr_value(a, where) for a in node.attribute if a.type not in _GRAPH_KINDS}
    formal = rule(plain, own) if rule is not None else []
    bodies = {a.name: _import_body(a.g, b.env, names, captured, opset, f"{where} {a.name}", formal,
                                   flat=not counted) for a in held}
    graphs = {k: graph for k, (graph, _) in bodies.items()}
    return graphs, captured, {k: specs for k, (_, specs) in bodies.items() if not counted}


def _import_body(graph: onnx.GraphProto, env: ShapeEnv, names: list[str], captured: list[Value],
                 opset: dict[str, int], where: str, formal: list[TensorType | None] = (), *,
                 flat: bool = False) -> tuple[Graph, list[Spec]]:
    """One subgraph: its own inputs, then the captured values (typed as outside), its
    constants and its nodes, typed in the outer graph's symbols (``env`` is shared); with
    ``flat``, a sequence output gives its items as outputs (and an empty optional none), and
    the specs say so."""
    b = GraphBuilder(graph.name or where, opset=opset, env=env)
    values: dict[str, Value | None] = {"": None}
    for i, vi in enumerate(graph.input):
        fed = formal[i] if i < len(formal) else None
        untyped = not vi.type.HasField("tensor_type") and fed is not None  # typed by what the node feeds it
        values[vi.name] = b.input(vi.name, fed if untyped else _type_of(vi, env, f"{where} input"))
    for name, outer in zip(names, captured):
        values[name] = b.input(name, outer.type)
    for init in graph.initializer:
        values[init.name] = b.const(init.name, _array(init))
    for i, node in enumerate(graph.node):
        _import_node(b, node, i, values, opset)
    specs: list[Spec] = []
    for vi in graph.output:
        if values.get(vi.name) is None:
            raise FormatError(f"{where}: output {vi.name!r} is not produced by any node, input or initializer")
        spec, items = flatten(values[vi.name]) if flat else (TENSOR, [_tensor(values[vi.name], f"{where}: "
                                                                              f"output {vi.name!r}")])
        specs.append(spec)
        b.output(*items)
    _check_declared([*graph.output, *graph.value_info], values, where)
    return b.build(), specs


@functools.cache
def _takes_outputs(adapt: Any) -> bool:
    """Whether an op's adapter takes the node's output count (Split before opset 18 needs it)."""
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(p.kind in positional for p in inspect.signature(adapt).parameters.values()) >= 4


@functools.cache
def _takes_types(adapt: Any) -> bool:
    """Whether an op's adapter takes the input types (legacy broadcasting with an ``axis``)."""
    return "types" in inspect.signature(adapt).parameters


def import_onnx(source: str | os.PathLike | bytes | onnx.ModelProto, *, name: str | None = None,
                sequence_lengths: Mapping[str, int] | None = None,
                optional_present: Mapping[str, bool] | None = None,
                input_values: Mapping[str, Any] | None = None) -> Graph:
    """Import an ONNX model (path, bytes or ModelProto) as a Graph with symbolic shapes inferred.

    A model with sequence or optional graph inputs is specialized on their structure:
    ``sequence_lengths`` gives each sequence input's length, ``optional_present`` whether each
    optional input is present, and ``input_values`` the value of each tensor input that decides
    a structure (a split size, a position, a loop's trip count; the error that asks for one
    names it), see :mod:`metadef.frontends.onnx.io_structure`. The session then takes lists and
    None for such inputs, gives lists and None for such outputs, and checks the structure (and
    the values) of each run; ``metadef.compile_onnx`` specializes on each structure it meets.

    Example:
        >>> import metadef as md
        >>> g = md.import_onnx(md.zoo.build("mlp"))
        >>> str(g.inputs[0].type)
        'f32[batch,784]'
    """
    return import_graph(load_model(source), name=name, sequence_lengths=sequence_lengths,
                        optional_present=optional_present, input_values=input_values)


__all__ = ["import_graph", "import_onnx", "load_model"]
