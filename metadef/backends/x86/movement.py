"""Concat and Split on x86: row copies inside the native program.

Both ops move whole blocks of bytes: with ``rows`` the product of the dims before ``axis``,
each part (an input of Concat, an output of Split) is one contiguous block of every row of
the whole tensor. One ``md_copy_rows`` call per part moves its blocks (a single ``memcpy``
when there is one row, as for a batch-1 NCHW concat along the channels), so neither op
leaves the native program for a Python step. Run node by node (shapes that depend on
values), they take their reference kernels.

Example:
    >>> from metadef.ir import parse_graph
    >>> g = parse_graph('''graph g(%a: f32[n,2], %b: f32[n,3]) -> (%y) {
    ...   %y: f32[n,5] = Concat(%a, %b) {axis=1} @cat
    ...   return %y }''')
    >>> step = concat_node(g.nodes[0]).native([(4, 2), (4, 3)], [(4, 5)], {"n": 4})
    >>> [(c.args[1].offset, c.dims) for c in step.calls]
    [(0, (4, 8, 8, 20)), (8, (4, 12, 12, 20))]
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from metadef.backends.x86.choice import Choice, StepKernel
from metadef.backends.x86.native import Arg, Call, NativeStep, needing
from metadef.codegen.native import native_function
from metadef.ir import Node
from metadef.ops.interface import resolve_attrs
from metadef.ops.numpy_eval import run_node
from metadef.shape import TensorType

Shape = tuple[int, ...]


def _copies(whole: Shape, parts: Sequence[Shape], axis: int, itemsize: int, concat: bool) -> NativeStep:
    """One ``md_copy_rows`` per part with bytes: Concat copies input ``k`` into its block of
    each output row, Split the block of each input row into output ``k``."""
    address = native_function("md_copy_rows")
    rows = math.prod(whole[:axis])
    whole_row = math.prod(whole[axis:]) * itemsize
    calls, offset = [], 0
    for k, part in enumerate(parts):
        part_row = math.prod(part[axis:]) * itemsize
        if rows and part_row:
            if concat:
                args, strides = (Arg("in", k), Arg("out", 0, offset)), (part_row, whole_row)
            else:
                args, strides = (Arg("in", 0, offset), Arg("out", k)), (whole_row, part_row)
            calls.append(Call(address, args, (rows, part_row, *strides), "concat" if concat else "split"))
        offset += part_row
    return NativeStep(tuple(calls))


def _prepare(node: Node) -> tuple[int, int] | str:
    """(axis, itemsize) of a Concat or Split whose element size is known, or why not."""
    types = [v.type for v in (*node.inputs, *node.outputs) if v is not None]
    if any(t is None or t.shape is None for t in types):
        return "a value's rank is unknown"
    dtype = types[-1].dtype.numpy
    if dtype.kind not in "biufc" or dtype.itemsize == 0:
        return f"{dtype} is not a fixed-size number"
    rank = len(types[-1].shape)
    op = node.metaop
    axis = int(resolve_attrs(op.name, f"(node {node.name})", op.attrs, node.attrs)["axis"])
    if not -rank <= axis < rank:
        return f"axis {axis} is outside rank {rank}"
    return axis % rank, dtype.itemsize


def _reference(node: Node) -> StepKernel:
    """The node's reference kernel, for the node-by-node path (shapes that depend on values)."""
    op = node.metaop
    attrs = resolve_attrs(op.name, f"(node {node.name})", op.attrs, node.attrs)

    def run(args: Sequence[np.ndarray | None], out_types: Sequence[TensorType]) -> list[np.ndarray]:
        return run_node(op, attrs, args, out_types, node.name)

    return run


def concat_node(node: Node) -> Choice | str:
    """Concat as one ``md_copy_rows`` per input, each into its block of the output's rows."""
    got = _prepare(node)
    if isinstance(got, str):
        return got
    axis, itemsize = got

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape], symbols: Mapping[str, int]
              ) -> NativeStep | str:
        parts = [s for s in inputs if s is not None]
        if len(parts) != len(inputs):
            return "an input is absent"
        return _copies(outputs[0], parts, axis, itemsize, concat=True)

    return Choice(_reference(node), "native", "Concat: one row copy per input (md_copy_rows)",
                  native=needing(lower, "md_copy_rows"))


def split_node(node: Node) -> Choice | str:
    """Split as one ``md_copy_rows`` per output, each from its block of the input's rows."""
    got = _prepare(node)
    if isinstance(got, str):
        return got
    axis, itemsize = got

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape], symbols: Mapping[str, int]
              ) -> NativeStep | str:
        if inputs[0] is None:
            return "the input is absent"
        return _copies(inputs[0], outputs, axis, itemsize, concat=False)

    return Choice(_reference(node), "native", "Split: one row copy per output (md_copy_rows)",
                  native=needing(lower, "md_copy_rows"))


__all__ = ["concat_node", "split_node"]
