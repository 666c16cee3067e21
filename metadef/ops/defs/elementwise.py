"""Elementwise and broadcast arithmetic, math functions, comparisons, logic, bitwise ops,
Where, Identity, Cast and CastLike.

Each op is one declaration; ``unary`` and ``binary`` only shorten the common cases. Ops whose
expression depends on an attribute or on how many inputs a node has (Mod, IsInf, Cast, Max,
Sum, ...) build it per node with a small semantics function.

Example:
    >>> from metadef.ops import get_op
    >>> get_op("Add").semantics.expression
    'C[...] = A[...] + B[...]'
    >>> get_op("Max").semantics.instantiate({}, [(2, 3), (3,), ()])[0].statements[0].rhs.func
    'max'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from metadef.core.dtypes import FLOAT8E8M0, STRING, DType, dtype, from_numpy, from_onnx
from metadef.core.errors import ShapeError, UnsupportedOpError
from metadef.ops.defs.cast_e8m0 import ROUND_MODES, to_float8e8m0
from metadef.ops.defs.cast_string import format_numbers, parse_floats, parse_integers
from metadef.ops.infer import InferContext
from metadef.ops.interface import REQUIRED, AttrSpec, int_, string
from metadef.ops.metaop import BROADCAST_ALL, SAME_AS_FIRST, Adapter, MetaOp, metaop
from metadef.ops.semantics import CAST_DTYPE_NAMES
from metadef.ops.strategy import Role
from metadef.shape import Dim, TensorType, broadcast_shapes, format_shape

Shapes = Sequence[Sequence[Dim] | None]

# --- old-opset forms --------------------------------------------------------------------


@dataclass(frozen=True)
class TrailingAxes:
    """An adapter's request for an input: append ``count`` axes of size 1 (the importer adds an
    ``Unsqueeze``), so that numpy broadcasting aligns the input where an old opset's explicit
    ``axis`` put it.

    Example:
        >>> TrailingAxes(2)
        TrailingAxes(count=2)
    """

    count: int


def legacy_attrs(opset: int, attrs: dict[str, Any], n_inputs: int, *,
                 types: Sequence[TensorType | None] = (),
                 ) -> tuple[dict[str, Any], dict[int, np.ndarray | TrailingAxes]]:
    """Adapter for ops that had opset-1 bookkeeping and pre-7 explicit broadcasting.

    ``consumed_inputs`` (opset < 6) never changed numerics: dropped. ``broadcast`` (opset < 7)
    is implied by numpy broadcasting. An explicit ``axis`` matches B's shape against A's dims
    from ``axis`` on: B gets as many trailing axes of size 1 as A has after that match, which
    the input ``types`` (A's and B's ranks) tell; without them the node is rejected by name.

    Example:
        >>> legacy_attrs(1, {"consumed_inputs": (0,), "broadcast": 1}, 2)
        ({}, {})
        >>> from metadef.shape import parse_type
        >>> legacy_attrs(6, {"broadcast": 1, "axis": 1}, 2,
        ...              types=[parse_type("f32[2,3,4,5]"), parse_type("f32[3]")])
        ({}, {1: TrailingAxes(count=2)})
    """
    out = dict(attrs)
    if opset < 6:
        out.pop("consumed_inputs", None)
    if opset >= 7 or "axis" not in out:
        if opset < 7:
            out.pop("broadcast", None)
        return out, {}
    axis = out.pop("axis")
    broadcast = out.pop("broadcast", 0)
    ranks = [t.rank if t is not None and t.shape is not None else None for t in types[:2]]
    if not broadcast:
        return out, {}  # axis only matters with broadcast=1: the shapes are equal
    if len(ranks) < 2 or None in ranks:
        raise UnsupportedOpError(
            f"the opset-{opset} attribute 'axis' of legacy broadcasting (axis={axis}) needs the "
            "ranks of both inputs, which are not known here: re-export the model with opset >= 7, "
            "where broadcasting follows numpy")
    rank_a, rank_b = ranks
    start = axis + rank_a if axis < 0 else axis
    count = rank_a - start - rank_b
    if count < 0 or start < 0:
        raise UnsupportedOpError(
            f"legacy broadcasting (opset {opset}) with axis={axis}: B of rank {rank_b} does not fit "
            f"in A of rank {rank_a} from axis {axis} on")
    return out, ({1: TrailingAxes(count)} if count else {})


def broadcast_rule(ctx: InferContext) -> list[Any]:
    """numpy broadcasting of every present input, as a callable rule."""
    shapes = [ctx.shape(i) for i in range(len(ctx.inputs)) if ctx.has(i)]
    if any(s is None for s in shapes):
        return [None]
    try:
        return [broadcast_shapes(*shapes)[0]]
    except ShapeError:
        ctx.fail("shapes " + " and ".join(format_shape(s) for s in shapes) + " cannot broadcast",
                 "every pair of trailing dims must be equal or 1")


def unary(name: str, body: str, *, types: str = "T in {float}", out: str = "T",
          attrs: Mapping[str, AttrSpec] | None = None, since: tuple[int, ...] = (1,),
          adapt: Adapter | None = legacy_attrs, doc: str = "") -> MetaOp:
    """An elementwise op ``Y = f(X)``; ``body`` is written over ``X[...]`` and may name the
    op's scalar attributes (``alpha * X[...]``)."""
    return metaop(name, inputs=("X",), outputs=(f"Y: {out}",), attrs=attrs, types=types,
                  rule=SAME_AS_FIRST, semantics=f"Y[...] = {body}", role=Role.ELEMENTWISE,
                  since=since, adapt=adapt, doc=doc)


def binary(name: str, body: str, *, types: str = "T in {numeric}", out: str = "T",
           since: tuple[int, ...] = (1,), adapt: Adapter | None = legacy_attrs,
           doc: str = "") -> MetaOp:
    """A broadcasting op ``C = f(A, B)``; ``body`` is written over ``A[...]`` and ``B[...]``."""
    return metaop(name, inputs=("A", "B"), outputs=(f"C: {out}",), types=types, rule=BROADCAST_ALL,
                  semantics=f"C[...] = {body}", role=Role.BROADCAST, since=since, adapt=adapt,
                  doc=doc)


# --- arithmetic -------------------------------------------------------------------------

Add = binary("Add", "A[...] + B[...]", since=(1, 6, 7, 13, 14))
Sub = binary("Sub", "A[...] - B[...]", since=(1, 6, 7, 13, 14))
Mul = binary("Mul", "A[...] * B[...]", since=(1, 6, 7, 13, 14))
Div = binary("Div", "A[...] / B[...]", since=(1, 6, 7, 13, 14),
             doc="Integer division truncates toward zero, as in ONNX Runtime.")

Pow = metaop(
    "Pow", inputs=("X", "Y: T1"), outputs=("Z",),
    types="T in {float, int32, int64}; T1 in {numeric}",
    rule=BROADCAST_ALL, semantics="Z[...] = pow(X[...], Y[...])",
    role=Role.BROADCAST, since=(1, 7, 12, 13, 15), adapt=legacy_attrs,
    doc="The exponent may have another type than the base; the result has the base's type.",
)

# fmod=1 is C's remainder, with the sign of the dividend: on magnitudes numpy's mod is C's
# fmod (exactly, for floats too), and the sign is the dividend's.
_FMOD = "C[...] = sign(A[...]) * (abs(A[...]) % abs(B[...]))"


def _mod_semantics(attrs: Mapping[str, Any], shapes: Shapes) -> str:
    """``fmod=0``: the sign of the divisor (numpy's mod); ``fmod=1``: the sign of the dividend."""
    return _FMOD if attrs.get("fmod") else "C[...] = A[...] % B[...]"


Mod = metaop(
    "Mod", inputs=("A", "B"), outputs=("C",), attrs={"fmod": int_(0)},
    types="T in {numeric}", rule=BROADCAST_ALL, semantics=_mod_semantics,
    role=Role.BROADCAST, since=(10, 13),
)

# --- math functions ---------------------------------------------------------------------

Sqrt = unary("Sqrt", "sqrt(X[...])", since=(1, 6, 13))
Exp = unary("Exp", "exp(X[...])", since=(1, 6, 13))
Log = unary("Log", "log(X[...])", since=(1, 6, 13))
Neg = unary("Neg", "-X[...]", types="T in {float, sint}", since=(1, 6, 13))
Abs = unary("Abs", "abs(X[...])", types="T in {numeric}", since=(1, 6, 13))
Floor = unary("Floor", "floor(X[...])", since=(1, 6, 13))
Ceil = unary("Ceil", "ceil(X[...])", since=(1, 6, 13))
Round = unary("Round", "round(X[...])", since=(11, 22), doc="Halves round to even.")
Reciprocal = unary("Reciprocal", "reciprocal(X[...])", since=(1, 6, 13))
Sign = unary("Sign", "sign(X[...])", types="T in {numeric}", since=(9, 13))
Erf = unary("Erf", "erf(X[...])", types="T in {numeric}", since=(9, 13))
Sin = unary("Sin", "sin(X[...])", since=(7, 22))
Cos = unary("Cos", "cos(X[...])", since=(7, 22))
Tan = unary("Tan", "tan(X[...])", since=(7, 22))
Asin = unary("Asin", "asin(X[...])", since=(7, 22))
Acos = unary("Acos", "acos(X[...])", since=(7, 22))
Atan = unary("Atan", "atan(X[...])", since=(7, 22))
Sinh = unary("Sinh", "sinh(X[...])", since=(9, 22))
Cosh = unary("Cosh", "cosh(X[...])", since=(9, 22))
Asinh = unary("Asinh", "asinh(X[...])", since=(9, 22))
Acosh = unary("Acosh", "acosh(X[...])", since=(9, 22))
Atanh = unary("Atanh", "atanh(X[...])", since=(9, 22))

# --- variadic: Max, Min, Sum, Mean ------------------------------------------------------


def _variadic(combine: str, *, mean: bool = False):
    """A semantics function folding ``data_0, data_1, ...`` with ``combine`` (a function
    name such as ``max``, or an operator such as ``+``)."""
    def semantics(attrs: Mapping[str, Any], shapes: Shapes) -> str:
        terms = [f"data_{i}[...]" for i in range(len(shapes))]
        body = terms[0]
        for t in terms[1:]:
            body = f"{combine}({body}, {t})" if combine.isalpha() else f"{body} {combine} {t}"
        if mean and len(terms) > 1:
            body = f"({body}) / {len(terms)}"
        return f"Y[...] = {body}"
    return semantics


def _variadic_op(name: str, combine: str, types: str, since: tuple[int, ...],
                 mean: bool = False) -> MetaOp:
    return metaop(name, inputs=("data*",), outputs=("Y",), types=types, rule=BROADCAST_ALL,
                  semantics=_variadic(combine, mean=mean), role=Role.BROADCAST, since=since,
                  adapt=legacy_attrs)


Max = _variadic_op("Max", "max", "T in {numeric}", (1, 6, 8, 12, 13))
Min = _variadic_op("Min", "min", "T in {numeric}", (1, 6, 8, 12, 13))
Sum = _variadic_op("Sum", "+", "T in {float}", (1, 6, 8, 13))
Mean = _variadic_op("Mean", "+", "T in {float}", (1, 6, 8, 13), mean=True)

# --- comparisons and logic --------------------------------------------------------------

Equal = binary("Equal", "A[...] == B[...]", types="T in {numeric, bool, string}", out="bool",
               since=(1, 7, 11, 13, 19))
Less = binary("Less", "A[...] < B[...]", out="bool", since=(1, 7, 9, 13))
LessOrEqual = binary("LessOrEqual", "A[...] <= B[...]", out="bool", since=(12, 16))
Greater = binary("Greater", "A[...] > B[...]", out="bool", since=(1, 7, 9, 13))
GreaterOrEqual = binary("GreaterOrEqual", "A[...] >= B[...]", out="bool", since=(12, 16))

Not = unary("Not", "not X[...]", types="T in {bool}")
And = binary("And", "A[...] and B[...]", types="T in {bool}", since=(1, 7))
Or = binary("Or", "A[...] or B[...]", types="T in {bool}", since=(1, 7))
Xor = binary("Xor", "A[...] != B[...]", types="T in {bool}", since=(1, 7))

IsNaN = unary("IsNaN", "isnan(X[...])", types="T in {float, float8}", out="bool",
              since=(9, 13, 20))


def _isinf_semantics(attrs: Mapping[str, Any], shapes: Shapes) -> str:
    """Which infinities count: both (the default), one sign, or none."""
    body = {(1, 1): "isinf(X[...])", (1, 0): "X[...] == -inf", (0, 1): "X[...] == inf",
            (0, 0): "isnan(X[...]) and not isnan(X[...])"}
    return f"Y[...] = {body[bool(attrs['detect_negative']), bool(attrs['detect_positive'])]}"


IsInf = metaop(
    "IsInf", inputs=("X",), outputs=("Y: bool",),
    attrs={"detect_negative": int_(1), "detect_positive": int_(1)},
    types="T in {float, float8}", rule=SAME_AS_FIRST, semantics=_isinf_semantics,
    role=Role.ELEMENTWISE, since=(10, 20),
)

Where = metaop(
    "Where", inputs=("C: bool", "X", "Y"), outputs=("Z",), types="T in {all, string}",
    rule=BROADCAST_ALL, semantics="Z[...] = where(C[...], X[...], Y[...])",
    role=Role.BROADCAST, since=(9, 16),
)

Identity = unary("Identity", "X[...]", types="T in {all, string}", since=(1, 13, 14, 16, 19, 21, 25),
                 adapt=None)

# --- bitwise ----------------------------------------------------------------------------

BitwiseNot = unary("BitwiseNot", "-X[...] - 1", types="T in {int}", since=(18,), adapt=None,
                   doc="Two's complement: ~x == -x - 1 (unsigned types wrap the same way).")


def _bitwise(name: str, ufunc: np.ufunc) -> MetaOp:
    # Opaque: the semantic language has no bitwise and/or/xor operator.
    def reference(inputs: list[np.ndarray | None], attrs: Mapping[str, Any]) -> np.ndarray:
        return ufunc(inputs[0], inputs[1])
    return metaop(name, inputs=("A", "B"), outputs=("C",), types="T in {int}",
                  rule=BROADCAST_ALL, reference=reference, role=Role.BROADCAST, since=(18,))


BitwiseAnd = _bitwise("BitwiseAnd", np.bitwise_and)
BitwiseOr = _bitwise("BitwiseOr", np.bitwise_or)
BitwiseXor = _bitwise("BitwiseXor", np.bitwise_xor)

# Shifts as multiplication and floor division by p = 2**Y computed in T, which wraps to 0 for
# shifts past the width (and to the minimum for a signed type's top bit): a right shift by a
# negative amount or one that leaves no bits gives the sign (0 or -1), a left shift gives 0.
_SHIFT = {
    "LEFT": """
p[...] = pow(2, max(Y[...], 0))
Z[...] = where(Y[...] < 0, X[...] * 0, X[...] * p[...])
""",
    "RIGHT": """
p[...] = pow(2, max(Y[...], 0))
Z[...] = where(Y[...] < 0 or p[...] <= 0, where(X[...] < 0, X[...] * 0 - 1, X[...] * 0),
               (X[...] - X[...] % p[...]) / p[...])
""",
}


def _shift_semantics(attrs: Mapping[str, Any], shapes: Shapes) -> str:
    return _SHIFT[attrs["direction"]]


def _shift_rule(ctx: InferContext) -> list[Any]:
    if ctx.attrs["direction"] not in _SHIFT:
        ctx.fail(f"direction must be LEFT or RIGHT, got {ctx.attrs['direction']!r}")
    return broadcast_rule(ctx)


BitShift = metaop(
    "BitShift", inputs=("X", "Y"), outputs=("Z",), attrs={"direction": string(REQUIRED)},
    types="T in {int}", rule=_shift_rule, semantics=_shift_semantics, role=Role.BROADCAST,
    since=(11, 28),
)

# --- casts ------------------------------------------------------------------------------


def saturation_bounds(target: np.dtype) -> tuple[float, float] | None:
    """The finite range a saturating cast clamps to: float8 targets only.

    Example:
        >>> saturation_bounds(np.dtype(ml_dtypes.float8_e4m3fn))
        (-448.0, 448.0)
    """
    if target.name not in _FLOAT8_NAMES:
        return None
    info = ml_dtypes.finfo(target)
    return float(info.min), float(info.max)


_FLOAT8_NAMES = frozenset(n for n in CAST_DTYPE_NAMES if n.startswith("float8"))


def _cast_semantics(attrs: Mapping[str, Any], shapes: Shapes) -> tuple[str, dict[str, float]] | None:
    """``cast_<to>(X)``; a saturating float8 cast clamps to the finite range first. A cast to
    float8e8m0 (it rounds on exponent bits) or to text has no expression: its reference runs it."""
    if from_onnx(attrs["to"]) is FLOAT8E8M0 or from_onnx(attrs["to"]).is_string:
        return None
    target = from_onnx(attrs["to"]).numpy
    body, params = "X[...]", {}
    bounds = saturation_bounds(target) if attrs["saturate"] else None
    if bounds is not None:
        body, params = f"min(max({body}, LO), HI)", {"LO": bounds[0], "HI": bounds[1]}
    if target.name in CAST_DTYPE_NAMES:
        body = f"cast_{target.name}({body})"
    # int4/uint4 have no cast_ function: the result's cast to the output dtype converts them.
    return f"Y[...] = {body}", params


def cast_target(ctx: InferContext, target: DType) -> DType:
    """``target``, after checking ``round_mode`` (which a cast to float8e8m0, the power-of-two
    scales of MX formats, rounds by: see :mod:`metadef.ops.defs.cast_e8m0`)."""
    if target is FLOAT8E8M0 and ctx.attrs["round_mode"] not in ROUND_MODES:
        ctx.fail(f"round_mode={ctx.attrs['round_mode']!r} must be one of {', '.join(ROUND_MODES)}")
    return target


def cast_reference(x: np.ndarray, target: np.dtype, attrs: Mapping[str, Any]) -> np.ndarray:
    """``x`` cast to ``target`` as Cast and CastLike do: float8 targets saturate (clamp to the
    finite range) when ``saturate`` is set; float8e8m0 rounds by ``round_mode``. Casts to and
    from string tensors (numpy object arrays) are ONNX Runtime's: see :func:`cast_text`.

    Example:
        >>> cast_reference(np.array([3.0]), FLOAT8E8M0.numpy, {"saturate": 1, "round_mode": "up"}
        ...                ).astype(np.float32)
        array([4.], dtype=float32)
    """
    if STRING.numpy in (x.dtype, target):
        return cast_text(x, target, attrs)
    if target == FLOAT8E8M0.numpy:
        return to_float8e8m0(x, attrs["round_mode"], bool(attrs["saturate"]))
    bounds = saturation_bounds(target) if attrs["saturate"] else None
    if bounds is not None:
        x = np.clip(x, *bounds)
    return x.astype(target)


def cast_text(x: np.ndarray, target: np.dtype, attrs: Mapping[str, Any]) -> np.ndarray:
    """A cast to or from a string tensor (see :mod:`metadef.ops.defs.cast_string`): numbers
    print as ONNX Runtime prints them; text reads as C's ``strtod`` (floats) or ``std::stoll``
    / ``std::stoull`` (integers, bool); a float narrower than float32 goes through float32, as
    in ONNX Runtime, and then casts as a float32 does (``saturate``, ``round_mode``); text to
    text is a copy.

    Example:
        >>> attrs = {"saturate": 1, "round_mode": "up"}
        >>> cast_text(np.array([0.1, np.inf], np.float16), np.dtype(object), attrs).tolist()
        ['0.099975586', 'INF']
        >>> cast_text(np.array(["0.1", "65520"], dtype=object), np.dtype(np.float16), attrs).tolist()
        [0.0999755859375, inf]
    """
    if target == STRING.numpy:
        return x.copy() if x.dtype == STRING.numpy else format_numbers(x)
    to = from_numpy(target)
    if to.kind == "bool" or (to.kind in ("int", "uint") and to.bits >= 8):
        return parse_integers(x, target)
    numbers = parse_floats(x, to.name)  # float64; int4 and the like read as floats, as in ONNX Runtime
    if target == np.float64:
        return numbers
    with np.errstate(over="ignore"):  # beyond float32: inf, as C's conversion gives
        return cast_reference(numbers.astype(np.float32), target, attrs)


def _cast_reference(inputs: list[np.ndarray | None], attrs: Mapping[str, Any]) -> np.ndarray:
    return cast_reference(np.asarray(inputs[0]), from_onnx(attrs["to"]).numpy, attrs)


def _cast_rule(ctx: InferContext) -> list[Any]:
    return [TensorType(cast_target(ctx, from_onnx(ctx.attrs["to"])), ctx.shape(0))]


def _cast_adapt(opset: int, attrs: dict[str, Any], n_inputs: int,
                ) -> tuple[dict[str, Any], dict[int, np.ndarray]]:
    """Opset 1 named the target type (``to="FLOAT"``); later opsets give its ONNX code."""
    attrs, extra = legacy_attrs(opset, attrs, n_inputs)
    to = attrs.get("to")
    if isinstance(to, bytes):
        to = to.decode()
    if isinstance(to, str):
        attrs["to"] = dtype(to.lower()).onnx
    return attrs, extra


Cast = metaop(
    "Cast", inputs=("X: T1",), outputs=("Y: T2",),
    attrs={"to": int_(REQUIRED), "saturate": int_(1), "round_mode": string("up")},
    types="T1 in {all, string}; T2 in {all, string}", rule=_cast_rule, semantics=_cast_semantics,
    reference=_cast_reference, role=Role.ELEMENTWISE, since=(1, 6, 9, 13, 19, 21, 23, 24, 25), adapt=_cast_adapt,
    doc="Casts to and from strings print and read numbers as ONNX Runtime does (cast_text).",
)


def _cast_like_reference(inputs: list[np.ndarray | None], attrs: Mapping[str, Any]) -> np.ndarray:
    # Opaque: the target dtype is the second input's dtype, which a semantics function (it sees
    # attributes and shapes only) cannot know.
    return cast_reference(np.asarray(inputs[0]), np.asarray(inputs[1]).dtype, attrs)


def _cast_like_rule(ctx: InferContext) -> list[Any]:
    return [TensorType(cast_target(ctx, ctx.dtype(1)), ctx.shape(0))]


CastLike = metaop(
    "CastLike", inputs=("X: T1", "target_type: T2"), outputs=("Y: T2",),
    attrs={"saturate": int_(1), "round_mode": string("up")},
    types="T1 in {all, string}; T2 in {all, string}", rule=_cast_like_rule, reference=_cast_like_reference,
    role=Role.ELEMENTWISE, since=(15, 19, 21, 23, 24, 25),
)
