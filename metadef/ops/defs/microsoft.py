"""Contrib ops of domain ``com.microsoft`` that exporters and ONNX Runtime's tools emit.

The Gelu family (``Gelu``, ``FastGelu``, ``BiasGelu``, ``QuickGelu``) are index expressions
over ``X[...]`` (a bias, when present, is added first as a temporary ``xb``).
``SkipLayerNormalization`` is a layer normalization over the last axis of
``input + skip (+ bias)``; its optional outputs are the float32 statistics (with a kept
extent-1 last axis) and the sum itself. ``FusedMatMul`` is ``alpha * op(A) @ op(B)``, an index
expression unless a ``transBatch`` flag moves the batch axes (then a numpy reference).
``Attention`` is ORT's fused self-attention with a numpy reference; it supports the common
subset (masks given as 2-D ``[batch, total_seq]`` 0/1 or 1-D ``[batch]`` lengths,
``unidirectional``, ``scale``, ``qkv_hidden_sizes``, ``past``/``present``) and refuses the
rest by name. ``QGemm`` is ORT's quantized Gemm (what its quantizer writes in QOperator form,
and what :mod:`metadef.passes.recognize_quantized` makes of a QDQ Gemm), with a numpy reference;
``MatMulIntegerToFloat`` is ORT's integer MatMul scaled to float32 (what the same pass makes of
``quantize_dynamic``'s ``MatMulInteger -> Cast -> Mul``), with a numpy reference.

Example:
    >>> from metadef.ops import get_op, infer_types
    >>> from metadef.shape import parse_type
    >>> get_op("QuickGelu", DOMAIN).semantics.expression
    'Y[...] = X[...] * sigmoid(alpha * X[...])'
    >>> y, present = infer_types(get_op("Attention", DOMAIN), "/attn",
    ...     [parse_type("f32[b,s,64]"), parse_type("f32[64,192]"), parse_type("f32[192]")],
    ...     {"num_heads": 4}, n_outputs=2)
    >>> str(y), str(present)
    ('f32[b,s,64]', 'f32[2,b,4,s,16]')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from metadef.core.dtypes import FLOAT32, UINT8
from metadef.core.errors import UnsupportedOpError
from metadef.ops.defs.quantized import integer_matmul, matmul_rule, saturation
from metadef.ops.infer import InferContext
from metadef.ops.interface import REQUIRED, float_, int_, ints
from metadef.ops.metaop import SAME_AS_FIRST, metaop
from metadef.ops.strategy import Role
from metadef.shape import Dim, TensorType, add, broadcast_shapes, floordiv

DOMAIN = "com.microsoft"
Shapes = Sequence[Sequence[Dim] | None]

# ------------------------------------------------------------------------- Gelu family

_ERF_GELU = "{x} * ndtr({x})"  # 0.5 x (1 + erf(x / sqrt 2)): x times the normal CDF
_TANH_GELU = "0.5 * {x} * (1 + tanh(0.7978845608028654 * ({x} + 0.044715 * {x} * {x} * {x})))"


def _biased(formula: str, bias: str) -> Any:
    """Semantics of ``formula`` applied to ``X`` plus (when the node has it) a bias input
    broadcast numpy-style against X's trailing axes."""

    def semantics(attrs: Mapping[str, Any], shapes: Shapes) -> str:
        if len(shapes) < 2 or shapes[1] is None:
            return "Y[...] = " + formula.format(x="X[...]")
        return f"xb[...] = X[...] + {bias}[...]\nY[...] = " + formula.format(x="xb[...]")

    return semantics


def _bias_rule(ctx: InferContext) -> list[Any]:
    x = ctx.shape(0)
    if ctx.has(1) and x is not None and ctx.shape(1) is not None:
        b = ctx.shape(1)
        if len(b) != 1 or (x and str(b[0]) != str(x[-1])):
            ctx.fail(f"the bias must be 1-D with X's last dimension ({x[-1] if x else '?'}), "
                     f"got shape {list(b)}")
    return [x]


_GELU_HINTS = {"types": "T in {float}", "role": Role.ELEMENTWISE, "domain": DOMAIN}

Gelu = metaop("Gelu", inputs=("X",), outputs=("Y",), rule=SAME_AS_FIRST,
              semantics="Y[...] = " + _ERF_GELU.format(x="X[...]"), **_GELU_HINTS)
FastGelu = metaop("FastGelu", inputs=("X", "bias?"), outputs=("Y",), rule=_bias_rule,
                  semantics=_biased(_TANH_GELU, "bias"), **_GELU_HINTS)
BiasGelu = metaop("BiasGelu", inputs=("X", "B"), outputs=("Y",), rule=_bias_rule,
                  semantics=_biased(_ERF_GELU, "B"), **_GELU_HINTS)
QuickGelu = metaop("QuickGelu", inputs=("X",), outputs=("Y",), rule=SAME_AS_FIRST,
                   attrs={"alpha": float_(1.702)},
                   semantics="Y[...] = X[...] * sigmoid(alpha * X[...])", **_GELU_HINTS)

# ------------------------------------------------------------ SkipLayerNormalization


def _skip_ln_rule(ctx: InferContext) -> list[Any]:
    x, skip = ctx.shape(0), ctx.shape(1)
    if x is None:
        return [None, TensorType(FLOAT32, None), TensorType(FLOAT32, None), None]
    if len(x) not in (2, 3):
        ctx.fail(f"input must be 2-D or 3-D ([batch, seq, hidden]), got rank {len(x)}")
    if skip is not None and (len(skip) > len(x) or str(skip[-1]) != str(x[-1])):
        ctx.fail(f"skip {list(skip)} must broadcast to input {list(x)} along its leading axes")
    for i in (2, 3, 4):
        s = ctx.shape(i)
        if s is not None and (len(s) != 1 or str(s[0]) != str(x[-1])):
            ctx.fail(f"{ctx.op.inputs[i].name} must be 1-D of the hidden size {x[-1]}, got {list(s)}")
    stats = TensorType(FLOAT32, (*x[:-1], 1))
    return [x, stats, stats, x]


def _skip_ln_semantics(attrs: Mapping[str, Any], shapes: Shapes) -> tuple[str, dict[str, Any]]:
    """``Sum = input + skip (+ bias)``; its mean and inverse standard deviation over the last
    axis in float32; ``Y = (Sum - Mean) * InvStdDev * gamma (+ beta)``."""
    x, skip = shapes[0], shapes[1]
    lead = [f"a{i}" for i in range(len(x) - 1)]
    full = ", ".join([*lead, "h"])
    # skip broadcasts along the leading axes: missing ones vanish, extent-1 ones read index 0
    skip_lead = [("0" if d == 1 and x[i + len(x) - len(skip)] != 1 else lead[i + len(x) - len(skip)])
                 for i, d in enumerate(skip[:-1])]
    total = f"X[{full}] + Skip[{', '.join([*skip_lead, 'h'])}]"
    if len(shapes) > 4 and shapes[4] is not None:
        total += " + Bias[h]"
    keep, zero = ", ".join([*lead, "k"]), ", ".join([*lead, "0"])
    text = (f"Sum[{full}] = {total}\n"
            f"xs[{full}] = cast_float32(Sum[{full}])\n"
            f"Mean[{keep}] = mean[b:N] xs[{', '.join([*lead, 'b + k*N'])}]\n"
            f"InvStdDev[{keep}] = rsqrt(mean[b:N] (xs[{', '.join([*lead, 'b + k*N'])}] - "
            f"Mean[{keep}]) ** 2 + epsilon)\n"
            f"Y[{full}] = (xs[{full}] - Mean[{zero}]) * InvStdDev[{zero}] * Gamma[h]")
    if len(shapes) > 3 and shapes[3] is not None:
        text += " + Beta[h]"
    return text, {"N": x[-1]}


SkipLayerNormalization = metaop(
    "SkipLayerNormalization", domain=DOMAIN,
    inputs=("X", "Skip", "Gamma", "Beta?", "Bias?"),
    outputs=("Y", "Mean?: float32", "InvStdDev?: float32", "Sum?"),
    attrs={"epsilon": float_(1e-12)}, types="T in {float}",
    rule=_skip_ln_rule, semantics=_skip_ln_semantics, role=Role.REDUCTION, parallel=("a0",),
)

# -------------------------------------------------------------------------- FusedMatMul


def _fused_matmul_perm(rank: int, trans: int, trans_batch: int) -> list[int]:
    """The axes of a stored operand in logical ``[batch..., rows, cols]`` order: transBatch
    moves axis 0 behind the batch axes, trans swaps the last two."""
    perm = list(range(rank))
    if trans_batch and rank > 2:
        perm = [*range(1, rank - 1), 0, rank - 1]
    if trans:
        perm[-2], perm[-1] = perm[-1], perm[-2]
    return perm


def _fused_matmul_rule(ctx: InferContext) -> list[Any]:
    a, b = ctx.shape(0), ctx.shape(1)
    if a is None or b is None:
        return [None]
    if len(a) < 2 or len(b) < 2:
        ctx.fail(f"both operands must have rank >= 2, got ranks {len(a)} and {len(b)}")
    at = ctx.attrs
    la = [a[p] for p in _fused_matmul_perm(len(a), at["transA"], at["transBatchA"])]
    lb = [b[p] for p in _fused_matmul_perm(len(b), at["transB"], at["transBatchB"])]
    if str(la[-1]) != str(lb[-2]):
        ctx.fail(f"the contracted sizes differ: op(A) is {la}, op(B) is {lb}")
    batch, _ = broadcast_shapes(la[:-2], lb[:-2])
    return [(*batch, la[-2], lb[-1])]


def _fused_matmul_semantics(attrs: Mapping[str, Any], shapes: Shapes) -> str | None:
    if (attrs["transBatchA"] and len(shapes[0]) > 2) or (attrs["transBatchB"] and len(shapes[1]) > 2):
        return None  # batch axes moved: the numpy reference runs it
    a = "A[..., k, m]" if attrs["transA"] else "A[..., m, k]"
    b = "B[..., n, k]" if attrs["transB"] else "B[..., k, n]"
    return f"Y[..., m, n] = alpha * sum[k] {a} * {b}"


def _fused_matmul_reference(inputs: list[np.ndarray | None], attrs: Mapping[str, Any]) -> np.ndarray:
    a, b = np.asarray(inputs[0]), np.asarray(inputs[1])
    a = a.transpose(_fused_matmul_perm(a.ndim, attrs["transA"], attrs["transBatchA"]))
    b = b.transpose(_fused_matmul_perm(b.ndim, attrs["transB"], attrs["transBatchB"]))
    return (np.matmul(a, b) * attrs["alpha"]).astype(a.dtype)


FusedMatMul = metaop(
    "FusedMatMul", domain=DOMAIN, inputs=("A", "B"), outputs=("Y",),
    attrs={"alpha": float_(1.0), "transA": int_(0), "transB": int_(0),
           "transBatchA": int_(0), "transBatchB": int_(0)},
    types="T in {float}", rule=_fused_matmul_rule, semantics=_fused_matmul_semantics,
    reference=_fused_matmul_reference, role=Role.CONTRACTION, parallel=("m", "n"),
)

# ---------------------------------------------------------------------------- Attention

_ATTENTION_INPUTS = ("input", "weights", "bias", "mask_index", "past", "attention_bias",
                     "past_sequence_length")
_UNSUPPORTED_ATTRS = ("do_rotary", "past_present_share_buffer", "rotary_embedding_dim")


def _attention_unsupported(attrs: Mapping[str, Any], present: Sequence[bool]) -> str | None:
    """Why a node is outside the supported subset (None when it is inside)."""
    for name in _UNSUPPORTED_ATTRS:
        if attrs.get(name):
            return f"attribute {name}={attrs[name]} is not supported (only 0)"
    for i in (5, 6):
        if i < len(present) and present[i]:
            return f"input {_ATTENTION_INPUTS[i]} is not supported"
    return None


def _hidden_sizes(attrs: Mapping[str, Any], total: Dim) -> tuple[Dim, Dim, Dim]:
    sizes = attrs.get("qkv_hidden_sizes")
    if sizes:
        if len(sizes) != 3:
            raise UnsupportedOpError(f"qkv_hidden_sizes must hold 3 sizes, got {list(sizes)}")
        return int(sizes[0]), int(sizes[1]), int(sizes[2])
    each = floordiv(total, 3)
    return each, each, each


def _attention_rule(ctx: InferContext) -> list[Any]:
    reason = _attention_unsupported(ctx.attrs, [ctx.has(i) for i in range(len(ctx.inputs))])
    if reason:
        ctx.fail(reason, "Attention supports input, weights, bias, mask_index and past, with "
                         "num_heads, unidirectional, scale, qkv_hidden_sizes, mask_filter_value")
    x, w = ctx.shape(0), ctx.shape(1)
    if x is None or w is None:
        return [None, None]
    if len(x) != 3 or len(w) != 2:
        ctx.fail(f"input must be [batch, seq, hidden] and weights 2-D, got ranks {len(x)} and {len(w)}")
    heads = ctx.attrs["num_heads"]
    q, k, v = _hidden_sizes(ctx.attrs, w[1])
    for name, size in (("q", q), ("k", k), ("v", v)):
        if isinstance(size, int) and size % heads:
            ctx.fail(f"the {name} hidden size {size} is not a multiple of num_heads={heads}")
    if str(q) != str(k):
        ctx.fail(f"the q and k hidden sizes must agree, got {q} and {k}")
    batch, seq = x[0], x[1]
    mask = ctx.shape(3)
    if mask is not None and not (len(mask) == 2 or (len(mask) == 1 and str(mask[0]) == str(batch))):
        ctx.fail(f"mask_index of shape {list(mask)} is not supported: give a 2-D [batch, "
                 "total_seq] 0/1 mask or 1-D [batch] lengths (3-D, 4-D and 1-D [2*batch] "
                 "start/end forms are not supported)")
    past = ctx.shape(4)
    total = seq if past is None else add(seq, past[3])
    if past is not None and str(k) != str(v):
        ctx.fail(f"past needs equal k and v hidden sizes, got {k} and {v}")
    present = (2, batch, heads, total, floordiv(k, heads))
    if str(k) != str(v):
        return [(batch, seq, v)]  # no present: its k and v halves would differ in size
    return [(batch, seq, v), present]


def _attention_reference(inputs: list[np.ndarray | None], attrs: Mapping[str, Any]) -> tuple:
    """ORT's Attention: project, split heads, ``softmax(scale * q k^T + mask) v``."""
    x, w, bias, mask, past = (*inputs, *[None] * 5)[:5]
    reason = _attention_unsupported(attrs, [a is not None for a in inputs])
    if reason:
        raise UnsupportedOpError(f"Attention: {reason}")
    return attention_of_projection(x @ w + (0 if bias is None else bias), attrs, mask, past, x.dtype)


def attention_of_projection(proj: np.ndarray, attrs: Mapping[str, Any], mask: np.ndarray | None,
                            past: np.ndarray | None, dtype: Any) -> tuple:
    """ORT's Attention from the projected ``[batch, seq, q + k + v]`` on: split heads,
    ``softmax(scale * q k^T + mask) v``; the output and (k and v of one size) the present."""
    batch, seq, _ = proj.shape
    heads = attrs["num_heads"]
    sizes = _hidden_sizes(attrs, proj.shape[-1])

    q, k, v = np.split(proj, [sizes[0], sizes[0] + sizes[1]], axis=-1)

    def split(t: np.ndarray) -> np.ndarray:  # [b, s, n*h] -> [b, n, s, h]
        return t.reshape(batch, seq, heads, -1).transpose(0, 2, 1, 3)

    q, k, v = split(q), split(k), split(v)
    past_len = 0
    if past is not None:
        past_len = past.shape[3]
        k, v = np.concatenate([past[0], k], axis=2), np.concatenate([past[1], v], axis=2)
    total = past_len + seq
    scale = attrs.get("scale") or 1.0 / np.sqrt(q.shape[-1])
    scores = (q @ k.transpose(0, 1, 3, 2)) * np.float32(scale)
    masked = np.zeros((batch, seq, total), bool)
    if mask is not None:
        if mask.ndim == 2:
            masked |= (mask == 0)[:, None, :]
        elif mask.shape == (batch,):
            masked |= (np.arange(total)[None, :] >= mask[:, None])[:, None, :]
        else:
            raise UnsupportedOpError(f"Attention: mask_index of shape {list(mask.shape)} is not "
                                     "supported (2-D [batch, total_seq] or 1-D [batch] only)")
    if attrs["unidirectional"]:
        masked |= (np.arange(total)[None, :] > np.arange(seq)[:, None] + past_len)[None]
    scores = scores + np.where(masked, np.float32(attrs["mask_filter_value"]), 0)[:, None]
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs = scores / scores.sum(axis=-1, keepdims=True)
    out = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, seq, -1)
    if k.shape != v.shape:  # no present output then (the rule refuses to give one)
        return (out.astype(dtype),)
    return out.astype(dtype), np.stack([k, v]).astype(dtype)


Attention = metaop(
    "Attention", domain=DOMAIN,
    inputs=("input", "weights", "bias?", "mask_index?: M", "past?", "attention_bias?",
            "past_sequence_length?: int32"),
    outputs=("output", "present?"),
    attrs={"num_heads": int_(REQUIRED), "unidirectional": int_(0), "scale": float_(0.0),
           "qkv_hidden_sizes": ints(None), "mask_filter_value": float_(-10000.0),
           "do_rotary": int_(0), "past_present_share_buffer": int_(0),
           "rotary_embedding_dim": int_(0)},
    types="T in {float}; M in {int32}", rule=_attention_rule,
    reference=_attention_reference, role=Role.OPAQUE,
)


# ------------------------------------------------------------- QGemm (ONNX Runtime's contrib op)


def qgemm_reference(inputs: list[np.ndarray | None], attrs: Mapping[str, Any]) -> np.ndarray:
    """ONNX Runtime's ``com.microsoft::QGemm`` in numpy: ``(A' - za) @ (B' - zb) + C`` in int32
    (``A'``, ``B'`` transposed as ``transA`` / ``transB`` say; ``zb`` per column), then with
    ``Y_scale`` requantized with ``alpha * a_scale * b_scale / y_scale`` as QLinearMatMul does,
    without it ``alpha * a_scale * b_scale`` times the sum in float32.

    Example:
        >>> a, b = np.array([[1, 2]], np.uint8), np.array([[3], [4]], np.int8)
        >>> one, zu, zs = np.float32(1), np.uint8(0), np.int8(0)
        >>> qgemm_reference([a, one, zu, b, one, zs, np.array([5], np.int32)], {"alpha": 1.0, "transA": 0,
        ...                  "transB": 0}).tolist()
        [[16.0]]
    """
    padded = list(inputs) + [None] * (9 - len(inputs))
    a, sa, za, b, sb, zb, c, sy, zy = padded[:9]
    a = np.asarray(a).T if attrs["transA"] else np.asarray(a)
    b = np.asarray(b).T if attrs["transB"] else np.asarray(b)
    acc = integer_matmul(a, b, za, zb)
    if c is not None:
        acc = acc + np.asarray(c, np.int32)
    scale = np.float32(attrs["alpha"]) * np.asarray(sa, np.float32).reshape(()) \
        * np.asarray(sb, np.float32).reshape(-1 if np.size(sb) > 1 else ())
    if sy is None:
        return (acc.astype(np.float32) * scale).astype(np.float32)
    multiplier = scale / np.asarray(sy, np.float32).reshape(())
    zero = np.asarray(0 if zy is None else zy)
    out = zero.dtype if zy is not None else np.dtype(np.uint8)
    scaled = np.rint(acc.astype(np.float32) * multiplier) + zero.astype(np.float32)
    return np.clip(scaled, *saturation(out)).astype(out)


def _qgemm_rule(ctx: InferContext) -> list[Any]:
    ta, tb = ctx.inputs[0], ctx.inputs[3]
    if ta is None or tb is None:
        ctx.fail("the matrix operands A and B are required")
    for t, what in ((ta, "A"), (tb, "B")):
        if t.shape is not None and len(t.shape) != 2:
            ctx.fail(f"{what} must be 2-D, got shape {list(t.shape)}")
    m = None if ta.shape is None else ta.shape[1 if ctx.attrs["transA"] else 0]
    n = None if tb.shape is None else tb.shape[0 if ctx.attrs["transB"] else 1]
    k_a = None if ta.shape is None else ta.shape[0 if ctx.attrs["transA"] else 1]
    k_b = None if tb.shape is None else tb.shape[1 if ctx.attrs["transB"] else 0]
    if isinstance(k_a, int) and isinstance(k_b, int) and k_a != k_b:
        ctx.fail(f"A' has {k_a} columns but B' has {k_b} rows")
    if ctx.has(7):
        out = ctx.dtype(8) if ctx.has(8) else UINT8
        return [TensorType(out, (m, n))]
    return [TensorType(FLOAT32, (m, n))]


QGemm = metaop(
    "QGemm", domain=DOMAIN,
    inputs=("A: TA", "a_scale: float32", "a_zero_point: TA", "B: TB", "b_scale: float32", "b_zero_point: TB",
            "C?: int32", "y_scale?: float32", "y_zero_point?: TY"),
    outputs=("Y: TR",), attrs={"alpha": float_(1.0), "transA": int_(0), "transB": int_(0)},
    types="TA in {int8, uint8}; TB in {int8, uint8}; TY in {int8, uint8}; TR in {float32, int8, uint8}",
    rule=_qgemm_rule, reference=qgemm_reference, role=Role.CONTRACTION, since=(1,),
    doc="ONNX Runtime's quantized Gemm: int32 product plus C, requantized (or scaled to float32).",
)


# ------------------------------------------- MatMulIntegerToFloat (ONNX Runtime's contrib op)


def matmul_integer_to_float_reference(inputs: list[np.ndarray | None], attrs: Mapping[str, Any]) -> np.ndarray:
    """ONNX Runtime's ``com.microsoft::MatMulIntegerToFloat`` in numpy: ``(A - a_zero_point) @
    (B - b_zero_point)`` in int32, times ``a_scale * b_scale`` (float32, ``b_scale`` and
    ``b_zero_point`` per column or per tensor), plus ``bias``: what ``quantize_dynamic``'s
    ``MatMulInteger -> Cast -> Mul(a_scale * b_scale) (-> Add(bias))`` computes, rounded the same.

    Example:
        >>> a, b = np.array([[1, 2]], np.uint8), np.array([[3], [4]], np.int8)
        >>> matmul_integer_to_float_reference([a, b, np.float32(0.5), np.float32(2), np.uint8(1), None,
        ...                                     np.array([0.25], np.float32)], {}).tolist()
        [[4.25]]
    """
    padded = list(inputs) + [None] * (7 - len(inputs))
    a, b, sa, sb, za, zb, bias = padded[:7]
    acc = integer_matmul(np.asarray(a), np.asarray(b), za, zb)
    scale = np.asarray(sa, np.float32).reshape(()) * np.asarray(sb, np.float32).reshape(-1 if np.size(sb) > 1 else ())
    y = (acc.astype(np.float32) * scale).astype(np.float32)
    return y if bias is None else (y + np.asarray(bias, np.float32)).astype(np.float32)


def _matmul_integer_to_float_rule(ctx: InferContext) -> list[Any]:
    shape = matmul_rule(ctx, 0, 1)
    tb = ctx.inputs[1]
    n = None if tb.shape is None or len(tb.shape) < 2 else tb.shape[-1]
    for i, what in ((2, "a_scale"), (4, "a_zero_point")):
        t = ctx.inputs[i] if ctx.has(i) else None
        if t is not None and t.shape is not None and any(d != 1 for d in t.shape):
            ctx.fail(f"{what} must hold one value (per tensor), got shape {list(t.shape)}")
    for i, what in ((3, "b_scale"), (5, "b_zero_point"), (6, "bias")):
        t = ctx.inputs[i] if ctx.has(i) else None
        if t is None or t.shape is None:
            continue
        if len(t.shape) > 1 or (t.shape and isinstance(n, int) and t.shape[0] not in (1, n)):
            ctx.fail(f"{what} must be one value or one per column of B ({n}), got shape {list(t.shape)}")
    return [TensorType(FLOAT32, shape)]


MatMulIntegerToFloat = metaop(
    "MatMulIntegerToFloat", domain=DOMAIN,
    inputs=("A: T1", "B: T2", "a_scale: float32", "b_scale: float32", "a_zero_point?: T1", "b_zero_point?: T2",
            "bias?: float32"),
    outputs=("Y: float32",), types="T1 in {int8, uint8}; T2 in {int8, uint8}",
    rule=_matmul_integer_to_float_rule, reference=matmul_integer_to_float_reference, role=Role.CONTRACTION,
    since=(1,),
    doc="ONNX Runtime's integer MatMul scaled to float32: (A - za) @ (B - zb) * a_scale * b_scale + bias.",
)



# ------------------------------------------------------------- QAttention (ONNX Runtime's contrib op)

_QATTENTION_ORDER = (0, 1, 2, 5, 8)
"""QAttention's input, weight, bias, mask_index and past: Attention's first five inputs."""


def qattention_reference(inputs: list[np.ndarray | None], attrs: Mapping[str, Any]) -> tuple:
    """ONNX Runtime's ``com.microsoft::QAttention`` in numpy: the projection as
    ``MatMulIntegerToFloat`` (``(input - izp) @ (weight - wzp)`` in int32, times ``input_scale *
    weight_scale``, plus ``bias``), then Attention's.

    Example:
        >>> x, w = np.ones((1, 2, 4), np.uint8), np.ones((4, 12), np.int8)
        >>> out, present = qattention_reference([x, w, np.zeros(12, np.float32), np.float32(0.5), np.float32(1)],
        ...                             {"num_heads": 2, "unidirectional": 0, "scale": 0.0, "qkv_hidden_sizes": None,
        ...                              "mask_filter_value": -10000.0})
        >>> out.shape, float(out[0, 0, 0])
        ((1, 2, 4), 2.0)
    """
    x, w, bias, sx, sw, mask, zx, zw, past = (*inputs, *[None] * 9)[:9]
    proj = matmul_integer_to_float_reference([x, w, sx, sw, zx, zw, bias], {})
    return attention_of_projection(proj, attrs, mask, past, np.float32)


def _qattention_rule(ctx: InferContext) -> list[Any]:
    reordered = [ctx.inputs[i] if i < len(ctx.inputs) else None for i in _QATTENTION_ORDER]
    if reordered[0] is not None:
        reordered[0] = TensorType(FLOAT32, reordered[0].shape)
    inner = dataclasses.replace(ctx, op=Attention, inputs=reordered,
                                values=[ctx.values[i] if i < len(ctx.values) else None for i in _QATTENTION_ORDER])
    return _attention_rule(inner)


QAttention = metaop(
    "QAttention", domain=DOMAIN,
    inputs=("input: T1", "weight: T2", "bias: float32", "input_scale: float32", "weight_scale: float32",
            "mask_index?: M", "input_zero_point?: T1", "weight_zero_point?: T2", "past?: float32"),
    outputs=("output: float32", "present?: float32"),
    attrs={"num_heads": int_(REQUIRED), "unidirectional": int_(0), "scale": float_(0.0),
           "qkv_hidden_sizes": ints(None), "mask_filter_value": float_(-10000.0), "do_rotary": int_(0),
           "past_present_share_buffer": int_(0), "rotary_embedding_dim": int_(0)},
    types="T1 in {int8, uint8}; T2 in {int8, uint8}; M in {int32}", rule=_qattention_rule,
    reference=qattention_reference, role=Role.OPAQUE, since=(1,),
    doc="ONNX Runtime's quantized Attention: the QKV projection as an integer product scaled to float32.",
)

__all__ = ["Attention", "BiasGelu", "DOMAIN", "FastGelu", "FusedMatMul", "Gelu", "MatMulIntegerToFloat", "QAttention",
           "QGemm", "QuickGelu", "SkipLayerNormalization", "attention_of_projection",
           "matmul_integer_to_float_reference", "qattention_reference"]
