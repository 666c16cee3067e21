"""Data movement on x86 inside the native program: Concat, Split, Slice, Pad, Gather, nearest
Resize and Upsample, Shape, Size; views (Reshape and the like, Dropout at inference) that move
nothing.

Concat and Split move whole blocks of bytes: with ``rows`` the product of the dims before
``axis``, each part (an input of Concat, an output of Split) is one contiguous block of every
row of the whole tensor; one ``md_copy_rows`` call per part moves its blocks (a single
``memcpy`` when there is one row, as for a batch-1 NCHW concat along the channels). A Slice
whose starts, axes and steps are constants is a box of rows too (its ends only set the
output's shape, which the binding knows); a constant-mode Pad with constant pads fills its
output (``md_fill``) and copies its input into the box, a Slice the other way round. Gather
copies the rows its indices pick (``md_gather``, every index checked: one out of range raises
InputError after the run, naming the node). Shape and Size copy their values, known once the
binding's shapes are. So none of these leaves the native program for a Python step; run node
by node (shapes that depend on values), they take their reference kernels.

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
from typing import Any

import numpy as np

from metadef.backends.x86.choice import Choice, attrs_of, reference
from metadef.backends.x86.native import ALIAS, PARALLEL_ELEMENTS, Arg, Call, Lowering, NativeStep, needing
from metadef.codegen.native import GATHER_PLANES_DIMS, MAP_ROWS_DIMS, native_function
from metadef.ir import Node
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


def element_dtype(node: Node) -> np.dtype | str:
    """The dtype of a node's first input when native copies move it (fixed-size numbers, every
    value of a known rank), or why not.

    Example:
        >>> from metadef.ir import parse_graph
        >>> g = parse_graph('''graph g(%x: f32[n,4], %i: i64[2]) -> (%y) {
        ...   %y: f32[n,2] = Gather(%x, %i) {axis=1} @pick
        ...   return %y }''')
        >>> element_dtype(g.nodes[0]), index_out_of_range(g.nodes[0], 1, 4, 9)[:47]
        (dtype('float32'), 'Gather pick: index 9 is out of range for axis 1')
    """
    types = [v.type for v in (*node.inputs, *node.outputs) if v is not None]
    if any(t is None or t.shape is None for t in types):
        return "a value's rank is unknown"
    dtype = types[0].dtype.numpy
    if dtype.kind not in "biufc" or dtype.itemsize == 0:
        return f"{dtype} is not a fixed-size number"
    return dtype


def index_out_of_range(node: Node, axis: int, size: int, index: int) -> str:
    """The error of an index out of range for ``axis`` (``size`` entries) of the node's data
    (an example: :func:`element_dtype`'s)."""
    return (f"{node.op} {node.name}: index {index} is out of range for axis {axis} of %{node.inputs[0].name}, "
            f"which has {size} entries (valid: {-size} to {size - 1}); check the values fed to the graph")


def _prepare(node: Node, axis: int | None = None) -> tuple[int, int] | str:
    """(axis, itemsize) of a node moving numbers of a known size along its first input's
    ``axis`` attribute (or ``axis``), or why not."""
    dtype = element_dtype(node)
    if isinstance(dtype, str):
        return dtype
    rank = len(next(v for v in (*node.inputs, *node.outputs) if v is not None).type.shape)
    axis = int(attrs_of(node)["axis"]) if axis is None else axis
    if not -rank <= axis < rank:
        return f"axis {axis} is outside rank {rank}"
    return axis % rank, dtype.itemsize


def native_choice(node: Node, reason: str, lower: Lowering, *routines: str) -> Choice:
    """The Choice of a step that runs ``lower``'s native calls (its reference kernel when the
    graph runs node by node), as :func:`gather_node` makes it."""
    return Choice(reference(node, "").kernel, "native", reason, native=needing(lower, *routines))


def _part_copies(node: Node, concat: bool) -> Choice | str:
    """Concat (``concat``) or Split as one ``md_copy_rows`` per part: each input into its block
    of the output's rows, or each output from its block of the input's rows."""
    got = _prepare(node)
    if isinstance(got, str):
        return got
    axis, itemsize = got

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape], symbols: Mapping[str, int]
              ) -> NativeStep | str:
        if concat:
            parts = [s for s in inputs if s is not None]
            if len(parts) != len(inputs):
                return "an input is absent"
            return _copies(outputs[0], parts, axis, itemsize, concat)
        if inputs[0] is None:
            return "the input is absent"
        return _copies(inputs[0], outputs, axis, itemsize, concat)

    what = "Concat: one row copy per input" if concat else "Split: one row copy per output"
    return native_choice(node, f"{what} (md_copy_rows)", lower, "md_copy_rows")


def concat_node(node: Node) -> Choice | str:
    """Concat as one ``md_copy_rows`` per input, each into its block of the output's rows."""
    return _part_copies(node, concat=True)


def split_node(node: Node) -> Choice | str:
    """Split as one ``md_copy_rows`` per output, each from its block of the input's rows."""
    return _part_copies(node, concat=False)


MAX_SLICE_CALLS = 256
"""A Slice needing more row copies than this (several outer axes sliced) runs from Python."""


def _slice_rows(in_shape: Shape, out_shape: Shape, starts: list[int], steps: list[int], itemsize: int,
                ) -> list[tuple[int, int, tuple[int, int, int, int]]] | str:
    """The row copies of a slice, each (source byte offset, destination byte offset, dims of
    ``md_copy_rows``), or why it is no set of row copies. ``starts``/``steps``: per axis,
    already clamped as ONNX says."""
    rank = len(in_shape)
    strides = [math.prod(in_shape[k + 1:]) * itemsize for k in range(rank)]
    out_strides = [math.prod(out_shape[k + 1:]) * itemsize for k in range(rank)]
    base = sum(start * stride for start, stride in zip(starts, strides))
    p = rank - 1  # the innermost axis that is not whole: it and the whole ones inside are one block
    while p >= 0 and starts[p] == 0 and steps[p] == 1 and out_shape[p] == in_shape[p]:
        p -= 1
    if p == rank - 1 and steps[p] != 1:
        return f"a step of {steps[p]} on the last axis needs an element gather"
    if math.prod(out_shape) == 0:
        return []
    if p >= 0 and steps[p] != 1:  # each picked entry of axis p is a block of the whole axes inside it
        block, outer = strides[p], p + 1
    else:
        block, outer = (out_shape[p] * strides[p], p) if p >= 0 else (math.prod(in_shape) * itemsize, 0)
    # outer levels (count, source stride, destination stride), merged where they are one level
    levels: list[list[int]] = []
    for k in range(outer):
        if out_shape[k] == 1:
            continue
        level = [out_shape[k], steps[k] * strides[k], out_strides[k]]
        if levels and levels[-1][1] == level[1] * level[0] and levels[-1][2] == level[2] * level[0]:
            levels[-1] = [levels[-1][0] * level[0], level[1], level[2]]
        else:
            levels.append(level)
    rows, src_stride, dst_stride = levels.pop() if levels else (1, block, block)
    if math.prod(level[0] for level in levels) > MAX_SLICE_CALLS:
        return f"it is more than {MAX_SLICE_CALLS} row copies"
    copies = [(base, 0)]
    for count, src_step, dst_step in levels:
        copies = [(s + i * src_step, d + i * dst_step) for s, d in copies for i in range(count)]
    return [(s, d, (rows, block, src_stride, dst_stride)) for s, d in copies]


def slice_node(node: Node) -> Choice | str:
    """A Slice with constant starts, axes and steps as row copies (``md_copy_rows``)."""
    got = _prepare(node, axis=0)
    if isinstance(got, str):
        return got
    _, itemsize = got
    params = [None if k >= len(node.inputs) or node.inputs[k] is None else node.inputs[k] for k in (1, 3, 4)]
    if any(v is not None and v.const is None for v in params):
        return "its starts, axes or steps are computed at run time"
    starts, axes, steps = (None if v is None else [int(x) for x in np.asarray(v.const).reshape(-1)] for v in params)
    assert starts is not None
    rank = len(node.inputs[0].type.shape)
    axes = list(range(len(starts))) if axes is None else [a % rank for a in axes]
    steps = [1] * len(starts) if steps is None else steps
    if 0 in steps or len({len(starts), len(axes), len(steps)}) != 1:
        return "its starts, axes and steps do not match"

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape], symbols: Mapping[str, int]
              ) -> NativeStep | str:
        shape = inputs[0]
        if shape is None:
            return "the input is absent"
        first, step = [0] * rank, [1] * rank
        for a, b, st in zip(axes, starts, steps):
            n = shape[a]
            b = b + n if b < 0 else b
            first[a], step[a] = min(max(b, 0), n if st > 0 else n - 1), st
        copies = _slice_rows(tuple(shape), tuple(outputs[0]), first, step, itemsize)
        if isinstance(copies, str):
            return copies
        address = native_function("md_copy_rows")
        return NativeStep(tuple(Call(address, (Arg("in", 0, s), Arg("out", 0, d)), dims, "slice")
                                for s, d, dims in copies))

    return native_choice(node, "Slice: row copies (md_copy_rows)", lower, "md_copy_rows")


_ZEROS = np.zeros(16, np.uint8)  # the fill value of a Pad without constant_value (any dtype's 0)


def pad_node(node: Node) -> Choice | str:
    """A constant-mode Pad with constant, non-negative pads: ``md_fill`` with the constant, then
    the input copied into its box of the output (``md_copy_rows``)."""
    got = _prepare(node, axis=0)
    if isinstance(got, str):
        return got
    _, itemsize = got
    attrs = attrs_of(node)
    if attrs["mode"] != "constant":
        return f"mode {attrs['mode']!r} (only 'constant' runs natively)"
    pads, axes = (None if k >= len(node.inputs) or node.inputs[k] is None else node.inputs[k] for k in (1, 3))
    if pads is None or pads.const is None or (axes is not None and axes.const is None):
        return "its pads or axes are computed at run time"
    rank = len(node.inputs[0].type.shape)
    amounts = [int(x) for x in np.asarray(pads.const).reshape(-1)]
    listed = list(range(rank)) if axes is None else [int(a) % rank for a in np.asarray(axes.const).reshape(-1)]
    if len(amounts) != 2 * len(listed) or min(amounts, default=0) < 0:
        return "its pads are negative (a crop) or do not match its axes"
    begin = [0] * rank
    for a, amount in zip(listed, amounts):
        begin[a] = amount
    has_value = len(node.inputs) > 2 and node.inputs[2] is not None

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape], symbols: Mapping[str, int]
              ) -> NativeStep | str:
        shape, out = inputs[0], tuple(outputs[0])
        if shape is None:
            return "the input is absent"
        value = Arg("in", 2) if has_value else Arg("addr", _ZEROS.ctypes.data)
        if has_value and math.prod(inputs[2] or ()) != 1:
            return "its constant_value is not one element"
        copies = _slice_rows(out, tuple(shape), begin, [1] * rank, itemsize)  # the box, as a slice of the output
        if isinstance(copies, str):
            return copies
        total = math.prod(out) * itemsize
        calls = [Call(native_function("md_fill"), (value, Arg("out", 0)), (total, itemsize), "pad fill")] \
            if total > math.prod(shape) * itemsize else []
        move = native_function("md_copy_rows")
        calls += [Call(move, (Arg("in", 0, small), Arg("out", 0, big)), (rows, block, small_stride, big_stride), "pad")
                  for big, small, (rows, block, big_stride, small_stride) in copies]
        return NativeStep(tuple(calls))

    return native_choice(node, "Pad: a fill, then the input copied into its box", lower, "md_fill", "md_copy_rows")


def gather_node(node: Node) -> Choice | str:
    """Gather as ``md_gather``: the rows the indices pick, each index checked."""
    got = _prepare(node)
    if isinstance(got, str):
        return got
    axis, itemsize = got
    index_type = node.inputs[1].type
    index_bytes = index_type.dtype.numpy.itemsize if index_type is not None else 0
    if index_bytes not in (4, 8):
        return "its indices are not int32 or int64"

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape], symbols: Mapping[str, int]
              ) -> NativeStep | str:
        shape, indices = inputs
        if shape is None or indices is None:
            return "an input is absent"
        outer, rows, count = math.prod(shape[:axis]), shape[axis], math.prod(indices)
        if outer == 0 or count == 0:
            return NativeStep(())
        status = np.zeros(2, np.int64)

        def why(index: int) -> str:
            return index_out_of_range(node, axis, rows, index)

        args = (Arg("in", 0), Arg("in", 1), Arg("out", 0), Arg("addr", status.ctypes.data))
        call = Call(native_function("md_gather"), args,
                    (outer, rows, count, math.prod(shape[axis + 1:]) * itemsize, index_bytes), "gather")
        return NativeStep((call,), keep=(status,), checks=((status, why),))

    return native_choice(node, "Gather: the picked rows copied, each index checked (md_gather)", lower, "md_gather")


def nearest_resize_node(node: Node) -> Choice | str:
    """A nearest-neighbour Resize (or Upsample) of float32 planes with constant parameters as
    ``md_gather_planes``: which input pixel each output pixel copies is found once per binding,
    by running the op's own reference on a plane of pixel numbers, so every coordinate mode
    and rounding rule is the reference's."""
    attrs = attrs_of(node)
    x = node.inputs[0].type
    if x is None or x.shape is None or len(x.shape) < 2 or x.dtype.numpy.itemsize != 4 \
            or x.dtype.numpy.kind not in "fiu":
        return "only 32-bit elements of a known rank are resized natively"
    if attrs.get("mode") != "nearest" or attrs.get("antialias") or \
            attrs.get("coordinate_transformation_mode") == "tf_crop_and_resize":
        return "only nearest resizing (no crop, no antialias) runs natively"
    params = [None if v is None else v.const for v in node.inputs[1:]]
    if any(v is not None and c is None for v, c in zip(node.inputs[1:], params)):
        return "its scales, sizes or roi are computed at run time"
    lower = _pixel_map(node, attrs, params, "resize nearest", "it resizes more than the last two axes")
    return native_choice(node, f"{node.op} nearest: a pixel map per binding (md_gather_planes)", lower,
                         "md_gather_planes")


def _pixel_map(node: Node, attrs: Mapping[str, Any], operands: Sequence[Any], what: str, leading: str) -> Lowering:
    """A lowering that picks every output pixel of the last two axes from an input pixel:
    which one is found once per binding by running the node's own reference on a plane of
    pixel numbers (with ``operands``, the node's other inputs); ``leading``: the reason when
    the shapes differ on another axis."""
    reference = node.metaop.semantics.reference
    rank = len(node.inputs[0].type.shape)

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape], symbols: Mapping[str, int]
              ) -> NativeStep | str:
        shape, out = inputs[0], tuple(outputs[0])
        if shape is None or tuple(shape[:-2]) != out[:-2]:
            return leading
        h, w = shape[-2:]
        numbers = np.arange(h * w, dtype=np.float64).reshape((1,) * (rank - 2) + (h, w))
        picked = np.asarray(reference([numbers, *operands], attrs))
        table = np.ascontiguousarray(picked.reshape(-1, *picked.shape[-2:])[0].reshape(-1), np.int32)
        if table.size != math.prod(out[-2:]):
            return "the reference's pixel map does not have the output's size"
        return _mapped_rows(table, (h, w), out, what) or _gathered_planes(table, h * w, out, what)

    return lower


def _mapped_rows(table: np.ndarray, hw: tuple[int, int], out: Sequence[int], what: str) -> NativeStep | None:
    """The pixel map ``table`` as ``md_map_rows`` where it picks whole rows (a row map and a
    column map) and keeps the input's columns as one block (a reflect, edge or wrap Pad: each
    output row one block copy and a few pixels; a pixel at a time it ran at 1.45x ONNX
    Runtime's time); else None."""
    (h, w), (oh, ow) = hw, out[-2:]
    grid = table.reshape(oh, ow)
    rows, cols = grid[:, 0] // w, grid[0] % w
    starts = np.flatnonzero(cols == 0)
    left = next((int(a) for a in starts if a + w <= ow and np.array_equal(cols[a:a + w], np.arange(w))), None)
    if left is None or not np.array_equal(grid, rows[:, None] * w + cols[None, :]):
        return None
    row_map, col_map = np.ascontiguousarray(rows, np.int32), np.ascontiguousarray(cols, np.int32)
    planes = math.prod(out[:-2])
    dims = {"planes": planes, "h": h, "w": w, "oh": oh, "ow": ow, "left": left, "task": 0, "tasks": 1}

    def tasks(count: int) -> list[tuple[int, ...]] | None:
        if count < 2 or planes < count or math.prod(out) < PARALLEL_ELEMENTS:
            return None
        return [tuple({**dims, "task": t, "tasks": count}[d] for d in MAP_ROWS_DIMS) for t in range(count)]

    call = Call(native_function("md_map_rows"), (Arg("in", 0), Arg("addr", row_map.ctypes.data),
                                                 Arg("addr", col_map.ctypes.data), Arg("out", 0)),
                tuple(dims[d] for d in MAP_ROWS_DIMS), what, tasks)
    return NativeStep((call,) if planes else (), keep=(row_map, col_map))


def _gathered_planes(table: np.ndarray, in_plane: int, out: Sequence[int], what: str) -> NativeStep:
    """Every plane of the output picked from its input plane (``in_plane`` elements) by
    ``table`` (int32, an input position per output position): one ``md_gather_planes`` call."""
    planes = math.prod(out[:-2])
    dims = {"planes": planes, "in_plane": in_plane, "out_plane": table.size, "task": 0, "tasks": 1}

    def tasks(count: int) -> list[tuple[int, ...]] | None:
        if count < 2 or planes < count or math.prod(out) < PARALLEL_ELEMENTS:
            return None
        return [tuple({**dims, "task": t, "tasks": count}[d] for d in GATHER_PLANES_DIMS) for t in range(count)]

    call = Call(native_function("md_gather_planes"), (Arg("in", 0), Arg("addr", table.ctypes.data), Arg("out", 0)),
                tuple(dims[d] for d in GATHER_PLANES_DIMS), what, tasks)
    return NativeStep((call,) if planes and table.size else (), keep=(table,))


def pad_planes_node(node: Node) -> Choice | str:
    """A reflect, edge or wrap Pad of 32-bit elements that pads only the last two axes, with
    constant pads, as ``md_gather_planes``: which input pixel each output pixel copies is found
    once per binding by running the op's own reference on a plane of pixel numbers."""
    got = _prepare(node, axis=0)
    if isinstance(got, str):
        return got
    attrs = attrs_of(node)
    if attrs["mode"] not in ("reflect", "edge", "wrap") or got[1] != 4:
        return f"mode {attrs['mode']!r} of {got[1]}-byte elements (a pixel map takes reflect, edge, wrap of 4)"
    consts = [None if k >= len(node.inputs) or node.inputs[k] is None else node.inputs[k].const for k in (1, 3)]
    if consts[0] is None or (len(node.inputs) > 3 and node.inputs[3] is not None and consts[1] is None):
        return "its pads or axes are computed at run time"
    rank = len(node.inputs[0].type.shape)
    listed = list(range(rank)) if consts[1] is None else [int(a) % rank for a in np.asarray(consts[1]).reshape(-1)]
    amounts = [int(x) for x in np.asarray(consts[0]).reshape(-1)]
    if rank < 2 or any(a < rank - 2 and amount for a, amount in zip(listed * 2, amounts)):
        return "it pads more than the last two axes"
    operands = [np.asarray(consts[0]), None, None if consts[1] is None else np.asarray(consts[1])]
    lower = _pixel_map(node, attrs, operands, f"pad {attrs['mode']}", "it pads more than the last two axes")
    return native_choice(node, f"Pad {attrs['mode']}: a pixel map per binding (md_map_rows)", lower,
                         "md_gather_planes", "md_map_rows")


def shape_node(node: Node) -> Choice | str:
    """Shape and Size: their values follow from the binding's shapes, copied from a constant."""
    attrs = attrs_of(node)

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape], symbols: Mapping[str, int]
              ) -> NativeStep | str:
        shape = inputs[0]
        if shape is None:
            return "the input is absent"
        if node.op == "Size":
            values = np.array(math.prod(shape), np.int64)
        else:
            rank = len(shape)
            start, end = attrs["start"], rank if attrs["end"] is None else attrs["end"]
            start, end = (min(max(v + rank if v < 0 else v, 0), rank) for v in (start, end))
            values = np.array(shape[start:end], np.int64)
        if values.nbytes == 0:
            return NativeStep(())
        call = Call(native_function("md_copy"), (Arg("addr", values.ctypes.data), Arg("out", 0)), (values.nbytes,),
                    node.op.lower())
        return NativeStep((call,), keep=(values,))

    return native_choice(node, f"{node.op}: its values copied, known from the binding's shapes", lower, "md_copy")


def view_node(node: Node) -> Choice | str:
    """A Reshape-like node (the output is the input's memory under another shape): no kernel."""
    out = node.outputs[0].type
    if out is None or out.shape is None:
        return "the output shape is unknown"

    def run(args: Sequence[np.ndarray | None], out_types: Sequence[TensorType]) -> list[np.ndarray]:
        return [np.reshape(args[0], tuple(out_types[0].shape))]

    return Choice(run, "view", f"{node.op}: a view of its input (no copy)", native=ALIAS)


_TRUE = np.ones(1, np.bool_)  # the fill value of an inference Dropout's mask


def inference_dropout(node: Node) -> Choice | str:
    """Dropout not in training mode (``training_mode`` absent or a constant, which inference
    checked: true only with ratio 0): its input, as a view; with its mask asked for, a copy
    and a mask of all true (``md_copy_rows``, ``md_fill``)."""
    training = node.inputs[2] if len(node.inputs) > 2 else None
    if training is not None and training.const is None:
        return "its training_mode is computed at run time"
    if len(node.outputs) == 1 or node.outputs[1] is None:
        def run(args: Sequence[np.ndarray | None], out_types: Sequence[TensorType]) -> list[np.ndarray]:
            return [args[0]]

        return Choice(run, "view", "Dropout at inference: its input (no copy)", native=ALIAS)
    got = _prepare(node, axis=0)
    if isinstance(got, str):
        return got
    itemsize = got[1]

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape], symbols: Mapping[str, int]
              ) -> NativeStep | str:
        size = math.prod(outputs[0])
        copy = Call(native_function("md_copy_rows"), (Arg("in", 0), Arg("out", 0)),
                    (1, size * itemsize, 0, 0), "dropout copy")
        mask = Call(native_function("md_fill"), (Arg("addr", _TRUE.ctypes.data), Arg("out", 1)), (size, 1),
                    "dropout mask")
        return NativeStep((copy, mask) if size else ())

    return native_choice(node, "Dropout at inference with its mask: a copy and a mask of all true", lower,
                   "md_copy_rows", "md_fill")


__all__ = ["MAX_SLICE_CALLS", "concat_node", "element_dtype", "gather_node", "index_out_of_range", "inference_dropout",
           "native_choice", "nearest_resize_node", "pad_node", "pad_planes_node", "shape_node", "slice_node",
           "split_node", "view_node"]
