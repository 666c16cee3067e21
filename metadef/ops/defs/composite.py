"""Composite meta-ops in the ``ai.metadef`` domain: patterns the optimizer recognizes that
ONNX has no operator for (``metadef.passes.recognize_patterns`` introduces them).

- ``SiLU``: ``x * sigmoid(x)`` (a.k.a. Swish), elementwise.
- ``Attention``: scaled-dot-product attention ``softmax(scale * Q Kᵀ + mask) V`` over the last
  two axes, with broadcast leading (batch, head) axes. K is taken untransposed, ``[*B, N, D]``
  like Q, so a recognizer absorbs or inserts the Transpose that produced ``Kᵀ``. Its semantics
  is a four-statement program: scores, their maximum, the sum of shifted exponentials, the
  weighted sum of V. ``layout="bshd"`` takes Q, K, V and gives Y with the heads after the
  sequence (``[*B, M, H, D]``: a projection's output reshaped, as ORT's MultiHeadAttention
  takes it), which spares the Transposes a transformer puts around it (the optimizer's
  ``fold_attention_transposes``); the scores are ``[*B, H, M, N]`` either way.
- ``Lookup``: ``Y = table[X - min]`` for an 8-bit ``X`` and a 256-entry ``table``: any
  elementwise function of one 8-bit tensor, tabulated (the optimizer's ``tabulate_8bit``
  replaces such chains: a QOperator GELU, a quantized sigmoid).

Example:
    >>> from metadef.ops import get_op, infer_types
    >>> from metadef.shape import parse_type
    >>> y, = infer_types(get_op("Attention", "ai.metadef"), "/attn",
    ...     [parse_type("f32[b,12,s,64]"), parse_type("f32[b,12,s,64]"),
    ...      parse_type("f32[b,12,s,64]"), parse_type("f32[b,1,1,s]")], {"scale": 0.125})
    >>> str(y)
    'f32[b,12,s,64]'
    >>> y, = infer_types(get_op("Attention", "ai.metadef"), "/attn",
    ...     [parse_type("f32[b,s,12,64]"), parse_type("f32[b,s,12,64]"),
    ...      parse_type("f32[b,s,12,64]"), parse_type("f32[b,1,1,s]")], {"scale": 0.125, "layout": "bshd"})
    >>> str(y)
    'f32[b,s,12,64]'
    >>> print(attention_semantics({"scale": 0.125}, [(2, 5, 4), (2, 6, 4), (2, 6, 3)]))
    t_s[..., m, n] = scale * sum[d] Q[..., m, d] * K[..., n, d]
    t_max[..., m] = max[n] t_s[..., m, n]
    t_sum[..., m] = sum[n] exp(t_s[..., m, n] - t_max[..., m])
    Y[..., m, e] = sum[n] exp(t_s[..., m, n] - t_max[..., m]) * V[..., n, e] / t_sum[..., m]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from metadef.ops.infer import InferContext
from metadef.ops.interface import REQUIRED, float_, string
from metadef.ops.metaop import SAME_AS_FIRST, metaop
from metadef.ops.strategy import Role
from metadef.ops.typerule import compile_rule
from metadef.shape import Dim

DOMAIN = "ai.metadef"

SiLU = metaop(
    "SiLU", domain=DOMAIN, inputs=("X",), outputs=("Y",), types="T in {float}",
    rule=SAME_AS_FIRST, semantics="Y[...] = X[...] * sigmoid(X[...])", role=Role.ELEMENTWISE,
    doc="Sigmoid-weighted linear unit (Swish): X * sigmoid(X).",
)

# The mask's last two dims are each 1 or M (N): the DSL has no "either", so they are free
# here and numpy broadcasting in the semantics checks them; its leading dims join *B.
ATTENTION_RULE = """
rule attention_type_infer:
  q: tensor<*B, M, D; T>
  k: tensor<*B, N, D; T>
  v: tensor<*B, N, Dv; T>
  mask?: tensor<*B, _, _; T>
  y: tensor<*B, M, Dv; T>
"""

ATTENTION_BSHD_RULE = """
rule attention_bshd_type_infer:
  q: tensor<*B, M, H, D; T>
  k: tensor<*B, N, H, D; T>
  v: tensor<*B, N, H, Dv; T>
  mask?: tensor<*C; T>
  y: tensor<*B, M, H, Dv; T>
"""

LAYOUTS = ("bhsd", "bshd")
"""``Attention``'s layouts: the heads among the batch axes (``[*B, M, D]``, the default), or
after the sequence (``[*B, M, H, D]``)."""

_RULES = {"bhsd": compile_rule(ATTENTION_RULE), "bshd": compile_rule(ATTENTION_BSHD_RULE)}


def _attention_rule(ctx: InferContext) -> list[Any]:
    layout = ctx.attrs["layout"]
    if layout not in _RULES:
        ctx.fail(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    return list(_RULES[layout](ctx))


def attention_semantics(attrs: Mapping[str, Any], shapes: Sequence[Sequence[Dim] | None]) -> str:
    """Scores ``scale * Q Kᵀ (+ mask)``, a softmax over ``n`` (max, exp-sum), then ``· V``;
    with ``layout="bshd"`` the head ``h`` indexes Q, K, V and Y after the sequence axis."""
    heads = attrs.get("layout", "bhsd") == "bshd"
    mask = ""
    if len(shapes) > 3 and shapes[3] is not None:
        rank = len(shapes[3])
        mask = (" + mask[..., h, m, n]" if rank >= 3 else " + mask[m, n]" if rank == 2 else " + mask[n]") \
            if heads else " + mask[..., m, n]"
    h, qk = (", h", "h, ") if heads else ("", "")
    shifted = f"exp(t_s[..., {qk}m, n] - t_max[..., {qk}m])"
    return "\n".join([
        f"t_s[..., {qk}m, n] = scale * sum[d] Q[..., m{h}, d] * K[..., n{h}, d]{mask}",
        f"t_max[..., {qk}m] = max[n] t_s[..., {qk}m, n]",
        f"t_sum[..., {qk}m] = sum[n] {shifted}",
        f"Y[..., m{h}, e] = sum[n] {shifted} * V[..., n{h}, e] / t_sum[..., {qk}m]",
    ])


Attention = metaop(
    "Attention", domain=DOMAIN, inputs=("Q", "K", "V", "mask?"), outputs=("Y",),
    attrs={"scale": float_(REQUIRED), "layout": string("bhsd")}, types="T in {float}", rule=_attention_rule,
    semantics=attention_semantics, role=Role.CONTRACTION, parallel=("m",),
    doc="softmax(scale * Q @ K^T + mask, axis=-1) @ V; Q [*B,M,D], K [*B,N,D], V [*B,N,Dv], "
        "mask broadcastable to [*B,M,N]; layout 'bshd': Q [*B,M,H,D], K [*B,N,H,D], V [*B,N,H,Dv], "
        "Y [*B,M,H,Dv], mask broadcastable to the scores [*B,H,M,N].",
)


LOOKUP_RULE = """
rule lookup_type_infer:
  x: tensor<*S; T1>
  table: tensor<256; T2>
  y: tensor<*S; T2>
"""


def lookup_reference(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> np.ndarray:
    """``table[x - min]``: each 8-bit value's entry (an int8 ``-128`` is entry 0).

    Example:
        >>> lookup_reference([np.array([-128, 0, 127], np.int8), np.arange(256.0)], {}).tolist()
        [0.0, 128.0, 255.0]
    """
    x, table = inputs
    x = np.asarray(x)
    return np.asarray(table)[x.astype(np.int64) - int(np.iinfo(x.dtype).min)]


Lookup = metaop(
    "Lookup", domain=DOMAIN, inputs=("X: T1", "table: T2"), outputs=("Y: T2",),
    types="T1 in {int8, uint8}; T2 in {all}", rule=compile_rule(LOOKUP_RULE), reference=lookup_reference,
    role=Role.OPAQUE,
    doc="Y = table[X - min(X's type)]: an elementwise function of an 8-bit tensor, tabulated (256 entries).",
)

__all__ = ["ATTENTION_BSHD_RULE", "ATTENTION_RULE", "DOMAIN", "LAYOUTS", "LOOKUP_RULE", "Attention", "Lookup", "SiLU",
           "attention_semantics", "lookup_reference"]
