"""Symbolic values of shape-like tensors, tracked along a graph while it is typed.

Exporters compute reshape targets at run time (``Shape -> Gather -> Unsqueeze -> Concat``).
``ShapeValues`` remembers, for each such small integer tensor, its elements as dims
(``(batch, seq, 12, 64)``), through each op's rule in ``SHAPE_VALUE_RULES``, so that shape
inference of the Reshape that reads it sees the symbolic target. The builder (typing a graph
as it is made) and the verifier (re-typing it) use the same tracker, so they agree.

Example:
    >>> from metadef.ir import parse_graph
    >>> g = parse_graph('''graph g(%x: f32[b,3]) -> (%s) {
    ...   %s: i64[2] = Shape(%x)
    ...   return %s
    ... }''')
    >>> sv = ShapeValues()
    >>> n = g.nodes[0]
    >>> sv.record(n.metaop, n.inputs, n.attrs, n.outputs)
    >>> sv.known(g.outputs[0])
    array([Expr(b), 3], dtype=object)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from metadef.ir.graph import Value
from metadef.ops import MetaOp
from metadef.ops.defs.shape_values import SHAPE_VALUE_RULES, ShapeValue, constant_value, value_array
from metadef.ops.interface import resolve_attrs


class ShapeValues:
    """Symbolic values by value identity (see the module doc)."""

    def __init__(self) -> None:
        self._values: dict[int, ShapeValue] = {}

    def known(self, v: Value | None) -> np.ndarray | None:
        """What inference may read of ``v``'s value: its constant, or its symbolic value as an
        int64 array (all dims static) or an object array of dims; None when unknown."""
        if v is None:
            return None
        if v.const is not None:
            return v.const
        sv = self._values.get(id(v))
        if sv is None:
            return None
        return value_array(sv, v.type.shape if v.type is not None else None)

    def record(self, meta: MetaOp, inputs: Sequence[Value | None], attrs: dict[str, Any],
               outs: Sequence[Value]) -> None:
        """Compute and remember the symbolic value of a node's shape-like output."""
        rule = SHAPE_VALUE_RULES.get(meta.name) if meta.domain in ("", "ai.onnx") else None
        if rule is None or len(outs) != 1 or outs[0].type is None or not outs[0].type.is_static:
            return
        known = [None if v is None else (constant_value(v.const) if v.const is not None
                                         else self._values.get(id(v))) for v in inputs]
        resolved = resolve_attrs(meta.name, f"(node {meta.name})", meta.attrs, attrs)
        value = rule(known, [None if v is None else v.type for v in inputs], resolved)
        if value is not None:
            self._values[id(outs[0])] = value


__all__ = ["ShapeValues"]
