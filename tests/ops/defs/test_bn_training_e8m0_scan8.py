"""Three forms metadef used to refuse, against ONNX Runtime on inputs the node tests do not use:
BatchNormalization with ``training_mode=1`` (batch statistics, running statistics updated with
``momentum``), Cast to float8e8m0 with ``round_mode`` and ``saturate`` (compared through a cast
back to float32, as ONNX Runtime hands out no float8e8m0 arrays), and the batched Scan of
opset 8 with ``sequence_lens`` and ``directions``; each also compiles for x86."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import metadef as md
from metadef.core.errors import ShapeError, UnsupportedOpError
from metadef.ops.defs.cast_e8m0 import to_float8e8m0
from metadef.testing.onnx_cases import assert_same, infer_text, one_node_model, run_both
from metadef.testing.oracle import run_onnxruntime

vi = helper.make_tensor_value_info

# ------------------------------------------------------------------ BatchNormalization


@pytest.mark.parametrize("dtype,shape,momentum,epsilon", [(np.float32, (4, 3, 5, 2), 0.8, 1e-3),
                                                          (np.float32, (7, 5), 0.99, 1e-5),
                                                          (np.float64, (2, 4, 3, 3, 2), 0.5, 0.1)])
def test_batchnorm_training_matches_onnxruntime(dtype, shape, momentum, epsilon) -> None:
    rng = np.random.default_rng(3)
    c = shape[1]
    feeds = {"x": (rng.standard_normal(shape) * 3 + 1).astype(dtype)}
    consts = {"s": rng.random(c).astype(dtype) + 0.5, "b": rng.standard_normal(c).astype(dtype),
              "m": rng.standard_normal(c).astype(dtype), "v": rng.random(c).astype(dtype) + 0.1}
    model = one_node_model("BatchNormalization", feeds, consts, n_out=3, opset=15, training_mode=1,
                           momentum=momentum, epsilon=epsilon)
    got, want = run_both(model, feeds)
    assert_same(got, want, rtol=1e-5, atol=1e-5)
    sess = md.compile(md.import_onnx(model), target="x86")
    assert_same([sess.run(feeds)[f"out{i}"] for i in range(3)], want, rtol=1e-5, atol=1e-5)


def test_batchnorm_training_is_not_folded_into_the_conv_before_it() -> None:
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 5, 5)).astype(np.float32)
    weights = {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "s": np.ones(4, np.float32),
               "b": np.zeros(4, np.float32), "m": np.zeros(4, np.float32), "v": np.ones(4, np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["h"]),
             helper.make_node("BatchNormalization", ["h", "s", "b", "m", "v"], ["y", "rm", "rv"], training_mode=1)]
    inits = [helper.make_tensor(n, TensorProto.FLOAT, a.shape, a.ravel()) for n, a in weights.items()]
    graph = helper.make_graph(nodes, "g", [vi("x", TensorProto.FLOAT, [2, 3, 5, 5])],
                              [vi("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)], ir_version=8)
    assert "BatchNormalization" in [n.op for n in md.optimize(md.import_onnx(model), level="moderate").nodes]
    # ONNX Runtime's own optimizer folds this BatchNormalization into the Conv as if it were in
    # inference mode (ORT 1.32): its unoptimized run is the reference
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    (want,) = session.run(["y"], {"x": x})
    for level in ("moderate", "aggressive"):
        optimized = md.optimize(md.import_onnx(model), level=level)
        for target in ("reference", "x86"):
            got = md.compile(optimized, target=target).run({"x": x})["y"]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"{level} on {target}")


def test_batchnorm_training_before_opset_14_is_refused_clearly() -> None:
    x = np.ones((2, 3), np.float32)
    stats = {k: np.ones(3, np.float32) for k in "sbmv"}
    with pytest.raises(UnsupportedOpError, match=r"training mode at opset 9.*re-export the model with opset 14"):
        md.import_onnx(one_node_model("BatchNormalization", {"x": x}, stats, n_out=5, opset=9))
    with pytest.raises(UnsupportedOpError, match="training mode at opset 6"):
        md.import_onnx(one_node_model("BatchNormalization", {"x": x}, stats, opset=6, is_test=0))
    with pytest.raises(ShapeError, match="training_mode=1 takes per-channel statistics"):
        infer_text("BatchNormalization", ["f32[2,3,4]", "f32[3,4]", "f32[3,4]", "f32[3,4]", "f32[3,4]"],
                   {"training_mode": 1}, n_outputs=3)


# ---------------------------------------------------------------------- Cast to e8m0


def _cast_and_back(source: np.ndarray, round_mode: str, saturate: int):
    node = helper.make_node("Cast", ["x"], ["e"], to=TensorProto.FLOAT8E8M0, round_mode=round_mode, saturate=saturate)
    back = helper.make_node("Cast", ["e"], ["y"], to=TensorProto.FLOAT)
    code = helper.np_dtype_to_tensor_dtype(source.dtype)
    graph = helper.make_graph([node, back], "g", [vi("x", code, list(source.shape))],
                              [vi("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)], ir_version=11)


def _e8m0_inputs() -> np.ndarray:
    rng = np.random.default_rng(5)
    special = [0.0, -0.0, 1.5, 1.4999, 3.0, 0.75, -3.0, np.inf, -np.inf, np.nan, 2.0 ** 127, 3e38, 2.0 ** -127,
               1e-40, 3 * 2.0 ** -128, 1.75 * 2.0 ** -127, 2.0 ** -126]
    spread = rng.standard_normal(500) * np.exp(rng.uniform(-85, 85, 500))
    return np.concatenate([special, spread])


@pytest.mark.parametrize("round_mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_cast_to_e8m0_matches_onnxruntime(round_mode: str, saturate: int, dtype) -> None:
    with np.errstate(over="ignore"):
        x = _e8m0_inputs().astype(dtype)
    model = _cast_and_back(x, round_mode, saturate)
    want = run_onnxruntime(model, {"x": x})["y"]
    for target in ("reference", "x86"):
        got = md.compile(md.import_onnx(model), target=target).run({"x": x})["y"]
        np.testing.assert_array_equal(got, want)


def test_cast_to_e8m0_of_integers_is_exact() -> None:
    # ONNX Runtime rounds an integer to float32 first (2**31 - 1 becomes 2**31); metadef reads it exactly
    x = np.array([1, 3, 6, 7, 2 ** 31 - 1, 3 * 2 ** 40, 2 ** 62 + 1, 0, -5], np.int64)
    bits = to_float8e8m0(x, "down", saturate=True).view(np.uint8).astype(int) - 127
    assert bits.tolist() == [0, 1, 2, 2, 30, 41, 62, -127, -127]
    up = to_float8e8m0(x, "up", saturate=False).view(np.uint8).astype(int) - 127
    assert up.tolist() == [0, 2, 3, 3, 31, 42, 63, 128, 128]  # 255 - 127: NaN for 0 and -5
    nearest = to_float8e8m0(x, "nearest").view(np.uint8).astype(int) - 127
    assert nearest.tolist() == [0, 2, 3, 3, 31, 42, 62, -127, -127]


def test_cast_like_to_e8m0_and_a_bad_round_mode() -> None:
    x = np.array([0.3, 5.0, 1e30], np.float32)
    like = to_float8e8m0(np.ones(1, np.float32))
    (got,) = md.compile(md.import_onnx(one_node_model("CastLike", {"x": x}, {"t": like}, opset=25,
                                                      round_mode="nearest"))).run({"x": x}).values()
    np.testing.assert_array_equal(got.astype(np.float32), np.array([0.25, 4.0, 2.0 ** 100], np.float32))
    with pytest.raises(ShapeError, match="round_mode='even' must be one of up, down, nearest"):
        infer_text("Cast", ["f32[3]"], {"to": TensorProto.FLOAT8E8M0, "round_mode": "even"})


# ----------------------------------------------------------------------------- Scan 8


def _scan8_model(directions: list[int], with_lens: bool):
    """Opset-8 Scan: state s (2 floats per batch element), two scan inputs; s += x, y = s * x2."""
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x"], ["s_out"]), helper.make_node("Mul", ["s_out", "x2"], ["y"])], "body",
        [vi("s_in", TensorProto.FLOAT, [2]), vi("x", TensorProto.FLOAT, [2]), vi("x2", TensorProto.FLOAT, [2])],
        [vi("s_out", TensorProto.FLOAT, [2]), vi("y", TensorProto.FLOAT, [2])])
    node = helper.make_node("Scan", ["lens" if with_lens else "", "init", "xs", "xs2"], ["final", "ys"], body=body,
                            num_scan_inputs=2, directions=directions)
    inputs = [vi("init", TensorProto.FLOAT, ["b", 2]), vi("xs", TensorProto.FLOAT, ["b", "t", 2]),
              vi("xs2", TensorProto.FLOAT, ["b", "t", 2])]
    graph = helper.make_graph([node], "g", [vi("lens", TensorProto.INT64, ["b"])] * with_lens + inputs,
                              [vi("final", TensorProto.FLOAT, None), vi("ys", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 8)], ir_version=8)


@pytest.mark.parametrize("directions", [[0, 0], [0, 1], [1, 1]])
@pytest.mark.parametrize("lens", [None, [5, 2, 1]])
def test_scan8_matches_onnxruntime(directions: list[int], lens: list[int] | None) -> None:
    rng = np.random.default_rng(6)
    feeds = {"init": rng.standard_normal((3, 2)).astype(np.float32),
             "xs": rng.standard_normal((3, 5, 2)).astype(np.float32),
             "xs2": rng.standard_normal((3, 5, 2)).astype(np.float32)}
    if lens is not None:
        feeds = {"lens": np.array(lens, np.int64), **feeds}
    model = _scan8_model(directions, lens is not None)
    graph = md.import_onnx(model)
    assert [str(v.type) for v in graph.outputs] == ["f32[b,2]", "f32[b,t,2]"]
    want = run_onnxruntime(model, feeds)
    for target in ("reference", "x86"):
        got = md.compile(graph, target=target).run(feeds)
        for name in ("final", "ys"):
            np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-6)


def test_scan8_is_not_exported_in_a_form_later_opsets_lack(tmp_path) -> None:
    with pytest.raises(UnsupportedOpError, match="batched form of opsets below 9"):
        md.export_onnx(md.import_onnx(_scan8_model([0, 0], False)), tmp_path / "scan8.onnx")
    assert not list(tmp_path.iterdir())


def test_scan8_checks_sequence_lens() -> None:
    feeds = {"lens": np.array([2, 9], np.int64), "init": np.zeros((2, 2), np.float32),
             "xs": np.zeros((2, 3, 2), np.float32), "xs2": np.zeros((2, 3, 2), np.float32)}
    sess = md.compile(md.import_onnx(_scan8_model([0, 0], True)))
    with pytest.raises(md.MetadefError, match=r"sequence_lens \[2, 9\] must give, for each of the 2 batch"):
        sess.run(feeds)
