"""The ops of ONNX opsets 23-28 (Attention, RMSNormalization, RotaryEmbedding, Swish, SwiGLU,
TensorScatter, BitCast, CumProd): shapes, errors, and numerics against ONNX Runtime where it
implements the op at that opset, else against onnx's reference evaluator."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from metadef.core.errors import DTypeError, ShapeError
from metadef.testing.onnx_cases import assert_same, check_model, infer_text, run_metadef

RNG = np.random.default_rng(2323)
OPS = ("Attention", "RMSNormalization", "RotaryEmbedding", "Swish", "SwiGLU", "TensorScatter",
       "BitCast", "CumProd")


def model(op: str, feeds: Mapping[str, np.ndarray | None], opset: int, n_out: int = 1,
          consts: Mapping[str, np.ndarray] | None = None, **attrs: Any) -> onnx.ModelProto:
    """One node reading ``feeds`` in order (a None feed is an omitted optional input), then
    ``consts`` (initializers); writes ``out0``, ``out1``..."""
    consts = dict(consts or {})
    names = [("" if a is None else n) for n, a in feeds.items()] + list(consts)
    outs = [f"out{i}" for i in range(n_out)]
    graph = helper.make_graph(
        [helper.make_node(op, names, outs, **attrs)], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in feeds.items() if a is not None],
        [helper.make_empty_tensor_value_info(o) for o in outs],
        [onnx.numpy_helper.from_array(a, n) for n, a in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def given(feeds: Mapping[str, np.ndarray | None]) -> dict[str, np.ndarray]:
    return {n: a for n, a in feeds.items() if a is not None}


def check_reference(m: onnx.ModelProto, feeds: Mapping[str, np.ndarray], rtol: float = 1e-5,
                    atol: float = 1e-6) -> None:
    """metadef agrees with onnx's reference evaluator (for ops ONNX Runtime lacks)."""
    want = ReferenceEvaluator(m).run(None, dict(feeds))
    assert_same(run_metadef(m, feeds), [np.asarray(w) for w in want], rtol=rtol, atol=atol)


def rand(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


# ----------------------------------------------------------------------------- Attention


def test_attention_shapes() -> None:
    assert infer_text("Attention", ["f32[b,12,s,64]", "f32[b,12,t,64]", "f32[b,12,t,64]"]) == \
        ["f32[b,12,s,64]", "f32[b,12,t,64]", "f32[b,12,t,64]", "f32[b,12,s,t]"]
    assert infer_text("Attention", ["bf16[b,s,768]", "bf16[b,t,256]", "bf16[b,t,128]"],
                      {"q_num_heads": 12, "kv_num_heads": 4}, n_outputs=1) == ["bf16[b,s,384]"]
    past = ["f32[b,8,1,16]", "f32[b,2,1,16]", "f32[b,2,1,16]", "bool[b,1,1,c]", "f32[b,2,c,16]",
            "f32[b,2,c,16]"]
    assert infer_text("Attention", past) == \
        ["f32[b,8,1,16]", "f32[b,2,c + 1,16]", "f32[b,2,c + 1,16]", "f32[b,8,1,c + 1]"]


@pytest.mark.parametrize(("types", "attrs", "match"), [
    (["f32[b,s,64]", "f32[b,t,64]", "f32[b,t,64]"], {}, "need the q_num_heads and kv_num_heads"),
    (["f32[b,s,64]", "f32[b,t,60]", "f32[b,t,64]"], {"q_num_heads": 4, "kv_num_heads": 8},
     "K hidden size 60 does not split into 8 heads"),
    (["f32[b,6,s,16]", "f32[b,4,t,16]", "f32[b,4,t,16]"], {}, "multiple of the 4 key/value"),
    (["f32[b,4,s,16]", "f32[b,4,t,8]", "f32[b,4,t,16]"], {}, "same head size, got 16 and 8"),
    (["f32[b,4,s,16]", "f32[b,4,t,16]", "f32[b,4,s,t,16]"], {}, "all 4-D"),
    (["f32[b,4,s,16]", "f32[b,4,t,16]", "f32[b,4,t,16]", None, "f32[b,4,p,16]"], {},
     "past_key and past_value must be given together"),
    (["f32[b,4,s,16]", "f32[b,4,t,16]", "f32[b,4,t,16]"], {"qk_matmul_output_mode": 4},
     "qk_matmul_output_mode=4"),
])
def test_attention_errors(types: list[str | None], attrs: dict[str, Any], match: str) -> None:
    with pytest.raises(ShapeError, match=match):
        infer_text("Attention", types, attrs)


def _attention_feeds(flat: bool, q_heads: int, kv_heads: int, *, mask: str | None = None,
                     past: int = 0, q_len: int = 5, kv_len: int = 7, v_size: int = 6,
                     dtype: Any = np.float32) -> dict[str, np.ndarray | None]:
    batch, size = 2, 8
    q = rand(batch, q_heads, q_len, size, dtype=dtype)
    k = rand(batch, kv_heads, kv_len, size, dtype=dtype)
    v = rand(batch, kv_heads, kv_len, v_size, dtype=dtype)
    if flat:
        q, k, v = (t.transpose(0, 2, 1, 3).reshape(batch, t.shape[2], -1) for t in (q, k, v))
    feeds: dict[str, np.ndarray | None] = {"q": q, "k": k, "v": v, "mask": None}
    total = past + kv_len
    if mask in ("float", "short"):  # a short mask is padded with "masked" (ORT refuses it)
        feeds["mask"] = rand(batch, 1, q_len, total - 2 * (mask == "short"), dtype=dtype)
    elif mask == "bool":
        feeds["mask"] = RNG.random((q_len, total)) < 0.7
    elif mask == "heads":
        feeds["mask"] = rand(q_heads, q_len, total, dtype=dtype)
    if past:
        feeds["past_key"] = rand(batch, kv_heads, past, size, dtype=dtype)
        feeds["past_value"] = rand(batch, kv_heads, past, v_size, dtype=dtype)
    return feeds


@pytest.mark.parametrize(("flat", "q_heads", "kv_heads", "mask", "past", "attrs"), [
    (False, 4, 4, None, 0, {}),
    (False, 6, 2, None, 0, {"scale": 0.3}),
    (False, 4, 2, "float", 0, {"is_causal": 1}),
    (False, 4, 4, "bool", 0, {}),
    (False, 4, 4, "heads", 3, {"is_causal": 1}),
    (False, 4, 1, None, 3, {"softcap": 1.5}),
    (True, 4, 2, None, 0, {"is_causal": 1}),
    (True, 6, 3, "float", 2, {"softcap": 4.0, "scale": 0.2}),
])
def test_attention_matches_onnxruntime(flat: bool, q_heads: int, kv_heads: int,
                                       mask: str | None, past: int, attrs: dict[str, Any]) -> None:
    feeds = _attention_feeds(flat, q_heads, kv_heads, mask=mask, past=past)
    if flat:
        attrs = {**attrs, "q_num_heads": q_heads, "kv_num_heads": kv_heads}
    if not past and feeds["mask"] is None:
        del feeds["mask"]
    m = model("Attention", feeds, 23, n_out=3 if past else 1, **attrs)
    check_model(m, given(feeds), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_attention_qk_matmul_output_modes(mode: int) -> None:
    feeds = _attention_feeds(False, 4, 2, mask="short", past=2)
    m = model("Attention", feeds, 23, n_out=4, qk_matmul_output_mode=mode, softcap=3.0)
    check_reference(m, given(feeds), rtol=1e-5, atol=1e-6)


def test_attention_float16_matches_onnxruntime() -> None:
    feeds = _attention_feeds(False, 4, 2, mask="bool", dtype=np.float16)
    m = model("Attention", feeds, 23, is_causal=1)
    check_model(m, given(feeds), rtol=2e-3, atol=2e-3)


def test_attention_fully_masked_rows_give_zeros() -> None:
    feeds = _attention_feeds(False, 2, 2, q_len=3, kv_len=4)
    feeds["mask"] = np.array([[True] * 4, [False] * 4, [True, False, True, False]])
    y, = run_metadef(model("Attention", feeds, 23), given(feeds))
    assert not np.isnan(y).any() and (y[:, :, 1] == 0).all() and (y[:, :, 0] != 0).all()


@pytest.mark.parametrize(("opset", "attrs"), [
    (24, {"is_causal": 1}),
    (24, {}),
    (25, {"is_causal": 1, "left_window_size": 2}),
    (25, {"left_window_size": 1, "right_window_size": 2}),
])
def test_attention_nonpad_lengths_and_windows(opset: int, attrs: dict[str, Any]) -> None:
    feeds = _attention_feeds(False, 4, 2, mask="heads", q_len=2, kv_len=6)
    feeds.update(past_key=None, past_value=None, nonpad=np.array([4, 6], np.int64))
    check_reference(model("Attention", feeds, opset, **attrs), given(feeds))


# ---------------------------------------------------------------------- RMSNormalization


def test_rms_normalization_shapes_and_errors() -> None:
    assert infer_text("RMSNormalization", ["f16[b,s,768]", "f32[768]"]) == ["f32[b,s,768]"]
    with pytest.raises(ShapeError, match="axis 3 is out of range for rank 3"):
        infer_text("RMSNormalization", ["f32[b,s,8]", "f32[8]"], {"axis": 3})
    with pytest.raises(ShapeError, match="must broadcast against the normalized axes"):
        infer_text("RMSNormalization", ["f32[b,s,8]", "f32[6]"])
    with pytest.raises(ShapeError, match="stash_type=7"):
        infer_text("RMSNormalization", ["f32[b,s,8]", "f32[8]"], {"stash_type": 7})


@pytest.mark.parametrize(("shape", "axis", "scale_rank", "dtype"), [
    ((3, 5, 16), -1, 1, np.float32),
    ((2, 3, 4, 6), 1, 3, np.float32),
    ((2, 3, 4, 6), -2, 1, np.float32),
    ((4, 32), -1, 1, np.float16),
])
def test_rms_normalization_matches_onnxruntime(shape: tuple[int, ...], axis: int,
                                               scale_rank: int, dtype: Any) -> None:
    feeds = {"x": rand(*shape, dtype=dtype) * 3, "s": rand(*shape[len(shape) - scale_rank:], dtype=dtype)}
    tol = 2e-3 if dtype == np.float16 else 1e-5
    check_model(model("RMSNormalization", feeds, 23, axis=axis, epsilon=1e-3), feeds,
                rtol=tol, atol=tol)


# ----------------------------------------------------------------------- RotaryEmbedding


def test_rotary_embedding_shapes_and_errors() -> None:
    assert infer_text("RotaryEmbedding", ["f32[b,8,s,64]", "f32[512,32]", "f32[512,32]",
                                          "i64[b,s]"]) == ["f32[b,8,s,64]"]
    with pytest.raises(ShapeError, match="needs the num_heads attribute"):
        infer_text("RotaryEmbedding", ["f32[b,s,64]", "f32[b,s,32]", "f32[b,s,32]"])
    with pytest.raises(ShapeError, match="last dim 16 must be half the rotary dim 64"):
        infer_text("RotaryEmbedding", ["f32[b,8,s,64]", "f32[b,s,16]", "f32[b,s,16]"])
    with pytest.raises(ShapeError, match=r"\[max_position, dim/2\] with position_ids"):
        infer_text("RotaryEmbedding", ["f32[b,8,s,64]", "f32[b,s,32]", "f32[b,s,32]", "i64[b,s]"])


@pytest.mark.parametrize(("flat", "positions", "attrs"), [
    (False, True, {}),
    (False, False, {"interleaved": 1}),
    (False, True, {"rotary_embedding_dim": 6, "interleaved": 1}),
    (True, True, {"num_heads": 3}),
    (True, False, {"num_heads": 3, "rotary_embedding_dim": 4}),
])
def test_rotary_embedding_matches_onnxruntime(flat: bool, positions: bool,
                                              attrs: dict[str, Any]) -> None:
    batch, heads, seq, size = 2, 3, 5, 10
    half = attrs.get("rotary_embedding_dim", size) // 2
    x = rand(batch, heads, seq, size)
    if flat:
        x = x.transpose(0, 2, 1, 3).reshape(batch, seq, heads * size)
    angles = RNG.uniform(0, 6, (20, half) if positions else (batch, seq, half))
    feeds = {"x": x, "cos": np.cos(angles).astype(np.float32), "sin": np.sin(angles).astype(np.float32)}
    if positions:
        feeds["pos"] = RNG.integers(0, 20, (batch, seq)).astype(np.int64)
    check_model(model("RotaryEmbedding", feeds, 23, **attrs), feeds, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------- Swish and SwiGLU


@pytest.mark.parametrize("alpha", [1.0, 0.4])
def test_swish_matches_onnxruntime(alpha: float) -> None:
    feeds = {"x": rand(3, 17) * 4}
    check_model(model("Swish", feeds, 24, alpha=alpha), feeds, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("dtype", "alpha"), [(np.float32, 1.0), (np.float64, 1.7), (np.float16, 0.5)])
def test_swiglu_matches_the_reference(dtype: Any, alpha: float) -> None:
    feeds = {"a": rand(4, 3, 9, dtype=dtype) * 3, "b": rand(4, 3, 9, dtype=dtype)}
    tol = 2e-3 if dtype == np.float16 else 1e-6
    check_reference(model("SwiGLU", feeds, 28, alpha=alpha), feeds, rtol=tol, atol=tol)


def test_swiglu_refuses_broadcasting() -> None:
    assert infer_text("SwiGLU", ["f16[b,64]", "f16[b,64]"]) == ["f16[b,64]"]
    with pytest.raises(ShapeError, match="same shape"):
        infer_text("SwiGLU", ["f32[4,64]", "f32[1,64]"])


# ------------------------------------------------------------------------- TensorScatter


def test_tensor_scatter_shapes_and_errors() -> None:
    assert infer_text("TensorScatter", ["f16[b,8,max,64]", "f16[b,8,s,64]", "i64[b]"]) == \
        ["f16[b,8,max,64]"]
    with pytest.raises(ShapeError, match="must match past_cache"):
        infer_text("TensorScatter", ["f32[b,8,16,64]", "f32[b,4,2,64]"])
    with pytest.raises(ShapeError, match="after the batch axis"):
        infer_text("TensorScatter", ["f32[b,16,64]", "f32[b,2,64]"], {"axis": 0})
    with pytest.raises(ShapeError, match="mode='ring'"):
        infer_text("TensorScatter", ["f32[b,16,64]", "f32[b,2,64]"], {"mode": "ring"})


@pytest.mark.parametrize(("shape", "update", "axis", "mode", "starts"), [
    ((3, 2, 6, 4), 2, -2, "linear", [0, 4, 1]),
    ((3, 2, 6, 4), 3, -2, "circular", [5, 4, 0]),
    ((2, 7, 3), 4, 1, "linear", [3, 0]),
    ((2, 5, 3, 2), 2, 1, "circular", [4, 2]),
])
def test_tensor_scatter_matches_onnxruntime(shape: tuple[int, ...], update: int, axis: int,
                                            mode: str, starts: list[int]) -> None:
    upd = list(shape)
    upd[axis] = update
    feeds = {"cache": rand(*shape), "update": rand(*upd), "idx": np.array(starts, np.int64)}
    check_model(model("TensorScatter", feeds, 24, axis=axis, mode=mode), feeds)


# ------------------------------------------------------------------------------- BitCast


@pytest.mark.parametrize(("source", "to"), [
    (np.float32, TensorProto.UINT32), (np.int64, TensorProto.DOUBLE),
    (np.float16, TensorProto.INT16), (np.uint8, TensorProto.INT8), (np.int32, TensorProto.FLOAT),
])
def test_bitcast_matches_onnxruntime(source: Any, to: int) -> None:
    x = RNG.integers(0, 120, (3, 5)).astype(source)
    feeds = {"x": x}
    check_model(model("BitCast", feeds, 26, to=to), feeds)


def test_bitcast_needs_equal_widths() -> None:
    assert infer_text("BitCast", ["f32[n,4]"], {"to": TensorProto.INT32}) == ["i32[n,4]"]
    with pytest.raises(ShapeError, match="same width, got float32 \\(32 bits\\) to int64"):
        infer_text("BitCast", ["f32[n]"], {"to": TensorProto.INT64})
    with pytest.raises(DTypeError):
        infer_text("BitCast", ["f32[n]"], {"to": TensorProto.STRING})


# ------------------------------------------------------------------------------- CumProd


@pytest.mark.parametrize(("dtype", "axis", "exclusive", "reverse"), [
    (np.float32, 0, 0, 0), (np.float32, 1, 1, 0), (np.float64, -1, 0, 1),
    (np.int64, 1, 1, 1), (np.int32, 0, 1, 0),
])
def test_cumprod_matches_onnxruntime(dtype: Any, axis: int, exclusive: int, reverse: int) -> None:
    x = RNG.uniform(0.5, 1.5, (4, 6)).astype(dtype) if dtype in (np.float32, np.float64) \
        else RNG.integers(-3, 4, (4, 6)).astype(dtype)
    m = model("CumProd", {"x": x}, 26, consts={"axis": np.array(axis, np.int64)},
              exclusive=exclusive, reverse=reverse)
    check_model(m, {"x": x})


def test_cumprod_shapes() -> None:
    assert infer_text("CumProd", ["f32[b,s]", "i64[]"], {}, [None, 1]) == ["f32[b,s]"]
    with pytest.raises(ShapeError, match="axis 2 is out of range for rank 2"):
        infer_text("CumProd", ["f32[b,s]", "i64[]"], {}, [None, 2])


@pytest.mark.slow
def test_conformance() -> None:
    from metadef.testing.conformance import format_report, run_cases

    report = run_cases(op=OPS, pattern=r"^(?!.*_expanded)")  # function bodies: other ops' tests
    assert not report.failures() and report.totals()["unsupported"] == 0, format_report(report)

