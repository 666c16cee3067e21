"""The recurrent-model ops of ONNX opset 27: LinearAttention and CausalConvWithState.

- ``LinearAttention`` is the recurrence of linear-attention models (Gated DeltaNet, RetNet,
  Mamba-2 style): per key/value head a state ``S`` of ``[d_k, d_v]`` is updated token by token
  (``update_rule``: ``linear`` ``S += k vᵀ``; ``gated`` decays ``S`` by ``exp(g)`` first;
  ``delta`` writes ``β (v - Sᵀk)`` instead of ``v``; ``gated_delta`` does both), and each query
  reads ``scale * qᵀ S``. Inputs are packed ``[batch, seq, heads*size]``; query heads share
  key/value heads in groups. The state is kept in float32 and returned as ``present_state``
  in the past state's dtype (the query's when there is none). It is opaque: one numpy
  reference (:func:`linear_attention_reference`), a loop over the tokens.
- ``CausalConvWithState`` is a depthwise causal 1-D convolution whose left padding is the
  carried state (the last ``k - 1`` inputs of the previous call; zeros when absent), with an
  optional fused SiLU. It is opaque (:func:`causal_conv_reference`): a sliding window
  contraction accumulated in float32, like ONNX's Conv reference.

Example:
    >>> from metadef.testing.onnx_cases import infer_text
    >>> infer_text("LinearAttention", ["f32[b,s,64]", "f32[b,s,32]", "f32[b,s,48]", None,
    ...            "f32[b,s,4]", "f32[b,s,4]"], {"q_num_heads": 8, "kv_num_heads": 4})
    ['f32[b,s,96]', 'f32[b,4,8,12]']
    >>> infer_text("CausalConvWithState", ["f16[b,64,s]", "f16[64,1,4]"])
    ['f16[b,64,s]', 'f16[b,64,3]']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from metadef.ops.infer import InferContext
from metadef.ops.interface import REQUIRED, float_, int_, string
from metadef.ops.metaop import metaop
from metadef.ops.strategy import Role
from metadef.shape import Decision, Dim, TensorType, equal, floordiv, format_shape, mul, sub

Arrays = list[np.ndarray | None]
UPDATE_RULES = ("linear", "gated", "delta", "gated_delta")
ACTIVATIONS = ("none", "silu", "swish")


def _arg(inputs: Arrays, i: int) -> np.ndarray | None:
    """Input ``i``, or None when the node omits it."""
    return inputs[i] if i < len(inputs) else None


def _differ(ctx: InferContext, a: Dim, b: Dim) -> bool:
    """Whether two dims are known to differ."""
    return equal(a, b, ctx.env) is Decision.FALSE


def _per_head(ctx: InferContext, hidden: Dim, heads: int, what: str) -> Dim:
    """The per-head size of a packed ``heads*size`` dim; fails when it does not divide."""
    if isinstance(hidden, int) and hidden % heads:
        ctx.fail(f"the {what} hidden size {hidden} does not split into {heads} heads")
    return floordiv(hidden, heads)


# ----------------------------------------------------------------------- LinearAttention


def _check_rule_inputs(ctx: InferContext, rule: str) -> None:
    """``decay`` is given exactly when the rule gates, ``beta`` exactly when it corrects."""
    if rule not in UPDATE_RULES:
        ctx.fail(f"update_rule={rule!r} is not one of {', '.join(map(repr, UPDATE_RULES))}")
    for index, name, wanted, kind in ((4, "decay", "gated" in rule, "gated"),
                                      (5, "beta", "delta" in rule, "delta")):
        if wanted and not ctx.has(index):
            ctx.fail(f"update_rule={rule!r} needs the {name} input (a {kind} rule)")
        if ctx.has(index) and not wanted:
            ctx.fail(f"update_rule={rule!r} takes no {name} input (only the {kind} rules do)")


def _linear_attention_rule(ctx: InferContext) -> list[Any]:
    """``output [batch, seq, q_heads*d_v]`` like the query; ``present_state [batch, kv_heads,
    d_k, d_v]`` in the past state's dtype (the query's without one)."""
    q_heads, kv_heads = ctx.attrs["q_num_heads"], ctx.attrs["kv_num_heads"]
    if q_heads <= 0 or kv_heads <= 0 or q_heads % kv_heads:
        ctx.fail(f"q_num_heads={q_heads} must be a positive multiple of kv_num_heads={kv_heads}")
    _check_rule_inputs(ctx, ctx.attrs["update_rule"])
    state_dtype = ctx.dtype(3) if ctx.has(3) else ctx.dtype(0)
    q, k, v = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    if q is None or k is None or v is None:
        return [None, TensorType(state_dtype, None)]
    for name, shape in (("query", q), ("key", k), ("value", v)):
        if len(shape) != 3:
            ctx.fail(f"{name} must be 3-D [batch, seq, heads*size], got rank {len(shape)}")
    d_k = _per_head(ctx, q[2], q_heads, "query")
    if _differ(ctx, d_k, _per_head(ctx, k[2], kv_heads, "key")):
        ctx.fail(f"query and key must have the same head size, got {q[2]}/{q_heads} and "
                 f"{k[2]}/{kv_heads}")
    d_v = _per_head(ctx, v[2], kv_heads, "value")
    batch, seq = q[0], q[1]
    for name, shape in (("key", k), ("value", v)):
        if _differ(ctx, shape[0], batch) or _differ(ctx, shape[1], seq):
            ctx.fail(f"{name} {format_shape(shape)} must have the query's batch and sequence length "
                     f"({batch}, {seq})")
    state = (batch, kv_heads, d_k, d_v)
    past = ctx.shape(3) if ctx.has(3) else None
    if past is not None and (len(past) != 4 or any(_differ(ctx, p, s) for p, s in zip(past, state))):
        ctx.fail(f"past_state {format_shape(past)} must be [batch, kv_heads, d_k, d_v] = {format_shape(state)}")
    _check_gates(ctx, kv_heads, d_k)
    return [(batch, seq, mul(q_heads, d_v)), TensorType(state_dtype, state)]


def _check_gates(ctx: InferContext, kv_heads: int, d_k: Dim) -> None:
    """decay: ``[batch, seq, kv_heads]`` or ``[.., kv_heads*d_k]``; beta: ``[.., kv_heads]``
    or ``[.., 1]``."""
    for index, name, lasts in ((4, "decay", (kv_heads, mul(kv_heads, d_k))),
                               (5, "beta", (kv_heads, 1))):
        shape = ctx.shape(index) if ctx.has(index) else None
        if shape is None:
            continue
        if len(shape) != 3 or all(_differ(ctx, shape[2], last) for last in lasts):
            ctx.fail(f"{name} must be [batch, seq, {lasts[0]}] or [batch, seq, {lasts[1]}], "
                     f"got {format_shape(shape)}")


def _heads(x: np.ndarray, heads: int) -> np.ndarray:
    """``[batch, seq, heads*size]`` -> ``[batch, heads, seq, size]`` in float32."""
    batch, seq, hidden = x.shape
    return x.reshape(batch, seq, heads, hidden // heads).transpose(0, 2, 1, 3).astype(np.float32)


def linear_attention_reference(inputs: Arrays, attrs: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """ONNX LinearAttention, token by token in float32: decay the state (gated rules), correct
    the value by what the state already recalls (delta rules), write ``k vᵀ``, read
    ``scale * qᵀ S`` (``scale`` 0 means ``1/sqrt(d_k)``).

    Example:
        >>> q = k = v = np.ones((1, 2, 2), np.float32)   # one head of size 2, two tokens
        >>> attrs = {"q_num_heads": 1, "kv_num_heads": 1, "scale": 1.0, "update_rule": "linear"}
        >>> y, state = linear_attention_reference([q, k, v], attrs)
        >>> y.tolist(), state.tolist()
        ([[[2.0, 2.0], [4.0, 4.0]]], [[[[2.0, 2.0], [2.0, 2.0]]]])
    """
    query, key, value, past = inputs[0], inputs[1], inputs[2], _arg(inputs, 3)
    decay, beta = _arg(inputs, 4), _arg(inputs, 5)
    q_heads, kv_heads = attrs["q_num_heads"], attrs["kv_num_heads"]
    q, k, v = _heads(query, q_heads), _heads(key, kv_heads), _heads(value, kv_heads)
    batch, _, seq, d_k = q.shape
    d_v = v.shape[-1]
    if decay is not None:  # [batch, kv_heads, seq, 1 or d_k]
        decay = _heads(decay, kv_heads)
    if beta is not None:  # [batch, kv_heads or 1, seq, 1]
        beta = beta.reshape(batch, seq, -1, 1).transpose(0, 2, 1, 3).astype(np.float32)
    state = np.zeros((batch, kv_heads, d_k, d_v), np.float32) if past is None \
        else past.astype(np.float32)
    scale = attrs["scale"] or 1 / np.sqrt(d_k)
    group = q_heads // kv_heads
    out = np.empty((batch, q_heads, seq, d_v), np.float32)
    for t in range(seq):
        k_t, v_t = k[:, :, t], v[:, :, t]
        if decay is not None:
            state = state * np.exp(decay[:, :, t])[..., None]
        if beta is not None:
            v_t = beta[:, :, t] * (v_t - np.einsum("bhdm,bhd->bhm", state, k_t))
        state = state + k_t[..., :, None] * v_t[..., None, :]
        shared = np.repeat(state, group, axis=1) if group > 1 else state
        out[:, :, t] = scale * np.einsum("bhd,bhdm->bhm", q[:, :, t], shared)
    y = out.transpose(0, 2, 1, 3).reshape(batch, seq, q_heads * d_v).astype(query.dtype)
    return y, state.astype(query.dtype if past is None else past.dtype)


LinearAttention = metaop(
    "LinearAttention",
    inputs=("query", "key", "value", "past_state?: S", "decay?", "beta?"),
    outputs=("output", "present_state: S"),
    attrs={"chunk_size": int_(64), "kv_num_heads": int_(REQUIRED), "q_num_heads": int_(REQUIRED),
           "scale": float_(0.0), "update_rule": string("gated_delta")},
    types="T in {float16, bfloat16, float32}; S in {float16, bfloat16, float32}",
    rule=_linear_attention_rule, reference=linear_attention_reference, role=Role.OPAQUE,
    since=(27,),
    doc="Linear attention as a recurrence over the tokens: a [d_k, d_v] state per key/value "
        "head, decayed (gated), delta-corrected (delta), written with k v^T and read by "
        "scale * q^T S; the final state is present_state.",
)


# ------------------------------------------------------------------- CausalConvWithState


def _causal_conv_rule(ctx: InferContext) -> list[Any]:
    """``output`` like the input ``[batch, channels, length]``; ``present_state [batch,
    channels, k - 1]``."""
    if ctx.attrs["activation"] not in ACTIVATIONS:
        ctx.fail(f"activation={ctx.attrs['activation']!r} is not one of "
                 f"{', '.join(map(repr, ACTIVATIONS))}")
    x, w = ctx.shape(0), ctx.shape(1)
    if x is None or w is None:
        return [x, None]
    if len(x) != 3:
        ctx.fail(f"input must be 3-D [batch, channels, length], got rank {len(x)}")
    if len(w) != 3 or _differ(ctx, w[0], x[1]) or _differ(ctx, w[1], 1):
        ctx.fail(f"weight must be [channels, 1, k] with the input's {x[1]} channels (a "
                 f"depthwise kernel), got {format_shape(w)}")
    if isinstance(w[2], int) and w[2] < 1:
        ctx.fail(f"the kernel size must be at least 1, got {w[2]}")
    bias = ctx.shape(2) if ctx.has(2) else None
    if bias is not None and (len(bias) != 1 or _differ(ctx, bias[0], x[1])):
        ctx.fail(f"bias must be 1-D of the {x[1]} channels, got {format_shape(bias)}")
    state = (x[0], x[1], sub(w[2], 1))
    past = ctx.shape(3) if ctx.has(3) else None
    if past is not None and (len(past) != 3 or any(_differ(ctx, p, s) for p, s in zip(past, state))):
        ctx.fail(f"past_state {format_shape(past)} must be [batch, channels, k - 1] = {format_shape(state)}")
    return [x, state]


def causal_conv_reference(inputs: Arrays, attrs: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Prepend the state (zeros without one), convolve each channel with its own kernel
    (``out[b, c, t] = sum[j] padded[b, c, t + j] * w[c, 0, j]``, accumulated in float32, then
    the bias), apply SiLU in float32 when asked; the new state is the padded input's last
    ``k - 1`` positions.

    Example:
        >>> x = np.arange(1, 5, dtype=np.float32).reshape(1, 1, 4)
        >>> w = np.ones((1, 1, 2), np.float32)             # the sum of each value and the last
        >>> y, state = causal_conv_reference([x, w, None, np.full((1, 1, 1), 10, np.float32)],
        ...                                  {"activation": "none"})
        >>> y.tolist(), state.tolist()
        ([[[11.0, 3.0, 5.0, 7.0]]], [[[4.0]]])
    """
    x, w, bias, past = inputs[0], inputs[1], _arg(inputs, 2), _arg(inputs, 3)
    batch, channels, _ = x.shape
    width = w.shape[2]
    if past is None:
        past = np.zeros((batch, channels, width - 1), x.dtype)
    padded = np.concatenate([past.astype(x.dtype), x], axis=2)
    windows = np.lib.stride_tricks.sliding_window_view(padded, width, axis=2)  # [b, c, L, k]
    acc = np.einsum("bclk,ck->bcl", windows.astype(np.float32), w[:, 0].astype(np.float32))
    if bias is not None:
        acc = acc + bias.astype(np.float32)[:, None]
    y = acc.astype(x.dtype)
    if attrs["activation"] in ("silu", "swish"):
        wide = y.astype(np.float32)
        y = (wide / (1 + np.exp(-wide))).astype(x.dtype)
    return y, padded[:, :, padded.shape[2] - (width - 1):]


CausalConvWithState = metaop(
    "CausalConvWithState",
    inputs=("input", "weight", "bias?", "past_state?"), outputs=("output", "present_state"),
    attrs={"activation": string("none")},
    types="T in {float16, bfloat16, float32}",
    rule=_causal_conv_rule, reference=causal_conv_reference, role=Role.OPAQUE, since=(27,),
    doc="Depthwise causal 1-D convolution left-padded by the carried state (zeros when absent), "
        "with an optional fused SiLU; present_state is the last k - 1 padded inputs.",
)

__all__ = ["ACTIVATIONS", "CausalConvWithState", "LinearAttention", "UPDATE_RULES",
           "causal_conv_reference", "linear_attention_reference"]
