"""GatherElements, GatherND, ScatterND and ScatterElements (and its opset-9 name Scatter) on
x86 inside the native program, as the routines of :mod:`metadef.codegen.native_scatter`.

Run from Python, their numpy references took 1.7-3x ONNX Runtime's time on small tensors (a
ScatterND adding rows 6-7x; one thread) and cut a model's native program in pieces. Here each
is one call (a scatter: a copy of its data into the output first, ``md_copy``), 0.75-1.1x ONNX
Runtime's time on the same tensors, every index checked: one out of range raises InputError
after the run, naming the node, the index and the valid range. A scatter's repeated index
keeps the last update, as the reference's numpy assignment does. Reductions (``add``,
``mul``, ``max``, ``min``) run natively on float32, float64, int32 and int64; elsewhere, and
where a binding's shapes do not fit (GatherElements' indices larger than the data on another
axis, which the reference broadcasts), the node runs its reference kernel with the reason.
GatherElements' indices may be smaller than the data on the other axes (ONNX allows it; the
reference's ``take_along_axis`` refuses): natively the result is ONNX Runtime's.

Example:
    >>> from metadef.ir import parse_graph
    >>> g = parse_graph('''graph g(%x: f32[n,100], %i: i64[n,5]) -> (%y) {
    ...   %y: f32[n,5] = GatherElements(%x, %i) {axis=1} @pick
    ...   return %y }''')
    >>> choice = gather_elements_node(g.nodes[0])
    >>> choice.reason
    'GatherElements: md_gather_elements, each index checked'
    >>> step = choice.native([(4, 100), (4, 5)], [(4, 5)], {"n": 4})
    >>> [c.what for c in step.calls], step.calls[0].dims[:5]
    (['gather elements'], (100, 4, 8, 4, 3))
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from metadef.backends.x86.choice import Choice, attrs_of
from metadef.backends.x86.movement import element_dtype, index_out_of_range, native_choice
from metadef.backends.x86.native import Arg, Call, NativeStep, Shape
from metadef.codegen.native import native_function
from metadef.codegen.native_scatter import (
    MAX_LEVELS,
    REDUCED_TYPES,
    element_mode,
    elements_dims,
    nd_dims,
    scatter_routine,
)
from metadef.ir import Node

_REDUCED = "/".join(t.name for t in REDUCED_TYPES)


def _moved(node: Node) -> tuple[np.dtype, dict[str, Any], str, int] | str:
    """``(dtype, attrs, reduction, mode)`` of a node whose elements the routines move (or
    combine, by its reduction), or why not."""
    dtype = element_dtype(node)
    if isinstance(dtype, str):
        return dtype
    attrs = attrs_of(node)
    reduction = str(attrs.get("reduction", "none"))
    mode = element_mode(dtype, reduction)
    if mode is None:
        return f"reduction {reduction!r} on {dtype} (natively: 'none' on any number; the others on {_REDUCED})"
    return dtype, attrs, reduction, mode


def _elements_node(node: Node, scatter: bool) -> Choice | str:
    found = _moved(node)
    if isinstance(found, str):
        return found
    dtype, attrs, reduction, mode = found
    rank = len(node.inputs[0].type.shape)
    axis = int(attrs["axis"])
    if not -rank <= axis < rank:
        return f"axis {axis} is outside rank {rank}"
    axis %= rank
    index_bytes = node.inputs[1].type.dtype.numpy.itemsize
    routine = scatter_routine(False, reduction) if scatter else "md_gather_elements"

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape], symbols: Mapping[str, int]
              ) -> NativeStep | str:
        data, indices = inputs[0], inputs[1]
        if data is None or indices is None or (scatter and inputs[2] is None):
            return "an input is absent"
        if scatter and tuple(inputs[2]) != tuple(indices):
            return f"updates {list(inputs[2])} differ from indices {list(indices)} in shape"
        larger = [d for d in range(rank) if d != axis and indices[d] > data[d]]
        if larger:
            return f"indices {list(indices)} exceed data {list(data)} on axis {larger[0]} (the reference broadcasts)"
        dims = elements_dims(data, indices, axis, dtype.itemsize, index_bytes, mode)
        if dims is None:
            return f"its indices are more than {MAX_LEVELS} loops"
        status = np.zeros(2, np.int64)
        calls = _data_copy(data, dtype.itemsize) if scatter else []
        if math.prod(indices):
            near = Arg("in", 2) if scatter else Arg("in", 0)
            args = (near, Arg("in", 1), Arg("out", 0), Arg("addr", status.ctypes.data))
            calls.append(Call(native_function(routine), args, dims, routine[3:].replace("_", " ")))
        return NativeStep(tuple(calls), keep=(status,),
                          checks=((status, lambda index: index_out_of_range(node, axis, data[axis], index)),))

    what = f"{node.op}: {routine}" + (f" (reduction {reduction})" if reduction != "none" else "")
    return native_choice(node, f"{what}, each index checked", lower, routine, *(("md_copy",) if scatter else ()))


def _data_copy(data: Shape, itemsize: int) -> list[Call]:
    """A scatter's first call: its data copied into the output (none when empty)."""
    size = math.prod(data) * itemsize
    return [Call(native_function("md_copy"), (Arg("in", 0), Arg("out", 0)), (size,), "scatter copy")] if size else []


def gather_elements_node(node: Node) -> Choice | str:
    """GatherElements as ``md_gather_elements``: each output element the data element its
    index picks along the axis, each index checked."""
    return _elements_node(node, scatter=False)


def scatter_elements_node(node: Node) -> Choice | str:
    """ScatterElements (and Scatter) as a copy of the data, then ``md_scatter_elements``:
    each update written (or combined, by the reduction) where its index says."""
    return _elements_node(node, scatter=True)


def _nd_node(node: Node, scatter: bool) -> Choice | str:
    found = _moved(node)
    if isinstance(found, str):
        return found
    dtype, attrs, reduction, _ = found
    if node.inputs[1].type.dtype.numpy.itemsize != 8:
        return "its indices are not int64"
    b = int(attrs.get("batch_dims", 0))
    routine = scatter_routine(True, reduction) if scatter else "md_gather_nd"

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape], symbols: Mapping[str, int]
              ) -> NativeStep | str:
        data, indices = inputs[0], inputs[1]
        if data is None or indices is None or (scatter and inputs[2] is None) or not indices:
            return "an input is absent or its indices are a scalar"
        k = indices[-1]
        if b + k > len(data) or tuple(indices[:b]) != tuple(data[:b]):
            return f"indices {list(indices)} do not index data {list(data)} with batch_dims {b}"
        want = (*indices[:-1], *data[k:])
        if scatter and tuple(inputs[2]) != want:
            return f"updates {list(inputs[2])} are not the {list(want)} that indices and data ask for"
        strides = [math.prod(data[d + 1:]) * dtype.itemsize for d in range(len(data))]
        unit, queries = math.prod(data[b + k:]), math.prod(indices[b:-1])
        dims = nd_dims(math.prod(data[:b]), queries, unit, dtype.itemsize, element_mode(dtype, reduction, unit),
                       math.prod(data[b:]) * dtype.itemsize, [(data[b + j], strides[b + j]) for j in range(k)])
        words = np.zeros(3, np.int64)  # [flag, index, axis]: the program clears words[:2] only
        calls = _data_copy(data, dtype.itemsize) if scatter else []
        if dims[0] * queries and unit:
            near = Arg("in", 2) if scatter else Arg("in", 0)
            args = (near, Arg("in", 1), Arg("out", 0), Arg("addr", words.ctypes.data))
            calls.append(Call(native_function(routine), args, dims, routine[3:].replace("_", " ")))

        def why(index: int) -> str:  # (the routine wrote the axis, counted from the first indexed one)
            return index_out_of_range(node, b + int(words[2]), data[b + int(words[2])], index)

        return NativeStep(tuple(calls), keep=(words,), checks=((words[:2], why),))

    what = f"{node.op}: {routine}" + (f" (reduction {reduction})" if reduction != "none" else "")
    return native_choice(node, f"{what}, each index checked", lower, routine, *(("md_copy",) if scatter else ()))


def gather_nd_node(node: Node) -> Choice | str:
    """GatherND (any ``batch_dims``) as ``md_gather_nd``: the slice each index tuple picks,
    every index checked."""
    return _nd_node(node, scatter=False)


def scatter_nd_node(node: Node) -> Choice | str:
    """ScatterND as a copy of the data, then ``md_scatter_nd``: each update slice written (or
    combined, by the reduction) where its index tuple says."""
    return _nd_node(node, scatter=True)


__all__ = ["gather_elements_node", "gather_nd_node", "scatter_elements_node", "scatter_nd_node"]
