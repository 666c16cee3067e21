"""``recognize_attention``: scaled-dot-product attention -> ``ai.metadef::Attention``.

::

    scores = MatMul(Q, Kt)                 # Kt: [*B, D, N]
    scores = Div(scores, c) | Mul(scores, c)   # optional; scale 1/c or c
    scores = Add(scores, mask)             # optional additive mask
    probs  = Softmax(scores, axis=-1)
    y      = MatMul(probs, V)

becomes ``Attention(Q, K, V[, mask], scale)`` with K ``[*B, N, D]``; so does ONNX's own
``Attention`` (opset 23, as exporters now emit scaled-dot-product attention) in its plain
form: 4-D Q, K, V with as many key/value heads as query heads, an optional float (additive)
mask, no causal mask, softcap, window, past key/value or extra outputs (rule
``recognize_onnx_attention``). When Kt is made by a
Transpose (BERT: ``Transpose(perm=[0,2,3,1])`` of the projected keys), the new node reads that
Transpose's input through one composed Transpose (or directly, when the composition is the
identity), else a Transpose of the last two axes is inserted. A mask of rank below 2 gets
leading unit axes. The scores, scaled, masked scores and probabilities must have no other
consumers.

Example:
    >>> len(attention_rules), attention_rules[0].name, attention_rules[-1].name
    (8, 'recognize_attention', 'recognize_onnx_attention')
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from metadef.ir import Node, Value
from metadef.passes.patterns.common import emit, escaping, fused_name, rank_of, scalar, scalar_value
from metadef.rewrite import GraphEditor, Match, Refusal, Rule, const, match, op, var
from metadef.rewrite.engine import Built
from metadef.rewrite.pattern import Pattern

RULE = "recognize_attention"
_TRANSPOSED = op("Transpose", var("source"), name="transpose")


def _softmax_over_last(node: Node) -> bool:
    rank = rank_of(node.inputs[0])
    return bool(rank) and int(node.attrs.get("axis", -1)) % rank == rank - 1


def _patterns() -> Iterator[Pattern]:
    scores = op("MatMul", var("q"), var("kt"), name="scores")
    for scaled in (op("Div", scores, const("divisor", where=scalar()), name="scaled"),
                   op("Mul", scores, const("factor", where=scalar()), name="scaled", commutative=True),
                   scores):
        for masked in (op("Add", scaled, var("mask"), name="masked", commutative=True), scaled):
            probs = op("Softmax", masked, name="probs", where=_softmax_over_last)
            yield op("MatMul", probs, var("v"), name="attention")


def _scale(m: Match) -> float:
    if m.has("divisor"):
        return 1.0 / scalar_value(m, "divisor")
    return scalar_value(m, "factor") if m.has("factor") else 1.0


def _keys(m: Match, ed: GraphEditor, rank: int) -> Value:
    """K ``[*B, N, D]`` from Kt ``[*B, D, N]``: through the Transpose that made Kt when there
    is one (not marked no_fuse), else a new Transpose of the last two axes."""
    kt = m.value("kt")
    swap = [*range(rank - 2), rank - 1, rank - 2]
    made = match(_TRANSPOSED, kt, ed.num_uses)
    if made is not None and not made.node("transpose").meta.get("no_fuse"):
        perm = [int(p) for p in made.node("transpose").attrs["perm"]]
        composed = [perm[i] for i in swap]
        source = made.value("source")
        if composed == list(range(rank)):
            return source
        k, = ed.add("Transpose", [source], {"perm": composed}, name=fused_name(m.nodes[0], "keys"))
        return k
    k, = ed.add("Transpose", [kt], {"perm": swap}, name=fused_name(m.nodes[0], "keys"))
    return k


def _mask(m: Match, ed: GraphEditor) -> Value | None:
    if not m.has("mask"):
        return None
    mask = m.value("mask")
    rank = rank_of(mask)
    if rank is None or rank >= 2:
        return mask
    axes = ed.const("attention_mask_axes", np.arange(2 - rank, dtype=np.int64))
    widened, = ed.add("Unsqueeze", [mask, axes], name=fused_name(m.nodes[0], "mask"))
    return widened


def _build(m: Match, ed: GraphEditor) -> Built:
    q, kt, v = m.value("q"), m.value("kt"), m.value("v")
    ranks = [rank_of(t) for t in (q, kt, v)]
    if any(r is None or r < 2 for r in ranks):
        return None  # 1-D MatMul operands: numpy promotion, not attention
    refusal = escaping(m, ed)
    if refusal is not None:
        return refusal
    if m.has("mask") and rank_of(m.value("mask")) is None:
        return Refusal(f"the mask %{m.value('mask').name} has an unknown rank")
    inputs = [q, _keys(m, ed, ranks[1]), v]
    mask = _mask(m, ed)
    return emit(m, ed, "Attention", inputs if mask is None else [*inputs, mask], {"scale": _scale(m)},
                domain="ai.metadef")


_PLAIN = {"is_causal": 0, "softcap": 0.0, "qk_matmul_output_mode": 0, "left_window_size": -1,
          "right_window_size": -1, "q_num_heads": None, "kv_num_heads": None}


def _build_onnx(m: Match, ed: GraphEditor) -> Built:
    """ONNX's Attention in its plain form as ``ai.metadef::Attention`` (see the module doc)."""
    node = m.node("onnx_attention")
    for key, plain in _PLAIN.items():
        if node.attrs.get(key, plain) != plain:
            return Refusal(f"{key}={node.attrs[key]!r} (only the plain form is recognized)")
    if len(node.outputs) != 1:
        return Refusal("present key/value or qk_matmul_output are asked for")
    q, k, v = (m.value(n) for n in ("q", "k", "v"))
    types = [t.type for t in (q, k, v)]
    if any(t is None or t.shape is None or len(t.shape) != 4 for t in types) or types[0].dtype != types[2].dtype:
        return Refusal("Q, K and V are not all 4-D of one dtype")
    if types[0].shape[1] != types[1].shape[1] or types[1].shape[1] != types[2].shape[1]:
        return Refusal("key/value heads differ from query heads (grouped-query attention)")
    mask = m.value("mask") if m.has("mask") else None
    if mask is not None and (mask.type is None or mask.type.dtype != types[0].dtype):
        return Refusal("the mask is not an additive mask of Q's dtype")
    scale = node.attrs.get("scale")
    if scale is None:
        depth = types[0].shape[-1]
        if not isinstance(depth, int):
            return Refusal("the default scale needs a static head size")
        scale = 1.0 / float(np.sqrt(depth))
    return emit(m, ed, "Attention", [q, k, v] if mask is None else [q, k, v, mask], {"scale": float(scale)},
                domain="ai.metadef")


attention_rules = [Rule(RULE, p, _build, doc="softmax(Q Kt * scale + mask) V -> ai.metadef::Attention")
                   for p in _patterns()]
attention_rules += [Rule("recognize_onnx_attention", op("Attention", *(var(n) for n in names), name="onnx_attention"),
                         _build_onnx, doc="ONNX Attention (plain form) -> ai.metadef::Attention")
                    for names in (("q", "k", "v"), ("q", "k", "v", "mask"))]

__all__ = ["attention_rules"]
