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
``recognize_onnx_attention``); so does ONNX Runtime's ``com.microsoft::Attention`` (what its
transformers optimizer writes) and its ``QAttention`` (the same after ``quantize_dynamic``) with
constant weights and bias, an optional 2-D 0/1 mask or 1-D lengths and no past, expanded to
the zoo transformer's form (rule ``expand_ort_attention``). When Kt is made by a
Transpose (BERT: ``Transpose(perm=[0,2,3,1])`` of the projected keys), the new node reads that
Transpose's input through one composed Transpose (or directly, when the composition is the
identity), else a Transpose of the last two axes is inserted. A mask of rank below 2 gets
leading unit axes. The scores, scaled, masked scores and probabilities must have no other
consumers.

Example:
    >>> len(attention_rules), attention_rules[0].name, attention_rules[-1].name
    (12, 'recognize_attention', 'fold_attention_transposes')
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


def _additive_mask(ed: GraphEditor, name: str, x: Value, mask: Value, fill: np.float32) -> Value:
    """``[batch, 1, 1, total]``: ``fill`` where a 2-D 0/1 mask is 0, or (1-D lengths) at the
    positions from each item's length on; else 0."""
    if len(mask.type.shape) == 2:  # type: ignore[union-attr]
        f, = ed.add("Cast", [mask], {"to": 1}, name=name)
        f, = ed.add("Sub", [ed.const("one", np.float32(1.0)), f], name=name)
        f, = ed.add("Mul", [f, ed.const("filter", fill)], name=name)
    else:
        shape, = ed.add("Shape", [x], name=name)
        seq, = ed.add("Gather", [shape, ed.const("axis", np.int64(1))], {"axis": 0}, name=name)
        positions, = ed.add("Range", [ed.const("zero", np.int64(0)), seq, ed.const("step", np.int64(1))], name=name)
        lengths, = ed.add("Cast", [mask], {"to": 7}, name=name)
        lengths, = ed.add("Unsqueeze", [lengths, ed.const("column", np.array([1], np.int64))], name=name)
        past, = ed.add("GreaterOrEqual", [positions, lengths], name=name)
        f, = ed.add("Where", [past, ed.const("filter", fill), ed.const("zero", np.float32(0.0))], name=name)
    f, = ed.add("Unsqueeze", [f, ed.const("axes", np.array([1, 2], np.int64))], name=name)
    return f


def _expand_ort(m: Match, ed: GraphEditor) -> Built:
    """ONNX Runtime's ``com.microsoft::Attention`` (what its transformers optimizer writes) or
    ``QAttention`` (the same quantized by ``quantize_dynamic``) as three projections (MatMul and
    a bias Add; quantized: ``MatMulIntegerToFloat`` with its bias), heads split,
    ``ai.metadef::Attention`` and heads merged: the zoo transformer's form, which the fused
    attention kernels take."""
    node = m.node("ort")
    quantized = node.op == "QAttention"
    get = list(node.inputs) + [None] * 9
    x, w, bias = get[0], get[1], get[2]
    mask, past = (get[5], get[8]) if quantized else (get[3], get[4])
    attrs = {"unidirectional": 0, "scale": 0.0, "mask_filter_value": -10000.0, **node.attrs}
    if attrs["unidirectional"] or attrs.get("qkv_hidden_sizes") or attrs.get("do_rotary") \
            or attrs.get("past_present_share_buffer") or past is not None or any(v is not None for v in get[9:]) \
            or (not quantized and any(v is not None for v in get[5:9])):
        return Refusal("only the plain form (no unidirectional, qkv_hidden_sizes, rotary, past) is expanded")
    if any(ed.num_uses(o) or ed.is_output(o) for o in node.outputs[1:]):
        return Refusal("its present output is read")
    if w is None or w.const is None or bias is None or bias.const is None:
        return Refusal("the weights or the bias are not constants")
    weights, b = np.asarray(w.const), np.asarray(bias.const, np.float32)
    heads = int(attrs["num_heads"])
    if x is None or x.type is None or x.type.shape is None or len(x.type.shape) != 3 or weights.ndim != 2 \
            or weights.shape[1] % 3 or b.shape != (weights.shape[1],) or (weights.shape[1] // 3) % heads:
        return Refusal("input, weights and bias are not [batch, seq, hidden], [hidden, 3 h], [3 h]")
    if mask is not None and (mask.type is None or mask.type.shape is None or len(mask.type.shape) not in (1, 2)):
        return Refusal("only a 2-D [batch, total] 0/1 mask_index or 1-D [batch] lengths are expanded")
    h = weights.shape[1] // 3
    scales, zeros = ((get[4], get[7]) if quantized else (None, None))
    if quantized and (scales is None or scales.const is None or (zeros is not None and zeros.const is None)):
        return Refusal("the weights' scale or zero point is not a constant")
    depth = h // heads
    name = fused_name(node, "Attention")

    def column(v: Value | None, i: int, what: str) -> Value | None:  # part i of a per-column constant
        if v is None:
            return None
        c = np.asarray(v.const)
        return ed.const(what, c if c.size == 1 else np.ascontiguousarray(c.reshape(-1)[i * h:(i + 1) * h]))

    parts = []
    for i in range(3):  # (each projection as the zoo's, then [b, heads, s, d])
        wi = ed.const("w", np.ascontiguousarray(weights[:, i * h:(i + 1) * h]))
        bi = ed.const("bias", b[i * h:(i + 1) * h])
        if quantized:
            inputs = [x, wi, get[3], column(scales, i, "w_scale"), get[6], column(zeros, i, "w_zero_point"), bi]
            p, = ed.add("MatMulIntegerToFloat", inputs, name=name, domain="com.microsoft")
        else:
            p, = ed.add("MatMul", [x, wi], name=name)
            p, = ed.add("Add", [p, bi], name=name)
        p, = ed.add("Reshape", [p, ed.const("heads", np.array([0, 0, heads, depth], np.int64))], name=name)
        p, = ed.add("Transpose", [p], {"perm": [0, 2, 1, 3]}, name=name)
        parts.append(p)
    if mask is not None:  # ORT's: the filter value added where the mask is 0, or past the length
        parts.append(_additive_mask(ed, name, x, mask, np.float32(attrs["mask_filter_value"])))
    scale = float(attrs["scale"]) or 1.0 / float(np.sqrt(depth))
    y, = ed.add("Attention", parts, {"scale": scale}, name=name, domain="ai.metadef")
    y, = ed.add("Transpose", [y], {"perm": [0, 2, 1, 3]}, name=name)
    y, = ed.add("Reshape", [y, ed.const("hidden", np.array([0, 0, h], np.int64))], name=name)
    return [y, *node.outputs[1:]]


def _heads_swap(node: Node) -> bool:
    """A Transpose that swaps axes 1 and 2 of a 4-D tensor (``[b, s, h, d] <-> [b, h, s, d]``)."""
    return [int(p) for p in node.attrs.get("perm", ())] == [0, 2, 1, 3]


def _fold_patterns() -> Iterator[Pattern]:
    parts = [op("Transpose", var(n), name=f"{n}_heads", where=_heads_swap) for n in ("q", "k", "v")]
    for extra in ((), (var("mask"),)):
        inner = op("Attention", *parts, *extra, name="inner", domain="ai.metadef",
                   where=lambda n: n.attrs.get("layout", "bhsd") == "bhsd")
        yield op("Transpose", inner, name="merge", where=_heads_swap)


def _fold(m: Match, ed: GraphEditor) -> Built:
    """``Transpose(Attention(Transpose(q), Transpose(k), Transpose(v)[, mask]))`` with each
    Transpose swapping the sequence and head axes -> ``Attention(q, k, v[, mask],
    layout="bshd")``: the projections' outputs read in place, the result written as the
    Reshape after it wants (the Transposes stay where they have other readers)."""
    inner = m.value("inner")
    if ed.num_uses(inner) != 1 or ed.is_output(inner):
        return Refusal("the attention's [b, h, s, d] output has other readers")
    inputs = [m.value(n) for n in ("q", "k", "v")] + ([m.value("mask")] if m.has("mask") else [])
    return emit(m, ed, "Attention", inputs, {**m.node("inner").attrs, "layout": "bshd"}, domain="ai.metadef")


attention_rules = [Rule(RULE, p, _build, doc="softmax(Q Kt * scale + mask) V -> ai.metadef::Attention")
                   for p in _patterns()]
attention_rules += [Rule("recognize_onnx_attention", op("Attention", *(var(n) for n in names), name="onnx_attention"),
                         _build_onnx, doc="ONNX Attention (plain form) -> ai.metadef::Attention")
                    for names in (("q", "k", "v"), ("q", "k", "v", "mask"))]
attention_rules += [Rule("expand_ort_attention", op(kind, name="ort", domain="com.microsoft"), _expand_ort,
                         doc=f"ORT's com.microsoft::{kind} -> projections + ai.metadef::Attention")
                    for kind in ("Attention", "QAttention")]
attention_rules += [Rule("fold_attention_transposes", p, _fold,
                         doc="heads-first Transposes around ai.metadef::Attention -> layout='bshd'")
                    for p in _fold_patterns()]

__all__ = ["attention_rules"]
