"""TopK along the last axis of a float32 tensor as ``md_topk_rows``.

The reference sorts (or partitions) each row in numpy, from Python: 64 rows of 1000, k = 5 ran
at 6-7x ONNX Runtime's time even after partitioning. :func:`topk_node` takes a TopK with a
constant K (1 to :data:`~metadef.codegen.native_topk.MAX_K`) along the last axis and runs it as
one ``md_topk_rows`` call in programs and step by step: the reference's order exactly (ties
by the lower position, NaN the largest). Any other TopK runs its reference kernel.

Example:
    >>> from metadef.ir import parse_graph
    >>> g = parse_graph('''graph g(%x: f32[n,100]) -> (%v, %i) {
    ...   %k: i64[1] = const [5]
    ...   %v: f32[n,5], %i: i64[n,5] = TopK(%x, %k) @top
    ...   return %v, %i }''')
    >>> topk_node(g.nodes[0]).reason
    'TopK along rows: md_topk_rows (our kernel)'
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from metadef.backends.x86.choice import Choice, attrs_of
from metadef.backends.x86.native import PARALLEL_ELEMENTS, Arg, Call, NativeStep, Shape, needing, timed_call
from metadef.codegen.native import native_function
from metadef.codegen.native_topk import MAX_K, topk_dims
from metadef.ir import Node
from metadef.shape import TensorType


def topk_node(node: Node) -> Choice | str:
    """A float32 TopK along the last axis with a constant K as ``md_topk_rows``, or why not."""
    x, k_value = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else None
    if x is None or x.type is None or x.type.shape is None or not x.type.shape or x.type.dtype.numpy != np.float32:
        return "only float32 TopK of a known rank runs as md_topk_rows"
    if k_value is None or k_value.const is None:
        return "its K is computed at run time"
    k = int(np.asarray(k_value.const).reshape(-1)[0])
    attrs = attrs_of(node)
    rank = len(x.type.shape)
    if int(attrs["axis"]) % rank != rank - 1 or not 1 <= k <= MAX_K:
        return f"only K in [1, {MAX_K}] along the last axis runs as md_topk_rows"
    largest = bool(attrs["largest"])

    def rows_of(shape: Sequence[int]) -> tuple[int, int]:
        return math.prod(shape[:-1]), shape[-1]

    def run(args: Sequence[np.ndarray | None], out_types: Sequence[TensorType]) -> list[np.ndarray]:
        data = np.ascontiguousarray(args[0], np.float32)
        rows, n = rows_of(data.shape)
        values = np.empty((*data.shape[:-1], k), np.float32)
        index = np.empty((*data.shape[:-1], k), np.int64)
        if values.size:
            timed_call(native_function("md_topk_rows"), [data.ctypes.data, values.ctypes.data, index.ctypes.data],
                       topk_dims(rows, n, k, largest=largest))()
        return [values, index]

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape], symbols: Mapping[str, int]
              ) -> NativeStep | str:
        shape = inputs[0]
        if shape is None or len(outputs) != 2:
            return "an input or an output is absent"
        rows, n = rows_of(shape)
        if k > n:
            return f"K = {k} is larger than the axis ({n})"
        if rows == 0:
            return NativeStep(())

        def tasks(count: int) -> list[tuple[int, ...]] | None:
            if count < 2 or rows < count or rows * n < PARALLEL_ELEMENTS:
                return None
            return [topk_dims(rows, n, k, largest=largest, task=t, tasks=count) for t in range(count)]

        return NativeStep((Call(native_function("md_topk_rows"), (Arg("in", 0), Arg("out", 0), Arg("out", 1)),
                                topk_dims(rows, n, k, largest=largest), "topk rows", tasks),))

    return Choice(run, "native", "TopK along rows: md_topk_rows (our kernel)", native=needing(lower, "md_topk_rows"))


__all__ = ["topk_node"]
