"""ONNX sequences (and optionals) whose structure is known at import time, unrolled into tensors.

metadef's IR holds tensors only. A sequence that a model builds and takes apart inside one graph
(``SequenceConstruct`` / ``SequenceInsert`` ... ``SequenceAt`` / ``ConcatFromSequence``) with
constant positions has a length and items the importer can follow: while importing, a sequence
is a :class:`SequenceValue`, a tuple of the tensor values it holds, and each sequence op is a rule
of :data:`sequence_rules` that makes a new tuple, picks an item, or emits tensor nodes (``Concat``,
``Split``, ``Unsqueeze``); ``SequenceMap`` imports its body once per item. Nothing of a sequence
reaches the graph but its tensors: a sequence graph input or output is specialized on its
length (see :mod:`metadef.frontends.onnx.io_structure`), and ``If`` / ``Loop`` around
sequences are resolved by :mod:`metadef.frontends.onnx.unroll`.

A position, split size or trip count must be known at import: a constant, or a small node over
constants (:func:`import_time_value`). One that depends on the model's tensor inputs asks for
them to be specialized on their value (a :class:`~metadef.core.errors.SpecializationError`
naming them and the ``input_values`` keyword); anything else known only at run time (a value
inside a Loop body, a subgraph's capture of a sequence) fails with ``UnsupportedOpError``
naming the node.

Example:
    >>> import numpy as np, onnx
    >>> from onnx import helper, TensorProto as T
    >>> import metadef as md
    >>> g = helper.make_graph(
    ...     [helper.make_node("SequenceConstruct", ["x", "y"], ["s"]),
    ...      helper.make_node("ConcatFromSequence", ["s"], ["z"], axis=0, new_axis=1)], "g",
    ...     [helper.make_tensor_value_info(n, T.FLOAT, [3]) for n in "xy"],
    ...     [helper.make_tensor_value_info("z", T.FLOAT, None)])
    >>> graph = md.import_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 12)]))
    >>> [n.op for n in graph.nodes], str(graph.outputs[0].type)
    (['Unsqueeze', 'Unsqueeze', 'Concat', 'Identity'], 'f32[2,3]')
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from metadef.core.errors import MetadefError, SpecializationError, UnsupportedOpError
from metadef.ir import Graph, GraphBuilder, Value
from metadef.ops.interface import resolve_attrs
from metadef.ops.numpy_eval import run_node


@dataclass(frozen=True)
class SequenceValue:
    """A sequence while importing: the tensor values it holds, in order.

    Example:
        >>> len(SequenceValue(()))
        0
    """

    items: tuple[Value, ...]

    def __len__(self) -> int:
        return len(self.items)


@dataclass(frozen=True)
class NoneValue(SequenceValue):
    """An empty optional (``Optional()`` with no input) while importing; a present optional is
    the tensor or sequence it holds.

    Example:
        >>> len(NoneValue(()))
        0
    """


class ModelBuilder(GraphBuilder):
    """The builder of a model's main graph, which knows its tensor inputs by value: a value
    that decides a sequence's structure and depends on them asks for them to be specialized
    (``import_onnx(..., input_values=...)``), where a subgraph's inputs could not be.

    Example:
        >>> ModelBuilder("g").value_inputs
        {}
    """

    def __init__(self, name: str = "main", **options: Any) -> None:
        super().__init__(name, **options)
        self.value_inputs: dict[int, str] = {}
        """The model's tensor inputs: id of the Value -> the ONNX input's name."""


def import_time_value(b: GraphBuilder, v: Value | None, depth: int = 0) -> np.ndarray | None:
    """``v``'s value when it can be computed while importing: a constant, a shape-like value
    the builder tracks, or a small node over such values (``Add(iteration, 1)``, ``Not(has)``)
    run by its reference semantics; None when it depends on run-time inputs.

    Example:
        >>> b = GraphBuilder("g")
        >>> one = b.const("one", np.array(1))
        >>> two, = b.node("Add", [one, one])
        >>> import_time_value(b, two)
        array(2)
    """
    if v is None:
        return None
    known = b.shape_values.known(v)
    if known is not None:
        return None if known.dtype == object else np.asarray(known)
    node = v.producer
    if node is None or depth > 32 or any(isinstance(a, Graph) for a in node.attrs.values()):
        return None
    if any(o.type is None or not o.type.is_static or int(np.prod(o.type.shape)) > 4096 for o in node.outputs):
        return None
    arrays = [import_time_value(b, x, depth + 1) for x in node.inputs]
    if any(a is None and x is not None for a, x in zip(arrays, node.inputs)):
        return None
    try:
        op = node.metaop
        attrs = resolve_attrs(op.name, node.name, op.attrs, node.attrs)
        outs = run_node(op, attrs, arrays, [o.type for o in node.outputs], node.name)
    except (MetadefError, ValueError, TypeError, IndexError):
        return None
    return np.asarray(outs[node.outputs.index(v)])


def inputs_behind(b: GraphBuilder, v: Value) -> list[str]:
    """The model's tensor inputs that ``v`` depends on (none outside a :class:`ModelBuilder`).

    Example:
        >>> from metadef.shape import parse_type
        >>> b = ModelBuilder("g")
        >>> k = b.input("k", parse_type("i64[]"))
        >>> b.value_inputs[id(k)] = "k"
        >>> inputs_behind(b, b.node("Neg", [k])[0])
        ['k']
    """
    if not isinstance(b, ModelBuilder):
        return []
    found: list[str] = []
    seen: set[int] = set()
    stack = [v]
    while stack and len(seen) < 100_000:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if id(x) in b.value_inputs and b.value_inputs[id(x)] not in found:
            found.append(b.value_inputs[id(x)])
        if x.producer is not None:
            stack += [i for i in x.producer.inputs if i is not None]
    return found


def needs_value(b: GraphBuilder, v: Value, what: str) -> MetadefError:
    """The error for a value that decides a structure but is known only at run time: a
    SpecializationError naming the model's inputs behind it, or UnsupportedOpError.

    Example:
        >>> from metadef.shape import parse_type
        >>> b = GraphBuilder("body")
        >>> type(needs_value(b, b.input("i", parse_type("i64[]")), "the position")).__name__
        'UnsupportedOpError'
    """
    behind = inputs_behind(b, v)
    if behind:
        wanted = ", ".join(f"{n!r}: ..." for n in behind)
        return SpecializationError(
            f"{what} is known only at run time: it depends on graph input(s) {behind}. metadef unrolls "
            f"sequences at import time, so it specializes the graph on their value: import with "
            f"input_values={{{wanted}}} (a run must then feed those values), or compile the model with "
            "metadef.compile_onnx, which specializes on each value it is run with", inputs=tuple(behind))
    return UnsupportedOpError(f"{what} is known only at run time; metadef unrolls sequences at import "
                              "time, so positions, split sizes and trip counts must be constants")


Imported = Value | SequenceValue
"""What an ONNX name stands for while importing: a tensor, a sequence, or an empty optional."""
Inline = Callable[[onnx.GraphProto, Sequence[Imported | None], str], list[Imported]]
"""The importer's way to import a subgraph's nodes into the current graph, its inputs bound to
the given values (SequenceMap bodies, unrolled Loop bodies, a folded If's branch)."""


@dataclass(frozen=True)
class SequenceNode:
    """What a sequence rule sees of one node: the builder, its inputs (tensors, sequences or
    None for an omitted one), its attributes, its graph attributes (with ``inline`` to import
    one of them here) and where it is, for errors."""

    builder: GraphBuilder
    inputs: Sequence[Value | SequenceValue | None]
    attrs: dict[str, Any]
    name: str
    where: str
    graphs: Mapping[str, onnx.GraphProto] = field(default_factory=dict)
    inline: Inline | None = None
    scope: Mapping[str, Imported | None] = field(default_factory=dict)
    """What each ONNX name of the enclosing scopes stands for (what a subgraph may read)."""

    def value(self, i: int) -> np.ndarray | None:
        """Input ``i``'s value when known at import (see :func:`import_time_value`), else None."""
        x = self.tensor(i)
        return None if x is None else import_time_value(self.builder, x)

    def body(self, name: str, bindings: Sequence[Imported | None], label: str) -> list[Imported]:
        """Graph attribute ``name`` imported here with its inputs bound to ``bindings``."""
        if name not in self.graphs or self.inline is None:
            raise UnsupportedOpError(f"{self.where}: attribute {name!r} must hold a graph")
        return self.inline(self.graphs[name], bindings, f"{self.name}/{label}")

    def sequence(self, i: int) -> SequenceValue:
        x = self.inputs[i] if i < len(self.inputs) else None
        if not isinstance(x, SequenceValue):
            raise UnsupportedOpError(f"{self.where}: input {i} must be a sequence built in this graph")
        return x

    def tensor(self, i: int) -> Value | None:
        x = self.inputs[i] if i < len(self.inputs) else None
        if isinstance(x, SequenceValue):
            raise UnsupportedOpError(f"{self.where}: input {i} must be a tensor, got a sequence")
        return x

    def constant(self, i: int) -> np.ndarray | None:
        """Input ``i``'s value when known now (None when omitted); a run-time value fails."""
        x = self.tensor(i)
        if x is None:
            return None
        known = import_time_value(self.builder, x)
        if known is None:
            raise needs_value(self.builder, x, f"{self.where}: input {i} ({x.name})")
        return known

    def position(self, i: int, length: int, default: int, *, inserting: bool = False) -> int:
        """A position input, defaulted and made non-negative (counted from the back when
        negative, as Python's ``list.insert`` does); ``inserting`` also allows ``length``."""
        value = self.constant(i)
        pos = default if value is None else int(value.reshape(-1)[0])  # a scalar (or one element)
        if not -length <= pos < length + inserting:
            raise UnsupportedOpError(f"{self.where}: position {pos} is out of range for a "
                                     f"sequence of length {length}")
        return pos + length if pos < 0 else pos

    def node(self, op: str, inputs: Sequence[Value | None], attrs: dict[str, Any] | None = None,
             outputs: int | None = None) -> tuple[Value, ...]:
        return self.builder.node(op, inputs, attrs, name=self.name, outputs=outputs)

    def int64s(self, label: str, data: Any) -> Value:
        return self.builder.const(f"{self.name}_{label}", np.asarray(data, dtype=np.int64))


Result = list[Value | SequenceValue]
SequenceRule = Callable[[SequenceNode], Result]


def _construct(n: SequenceNode) -> Result:
    return [SequenceValue(tuple(n.tensor(i) for i in range(len(n.inputs))))]


def _insert(n: SequenceNode) -> Result:
    items = list(n.sequence(0).items)
    items.insert(n.position(2, len(items), len(items), inserting=True), n.tensor(1))
    return [SequenceValue(tuple(items))]


def _erase(n: SequenceNode) -> Result:
    items = list(n.sequence(0).items)
    del items[n.position(1, len(items), len(items) - 1)]
    return [SequenceValue(tuple(items))]


def _at(n: SequenceNode) -> Result:
    seq = n.sequence(0)
    return [seq.items[n.position(1, len(seq), 0)]]


def _length(n: SequenceNode) -> Result:
    return [n.int64s("length", len(n.sequence(0)))]


def _concat(n: SequenceNode) -> Result:
    items = list(n.sequence(0).items)
    if not items:
        raise UnsupportedOpError(f"{n.where}: ConcatFromSequence of an empty sequence")
    axis = int(n.attrs.get("axis", 0))
    if n.attrs.get("new_axis", 0):
        rank = items[0].type.rank
        axis = axis + rank + 1 if axis < 0 else axis
        axes = n.int64s("axes", [axis])
        items = [n.node("Unsqueeze", [x, axes])[0] for x in items]
    return [n.node("Concat", items, {"axis": axis})[0]]


def _split(n: SequenceNode) -> Result:
    x = n.tensor(0)
    rank = x.type.rank
    axis = int(n.attrs.get("axis", 0))
    axis = axis + rank if axis < 0 else axis
    split = n.tensor(1) if len(n.inputs) > 1 else None
    if split is not None and split.type.rank == 1 and isinstance(split.type.shape[0], int):
        count = split.type.shape[0]  # the count is the split's length, its values may be run-time
        return [SequenceValue(n.node("Split", [x, split], {"axis": axis}, outputs=count) if count else ())]
    size = x.type.shape[axis]
    if not isinstance(size, int):
        raise UnsupportedOpError(f"{n.where}: splitting axis {axis} of {x.type}, whose size is known "
                                 "only at run time, gives a sequence of unknown length")
    chunk = 1 if split is None else int(n.constant(1).reshape(-1)[0])
    sizes = [chunk] * (size // chunk) + ([size % chunk] if size % chunk else [])
    if not sizes:
        return [SequenceValue(())]
    parts = n.node("Split", [x, n.int64s("split", sizes)], {"axis": axis}, outputs=len(sizes))
    if split is None and not n.attrs.get("keepdims", 1):
        axes = n.int64s("axes", [axis])
        parts = tuple(n.node("Squeeze", [p, axes])[0] for p in parts)
    return [SequenceValue(tuple(parts))]


def _optional(n: SequenceNode) -> Result:
    held = n.inputs[0] if n.inputs else None
    return [NoneValue(()) if held is None else held]


def _has_element(n: SequenceNode) -> Result:
    held = n.inputs[0] if n.inputs else None
    present = held is not None and not isinstance(held, NoneValue)
    return [n.builder.const(f"{n.name}_present", np.array(present))]


def _get_element(n: SequenceNode) -> Result:
    held = n.inputs[0] if n.inputs else None
    if held is None or isinstance(held, NoneValue):
        raise UnsupportedOpError(f"{n.where}: OptionalGetElement of an empty optional (ONNX makes this "
                                 "an error at run time)")
    return [held]


def _sequence_map(n: SequenceNode) -> Result:
    """SequenceMap, unrolled: its body imported once per item, fed the items of the sequence
    inputs and the tensor inputs whole; each body output becomes a sequence."""
    length = len(n.sequence(0))
    for i, x in enumerate(n.inputs):
        if isinstance(x, NoneValue) or (isinstance(x, SequenceValue) and len(x) != length):
            got = "an empty optional" if isinstance(x, NoneValue) else f"{len(x)} items"
            raise UnsupportedOpError(f"{n.where}: input {i} has {got}; SequenceMap needs every sequence "
                                     f"input to have the first one's length ({length})")
    outputs: list[list[Value]] = [[] for _ in n.graphs.get("body", onnx.GraphProto()).output]
    for k in range(length):
        bindings = [x.items[k] if isinstance(x, SequenceValue) else x for x in n.inputs]
        for i, (out, got) in enumerate(zip(outputs, n.body("body", bindings, f"item{k}"))):
            if isinstance(got, SequenceValue):
                raise UnsupportedOpError(f"{n.where}: body output {i} is a sequence; SequenceMap's body "
                                         "gives tensors")
            out.append(got)
    return [SequenceValue(tuple(out)) for out in outputs]


sequence_rules: dict[str, SequenceRule] = {
    "SequenceEmpty": lambda n: [SequenceValue(())],
    "SequenceConstruct": _construct,
    "SequenceInsert": _insert,
    "SequenceErase": _erase,
    "SequenceAt": _at,
    "SequenceLength": _length,
    "ConcatFromSequence": _concat,
    "SplitToSequence": _split,
    "Optional": _optional,
    "OptionalHasElement": _has_element,
    "OptionalGetElement": _get_element,
    "SequenceMap": _sequence_map,
}
"""How each sequence (and optional) op of the default domain is unrolled at import time, by op
name: an optional whose presence is known at import time is the value it holds, or
:class:`NoneValue`."""
