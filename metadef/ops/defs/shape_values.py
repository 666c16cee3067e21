"""Symbolic *values* of shape-like tensors, and the per-op table that propagates them.

A model exported from PyTorch computes its reshape targets at run time:
``Shape -> Gather -> Unsqueeze -> Concat -> Reshape``. To infer ``[batch, seq, 12, 64]`` for
that Reshape, inference must know that the Concat's output *holds* ``(batch, seq, 12, 64)``.
This module gives such values a representation and a rule table:

- a **symbolic value** is the flat, row-major tuple of a small integer tensor's elements, each a
  :data:`~metadef.shape.Dim` (an ``int`` or a symbolic ``Expr``); its shape is the tensor's type;
- :data:`SHAPE_VALUE_RULES` maps an op name to ``rule(values, types, attrs) -> value | None``
  (``values[i]``: input ``i``'s symbolic value or None; ``types[i]``: its TensorType; ``attrs``:
  the node's resolved attributes). ``None`` means "not a shape value" (the pattern of JAX's
  ``dce_rules[prim]``: a pass looks the op up; nothing dispatches on op names);
- :func:`constant_value` turns a small integer constant into a symbolic value, and
  :func:`value_array` turns a symbolic value back into an array that a shape rule can read
  through ``ctx.value(i)``: ``int64`` when every element is static, else an ``object`` array of
  dims. The shape rules of the tensor family read both (see :func:`input_dims`).

Example (the BERT chain, by hand):
    >>> from metadef.shape import parse_type
    >>> h = parse_type("f32[batch,seq,768]")
    >>> i64 = parse_type("i64[3]")
    >>> shape = SHAPE_VALUE_RULES["Shape"]([None], [h], {"start": 0, "end": None})
    >>> seq = SHAPE_VALUE_RULES["Gather"]([shape, (1,)], [i64, parse_type("i64[]")], {"axis": 0})
    >>> seq1 = SHAPE_VALUE_RULES["Unsqueeze"]([seq, (0,)], [parse_type("i64[]"), None], {})
    >>> SHAPE_VALUE_RULES["Concat"]([(0,), seq1, (12,), (64,)], [i64] * 4, {"axis": 0})
    (0, Expr(seq), 12, 64)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from metadef.core.dtypes import INT_TYPES, from_onnx
from metadef.ops.infer import InferContext
from metadef.shape import Dim, Expr, TensorType, add, floordiv, mul, sub

ShapeValue = tuple[Dim, ...]
ShapeValueRule = Callable[[Sequence["ShapeValue | None"], Sequence["TensorType | None"],
                           Mapping[str, Any]], "ShapeValue | None"]

Shapes = Sequence[Sequence[Dim] | None]
"""Input shapes as a semantics function sees them (None for an absent input)."""

MAX_ELEMENTS = 64
"""Tensors with more elements than this are not treated as shape values."""


# --- representation -------------------------------------------------------------------


def as_dim(x: Any) -> Dim:
    """An element of a shape value: an int or an Expr (numpy integers become ints)."""
    return x if isinstance(x, Expr) else int(x)


def constant_value(array: np.ndarray | None) -> ShapeValue | None:
    """The symbolic value of a small integer constant (None for other constants).

    Example:
        >>> constant_value(np.array([0, -1], np.int64))
        (0, -1)
    """
    if array is None:
        return None
    array = np.asarray(array)
    if array.dtype == object:
        items = array.reshape(-1).tolist()
        if any(isinstance(x, str) for x in items):
            return None  # a string tensor: text, not dims
        return tuple(as_dim(x) for x in items)
    if array.dtype.kind not in "iu" or array.size > MAX_ELEMENTS:
        return None
    return tuple(int(x) for x in array.reshape(-1))


def value_array(value: ShapeValue, shape: Sequence[int] | None = None) -> np.ndarray:
    """``value`` as an array of ``shape`` (default 1-D): int64 when static, else object.

    Example:
        >>> value_array((2, 3)).dtype
        dtype('int64')
    """
    shape = (len(value),) if shape is None else tuple(shape)
    if all(isinstance(d, int) for d in value):
        return np.asarray(value, dtype=np.int64).reshape(shape)
    out = np.empty(len(value), dtype=object)
    out[:] = list(value)
    return out.reshape(shape)


def input_dims(values: Sequence[np.ndarray | None], i: int) -> ShapeValue | None:
    """Input ``i``'s value as a flat tuple of dims, from an integer or an object array."""
    if i >= len(values) or values[i] is None:
        return None
    array = np.asarray(values[i])
    if array.dtype != object and array.dtype.kind not in "iu":
        return None
    return tuple(as_dim(x) for x in array.reshape(-1))


# --- dim arithmetic -------------------------------------------------------------------


def product(dims: Sequence[Dim]) -> Dim:
    """The product of some dims (1 for none)."""
    out: Dim = 1
    for d in dims:
        out = mul(out, d)
    return out


def _atom_dim(atom: Any) -> Expr:
    return Expr(((((atom, 1),), 1),))


def _monomial_quotient(mono: tuple, by: tuple) -> Dim | None:
    powers = dict(mono)
    for atom, p in by:
        if powers.get(atom, 0) < p:
            return None
        powers[atom] -= p
    out: Dim = 1
    for atom, p in powers.items():
        for _ in range(p):
            out = mul(out, _atom_dim(atom))
    return out


def exact_quotient(a: Dim, b: Dim) -> Dim | None:
    """``a / b`` when ``b`` (a single term) divides every term of ``a``; else None.

    Example:
        >>> from metadef.shape import sym
        >>> b, s = sym("batch"), sym("seq")
        >>> exact_quotient(b * s * 768, b * 64)
        Expr(seq*12)
    """
    if isinstance(b, int):
        if b == 0:
            return None
        if isinstance(a, int):
            return a // b if a % b == 0 else None
        return floordiv(a, b) if all(c % b == 0 for _m, c in a.terms) else None
    if a == b:
        return 1
    if len(b.terms) != 1:
        return None
    (b_mono, b_coef), = b.terms
    a_terms = a.terms if isinstance(a, Expr) else ((((), a),) if a else ())
    out: Dim = 0
    for mono, coef in a_terms:
        q = _monomial_quotient(mono, b_mono)
        if q is None or coef % b_coef:
            return None
        out = add(out, mul(q, coef // b_coef))
    return out


def normalize_axis(axis: int, rank: int) -> int | None:
    """``axis`` in ``[0, rank)`` (negative counts from the back), or None when out of range."""
    a = axis + rank if axis < 0 else axis
    return a if 0 <= a < rank else None


# --- helpers for shape rules that read values (shared by the tensor family) -------------


def static_length(ctx: InferContext, i: int) -> int | None:
    """The static length of 1-D input ``i`` (None when absent, unranked or symbolic)."""
    s = ctx.shape(i)
    if s is None or len(s) != 1 or not isinstance(s[0], int):
        return None
    return s[0]


def axis_of(ctx: InferContext, axis: int, rank: int, what: str = "axis") -> int:
    """``axis`` normalized against ``rank``; fails naming the allowed range."""
    a = normalize_axis(axis, rank)
    if a is None:
        ctx.fail(f"{what} {axis} is out of range for rank {rank}",
                 hint=f"use an axis in [{-rank}, {rank - 1}]")
    return a


def axes_of(ctx: InferContext, axes: Sequence[Dim], rank: int, what: str = "axis") -> list[int]:
    """Several distinct axes, normalized; symbolic or repeated axes fail."""
    out: list[int] = []
    for a in axes:
        if not isinstance(a, int):
            ctx.fail(f"{what} {a} is not a constant")
        n = axis_of(ctx, a, rank, what)
        if n in out:
            ctx.fail(f"{what} {a} appears twice")
        out.append(n)
    return out


def fresh_dims(ctx: InferContext, n: int | None, hint: str) -> tuple[Dim, ...] | None:
    """``n`` new symbols (None when ``n`` is unknown): sizes that depend on values."""
    return None if n is None else tuple(ctx.fresh(hint) for _ in range(n))


# --- rules ----------------------------------------------------------------------------


def _rank(t: TensorType | None) -> int | None:
    return None if t is None or t.shape is None else len(t.shape)


def _shape_rule(values: Sequence[ShapeValue | None], types: Sequence[TensorType | None],
                attrs: Mapping[str, Any]) -> ShapeValue | None:
    """Shape: the dims of its input (start/end clamp like a Python slice)."""
    t = types[0]
    if t is None or t.shape is None:
        return None
    return tuple(t.shape[attrs.get("start") or 0:attrs.get("end")])


def _size_rule(values, types, attrs):
    t = types[0]
    return None if t is None or t.shape is None else (product(t.shape),)


def _same_value(values, types, attrs):
    """Reshape, Squeeze, Unsqueeze, Flatten, Identity: the elements are unchanged."""
    return values[0]


def _gather_rule(values, types, attrs):
    data, idx = values[0], values[1] if len(values) > 1 else None
    if data is None or idx is None or _rank(types[0]) != 1 or attrs.get("axis", 0) not in (0, -1):
        return None
    n = len(data)
    out = []
    for i in idx:
        if not isinstance(i, int) or not -n <= i < n:
            return None
        out.append(data[i])
    return tuple(out)


def _concat_rule(values, types, attrs):
    if any(v is None for v in values) or any(_rank(t) != 1 for t in types):
        return None
    return tuple(d for v in values for d in v)


def _slice_rule(values, types, attrs):
    data = values[0]
    if data is None or _rank(types[0]) != 1 or any(v is None for v in values[1:3]):
        return None
    rest = [v for v in values[3:5]]
    axes = rest[0] if rest and rest[0] is not None else (0,)
    steps = rest[1] if len(rest) > 1 and rest[1] is not None else (1,)
    bounds = [*values[1], *values[2], *axes, *steps]
    if len(values[1]) != 1 or not all(isinstance(x, int) for x in bounds) or axes[0] not in (0, -1):
        return None
    if steps[0] == 0:
        return None
    return tuple(data[slice(values[1][0], values[2][0], steps[0])])


def _cast_rule(values, types, attrs):
    to = attrs.get("to")
    return values[0] if to is not None and from_onnx(int(to)) in INT_TYPES else None


def _broadcast_values(values, types) -> list[tuple[ShapeValue, ShapeValue]] | None:
    a, b = values[0], values[1] if len(values) > 1 else None
    if a is None or b is None or any(t is None or t.dtype not in INT_TYPES for t in types[:2]):
        return None
    if len(a) == len(b) and _rank(types[0]) == _rank(types[1]):
        return [(a, b)]
    if len(b) == 1 and _rank(types[1]) in (0, 1):
        return [(a, b * len(a))]
    if len(a) == 1 and _rank(types[0]) in (0, 1):
        return [(a * len(b), b)]
    return None


def _arithmetic(fn: Callable[[Dim, Dim], Dim | None]) -> ShapeValueRule:
    def rule(values, types, attrs):
        pairs = _broadcast_values(values, types)
        if pairs is None:
            return None
        (a, b), = pairs
        out = tuple(fn(x, y) for x, y in zip(a, b))
        return None if any(d is None for d in out) else out
    return rule


def _div(a: Dim, b: Dim) -> Dim | None:
    """Integer Div of non-negative dims (ONNX truncates; dims are >= 0, so it floors)."""
    if isinstance(b, int) and b == 0:
        return None
    if isinstance(a, int) and isinstance(b, int):
        return math.trunc(a / b) if (a < 0) != (b < 0) else a // b
    q = exact_quotient(a, b)
    return q if q is not None else floordiv(a, b)


SHAPE_VALUE_RULES: dict[str, ShapeValueRule] = {
    "Shape": _shape_rule,
    "Size": _size_rule,
    "Gather": _gather_rule,
    "Unsqueeze": _same_value,
    "Squeeze": _same_value,
    "Reshape": _same_value,
    "Flatten": _same_value,
    "Identity": _same_value,
    "Concat": _concat_rule,
    "Slice": _slice_rule,
    "Cast": _cast_rule,
    "Add": _arithmetic(add),
    "Sub": _arithmetic(sub),
    "Mul": _arithmetic(mul),
    "Div": _arithmetic(_div),
}
"""Op name -> rule(values, types, attrs) giving the output's symbolic value, or None."""


__all__ = [
    "MAX_ELEMENTS", "SHAPE_VALUE_RULES", "ShapeValue", "Shapes", "ShapeValueRule", "as_dim", "axes_of",
    "axis_of", "constant_value", "exact_quotient", "fresh_dims", "input_dims", "normalize_axis",
    "product", "static_length", "value_array",
]
