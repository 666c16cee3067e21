"""The transformer ops of ONNX opsets 23 to 28: Attention, RMSNormalization, RotaryEmbedding,
Swish, SwiGLU, TensorScatter and BitCast.

- ``Attention`` (23, 24, 25) is ONNX's standard scaled-dot-product attention, distinct from
  the ``ai.metadef`` one the pattern recognizer introduces: 3-D inputs ``[batch, seq,
  heads*size]`` (with ``q_num_heads``, ``kv_num_heads``) or 4-D ``[batch, heads, seq, size]``;
  grouped key/value heads; an additive or boolean mask (shorter than the keys: padded with
  "masked"); ``is_causal`` and sliding windows aligned to the end of the past (bottom-right);
  ``softcap``; a past key/value cache concatenated in front (the ``present_*`` outputs) or
  per-batch valid lengths (``nonpad_kv_seqlen``); and a ``qk_matmul_output`` chosen by
  ``qk_matmul_output_mode`` (0 or 1: the scaled, soft-capped scores; 2: plus the mask;
  3: the softmax). A query row that may attend no key gives zeros. It is opaque: one numpy
  reference (:func:`attention_reference`) computes it in the inputs' dtype, like ONNX's.
- ``RMSNormalization`` is an index expression, written per node from the rank and axis like
  LayerNormalization's: ``X / sqrt(mean(X²) + epsilon) * scale`` in the stash type.
- ``Swish`` and ``SwiGLU`` are elementwise index expressions.
- ``RotaryEmbedding``, ``TensorScatter`` and ``BitCast`` are opaque (positions read from
  input values; a reinterpretation of bytes).

Example:
    >>> from metadef.testing.onnx_cases import infer_text
    >>> infer_text("Attention", ["f32[b,s,64]", "f32[b,t,32]", "f32[b,t,32]"],
    ...            {"q_num_heads": 8, "kv_num_heads": 4}, n_outputs=1)
    ['f32[b,s,64]']
    >>> infer_text("Attention", ["f16[b,8,s,16]", "f16[b,2,t,16]", "f16[b,2,t,24]", None,
    ...            "f16[b,2,p,16]", "f16[b,2,p,24]"])
    ['f16[b,8,s,24]', 'f16[b,2,p + t,16]', 'f16[b,2,p + t,24]', 'f16[b,8,s,p + t]']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from metadef.core.dtypes import from_onnx
from metadef.core.errors import BackendError, DTypeError
from metadef.ops.defs.elementwise import unary
from metadef.ops.defs.nn_norm import STASH_TYPES
from metadef.ops.defs.shape_values import Shapes, normalize_axis
from metadef.ops.infer import InferContext
from metadef.ops.interface import REQUIRED, float_, int_, string
from metadef.ops.metaop import metaop
from metadef.ops.strategy import Role
from metadef.shape import Decision, Dim, TensorType, add, equal, floordiv, mul

Arrays = list[np.ndarray | None]
SOFTMAX_PRECISIONS = (1, 10, 11, 16)  # float, float16, double, bfloat16


def _arg(inputs: Arrays, i: int) -> np.ndarray | None:
    """Input ``i``, or None when the node omits it."""
    return inputs[i] if i < len(inputs) else None


def _differ(ctx: InferContext, a: Dim, b: Dim) -> bool:
    """Whether two dims are known to differ."""
    return equal(a, b, ctx.env) is Decision.FALSE


def _split(ctx: InferContext, hidden: Dim, heads: int, what: str) -> Dim:
    """The per-head size of a ``heads*size`` hidden dim; fails when it does not divide."""
    if isinstance(hidden, int) and (heads <= 0 or hidden % heads):
        ctx.fail(f"the {what} hidden size {hidden} does not split into {heads} heads")
    return floordiv(hidden, heads)


# ----------------------------------------------------------------------------- Attention


def _attention_geometry(ctx: InferContext) -> dict[str, Dim]:
    """Batch, heads, lengths and head sizes of Q, K and V (3-D or 4-D)."""
    q, k, v = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    if not len(q) == len(k) == len(v) or len(q) not in (3, 4):
        ctx.fail(f"Q, K and V must all be 3-D [batch, seq, heads*size] or all 4-D [batch, "
                 f"heads, seq, size], got ranks {len(q)}, {len(k)} and {len(v)}")
    if len(q) == 4:
        return {"batch": q[0], "q_heads": q[1], "q_len": q[2], "size": q[3], "kv_heads": k[1],
                "kv_len": k[2], "k_size": k[3], "v_size": v[3]}
    q_heads, kv_heads = ctx.attrs["q_num_heads"], ctx.attrs["kv_num_heads"]
    if q_heads is None or kv_heads is None:
        ctx.fail("3-D Q, K and V need the q_num_heads and kv_num_heads attributes")
    return {"batch": q[0], "q_heads": q_heads, "q_len": q[1],
            "size": _split(ctx, q[2], q_heads, "Q"), "kv_heads": kv_heads, "kv_len": k[1],
            "k_size": _split(ctx, k[2], kv_heads, "K"),
            "v_size": _split(ctx, v[2], kv_heads, "V")}


def _attention_rule(ctx: InferContext) -> list[Any]:
    """Y like Q with V's head size; the presents ``[batch, kv_heads, past + kv_len, size]``;
    the scores ``[batch, q_heads, q_len, past + kv_len]``."""
    if ctx.attrs["qk_matmul_output_mode"] not in (0, 1, 2, 3):
        ctx.fail(f"qk_matmul_output_mode={ctx.attrs['qk_matmul_output_mode']} is not 0, 1, 2 or 3")
    precision = ctx.attrs["softmax_precision"]
    if precision is not None and precision not in SOFTMAX_PRECISIONS:
        ctx.fail(f"softmax_precision={precision} is not a float type "
                 "(1 float, 10 float16, 11 double, 16 bfloat16)")
    if ctx.has(4) != ctx.has(5):
        ctx.fail("past_key and past_value must be given together")
    if ctx.has(4) and ctx.has(6):
        ctx.fail("nonpad_kv_seqlen cannot be combined with a past key/value cache")
    if any(ctx.shape(i) is None for i in range(3)):
        return [None] * 4
    g = _attention_geometry(ctx)
    if _differ(ctx, g["size"], g["k_size"]):
        ctx.fail(f"Q and K must have the same head size, got {g['size']} and {g['k_size']}")
    if isinstance(g["q_heads"], int) and isinstance(g["kv_heads"], int) and (
            g["kv_heads"] <= 0 or g["q_heads"] % g["kv_heads"]):
        ctx.fail(f"the {g['q_heads']} query heads must be a multiple of the {g['kv_heads']} "
                 "key/value heads")
    past = ctx.shape(4)
    if past is not None and len(past) != 4:
        ctx.fail(f"past_key must be 4-D [batch, kv_heads, past_len, size], got rank {len(past)}")
    total = g["kv_len"] if past is None else add(past[2], g["kv_len"])
    batch, q_heads, q_len = g["batch"], g["q_heads"], g["q_len"]
    y = (batch, q_heads, q_len, g["v_size"]) if len(ctx.shape(0)) == 4 \
        else (batch, q_len, mul(q_heads, g["v_size"]))
    return [y, (batch, g["kv_heads"], total, g["size"]), (batch, g["kv_heads"], total, g["v_size"]),
            (batch, q_heads, q_len, total)]


def _split_heads(x: np.ndarray, heads: int) -> np.ndarray:
    """``[batch, seq, heads*size]`` -> ``[batch, heads, seq, size]``."""
    batch, seq, hidden = x.shape
    return x.reshape(batch, seq, heads, hidden // heads).transpose(0, 2, 1, 3)


def _blocked(allowed: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """An additive bias: 0 where ``allowed``, -inf elsewhere."""
    return np.where(allowed, dtype.type(0), dtype.type(-np.inf))


def _per_batch(rows: np.ndarray) -> np.ndarray:
    """A ``[batch, q, kv]`` array as ``[batch, 1, q, kv]``, to broadcast over heads; a
    ``[q, kv]`` one is left as is."""
    return rows[:, None] if rows.ndim == 3 else rows


def attention_bias(mask: np.ndarray | None, q_len: int, kv_len: int, dtype: np.dtype, *,
                   causal: bool = False, window: tuple[int, int] = (-1, -1),
                   offset: int | np.ndarray = 0, nonpad: np.ndarray | None = None) -> np.ndarray:
    """The additive bias on the scores: the mask (boolean: False masks), the causal and
    window constraints, and the padding beyond ``nonpad`` keys. ``offset`` is the number of
    keys before the query block (a scalar, or one per batch): query ``i`` sits at key
    position ``i + offset``; ``window`` is how far it may look back and ahead (-1: no limit).

    Example:
        >>> attention_bias(None, 2, 3, np.dtype(np.float32), causal=True, offset=1)
        array([[  0.,   0., -inf],
               [  0.,   0.,   0.]], dtype=float32)
    """
    bias = np.zeros((q_len, kv_len), dtype)
    if mask is not None:
        pad = kv_len - mask.shape[-1]  # a shorter mask masks the keys past its end
        if mask.dtype == np.bool_:
            mask = _blocked(np.pad(mask, [(0, 0)] * (mask.ndim - 1) + [(0, pad)]), dtype)
        else:
            mask = np.pad(mask, [(0, 0)] * (mask.ndim - 1) + [(0, pad)],
                          constant_values=-np.inf)
        bias = bias + mask
    query = np.arange(q_len)[:, None] + np.reshape(offset, (-1, 1, 1) if np.ndim(offset) else ())
    behind = query - np.arange(kv_len)  # how far key j lies behind query i
    if causal:
        bias = bias + _per_batch(_blocked(behind >= 0, bias.dtype))
    left, right = window
    if left >= 0 or right >= 0:
        inside = (behind <= left if left >= 0 else True) & (-behind <= right if right >= 0 else True)
        bias = bias + _per_batch(_blocked(np.broadcast_to(inside, behind.shape), bias.dtype))
    if nonpad is not None:
        valid = np.arange(kv_len) < nonpad.reshape(-1, 1)
        bias = bias + _blocked(valid, bias.dtype)[:, None, None, :]
    return bias


def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` in ``a``'s dtype (numpy computes bfloat16 products in float32)."""
    return np.matmul(a, b).astype(a.dtype, copy=False)


def _softmax_rows(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis; a row of only -inf gives zeros (no NaN)."""
    top = x.max(axis=-1, keepdims=True)
    zero, one = np.zeros((), x.dtype), np.ones((), x.dtype)
    e = np.exp(x - np.where(np.isneginf(top), zero, top))
    total = e.sum(axis=-1, keepdims=True)
    return e / np.where(total == zero, one, total)


def attention_reference(inputs: Arrays, attrs: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    """ONNX Attention: ``softmax(softcap(scale * Q Kᵀ) + bias) V``, and the presents and
    scores; see the module doc.

    Example:
        >>> q = np.ones((1, 1, 2, 4), np.float32)
        >>> v = np.arange(8, dtype=np.float32).reshape(1, 1, 2, 4)
        >>> attrs = {name: spec.default for name, spec in Attention.attrs.items()}
        >>> attrs["is_causal"] = 1
        >>> attention_reference([q, q, v], attrs)[0]
        array([[[[0., 1., 2., 3.],
                 [2., 3., 4., 5.]]]], dtype=float32)
    """
    q, k, v, mask = inputs[0], inputs[1], inputs[2], _arg(inputs, 3)
    past_key, past_value, nonpad = _arg(inputs, 4), _arg(inputs, 5), _arg(inputs, 6)
    flat = q.ndim == 3
    if flat:
        q = _split_heads(q, attrs["q_num_heads"])
        k, v = _split_heads(k, attrs["kv_num_heads"]), _split_heads(v, attrs["kv_num_heads"])
    dtype = q.dtype
    scale = attrs["scale"]
    root = dtype.type(np.sqrt(1 / np.sqrt(q.shape[3]) if scale is None else scale))
    past = 0
    if past_key is not None:
        past = past_key.shape[2]
        k, v = np.concatenate((past_key, k), axis=2), np.concatenate((past_value, v), axis=2)
    present_key, present_value = k, v
    q_len, kv_len = q.shape[2], k.shape[2]
    offset = nonpad.reshape(-1) - q_len if nonpad is not None and past_key is None else past
    bias = attention_bias(mask, q_len, kv_len, dtype, causal=bool(attrs["is_causal"]),
                          window=(attrs["left_window_size"], attrs["right_window_size"]),
                          offset=offset, nonpad=nonpad)
    if q.shape[1] != k.shape[1]:  # grouped heads: each key/value head serves a run of queries
        k = np.repeat(k, q.shape[1] // k.shape[1], axis=1)
        v = np.repeat(v, q.shape[1] // v.shape[1], axis=1)
    scores = _matmul(q * root, np.swapaxes(k, -1, -2) * root)
    softcap = attrs["softcap"]
    if softcap > 0:
        scores = np.tanh(scores / softcap) * softcap
    biased = scores + bias
    mode = attrs["qk_matmul_output_mode"]
    qk = biased if mode == 2 else scores
    if attrs["softmax_precision"] is not None:
        biased = biased.astype(from_onnx(attrs["softmax_precision"]).numpy)
    probs = _softmax_rows(biased)
    # A row whose bias masks every key attends nothing: zeros, decided on the bias alone.
    probs = np.where(np.isneginf(bias.max(axis=-1, keepdims=True)), np.zeros((), probs.dtype), probs)
    if mode == 3:
        qk = probs
    y = _matmul(probs.astype(dtype), v)
    if flat:
        y = y.transpose(0, 2, 1, 3).reshape(y.shape[0], y.shape[2], -1)
    return y, present_key, present_value, qk


Attention = metaop(
    "Attention",
    inputs=("Q: T1", "K: T1", "V: T2", "attn_mask?: U", "past_key?: T1", "past_value?: T2",
            "nonpad_kv_seqlen?: int64"),
    outputs=("Y: T1", "present_key?: T1", "present_value?: T2", "qk_matmul_output?: T1"),
    attrs={"is_causal": int_(0), "kv_num_heads": int_(None), "q_num_heads": int_(None),
           "qk_matmul_output_mode": int_(0), "scale": float_(None), "softcap": float_(0.0),
           "softmax_precision": int_(None), "left_window_size": int_(-1),
           "right_window_size": int_(-1)},
    types="T1 in {float}; T2 in {float}; U in {numeric, bool}",
    rule=_attention_rule, reference=attention_reference, role=Role.OPAQUE, since=(23, 24, 25),
    doc="softmax(softcap(scale * Q K^T) + mask, causal, window and padding biases) V over "
        "3-D or 4-D, possibly grouped, heads; past key/value caches are concatenated.",
)


# ---------------------------------------------------------------------- RMSNormalization


def _rms_axis(ctx: InferContext) -> int | None:
    x = ctx.shape(0)
    if x is None:
        return None
    axis = normalize_axis(ctx.attrs["axis"], len(x))
    if axis is None:
        ctx.fail(f"axis {ctx.attrs['axis']} is out of range for rank {len(x)}")
    return axis


def _rmsnorm_rule(ctx: InferContext) -> list[Any]:
    if ctx.attrs["stash_type"] not in STASH_TYPES:
        ctx.fail(f"stash_type={ctx.attrs['stash_type']} is not one of {sorted(STASH_TYPES)} "
                 "(float, float16, double, bfloat16)")
    axis, x, scale = _rms_axis(ctx), ctx.shape(0), ctx.shape(1)
    if x is not None and scale is not None and (len(scale) > len(x) or any(
            _differ(ctx, s, d) and s != 1 for s, d in zip(scale[::-1], x[::-1]))):
        ctx.fail(f"scale {list(scale)} must broadcast against the normalized axes "
                 f"{list(x[axis:])}")
    return [x]


def rmsnorm_semantics(attrs: Mapping[str, Any], shapes: Shapes) -> str:
    """``X / sqrt(mean(X²) + epsilon) * scale`` over the axes from ``axis`` on, in the stash
    type; scale broadcasts against the trailing axes.

    Example:
        >>> print(rmsnorm_semantics({"axis": -1, "stash_type": 1}, [(2, 8), (8,)]))
        xs[a0, b0] = cast_float32(X[a0, b0])
        rstd[a0] = rsqrt(mean[b0] xs[a0, b0] ** 2 + epsilon)
        Y[a0, b0] = xs[a0, b0] * rstd[a0] * scale[b0]
    """
    rank = len(shapes[0])
    axis = attrs["axis"] % rank
    _, cast = STASH_TYPES[attrs["stash_type"]]
    lead = [f"a{i}" for i in range(axis)]
    norm = [f"b{i}" for i in range(rank - axis)]
    full, kept = ", ".join(lead + norm), ", ".join(lead)
    scale = ", ".join((lead + norm)[rank - len(shapes[1]):])
    return (f"xs[{full}] = {cast}(X[{full}])\n"
            f"rstd[{kept}] = rsqrt(mean[{', '.join(norm)}] xs[{full}] ** 2 + epsilon)\n"
            f"Y[{full}] = xs[{full}] * rstd[{kept}] * scale[{scale}]")


RMSNormalization = metaop(
    "RMSNormalization", inputs=("X", "scale: V"), outputs=("Y: V",),
    attrs={"axis": int_(-1), "epsilon": float_(1e-5), "stash_type": int_(1)},
    types="T in {float}; V in {float}", rule=_rmsnorm_rule, semantics=rmsnorm_semantics,
    role=Role.REDUCTION, parallel=("a0",), since=(23,),
    doc="X / sqrt(mean(X^2 over the axes from axis on) + epsilon) * scale.",
)


# ----------------------------------------------------------------------- RotaryEmbedding


def _rotary_rule(ctx: InferContext) -> list[Any]:
    x, cos, sin = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    if x is None:
        return [None]
    heads = ctx.attrs["num_heads"]
    if len(x) == 3:
        if not heads:
            ctx.fail("a 3-D input [batch, seq, hidden] needs the num_heads attribute")
        size = _split(ctx, x[2], heads, "input")
    elif len(x) == 4:
        size = x[3]
    else:
        ctx.fail(f"the input must be 4-D [batch, heads, seq, size] or 3-D [batch, seq, hidden], "
                 f"got rank {len(x)}")
    dim = ctx.attrs["rotary_embedding_dim"] or size
    want = "[max_position, dim/2] with position_ids" if ctx.has(3) \
        else "[batch, seq, dim/2] without position_ids"
    for name, cache in (("cos_cache", cos), ("sin_cache", sin)):
        if cache is None:
            continue
        if len(cache) != (2 if ctx.has(3) else 3):
            ctx.fail(f"{name} must be {want}, got rank {len(cache)}")
        if isinstance(dim, int) and _differ(ctx, cache[-1], dim // 2):
            ctx.fail(f"{name}'s last dim {cache[-1]} must be half the rotary dim {dim}")
    return [x]


def _rotary_reference(inputs: Arrays, attrs: Mapping[str, Any]) -> np.ndarray:
    """Rotate pairs of each head's first ``rotary_embedding_dim`` values by the angle of their
    position: halves ``(x1, x2)`` (or interleaved even/odd values) become
    ``(cos x1 - sin x2, sin x1 + cos x2)``; the rest pass through."""
    x, cos, sin, positions = inputs[0], inputs[1], inputs[2], _arg(inputs, 3)
    heads = x.transpose(0, 2, 1, 3) if x.ndim == 4 \
        else x.reshape(*x.shape[:2], attrs["num_heads"], -1)  # [batch, seq, heads, size]
    dim = attrs["rotary_embedding_dim"] or heads.shape[-1]
    if positions is not None:
        cos, sin = cos[positions], sin[positions]
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    turn = heads[..., :dim]
    if attrs["interleaved"]:
        x1, x2 = turn[..., 0::2], turn[..., 1::2]
    else:
        x1, x2 = turn[..., :dim // 2], turn[..., dim // 2:]
    real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
    turned = np.stack([real, imag], axis=-1).reshape(turn.shape) if attrs["interleaved"] \
        else np.concatenate([real, imag], axis=-1)
    out = np.concatenate([turned, heads[..., dim:]], axis=-1)
    return out.transpose(0, 2, 1, 3) if x.ndim == 4 else out.reshape(x.shape)


RotaryEmbedding = metaop(
    "RotaryEmbedding", inputs=("X", "cos_cache", "sin_cache", "position_ids?: M"),
    outputs=("Y",),
    attrs={"interleaved": int_(0), "num_heads": int_(0), "rotary_embedding_dim": int_(0)},
    types="T in {float}; M in {int64}", rule=_rotary_rule, reference=_rotary_reference,
    role=Role.OPAQUE, since=(23,),
    doc="Rotary position embedding of each head's first rotary_embedding_dim values, by "
        "cos/sin caches indexed by position_ids (or given per batch and position).",
)


# ---------------------------------------------------------------------- Swish and SwiGLU

Swish = unary("Swish", "X[...] * sigmoid(alpha * X[...])", attrs={"alpha": float_(1.0)},
              since=(24,), doc="X * sigmoid(alpha * X).")


def _swiglu_rule(ctx: InferContext) -> list[Any]:
    a, b = ctx.shape(0), ctx.shape(1)
    if a is not None and b is not None and (
            len(a) != len(b) or any(_differ(ctx, p, q) for p, q in zip(a, b))):
        ctx.fail(f"A and B must have the same shape (no broadcasting), got {list(a)} and {list(b)}")
    return [a if a is not None else b]


SwiGLU = metaop(
    "SwiGLU", inputs=("A", "B"), outputs=("Y",), attrs={"alpha": float_(1.0)},
    types="T in {float}", rule=_swiglu_rule,
    semantics="Y[...] = A[...] * sigmoid(alpha * A[...]) * B[...]", role=Role.ELEMENTWISE,
    since=(28,), doc="Swish(A) * B: A * sigmoid(alpha * A) * B, of equal shapes.",
)


# ------------------------------------------------------------------------- TensorScatter


def _tensor_scatter_rule(ctx: InferContext) -> list[Any]:
    if ctx.attrs["mode"] not in ("linear", "circular"):
        ctx.fail(f"mode={ctx.attrs['mode']!r} is not 'linear' or 'circular'")
    cache, update = ctx.shape(0), ctx.shape(1)
    if cache is None or update is None:
        return [cache]
    axis = normalize_axis(ctx.attrs["axis"], len(cache))
    if axis is None or axis == 0:
        ctx.fail(f"axis {ctx.attrs['axis']} must name a sequence axis after the batch axis "
                 f"(1 to {len(cache) - 1} for rank {len(cache)})")
    if len(update) != len(cache) or any(
            i != axis and _differ(ctx, u, c) for i, (u, c) in enumerate(zip(update, cache))):
        ctx.fail(f"update {list(update)} must match past_cache {list(cache)} on every axis "
                 f"but the sequence axis {axis}")
    indices = ctx.shape(2) if ctx.has(2) else None
    if indices is not None and (len(indices) != 1 or _differ(ctx, indices[0], cache[0])):
        ctx.fail(f"write_indices must be 1-D with one entry per batch ({cache[0]}), "
                 f"got shape {list(indices)}")
    return [cache]


def _tensor_scatter_reference(inputs: Arrays, attrs: Mapping[str, Any]) -> np.ndarray:
    """Write ``update`` into a copy of the cache along the sequence axis, from each batch's
    write index (modulo the cache length in ``circular`` mode)."""
    cache, update, starts = inputs[0], inputs[1], _arg(inputs, 2)
    axis = attrs["axis"] % cache.ndim
    batch, size = cache.shape[0], cache.shape[axis]
    starts = np.zeros(batch, np.int64) if starts is None else starts.astype(np.int64)
    positions = starts[:, None] + np.arange(update.shape[axis])  # [batch, update length]
    if attrs["mode"] == "circular":
        positions %= size
    elif positions.size and (positions.min() < 0 or positions.max() >= size):
        raise BackendError(f"TensorScatter: linear writes at {positions.min()}.."
                           f"{positions.max()} fall outside the cache length {size}")
    out = cache.copy()
    rows = np.arange(batch)[:, None]
    # With the sequence axis moved next to the batch axis, one fancy assignment writes all.
    np.moveaxis(out, axis, 1)[rows, positions] = np.moveaxis(update, axis, 1)
    return out


TensorScatter = metaop(
    "TensorScatter", inputs=("past_cache", "update", "write_indices?: int64"),
    outputs=("present_cache",), attrs={"axis": int_(-2), "mode": string("linear")},
    types="T in {all, string}", rule=_tensor_scatter_rule, reference=_tensor_scatter_reference,
    role=Role.OPAQUE, since=(24,),
    doc="A copy of past_cache with update written along axis from each batch's write index "
        "(wrapping around in circular mode): a key/value cache update.",
)


# ------------------------------------------------------------------------------- BitCast


def _bitcast_rule(ctx: InferContext) -> list[Any]:
    to = from_onnx(ctx.attrs["to"])  # a DTypeError names an unknown or unsupported code
    if to.is_string:
        raise DTypeError(f"{ctx.describe()}: BitCast reinterprets numbers' bytes; to=string has none")
    source = ctx.dtype(0)
    if source.bits != to.bits or source.bits % 8:
        ctx.fail(f"BitCast needs whole-byte element types of the same width, got "
                 f"{source.name} ({source.bits} bits) to {to.name} ({to.bits} bits)")
    return [TensorType(to, ctx.shape(0))]


def _bitcast_reference(inputs: Arrays, attrs: Mapping[str, Any]) -> np.ndarray:
    return np.asarray(inputs[0]).view(from_onnx(attrs["to"]).numpy)


BitCast = metaop(
    "BitCast", inputs=("input: T1",), outputs=("output: T2",), attrs={"to": int_(REQUIRED)},
    types="T1 in {all}; T2 in {all}", rule=_bitcast_rule, reference=_bitcast_reference,
    role=Role.OPAQUE, since=(26,),
    doc="The same bits read as another element type of the same width (no conversion).",
)

__all__ = ["Attention", "BitCast", "RMSNormalization", "RotaryEmbedding", "SOFTMAX_PRECISIONS",
           "SwiGLU", "Swish", "TensorScatter", "attention_bias", "attention_reference",
           "rmsnorm_semantics"]
