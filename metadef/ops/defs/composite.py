"""Composite meta-ops in the ``ai.metadef`` domain: patterns the optimizer recognizes that
ONNX has no operator for (``metadef.passes.recognize_patterns`` introduces them).

- ``SiLU``: ``x * sigmoid(x)`` (a.k.a. Swish), elementwise.
- ``Attention``: scaled-dot-product attention ``softmax(scale * Q Kᵀ + mask) V`` over the last
  two axes, with broadcast leading (batch, head) axes. K is taken untransposed, ``[*B, N, D]``
  like Q, so a recognizer absorbs or inserts the Transpose that produced ``Kᵀ``. Its semantics
  is a four-statement program: scores, their maximum, the sum of shifted exponentials, the
  weighted sum of V.

Example:
    >>> from metadef.ops import get_op, infer_types
    >>> from metadef.shape import parse_type
    >>> y, = infer_types(get_op("Attention", "ai.metadef"), "/attn",
    ...     [parse_type("f32[b,12,s,64]"), parse_type("f32[b,12,s,64]"),
    ...      parse_type("f32[b,12,s,64]"), parse_type("f32[b,1,1,s]")], {"scale": 0.125})
    >>> str(y)
    'f32[b,12,s,64]'
    >>> print(attention_semantics({"scale": 0.125}, [(2, 5, 4), (2, 6, 4), (2, 6, 3)]))
    t_s[..., m, n] = scale * sum[d] Q[..., m, d] * K[..., n, d]
    t_max[..., m] = max[n] t_s[..., m, n]
    t_sum[..., m] = sum[n] exp(t_s[..., m, n] - t_max[..., m])
    Y[..., m, e] = sum[n] exp(t_s[..., m, n] - t_max[..., m]) * V[..., n, e] / t_sum[..., m]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from metadef.ops.interface import REQUIRED, float_
from metadef.ops.metaop import SAME_AS_FIRST, metaop
from metadef.ops.strategy import Role
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


def attention_semantics(attrs: Mapping[str, Any], shapes: Sequence[Sequence[Dim] | None]) -> str:
    """Scores ``scale * Q Kᵀ (+ mask)``, a softmax over ``n`` (max, exp-sum), then ``· V``."""
    mask = " + mask[..., m, n]" if len(shapes) > 3 and shapes[3] is not None else ""
    shifted = "exp(t_s[..., m, n] - t_max[..., m])"
    return "\n".join([
        f"t_s[..., m, n] = scale * sum[d] Q[..., m, d] * K[..., n, d]{mask}",
        "t_max[..., m] = max[n] t_s[..., m, n]",
        f"t_sum[..., m] = sum[n] {shifted}",
        f"Y[..., m, e] = sum[n] {shifted} * V[..., n, e] / t_sum[..., m]",
    ])


Attention = metaop(
    "Attention", domain=DOMAIN, inputs=("Q", "K", "V", "mask?"), outputs=("Y",),
    attrs={"scale": float_(REQUIRED)}, types="T in {float}", rule=ATTENTION_RULE,
    semantics=attention_semantics, role=Role.CONTRACTION, parallel=("m",),
    doc="softmax(scale * Q @ K^T + mask, axis=-1) @ V; Q [*B,M,D], K [*B,N,D], V [*B,N,Dv], "
        "mask broadcastable to [*B,M,N].",
)

__all__ = ["ATTENTION_RULE", "DOMAIN", "Attention", "SiLU", "attention_semantics"]
