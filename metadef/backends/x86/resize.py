"""A linear or cubic Resize of the last two axes as ``md_resize2d``.

The reference resizes axis by axis in float64 numpy; as a node's kernel that ran bilinear 2x
upsampling of ``[8, 64, 56, 56]`` at 19x ONNX Runtime's time. :func:`resize_node` takes a
float32 Resize whose scales or sizes are constants and which resizes only the last two axes
(segmentation heads, FPNs, super-resolution), and runs it as one ``md_resize2d`` call: per
binding, each axis's taps (input indices and weights) come from the reference's own
interpolation (``metadef.ops.defs.nn_resize.axis_taps``: every coordinate mode, linear or cubic,
antialiased or not), so only the arithmetic is native (in float32). ``tf_crop_and_resize``
(its extrapolated pixels) and nearest resizing (:func:`.movement.nearest_resize_node`) go
elsewhere.

Example:
    >>> import numpy as np
    >>> from metadef.ir import GraphBuilder
    >>> from metadef.shape import parse_type
    >>> b = GraphBuilder("g")
    >>> y, = b.node("Resize", [b.input("x", parse_type("f32[n,3,4,4]")), None,
    ...                        b.const("s", np.array([1, 1, 2, 2], np.float32))], {"mode": "linear"})
    >>> resize_node(b.build().nodes[0]).reason
    'linear resize of the last two axes: md_resize2d (our kernel)'
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from metadef.backends.x86.choice import Choice, attrs_of, reference
from metadef.backends.x86.native import PARALLEL_ELEMENTS, Arg, Call, NativeStep, Shape, needing, timed_call
from metadef.codegen.native import native_function
from metadef.codegen.native_resize import ROW_FLOATS, resize2d_dims
from metadef.ir import Node
from metadef.ops.defs.nn_resize import axis_taps, plan, resize_operands
from metadef.shape import TensorType


def _tables(shape: Sequence[int], attrs: Mapping[str, Any], scales: Any, sizes: Any
            ) -> tuple[tuple[int, int], list[np.ndarray]] | str:
    """The output plane and the four tap tables (row indices and weights, column indices and
    weights, one tap count) for resizing ``shape``, or why the routine does not take it."""
    axes, scale, out = plan(tuple(shape), attrs, scales, sizes)
    rank = len(shape)
    tables = []
    for axis in (rank - 2, rank - 1):
        n_in = shape[axis]
        if axis not in axes or (out[axes.index(axis)] == n_in and math.isclose(scale[axes.index(axis)], 1.0)):
            tables.append((np.arange(n_in)[:, None], np.ones((n_in, 1))))  # (as the reference: untouched)
        else:
            k = axes.index(axis)
            tables.append(axis_taps(n_in, out[k], scale[k], attrs))
    for a, s, n in zip(axes, scale, out):
        if a < rank - 2 and (n != shape[a] or not math.isclose(s, 1.0)):
            return "it resizes more than the last two axes"
    if shape[-1] > ROW_FLOATS or 0 in shape:
        return f"its rows are longer than {ROW_FLOATS} floats, or it is empty"
    taps = max(t[0].shape[1] for t in tables)
    arrays = []
    for idx, weights in tables:
        pad = taps - idx.shape[1]  # (zero weights make the two tables one tap count)
        arrays.append(np.ascontiguousarray(np.pad(idx, ((0, 0), (0, pad))), np.int32))
        arrays.append(np.ascontiguousarray(np.pad(weights, ((0, 0), (0, pad))), np.float32))
    return (tables[0][0].shape[0], tables[1][0].shape[0]), arrays


def resize_node(node: Node) -> Choice | str:
    """A float32 linear or cubic Resize of the last two axes with constant parameters as
    ``md_resize2d`` (see the module doc), or why not. Constant sizes that turn out to resize
    a leading axis of some input run the reference's kernel for it (from Python)."""
    if node.qualop != "Resize":
        return "only Resize (not the old Upsample) runs as md_resize2d"
    attrs = attrs_of(node)
    x = node.inputs[0].type if node.inputs and node.inputs[0] is not None else None
    if x is None or x.shape is None or len(x.shape) < 2 or x.dtype.numpy != np.float32:
        return "only float32 tensors of a known rank are resized by md_resize2d"
    if attrs.get("mode") not in ("linear", "cubic") or attrs.get("coordinate_transformation_mode") == \
            "tf_crop_and_resize":
        return "only linear and cubic resizing (no crop) runs as md_resize2d"
    params = [None if v is None else v.const for v in node.inputs[1:]]
    if any(v is not None and c is None for v, c in zip(node.inputs[1:], params)):
        return "its scales or sizes are computed at run time"
    _, scales, sizes = resize_operands([None, *params])  # (the roi: only tf_crop_and_resize reads it)
    if scales is not None and not attrs.get("axes") and np.any(np.asarray(scales)[:-2] != 1):
        return "it resizes more than the last two axes"
    fallback = reference(node, "")

    def call(shape: Sequence[int]) -> tuple[tuple[int, ...], list[np.ndarray], tuple[int, ...]] | str:
        got = _tables(shape, attrs, scales, sizes)
        if isinstance(got, str):
            return got
        (oh, ow), tables = got
        planes = math.prod(shape[:-2])
        return (*shape[:-2], oh, ow), tables, resize2d_dims(planes, shape[-2], shape[-1], oh, ow,
                                                              tables[0].shape[1])

    def run(args: Sequence[np.ndarray | None], out_types: Sequence[TensorType]) -> list[np.ndarray]:
        data = np.ascontiguousarray(args[0], np.float32)
        got = call(data.shape)
        if isinstance(got, str):  # (sizes that resize a leading axis: the reference's kernel)
            return fallback.kernel(args, out_types)
        out_shape, tables, dims = got
        out = np.empty(out_shape, np.float32)
        timed_call(native_function("md_resize2d"), [a.ctypes.data for a in (data, out, *tables)], dims)()
        return [out]

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape], symbols: Mapping[str, int]
              ) -> NativeStep | str:
        shape = inputs[0]
        got = "the input is absent" if shape is None else call(shape)
        if isinstance(got, str):
            return got
        out_shape, tables, dims = got
        if tuple(out_shape) != tuple(outputs[0]):
            return f"its tables give {out_shape}, not the output's {tuple(outputs[0])}"
        units = dims[0] * dims[3]

        def tasks(count: int) -> list[tuple[int, ...]] | None:
            if count < 2 or units < count or math.prod(out_shape) < PARALLEL_ELEMENTS:
                return None
            return [(*dims[:-2], t, count) for t in range(count)]

        args = (Arg("in", 0), Arg("out", 0), *(Arg("addr", t.ctypes.data) for t in tables))
        return NativeStep((Call(native_function("md_resize2d"), args, dims, f"{attrs['mode']} resize", tasks),),
                          keep=tuple(tables))

    return Choice(run, "native", f"{attrs['mode']} resize of the last two axes: md_resize2d (our kernel)",
                  native=needing(lower, "md_resize2d"))


__all__ = ["resize_node"]
