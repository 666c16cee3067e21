"""Labelled arrays: numpy values whose axes are named by index variables.

The reference evaluator keeps every intermediate value as a :class:`Labelled`: an array plus
one label per axis (an index variable, or ``...k`` for the k-th batch axis of an ellipsis
block, counted from the right). Every labelled axis has the full extent of its variable
(broadcast axes are stride-0 views), so combining values is just aligning labels.
Python scalars (literals and params) stay Python scalars, so numpy 2's weak-scalar promotion
applies: ``float32 array * 0.5`` stays float32.

Example:
    >>> import numpy as np
    >>> a = Labelled(np.arange(3.0), ("i",))
    >>> b = Labelled(np.arange(2.0), ("j",))
    >>> out = apply(np.multiply, a, b)
    >>> out.labels, out.value.shape
    (('i', 'j'), (3, 2))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import ml_dtypes
import numpy as np

from metadef.core.errors import SemanticsError
from metadef.ops.semantics import Access, Affine

Scalar = int | float | bool | complex
ML_FLOATS = frozenset(np.dtype(getattr(ml_dtypes, name)) for name in dir(ml_dtypes)
                      if name == "bfloat16" or name.startswith("float8_"))
"""The float dtypes ml_dtypes adds to numpy (bfloat16, the float8 variants)."""
LOW_FLOATS = ML_FLOATS | {np.dtype(np.float16)}
"""Floats narrower than float32 (float16, bfloat16, the float8s): their products are taken and
summed in float32, rounded once."""
Params = Mapping[str, Any]


def ellipsis_label(k: int) -> str:
    """The label of the k-th axis of an ellipsis block, counted from the right (0 = last)."""
    return f"...{k}"


@dataclass(frozen=True)
class Labelled:
    """A value with named axes; ``labels`` is empty for scalars (Python or numpy)."""

    value: Any
    labels: tuple[str, ...] = ()

    @property
    def is_weak(self) -> bool:
        """True for Python scalars (literals, params), which do not upcast arrays."""
        return isinstance(self.value, Scalar)


def align(value: Labelled, labels: Sequence[str]) -> Any:
    """``value`` transposed to ``labels`` order, with size-1 axes for labels it lacks."""
    if not value.labels:
        return value.value
    present = [lab for lab in labels if lab in value.labels]
    array = np.transpose(value.value, [value.labels.index(lab) for lab in present])
    return array[tuple(slice(None) if lab in value.labels else None for lab in labels)]


def union_labels(values: Sequence[Labelled]) -> tuple[str, ...]:
    """All labels of ``values``, in order of first appearance."""
    return tuple(dict.fromkeys(lab for v in values for lab in v.labels))


def apply(func: Callable[..., Any], *args: Labelled) -> Labelled:
    """Call a numpy function on label-aligned arguments; Python scalars in, Python scalar out.

    Example:
        >>> apply(np.add, Labelled(1), Labelled(2)).value
        3
    """
    labels = union_labels(args)
    result = func(*_pin_weak_scalars(args, [align(a, labels) for a in args]))
    if all(a.is_weak for a in args) and isinstance(result, np.generic):
        result = result.item()
    return Labelled(result, labels)


def _pin_weak_scalars(args: Sequence[Labelled], values: list[Any]) -> list[Any]:
    """Give Python numbers the dtype of an ml_dtypes float array beside them.

    numpy's weak-scalar rule keeps ``float16 * 0.5`` in float16, but ml_dtypes' own loops
    would turn ``bfloat16 * 0.5`` into float32; this keeps it bfloat16 as well.
    """
    ml = [np.asarray(a.value).dtype for a in args if not a.is_weak]
    ml = [d for d in ml if d in ML_FLOATS]
    if not ml:
        return values
    return [np.asarray(v, ml[0])[()] if a.is_weak and not isinstance(v, bool) else v
            for a, v in zip(args, values)]


def broadcast_full(value: Labelled, labels: Sequence[str], ranges: Mapping[str, int]) -> np.ndarray:
    """``value`` as an array with exactly ``labels`` (a superset of its own), full extents."""
    missing = [lab for lab in value.labels if lab not in labels]
    if missing:
        raise SemanticsError(f"internal: labels {missing} are not among {list(labels)}")
    array = np.asarray(align(value, labels))
    return np.broadcast_to(array, tuple(ranges[lab] for lab in labels))


# ---------------------------------------------------------------------- strided accesses


@dataclass(frozen=True)
class _DimRead:
    """How one axis of a tensor is indexed: ``const + sum(coef * label)``."""

    const: int
    coefs: tuple[tuple[str, int], ...]
    bare: bool  # a whole-index variable or an ellipsis axis (broadcasts when the dim is 1)

    def bounds(self, ranges: Mapping[str, int]) -> tuple[int, int]:
        lo = hi = self.const
        for lab, c in self.coefs:
            span = c * (ranges[lab] - 1)
            lo, hi = lo + min(0, span), hi + max(0, span)
        return lo, hi


def linear_form(idx: Affine, params: Params, where: str) -> tuple[int, dict[str, int]]:
    """``idx.linear_form`` with params checked: present and integer."""
    for name in idx.params():
        value = params.get(name)
        if value is None:
            raise SemanticsError(f"{where}: param {name} in index {idx} has no value")
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise SemanticsError(
                f"{where}: param {name} in index {idx} must be an integer, got {value!r}")
    return idx.linear_form({k: int(params[k]) for k in idx.params()})


def dim_reads(access: Access, shape: tuple[int, ...], params: Params,
              where: str) -> list[_DimRead]:
    """One :class:`_DimRead` per axis of the tensor (the ellipsis block expanded)."""
    reads: list[_DimRead] = []
    block = len(shape) - (len(access.indices) - 1)
    for idx in access.indices:
        if isinstance(idx, Affine):
            const, coefs = linear_form(idx, params, where)
            reads.append(_DimRead(const, tuple(coefs.items()), idx.var_name is not None))
        else:
            reads += [_DimRead(0, ((ellipsis_label(k), 1),), True)
                      for k in range(block - 1, -1, -1)]
    return reads


def _broadcast(read: _DimRead) -> _DimRead:
    return replace(read, coefs=tuple((lab, 0) for lab, _ in read.coefs))


def _fill_scalar(fill: Any, dtype: np.dtype, where: str) -> Any:
    """The fill value in ``dtype``: +-inf saturate for integers, NaN is refused there."""
    if dtype.kind in "iu" and isinstance(fill, float):
        if np.isnan(fill):
            raise SemanticsError(f"{where}: cannot pad an integer tensor with NaN")
        info = np.iinfo(dtype)
        return int(min(max(fill, info.min), info.max))
    return np.asarray(fill).astype(dtype)


def strided_view(array: np.ndarray, access: Access, ranges: Mapping[str, int], params: Params,
                 fill: Any = 0, where: str = "") -> Labelled:
    """Read ``access`` from ``array`` without copying elements (except once to pad).

    Affine indices become strided axes, one per variable; repeated variables become a
    diagonal (their strides add); an out-of-range read gives ``fill``. The result's axes
    carry every variable's full range.

    Example:
        >>> from metadef.ops.semantics import parse_semantics
        >>> acc = parse_semantics("Y[p, r] = X[2*p + r - 1]").statements[0].rhs
        >>> strided_view(np.arange(1, 6), acc, {"p": 3, "r": 2}, {}).value.tolist()
        [[0, 1], [2, 3], [4, 5]]
    """
    if array.ndim == 0:
        return Labelled(array, ())
    reads = [_broadcast(r) if r.bare and size == 1 else r  # numpy's length-1 broadcasting
             for r, size in zip(dim_reads(access, array.shape, params, where), array.shape)]
    labels = tuple(dict.fromkeys(lab for r in reads for lab, _ in r.coefs))
    shape = tuple(ranges[lab] for lab in labels)
    if 0 in shape:
        return Labelled(np.zeros(shape, array.dtype), labels)
    bounds = [r.bounds(ranges) for r in reads]
    if any(hi < 0 or lo >= size for (lo, hi), size in zip(bounds, array.shape)):
        return Labelled(np.full(shape, _fill_scalar(fill, array.dtype, where)), labels)
    pads = [(max(0, -lo), max(0, hi - (size - 1))) for (lo, hi), size in zip(bounds, array.shape)]
    if any(before or after for before, after in pads):
        array = np.pad(array, pads, constant_values=_fill_scalar(fill, array.dtype, where))
    origin = []
    for r, (lo, hi), (before, _), size in zip(reads, bounds, pads, array.shape):
        if not (lo + before >= 0 and hi + before < size):  # never read outside the buffer
            raise SemanticsError(f"{where}: internal: access {access} escapes its padding")
        origin.append(slice(r.const + before, r.const + before + 1))
    strides = dict.fromkeys(labels, 0)
    for r, stride in zip(reads, array.strides):
        for lab, c in r.coefs:
            strides[lab] += c * stride
    base = array[tuple(origin)]
    # as_strided goes through __array_interface__, whose typestr ('<f1') numpy cannot read back
    # for ml_dtypes' float8 types: stride over same-sized unsigned ints, then view back.
    raw = base.view(f"u{base.itemsize}") if base.dtype.kind == "V" or (base.dtype.str[1] == "f" \
        and base.dtype.itemsize == 1) else base
    view = np.lib.stride_tricks.as_strided(raw, shape, tuple(strides[lab] for lab in labels),
                                           writeable=False)
    return Labelled(view.view(base.dtype) if raw is not base else view, labels)


def inbounds_mask(array: np.ndarray, access: Access, ranges: Mapping[str, int],
                  params: Params, where: str = "") -> Labelled:
    """1 (in the tensor's dtype) where ``access`` reads inside ``array``, 0 where it pads.

    Example:
        >>> from metadef.ops.semantics import parse_semantics
        >>> acc = parse_semantics("Y[p] = X[p - 1]").statements[0].rhs
        >>> inbounds_mask(np.ones(3), acc, {"p": 3}, {}).value.tolist()
        [0.0, 1.0, 1.0]
    """
    mask = Labelled(True)
    for read, size in zip(dim_reads(access, array.shape, params, where), array.shape):
        if read.bare and (size == 1 or ranges[read.coefs[0][0]] <= size):
            continue
        index = Labelled(read.const)
        for lab, c in read.coefs:
            index = apply(np.add, index, Labelled(np.arange(ranges[lab]) * c, (lab,)))
        inside = apply(np.logical_and, apply(np.greater_equal, index, Labelled(0)),
                       apply(np.less, index, Labelled(size)))
        mask = apply(np.logical_and, mask, inside)
    return Labelled(np.asarray(mask.value).astype(array.dtype), mask.labels)


__all__ = ["ML_FLOATS", "Labelled", "align", "apply", "broadcast_full", "dim_reads", "ellipsis_label",
           "inbounds_mask", "linear_form", "strided_view"]
