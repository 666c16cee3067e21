"""Softmax and LogSoftmax nodes over contiguous rows as ``md_softmax_rows`` (or
``md_log_softmax_rows``) calls.

The generated kernel of a Softmax (from its three-statement semantics: a maximum, a sum of
shifted exponentials, the quotient) computes ``exp`` twice an element and ran at ~1 ns an
element on one Zen 4 core; ONNX Runtime takes ~0.3. When the reduced elements are contiguous
rows (the last axis, or before opset 13 every axis from ``axis`` on) of a float32 tensor, which
the node's attributes and rank decide, :func:`softmax_node` runs it as the routine attention
uses: per row, its maximum, then ``exp(x - max)`` stored and summed, then one scaling pass (for
LogSoftmax ``x - max - log(sum)``), in native programs and step by step alike, with no
generated kernel compiled for it. Any other Softmax keeps the generated kernel.

Example:
    >>> from metadef.ir import parse_graph
    >>> g = parse_graph("graph g(%x: f32[n,10]) -> (%y) { %y: f32[n,10] = Softmax(%x) {axis=-1} @s return %y }")
    >>> choice = softmax_node(g.nodes[0])
    >>> choice.reason
    'softmax over rows: md_softmax_rows (our kernel)'
    >>> step = choice.native([(8, 10)], [(8, 10)], {"n": 8})
    >>> step.calls[0].what, step.calls[0].dims[:4]
    ('softmax rows', (1, 1, 8, 10))
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from metadef.backends.x86.attention import softmax_rows_call
from metadef.backends.x86.choice import Choice, attrs_of
from metadef.backends.x86.native import NULL, Arg, NativeStep, Shape, needing, timed_call
from metadef.codegen.native import native_function
from metadef.codegen.native_softmax import softmax_dims
from metadef.ir import Node
from metadef.shape import TensorType

ROW_OPS = {"Softmax": False, "LogSoftmax": True}
"""The ops the softmax routines run, and whether as ``log(softmax)``."""


def _rows(shape: Sequence[int], axis: int, coerce: bool) -> tuple[int, int]:
    """``(rows, row length)`` of a softmax over ``axis`` of ``shape``."""
    axis %= len(shape)
    return math.prod(shape[:axis]), math.prod(shape[axis:]) if coerce else shape[axis]


def softmax_node(node: Node) -> Choice | str:
    """A float32 Softmax or LogSoftmax over contiguous rows as ``md_softmax_rows`` (or
    ``md_log_softmax_rows``), or why not (a ``str``: the generated kernel takes it)."""
    x, y = node.inputs[0], node.outputs[0]
    if node.qualop not in ROW_OPS or x is None or x.type is None or x.type.shape is None or y is None \
            or y.type is None or y.type.dtype.numpy != np.float32 or x.type.dtype.numpy != np.float32:
        return "not a float32 softmax of known rank"
    attrs = attrs_of(node)
    rank, coerce = len(x.type.shape), bool(attrs.get("_coerce_2d"))
    if rank == 0 or (not coerce and int(attrs["axis"]) % rank != rank - 1):
        return "not over contiguous rows (the last axis)"
    log = ROW_OPS[node.qualop]
    routine = "md_log_softmax_rows" if log else "md_softmax_rows"
    what = "log softmax rows" if log else "softmax rows"

    def run(args: Sequence[np.ndarray | None], out_types: Sequence[TensorType]) -> list[np.ndarray]:
        data = np.ascontiguousarray(args[0], np.float32)
        out = np.empty(data.shape, np.float32)
        if out.size:
            rows, n = _rows(data.shape, int(attrs["axis"]), coerce)
            timed_call(native_function(routine), [data.ctypes.data, 0, out.ctypes.data],
                       softmax_dims(1, 1, rows, n))()
        return [out]

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape], symbols: Mapping[str, int]
              ) -> NativeStep | str:
        shape = inputs[0]
        if shape is None:
            return "the input is absent"
        rows, n = _rows(shape, int(attrs["axis"]), coerce)
        if rows * n == 0:
            return NativeStep(())
        return NativeStep((softmax_rows_call(1, 1, rows, n, None, Arg("in", 0), NULL, Arg("out", 0), what, log),))

    return Choice(run, "native", f"{'log ' if log else ''}softmax over rows: {routine} (our kernel)",
                  native=needing(lower, routine))


__all__ = ["ROW_OPS", "softmax_node"]
