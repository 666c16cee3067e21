"""Activations: Relu and friends, Clip, Dropout (inference), and the Softmax family.

Pointwise activations are one-line index expressions over ``X[...]`` that name their scalar
attributes (``alpha``, ``beta``...). Softmax, LogSoftmax and Hardmax are three-statement
programs built per node from the axis and the rank: a maximum, a sum (or a first index), the
result.

Example:
    >>> from metadef.ops import get_op
    >>> get_op("Relu").semantics.expression
    'Y[...] = max(X[...], 0)'
    >>> print(get_op("Softmax").semantics.expression({"axis": -1}, [(2, 5)]))
    t_max[...] = max[k0] X[..., k0]
    t_sum[...] = sum[k0] exp(X[..., k0] - t_max[...])
    Y[..., i0] = exp(X[..., i0] - t_max[...]) / t_sum[...]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from metadef.core.errors import UnsupportedOpError
from metadef.ops.defs.elementwise import Shapes, TrailingAxes, legacy_attrs, unary
from metadef.ops.infer import InferContext
from metadef.ops.interface import float_, int_, string
from metadef.ops.metaop import BROADCAST_ALL, SAME_AS_FIRST, metaop
from metadef.ops.strategy import Role
from metadef.shape import TensorType

# --- pointwise --------------------------------------------------------------------------

# Elu, Selu and Celu: exp(x) - 1 cancels badly near 0 in bfloat16 and float16; with no expm1
# in the language it is computed in float64 and rounded once to the output type.
Relu = unary("Relu", "max(X[...], 0)", types="T in {float, sint}", since=(1, 6, 13, 14))
LeakyRelu = unary("LeakyRelu", "where(X[...] < 0, alpha * X[...], X[...])",
                  attrs={"alpha": float_(0.01)}, since=(1, 6, 16))
Elu = unary("Elu", "where(X[...] < 0, alpha * expm1(X[...]), X[...])",
            attrs={"alpha": float_(1.0)}, since=(1, 6, 22))
Selu = unary("Selu", "gamma * where(X[...] > 0, X[...], alpha * expm1(X[...]))",
             attrs={"alpha": float_(1.67326319217681884765625),
                    "gamma": float_(1.05070102214813232421875)}, since=(1, 6, 22))
Celu = unary("Celu", "max(X[...], 0) + min(0, alpha * expm1(X[...] / alpha))",
             attrs={"alpha": float_(1.0)}, since=(12, 28))
ThresholdedRelu = unary("ThresholdedRelu", "where(X[...] > alpha, X[...], 0)",
                        attrs={"alpha": float_(1.0)}, since=(10, 22))
Shrink = unary("Shrink", "where(X[...] < -lambd, X[...] + bias, "
                         "where(X[...] > lambd, X[...] - bias, 0))",
               types="T in {numeric}", attrs={"bias": float_(0.0), "lambd": float_(0.5)},
               since=(9,))
Sigmoid = unary("Sigmoid", "sigmoid(X[...])", since=(1, 6, 13))
HardSigmoid = unary("HardSigmoid", "max(0, min(1, alpha * X[...] + beta))",
                    attrs={"alpha": float_(0.2), "beta": float_(0.5)}, since=(1, 6, 22))
HardSwish = unary("HardSwish", "X[...] * max(0, min(1, X[...] / 6 + 0.5))", since=(14, 22))
Tanh = unary("Tanh", "tanh(X[...])", since=(1, 6, 13))
Softplus = unary("Softplus", "softplus(X[...])", since=(1, 22))
Softsign = unary("Softsign", "X[...] / (1 + abs(X[...]))", since=(1, 22))
Mish = unary("Mish", "X[...] * tanh(softplus(X[...]))", since=(18, 22))

_GELU = {
    "none": "Y[...] = X[...] * ndtr(X[...])",  # 0.5 x (1 + erf(x / sqrt 2)), ndtr: the normal CDF
    "tanh": "Y[...] = 0.5 * X[...] * "
            "(1 + tanh(0.7978845608028654 * (X[...] + 0.044715 * X[...] * X[...] * X[...])))",
}


def _gelu_rule(ctx: InferContext) -> list[Any]:
    if ctx.attrs["approximate"] not in _GELU:
        ctx.fail(f"approximate must be 'none' or 'tanh', got {ctx.attrs['approximate']!r}")
    return [ctx.shape(0)]


Gelu = metaop(
    "Gelu", inputs=("X",), outputs=("Y",), attrs={"approximate": string("none")},
    types="T in {float}", rule=_gelu_rule,
    semantics=lambda attrs, shapes: _GELU[attrs["approximate"]],
    role=Role.ELEMENTWISE, since=(20,),
)

def _prelu_adapt(opset: int, attrs: dict[str, Any], n_inputs: int, *,
                 types: Sequence[TensorType | None] = (),
                 ) -> tuple[dict[str, Any], dict[int, np.ndarray | TrailingAxes]]:
    """Before opset 7 a slope of C values (not 1) is per channel, axis 1 of X (as PyTorch and
    Caffe2 exported it, and as onnx's reference runtime reads it); from 7 on it broadcasts like
    numpy. The old form gets trailing axes of size 1, so that both read the same."""
    attrs, extra = legacy_attrs(opset, attrs, n_inputs, types=types)
    x, slope = (list(types) + [None, None])[:2]
    if (opset < 7 and x is not None and slope is not None and x.rank is not None and x.rank > 2
            and slope.rank == 1 and slope.shape[0] != 1):
        extra[1] = TrailingAxes(x.rank - 2)
    return attrs, extra


PRelu = metaop(
    "PRelu", inputs=("X", "slope"), outputs=("Y",),
    types="T in {float, int32, int64, uint32, uint64}", rule=BROADCAST_ALL,
    semantics="Y[...] = where(X[...] < 0, slope[...] * X[...], X[...])",
    role=Role.BROADCAST, since=(1, 6, 7, 9, 16), adapt=_prelu_adapt,
)

# --- Clip -------------------------------------------------------------------------------


def _clip_semantics(attrs: Mapping[str, Any], shapes: Shapes) -> str:
    """``min(max(X, lower), upper)`` with the bounds the node has; ``lower > upper`` gives
    ``upper`` everywhere, as ONNX says."""
    body = "X[...]"
    if len(shapes) > 1 and shapes[1] is not None:
        body = f"max({body}, lower[...])"
    if len(shapes) > 2 and shapes[2] is not None:
        body = f"min({body}, upper[...])"
    return f"Y[...] = {body}"


def _clip_adapt(opset: int, attrs: dict[str, Any], n_inputs: int,
                ) -> tuple[dict[str, Any], dict[int, np.ndarray]]:
    """Below opset 11 the bounds were float attributes: they become constant inputs (float32,
    the only type those models use in practice)."""
    attrs, extra = legacy_attrs(opset, attrs, n_inputs)
    if opset < 11:
        for index, name in ((1, "min"), (2, "max")):
            if name in attrs:
                extra[index] = np.asarray(attrs.pop(name), np.float32)
    return attrs, extra


Clip = metaop(
    "Clip", inputs=("X", "lower?", "upper?"), outputs=("Y",), types="T in {numeric}",
    rule=SAME_AS_FIRST, semantics=_clip_semantics, role=Role.BROADCAST,
    since=(1, 6, 11, 12, 13), adapt=_clip_adapt,
)

# --- Dropout ----------------------------------------------------------------------------


def _training(inputs: Sequence[np.ndarray | None]) -> tuple[bool, float]:
    ratio = 0.5 if len(inputs) < 2 or inputs[1] is None else float(np.asarray(inputs[1]))
    training = len(inputs) > 2 and inputs[2] is not None and bool(np.asarray(inputs[2]))
    return training and ratio != 0.0, ratio


_TRAINING_HINT = ("dropout in training mode is random and metadef runs inference only: feed "
                  "training_mode=false (or leave it out) or remove the Dropout node")


def _dropout_reference(inputs: list[np.ndarray | None], attrs: Mapping[str, Any]) -> tuple:
    # Opaque: whether to refuse depends on the run-time value of training_mode.
    training, ratio = _training(inputs)
    if training:
        raise UnsupportedOpError(f"Dropout got training_mode=true with ratio {ratio}; "
                                 f"{_TRAINING_HINT}")
    data = np.asarray(inputs[0])
    return data.copy(), np.ones(data.shape, dtype=np.bool_)


def _dropout_rule(ctx: InferContext) -> list[Any]:
    training = ctx.value(2) if ctx.has(2) else None
    if training is not None and bool(np.asarray(training)):
        ratio = ctx.value(1) if ctx.has(1) else np.asarray(0.5)
        if ratio is None or float(np.asarray(ratio)) != 0.0:
            ctx.fail("training_mode is the constant true", _TRAINING_HINT)
    return [ctx.shape(0), ctx.shape(0)]


def _dropout_adapt(opset: int, attrs: dict[str, Any], n_inputs: int,
                   ) -> tuple[dict[str, Any], dict[int, np.ndarray]]:
    """Below opset 12 ``ratio`` was an attribute; below 7 ``is_test=0`` (the default) meant
    training, which becomes a constant true training_mode that inference then refuses."""
    attrs, extra = legacy_attrs(opset, attrs, n_inputs)
    if opset < 12 and "ratio" in attrs:
        extra[1] = np.asarray(attrs.pop("ratio"), np.float32)
    if opset < 7 and not attrs.pop("is_test", 0):
        extra.setdefault(1, np.asarray(0.5, np.float32))
        extra[2] = np.asarray(True)
    return attrs, extra


Dropout = metaop(
    "Dropout", inputs=("data", "ratio?: T1", "training_mode?: bool"),
    outputs=("output", "mask?: bool"), attrs={"seed": int_()},
    types="T in {float, float8}; T1 in {float, float8}", rule=_dropout_rule,
    reference=_dropout_reference, role=Role.ELEMENTWISE, reads=(1, 2),
    since=(1, 6, 7, 10, 12, 13, 22), adapt=_dropout_adapt,
    doc="Inference only: the identity, and an all-true mask; training mode is refused.",
)

# --- Softmax family ---------------------------------------------------------------------


def _normalized_axis(attrs: Mapping[str, Any], rank: int) -> int:
    axis = int(attrs["axis"])
    return axis + rank if axis < 0 else axis


def _axis_rule(ctx: InferContext) -> list[Any]:
    rank = ctx.rank(0)
    if rank == 0:
        ctx.fail("the input must have rank >= 1 (a scalar has no axis to normalize over)")
    if rank is not None and not -rank <= ctx.attrs["axis"] < rank:
        ctx.fail(f"axis {ctx.attrs['axis']} is out of range for rank {rank}",
                 f"use an axis in [{-rank}, {rank - 1}]")
    return [ctx.shape(0)]


def _axis_indices(attrs: Mapping[str, Any], rank: int) -> tuple[list[str], list[str], list[str]]:
    """Index names: the reduced axes (``k0``...), their output names (``i0``...) and the
    kept axes after them (``j0``...). Before opset 13 (``_coerce_2d``) every axis from
    ``axis`` on is reduced, as if the input were flattened to 2-D there."""
    axis = _normalized_axis(attrs, rank)
    n_reduced = rank - axis if attrs.get("_coerce_2d") else 1
    reduced = [f"k{n}" for n in range(n_reduced)]
    outs = [f"i{n}" for n in range(n_reduced)]
    kept = [f"j{n}" for n in range(rank - axis - n_reduced)]
    return reduced, outs, kept


def _index(*groups: Sequence[str]) -> str:
    return ", ".join(["...", *(name for group in groups for name in group)])


SoftmaxBody = Callable[[str, str, str], str]


def _softmax_family(result: SoftmaxBody) -> Callable[[Mapping[str, Any], Shapes], str]:
    """A semantics function: the max over the axis, the sum of shifted exponentials, then
    ``result(x, t_max, t_sum)`` for the output element."""
    def semantics(attrs: Mapping[str, Any], shapes: Shapes) -> str:
        reduced, outs, kept = _axis_indices(attrs, len(shapes[0] or ()))
        x_red, x_out, temp = (f"X[{_index(reduced, kept)}]", f"X[{_index(outs, kept)}]",
                              _index(kept))
        return "\n".join([
            f"t_max[{temp}] = max[{', '.join(reduced)}] {x_red}",
            f"t_sum[{temp}] = sum[{', '.join(reduced)}] exp({x_red} - t_max[{temp}])",
            f"Y[{_index(outs, kept)}] = {result(x_out, f't_max[{temp}]', f't_sum[{temp}]')}",
        ])
    return semantics


def _softmax_adapt(opset: int, attrs: dict[str, Any], n_inputs: int,
                   ) -> tuple[dict[str, Any], dict[int, np.ndarray]]:
    """Before opset 13 the axis defaulted to 1 and the input was coerced to 2-D at it."""
    if opset >= 13:
        return attrs, {}
    return {**attrs, "axis": attrs.get("axis", 1), "_coerce_2d": 1}, {}


_AXIS_ATTRS = {"axis": int_(-1), "_coerce_2d": int_()}

Softmax = metaop(
    "Softmax", inputs=("X",), outputs=("Y",), attrs=_AXIS_ATTRS, types="T in {float}",
    rule=_axis_rule, semantics=_softmax_family(lambda x, m, s: f"exp({x} - {m}) / {s}"),
    role=Role.REDUCTION, since=(1, 11, 13), adapt=_softmax_adapt,
)
LogSoftmax = metaop(
    "LogSoftmax", inputs=("X",), outputs=("Y",), attrs=_AXIS_ATTRS, types="T in {float}",
    rule=_axis_rule, semantics=_softmax_family(lambda x, m, s: f"{x} - {m} - log({s})"),
    role=Role.REDUCTION, since=(1, 11, 13), adapt=_softmax_adapt,
)


def _hardmax_semantics(attrs: Mapping[str, Any], shapes: Shapes) -> tuple[str, dict[str, Any]]:
    """1 at the first maximum along the axis (row-major first over coerced axes), else 0."""
    shape = tuple(shapes[0] or ())
    reduced, outs, kept = _axis_indices(attrs, len(shape))
    sizes = shape[len(shape) - len(kept) - len(reduced):][:len(reduced)]
    params = {f"S{n}": sizes[n] for n in range(1, len(reduced))}

    def flat(names: Sequence[str]) -> str:  # row-major position among the reduced axes
        text = names[0]
        for n, name in enumerate(names[1:], 1):
            text = f"({text}) * S{n} + {name}"
        return text

    temp = _index(kept)
    x_red = f"X[{_index(reduced, kept)}]"
    return "\n".join([
        f"t_max[{temp}] = max[{', '.join(reduced)}] {x_red}",
        f"t_first[{temp}] = min[{', '.join(reduced)}] "
        f"where({x_red} == t_max[{temp}], {flat(reduced)}, inf)",
        f"Y[{_index(outs, kept)}] = where({flat(outs)} == t_first[{temp}], 1, 0)",
    ]), params


Hardmax = metaop(
    "Hardmax", inputs=("X",), outputs=("Y",), attrs=_AXIS_ATTRS, types="T in {float}",
    rule=_axis_rule, semantics=_hardmax_semantics, role=Role.REDUCTION, since=(1, 11, 13),
    adapt=_softmax_adapt,
)
