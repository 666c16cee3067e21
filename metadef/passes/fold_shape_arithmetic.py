"""``fold_shape_arithmetic``: replace run-time shape computations by constants.

PyTorch and TensorFlow exporters compute reshape targets at run time
(``Shape -> Gather -> Unsqueeze -> Concat -> Reshape``). The symbolic value of every small
integer tensor follows from :data:`~metadef.ops.defs.shape_values.SHAPE_VALUE_RULES` (the
table inference uses); this pass reads it and:

- ``fold_static_shape``: a value that is fully static (say a Shape of a static tensor) becomes a
  constant, where it leaves the shape computation;
- ``fold_shape_chain``: a Reshape, Expand or Slice whose shape-like input is symbolic gets a
  constant that means the same: for Reshape, static dims, ``0`` (copy the input's dim at that
  position, allowzero=0) and at most one ``-1``; for Expand, ``1`` where the input already has
  the dim; for Slice ends, "to the end" where the end is the whole dim. The table
  :data:`shape_target_encoders` says how, per op;
- ``shorten_shape_chain`` (second phase): a symbolic value that no constant can replace but that
  is a run of one tensor's dims becomes one ``Shape(x, start, end)`` node.

Example (BERT's attention reshape):
    >>> from metadef.ir import parse_graph, print_graph
    >>> from metadef.passes.base import PassContext
    >>> g = parse_graph('''graph g(%x: f32[batch,seq,768]) -> (%y) {
    ...   %i0: i64[] = const [0]
    ...   %i1: i64[] = const [1]
    ...   %ax: i64[1] = const [0]
    ...   %heads: i64[2] = const [12, 64]
    ...   %s: i64[3] = Shape(%x) @shape
    ...   %b: i64[] = Gather(%s, %i0) @gather_b
    ...   %q: i64[] = Gather(%s, %i1) @gather_q
    ...   %b1: i64[1] = Unsqueeze(%b, %ax) @unsq_b
    ...   %q1: i64[1] = Unsqueeze(%q, %ax) @unsq_q
    ...   %t: i64[4] = Concat(%b1, %q1, %heads) {axis=0} @concat
    ...   %y: f32[batch,seq,12,64] = Reshape(%x, %t) @reshape
    ...   return %y
    ... }''')
    >>> ctx = PassContext()
    >>> print(print_graph(fold_shape_arithmetic(g, ctx)), end="")
    graph g(%x: f32[batch,seq,768]) -> (%y) {
      %reshape_shape: i64[4] = const [0, 0, 12, 64]
      %y: f32[batch,seq,12,64] = Reshape(%x, %reshape_shape) @reshape
      return %y
    }
    >>> ctx.log.lines()
    ['taken fold_shape_chain at reshape']
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from metadef.core.dtypes import INT_TYPES
from metadef.core.errors import MetadefError
from metadef.ir import Graph, Node, Value
from metadef.ops.defs.shape_values import (
    MAX_ELEMENTS,
    SHAPE_VALUE_RULES,
    ShapeValue,
    constant_value,
    normalize_axis,
    value_array,
)
from metadef.ops.interface import resolve_attrs
from metadef.passes.base import PassContext
from metadef.passes.simplify import rebuild, same_type
from metadef.rewrite import GraphEditor, Match, Refusal, Rule, apply_rules, op
from metadef.rewrite.engine import Built

INT64_MAX = 2**63 - 1
PASS = "fold_shape_arithmetic"


class LazyShapeValues:
    """The symbolic values of a graph's small integer tensors, computed on demand (through
    ``SHAPE_VALUE_RULES``, like :class:`metadef.ir.values.ShapeValues`, which the builder and
    the verifier fill in graph order) and kept, so a pass may ask while it edits the graph."""

    def __init__(self) -> None:
        self._memo: dict[int, tuple[Value, ShapeValue | None]] = {}

    def of(self, v: Value | None) -> ShapeValue | None:
        """``v``'s elements (ints and symbolic dims), or None when it is not a shape value."""
        if v is None:
            return None
        hit = self._memo.get(id(v))
        if hit is not None and hit[0] is v:
            return hit[1]
        value = self._compute(v)
        self._memo[id(v)] = (v, value)
        return value

    def _compute(self, v: Value) -> ShapeValue | None:
        if v.const is not None:
            return constant_value(v.const)
        node, t = v.producer, v.type
        if node is None or t is None or not t.is_static or t.dtype not in INT_TYPES:
            return None
        if math.prod(t.shape) > MAX_ELEMENTS or len(node.outputs) != 1 or node.domain not in ("", "ai.onnx"):
            return None
        rule = SHAPE_VALUE_RULES.get(node.op)
        if rule is None:
            return None
        known = [self.of(i) for i in node.inputs]
        try:
            attrs = resolve_attrs(node.op, f"(node {node.name})", node.metaop.attrs, node.attrs)
            value = rule(known, [None if i is None else i.type for i in node.inputs], attrs)
        except MetadefError:
            return None
        return value if value is not None and len(value) == math.prod(t.shape) else None

    def is_static(self, v: Value | None) -> bool:
        value = self.of(v)
        return value is not None and all(isinstance(d, int) for d in value)

    def computes(self, node: Node) -> bool:
        """Whether ``node`` is part of a shape computation (its output has a symbolic value)."""
        return len(node.outputs) == 1 and node.outputs[0].const is None and self.of(node.outputs[0]) is not None


def _live_users(ed: GraphEditor, v: Value) -> list[Node]:
    return [u for u in ed.users(v) if any(ed.num_uses(o) for o in u.outputs)]


# --- encoders: a symbolic target as a constant the op reads the same way --------------------

Encoded = tuple[list[int], dict[str, Any]] | str


def _shape_of(node: Node, i: int) -> tuple | None:
    v = node.inputs[i] if i < len(node.inputs) else None
    return None if v is None or v.type is None else v.type.shape


def _reshape_target(node: Node, value: ShapeValue) -> Encoded:
    data = _shape_of(node, 0)
    if data is None:
        return "the input's rank is unknown"
    literal_zero = node.attrs.get("allowzero", 0) and any(isinstance(d, int) and d == 0 for d in value)
    out: list[int] = []
    free = any(isinstance(d, int) and d == -1 for d in value)
    for i, d in enumerate(value):
        if isinstance(d, int):
            out.append(d)
        elif i < len(data) and data[i] == d and not literal_zero:
            out.append(0)
        elif not free:
            out.append(-1)
            free = True
        else:
            return f"target dim {i} ({d}) is not static, not the input's dim {i}, and a -1 is taken"
    attrs = dict(node.attrs)
    if not literal_zero:
        attrs.pop("allowzero", None)
    return out, attrs


def _expand_target(node: Node, value: ShapeValue) -> Encoded:
    data = _shape_of(node, 0)
    if data is None:
        return "the input's rank is unknown"
    offset = len(value) - len(data)
    out: list[int] = []
    for i, d in enumerate(value):
        if isinstance(d, int):
            out.append(d)
        elif i >= offset and data[i - offset] == d:
            out.append(1)
        else:
            return f"target dim {i} ({d}) is not static and not the input's dim there"
    return out, dict(node.attrs)


def _const_ints(node: Node, i: int) -> list[int] | None:
    v = node.inputs[i] if i < len(node.inputs) else None
    return None if v is None or v.const is None else [int(x) for x in np.asarray(v.const).reshape(-1)]


def _slice_ends(node: Node, value: ShapeValue) -> Encoded:
    data = _shape_of(node, 0)
    if data is None:
        return "the input's rank is unknown"
    axes = _const_ints(node, 3) if len(node.inputs) > 3 and node.inputs[3] is not None else list(range(len(value)))
    steps = _const_ints(node, 4) if len(node.inputs) > 4 and node.inputs[4] is not None else [1] * len(value)
    if axes is None or steps is None:
        return "its axes or steps are not constant"
    out: list[int] = []
    for k, d in enumerate(value):
        axis = normalize_axis(axes[k], len(data)) if k < len(axes) else None
        if isinstance(d, int):
            out.append(d)
        elif axis is not None and steps[k] > 0 and data[axis] == d:
            out.append(INT64_MAX)
        else:
            return f"end {k} ({d}) is not static and not the whole of its axis"
    return out, dict(node.attrs)


@dataclass(frozen=True)
class ShapeTarget:
    """Which input of an op holds a shape-like value, and how to write a symbolic one as a constant."""

    input: int
    encode: Callable[[Node, ShapeValue], Encoded]


shape_target_encoders: dict[str, ShapeTarget] = {
    "Reshape": ShapeTarget(1, _reshape_target),
    "Expand": ShapeTarget(1, _expand_target),
    "Slice": ShapeTarget(2, _slice_ends),
}
"""Op name -> the input a symbolic shape feeds and its encoder (others fold only when static)."""


# --- rules ---------------------------------------------------------------------------------


def _fold_static(m: Match, ed: GraphEditor, values: LazyShapeValues) -> Built:
    node = m.node("root")
    if all(v is None or v.const is not None for v in node.inputs):
        return None  # constants only: fold_constants' work
    if not values.computes(node) or not values.is_static(node.outputs[0]):
        return None
    v = node.outputs[0]
    leaves = ed.is_output(v) or any(not (values.computes(u) and values.is_static(u.outputs[0]))
                                    for u in _live_users(ed, v))
    if not leaves:
        return None  # a later node of the same static computation folds instead
    array = value_array(values.of(v), v.type.shape).astype(v.type.dtype.numpy)
    return ed.const(f"{node.name}_value", array)


def _fold_chain(m: Match, ed: GraphEditor, values: LazyShapeValues, target: ShapeTarget) -> Built:
    node = m.node("root")
    v = node.inputs[target.input] if target.input < len(node.inputs) else None
    if v is None or v.const is not None:
        return None
    value = values.of(v)
    if value is None:
        return None
    encoded = target.encode(node, value)
    if isinstance(encoded, str):
        return Refusal(encoded)
    ints, attrs = encoded
    inputs = list(node.inputs)
    name = node.metaop.inputs[target.input].name
    inputs[target.input] = ed.const(f"{node.name}_{name}", np.asarray(ints, dtype=v.type.dtype.numpy))
    return rebuild(ed, node, node.op, inputs, attrs)


def _shorten(m: Match, ed: GraphEditor, values: LazyShapeValues) -> Built:
    node = m.node("root")
    if not values.computes(node) or all(values.of(i) is None for i in node.inputs):
        return None  # not a shape value, or already a source (a Shape node)
    v = node.outputs[0]
    value = values.of(v)
    if v.type.rank != 1 or not any(not values.computes(u) for u in _live_users(ed, v)):
        return None
    for x, reader in _sources(values, v):
        shape = x.type.shape
        for start in range(len(shape) - len(value) + 1):
            if tuple(shape[start:start + len(value)]) == tuple(value):
                attrs = {"start": start, "end": start + len(value)} if len(value) != len(shape) else {}
                new, = ed.add("Shape", [x], attrs, name=reader.name)
                if not same_type(new, v):
                    return None
                new.producer.name, new.name = reader.name, v.name  # the chain's Shape, now alone
                return new
    return None


def _sources(values: LazyShapeValues, v: Value) -> list[tuple[Value, Node]]:
    """The tensors whose shapes a shape value was computed from, with the chain's node that
    reads each (the Shape nodes and their inputs)."""
    found: list[tuple[Value, Node]] = []
    stack, seen = [v], set()
    while stack:
        cur = stack.pop()
        node = cur.producer
        if node is None or id(node) in seen or values.of(cur) is None:
            continue
        seen.add(id(node))
        for i in node.inputs:
            if i is not None and values.of(i) is None and i.type is not None and i.type.shape is not None:
                found.append((i, node))
            elif i is not None:
                stack.append(i)
    return found


def shape_arithmetic_rules(values: LazyShapeValues) -> list[Rule]:
    """The first phase's rule table, reading ``values``."""
    chain = [Rule("fold_shape_chain", op(name, name="root"),
                  functools.partial(_fold_chain, values=values, target=target), fuses=False,
                  doc=f"{name} of a symbolic shape -> {name} of an equivalent constant")
             for name, target in shape_target_encoders.items()]
    static = Rule("fold_static_shape", op(None, name="root"), functools.partial(_fold_static, values=values),
                  fuses=False, doc="a shape computation with a static value -> a constant")
    return [*chain, static]


def shorten_rules(values: LazyShapeValues) -> list[Rule]:
    """The second phase: what could not become a constant becomes one Shape node."""
    return [Rule("shorten_shape_chain", op(None, name="root"), functools.partial(_shorten, values=values),
                 fuses=False, doc="a run of a tensor's dims, computed by a chain -> Shape(x, start, end)")]


def fold_shape_arithmetic(graph: Graph, ctx: PassContext) -> Graph:
    """A new graph with shape computations folded (see the module doc)."""
    values = LazyShapeValues()
    ed = GraphEditor(graph.clone())
    for rules in (shape_arithmetic_rules(values), shorten_rules(values)):
        active = [r for r in rules if r.name not in ctx.options.disabled]
        apply_rules(ed, active, ctx.log, PASS, ctx.options)
        ed.graph = ed.finish()
    return ed.graph


__all__ = ["ShapeTarget", "LazyShapeValues", "fold_shape_arithmetic", "shape_arithmetic_rules",
           "shape_target_encoders", "shorten_rules"]
