"""ai.metadef composite ops: SiLU and Attention (types, semantics against numpy and against
the decomposed graph they replace)."""

import numpy as np
import pytest

import metadef as md
from metadef.core.errors import MetadefError
from metadef.ir import parse_graph
from metadef.ops import Role, get_op, infer_types
from metadef.ops.numpy_eval.run import run_node
from metadef.shape import parse_type

RNG = np.random.default_rng(0)
ATTENTION = get_op("Attention", "ai.metadef")
SILU = get_op("SiLU", "ai.metadef")


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _attention_numpy(q, k, v, mask, scale):
    s = scale * (q.astype(np.float64) @ np.swapaxes(k, -1, -2)) + (0 if mask is None else mask)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def test_silu_is_elementwise_and_matches_numpy():
    assert SILU.role is Role.ELEMENTWISE and SILU.domain == "ai.metadef"
    x = _f32(3, 5)
    y, = run_node(SILU, {}, [x], [parse_type("f32[3,5]")])
    np.testing.assert_allclose(y, x / (1 + np.exp(-x.astype(np.float64))), rtol=1e-6)


@pytest.mark.parametrize("types,want", [
    (["f32[b,12,s,64]", "f32[b,12,t,64]", "f32[b,12,t,32]"], "f32[b,12,s,32]"),
    (["f32[b,12,s,64]", "f32[1,12,t,64]", "f32[b,1,t,64]", "f32[b,1,1,t]"], "f32[b,12,s,64]"),
    (["f16[5,8]", "f16[7,8]", "f16[7,3]", "f16[5,7]"], "f16[5,3]"),
])
def test_attention_shape_rule(types, want):
    out, = infer_types(ATTENTION, "/attn", [parse_type(t) for t in types], {"scale": 0.125})
    assert str(out) == want


def test_attention_shape_rule_names_the_disagreement():
    with pytest.raises(MetadefError, match="D to agree"):
        infer_types(ATTENTION, "/attn", [parse_type("f32[4,8]"), parse_type("f32[6,9]"),
                                         parse_type("f32[6,2]")], {"scale": 1.0})


@pytest.mark.parametrize("with_mask", [False, True])
def test_attention_semantics_match_numpy(with_mask):
    q, k, v = _f32(2, 3, 5, 4), _f32(1, 3, 6, 4), _f32(2, 3, 6, 7)
    mask = _f32(2, 1, 1, 6) if with_mask else None
    inputs = [q, k, v] + ([mask] if with_mask else [])
    y, = run_node(ATTENTION, {"scale": 0.5}, inputs, [parse_type("f32[2,3,5,7]")])
    np.testing.assert_allclose(y, _attention_numpy(q, k, v, mask, 0.5), rtol=1e-5, atol=1e-6)


DECOMPOSED = """graph g(%q: f32[b,2,s,4], %kt: f32[b,2,4,t], %v: f32[b,2,t,3], %mask: f32[b,1,1,t]) -> (%y) {
  %c: f32[] = const [2.0]
  %scores: f32[b,2,s,t] = MatMul(%q, %kt)
  %scaled: f32[b,2,s,t] = Div(%scores, %c)
  %masked: f32[b,2,s,t] = Add(%scaled, %mask)
  %probs: f32[b,2,s,t] = Softmax(%masked) {axis=-1}
  %y: f32[b,2,s,3] = MatMul(%probs, %v)
  return %y
}"""

FUSED = """graph g(%q: f32[b,2,s,4], %kt: f32[b,2,4,t], %v: f32[b,2,t,3], %mask: f32[b,1,1,t]) -> (%y) {
  %k: f32[b,2,t,4] = Transpose(%kt) {perm=[0,1,3,2]}
  %y: f32[b,2,s,3] = ai.metadef::Attention(%q, %k, %v, %mask) {scale=0.5}
  return %y
}"""


def test_attention_graph_matches_the_decomposed_graph_on_the_reference_backend():
    feeds = {"q": _f32(2, 2, 5, 4), "kt": _f32(2, 2, 4, 6), "v": _f32(2, 2, 6, 3), "mask": _f32(2, 1, 1, 6)}
    want = md.compile(parse_graph(DECOMPOSED), target="reference").run(feeds)["y"]
    got = md.compile(parse_graph(FUSED, types="check"), target="reference").run(feeds)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mask_shape", [None, (2, 1, 1, 6), (2, 3, 5, 6), (5, 6), (6,)])
def test_attention_with_heads_after_the_sequence_is_the_transposed_attention(mask_shape):
    """``layout="bshd"``: Q, K, V, Y ``[b, s, h, d]``, the scores (and the mask) ``[b, h, m, n]``."""
    q, k, v = _f32(2, 5, 3, 4), _f32(2, 6, 3, 4), _f32(2, 6, 3, 7)
    mask = None if mask_shape is None else _f32(*mask_shape)
    heads_first = [np.swapaxes(t, 1, 2) for t in (q, k, v)]
    want = np.swapaxes(_attention_numpy(*heads_first, mask, 0.5), 1, 2)
    operands = [q, k, v] + ([mask] if mask is not None else [])
    types = [parse_type(f"f32[{','.join(map(str, t.shape))}]") for t in operands]
    out, = infer_types(ATTENTION, "/attn", types, {"scale": 0.5, "layout": "bshd"})
    assert out.shape == (2, 5, 3, 7)
    y, = run_node(ATTENTION, {"scale": 0.5, "layout": "bshd"}, operands, [out])
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def test_attention_layout_must_be_known():
    with pytest.raises(MetadefError, match="layout must be one of bhsd, bshd"):
        infer_types(ATTENTION, "/attn", [parse_type("f32[4,8]")] * 3, {"scale": 1.0, "layout": "sbhd"})
