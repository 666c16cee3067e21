"""Quantized ONNX: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger,
ConvInteger, QLinearMatMul, QLinearConv (ONNX Runtime's ``QGemm``: :mod:`.microsoft`).

Arithmetic is ONNX's: quantizing rounds half to even and saturates to the target's range
(``y = clip(round(x / scale) + zero_point)``); dequantizing is ``(x - zero_point) * scale``;
integer contractions accumulate ``(a - a_zero_point) * (b - b_zero_point)`` in int32 and
the QLinear ops requantize with the float32 multiplier ``a_scale * b_scale / y_scale``.

Each op is an index expression written per node: scales and zero points are read per tensor
(``S[]``), per axis (``S[i1]``), per row or column (``ZB[n]``) or per output channel; the
padding of a convolution reads as the zero point (``fill(X[..], ZX)``). The saturation range
comes from the output dtype, which is the zero point's: the ops read that input like a
constant (``reads``), and a node whose zero point is not constant, or that quantizes in
blocks (``block_size``: the index would be ``i // block_size``), runs the numpy reference.

Example:
    >>> from metadef.ops import get_op, infer_types
    >>> from metadef.shape import parse_type
    >>> y, = infer_types(get_op("QuantizeLinear"), "/q", [parse_type("f32[batch,3,8]"),
    ...                  parse_type("f32[3]"), parse_type("i8[3]")], {})
    >>> str(y)
    'i8[batch,3,8]'
    >>> quantize_semantics({"axis": 1, "block_size": 0, "output_dtype": 0, "saturate": 1,
    ...                     "precision": 0}, [(2, 3), (3,), (3,)], [None, None,
    ...                     np.zeros(3, np.int8)])[0]
    'Y[i0, i1] = min(max(round(X[i0, i1] / Y_scale[i1]) + cast_float32(Y_zero_point[i1]), LO), HI)'
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

import ml_dtypes
import numpy as np

from metadef.core.dtypes import FLOAT32, UINT8, DType, from_onnx
from metadef.core.errors import ShapeError
from metadef.ops.defs.linalg import MatMul, _matmul_infer
from metadef.ops.defs.nn import Conv, conv_semantics
from metadef.ops.defs.nn_pool import WINDOW_ATTRS, window_infer
from metadef.ops.infer import InferContext
from metadef.ops.interface import int_
from metadef.ops.metaop import metaop
from metadef.ops.semantic_tree import CAST_DTYPE_NAMES
from metadef.ops.strategy import Role
from metadef.shape import Dim, TensorType

Arrays = list[np.ndarray | None]
Shapes = Sequence[Sequence[Dim] | None]
Semantics = tuple[str, dict[str, Any]] | None

_QUANT_TYPES = "int8, uint8, int16, uint16, int4, uint4, int2, uint2, float8, float4e2m1"

# ------------------------------------------------------------------------------ helpers


def saturation(dtype: np.dtype) -> tuple[float, float] | None:
    """The range a quantized value saturates to (None: a float type ml_dtypes rounds itself).

    Example:
        >>> saturation(np.dtype(np.int8)), saturation(np.dtype(ml_dtypes.uint4))
        ((-128.0, 127.0), (0.0, 15.0))
    """
    try:
        info = ml_dtypes.iinfo(dtype)
    except (TypeError, ValueError):
        if dtype.name.startswith("float8"):
            finfo = ml_dtypes.finfo(dtype)
            return float(finfo.min), float(finfo.max)
        return None
    return float(info.min), float(info.max)


def is_integer(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is an integer type, ml_dtypes' int4/int2 included (numpy kind 'V')."""
    try:
        ml_dtypes.iinfo(dtype)
    except (TypeError, ValueError):
        return False
    return True


def per_axis(name: str, shape: Sequence[Dim] | None, var: str) -> str | None:
    """How a scale or zero point is read: ``name[]`` (a scalar), ``name[0]`` (one element),
    ``name[var]`` (a 1-D vector along ``var``); None for other shapes (the reference runs).

    Example:
        >>> per_axis("S", (), "i1"), per_axis("S", (1,), "i1"), per_axis("S", (3,), "i1")
        ('S[]', 'S[0]', 'S[i1]')
    """
    if shape is None or len(shape) > 1:
        return None
    if not shape:
        return f"{name}[]"
    return f"{name}[0]" if shape[0] == 1 else f"{name}[{var}]"


def scalar(name: str, shape: Sequence[Dim] | None) -> str | None:
    """``name[]`` or ``name[0]`` for a per-tensor value; None for a vector or unknown shape."""
    if shape is None or len(shape) > 1 or (shape and shape[0] != 1):
        return None
    return f"{name}[0]" if shape else f"{name}[]"


def check_vector(ctx: InferContext, i: int, what: str, size: Dim | None = None) -> None:
    """Input ``i`` must be a scalar, one element, or (when ``size`` is given) a 1-D vector of
    ``size`` elements."""
    shape = ctx.shape(i) if ctx.has(i) else ()
    if shape is None or (len(shape) == 0) or (len(shape) == 1 and shape[0] in (1, size)):
        return
    if len(shape) == 1 and size is not None and not (isinstance(shape[0], int) and isinstance(size, int)):
        return
    want = "a scalar" + ("" if size is None else f" or a 1-D tensor of {size} elements")
    ctx.fail(f"input {i} ({what}) must be {want}, got shape {list(shape)}")


def expand(value: np.ndarray, shape: tuple[int, ...], axis: int, block_size: int) -> np.ndarray:
    """A scale or zero point made broadcastable to ``shape``: per tensor, per axis, or
    repeated over blocks of ``block_size`` along ``axis`` (ONNX's ``reshape_input``)."""
    value = np.asarray(value)
    if value.size == 1 and (value.ndim <= 1 or not block_size):
        return value.reshape(())
    if not block_size:
        dims = [1] * len(shape)
        dims[axis] = value.size
        return value.reshape(dims)
    repeated = np.repeat(value, block_size, axis=axis)
    return np.take(repeated, np.arange(shape[axis]), axis=axis)


def _check_blocked(ctx: InferContext, x: Sequence[Dim], scale: Sequence[Dim], axis: int) -> None:
    block = ctx.attrs["block_size"]
    if block < 0:
        ctx.fail(f"block_size must be >= 0, got {block}")
    if block == 0:
        if len(scale) > 1:
            ctx.fail(f"the scale must be a scalar or 1-D (per axis) without block_size, got "
                     f"rank {len(scale)}", hint="set block_size for blocked quantization")
        if len(scale) == 1 and scale[0] != 1 and isinstance(x[axis], int) \
                and isinstance(scale[0], int) and scale[0] != x[axis]:
            ctx.fail(f"a per-axis scale needs one value per element of axis {axis} "
                     f"({x[axis]}), got {scale[0]}")
        return
    if len(scale) != len(x):
        ctx.fail(f"a blocked scale must have the input's rank {len(x)}, got {len(scale)}")
    for i, (d, s) in enumerate(zip(x, scale)):
        want = -(-d // block) if i == axis else d
        if isinstance(want, int) and isinstance(s, int) and want != s:
            ctx.fail(f"a blocked scale must have shape {list(x)} with axis {axis} divided into "
                     f"blocks of {block} ({want}); got {s} at axis {i}")


def _axis(ctx: InferContext, rank: int, scale: Sequence[Dim]) -> int:
    """The quantization axis, checked where it matters (a vector or blocked scale)."""
    axis = ctx.attrs["axis"]
    if scale and scale != (1,) and not -rank <= axis < rank:
        ctx.fail(f"axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


# ------------------------------------------------------------------- QuantizeLinear


def _quantize_rule(ctx: InferContext) -> list[Any]:
    attrs = ctx.attrs
    out: DType = from_onnx(attrs["output_dtype"]) if attrs["output_dtype"] else UINT8
    if ctx.has(2):
        if attrs["output_dtype"] and ctx.dtype(2) is not out:
            ctx.fail(f"output_dtype {out.name} disagrees with the zero point's dtype "
                     f"{ctx.dtype(2).name}")
        out = ctx.dtype(2)
    if saturation(np.dtype(out.numpy)) is None and out.name != "float4e2m1":
        ctx.fail(f"cannot quantize to {out.name}", hint=f"quantize to one of {_QUANT_TYPES}")
    x, scale = ctx.shape(0), ctx.shape(1)
    if x is not None and scale is not None:
        _check_blocked(ctx, x, scale, _axis(ctx, len(x), scale))
    return [TensorType(out, x)]


def quantize_semantics(attrs: Mapping[str, Any], shapes: Shapes,
                       values: Sequence[np.ndarray | None]) -> Semantics:
    """``Y = min(max(round(X / S) + Z, LO), HI)`` read per tensor or per axis."""
    x = shapes[0]
    has_zero = len(shapes) > 2 and shapes[2] is not None
    zero = values[2] if len(values) > 2 else None
    if x is None or attrs["block_size"] or (has_zero and zero is None):
        return None
    target = np.asarray(zero).dtype if has_zero else np.dtype(
        from_onnx(attrs["output_dtype"]).numpy if attrs["output_dtype"] else np.uint8)
    ix = ", ".join(f"i{k}" for k in range(len(x)))
    var = f"i{attrs['axis'] % len(x)}" if x else ""
    scale = per_axis("Y_scale", shapes[1], var)
    zero_at = per_axis("Y_zero_point", shapes[2], var) if has_zero else "0"
    if scale is None or zero_at is None:
        return None
    body = f"X[{ix}] / {scale}"
    if attrs["precision"]:
        name = from_onnx(attrs["precision"]).numpy().dtype.name
        body = f"cast_{name}(X[{ix}]) / cast_{name}({scale})"
    bounds = saturation(target)
    if is_integer(target):
        zero_text = f" + cast_float32({zero_at})" if has_zero else ""
        body = f"min(max(round({body}){zero_text}, LO), HI)"
    elif target.name in CAST_DTYPE_NAMES and bounds is not None:  # float8
        body = f"min(max({body}, LO), HI)" if attrs["saturate"] else body
        body = f"cast_{target.name}({body})"
    else:
        return None
    params = {} if bounds is None else {"LO": bounds[0], "HI": bounds[1]}
    return f"Y[{ix}] = {body}", params


def quantize_reference(inputs: Arrays, attrs: Mapping[str, Any]) -> np.ndarray:
    """ONNX's QuantizeLinear in numpy (every form, blocked included)."""
    x, scale, zero = inputs[0], inputs[1], inputs[2] if len(inputs) > 2 else None
    shape, block = np.shape(x), attrs["block_size"]
    axis = attrs["axis"] % max(len(shape), 1)
    if zero is not None:
        target = np.asarray(zero).dtype
    else:
        target = np.dtype(from_onnx(attrs["output_dtype"]).numpy if attrs["output_dtype"] else np.uint8)
    scale = expand(scale, shape, axis, block)
    if attrs["precision"]:
        work = from_onnx(attrs["precision"]).numpy
        ratio = np.asarray(x).astype(work) / scale.astype(work)
    else:
        ratio = np.asarray(x) / scale
    bounds = saturation(target)
    with np.errstate(invalid="ignore", over="ignore"):
        if is_integer(target):
            q = np.rint(ratio).astype(np.float64)
            if zero is not None:
                q = q + expand(zero, shape, axis, block).astype(np.float64)
            return np.clip(q, *bounds).astype(target)
        if bounds is not None and attrs["saturate"]:
            ratio = np.clip(ratio.astype(np.float32), *bounds)
        return np.asarray(ratio).astype(np.float32).astype(target)


QuantizeLinear = metaop(
    "QuantizeLinear", inputs=("X: T1", "Y_scale: T2", "Y_zero_point?: T3"), outputs=("Y: T3",),
    attrs={"axis": int_(1), "saturate": int_(1), "block_size": int_(0), "output_dtype": int_(0),
           "precision": int_(0)},
    types=f"T1 in {{float}}; T2 in {{float}}; T3 in {{{_QUANT_TYPES}}}",
    rule=_quantize_rule, semantics=quantize_semantics, reference=quantize_reference,
    role=Role.ELEMENTWISE, reads=(2,), passed=(1, 2), since=(10, 13, 19, 21, 23, 24, 25, 28),
    doc="y = saturate(round_half_even(x / scale) + zero_point); per tensor, axis or block.",
)


# ----------------------------------------------------------------- DequantizeLinear


def _dequantize_rule(ctx: InferContext) -> list[Any]:
    code = ctx.attrs["output_dtype"]
    scale_dtype = ctx.dtype(1)
    out = from_onnx(code) if code else (FLOAT32 if scale_dtype.name == "float8e8m0" else scale_dtype)
    if out.kind != "float" or out.bits < 16:
        ctx.fail(f"output_dtype {out.name} is not float32, float16 or bfloat16")
    x, scale = ctx.shape(0), ctx.shape(1)
    if x is not None and scale is not None:
        _check_blocked(ctx, x, scale, _axis(ctx, len(x), scale))
    return [TensorType(out, x)]


def dequantize_semantics(attrs: Mapping[str, Any], shapes: Shapes) -> Semantics:
    """``Y = (X - Z) * S`` in float32, read per tensor or per axis (float8 zero points are 0)."""
    x = shapes[0]
    if x is None or attrs["block_size"]:
        return None
    ix = ", ".join(f"i{k}" for k in range(len(x)))
    var = f"i{attrs['axis'] % len(x)}" if x else ""
    scale = per_axis("X_scale", shapes[1], var)
    has_zero = len(shapes) > 2 and shapes[2] is not None
    zero = per_axis("X_zero_point", shapes[2], var) if has_zero else ""
    if scale is None or zero is None:
        return None
    shifted = f"(cast_float32(X[{ix}]) - cast_float32({zero}))" if has_zero else f"cast_float32(X[{ix}])"
    return f"Y[{ix}] = {shifted} * cast_float32({scale})", {}


def dequantize_reference(inputs: Arrays, attrs: Mapping[str, Any]) -> np.ndarray:
    """ONNX's DequantizeLinear in numpy (every form, blocked included)."""
    x, scale, zero = inputs[0], inputs[1], inputs[2] if len(inputs) > 2 else None
    shape, block = np.shape(x), attrs["block_size"]
    axis = attrs["axis"] % max(len(shape), 1)
    shifted = np.asarray(x).astype(np.float32)
    if zero is not None:
        shifted = shifted - expand(zero, shape, axis, block).astype(np.float32)
    return shifted * expand(scale, shape, axis, block).astype(np.float32)


DequantizeLinear = metaop(
    "DequantizeLinear", inputs=("X: T1", "X_scale: T2", "X_zero_point?: T1"), outputs=("Y: T3",),
    attrs={"axis": int_(1), "block_size": int_(0), "output_dtype": int_(0)},
    types=f"T1 in {{{_QUANT_TYPES}, int32}}; T2 in {{float, float8e8m0}}; T3 in {{float}}",
    rule=_dequantize_rule, semantics=dequantize_semantics, reference=dequantize_reference,
    role=Role.ELEMENTWISE, passed=(1, 2), since=(10, 13, 19, 21, 23, 24, 25, 28),
    doc="y = (x - zero_point) * scale, computed in float32; per tensor, axis or block.",
)


# ------------------------------------------------------------ DynamicQuantizeLinear


def dynamic_quantize_semantics(attrs: Mapping[str, Any], shapes: Shapes) -> str | None:
    """Range over every element (widened to hold 0), then QuantizeLinear to uint8; a constant
    input gets scale 1 (ONNX Runtime's choice)."""
    if shapes[0] is None:
        return None
    ix = ", ".join(f"i{k}" for k in range(len(shapes[0])))
    x = f"X[{ix}]"
    top, bottom = (f"max[{ix}] {x}", f"min[{ix}] {x}") if ix else (x, x)
    return (f"hi[] = max({top}, 0); lo[] = min({bottom}, 0)\n"
            "Y_scale[] = where(hi[] == lo[], 1, (hi[] - lo[]) / 255)\n"
            "Y_zero_point[] = round(min(max(0 - lo[] / Y_scale[], 0), 255))\n"
            f"Y[{ix}] = min(max(round({x} / Y_scale[]) + Y_zero_point[], 0), 255)")


def _dynamic_rule(ctx: InferContext) -> list[Any]:
    return [TensorType(UINT8, ctx.shape(0)), TensorType(FLOAT32, ()), TensorType(UINT8, ())]


DynamicQuantizeLinear = metaop(
    "DynamicQuantizeLinear", inputs=("X: float32",),
    outputs=("Y: uint8", "Y_scale: float32", "Y_zero_point: uint8"),
    types="", rule=_dynamic_rule, semantics=dynamic_quantize_semantics,
    role=Role.REDUCTION, since=(11,),
    doc="uint8 quantization with scale and zero point from the input's range (and 0).",
)


# ----------------------------------------------------------------- integer MatMul


def matmul_rule(ctx: InferContext, a: int, b: int) -> tuple[Dim, ...] | None:
    """The MatMul shape of inputs ``a`` and ``b`` (their dtypes may differ)."""
    if not ctx.has(a) or not ctx.has(b):
        ctx.fail("both matrix operands are required")
    ta, tb = ctx.inputs[a], ctx.inputs[b]
    inner = dataclasses.replace(ctx, op=MatMul, inputs=[ta, TensorType(ta.dtype, tb.shape)],
                                bound={"T": ta.dtype})
    try:
        shape, = _matmul_infer(inner)
    except ShapeError as e:  # said of MatMul: say it of this node
        ctx.fail(str(e).split("}: ", 1)[-1])
    return shape


def _matmul_text(shapes: Shapes, za: str | None, zb: str | None) -> tuple[str, str] | None:
    """The output index and ``sum[k] (A - ZA) * (B - ZB)`` in int32 (ZA per row m, ZB per
    column n); ``shapes`` are those of A, B, ZA, ZB. None where a shape is unknown or odd."""
    sa, sb = shapes[0], shapes[1]
    if sa is None or sb is None:
        return None
    rows, cols = len(sa) > 1, len(sb) > 1
    batch = "..., " if rows or cols else ""
    a_at = f"A[{batch}m, k]" if rows else "A[k]"
    b_at = f"B[{batch}k, n]" if cols else "B[k]"
    out = ", ".join([*(["..."] if batch else []), *(["m"] if rows else []), *(["n"] if cols else [])])
    terms = []
    for at, zero, shape, var in ((a_at, za, shapes[2], "m"), (b_at, zb, shapes[3], "n")):
        if zero is None or shape is None:
            terms.append(f"cast_int32({at})")
            continue
        z = per_axis(zero, shape, var)
        if z is None or (z.endswith(f"[{var}]") and not (rows if var == "m" else cols)):
            return None
        terms.append(f"(cast_int32({at}) - cast_int32({z}))")
    return f"[{out}]", f"sum[k] {terms[0]} * {terms[1]}"


def _shape_at(shapes: Shapes, i: int) -> Sequence[Dim] | None:
    return shapes[i] if i < len(shapes) else None


def matmul_integer_semantics(attrs: Mapping[str, Any], shapes: Shapes) -> Semantics:
    """``Y[.., m, n] = sum[k] (A - ZA) * (B - ZB)`` accumulated in int32."""
    parts = _matmul_text([shapes[0], shapes[1], _shape_at(shapes, 2), _shape_at(shapes, 3)],
                         "A_zero_point", "B_zero_point")
    return None if parts is None else (f"Y{parts[0]} = {parts[1]}", {})


def _zero(value: Any, column: int) -> np.ndarray:
    """A per-row 1-D vector as a column (to broadcast over a row's elements) when ``column``."""
    z = np.asarray(value)
    return z.reshape(-1, 1) if z.ndim == 1 and z.size > 1 and column else z


def integer_matmul(a: np.ndarray, b: np.ndarray, za: Any, zb: Any) -> np.ndarray:
    """``(a - za) @ (b - zb)`` in int32; a 1-D ``za`` is per row of ``a``, ``zb`` per column."""
    a32, b32 = np.asarray(a).astype(np.int32), np.asarray(b).astype(np.int32)
    if za is not None:
        a32 = a32 - _zero(za, a32.ndim > 1).astype(np.int32)
    if zb is not None:
        b32 = b32 - np.asarray(zb).astype(np.int32)
    return np.matmul(a32, b32)


def _matmul_integer_reference(inputs: Arrays, attrs: Mapping[str, Any]) -> np.ndarray:
    padded = list(inputs) + [None] * (4 - len(inputs))
    return integer_matmul(*padded[:4])


def _matmul_integer_rule(ctx: InferContext) -> list[Any]:
    return [matmul_rule(ctx, 0, 1)]


MatMulInteger = metaop(
    "MatMulInteger", inputs=("A: T1", "B: T2", "A_zero_point?: T1", "B_zero_point?: T2"),
    outputs=("Y: int32",), types="T1 in {int8, uint8}; T2 in {int8, uint8}",
    rule=_matmul_integer_rule, semantics=matmul_integer_semantics,
    reference=_matmul_integer_reference, role=Role.CONTRACTION, parallel=("m", "n"), since=(10,),
    doc="(A - a_zero_point) @ (B - b_zero_point) in int32; zero points per tensor, row or column.",
)


# ----------------------------------------------------------------------- QLinearMatMul

# A, A_scale, A_zero_point, B, B_scale, B_zero_point, Y_scale, Y_zero_point
_QMM = ("A", "A_scale", "A_zero_point", "B", "B_scale", "B_zero_point", "Y_scale", "Y_zero_point")


def requantize(acc: str, multiplier: str, zero: str) -> str:
    """``min(max(round(float32(acc) * multiplier) + zero, LO), HI)``: ONNX Runtime's
    requantization of an int32 accumulator."""
    return f"min(max(round(cast_float32({acc}) * ({multiplier})) + cast_float32({zero}), LO), HI)"


def qlinear_matmul_semantics(attrs: Mapping[str, Any], shapes: Shapes,
                             values: Sequence[np.ndarray | None]) -> Semantics:
    """Integer MatMul, then requantized with ``A_scale * B_scale / Y_scale``."""
    zero = values[7] if len(values) > 7 else None
    parts = _matmul_text([shapes[0], shapes[3], shapes[2], shapes[5]], "A_zero_point", "B_zero_point")
    if zero is None or parts is None:
        return None
    rows, cols = len(shapes[0]) > 1, len(shapes[3]) > 1
    sa = per_axis("A_scale", shapes[1], "m")
    sb = per_axis("B_scale", shapes[4], "n")
    sy = per_axis("Y_scale", shapes[6], "m")
    zy = per_axis("Y_zero_point", shapes[7], "m")
    vector = [t for t, ok in ((sa, rows), (sb, cols), (sy, rows), (zy, rows))
              if t is None or (t.endswith(("[m]", "[n]")) and not ok)]
    bounds = saturation(np.asarray(zero).dtype)
    if vector or bounds is None:
        return None
    body = requantize(parts[1], f"{sa} * {sb} / {sy}", zy)
    return f"Y{parts[0]} = {body}", {"LO": bounds[0], "HI": bounds[1]}


def qlinear_matmul_reference(inputs: Arrays, attrs: Mapping[str, Any]) -> np.ndarray:
    """Integer MatMul and requantization in numpy (a, y per row; b per column)."""
    a, sa, za, b, sb, zb, sy, zy = inputs[:8]
    acc = integer_matmul(a, b, za, zb)
    column = 1 if np.ndim(a) > 1 else 0  # a per-row value broadcasts over the columns
    sa, sy, zr = (_zero(v, column) if np.size(v) > 1 else np.asarray(v).reshape(())
                  for v in (sa, sy, zy))
    multiplier = sa * np.asarray(sb).reshape(-1 if np.size(sb) > 1 else ()) / sy
    scaled = np.rint(acc.astype(np.float32) * multiplier) + zr.astype(np.float32)
    return np.clip(scaled, *saturation(np.asarray(zy).dtype)).astype(np.asarray(zy).dtype)


def _qlinear_matmul_rule(ctx: InferContext) -> list[Any]:
    return [matmul_rule(ctx, 0, 3)]


QLinearMatMul = metaop(
    "QLinearMatMul", inputs=("A: T1", "A_scale: TS", "A_zero_point: T1", "B: T2", "B_scale: TS",
                             "B_zero_point: T2", "Y_scale: TS", "Y_zero_point: T3"),
    outputs=("Y: T3",),
    types="TS in {float}; T1 in {int8, uint8}; T2 in {int8, uint8}; T3 in {int8, uint8}",
    rule=_qlinear_matmul_rule, semantics=qlinear_matmul_semantics,
    reference=qlinear_matmul_reference, role=Role.CONTRACTION, parallel=("m", "n"),
    reads=(7,), since=(10, 21),
    doc="Quantized MatMul: int32 accumulation, requantized with a_scale * b_scale / y_scale.",
)


# ------------------------------------------------------------ ConvInteger, QLinearConv

_CONV = re.compile(r"^(?P<out>Y\[[^\]]*\]) = (?P<bias>B\[[^\]]*\] \+ )?(?P<sum>sum\[[^\]]*\]) "
                   r"(?P<x>X\[[^\]]*\]) \* (?P<w>W\[(?P<k>[^,\]]*)[^\]]*\])$")


def integer_conv(attrs: Mapping[str, Any], shapes: Shapes, zx: Sequence[Dim] | None,
                 zw: Sequence[Dim] | None, zx_name: str, zw_name: str,
                 ) -> tuple[str, str, str, dict[str, Any]] | None:
    """Conv's expression over ``X - ZX`` (padding reads as ``ZX``, so it shifts to 0) and
    ``W - ZW`` (ZW per output channel), in int32: (output access, bias part, accumulator,
    params)."""
    if shapes[0] is None or shapes[1] is None:
        return None
    text, params = conv_semantics(attrs, list(shapes))
    m = _CONV.match(text)
    if m is None:
        return None
    x, w = m["x"], m["w"]
    if zx is not None:
        z = scalar(zx_name, zx)
        if z is None:
            return None
        x = f"(cast_int32(fill({x}, {z})) - cast_int32({z}))"
    else:
        x = f"cast_int32({x})"
    if zw is not None:
        z = per_axis(zw_name, zw, m["k"])
        if z is None:
            return None
        w = f"(cast_int32({w}) - cast_int32({z}))"
    else:
        w = f"cast_int32({w})"
    return m["out"], m["bias"] or "", f"{m['sum']} {x} * {w}", params


def conv_integer_semantics(attrs: Mapping[str, Any], shapes: Shapes) -> Semantics:
    """``Y = sum (X - ZX) * (W - ZW)`` in int32, over Conv's window."""
    parts = integer_conv(attrs, shapes[:2], _shape_at(shapes, 2), _shape_at(shapes, 3),
                         "X_zero_point", "W_zero_point")
    return None if parts is None else (f"{parts[0]} = {parts[2]}", parts[3])


def qlinear_conv_semantics(attrs: Mapping[str, Any], shapes: Shapes,
                           values: Sequence[np.ndarray | None]) -> Semantics:
    """Integer Conv plus the int32 bias, requantized per output channel with
    ``X_scale * W_scale[k] / Y_scale``."""
    zero = values[7] if len(values) > 7 else None
    bias = _shape_at(shapes, 8)
    parts = integer_conv(attrs, [shapes[0], shapes[3], bias], shapes[2], shapes[5],
                         "X_zero_point", "W_zero_point")
    if zero is None or parts is None:
        return None
    out, bias_text, acc, params = parts
    k = out.split(",")[1].strip()
    sx, sw, sy = scalar("X_scale", shapes[1]), per_axis("W_scale", shapes[4], k), \
        scalar("Y_scale", shapes[6])
    zy = scalar("Y_zero_point", shapes[7])
    bounds = saturation(np.asarray(zero).dtype)
    if None in (sx, sw, sy, zy) or bounds is None:
        return None
    body = requantize(f"{bias_text}{acc}", f"{sx} * {sw} / {sy}", zy)
    return f"{out} = {body}", {**params, "LO": bounds[0], "HI": bounds[1]}


def _conv_rule(ctx: InferContext, x: int, w: int) -> tuple[Dim, ...] | None:
    tx, tw = ctx.inputs[x], ctx.inputs[w]
    if tx is None or tw is None:
        ctx.fail("the input and the weight are required")
    inner = dataclasses.replace(ctx, op=Conv, inputs=[tx, TensorType(tx.dtype, tw.shape)],
                                bound={"T": tx.dtype})
    try:
        out, = window_infer(inner, ctx.attrs.get("kernel_shape"), weight=True)
    except ShapeError as e:  # said of Conv: say it of this node
        ctx.fail(str(e).split("}: ", 1)[-1])
    return None if out is None else out.shape


def _out_channels(ctx: InferContext, w: int) -> Dim | None:
    shape = ctx.shape(w)
    return shape[0] if shape else None


def _conv_integer_rule(ctx: InferContext) -> list[Any]:
    check_vector(ctx, 2, "x_zero_point")
    check_vector(ctx, 3, "w_zero_point", _out_channels(ctx, 1))
    return [_conv_rule(ctx, 0, 1)]


def _qlinear_conv_rule(ctx: InferContext) -> list[Any]:
    channels = _out_channels(ctx, 3)
    for i, what in ((1, "x_scale"), (2, "x_zero_point"), (6, "y_scale"), (7, "y_zero_point")):
        check_vector(ctx, i, what)
    check_vector(ctx, 4, "w_scale", channels)
    check_vector(ctx, 5, "w_zero_point", channels)
    if ctx.has(8) and ctx.shape(8) is not None and len(ctx.shape(8)) != 1:
        ctx.fail(f"the bias B must be 1-D (one int32 per output channel), got shape {list(ctx.shape(8))}")
    return [_conv_rule(ctx, 0, 3)]


ConvInteger = metaop(
    "ConvInteger", inputs=("X: T1", "W: T2", "X_zero_point?: T1", "W_zero_point?: T2"),
    outputs=("Y: int32",), attrs={**WINDOW_ATTRS, "group": int_(1)},
    types="T1 in {int8, uint8}; T2 in {int8, uint8}",
    rule=_conv_integer_rule, semantics=conv_integer_semantics,
    role=Role.CONTRACTION, layouts=("NCHW",), parallel=("n", "k"), since=(10,),
    doc="Conv over (x - x_zero_point) and (w - w_zero_point) in int32; padding is the zero point.",
)

QLinearConv = metaop(
    "QLinearConv", inputs=("X: T1", "X_scale: float32", "X_zero_point: T1", "W: T2",
                           "W_scale: float32", "W_zero_point: T2", "Y_scale: float32",
                           "Y_zero_point: T3", "B?: int32"),
    outputs=("Y: T3",), attrs={**WINDOW_ATTRS, "group": int_(1)},
    types="T1 in {int8, uint8}; T2 in {int8, uint8}; T3 in {int8, uint8}",
    rule=_qlinear_conv_rule, semantics=qlinear_conv_semantics,
    role=Role.CONTRACTION, layouts=("NCHW",), parallel=("n", "k"), reads=(7,), since=(10,),
    doc="Quantized Conv: int32 accumulation plus bias, requantized per output channel.",
)
