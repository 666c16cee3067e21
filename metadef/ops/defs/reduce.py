"""Reductions and scans: ReduceSum and its nine siblings, ArgMax/ArgMin, CumSum, CumProd,
TopK.

Every ``Reduce*`` op takes its axes as input 1 (``reads=(1,)``); older opsets, where ``axes``
was an attribute (ReduceSum below 13, the others below 18), are moved to that form by
``adapt`` at import. Shape inference is exact when the axes are constant; when they are only
known at run time it gives fresh symbols (of known rank when ``keepdims=1`` or the number of
axes is known).

What a reduction computes, for given axes, is the index expression that
:func:`reduce_expression` writes for one node; ONNX's names are kept (``data`` in,
``reduced`` out) and a reduced axis kept with ``keepdims=1`` is an output variable ``z*``
whose range 1 comes from the output shape::

    >>> reduce_expression("ReduceSum", rank=3, axes=(1,), keepdims=True)
    'reduced[i0, z1, i2] = sum[i1] data[i0, i1, i2]'
    >>> reduce_expression("ReduceL2", rank=2, axes=(0, 1), keepdims=False)
    'reduced[] = sqrt(sum[i0, i1] data[i0, i1] * data[i0, i1])'

Each op's semantics is that expression, written per node from its axes (a constant input, or
the value at run time in the reference backend). A node whose axes are not known, or that
reduces over an empty axis (where the identity value depends on the dtype), has no expression
and runs the op's numpy reference (:func:`reduce_reference`) instead. ArgMax/ArgMin, CumSum,
CumProd and TopK are opaque by nature (a pick, a scan, a sort).

Example:
    >>> from metadef.ops import get_op, infer_types
    >>> from metadef.shape import parse_type
    >>> import numpy as np
    >>> out, = infer_types(get_op("ReduceMean"), "n", [parse_type("f32[batch,3,8]"),
    ...                    parse_type("i64[1]")], {"keepdims": 0}, [None, np.array([-1])])
    >>> str(out)
    'f32[batch,3]'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ml_dtypes
import numpy as np

from metadef.core.dtypes import INT64
from metadef.ops.infer import InferContext
from metadef.ops.interface import AttrSpec, int_
from metadef.ops.metaop import Adapter, MetaOp, metaop
from metadef.ops.strategy import Role
from metadef.shape import Dim, TensorType

Arrays = list[np.ndarray | None]

# ------------------------------------------------------------------------- axes helpers


def normalize_axes(axes: Sequence[int], rank: int, fail: Callable[[str], Any]) -> tuple[int, ...]:
    """Axes in ``[0, rank)``, sorted; ``fail(text)`` is called for out-of-range or repeated ones.

    Example:
        >>> normalize_axes([-1, 0], 3, print)
        (0, 2)
    """
    out = []
    for a in (int(v) for v in axes):
        if not -rank <= a < rank:
            fail(f"axis {a} is out of range for rank {rank} (expected -{rank} <= axis < {rank})")
        out.append(a % rank if rank else a)
    if len(set(out)) != len(out):
        fail(f"axes {list(axes)} name an axis twice")
    return tuple(sorted(out))


def reduced_axes(axes: np.ndarray | None, noop: int, rank: int,
                 fail: Callable[[str], Any]) -> tuple[int, ...] | None:
    """The axes a node reduces (None: the identity, ``noop_with_empty_axes=1`` with no axes)."""
    if axes is None or np.size(axes) == 0:
        return None if noop else tuple(range(rank))
    return normalize_axes(np.asarray(axes).reshape(-1).tolist(), rank, fail)


def reduce_shape(shape: Sequence[Dim], axes: tuple[int, ...] | None,
                 keepdims: int) -> tuple[Dim, ...]:
    """The output shape of a reduction over known axes (None: the identity)."""
    if axes is None:
        return tuple(shape)
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


# ------------------------------------------------------------------ the index expressions

# kind -> the body over one access ``{x}``; ``{sum}``, ``{max}``... are the reduction prefixes
# (``sum[i1] ``), empty when no axis is reduced.
_BODIES: dict[str, str] = {
    "ReduceSum": "{sum}{x}", "ReduceMean": "{mean}{x}", "ReduceMax": "{max}{x}",
    "ReduceMin": "{min}{x}", "ReduceProd": "{prod}{x}", "ReduceL1": "{sum}abs({x})",
    "ReduceL2": "sqrt({sum}{x} * {x})", "ReduceLogSum": "log({sum}{x})",
    "ReduceSumSquare": "{sum}{x} * {x}",
    "ReduceLogSumExp": "m[{kept}] + log({sum}exp({x} - m[{kept}]))",  # m: the max, below
}


def reduce_expression(kind: str, rank: int, axes: Sequence[int] | None, keepdims: bool) -> str:
    """The index expression of one ``Reduce*`` node (axes normalized; None: the identity).

    Example:
        >>> reduce_expression("ReduceLogSumExp", rank=2, axes=(1,), keepdims=False)
        'm[i0] = max[i1] data[i0, i1]; reduced[i0] = m[i0] + log(sum[i1] exp(data[i0, i1] - m[i0]))'
    """
    if axes is None:
        return "reduced[...] = data[...]"
    data = f"data[{', '.join(f'i{k}' for k in range(rank))}]"
    kept = ", ".join(f"i{k}" for k in range(rank) if k not in axes)
    out = ", ".join(f"z{k}" if k in axes else f"i{k}" for k in range(rank)) if keepdims else kept
    if not axes:  # a scalar: each body applied to its one element (log-sum-exp is the identity)
        body = "{x}" if kind == "ReduceLogSumExp" else _BODIES[kind]
        return f"reduced[{out}] = " + body.format(x=data, sum="", mean="", max="", min="", prod="")
    names = ", ".join(f"i{k}" for k in axes)
    prefixes = {op: f"{op}[{names}] " for op in ("sum", "mean", "max", "min", "prod")}
    text = f"reduced[{out}] = " + _BODIES[kind].format(x=data, kept=kept, **prefixes)
    return f"m[{kept}] = {prefixes['max']}{data}; {text}" if kind == "ReduceLogSumExp" else text


def reduce_semantics(kind: str) -> Callable[..., str | None]:
    """The semantics function of one ``Reduce*`` op (None where the reference must run)."""

    def semantics(attrs: Mapping[str, Any], shapes: Sequence[Any], values: Sequence[Any]) -> str | None:
        shape = shapes[0]
        has_axes = len(shapes) > 1 and shapes[1] is not None
        axes_value = values[1] if len(values) > 1 else None
        if shape is None or (has_axes and axes_value is None):
            return None
        rank = len(shape)
        try:
            axes = reduced_axes(axes_value if has_axes else None, attrs["noop_with_empty_axes"], rank,
                                _raise)
        except ValueError:
            return None  # the reference reports the bad axes with the node's name
        if axes is not None and any(shape[a] == 0 for a in axes):
            return None
        return reduce_expression(kind, rank, axes, bool(attrs["keepdims"]))

    return semantics


def _raise(text: str) -> None:
    raise ValueError(text)


# ------------------------------------------------------------------ the numpy references


def _work(x: np.ndarray) -> np.ndarray:
    """float16/bfloat16 are computed in float32 (the result is cast back by the backend)."""
    return x.astype(np.float32) if x.dtype in (np.float16, ml_dtypes.bfloat16) else x


def _lowest(dtype: np.dtype, largest: bool) -> Any:
    """The identity of max (``largest``) or min: ∓inf, the integer limits, False/True."""
    if dtype == np.bool_:
        return not largest
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return info.min if largest else info.max
    return -np.inf if largest else np.inf


def _log_sum_exp(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    """log(sum(exp(x))) shifted by the max; an empty set gives -inf."""
    m = np.max(x, axis=axis, keepdims=True, initial=-np.inf)
    shift = np.where(np.isfinite(m), m, 0)
    out = np.log(np.sum(np.exp(x - shift), axis=axis, keepdims=True)) + shift
    return out if keepdims else np.squeeze(out, axis=axis)


_NUMPY: dict[str, Callable[[np.ndarray, tuple[int, ...], bool], Any]] = {
    "ReduceSum": lambda x, a, k: np.sum(x, axis=a, keepdims=k, dtype=x.dtype),
    "ReduceMean": lambda x, a, k: np.mean(x, axis=a, keepdims=k),
    "ReduceMax": lambda x, a, k: np.max(x, axis=a, keepdims=k, initial=_lowest(x.dtype, True)),
    "ReduceMin": lambda x, a, k: np.min(x, axis=a, keepdims=k, initial=_lowest(x.dtype, False)),
    "ReduceProd": lambda x, a, k: np.prod(x, axis=a, keepdims=k, dtype=x.dtype),
    "ReduceL1": lambda x, a, k: np.sum(np.abs(x), axis=a, keepdims=k, dtype=x.dtype),
    "ReduceL2": lambda x, a, k: np.sqrt(np.sum(x * x, axis=a, keepdims=k, dtype=x.dtype)),
    "ReduceLogSum": lambda x, a, k: np.log(np.sum(x, axis=a, keepdims=k, dtype=x.dtype)),
    "ReduceLogSumExp": _log_sum_exp,
    "ReduceSumSquare": lambda x, a, k: np.sum(x * x, axis=a, keepdims=k, dtype=x.dtype),
}


def reduce_reference(kind: str) -> Callable[[Arrays, Mapping[str, Any]], np.ndarray]:
    """The numpy reference of a ``Reduce*`` op, for axes known only at run time."""
    compute = _NUMPY[kind]

    def reference(inputs: Arrays, attrs: Mapping[str, Any]) -> np.ndarray:
        data = np.asarray(inputs[0])
        axes_value = inputs[1] if len(inputs) > 1 else None

        def fail(text: str) -> None:
            raise ValueError(f"{kind}: {text}")

        axes = reduced_axes(axes_value, attrs["noop_with_empty_axes"], data.ndim, fail)
        if axes is None:
            return data.copy()
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return np.asarray(compute(_work(data), axes, bool(attrs["keepdims"])))
    return reference


# ------------------------------------------------------------------ shape rules


def _reduce_rule(ctx: InferContext) -> list[Any]:
    """Exact with constant axes; fresh symbols (rank known when it can be) otherwise."""
    shape = ctx.shape(0)
    keepdims, noop = ctx.attrs["keepdims"], ctx.attrs["noop_with_empty_axes"]
    if shape is None:
        return [None]
    axes_shape = ctx.shape(1) if ctx.has(1) else (0,)
    value = ctx.value(1) if ctx.has(1) else np.zeros(0, np.int64)
    if value is None and axes_shape is not None and 0 in axes_shape:
        value = np.zeros(0, np.int64)  # an empty axes tensor needs no value
    if value is not None:
        return [reduce_shape(shape, reduced_axes(value, noop, len(shape), ctx.fail), keepdims)]
    if axes_shape is not None and len(axes_shape) != 1:
        ctx.fail(f"axes must be a 1-D tensor, got rank {len(axes_shape)}")
    if keepdims:
        return [tuple(1 if d == 1 else ctx.fresh("reduced") for d in shape)]
    count = axes_shape[0] if axes_shape is not None else None
    if isinstance(count, int) and count <= len(shape):
        return [tuple(ctx.fresh("reduced") for _ in range(len(shape) - count))]
    return [None]


def _axes_to_input(first_input_opset: int) -> Adapter:
    """Before ``first_input_opset`` the axes were an attribute: move them to input 1."""
    def adapt(opset: int, attrs: dict[str, Any], n_inputs: int) -> tuple[dict[str, Any],
                                                                        dict[int, np.ndarray]]:
        if opset >= first_input_opset or "axes" not in attrs:
            return attrs, {}
        attrs = dict(attrs)
        axes = np.asarray(attrs.pop("axes"), dtype=np.int64).reshape(-1)
        return attrs, {1: axes}
    return adapt


# ------------------------------------------------------------------ the Reduce* ops

_REDUCE_ATTRS: dict[str, AttrSpec] = {"keepdims": int_(1), "noop_with_empty_axes": int_(0)}
_REDUCE_TYPES = "T in {float, int32, int64, uint32, uint64}"


def reduce_op(name: str, *, types: str = _REDUCE_TYPES, first_input_opset: int = 18,
              since: tuple[int, ...] = (1, 11, 13, 18), doc: str = "") -> MetaOp:
    """Declare one ``Reduce*`` op: data and optional axes in, one reduced tensor out."""
    return metaop(
        name, inputs=("data", "axes?: int64"), outputs=("reduced",),
        attrs=_REDUCE_ATTRS, types=types, rule=_reduce_rule,
        semantics=reduce_semantics(name), reference=reduce_reference(name),
        role=Role.REDUCTION, reads=(1,),
        since=since, adapt=_axes_to_input(first_input_opset), doc=doc,
    )


ReduceSum = reduce_op("ReduceSum", first_input_opset=13, since=(1, 11, 13),
                      doc="reduced = sum over axes")
ReduceMean = reduce_op("ReduceMean", doc="reduced = mean over axes")
ReduceMax = reduce_op("ReduceMax", types="T in {numeric, bool}", since=(1, 11, 12, 13, 18, 20),
                      doc="reduced = max over axes (-inf, or the dtype's minimum, when empty)")
ReduceMin = reduce_op("ReduceMin", types="T in {numeric, bool}", since=(1, 11, 12, 13, 18, 20),
                      doc="reduced = min over axes (+inf, or the dtype's maximum, when empty)")
ReduceProd = reduce_op("ReduceProd", doc="reduced = product over axes")
ReduceL1 = reduce_op("ReduceL1", doc="reduced = sum |data| over axes")
ReduceL2 = reduce_op("ReduceL2", doc="reduced = sqrt(sum data^2) over axes")
ReduceLogSum = reduce_op("ReduceLogSum", doc="reduced = log(sum data) over axes")
ReduceLogSumExp = reduce_op("ReduceLogSumExp", doc="reduced = log(sum exp(data)) over axes")
ReduceSumSquare = reduce_op("ReduceSumSquare", doc="reduced = sum data^2 over axes")


# ------------------------------------------------------------------ ArgMax, ArgMin


def _arg_rule(ctx: InferContext) -> list[Any]:
    shape = ctx.shape(0)
    if shape is None:
        return [TensorType(INT64, None)]
    if not shape:
        ctx.fail("the input must have rank 1 or more")
    axis, = normalize_axes([ctx.attrs["axis"]], len(shape), ctx.fail)
    if shape[axis] == 0:
        ctx.fail(f"axis {axis} has size 0: there is no element to pick")
    return [TensorType(INT64, reduce_shape(shape, (axis,), ctx.attrs["keepdims"]))]


def arg_reference(largest: bool) -> Callable[[Arrays, Mapping[str, Any]], np.ndarray]:
    """np.argmax/argmin; ``select_last_index`` picks the last of equal values (by flipping)."""
    pick = np.argmax if largest else np.argmin

    def reference(inputs: Arrays, attrs: Mapping[str, Any]) -> np.ndarray:
        data = np.asarray(inputs[0])
        axis = attrs["axis"] % data.ndim
        if attrs["select_last_index"]:
            index = data.shape[axis] - 1 - pick(np.flip(data, axis), axis=axis, keepdims=True)
        else:
            index = pick(data, axis=axis, keepdims=True)
        index = index.astype(np.int64)
        return index if attrs["keepdims"] else np.squeeze(index, axis=axis)
    return reference


_ARG_ATTRS: dict[str, AttrSpec] = {"axis": int_(0), "keepdims": int_(1),
                                   "select_last_index": int_(0)}

ArgMax = metaop("ArgMax", inputs=("data",), outputs=("reduced: int64",), attrs=_ARG_ATTRS,
                types="T in {numeric}", rule=_arg_rule, reference=arg_reference(True),
                role=Role.REDUCTION, since=(1, 11, 12, 13),
                doc="the index of the largest element along axis (the first, or the last)")
ArgMin = metaop("ArgMin", inputs=("data",), outputs=("reduced: int64",), attrs=_ARG_ATTRS,
                types="T in {numeric}", rule=_arg_rule, reference=arg_reference(False),
                role=Role.REDUCTION, since=(1, 11, 12, 13),
                doc="the index of the smallest element along axis (the first, or the last)")


# ------------------------------------------------------------------ CumSum


def _cumsum_rule(ctx: InferContext) -> list[Any]:
    shape, axis = ctx.shape(0), ctx.value(1)
    if ctx.shape(1) is not None and len(ctx.shape(1)) > 1:
        ctx.fail(f"axis must be a scalar or a 1-element tensor, got rank {len(ctx.shape(1))}")
    if shape is not None and axis is not None:
        normalize_axes(np.asarray(axis).reshape(-1)[:1].tolist(), len(shape), ctx.fail)
    return [shape]


def scan_reference(accumulate: Callable[..., np.ndarray], identity: int) -> Callable[..., np.ndarray]:
    """The numpy reference of a scan along a run-time axis: ``accumulate`` is ``np.cumsum`` or
    ``np.cumprod``, ``identity`` what an exclusive scan starts from (0 or 1).

    Example:
        >>> attrs = {"exclusive": 1, "reverse": 0}
        >>> scan_reference(np.cumprod, 1)([np.array([2, 3, 4]), np.array(0)], attrs)
        array([1, 2, 6])
    """

    def reference(inputs: Arrays, attrs: Mapping[str, Any]) -> np.ndarray:
        # Opaque: a scan's comprehension (sum[j] x[j] * (j <= i)) is quadratic in the axis
        # length, and the axis is a run-time input; numpy's accumulate is the linear scan.
        x = np.asarray(inputs[0])
        axis = int(np.asarray(inputs[1]).reshape(-1)[0]) % max(x.ndim, 1)
        work = _work(x)
        if attrs["reverse"]:
            work = np.flip(work, axis)
        out = accumulate(work, axis=axis, dtype=work.dtype)
        if attrs["exclusive"]:  # shift by one: each element scans what comes strictly before it
            out = np.concatenate([np.full_like(np.take(out, [0], axis=axis), identity),
                                  np.take(out, np.arange(x.shape[axis] - 1), axis=axis)], axis=axis)
        return np.flip(out, axis) if attrs["reverse"] else out

    return reference


_SCAN_TYPES = "T in {float, int32, int64, uint32, uint64}; Tind in {int32, int64}"
CumSum = metaop("CumSum", inputs=("x", "axis: Tind"), outputs=("y",),
                attrs={"exclusive": int_(0), "reverse": int_(0)}, types=_SCAN_TYPES,
                rule=_cumsum_rule, reference=scan_reference(np.cumsum, 0), role=Role.OPAQUE,
                reads=(1,), since=(11, 14),
                doc="running sums along axis (exclusive: strictly before; reverse: from the end)")
CumProd = metaop("CumProd", inputs=("x", "axis: Tind"), outputs=("y",),
                 attrs={"exclusive": int_(0), "reverse": int_(0)}, types=_SCAN_TYPES,
                 rule=_cumsum_rule, reference=scan_reference(np.cumprod, 1), role=Role.OPAQUE,
                 reads=(1,), since=(26,),
                 doc="running products along axis (exclusive: strictly before; reverse: from "
                     "the end)")


# ------------------------------------------------------------------ TopK


def _topk_rule(ctx: InferContext) -> list[Any]:
    shape, k = ctx.shape(0), ctx.value(1)
    if ctx.shape(1) is not None and ctx.shape(1) not in ((1,), ()):
        ctx.fail(f"K must be a 1-element tensor, got shape {list(ctx.shape(1))}")
    if shape is None:
        return [None, TensorType(INT64, None)]
    if not shape:
        ctx.fail("the input must have rank 1 or more")
    axis, = normalize_axes([ctx.attrs["axis"]], len(shape), ctx.fail)
    if k is None:
        size: Dim = ctx.fresh("k")
    else:
        size = int(np.asarray(k).reshape(-1)[0])
        if size < 0 or (isinstance(shape[axis], int) and size > shape[axis]):
            ctx.fail(f"K = {size} must be in [0, {shape[axis]}] (the size of axis {axis})")
    out = tuple(size if i == axis else d for i, d in enumerate(shape))
    return [out, TensorType(INT64, out)]


def _sorted_order(x: np.ndarray, axis: int, largest: bool) -> np.ndarray:
    """The positions along ``axis`` in TopK's order: by value (descending when ``largest``),
    ties by the lower position (stable sorts; descending as a stable ascending sort of the
    flipped array)."""
    if not largest:
        return np.argsort(x, axis=axis, kind="stable")
    return x.shape[axis] - 1 - np.flip(np.argsort(np.flip(x, axis), axis=axis, kind="stable"), axis)


def _topk_partial(x: np.ndarray, k: int, axis: int, largest: bool) -> tuple[np.ndarray, np.ndarray]:
    """TopK without sorting whole rows: each row's k-th value by ``np.partition`` (linear), the
    elements beyond it and, of those equal to it, the first by position (TopK's tie rule), then
    only those k sorted. For numbers with no NaN (the caller checks)."""
    n = x.shape[axis]
    rows = np.moveaxis(x, axis, -1).reshape(-1, n)
    kth = np.partition(rows, n - k if largest else k - 1, axis=1)[:, n - k if largest else k - 1, None]
    beyond = rows > kth if largest else rows < kth
    equal = rows == kth
    need = k - beyond.sum(axis=1, keepdims=True)
    chosen = beyond | equal
    tied = np.flatnonzero(equal.sum(axis=1, keepdims=True) > need)  # rows with more ties than room
    if tied.size:  # (only there: the first of the equal ones, by position)
        chosen[tied] = beyond[tied] | (equal[tied] & (np.cumsum(equal[tied], axis=1) <= need[tied]))
    index = np.nonzero(chosen)[1].reshape(-1, k)  # (each row's k, in position order)
    values = np.take_along_axis(rows, index, axis=1)
    order = _sorted_order(values, 1, largest)
    index, values = np.take_along_axis(index, order, 1), np.take_along_axis(values, order, 1)
    shape = np.moveaxis(x, axis, -1).shape[:-1] + (k,)
    return (np.moveaxis(values.reshape(shape), -1, axis), np.moveaxis(index.reshape(shape), -1, axis))


def _topk_reference(inputs: Arrays, attrs: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    # Opaque: sorting is not a comprehension. Stable sorts break ties by the lower index.
    x = np.asarray(inputs[0])
    k = int(np.asarray(inputs[1]).reshape(-1)[0])
    axis = attrs["axis"] % x.ndim
    largest = bool(attrs["largest"])
    if 0 < k <= x.shape[axis] // 4 and x.dtype.kind in "iuf" and not (x.dtype.kind == "f" and np.isnan(x).any()):
        values, index = _topk_partial(x, k, axis, largest)  # (a few of many: 64 rows of 1000, k = 5: 40x faster)
        return values, index.astype(np.int64)
    index = np.take(_sorted_order(x, axis, largest), np.arange(k), axis=axis)
    return np.take_along_axis(x, index, axis=axis), index.astype(np.int64)


def _k_to_input(opset: int, attrs: dict[str, Any], n_inputs: int) -> tuple[dict[str, Any],
                                                                           dict[int, np.ndarray]]:
    """Before opset 10, K was the attribute ``k``: move it to input 1."""
    if opset >= 10 or "k" not in attrs:
        return attrs, {}
    attrs = dict(attrs)
    return attrs, {1: np.array([attrs.pop("k")], dtype=np.int64)}


TopK = metaop("TopK", inputs=("X", "K: int64"), outputs=("Values", "Indices: int64"),
              attrs={"axis": int_(-1), "largest": int_(1), "sorted": int_(1)},
              types="T in {numeric}", rule=_topk_rule, reference=_topk_reference,
              role=Role.OPAQUE, reads=(1,), since=(1, 10, 11), adapt=_k_to_input,
              doc="the K largest (or smallest) elements along axis and their indices")
