"""Softmax and LogSoftmax nodes over contiguous rows as ``md_softmax_rows`` calls.

The generated kernel of a Softmax (from its three-statement semantics: a maximum, a sum of
shifted exponentials, the quotient) computes ``exp`` twice an element and runs at ~1 ns an
element on one Zen 4 core; ONNX Runtime takes ~0.3. When the reduced elements are contiguous
rows (the last axis, or before opset 13 every axis from ``axis`` on) of a float32 tensor,
:func:`softmax_lowering` runs the node as the routine attention uses: per row, its maximum, then
``exp(x - max)`` stored and summed, then one scaling pass (for LogSoftmax ``x - max - log(sum)``).
Any other node or shape keeps the generated kernel.

Example:
    >>> from metadef.ir import parse_graph
    >>> g = parse_graph("graph g(%x: f32[n,10]) -> (%y) { %y: f32[n,10] = Softmax(%x) {axis=-1} @s return %y }")
    >>> step = softmax_lowering(g.nodes[0], lambda *a: "generated")([(8, 10)], [(8, 10)], {"n": 8})
    >>> step.calls[0].what, step.calls[0].dims[:4]
    ('softmax rows', (1, 1, 8, 10))
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from metadef.backends.x86.attention import softmax_rows_call
from metadef.backends.x86.choice import attrs_of
from metadef.backends.x86.native import NULL, Arg, Lowering, NativeStep, Shape, needing, needs
from metadef.ir import Node

ROW_OPS = {"Softmax": False, "LogSoftmax": True}
"""The ops ``md_softmax_rows`` runs, and whether as ``log(softmax)``."""


def softmax_lowering(node: Node, otherwise: Lowering) -> Lowering:
    """``node`` (a float32 Softmax or LogSoftmax) as one ``md_softmax_rows`` call over the rows
    of its input where the reduced elements are contiguous rows; ``otherwise`` (the generated
    kernel) for any other node or shape."""
    out = node.outputs[0].type if node.outputs and node.outputs[0] is not None else None
    if node.qualop not in ROW_OPS or out is None or out.dtype.numpy != np.float32:
        return otherwise
    attrs = attrs_of(node)
    log = ROW_OPS[node.qualop]

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape], symbols: Mapping[str, int]
              ) -> NativeStep | str:
        shape = inputs[0]
        if shape is None or not shape:
            return otherwise(inputs, outputs, symbols)
        axis = int(attrs["axis"]) % len(shape)
        if not attrs.get("_coerce_2d") and axis != len(shape) - 1:
            return otherwise(inputs, outputs, symbols)
        rows, n = math.prod(shape[:axis]), math.prod(shape[axis:])
        if rows == 0 or n == 0:
            return otherwise(inputs, outputs, symbols)
        what = "log softmax rows" if log else "softmax rows"
        return NativeStep((softmax_rows_call(1, 1, rows, n, None, Arg("in", 0), NULL, Arg("out", 0), what, log),))

    return needing(lower, *needs(otherwise), "md_softmax_rows")


__all__ = ["ROW_OPS", "softmax_lowering"]
