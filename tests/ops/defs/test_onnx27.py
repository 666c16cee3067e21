"""The opset-27 recurrent-model ops (LinearAttention, CausalConvWithState): shapes, errors, and
numerics against ONNX Runtime (which implements both at opset 27) and onnx's reference
evaluator, on inputs the ONNX node tests do not use."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

from metadef.core.errors import ShapeError
from metadef.testing.onnx_cases import assert_same, check_model, infer_text, one_node_model, run_metadef

RNG = np.random.default_rng(2727)
OPS = ("LinearAttention", "CausalConvWithState")


def model(op: str, feeds: Mapping[str, np.ndarray | None], n_out: int = 2,
          **attrs: Any) -> onnx.ModelProto:
    """One opset-27 node reading ``feeds`` in order (None: an omitted optional input)."""
    given = {n: a for n, a in feeds.items() if a is not None}
    names = [n if a is not None else "" for n, a in feeds.items()]
    while names and not names[-1]:
        names.pop()
    m = one_node_model(op, given, inputs=names, n_out=n_out, opset=27, **attrs)
    m.ir_version = 10
    return m


def given(feeds: Mapping[str, np.ndarray | None]) -> dict[str, np.ndarray]:
    return {n: a for n, a in feeds.items() if a is not None}


def rand(*shape: int, dtype: Any = np.float32, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(dtype)


def check_reference(m: onnx.ModelProto, feeds: Mapping[str, np.ndarray], rtol: float = 1e-5,
                    atol: float = 1e-6) -> None:
    want = ReferenceEvaluator(m).run(None, dict(feeds))
    assert_same(run_metadef(m, feeds), [np.asarray(w) for w in want], rtol=rtol, atol=atol)


# ----------------------------------------------------------------------- LinearAttention


def test_linear_attention_shapes() -> None:
    heads = {"q_num_heads": 6, "kv_num_heads": 2}
    assert infer_text("LinearAttention", ["f32[b,s,96]", "f32[b,s,32]", "f32[b,s,40]", None,
                                          "f32[b,s,2]", "f32[b,s,1]"], heads) == \
        ["f32[b,s,120]", "f32[b,2,16,20]"]
    assert infer_text("LinearAttention", ["f16[b,s,32]", "f16[b,s,32]", "f16[b,s,32]",
                                          "f32[b,4,8,8]"],
                      {"q_num_heads": 4, "kv_num_heads": 4, "update_rule": "linear"}) == \
        ["f16[b,s,32]", "f32[b,4,8,8]"]


@pytest.mark.parametrize(("types", "attrs", "match"), [
    (["f32[b,s,32]"] * 3, {"q_num_heads": 6, "kv_num_heads": 4, "update_rule": "linear"},
     "positive multiple of kv_num_heads=4"),
    (["f32[b,s,32]"] * 3, {"q_num_heads": 4, "kv_num_heads": 4, "update_rule": "hebbian"},
     "update_rule='hebbian'"),
    (["f32[b,s,32]"] * 3, {"q_num_heads": 4, "kv_num_heads": 4}, "needs the decay input"),
    (["f32[b,s,32]"] * 3 + [None, "f32[b,s,4]"], {"q_num_heads": 4, "kv_num_heads": 4,
                                                  "update_rule": "delta"}, "takes no decay"),
    (["f32[b,s,30]"] * 3, {"q_num_heads": 4, "kv_num_heads": 4, "update_rule": "linear"},
     "query hidden size 30 does not split into 4 heads"),
    (["f32[b,s,32]", "f32[b,s,16]", "f32[b,s,32]"],
     {"q_num_heads": 4, "kv_num_heads": 4, "update_rule": "linear"}, "same head size"),
    (["f32[b,s,32]"] * 3 + ["f32[b,4,8,4]"],
     {"q_num_heads": 4, "kv_num_heads": 4, "update_rule": "linear"}, "past_state"),
    (["f32[b,s,32]"] * 3 + [None, "f32[b,s,4]", "f32[b,s,3]"],
     {"q_num_heads": 4, "kv_num_heads": 4}, "beta must be"),
    (["f32[b,5,32]", "f32[b,6,32]", "f32[b,5,32]"],
     {"q_num_heads": 4, "kv_num_heads": 4, "update_rule": "linear"}, "sequence length"),
])
def test_linear_attention_errors(types: list[str | None], attrs: dict[str, Any], match: str) -> None:
    with pytest.raises(ShapeError, match=match):
        infer_text("LinearAttention", types, attrs, n_outputs=2)


def _linear_feeds(rule: str, q_heads: int, kv_heads: int, *, seq: int = 5, d_k: int = 4,
                  d_v: int = 3, past: bool = False, per_head_decay: bool = False,
                  beta_shared: bool = False, dtype: Any = np.float32) -> dict[str, np.ndarray | None]:
    batch = 2
    feeds: dict[str, np.ndarray | None] = {
        "q": rand(batch, seq, q_heads * d_k, dtype=dtype),
        "k": rand(batch, seq, kv_heads * d_k, dtype=dtype, scale=0.5),
        "v": rand(batch, seq, kv_heads * d_v, dtype=dtype),
        "past": rand(batch, kv_heads, d_k, d_v, dtype=dtype) if past else None,
        "decay": None, "beta": None}
    if "gated" in rule:
        width = kv_heads if per_head_decay else kv_heads * d_k
        feeds["decay"] = -RNG.uniform(0.01, 0.5, (batch, seq, width)).astype(dtype)
    if "delta" in rule:
        feeds["beta"] = RNG.uniform(0.1, 0.9, (batch, seq, 1 if beta_shared else kv_heads)).astype(dtype)
    return feeds


@pytest.mark.parametrize(("rule", "q_heads", "kv_heads", "options", "attrs"), [
    ("linear", 3, 3, {}, {}),
    ("linear", 4, 2, {"past": True}, {"scale": 0.7}),
    ("gated", 2, 2, {"per_head_decay": True}, {}),
    ("gated", 6, 3, {"past": True}, {}),
    ("delta", 4, 4, {"beta_shared": True}, {}),
    ("gated_delta", 4, 2, {"past": True}, {"chunk_size": 2}),
    ("gated_delta", 3, 1, {"per_head_decay": True, "seq": 1, "past": True}, {}),
])
def test_linear_attention_matches_onnxruntime(rule: str, q_heads: int, kv_heads: int,
                                              options: dict[str, Any], attrs: dict[str, Any]) -> None:
    feeds = _linear_feeds(rule, q_heads, kv_heads, **options)
    m = model("LinearAttention", feeds, q_num_heads=q_heads, kv_num_heads=kv_heads,
              update_rule=rule, **attrs)
    check_model(m, given(feeds), rtol=1e-4, atol=1e-5)


def test_linear_attention_float16_state_and_output() -> None:
    feeds = _linear_feeds("gated_delta", 4, 2, dtype=np.float16)
    m = model("LinearAttention", feeds, q_num_heads=4, kv_num_heads=2)
    y, state = run_metadef(m, given(feeds))
    assert y.dtype == state.dtype == np.float16
    check_reference(m, given(feeds), rtol=2e-3, atol=2e-3)


def test_linear_attention_keeps_a_float32_past_state_with_float16_activations() -> None:
    feeds = _linear_feeds("gated", 2, 2, past=True, dtype=np.float16)
    feeds["past"] = feeds["past"].astype(np.float32)
    y, state = run_metadef(model("LinearAttention", feeds, q_num_heads=2, kv_num_heads=2,
                                 update_rule="gated"), given(feeds))
    assert (y.dtype, state.dtype) == (np.float16, np.float32)


def test_linear_attention_prefill_then_decode_equals_one_pass() -> None:
    """The state carries the recurrence: two calls on halves give the one-call result."""
    feeds = _linear_feeds("gated_delta", 4, 2, seq=6)
    attrs = {"q_num_heads": 4, "kv_num_heads": 2}
    whole, whole_state = run_metadef(model("LinearAttention", feeds, **attrs), given(feeds))
    first = {n: (a[:, :4] if a is not None else None) for n, a in feeds.items()}
    y1, state = run_metadef(model("LinearAttention", first, **attrs), given(first))
    second = {n: (a[:, 4:] if a is not None else None) for n, a in feeds.items()}
    second["past"] = state
    y2, state2 = run_metadef(model("LinearAttention", second, **attrs), given(second))
    np.testing.assert_allclose(np.concatenate([y1, y2], axis=1), whole, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state2, whole_state, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------- CausalConvWithState


def test_causal_conv_shapes_and_errors() -> None:
    assert infer_text("CausalConvWithState", ["f32[b,8,s]", "f32[8,1,1]", "f32[8]"]) == \
        ["f32[b,8,s]", "f32[b,8,0]"]
    with pytest.raises(ShapeError, match="weight must be \\[channels, 1, k\\]"):
        infer_text("CausalConvWithState", ["f32[b,8,s]", "f32[4,1,3]"])
    with pytest.raises(ShapeError, match="past_state \\[b,8,3\\] must be"):
        infer_text("CausalConvWithState", ["f32[b,8,s]", "f32[8,1,3]", None, "f32[b,8,3]"])
    with pytest.raises(ShapeError, match="bias must be 1-D"):
        infer_text("CausalConvWithState", ["f32[b,8,s]", "f32[8,1,3]", "f32[4]"])
    with pytest.raises(ShapeError, match="activation='gelu'"):
        infer_text("CausalConvWithState", ["f32[b,8,s]", "f32[8,1,3]"], {"activation": "gelu"})
    with pytest.raises(ShapeError, match="must be 3-D"):
        infer_text("CausalConvWithState", ["f32[b,8]", "f32[8,1,3]"])


@pytest.mark.parametrize(("length", "width", "bias", "past", "activation", "dtype"), [
    (9, 3, True, True, "none", np.float32),
    (1, 5, False, True, "silu", np.float32),
    (2, 6, True, False, "swish", np.float32),
    (7, 1, True, False, "silu", np.float32),
    (6, 4, True, True, "silu", np.float16),
])
def test_causal_conv_matches_onnxruntime(length: int, width: int, bias: bool, past: bool,
                                         activation: str, dtype: Any) -> None:
    batch, channels = 3, 5
    feeds = {"x": rand(batch, channels, length, dtype=dtype),
             "w": rand(channels, 1, width, dtype=dtype),
             "b": rand(channels, dtype=dtype) if bias else None,
             "state": rand(batch, channels, width - 1, dtype=dtype) if past else None}
    tol = 2e-3 if dtype == np.float16 else 1e-5
    check_model(model("CausalConvWithState", feeds, activation=activation), given(feeds),
                rtol=tol, atol=tol)


def test_causal_conv_streaming_equals_one_pass() -> None:
    """Feeding the sequence in chunks, carrying present_state, gives the whole-sequence output."""
    x, w = rand(2, 3, 10), rand(3, 1, 4)
    whole, _ = run_metadef(model("CausalConvWithState", {"x": x, "w": w}), {"x": x, "w": w})
    state, parts = np.zeros((2, 3, 3), np.float32), []
    for chunk in (x[:, :, :3], x[:, :, 3:4], x[:, :, 4:]):
        feeds = {"x": chunk, "w": w, "b": None, "state": state}
        y, state = run_metadef(model("CausalConvWithState", feeds), given(feeds))
        parts.append(y)
    np.testing.assert_allclose(np.concatenate(parts, axis=2), whole, rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_conformance() -> None:
    from metadef.testing.conformance import format_report, run_cases

    report = run_cases(op=OPS, pattern=r"^(?!.*_expanded)")  # function bodies: other ops' tests
    assert not report.failures() and report.totals()["unsupported"] == 0, format_report(report)
