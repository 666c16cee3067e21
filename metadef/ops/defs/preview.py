"""Ops of domain ``ai.onnx.preview``, ONNX's staging area for ops before they join the standard:
``FlexAttention``.

``FlexAttention`` is scaled dot-product attention over 4-D heads ``[batch, heads, seq, size]``
(grouped key/value heads allowed) with two optional subgraphs that rewrite the scores before
the softmax (``score_mod``: a mask, a soft cap, a positional bias) and the probabilities after
it (``prob_mod``). Each subgraph takes one tensor ``[batch, q_heads, q_len, kv_len]`` of the
softmax dtype (``softmax_precision``; by default float32 for float16/bfloat16 inputs, else the
input dtype) and gives one of the same type. Like ``If``'s branches (see
:mod:`metadef.ops.defs.control`) the subgraphs read outer values through the node's trailing
``captured`` inputs, which follow their own input. The op is opaque: a numpy reference
(:func:`flex_attention_reference`) that runs the subgraphs with
:func:`~metadef.ops.defs.fused.run_body`.

Example:
    >>> from metadef.ops import get_op, infer_types
    >>> from metadef.shape import parse_type
    >>> types = [parse_type(t) for t in ("f16[b,8,s,64]", "f16[b,2,t,64]", "f16[b,2,t,32]")]
    >>> [str(t) for t in infer_types(get_op("FlexAttention", DOMAIN), "/attn", types, {})]
    ['f16[b,8,s,32]']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from metadef.core.dtypes import FLOAT32, DType, from_numpy, from_onnx
from metadef.ops.defs.control import CAPTURED
from metadef.ops.defs.fused import run_body
from metadef.ops.defs.onnx23 import SOFTMAX_PRECISIONS
from metadef.ops.infer import InferContext
from metadef.ops.interface import Param, float_, graph_, int_
from metadef.ops.metaop import metaop
from metadef.ops.strategy import Role
from metadef.shape import Decision, Dim, TensorType, equal, format_shape

DOMAIN = "ai.onnx.preview"
MODIFIERS = ("score_mod", "prob_mod")

Arrays = list[np.ndarray | None]


def softmax_dtype(dtype: DType, precision: int | None) -> DType:
    """The dtype FlexAttention's scores, softmax and modifiers use: ``softmax_precision`` when
    given, float32 for inputs narrower than 32 bits, else the input dtype.

    Example:
        >>> from metadef.core.dtypes import FLOAT16, FLOAT64
        >>> softmax_dtype(FLOAT16, None).name, softmax_dtype(FLOAT64, None).name
        ('float32', 'float64')
    """
    if precision is not None:
        return from_onnx(precision)
    return FLOAT32 if dtype.bits < 32 else dtype


def _differ(ctx: InferContext, a: Dim, b: Dim) -> bool:
    return equal(a, b, ctx.env) is Decision.FALSE


def _check_modifier(ctx: InferContext, key: str, scores: TensorType) -> None:
    """A modifier takes the scores (then the captured values) and gives one tensor of their
    dtype and rank."""
    graph = ctx.attrs[key]
    captured = ctx.inputs[3:]
    if len(graph.inputs) != 1 + len(captured) or len(graph.outputs) != 1:
        ctx.fail(f"{key} must take one tensor (then the {len(captured)} values the node captures) "
                 f"and give one, got {len(graph.inputs) - len(captured)} inputs and "
                 f"{len(graph.outputs)} outputs")
    for what, value in (("takes", graph.inputs[0].type), ("gives", graph.outputs[0].type)):
        if value is not None and (value.dtype is not scores.dtype or (
                value.shape is not None and len(value.shape) != 4)):
            ctx.fail(f"{key} {what} {value}, but the scores are {scores} ([batch, q_heads, "
                     f"q_len, kv_len] in the softmax dtype)",
                     "softmax_precision sets that dtype (float32 by default below 32 bits)")


def _flex_attention_rule(ctx: InferContext) -> list[Any]:
    """``Y [batch, q_heads, q_len, v_size]`` in the inputs' dtype."""
    precision = ctx.attrs["softmax_precision"]
    if precision is not None and precision not in SOFTMAX_PRECISIONS:
        ctx.fail(f"softmax_precision={precision} is not a float type "
                 "(1 float, 10 float16, 11 double, 16 bfloat16)")
    q, k, v = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    if q is None or k is None or v is None:
        return [None]
    if not len(q) == len(k) == len(v) == 4:
        ctx.fail(f"Q, K and V must be 4-D [batch, heads, seq, size], got ranks {len(q)}, "
                 f"{len(k)} and {len(v)}")
    if _differ(ctx, q[3], k[3]):
        ctx.fail(f"Q and K must have the same head size, got {q[3]} and {k[3]}")
    if _differ(ctx, k[1], v[1]) or _differ(ctx, k[2], v[2]):
        ctx.fail(f"K {format_shape(k)} and V {format_shape(v)} must have the same heads and sequence length")
    if any(_differ(ctx, t[0], q[0]) for t in (k, v)):
        ctx.fail(f"Q, K and V must have the same batch, got {q[0]}, {k[0]} and {v[0]}")
    if isinstance(q[1], int) and isinstance(k[1], int) and (k[1] <= 0 or q[1] % k[1]):
        ctx.fail(f"the {q[1]} query heads must be a multiple of the {k[1]} key/value heads")
    scores = TensorType(softmax_dtype(ctx.dtype(0), precision), (q[0], q[1], q[2], k[2]))
    for key in MODIFIERS:
        if ctx.attrs[key] is not None:
            _check_modifier(ctx, key, scores)
    return [(q[0], q[1], q[2], v[3])]


def _modify(graph: Any, tensor: np.ndarray, captured: Arrays) -> np.ndarray:
    """Run a modifier subgraph on ``tensor`` and the captured values; keep the dtype."""
    out, = run_body(graph, [tensor, *captured])
    return np.asarray(out, dtype=tensor.dtype)


def flex_attention_reference(inputs: Arrays, attrs: Mapping[str, Any]) -> np.ndarray:
    """``prob_mod(softmax(score_mod(scale * Q Kᵀ))) V``: Q and K pre-scaled by ``sqrt(scale)``
    in their dtype, the scores, softmax and modifiers in the softmax dtype, the result cast to
    the inputs' dtype (ONNX's reference, step for step).

    Example:
        >>> q = np.zeros((1, 1, 1, 4), np.float32)          # equal scores: uniform weights
        >>> v = np.arange(8, dtype=np.float32).reshape(1, 1, 2, 4)
        >>> attrs = {"scale": None, "score_mod": None, "prob_mod": None, "softmax_precision": None}
        >>> flex_attention_reference([q, q[:, :, [0, 0]], v], attrs)
        array([[[[2., 3., 4., 5.]]]], dtype=float32)
    """
    q, k, v, captured = inputs[0], inputs[1], inputs[2], list(inputs[3:])
    if q.shape[1] != k.shape[1]:  # grouped heads: query head h reads key/value head h // group
        group = q.shape[1] // k.shape[1]
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scale = attrs["scale"]
    root = np.array(np.sqrt(np.float32(1 / np.sqrt(q.shape[3]) if scale is None else scale)),
                    q.dtype)
    compute = softmax_dtype(from_numpy(q.dtype), attrs["softmax_precision"]).numpy
    scores = np.matmul(q * root, np.swapaxes(k * root, -1, -2)).astype(compute)
    if attrs["score_mod"] is not None:
        scores = _modify(attrs["score_mod"], scores, captured)
    shifted = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs = shifted / shifted.sum(axis=-1, keepdims=True)
    if attrs["prob_mod"] is not None:
        probs = _modify(attrs["prob_mod"], probs, captured)
    return np.matmul(probs, v.astype(compute)).astype(v.dtype)


FlexAttention = metaop(
    "FlexAttention", domain=DOMAIN,
    inputs=("Q", "K", "V", Param(CAPTURED, optional=True, variadic=True, type_var="C", mixed=True)),
    outputs=("Y",),
    attrs={"scale": float_(None), "score_mod": graph_(None), "prob_mod": graph_(None),
           "softmax_precision": int_(None)},
    types="T in {float}; C in {all}",
    rule=_flex_attention_rule, reference=flex_attention_reference, role=Role.OPAQUE,
    doc="softmax(score_mod(scale * Q K^T)) then prob_mod, times V, over 4-D (possibly grouped) "
        "heads; the modifiers are subgraphs.",
)

__all__ = ["DOMAIN", "FlexAttention", "MODIFIERS", "flex_attention_reference", "softmax_dtype"]
