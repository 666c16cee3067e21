"""Tensor and shape manipulation: views, layout, concatenation, padding, shape queries.

Views (Reshape, Flatten, Squeeze, Unsqueeze) are ``np.reshape`` references; affine data
movement (Transpose, Expand, Tile, Range, ConstantOfShape) has an index expression generated
per node. Rules that read input *values* (Reshape's shape, Expand's shape, ...)
accept integer arrays and, for values known only symbolically, object arrays of dims (see
:mod:`metadef.ops.defs.shape_values`); when a value is unknown they give fresh symbols.
Indexing ops (Slice, Gather, Scatter*, ...) and index masks (OneHot, Trilu, EyeLike) live in
:mod:`metadef.ops.defs.tensor_index`.

Example:
    >>> import numpy as np
    >>> from metadef.ops import get_op, infer_types
    >>> from metadef.shape import parse_type
    >>> x = parse_type("f32[batch,seq,768]")
    >>> shape = np.array([0, 0, 12, 64], np.int64)
    >>> out, = infer_types(get_op("Reshape"), "/r", [x, parse_type("i64[4]")], {}, [None, shape])
    >>> str(out)
    'f32[batch,seq,12,64]'
    >>> str(get_op("Transpose").semantics.instantiate({"perm": (1, 2, 0)}, [(2, 3, 4)])[0])
    'transposed[i0, i1, i2] = data[i2, i0, i1]'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from metadef.core.dtypes import FLOAT32, from_numpy
from metadef.core.errors import ShapeError
from metadef.ops.defs import tensor_index  # noqa: F401  (the indexing half of the family)
from metadef.ops.defs.shape_values import (
    Shapes,
    axes_of,
    axis_of,
    exact_quotient,
    fresh_dims,
    input_dims,
    product,
    static_length,
)
from metadef.ops.infer import InferContext
from metadef.ops.interface import REQUIRED, int_, ints, string, tensor_
from metadef.ops.metaop import metaop
from metadef.ops.strategy import Role
from metadef.shape import (
    Decision,
    Dim,
    TensorType,
    add,
    broadcast_shapes,
    ceildiv,
    equal,
    floordiv,
    format_shape,
    mul,
    sub,
)

INT_INDEX = "Tind in {int32, int64}"


# --- helpers shared by the rules --------------------------------------------------------


def _take_axes(attrs: Mapping[str, Any], n_inputs: int, index: int) -> tuple[dict, dict]:
    """Adapter core: the ``axes`` attribute of an old opset becomes input ``index``."""
    attrs = dict(attrs)
    axes = attrs.pop("axes", None)
    return attrs, ({} if axes is None else {index: np.asarray(axes, np.int64)})


def _axes_to_input(first_opset: int):
    def adapt(opset: int, attrs: dict, n_inputs: int) -> tuple[dict, dict]:
        return _take_axes(attrs, n_inputs, 1) if opset < first_opset else (attrs, {})
    return adapt


# --- Reshape, Flatten, Squeeze, Unsqueeze: views ----------------------------------------


def _reshape_dims(ctx: InferContext, target: Sequence[Dim]) -> list[Dim | None]:
    data, allowzero = ctx.shape(0), ctx.attrs["allowzero"]
    out: list[Dim | None] = []
    for i, t in enumerate(target):
        if isinstance(t, int) and t < -1:
            ctx.fail(f"shape[{i}] is {t}; only -1 (infer) and sizes >= 0 are allowed")
        if isinstance(t, int) and t == -1:
            if None in out:
                ctx.fail("the shape has more than one -1", hint="infer at most one dimension")
            out.append(None)
        elif isinstance(t, int) and t == 0 and not allowzero:
            if data is not None and i >= len(data):
                ctx.fail(f"shape[{i}] is 0 (copy input dim {i}) but the input has rank {len(data)}")
            out.append(ctx.fresh("reshape") if data is None else data[i])
        else:
            out.append(t)
    if allowzero and 0 in target and -1 in target:
        ctx.fail("with allowzero=1 a shape may not hold both 0 and -1")
    return out


def _reshape_rule(ctx: InferContext) -> list[Any]:
    target = input_dims(ctx.values, 1)
    if target is None:
        return [fresh_dims(ctx, static_length(ctx, 1), "reshape")]
    out = _reshape_dims(ctx, target)
    data = ctx.shape(0)
    known = product([d for d in out if d is not None])
    if data is None:
        return [tuple(ctx.fresh("reshape") if d is None else d for d in out)]
    total = product(data)
    if None not in out:
        if isinstance(total, int) and isinstance(known, int) and total != known:
            ctx.fail(f"cannot reshape {total} elements into {list(out)} ({known} elements)")
        return [tuple(out)]
    if known == 0:
        ctx.fail("cannot infer the -1 dimension when another dimension is 0")
    q = exact_quotient(total, known)
    if q is None:
        if isinstance(total, int) and isinstance(known, int):
            ctx.fail(f"cannot reshape {total} elements into {list(target)}: "
                     f"{total} is not a multiple of {known}")
        q = floordiv(total, known)
    return [tuple(q if d is None else d for d in out)]


def _reshape_reference(inputs: list, attrs: Mapping[str, Any]) -> np.ndarray:
    x, shape = inputs[0], [int(s) for s in inputs[1]]
    if not attrs["allowzero"]:
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return x.reshape(shape)


def _reshape_adapt(opset: int, attrs: dict, n_inputs: int) -> tuple[dict, dict]:
    attrs = dict(attrs)
    shape = attrs.pop("shape", None)
    attrs.pop("consumed_inputs", None)
    return attrs, ({} if shape is None or opset >= 5 else {1: np.asarray(shape, np.int64)})


Reshape = metaop(
    "Reshape", inputs=("data", "shape: int64"), outputs=("reshaped",), types="T in {all, string}",
    attrs={"allowzero": int_(0)}, rule=_reshape_rule, reference=_reshape_reference,
    role=Role.INJECTIVE, reads=(1,), since=(1, 5, 13, 14, 19, 21), adapt=_reshape_adapt,
    doc="A view with a new shape: 0 copies the input dim (unless allowzero), -1 is inferred.",
)


def _flatten_rule(ctx: InferContext) -> list[Any]:
    s = ctx.shape(0)
    if s is None:
        return [(ctx.fresh("flat"), ctx.fresh("flat"))]
    axis = ctx.attrs["axis"]
    a = axis + len(s) if axis < 0 else axis
    if not 0 <= a <= len(s):
        ctx.fail(f"axis {axis} is out of range for rank {len(s)}",
                 hint=f"use an axis in [{-len(s)}, {len(s)}]")
    return [(product(s[:a]), product(s[a:]))]


def _flatten_reference(inputs: list, attrs: Mapping[str, Any]) -> np.ndarray:
    x, axis = inputs[0], attrs["axis"]
    a = axis + x.ndim if axis < 0 else axis
    return x.reshape(int(np.prod(x.shape[:a])), int(np.prod(x.shape[a:])))


Flatten = metaop(
    "Flatten", inputs=("input",), outputs=("output",), attrs={"axis": int_(1)}, types="T in {all, string}",
    rule=_flatten_rule, reference=_flatten_reference, role=Role.INJECTIVE,
    since=(1, 9, 11, 13, 21), doc="A 2-D view: dims before axis, and dims from axis on.",
)


def _squeeze_rule(ctx: InferContext) -> list[Any]:
    s = ctx.shape(0)
    if not ctx.has(1):  # symbolic dims are assumed not to be 1 (as ONNX Runtime does)
        return [None if s is None else tuple(d for d in s if d != 1)]
    axes = input_dims(ctx.values, 1)
    if s is None:
        return [None]
    if axes is None:
        n = static_length(ctx, 1)
        return [None if n is None else fresh_dims(ctx, len(s) - n, "squeeze")]
    if not axes:
        return [tuple(d for d in s if d != 1)]
    drop = axes_of(ctx, axes, len(s))
    for a in drop:
        if isinstance(s[a], int) and s[a] != 1:
            ctx.fail(f"cannot squeeze axis {a} of size {s[a]}", hint="only dims of size 1 squeeze")
    return [tuple(d for i, d in enumerate(s) if i not in drop)]


def _squeeze_reference(inputs: list, attrs: Mapping[str, Any]) -> np.ndarray:
    x = inputs[0]
    axes = inputs[1] if len(inputs) > 1 and inputs[1] is not None else None
    if axes is None or axes.size == 0:
        return np.squeeze(x)
    return np.squeeze(x, axis=tuple(int(a) for a in axes.reshape(-1)))


Squeeze = metaop(
    "Squeeze", inputs=("data", "axes?: int64"), outputs=("squeezed",), types="T in {all, string}",
    rule=_squeeze_rule, reference=_squeeze_reference, role=Role.INJECTIVE, reads=(1,), since=(1, 11, 13, 21),
    adapt=_axes_to_input(13), doc="Removes dims of size 1 (the given axes, or all of them).",
)


def _unsqueeze_rule(ctx: InferContext) -> list[Any]:
    s, axes = ctx.shape(0), input_dims(ctx.values, 1)
    if s is None:
        return [None]
    if axes is None:
        n = static_length(ctx, 1)
        return [None if n is None else fresh_dims(ctx, len(s) + n, "unsqueeze")]
    rank = len(s) + len(axes)
    new = axes_of(ctx, axes, rank)
    rest = iter(s)
    return [tuple(1 if i in new else next(rest) for i in range(rank))]


def _unsqueeze_reference(inputs: list, attrs: Mapping[str, Any]) -> np.ndarray:
    return np.expand_dims(inputs[0], tuple(int(a) for a in inputs[1].reshape(-1)))


Unsqueeze = metaop(
    "Unsqueeze", inputs=("data", "axes: int64"), outputs=("expanded",), types="T in {all, string}",
    rule=_unsqueeze_rule, reference=_unsqueeze_reference, role=Role.INJECTIVE, reads=(1,), since=(1, 11, 13, 21),
    adapt=_axes_to_input(13), doc="Inserts dims of size 1 at the given axes (of the output).",
)


# --- Transpose, Expand, Tile: affine index maps ------------------------------------------


def _perm(attrs: Mapping[str, Any], rank: int) -> tuple[int, ...]:
    return tuple(attrs["perm"]) if attrs["perm"] else tuple(range(rank - 1, -1, -1))


def _transpose_rule(ctx: InferContext) -> list[Any]:
    s = ctx.shape(0)
    if s is None:
        return [None if not ctx.attrs["perm"] else fresh_dims(ctx, len(ctx.attrs["perm"]), "t")]
    perm = _perm(ctx.attrs, len(s))
    if sorted(perm) != list(range(len(s))):
        ctx.fail(f"perm {list(perm)} is not a permutation of the {len(s)} axes")
    return [tuple(s[p] for p in perm)]


def _transpose_semantics(attrs: Mapping[str, Any], shapes: Shapes) -> str:
    """``transposed[i0, i1, i2] = data[i2, i0, i1]`` for perm (1, 2, 0)."""
    perm = _perm(attrs, len(shapes[0]))
    names = [f"i{k}" for k in range(len(perm))]
    source = [""] * len(perm)
    for k, p in enumerate(perm):
        source[p] = names[k]
    return f"transposed[{', '.join(names)}] = data[{', '.join(source)}]"


Transpose = metaop(
    "Transpose", inputs=("data",), outputs=("transposed",), attrs={"perm": ints()},
    types="T in {all, string}", rule=_transpose_rule, semantics=_transpose_semantics, role=Role.INJECTIVE,
    since=(1, 13, 21), doc="Permutes the axes (default: reverses them).",
)


def _expand_rule(ctx: InferContext) -> list[Any]:
    s, target = ctx.shape(0), input_dims(ctx.values, 1)
    if target is None:
        n = static_length(ctx, 1)
        if s is None or n is None:
            return [None]
        rank = max(len(s), n)
        padded = (1,) * (rank - len(s)) + tuple(s)
        return [tuple(ctx.fresh("expand") if d == 1 else d for d in padded)]
    if s is None:
        return [None]
    try:
        out, _undecided = broadcast_shapes(s, target)
    except ShapeError:
        ctx.fail(f"the input shape {list(s)} does not broadcast to shape {list(target)}",
                 hint="each dim must be equal to the target's, or 1")
    return [out]


Expand = metaop(
    "Expand", inputs=("input", "shape: int64"), outputs=("output",), types="T in {all, string}",
    rule=_expand_rule, semantics="output[...] = input[...]", role=Role.BROADCAST, reads=(1,), since=(8, 13),
    doc="Broadcasts the input to a shape (numpy rules, both ways).",
)


def _tile_rule(ctx: InferContext) -> list[Any]:
    s, reps = ctx.shape(0), input_dims(ctx.values, 1)
    if s is None:
        return [fresh_dims(ctx, static_length(ctx, 1), "tile")]
    if reps is None:
        return [fresh_dims(ctx, len(s), "tile")]
    if len(reps) != len(s):
        ctx.fail(f"repeats has {len(reps)} entries but the input has rank {len(s)}")
    if any(isinstance(r, int) and r < 0 for r in reps):
        ctx.fail(f"repeats {list(reps)} holds a negative count")
    return [tuple(mul(d, r) for d, r in zip(s, reps))]


def _tile_semantics(attrs: Mapping[str, Any], shapes: Shapes) -> tuple[str, dict[str, Dim]]:
    """``output[t0*D0 + i0, t1*D1 + i1] = input[i0, i1]``: copy t of each axis."""
    rank = len(shapes[0])
    lhs = ", ".join(f"t{k}*D{k} + i{k}" for k in range(rank))
    rhs = ", ".join(f"i{k}" for k in range(rank))
    return f"output[{lhs}] = input[{rhs}]", {f"D{k}": d for k, d in enumerate(shapes[0])}


Tile = metaop(
    "Tile", inputs=("input", "repeats: int64"), outputs=("output",), types="T in {all, string}",
    rule=_tile_rule, semantics=_tile_semantics, role=Role.INJECTIVE, reads=(1,), since=(1, 6, 13),
    doc="Repeats the input repeats[k] times along each axis k.",
)


# --- Concat, Split --------------------------------------------------------------------


def _agree(ctx: InferContext, a: Dim, b: Dim, axis: int) -> Dim:
    same = equal(a, b, ctx.env)
    if same is Decision.FALSE:
        ctx.fail(f"dim {axis} differs between inputs ({a} and {b}); only the concat axis may")
    return a if isinstance(a, int) or not isinstance(b, int) else b


def _concat_rule(ctx: InferContext) -> list[Any]:
    shapes = [ctx.shape(i) for i in range(len(ctx.inputs))]
    if any(s is None for s in shapes):
        return [None]
    rank = len(shapes[0])
    if any(len(s) != rank for s in shapes):
        ctx.fail("inputs have different ranks " + str([len(s) for s in shapes]))
    axis = axis_of(ctx, ctx.attrs["axis"], rank)
    out = list(shapes[0])
    for s in shapes[1:]:
        for k in range(rank):
            out[k] = add(out[k], s[k]) if k == axis else _agree(ctx, out[k], s[k], k)
    return [tuple(out)]


def _concat_adapt(opset: int, attrs: dict, n_inputs: int) -> tuple[dict, dict]:
    """Before 4, axis was optional with default 1."""
    return ({"axis": 1, **attrs} if opset < 4 else attrs), {}


Concat = metaop(
    "Concat", inputs=("inputs*",), outputs=("concat_result",), attrs={"axis": int_(REQUIRED)},
    types="T in {all, string}", rule=_concat_rule, reference=lambda xs, a: np.concatenate(xs, axis=a["axis"]),
    role=Role.INJECTIVE, since=(1, 4, 11, 13), adapt=_concat_adapt,
    doc="Joins the inputs along axis (piecewise: not one index expression).",
)


def _split_sizes(ctx: InferContext, dim: Dim) -> list[Dim] | None:
    split = input_dims(ctx.values, 1)
    if split is not None:
        total = add(0, 0)
        for d in split:
            total = add(total, d)
        if isinstance(dim, int) and isinstance(total, int) and total != dim:
            ctx.fail(f"split {list(split)} sums to {total} but the axis has {dim}")
        return list(split)
    if ctx.has(1):
        return fresh_dims(ctx, static_length(ctx, 1), "split")
    n = ctx.attrs["num_outputs"]
    if n is None:
        ctx.fail("the number of outputs is unknown", hint="give num_outputs or a split input")
    if n < 1:
        ctx.fail(f"num_outputs is {n}; it must be at least 1")
    chunk = ceildiv(dim, n)
    return [chunk] * (n - 1) + [sub(dim, mul(chunk, n - 1))]


def _split_rule(ctx: InferContext) -> list[Any]:
    s = ctx.shape(0)
    if s is None:
        n = ctx.attrs["num_outputs"] or static_length(ctx, 1) or 1
        return [None] * n
    axis = axis_of(ctx, ctx.attrs["axis"], len(s))
    sizes = _split_sizes(ctx, s[axis])
    if sizes is None:
        ctx.fail("the split input has no static length, so the number of outputs is unknown")
    return [s[:axis] + (d,) + s[axis + 1:] for d in sizes]


def _split_reference(inputs: list, attrs: Mapping[str, Any]) -> list[np.ndarray]:
    x, axis = inputs[0], attrs["axis"]
    if len(inputs) > 1 and inputs[1] is not None:
        sizes = [int(d) for d in inputs[1]]
    else:
        n, dim = attrs["num_outputs"], x.shape[axis]
        chunk = -(-dim // n)
        sizes = [chunk] * (n - 1) + [dim - chunk * (n - 1)]
    return np.split(x, np.cumsum(sizes)[:-1], axis=axis)


def _split_adapt(opset: int, attrs: dict, n_inputs: int,
                 n_outputs: int | None = None) -> tuple[dict, dict]:
    """Before 13 ``split`` is an attribute; before 18 an equal split has as many parts as
    the node has outputs (``n_outputs``, when the importer passes it)."""
    attrs = dict(attrs)
    split = attrs.pop("split", None)
    extra = {} if split is None else {1: np.asarray(split, np.int64)}
    if (opset < 18 and split is None and n_inputs < 2 and n_outputs is not None
            and attrs.get("num_outputs") is None):
        attrs["num_outputs"] = n_outputs
    return attrs, extra


Split = metaop(
    "Split", inputs=("input", "split?: int64"), outputs=("outputs*",), types="T in {all, string}",
    attrs={"axis": int_(0), "num_outputs": int_()}, rule=_split_rule,
    reference=_split_reference, role=Role.INJECTIVE, reads=(1,), since=(1, 2, 11, 13, 18),
    adapt=_split_adapt, doc="Splits along axis by sizes, or into num_outputs parts "
                            "(the last one smaller when the axis does not divide evenly).",
)


# --- Pad ------------------------------------------------------------------------------

PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "wrap"}


def _pad_axes(ctx: InferContext, rank: int) -> list[int] | None:
    if not ctx.has(3):
        return list(range(rank))
    axes = input_dims(ctx.values, 3)
    return None if axes is None else axes_of(ctx, axes, rank)


def _pad_rule(ctx: InferContext) -> list[Any]:
    if ctx.attrs["mode"] not in PAD_MODES:
        ctx.fail(f"mode {ctx.attrs['mode']!r} is not one of {', '.join(PAD_MODES)}")
    s = ctx.shape(0)
    if s is None:
        return [None]
    axes, pads = _pad_axes(ctx, len(s)), input_dims(ctx.values, 1)
    if axes is None or pads is None:
        touched = range(len(s)) if axes is None else axes
        return [tuple(ctx.fresh("pad") if k in touched else d for k, d in enumerate(s))]
    if len(pads) != 2 * len(axes):
        ctx.fail(f"pads has {len(pads)} entries; {2 * len(axes)} expected (begin and end "
                 f"for each of {len(axes)} axes)")
    out = list(s)
    for k, a in enumerate(axes):
        out[a] = add(add(s[a], pads[k]), pads[k + len(axes)])
        if isinstance(out[a], int) and out[a] < 0:
            ctx.fail(f"pads {list(pads)} remove more than the {s[a]} elements of axis {a}")
    return [tuple(out)]


def _pad_reference(inputs: list, attrs: Mapping[str, Any]) -> np.ndarray:
    x, pads = inputs[0], [int(p) for p in inputs[1]]
    axes = (range(x.ndim) if len(inputs) < 4 or inputs[3] is None
            else [int(a) % x.ndim for a in inputs[3]])
    before, after = [0] * x.ndim, [0] * x.ndim
    for k, a in enumerate(axes):
        before[a], after[a] = pads[k], pads[k + len(axes)]
    x = x[tuple(slice(max(0, -b), n - max(0, -e)) for n, b, e in zip(x.shape, before, after))]
    width = [(max(0, b), max(0, e)) for b, e in zip(before, after)]
    mode = PAD_MODES[attrs["mode"]]
    if mode != "constant":
        return np.pad(x, width, mode=mode)
    value = np.asarray(inputs[2]).reshape(-1)[:1] if len(inputs) > 2 and inputs[2] is not None else ()
    fill = value if len(value) else np.array("", object) if x.dtype == object else 0  # (not "": that pads np.str_)
    return np.pad(x, width, mode="constant", constant_values=fill)


def _pad_adapt(opset: int, attrs: dict, n_inputs: int) -> tuple[dict, dict]:
    """Before 11, pads and the (float) value are attributes."""
    if opset >= 11:
        return attrs, {}
    attrs = dict(attrs)
    pads = attrs.pop("pads", attrs.pop("paddings", None))  # opset 1 called it paddings
    value = attrs.pop("value", 0.0)
    extra = {} if pads is None else {1: np.asarray(pads, np.int64)}
    if value:
        extra[2] = np.asarray(value, np.float32)
    return attrs, extra


Pad = metaop(
    "Pad", inputs=("data", "pads: int64", "constant_value?", "axes?: Tind"),
    outputs=("output",), types=f"T in {{all, string}}; {INT_INDEX}", attrs={"mode": string("constant")},
    rule=_pad_rule, reference=_pad_reference, role=Role.INJECTIVE, reads=(1, 3),
    since=(1, 2, 11, 13, 18, 19, 21), adapt=_pad_adapt,
    doc="Pads (or crops, for negative pads) with a constant (default 0; strings: \"\"), a reflection, the "
        "edge or a wrap; pads are an input, so its amounts are not known to a per-node index expression.",
)


# --- Shape, Size, ConstantOfShape, Range ------------------------------------------------


def _shape_rule(ctx: InferContext) -> list[Any]:
    s = ctx.shape(0)
    if s is None:
        return [(ctx.fresh("rank"),)]
    return [(len(range(len(s))[ctx.attrs["start"]:ctx.attrs["end"]]),)]


Shape = metaop(
    "Shape", inputs=("data",), outputs=("shape: int64",), attrs={"start": int_(0), "end": int_()},
    types="T in {all, string}", rule=_shape_rule,
    reference=lambda xs, a: np.array(xs[0].shape[a["start"]:a["end"]], np.int64),
    role=Role.OPAQUE, since=(1, 13, 15, 19, 21), doc="The input's dims [start:end] as int64.",
)

Size = metaop(
    "Size", inputs=("data",), outputs=("size: int64",), types="T in {all, string}", rule=lambda ctx: [()],
    reference=lambda xs, a: np.array(xs[0].size, np.int64), role=Role.OPAQUE,
    since=(1, 13, 19, 21), doc="The input's number of elements as an int64 scalar.",
)


def _constant_of_shape_rule(ctx: InferContext) -> list[Any]:
    value = ctx.attrs["value"]
    dtype = FLOAT32 if value is None else from_numpy(value.dtype)
    dims = input_dims(ctx.values, 0)
    if dims is None:
        return [TensorType(dtype, fresh_dims(ctx, static_length(ctx, 0), "const"))]
    if any(isinstance(d, int) and d < 0 for d in dims):
        ctx.fail(f"shape {list(dims)} holds a negative dim")
    return [TensorType(dtype, tuple(dims))]


def _constant_of_shape_semantics(attrs: Mapping[str, Any], shapes: Shapes) -> tuple[str, dict]:
    value = attrs["value"]
    v = 0.0 if value is None else np.asarray(value).reshape(-1)[0].item()
    return "output[...] = v", {"v": int(v) if isinstance(v, bool) else v}


ConstantOfShape = metaop(
    "ConstantOfShape", inputs=("input: int64",), outputs=("output: T2",),
    types="T2 in {all}", attrs={"value": tensor_()}, rule=_constant_of_shape_rule,
    semantics=_constant_of_shape_semantics, role=Role.INJECTIVE, reads=(0,),
    since=(9, 20, 21), doc="A tensor of the given shape filled with value (default 0.0f).",
)


def _range_length(ctx: InferContext) -> Dim | None:
    raw = [ctx.value(i) for i in range(3)]
    if any(v is None for v in raw):
        return None
    if all(np.asarray(v).dtype != object for v in raw):
        start, limit, delta = (np.asarray(v).reshape(-1)[0] for v in raw)
        if delta == 0:
            ctx.fail("delta is 0")
        if all(np.asarray(v).dtype.kind in "iu" for v in raw):
            return max(0, -((int(start) - int(limit)) // int(delta)))
        return max(0, int(np.ceil((float(limit) - float(start)) / float(delta))))
    start, limit, delta = (input_dims(ctx.values, i) for i in range(3))
    if None in (start, limit, delta) or not isinstance(delta[0], int) or delta[0] == 0:
        return None  # symbolic ranges are assumed non-empty
    if delta[0] > 0:
        return ceildiv(sub(limit[0], start[0]), delta[0])
    return ceildiv(sub(start[0], limit[0]), -delta[0])


def _range_rule(ctx: InferContext) -> list[Any]:
    """Scalars, or one-element 1-D tensors as ONNX Runtime takes them (AffineGrid's body passes them)."""
    for i in range(3):
        shape = ctx.shape(i)
        if shape is not None and (len(shape) > 1 or (
                len(shape) == 1 and isinstance(shape[0], int) and shape[0] != 1)):
            ctx.fail(f"input {i} must be a scalar (or a one-element 1-D tensor), got shape "
                     f"{format_shape(shape)}")
    n = _range_length(ctx)
    return [(ctx.fresh("range") if n is None else n,)]


def _range_semantics(attrs: Mapping[str, Any], shapes: Shapes) -> str:
    """``output[i] = start + i * delta``, reading element 0 of one-element 1-D inputs.

    Example:
        >>> _range_semantics({}, [(), (1,), (1,)])
        'output[i] = start[] + i * delta[0]'
    """
    start, delta = (f"{name}[{'0' if shape else ''}]"
                    for name, shape in (("start", shapes[0]), ("delta", shapes[2])))
    return f"output[i] = {start} + i * {delta}"


Range = metaop(
    "Range", inputs=("start", "limit", "delta"), outputs=("output",),
    types="T in {float, int16, int32, int64}", rule=_range_rule,
    semantics=_range_semantics, role=Role.INJECTIVE, reads=(0, 1, 2),
    since=(11,), doc="start, start + delta, ... up to (excluding) limit: "
                     "max(0, ceil((limit - start) / delta)) elements.",
)

__all__ = ["Concat", "ConstantOfShape", "Expand", "Flatten", "Pad", "Range", "Reshape", "Shape", "Size", "Split",
           "Squeeze", "Tile", "Transpose", "Unsqueeze"]
