"""``recognize_attention``: scaled-dot-product attention -> ``ai.metadef::Attention``.

::

    scores = MatMul(Q, Kt)                 # Kt: [*B, D, N]
    scores = Div(scores, c) | Mul(scores, c)   # optional; scale 1/c or c
    scores = Add(scores, mask)             # optional additive mask
    probs  = Softmax(scores, axis=-1)
    y      = MatMul(probs, V)

becomes ``Attention(Q, K, V[, mask], scale)`` with K ``[*B, N, D]``: when Kt is made by a
Transpose (BERT: ``Transpose(perm=[0,2,3,1])`` of the projected keys), the new node reads that
Transpose's input through one composed Transpose (or directly, when the composition is the
identity), else a Transpose of the last two axes is inserted. A mask of rank below 2 gets
leading unit axes. The scores, scaled, masked scores and probabilities must have no other
consumers.

Example:
    >>> len(attention_rules), attention_rules[0].name
    (6, 'recognize_attention')
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


attention_rules = [Rule(RULE, p, _build, doc="softmax(Q Kt * scale + mask) V -> ai.metadef::Attention")
                   for p in _patterns()]

__all__ = ["attention_rules"]
