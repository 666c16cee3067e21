"""ONNX export of what ONNX Runtime does not know: fused groups and metadef's own ops, as
model-local functions (``FunctionProto`` in ``model.functions``) built from standard ops.

- ``ai.metadef::Fused`` becomes a call of a function in domain ``ai.metadef.fused`` named
  after the group's kind (``contraction_epilogue_0``), one function per distinct body: its
  nodes are the body's nodes; the body's constants (scalars and shape-read values only, see
  ``metadef.passes.fuse_groups``) become ``Constant`` nodes inside it. Constants inside keep
  the call's arity equal to the Fused node's (Netron shows the same edges as metadef's IR),
  make the function self-contained (two groups share a function only if their constants are
  equal too), and ONNX Runtime folds them when it inlines the call.
- ``ai.metadef::SiLU``, ``ai.metadef::Attention`` and ``ai.metadef::Lookup`` become calls of
  local functions of the same name in ``ai.metadef`` (Sigmoid/Mul; Transpose/MatMul/Mul/Add/
  Softmax/MatMul; Cast/Gather, ``LookupInt8`` with the offset of int8's -128), so the
  node reads as it does in metadef and runs in ONNX Runtime. (Gelu and LayerNormalization are
  standard ONNX ops in the IR already: the exported opset is at least 21.)
- A function body that holds such ops calls their functions in turn (nested).

Each rule is an entry of ``function_rules``, keyed by (domain, op): adding an op means adding
an entry, not editing the exporter.

Example:
    >>> import metadef as md
    >>> g = md.optimize(md.import_onnx(md.zoo.build("mlp")), level="aggressive")
    >>> lib = FunctionLibrary({"": 21})
    >>> fused = [n for n in g.nodes if n.op == "Fused"][0]
    >>> lib.call_node(fused, ["x", "w"], ["y"]).op_type
    'contraction_epilogue_0'
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from metadef.core.errors import FormatError
from metadef.ir import Graph, Node, Value

METADEF_DOMAIN = "ai.metadef"
FUSED_DOMAIN = "ai.metadef.fused"


def attribute_proto(name: str, value: Any) -> onnx.AttributeProto:
    """One node attribute as an AttributeProto (a GraphProto must be converted already).

    Example:
        >>> attribute_proto("perm", (1, 0)).ints
        [1, 0]
    """
    if isinstance(value, onnx.GraphProto):
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


class FunctionLibrary:
    """The model-local functions of one export, one per distinct structure (see the module doc).

    ``versions`` is the model's opset map; each function imports the same versions (ONNX
    Runtime wants a function's opsets to agree with the model's), and a domain a function
    introduces is added to it at version 1.
    """

    def __init__(self, versions: dict[str, int]) -> None:
        self.versions = versions
        self.functions: list[onnx.FunctionProto] = []
        self._by_key: dict[bytes, str] = {}
        self._numbers: dict[tuple[str, str], int] = {}

    def add(self, domain: str, base: str, nodes: Sequence[onnx.NodeProto], inputs: Sequence[str],
            outputs: Sequence[str], *, numbered: bool = True) -> str:
        """The name of a function with this body: an equal one already added, else a new one
        named ``base_<k>`` (``numbered``) or ``base`` then ``base_1``..."""
        used = {n.domain for n in nodes} | {""}
        for d in used:
            self.versions.setdefault(d, 1)
        self.versions.setdefault(domain, 1)
        opsets = [helper.make_opsetid(d, self.versions[d]) for d in sorted(used)]
        proto = helper.make_function(domain, "", list(inputs), list(outputs), list(nodes), opsets)
        key = domain.encode() + b"\0" + base.encode() + b"\0" + proto.SerializeToString(deterministic=True)
        if key in self._by_key:
            return self._by_key[key]
        k = self._numbers.get((domain, base), 0)
        self._numbers[(domain, base)] = k + 1
        proto.name = f"{base}_{k}" if numbered or k else base
        self._by_key[key] = proto.name
        self.functions.append(proto)
        return proto.name

    def call_node(self, node: Node, inputs: list[str], outputs: list[str]) -> onnx.NodeProto | None:
        """``node`` as a call of a local function (made on first need), or None when ONNX
        knows its op and it exports as it is."""
        rule = function_rules.get((node.domain, node.op))
        return None if rule is None else rule(self, node, inputs, outputs)

    def node_proto(self, node: Node, inputs: list[str], outputs: list[str]) -> onnx.NodeProto:
        """``node`` inside a function body: a call when a rule has it, else the op as it is."""
        call = self.call_node(node, inputs, outputs)
        if call is not None:
            return call
        proto = helper.make_node(node.op, inputs, outputs, domain=node.domain or "")
        for k, v in node.attrs.items():
            if isinstance(v, Graph):
                raise FormatError(f"cannot export {node.qualop} node {node.name} inside a function: it holds "
                                  f"subgraph {k!r}; keep control flow out of fused groups (mark it no_fuse)")
            if v is not None:
                proto.attribute.append(attribute_proto(k, v))
        if node.domain not in ("", "ai.onnx"):
            self.versions.setdefault(node.domain, 1)
        return proto


def _call(node: Node, domain: str, name: str, inputs: list[str], outputs: list[str],
          doc: str = "") -> onnx.NodeProto:
    return helper.make_node(name, inputs, outputs, name=node.name, domain=domain, doc_string=doc)


def _fused_call(lib: FunctionLibrary, node: Node, inputs: list[str], outputs: list[str]) -> onnx.NodeProto:
    """A Fused node: its body becomes a function (see the module doc)."""
    body: Graph = node.attrs["body"]
    names: dict[int, str] = {id(v): f"x{i}" for i, v in enumerate(body.inputs)}
    nodes: list[onnx.NodeProto] = []
    for i, c in enumerate(body.constants):
        names[id(c)] = f"c{i}"
        nodes.append(helper.make_node("Constant", [], [f"c{i}"], value=numpy_helper.from_array(np.asarray(c.const))))
    out_of = {id(v): f"y{i}" for i, v in reversed(list(enumerate(body.outputs)))}
    computed: set[int] = set()
    k = 0
    for m in body.nodes:
        for o in m.outputs:
            names[id(o)] = out_of.get(id(o)) or f"t{k}"
            k += 1
            computed.add(id(o))
    for m in body.nodes:
        ins = ["" if v is None else _body_name(v, names) for v in m.inputs]
        nodes.append(lib.node_proto(m, ins, [names[id(o)] for o in m.outputs]))
    formal_outputs = []
    for i, v in enumerate(body.outputs):
        name = f"y{i}"
        if id(v) not in computed or names[id(v)] != name:  # an input, a constant or a repeat
            nodes.append(helper.make_node("Identity", [_body_name(v, names)], [name]))
        formal_outputs.append(name)
    kind = str(node.attrs.get("kind", "group"))
    base = "".join(c if c.isalnum() else "_" for c in kind)
    fname = lib.add(FUSED_DOMAIN, base, nodes, [f"x{i}" for i in range(len(body.inputs))], formal_outputs)
    anchor = node.meta.get("anchor", "")
    return _call(node, FUSED_DOMAIN, fname, inputs, outputs, f"fused group ({kind}), anchored at {anchor}")


def _body_name(v: Value, names: dict[int, str]) -> str:
    if id(v) not in names:
        raise FormatError(f"fused body value %{v.name} is neither an input, a constant nor computed "
                          "in the body; the body is malformed (run metadef.ir.verify on the graph)")
    return names[id(v)]


def _silu_call(lib: FunctionLibrary, node: Node, inputs: list[str], outputs: list[str]) -> onnx.NodeProto:
    """SiLU(X) = X * Sigmoid(X)."""
    body = [helper.make_node("Sigmoid", ["X"], ["s"]), helper.make_node("Mul", ["X", "s"], ["Y"])]
    fname = lib.add(METADEF_DOMAIN, "SiLU", body, ["X"], ["Y"], numbered=False)
    return _call(node, METADEF_DOMAIN, fname, inputs, outputs)


def _attention_call(lib: FunctionLibrary, node: Node, inputs: list[str], outputs: list[str]) -> onnx.NodeProto:
    """Attention(Q, K, V[, mask]) = Softmax(scale * Q Kᵀ [+ mask]) V; the scale and the rank
    (for Kᵀ's Transpose) are baked in: one function per (rank, mask, scale, layout) met; with
    ``layout="bshd"`` Q and V have their heads swapped before the sequence, K straight to Kᵀ,
    and Y back."""
    q = node.inputs[0]
    rank = None if q is None or q.type is None or q.type.shape is None else len(q.type.shape)
    if rank is None or rank < 2 or (rank < 3 and node.attrs.get("layout", "bhsd") == "bshd"):
        raise FormatError(f"cannot export ai.metadef::Attention node {node.name}: the rank of Q is unknown "
                          "(run shape inference first: md.optimize does)")
    perm = [*range(rank - 2), rank - 1, rank - 2]
    masked = len(inputs) > 3 and inputs[3] != ""
    scale = numpy_helper.from_array(np.array(float(node.attrs["scale"]), np.float32))
    body: list[onnx.NodeProto] = []
    q_name, v_name, y_name = "Q", "V", "Y"
    swap = [*range(rank - 3), rank - 2, rank - 3, rank - 1]
    if node.attrs.get("layout", "bhsd") == "bshd":  # heads after the sequence: swapped in and out
        body = [helper.make_node("Transpose", [t], [f"{t}h"], perm=swap) for t in ("Q", "V")]
        q_name, v_name, y_name = "Qh", "Vh", "Yh"
        perm = [*range(rank - 3), rank - 2, rank - 1, rank - 3]  # K [*B, N, H, D] -> [*B, H, D, N]
    body += [
        helper.make_node("Transpose", ["K"], ["Kt"], perm=perm),
        helper.make_node("MatMul", [q_name, "Kt"], ["qk"]),
        helper.make_node("Constant", [], ["scale32"], value=scale),
        helper.make_node("CastLike", ["scale32", "Q"], ["scale"]),
        helper.make_node("Mul", ["qk", "scale"], ["scores"]),
    ]
    if masked:
        body.append(helper.make_node("Add", ["scores", "mask"], ["masked"]))
    body += [helper.make_node("Softmax", ["masked" if masked else "scores"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", v_name], [y_name])]
    if y_name != "Y":
        body.append(helper.make_node("Transpose", [y_name], ["Y"], perm=swap))
    formal = ["Q", "K", "V", "mask"] if masked else ["Q", "K", "V"]
    fname = lib.add(METADEF_DOMAIN, "Attention", body, formal, ["Y"], numbered=False)
    return _call(node, METADEF_DOMAIN, fname, inputs[:len(formal)], outputs,
                 f"scaled-dot-product attention, scale {float(node.attrs['scale']):g}")


def _lookup_call(lib: FunctionLibrary, node: Node, inputs: list[str], outputs: list[str]) -> onnx.NodeProto:
    """Lookup(X, table) = Gather(table, Cast(X to int32) [+ 128 for an int8 X])."""
    x = node.inputs[0]
    signed = x is not None and x.type is not None and x.type.dtype.numpy == np.int8
    body = [helper.make_node("Cast", ["X"], ["i" if signed else "index"], to=onnx.TensorProto.INT32)]
    if signed:  # (int8's -128 is entry 0)
        body += [helper.make_node("Constant", [], ["half"], value=numpy_helper.from_array(np.array(128, np.int32))),
                 helper.make_node("Add", ["i", "half"], ["index"])]
    body.append(helper.make_node("Gather", ["table", "index"], ["Y"], axis=0))
    fname = lib.add(METADEF_DOMAIN, "LookupInt8" if signed else "Lookup", body, ["X", "table"], ["Y"], numbered=False)
    return _call(node, METADEF_DOMAIN, fname, inputs, outputs, "an 8-bit tensor's entries in a 256-entry table")


FunctionRule = Callable[[FunctionLibrary, Node, list[str], list[str]], onnx.NodeProto]
function_rules: dict[tuple[str, str], FunctionRule] = {
    (METADEF_DOMAIN, "Fused"): _fused_call,
    (METADEF_DOMAIN, "SiLU"): _silu_call,
    (METADEF_DOMAIN, "Attention"): _attention_call,
    (METADEF_DOMAIN, "Lookup"): _lookup_call,
}
"""How each op ONNX Runtime does not know exports, keyed by (domain, op)."""

__all__ = ["FUSED_DOMAIN", "METADEF_DOMAIN", "FunctionLibrary", "attribute_proto", "function_rules"]
