"""ONNX sequences (and optionals) whose structure is known at import time, unrolled into tensors.

metadef's IR holds tensors only. A sequence that a model builds and takes apart inside one graph
(``SequenceConstruct`` / ``SequenceInsert`` ... ``SequenceAt`` / ``ConcatFromSequence``) with
constant positions has a length and items the importer can follow: while importing, a sequence
is a :class:`SequenceValue`, a tuple of the tensor values it holds, and each sequence op is a rule
of :data:`sequence_rules` that makes a new tuple, picks an item, or emits tensor nodes (``Concat``,
``Split``, ``Unsqueeze``). Nothing of a sequence reaches the graph. A position known only at run
time, a split count known only at run time, or a sequence that leaves the graph (a graph output,
a graph input, a subgraph's capture) fails with ``UnsupportedOpError`` naming the node.

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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from metadef.core.errors import UnsupportedOpError
from metadef.ir import GraphBuilder, Value


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


@dataclass(frozen=True)
class SequenceNode:
    """What a sequence rule sees of one node: the builder, its inputs (tensors, sequences or
    None for an omitted one), its attributes and where it is, for errors."""

    builder: GraphBuilder
    inputs: Sequence[Value | SequenceValue | None]
    attrs: dict[str, Any]
    name: str
    where: str

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
        known = self.builder.shape_values.known(x)
        if known is None or known.dtype == object:
            raise UnsupportedOpError(
                f"{self.where}: input {i} ({x.name}) is known only at run time; metadef unrolls "
                "sequences at import time, so positions and split sizes must be constants")
        return np.asarray(known)

    def position(self, i: int, length: int, default: int, *, inserting: bool = False) -> int:
        """A position input, defaulted and made non-negative (counted from the back when
        negative, as Python's ``list.insert`` does); ``inserting`` also allows ``length``."""
        value = self.constant(i)
        pos = default if value is None else int(value)
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
    chunk = 1 if split is None else int(n.constant(1))
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
}
"""How each sequence (and optional) op of the default domain is unrolled at import time, by op
name: an optional whose presence is known at import time is the value it holds, or
:class:`NoneValue`."""
