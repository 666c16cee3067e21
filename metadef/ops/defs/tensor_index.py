"""Indexing ops of the tensor family: Slice, Gather*, Scatter*, NonZero, Compress,
ReverseSequence, and the index masks OneHot, Trilu and EyeLike.

Most read inputs at positions given by other inputs' *values* (indices, starts, sequence
lengths), which an index expression cannot name, so each has a vectorized numpy reference;
the masks compare index variables and have index expressions. Slice's rule computes symbolic
output dims from constant starts and ends, with ONNX's clamping; where a bound or the dim is
symbolic the bound is assumed to lie inside the dim, and when that is about a plain symbol the
assumption is recorded in the graph's ShapeEnv (``seq <= 512`` for ``weight[0:seq]``;
``seq >= 1`` for ``x[:, 1:]``).

Example:
    >>> import numpy as np
    >>> from metadef.ops import get_op, infer_types
    >>> from metadef.shape import parse_type
    >>> x, i64 = parse_type("f32[batch,seq,768]"), parse_type("i64[1]")
    >>> vals = [None, np.array([1]), np.array([2**63 - 1]), np.array([1])]
    >>> out, = infer_types(get_op("Slice"), "/s", [x, i64, i64, i64], {}, vals)
    >>> str(out)
    'f32[batch,seq - 1,768]'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from metadef.core.dtypes import from_onnx
from metadef.core.errors import DTypeError
from metadef.ops.defs.shape_values import (
    Shapes,
    axes_of,
    axis_of,
    fresh_dims,
    input_dims,
    normalize_axis,
    static_length,
)
from metadef.ops.infer import InferContext
from metadef.ops.interface import int_, string
from metadef.ops.metaop import metaop
from metadef.ops.strategy import Role
from metadef.shape import Decision, Dim, TensorType, ceildiv, equal, sub

INT_INDEX = "Tind in {int32, int64}"
TO_END = 2 ** 30
"""A constant bound at least this large (in magnitude) means "to the end" (INT64_MAX...)."""


# --- Slice ----------------------------------------------------------------------------


def _assume(ctx: InferContext, name_of: Dim, **bound: int) -> None:
    """Record in the ShapeEnv what a symbolic slice assumed, when the dim is a plain symbol."""
    atom = name_of.as_atom() if not isinstance(name_of, int) else None
    if atom is not None and atom.key[0] == "sym":
        ctx.env.constrain(atom.key[1], **bound)


def _static_bound(v: int, dim: int, lo: int, hi: int) -> int:
    return min(max(v + dim if v < 0 else v, lo), hi)


def _clamp(ctx: InferContext, v: Dim, dim: Dim, lo: int, hi: Dim) -> Dim:
    """One slice bound, made non-negative and clamped to [lo, hi] as ONNX says.

    ``hi`` is ``dim`` (step > 0) or ``dim - 1`` (step < 0); ``lo`` is 0 or -1. With a static
    bound and dim this is exact; otherwise a bound is assumed to lie inside the dim, as ONNX
    Runtime's symbolic inference assumes, and the assumption goes to the ShapeEnv.
    """
    if isinstance(v, int) and isinstance(dim, int):
        return _static_bound(v, dim, lo, hi)
    if isinstance(v, int):
        if v >= TO_END:
            return hi
        if v <= -TO_END:
            return lo
        _assume(ctx, dim, lo=abs(v))
        return dim + v if v < 0 else v
    if equal(v, dim) is Decision.TRUE:
        return hi
    if isinstance(dim, int):
        _assume(ctx, v, hi=dim)
    return v


def _slice_dim(ctx: InferContext, dim: Dim, start: Dim, end: Dim, step: Dim) -> Dim:
    if not isinstance(step, int):
        return ctx.fresh("slice")
    if (step > 0 and ((isinstance(start, int) and start >= TO_END) or (isinstance(end, int) and end <= -TO_END))) \
            or (step < 0 and isinstance(end, int) and end >= TO_END):
        return 0  # from the end onwards (or up to before the start): empty, whatever the dim
    if step > 0:
        s, e = _clamp(ctx, start, dim, 0, dim), _clamp(ctx, end, dim, 0, dim)
        span, stride = sub(e, s), step
    else:
        hi = sub(dim, 1)
        s, e = _clamp(ctx, start, dim, 0, hi), _clamp(ctx, end, dim, -1, hi)
        span, stride = sub(s, e), -step
    if isinstance(span, int):
        return max(0, -(-span // stride))
    return ceildiv(span, stride)


def _slice_params(ctx: InferContext, rank: int) -> tuple[list[int] | None, list | None,
                                                          list | None, list | None]:
    """Axes, starts, ends and steps where known, checked against each other and the rank."""
    starts, ends = input_dims(ctx.values, 1), input_dims(ctx.values, 2)
    axes = input_dims(ctx.values, 3) if ctx.has(3) else None
    steps = input_dims(ctx.values, 4) if ctx.has(4) else None
    lengths = {"starts": static_length(ctx, 1), "ends": static_length(ctx, 2),
               "axes": static_length(ctx, 3), "steps": static_length(ctx, 4)}
    for name, v in (("starts", starts), ("ends", ends), ("axes", axes), ("steps", steps)):
        lengths[name] = len(v) if v is not None else lengths[name]
    known = {k: n for k, n in lengths.items() if n is not None}
    if len(set(known.values())) > 1:
        ctx.fail(" but ".join(f"{k} has {n} entries" for k, n in known.items()),
                 hint="starts, ends, axes and steps must have one entry per sliced axis")
    n = next(iter(known.values()), None)
    if axes is None and not ctx.has(3) and n is not None:
        axes = list(range(n))
    norm = None if axes is None else axes_of(ctx, axes, rank)
    if steps is None and not ctx.has(4) and n is not None:
        steps = [1] * n
    for a, st in zip(norm or (), steps or ()):
        if isinstance(st, int) and st == 0:
            ctx.fail(f"step 0 on axis {a}; a step must not be 0")
    return norm, starts, ends, steps


def _slice_rule(ctx: InferContext) -> list[Any]:
    s = ctx.shape(0)
    if s is None:
        return [None]
    axes, starts, ends, steps = _slice_params(ctx, len(s))
    if axes is None:  # any axis may be sliced
        return [fresh_dims(ctx, len(s), "slice")]
    out = list(s)
    for k, a in enumerate(axes):
        if starts is None or ends is None or steps is None:
            out[a] = ctx.fresh("slice")
        else:
            _note_out_of_range(ctx, a, s[a], starts[k], ends[k])
            out[a] = _slice_dim(ctx, s[a], starts[k], ends[k], steps[k])
    return [tuple(out)]


def _note_out_of_range(ctx: InferContext, axis: int, dim: Dim, start: Dim, end: Dim) -> None:
    """A bound past a static dim (other than the "to the end" sentinels exporters use) is
    clamped as ONNX says, but it is usually a bug in the model: say so (an error under
    METADEF_STRICT_SHAPES=1)."""
    if not isinstance(dim, int):
        return
    for what, v in (("start", start), ("end", end)):
        if isinstance(v, int) and dim < abs(v) < TO_END and not (v < 0 and what == "end" and v == -dim - 1):
            ctx.note(f"{what} {v} exceeds dim {axis} ({dim})",
                     hint=f"ONNX clamps it to {'0' if v < 0 else dim}")


def _slice_reference(inputs: list, attrs: Mapping[str, Any]) -> np.ndarray:
    x, starts, ends = inputs[0], inputs[1].reshape(-1), inputs[2].reshape(-1)
    has = [len(inputs) > i and inputs[i] is not None for i in (3, 4)]
    axes = inputs[3].reshape(-1) if has[0] else range(len(starts))
    steps = inputs[4].reshape(-1) if has[1] else [1] * len(starts)
    index = [slice(None)] * x.ndim
    for a, b, e, st in zip(axes, starts, ends, steps):
        # ONNX clamps a negative step's start to 0, where a Python slice would run empty
        n, st = x.shape[int(a)], int(st)
        lo, hi = (0, n) if st > 0 else (-1, n - 1)
        start, end = _static_bound(int(b), n, 0, hi), _static_bound(int(e), n, lo, hi)
        index[int(a)] = slice(start, None if end < 0 else end, st)
    return x[tuple(index)]


def _slice_adapt(opset: int, attrs: dict, n_inputs: int) -> tuple[dict, dict]:
    """Before 10, starts, ends and axes are attributes (and there are no steps)."""
    if opset >= 10:
        return attrs, {}
    attrs = dict(attrs)
    extra = {i: np.asarray(attrs.pop(name), np.int64)
             for i, name in ((1, "starts"), (2, "ends"), (3, "axes")) if name in attrs}
    return attrs, extra


Slice = metaop(
    "Slice", inputs=("data", "starts: Tind", "ends: Tind", "axes?: Tind", "steps?: Tind"),
    outputs=("output",), types=f"T in {{all, string}}; {INT_INDEX}", rule=_slice_rule,
    reference=_slice_reference, role=Role.INJECTIVE, reads=(1, 2, 3, 4),
    since=(1, 10, 11, 13), adapt=_slice_adapt,
    doc="data[starts:ends:steps] on the given axes; bounds clamp to the dim as in Python.",
)


# --- Gather, GatherElements, GatherND ---------------------------------------------------


def _gather_rule(ctx: InferContext) -> list[Any]:
    s, q = ctx.shape(0), ctx.shape(1)
    if s is None or q is None:
        return [None]
    a = axis_of(ctx, ctx.attrs["axis"], len(s))
    return [tuple(s[:a]) + tuple(q) + tuple(s[a + 1:])]


Gather = metaop(
    "Gather", inputs=("data", "indices: Tind"), outputs=("output",),
    types=f"T in {{all, string}}; {INT_INDEX}", attrs={"axis": int_(0)}, rule=_gather_rule,
    reference=lambda xs, a: np.take(xs[0], xs[1], axis=a["axis"]),  # negative indices wrap
    role=Role.INJECTIVE, since=(1, 11, 13),
    doc="Takes entries of data along axis at the indices (negative: from the back).",
)


def _wrap(indices: np.ndarray, size: Any) -> np.ndarray:
    return np.where(indices < 0, indices + size, indices)


def _gather_elements_rule(ctx: InferContext) -> list[Any]:
    s, q = ctx.shape(0), ctx.shape(1)
    if s is not None and q is not None:
        if len(s) != len(q):
            ctx.fail(f"indices have rank {len(q)} but data has rank {len(s)}")
        axis_of(ctx, ctx.attrs["axis"], len(s))
    return [q]


def _gather_elements_reference(inputs: list, attrs: Mapping[str, Any]) -> np.ndarray:
    data, idx = inputs
    axis = normalize_axis(attrs["axis"], data.ndim)
    return np.take_along_axis(data, _wrap(idx, data.shape[axis]), axis=axis)


GatherElements = metaop(
    "GatherElements", inputs=("data", "indices: Tind"), outputs=("output",),
    types=f"T in {{all, string}}; {INT_INDEX}", attrs={"axis": int_(0)}, rule=_gather_elements_rule,
    reference=_gather_elements_reference, role=Role.INJECTIVE, since=(11, 13),
    doc="output[i][j] = data[indices[i][j]][j] for axis 0 (and so on for other axes).",
)


def _gathernd_rule(ctx: InferContext) -> list[Any]:
    s, q, b = ctx.shape(0), ctx.shape(1), ctx.attrs["batch_dims"]
    if s is None or q is None:
        return [None]
    if not q or not isinstance(q[-1], int):
        ctx.fail("the last dim of indices must be a static size", hint="give indices a fixed last dim")
    k = q[-1]
    if not 0 <= b < min(len(s), len(q)):
        ctx.fail(f"batch_dims {b} must be in [0, {min(len(s), len(q))}) "
                 "(below the ranks of data and indices)")
    if b + k > len(s):
        ctx.fail(f"batch_dims {b} plus index length {k} exceeds the data rank {len(s)}")
    return [tuple(q[:-1]) + tuple(s[b + k:])]


def _gathernd_reference(inputs: list, attrs: Mapping[str, Any]) -> np.ndarray:
    data, idx, b = inputs[0], inputs[1], attrs["batch_dims"]
    k = idx.shape[-1]
    batch = int(np.prod(data.shape[:b]))
    flat = data.reshape((batch,) + data.shape[b:])
    where = _wrap(idx.reshape(batch, int(np.prod(idx.shape[b:-1])), k),
                  np.asarray(data.shape[b:b + k]))
    picked = flat[(np.arange(batch)[:, None],) + tuple(where[..., j] for j in range(k))]
    return picked.reshape(idx.shape[:-1] + data.shape[b + k:])


GatherND = metaop(
    "GatherND", inputs=("data", "indices: int64"), outputs=("output",), types="T in {all, string}",
    attrs={"batch_dims": int_(0)}, rule=_gathernd_rule, reference=_gathernd_reference,
    role=Role.INJECTIVE, since=(11, 12, 13),
    doc="Gathers slices of data at the index tuples in the last dim of indices.",
)


# --- ScatterND, ScatterElements, Scatter ------------------------------------------------

SCATTER_REDUCTIONS: dict[str, Callable[[np.ndarray, tuple, np.ndarray], None]] = {
    "none": lambda out, where, upd: out.__setitem__(where, upd),
    "add": np.add.at, "mul": np.multiply.at, "max": np.maximum.at, "min": np.minimum.at,
}


def _check_reduction(ctx: InferContext) -> None:
    r = ctx.attrs.get("reduction", "none")
    if r not in SCATTER_REDUCTIONS:
        ctx.fail(f"reduction {r!r} is not one of {', '.join(SCATTER_REDUCTIONS)}")
    if r not in ("none", "add") and ctx.dtype(0).is_string:  # (add concatenates, as ONNX Runtime does)
        raise DTypeError(f"op {ctx.op.name} (node {ctx.node}): reduction {r!r} combines numbers, but data "
                         "is a string tensor; strings take reduction 'none' or 'add' (concatenation)")


def _scatternd_rule(ctx: InferContext) -> list[Any]:
    _check_reduction(ctx)
    s, q, u = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    if s is not None and q is not None and u is not None and q and isinstance(q[-1], int):
        want = tuple(q[:-1]) + tuple(s[q[-1]:])
        if len(u) != len(want) or any(equal(x, y) is Decision.FALSE for x, y in zip(u, want)):
            ctx.fail(f"updates have shape {list(u)} but indices and data ask for {list(want)}")
    return [s]


def _scatternd_reference(inputs: list, attrs: Mapping[str, Any]) -> np.ndarray:
    data, idx, updates = inputs
    k = idx.shape[-1]
    where = tuple(_wrap(idx[..., j], data.shape[j]) for j in range(k))
    out = data.copy()
    SCATTER_REDUCTIONS[attrs["reduction"]](out, where, updates)
    return out


ScatterND = metaop(
    "ScatterND", inputs=("data", "indices: int64", "updates"), outputs=("output",), types="T in {all, string}",
    attrs={"reduction": string("none")}, rule=_scatternd_rule, reference=_scatternd_reference,
    role=Role.INJECTIVE, since=(11, 13, 16, 18),
    doc="A copy of data with slices at the index tuples replaced by (or combined with) updates.",
)


def _scatter_elements_rule(ctx: InferContext) -> list[Any]:
    _check_reduction(ctx)
    s, q, u = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    if s is not None and q is not None:
        if len(s) != len(q):
            ctx.fail(f"indices have rank {len(q)} but data has rank {len(s)}")
        axis_of(ctx, ctx.attrs["axis"], len(s))
    if q is not None and u is not None and (len(q) != len(u) or any(
            equal(x, y) is Decision.FALSE for x, y in zip(q, u))):
        ctx.fail(f"updates have shape {list(u)} but indices have shape {list(q)}")
    return [s]


def _scatter_elements_reference(inputs: list, attrs: Mapping[str, Any]) -> np.ndarray:
    data, idx, updates = inputs
    axis = normalize_axis(attrs["axis"], data.ndim)
    where = list(np.indices(idx.shape, sparse=True))
    where[axis] = _wrap(idx, data.shape[axis])
    out = data.copy()
    SCATTER_REDUCTIONS[attrs.get("reduction", "none")](out, tuple(where), updates)
    return out


ScatterElements = metaop(
    "ScatterElements", inputs=("data", "indices: Tind", "updates"), outputs=("output",),
    types=f"T in {{all, string}}; {INT_INDEX}", attrs={"axis": int_(0), "reduction": string("none")},
    rule=_scatter_elements_rule, reference=_scatter_elements_reference, role=Role.INJECTIVE,
    since=(11, 13, 16, 18),
    doc="output[indices[i][j]][j] = updates[i][j] for axis 0 (combined by reduction).",
)

Scatter = metaop(
    "Scatter", inputs=("data", "indices: Tind", "updates"), outputs=("output",),
    types=f"T in {{all, string}}; {INT_INDEX}", attrs={"axis": int_(0)}, rule=_scatter_elements_rule,
    reference=_scatter_elements_reference, role=Role.INJECTIVE, since=(9,),
    doc="The opset-9 name of ScatterElements (deprecated at 11), without reduction.",
)


# --- NonZero, Compress, ReverseSequence -------------------------------------------------

NonZero = metaop(
    "NonZero", inputs=("X",), outputs=("Y: int64",), types="T in {all, string}",
    rule=lambda ctx: [(ctx.fresh("rank") if ctx.rank(0) is None else ctx.rank(0),
                       ctx.fresh("nonzero"))],
    reference=lambda xs, a: np.array(np.nonzero(xs[0]), dtype=np.int64).reshape(xs[0].ndim, -1),
    role=Role.OPAQUE, since=(9, 13),
    doc="The indices of the non-zero elements, one row per axis (a data-dependent count).",
)


def _compress_rule(ctx: InferContext) -> list[Any]:
    s, cond, axis = ctx.shape(0), ctx.value(1), ctx.attrs["axis"]
    if s is None:
        return [None] if axis is not None else [(ctx.fresh("compress"),)]
    a = None if axis is None else axis_of(ctx, axis, len(s))
    length = s[a] if a is not None else None
    count: Dim = ctx.fresh("compress")
    if cond is not None and cond.dtype != object and (a is None or isinstance(length, int)):
        count = int(np.count_nonzero(cond.reshape(-1)[:length]))
    if a is None:
        return [(count,)]
    return [tuple(s[:a]) + (count,) + tuple(s[a + 1:])]


Compress = metaop(
    "Compress", inputs=("input", "condition: bool"), outputs=("output",), types="T in {all, string}",
    attrs={"axis": int_()}, rule=_compress_rule,
    reference=lambda xs, a: np.compress(xs[1].reshape(-1), xs[0], axis=a["axis"]),
    role=Role.OPAQUE, reads=(1,), since=(9, 11),
    doc="The slices along axis (or the flattened elements) where condition is true.",
)


def _reverse_sequence_rule(ctx: InferContext) -> list[Any]:
    s, b, t = ctx.shape(0), ctx.attrs["batch_axis"], ctx.attrs["time_axis"]
    if {b, t} != {0, 1}:
        ctx.fail(f"batch_axis {b} and time_axis {t} must be 0 and 1, one each")
    if s is not None:
        if len(s) < 2:
            ctx.fail(f"the input must have rank >= 2, got rank {len(s)}")
        lens = ctx.shape(1)
        if lens is not None and (len(lens) != 1 or equal(lens[0], s[b]) is Decision.FALSE):
            ctx.fail(f"sequence_lens has shape {list(lens)} but the batch dim is {s[b]}")
    return [s]


def _reverse_sequence_reference(inputs: list, attrs: Mapping[str, Any]) -> np.ndarray:
    x, lens = inputs
    b, t = attrs["batch_axis"], attrs["time_axis"]
    shape = [1] * x.ndim
    shape[t] = x.shape[t]
    time = np.arange(x.shape[t]).reshape(shape)
    shape[t], shape[b] = 1, x.shape[b]
    n = lens.astype(np.int64).reshape(shape)
    source = np.broadcast_to(np.where(time < n, n - 1 - time, time), x.shape)
    return np.take_along_axis(x, source, axis=t)


ReverseSequence = metaop(
    "ReverseSequence", inputs=("input", "sequence_lens: int64"), outputs=("Y",), types="T in {all, string}",
    attrs={"batch_axis": int_(1), "time_axis": int_(0)}, rule=_reverse_sequence_rule,
    reference=_reverse_sequence_reference, role=Role.INJECTIVE, since=(10,),
    doc="Reverses the first sequence_lens[b] steps along time_axis of each batch entry b.",
)

# --- OneHot, Trilu, EyeLike: masks from index comparisons -------------------------------


def _onehot_rule(ctx: InferContext) -> list[Any]:
    s, depth = ctx.shape(0), ctx.value(1)
    values = ctx.shape(2)
    if values is not None and list(values) != [2] and all(isinstance(d, int) for d in values):
        ctx.fail(f"values must hold 2 elements (off, on), got shape {list(values)}")
    if depth is not None and np.asarray(depth).size != 1:
        ctx.fail(f"depth must hold one element, got {np.asarray(depth).size}")
    d: Dim = ctx.fresh("depth") if depth is None else int(np.asarray(depth).reshape(-1)[0])
    if isinstance(d, int) and d < 1:
        ctx.fail(f"depth is {d}; it must be at least 1")
    if s is None:
        return [None]
    axis = axis_of(ctx, ctx.attrs["axis"], len(s) + 1)
    return [tuple(s[:axis]) + (d,) + tuple(s[axis:])]


def _onehot_semantics(attrs: Mapping[str, Any], shapes: Shapes) -> str:
    """``output[i0, d, i1] = where(wrap(indices[i0, i1]) == d, values[1], values[0])``."""
    rank = len(shapes[0])
    axis = attrs["axis"] + rank + 1 if attrs["axis"] < 0 else attrs["axis"]
    names = [f"i{k}" for k in range(rank)]
    lhs = ", ".join(names[:axis] + ["d"] + names[axis:])
    idx = f"indices[{', '.join(names)}]"
    depth = "depth[]" if len(shapes[1]) == 0 else "depth[0]"
    wrapped = f"where({idx} < 0, {idx} + {depth}, {idx})"
    return f"output[{lhs}] = where({wrapped} == d, values[1], values[0])"


OneHot = metaop(
    "OneHot", inputs=("indices: T1", "depth: T2", "values: T3"), outputs=("output: T3",),
    types="T1 in {numeric}; T2 in {numeric}; T3 in {all, string}", attrs={"axis": int_(-1)},
    rule=_onehot_rule, semantics=_onehot_semantics, role=Role.INJECTIVE, reads=(1,),
    since=(9, 11), doc="values[1] where the index (negative: from depth) equals the new axis's "
                       "position, values[0] elsewhere (also for out-of-range indices).",
)


def _matrix_rule(ctx: InferContext) -> list[Any]:
    if ctx.rank(0) is not None and ctx.rank(0) < 2:
        ctx.fail(f"the input must have rank >= 2, got rank {ctx.rank(0)}")
    return [ctx.shape(0)]


def _trilu_semantics(attrs: Mapping[str, Any], shapes: Shapes) -> str:
    k = "k[]" if len(shapes) > 1 and shapes[1] is not None else "0"
    keep = f"j - i >= {k}" if attrs["upper"] else f"j - i <= {k}"
    return f"output[..., i, j] = where({keep}, input[..., i, j], 0)"


Trilu = metaop(
    "Trilu", inputs=("input", "k?: int64"), outputs=("output",), attrs={"upper": int_(1)},
    rule=_matrix_rule, semantics=_trilu_semantics, role=Role.INJECTIVE, since=(14,),
    doc="Keeps the upper (or lower) triangle above (below) the k-th diagonal; zeros elsewhere.",
)


def _eyelike_rule(ctx: InferContext) -> list[Any]:
    if ctx.rank(0) not in (None, 2):
        ctx.fail(f"the input must have rank 2, got rank {ctx.rank(0)}")
    code = ctx.attrs["dtype"]
    return [TensorType(ctx.dtype(0) if code is None else from_onnx(code), ctx.shape(0))]


EyeLike = metaop(
    "EyeLike", inputs=("input: T1",), outputs=("output: T2",),
    types="T1 in {numeric, bool}; T2 in {numeric, bool}", attrs={"dtype": int_(), "k": int_(0)},
    rule=_eyelike_rule, semantics="output[i, j] = where(j - i == k, 1, 0)", role=Role.INJECTIVE,
    since=(9, 22), doc="Ones on the k-th diagonal of a matrix shaped like the input.",
)

__all__ = [
    "Compress", "EyeLike", "Gather", "GatherElements", "GatherND", "NonZero", "OneHot",
    "ReverseSequence", "Scatter", "ScatterElements", "ScatterND", "Slice", "Trilu",
]
