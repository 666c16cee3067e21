"""ONNX Runtime's quantized contrib ops of the QOperator form (domain ``com.microsoft``):
``QLinearAdd``, ``QLinearMul``, ``QLinearSigmoid``, ``QLinearLeakyRelu``,
``QLinearGlobalAveragePool``, ``QLinearAveragePool``, ``QLinearSoftmax`` and ``QLinearConcat``.

ONNX Runtime's quantizer writes them (``quantize_static(..., quant_format=QuantFormat.QOperator)``,
and the int8 models of the ONNX model zoo) between its ``QLinearConv`` / ``QLinearMatMul``
layers. Each is the float op between a dequantize of its inputs and a quantize of its output,
with per-tensor scales and zero points: ``y = saturate(round(f(dequantize(x...)) / y_scale) +
y_zero_point)``, written as an index expression (so the x86 backend generates one kernel for
it, fused with its neighbours, and the reference evaluates the same text); the saturation range
comes from the output's zero point, which the ops read like a constant (``reads``). Rounding is
ONNX Runtime's: Add is ``(a - za) * (sa / sc) + (b - zb) * (sb / sc) + zc`` rounded once (its
fused multiply-adds; exact here in float64), Mul ``(a - za) * (b - zb) * (sa * sb / sc)``, the
pools the mean of ``x - zx`` times ``sx / sy`` (ONNX Runtime's average pool can differ by one
step where a window is clipped); a node whose zero points are not constants runs the numpy
reference.

Example:
    >>> import numpy as np
    >>> from metadef.ops import get_op, infer_types
    >>> from metadef.shape import parse_type
    >>> op = get_op("QLinearAdd", DOMAIN)
    >>> y, = infer_types(op, "/add", [parse_type("u8[b,8,4,4]"), parse_type("f32[]"), parse_type("u8[]"),
    ...     parse_type("u8[b,8,4,4]"), parse_type("f32[]"), parse_type("u8[]"), parse_type("f32[]"),
    ...     parse_type("u8[]")], {})
    >>> str(y)
    'u8[b,8,4,4]'
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from metadef.core.errors import UnsupportedOpError
from metadef.ops.defs.nn_pool import averagepool_semantics, window_infer
from metadef.ops.defs.quantized import saturation, scalar
from metadef.ops.infer import InferContext
from metadef.ops.interface import REQUIRED, Param, float_, int_, ints, string
from metadef.ops.metaop import metaop
from metadef.ops.strategy import Role
from metadef.shape import TensorType, broadcast_shapes

DOMAIN = "com.microsoft"
Shapes = Sequence[Sequence[Any] | None]
Values = Sequence[np.ndarray | None]


def _dq(x: str, scale: str, zero: str | None) -> str:
    """``(x - zero) * scale`` in float32 (DequantizeLinear's arithmetic)."""
    shifted = f"(cast_float32({x}) - cast_float32({zero}))" if zero else f"cast_float32({x})"
    return f"{shifted} * {scale}"


def _q(body: str, zero: str | None) -> str:
    """``saturate(round(body) + zero)`` (``body`` already divided by the output's scale)."""
    plus = f" + cast_float32({zero})" if zero else ""
    return f"min(max(round({body}){plus}, LO), HI)"


def _operand(shapes: Shapes, i: int, name: str) -> str | None:
    """How a per-tensor scale or zero point at input ``i`` is read (None: absent or not per tensor)."""
    return scalar(name, shapes[i]) if i < len(shapes) and shapes[i] is not None else None


def _bounds(values: Values, i: int) -> dict[str, float] | None:
    """The saturation range of the output, from its zero point (input ``i``, read like a
    constant); None where it is absent or computed (the node runs its numpy reference)."""
    zero = values[i] if i < len(values) else None
    bounds = None if zero is None else saturation(np.asarray(zero).dtype)
    return None if bounds is None else {"LO": bounds[0], "HI": bounds[1]}


def _quantized_inputs(ctx: InferContext, data: Sequence[int], zeros: Sequence[int]) -> None:
    """The data inputs are 8-bit of one dtype, and each given zero point has it too."""
    dtypes = {ctx.dtype(i).name for i in data if ctx.has(i)}
    for i in zeros:
        if ctx.has(i):
            dtypes.add(ctx.dtype(i).name)
    if not dtypes <= {"uint8", "int8"} or len(dtypes) > 1:
        ctx.fail(f"the quantized inputs and zero points must all be uint8 or all int8, got {sorted(dtypes)}")


# ------------------------------------------------------------------ QLinearAdd, QLinearMul


def _binary_semantics(kind: str) -> Any:
    def semantics(attrs: Mapping[str, Any], shapes: Shapes, values: Values) -> Any:
        sa, sb, sc = (_operand(shapes, i, n) for i, n in ((1, "A_scale"), (4, "B_scale"), (6, "C_scale")))
        za, zb, zc = (_operand(shapes, i, n) for i, n in ((2, "A_zero_point"), (5, "B_zero_point"),
                                                          (7, "C_zero_point")))
        bounds = _bounds(values, 7)
        if None in (sa, sb, sc) or bounds is None or shapes[0] is None or shapes[3] is None:
            return None
        a = f"cast_float32(A[...]) - cast_float32({za})" if za else "cast_float32(A[...])"
        b = f"cast_float32(B[...]) - cast_float32({zb})" if zb else "cast_float32(B[...])"
        if kind == "add":  # ONNX Runtime's: a * (sa / sc) + (b * (sb / sc) + zc) by fused multiply-adds,
            # here exact in float64 (8-bit values times float32 ratios) and rounded once
            terms = [f"cast_float64({a}) * cast_float64({sa} / {sc})", f"cast_float64({b}) * cast_float64({sb} / {sc})"]
            if zc:
                terms.append(f"cast_float64({zc})")
            return f"C[...] = min(max(round(cast_float32({' + '.join(terms)})), LO), HI)", bounds
        return f"C[...] = {_q(f'({a}) * ({b}) * ({sa} * {sb} / {sc})', zc)}", bounds
    return semantics


def _binary_reference(kind: str) -> Any:
    def reference(inputs: list[np.ndarray | None], attrs: Mapping[str, Any]) -> np.ndarray:
        a, sa, za, b, sb, zb, sc, zc = (list(inputs) + [None] * 8)[:8]
        fa = np.asarray(a, np.float32) - np.float32(0 if za is None else np.asarray(za).reshape(()))
        fb = np.asarray(b, np.float32) - np.float32(0 if zb is None else np.asarray(zb).reshape(()))
        sa, sb, sc = (np.float32(np.asarray(s).reshape(())) for s in (sa, sb, sc))
        zero = np.float32(0 if zc is None else np.asarray(zc).reshape(()))
        dtype = np.asarray(a).dtype if zc is None else np.asarray(zc).dtype
        if kind == "add":
            exact = fa.astype(np.float64) * np.float64(sa / sc) + fb.astype(np.float64) * np.float64(sb / sc) + zero
            out = np.rint(exact.astype(np.float32))
        else:
            out = np.rint((fa * fb * np.float32(sa * sb / sc)).astype(np.float32)) + zero
        return np.clip(out, *saturation(dtype)).astype(dtype)
    return reference


def _binary_rule(ctx: InferContext) -> list[Any]:
    _quantized_inputs(ctx, (0, 3), (2, 5, 7))
    a, b = ctx.shape(0), ctx.shape(3)
    shape = None if a is None or b is None else broadcast_shapes(a, b)[0]
    return [TensorType(ctx.dtype(0), shape)]


_BINARY_INPUTS = ("A: T", "A_scale: float32", "A_zero_point?: T", "B: T", "B_scale: float32", "B_zero_point?: T",
                  "C_scale: float32", "C_zero_point?: T")

QLinearAdd = metaop(
    "QLinearAdd", domain=DOMAIN, inputs=_BINARY_INPUTS, outputs=("C: T",), types="T in {int8, uint8}",
    rule=_binary_rule, semantics=_binary_semantics("add"), reference=_binary_reference("add"),
    role=Role.BROADCAST, reads=(7,), passed=(1, 2, 4, 5, 6, 7), since=(1,),
    doc="Quantized broadcasting Add: (a - za) * sa/sc + (b - zb) * sb/sc, rounded, plus zc.",
)
QLinearMul = metaop(
    "QLinearMul", domain=DOMAIN, inputs=_BINARY_INPUTS, outputs=("C: T",), types="T in {int8, uint8}",
    rule=_binary_rule, semantics=_binary_semantics("mul"), reference=_binary_reference("mul"),
    role=Role.BROADCAST, reads=(7,), passed=(1, 2, 4, 5, 6, 7), since=(1,),
    doc="Quantized broadcasting Mul: (a - za) * (b - zb) * sa*sb/sc, rounded, plus zc.",
)


# ------------------------------------------------------------- QLinearSigmoid, QLinearLeakyRelu


def _unary_semantics(body: str) -> Any:
    def semantics(attrs: Mapping[str, Any], shapes: Shapes, values: Values) -> Any:
        sx, zx, sy, zy = (_operand(shapes, i, n) for i, n in ((1, "X_scale"), (2, "X_zero_point"),
                                                              (3, "Y_scale"), (4, "Y_zero_point")))
        bounds = _bounds(values, 4)
        if sx is None or sy is None or bounds is None or shapes[0] is None:
            return None
        x = f"({_dq('X[...]', sx, zx)})"
        return f"Y[...] = {_q(body.format(x=x) + f' / {sy}', zy)}", {**bounds, "ALPHA": attrs.get("alpha", 0.01)}
    return semantics


def _unary_reference(fn: Any) -> Any:
    def reference(inputs: list[np.ndarray | None], attrs: Mapping[str, Any]) -> np.ndarray:
        x, sx, zx, sy, zy = (list(inputs) + [None] * 5)[:5]
        fx = (np.asarray(x, np.float32) - np.float32(0 if zx is None else np.asarray(zx).reshape(()))) \
            * np.float32(np.asarray(sx).reshape(()))
        y = fn(fx, np.float32(attrs.get("alpha", 0.01))).astype(np.float32) / np.float32(np.asarray(sy).reshape(()))
        dtype = np.asarray(x).dtype if zy is None else np.asarray(zy).dtype
        out = np.rint(y) + np.float32(0 if zy is None else np.asarray(zy).reshape(()))
        return np.clip(out, *saturation(dtype)).astype(dtype)
    return reference


def _unary_rule(ctx: InferContext) -> list[Any]:
    _quantized_inputs(ctx, (0,), (2, 4))
    return [TensorType(ctx.dtype(0), ctx.shape(0))]


_UNARY_INPUTS = ("X: T", "X_scale: float32", "X_zero_point?: T", "Y_scale: float32", "Y_zero_point?: T")

QLinearSigmoid = metaop(
    "QLinearSigmoid", domain=DOMAIN, inputs=_UNARY_INPUTS, outputs=("Y: T",), types="T in {int8, uint8}",
    rule=_unary_rule, semantics=_unary_semantics("sigmoid({x})"),
    reference=_unary_reference(lambda x, alpha: 1 / (1 + np.exp(-x))),
    role=Role.ELEMENTWISE, reads=(4,), passed=(1, 2, 3, 4), since=(1,),
    doc="Quantized Sigmoid: quantize(sigmoid(dequantize(x))).",
)
QLinearLeakyRelu = metaop(
    "QLinearLeakyRelu", domain=DOMAIN, inputs=_UNARY_INPUTS, outputs=("Y: T",), attrs={"alpha": float_(0.01)},
    types="T in {int8, uint8}", rule=_unary_rule, semantics=_unary_semantics("where({x} < 0, ALPHA * {x}, {x})"),
    reference=_unary_reference(lambda x, alpha: np.where(x < 0, alpha * x, x)),
    role=Role.ELEMENTWISE, reads=(4,), passed=(1, 2, 3, 4), since=(1,),
    doc="Quantized LeakyRelu: quantize(leaky_relu(dequantize(x), alpha)).",
)


# --------------------------------------------------------------- the quantized average pools


def _pool_operands(shapes: Shapes, values: Values) -> tuple[str, str | None, str, str | None, dict] | None:
    sx, zx, sy, zy = (_operand(shapes, i, n) for i, n in ((1, "x_scale"), (2, "x_zero_point"),
                                                          (3, "y_scale"), (4, "y_zero_point")))
    bounds = _bounds(values, 4)
    if sx is None or sy is None or bounds is None or shapes[0] is None:
        return None
    return sx, zx, sy, zy, bounds


def _global_semantics(attrs: Mapping[str, Any], shapes: Shapes, values: Values) -> Any:
    got = _pool_operands(shapes, values)
    if got is None or attrs["channels_last"]:
        return None
    sx, zx, sy, zy, bounds = got
    nd = len(shapes[0]) - 2
    hs = ", ".join(f"h{i}" for i in range(nd))
    x = f"X[n, c{''.join(f', h{i}' for i in range(nd))}]"
    shifted = f"cast_float32({x}) - cast_float32({zx})" if zx else f"cast_float32({x})"
    keep = "".join(f", o{i}" for i in range(nd))
    return f"Y[n, c{keep}] = {_q(f'(mean[{hs}] ({shifted})) * ({sx} / {sy})', zy)}", bounds


def _average_semantics(attrs: Mapping[str, Any], shapes: Shapes, values: Values) -> Any:
    got = _pool_operands(shapes, values)
    zx_given = len(shapes) > 2 and shapes[2] is not None
    if got is None or attrs["channels_last"] or (zx_given and values[2] is None):
        return None
    sx, _, sy, zy, bounds = got
    zx = str(int(np.asarray(values[2]).reshape(()))) if zx_given else None
    text, params = averagepool_semantics({k: v for k, v in attrs.items() if k != "channels_last"}, [shapes[0]])
    lhs, rhs = text.split(" = ", 1)
    top, bottom = rhs.split(" / ", 1)  # (the window's sum over its count: only the sum reads dequantized values)
    # (a tap in the padding reads as the zero point: it adds 0 to the sum, as a float pool's does)
    x = (lambda m: f"(cast_float32(fill({m.group(0)}, {zx})) - {zx}.0)") if zx else \
        (lambda m: f"cast_float32({m.group(0)})")
    top = re.sub(r"X\[([^\]]*)\]", x, top, count=1)
    return f"{lhs} = {_q(f'({top} / {bottom}) * ({sx} / {sy})', zy)}", {**params, **bounds}


def _global_reference(inputs: list[np.ndarray | None], attrs: Mapping[str, Any]) -> np.ndarray:
    """The semantics' arithmetic in numpy, either layout (``channels_last``: NHWC)."""
    x, sx, zx, sy, zy = (list(inputs) + [None] * 5)[:5]
    x = np.asarray(x)
    axes = tuple(range(1, x.ndim - 1)) if attrs["channels_last"] else tuple(range(2, x.ndim))
    shifted = x.astype(np.float32) - np.float32(0 if zx is None else np.asarray(zx).reshape(()))
    ratio = np.float32(np.asarray(sx).reshape(())) / np.float32(np.asarray(sy).reshape(()))
    mean = shifted.mean(axis=axes, keepdims=True, dtype=np.float32)
    dtype = x.dtype if zy is None else np.asarray(zy).dtype
    out = np.rint(mean * ratio) + np.float32(0 if zy is None else np.asarray(zy).reshape(()))
    return np.clip(out, *saturation(dtype)).astype(dtype)


def _pool_reference(inputs: list[np.ndarray | None], attrs: Mapping[str, Any]) -> np.ndarray:
    raise UnsupportedOpError("a QLinearAveragePool whose zero points are not constants has no reference kernel in "
                             "metadef yet: make them initializers")


def _global_rule(ctx: InferContext) -> list[Any]:
    _quantized_inputs(ctx, (0,), (2, 4))
    x = ctx.shape(0)
    if x is not None and len(x) < 3:
        ctx.fail(f"X must have a batch, a channel and spatial axes, got shape {list(x)}")
    if x is None:
        return [TensorType(ctx.dtype(0), None)]
    last = bool(ctx.attrs["channels_last"])
    shape = (x[0], *(1 for _ in x[1:-1]), x[-1]) if last else (x[0], x[1], *(1 for _ in x[2:]))
    return [TensorType(ctx.dtype(0), shape)]


_POOL_INPUTS = ("X: T", "x_scale: float32", "x_zero_point?: T", "y_scale: float32", "y_zero_point?: T")

QLinearGlobalAveragePool = metaop(
    "QLinearGlobalAveragePool", domain=DOMAIN, inputs=_POOL_INPUTS, outputs=("Y: T",),
    attrs={"channels_last": int_(0)}, types="T in {int8, uint8}", rule=_global_rule, semantics=_global_semantics,
    reference=_global_reference, role=Role.REDUCTION, reads=(4,), passed=(1, 2, 3, 4), since=(1,),
    doc="Quantized GlobalAveragePool: the mean of (x - zx), times x_scale / y_scale, rounded, plus zy.",
)


def _average_rule(ctx: InferContext) -> list[Any]:
    _quantized_inputs(ctx, (0,), (2, 4))
    if ctx.attrs["channels_last"]:
        ctx.fail("channels_last=1 is not supported (the NCHW form is what ONNX Runtime's quantizer writes)")
    return window_infer(ctx, ctx.attrs["kernel_shape"], weight=False, indices=False,
                        ceil_mode=bool(ctx.attrs["ceil_mode"]))


QLinearAveragePool = metaop(
    "QLinearAveragePool", domain=DOMAIN, inputs=_POOL_INPUTS, outputs=("Y: T",),
    attrs={"auto_pad": string("NOTSET"), "ceil_mode": int_(0), "channels_last": int_(0),
           "count_include_pad": int_(0), "dilations": ints(), "kernel_shape": ints(REQUIRED), "pads": ints(),
           "strides": ints()},
    types="T in {int8, uint8}", rule=_average_rule, semantics=_average_semantics, reference=_pool_reference,
    role=Role.REDUCTION, reads=(2, 4), passed=(1, 3, 4), since=(1,),
    doc="Quantized AveragePool: each window's mean of (x - zx), times x_scale / y_scale, rounded, plus zy.",
)


# -------------------------------------------------------------------------- QLinearSoftmax


def _softmax_semantics(attrs: Mapping[str, Any], shapes: Shapes, values: Values) -> Any:
    """Over the last axis: the row's maximum and sum of exponentials of the dequantized values,
    each output quantized (another axis runs the reference)."""
    got = _pool_operands(shapes, values)
    if got is None or not shapes[0] or int(attrs["axis"]) % len(shapes[0]) != len(shapes[0]) - 1:
        return None
    sx, zx, sy, zy, bounds = got
    ix = ", ".join(f"i{k}" for k in range(len(shapes[0]) - 1))
    lead = f"{ix}, " if ix else ""

    def dq(v: str) -> str:
        return f"({_dq(f'X[{lead}{v}]', sx, zx)})"

    return (f"t_max[{ix}] = max[k] {dq('k')}\n"
            f"t_sum[{ix}] = sum[k] exp({dq('k')} - t_max[{ix}])\n"
            f"Y[{lead}j] = {_q(f'exp({dq(chr(106))} - t_max[{ix}]) / t_sum[{ix}] / {sy}', zy)}"), bounds


def _softmax_reference(inputs: list[np.ndarray | None], attrs: Mapping[str, Any]) -> np.ndarray:
    x, sx, zx, sy, zy = (list(inputs) + [None] * 5)[:5]
    fx = (np.asarray(x, np.float32) - np.float32(0 if zx is None else np.asarray(zx).reshape(()))) \
        * np.float32(np.asarray(sx).reshape(()))
    axis = int(attrs["axis"]) % max(fx.ndim, 1)
    axes = tuple(range(axis, fx.ndim)) if int(attrs["opset"]) < 13 else (axis,)  # (opset < 13: the axes from axis)
    e = np.exp(fx - fx.max(axis=axes, keepdims=True))
    y = (e / e.sum(axis=axes, keepdims=True)).astype(np.float32) / np.float32(np.asarray(sy).reshape(()))
    dtype = np.asarray(x).dtype if zy is None else np.asarray(zy).dtype
    out = np.rint(y) + np.float32(0 if zy is None else np.asarray(zy).reshape(()))
    return np.clip(out, *saturation(dtype)).astype(dtype)


QLinearSoftmax = metaop(
    "QLinearSoftmax", domain=DOMAIN, inputs=_POOL_INPUTS, outputs=("Y: T",),
    attrs={"axis": int_(-1), "opset": int_(REQUIRED)}, types="T in {int8, uint8}", rule=_unary_rule,
    semantics=_softmax_semantics, reference=_softmax_reference, role=Role.REDUCTION, reads=(4,), passed=(1, 2, 3, 4),
    since=(1,), doc="Quantized Softmax: quantize(softmax(dequantize(x))) over axis (opset < 13: the axes from it).",
)


# --------------------------------------------------------------------------- QLinearConcat


def _concat_reference(inputs: list[np.ndarray | None], attrs: Mapping[str, Any]) -> np.ndarray:
    sy, zy, *rest = inputs
    dtype = np.asarray(zy).dtype

    def one(v: Any) -> np.float32:
        return np.float32(np.asarray(v).reshape(()))

    parts = []
    for x, sx, zx in zip(rest[0::3], rest[1::3], rest[2::3]):
        fx = (np.asarray(x, np.float32) - one(zx)) * one(sx)
        parts.append(np.clip(np.rint(fx / one(sy)) + one(zy), *saturation(dtype)).astype(dtype))
    return np.concatenate(parts, axis=int(attrs["axis"]))


def _concat_rule(ctx: InferContext) -> list[Any]:
    count = len(ctx.inputs) - 2
    if count < 3 or count % 3:
        ctx.fail(f"the inputs after Y_scale and Y_zero_point must come in (X, X_scale, X_zero_point) triples, "
                 f"got {count}")
    _quantized_inputs(ctx, tuple(range(2, len(ctx.inputs), 3)), (1, *range(4, len(ctx.inputs), 3)))
    shapes = [ctx.shape(i) for i in range(2, len(ctx.inputs), 3)]
    if any(s is None for s in shapes):
        return [TensorType(ctx.dtype(1), None)]
    rank = len(shapes[0])
    axis = int(ctx.attrs["axis"]) % rank
    total: Any = 0
    for s in shapes:
        if len(s) != rank or any(a != b for i, (a, b) in enumerate(zip(s, shapes[0])) if i != axis
                                 and isinstance(a, int) and isinstance(b, int)):
            ctx.fail(f"the inputs' shapes {[list(x) for x in shapes]} differ off axis {axis}")
        total = total + s[axis] if isinstance(total, int) and isinstance(s[axis], int) else None
    return [TensorType(ctx.dtype(1), (*shapes[0][:axis], total, *shapes[0][axis + 1:]))]


QLinearConcat = metaop(
    "QLinearConcat", domain=DOMAIN,
    inputs=("Y_scale: float32", "Y_zero_point: T", Param("inputs", variadic=True, type_var="V", mixed=True)),
    outputs=("Y: T",),
    attrs={"axis": int_(REQUIRED)}, types="T in {int8, uint8}; V in {all}", rule=_concat_rule,
    reference=_concat_reference, role=Role.OPAQUE, since=(1,),
    doc="Quantized Concat: each input requantized to Y's scale and zero point, then concatenated.",
)


__all__ = ["DOMAIN", "QLinearAdd", "QLinearAveragePool", "QLinearConcat", "QLinearGlobalAveragePool",
           "QLinearLeakyRelu", "QLinearMul", "QLinearSigmoid", "QLinearSoftmax"]
