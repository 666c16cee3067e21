"""Concat and Split inside the native program (``metadef.backends.x86.movement``), against ONNX
Runtime: every axis, several dtypes, new batch sizes without compiling, empty parts."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import metadef as md
from metadef.codegen.jit import compile_count

pytestmark = pytest.mark.jit

RNG = np.random.default_rng(7)
ONNX_TYPES = {np.float32: TensorProto.FLOAT, np.int64: TensorProto.INT64, np.bool_: TensorProto.BOOL,
              np.float16: TensorProto.FLOAT16, np.uint8: TensorProto.UINT8}


def _values(shape: tuple[int, ...], dtype: type) -> np.ndarray:
    if dtype is np.bool_:
        return RNG.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        return RNG.integers(0, 200, shape).astype(dtype)
    return RNG.standard_normal(shape).astype(dtype)


def _model(node: onnx.NodeProto, inputs: list[tuple[str, list]], outputs: list[str], dtype: type,
           ) -> onnx.ModelProto:
    t = ONNX_TYPES[dtype]
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, t, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, t, None) for n in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _check(model: onnx.ModelProto, feed_sets: list[dict[str, np.ndarray]]) -> md.Session:
    sess = md.compile(md.import_onnx(model), target="x86")
    oracle = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in model.graph.output]
    sess.run(feed_sets[0])
    compiled = compile_count()
    for feeds in feed_sets:
        got = sess.run(feeds)
        for name, want in zip(names, oracle.run(None, feeds)):
            assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
            np.testing.assert_array_equal(got[name], want, err_msg=name)
    assert compile_count() == compiled  # new shapes compile nothing
    return sess


def _native(sess: md.Session, symbols: dict[str, int], kind: str) -> int:
    program = sess.executable.programs.bound(symbols)
    try:
        assert program.python_steps == 0, program.python_reasons
        return program.call_kinds[kind]
    finally:
        sess.executable.programs.give_back(program)


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, np.float16, np.uint8])
@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_concat_matches_onnxruntime_on_every_axis(dtype: type, axis: int) -> None:
    shapes = [["n", 3, 4], ["n", 3, 4], ["n", 3, 4]]
    sizes = [2, 1, 3]
    for s, k in zip(shapes, sizes):
        s[axis] = k if axis != 0 else "n"
    node = helper.make_node("Concat", ["a", "b", "c"], ["y"], axis=axis)
    model = _model(node, list(zip("abc", shapes)), ["y"], dtype)
    feed_sets = []
    for n in (1, 5, 2):
        feed_sets.append({name: _values(tuple(n if d == "n" else d for d in s), dtype)
                          for name, s in zip("abc", shapes)})
    sess = _check(model, feed_sets)
    assert _native(sess, {"n": 4}, "concat") == 3


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_split_matches_onnxruntime_on_every_axis(axis: int) -> None:
    shape: list = ["n", 6, 12]
    shape[axis] = 12 if axis == 0 else shape[axis]
    parts = np.array([1, 2, 3]) * (shape[axis] // 6)
    node = helper.make_node("Split", ["x", "s"], ["y0", "y1", "y2"], axis=axis)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(f"y{k}", TensorProto.FLOAT, None) for k in range(3)],
                              [onnx.numpy_helper.from_array(parts.astype(np.int64), "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    feed_sets = [{"x": _values(tuple(n if d == "n" else d for d in shape), np.float32)} for n in (1, 3)]
    sess = _check(model, feed_sets)
    assert _native(sess, {"n": 2}, "split") == 3


def test_empty_parts_copy_nothing_and_the_rest_is_right() -> None:
    node = helper.make_node("Concat", ["a", "b"], ["y"], axis=1)
    model = _model(node, [("a", ["n", 0]), ("b", ["n", 3])], ["y"], np.float32)
    sess = _check(model, [{"a": np.zeros((k, 0), np.float32), "b": _values((k, 3), np.float32)} for k in (2, 0)])
    assert _native(sess, {"n": 2}, "concat") == 1


def test_a_concat_inside_a_model_keeps_the_program_native() -> None:
    """Two branches of a conv net joined by Concat then Split again (as SqueezeNet's fire
    modules and channel shuffles do): one native program, outputs as ONNX Runtime's."""
    w1, w2 = _values((4, 3, 1, 1), np.float32), _values((5, 3, 3, 3), np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"]),
             helper.make_node("Conv", ["x", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["c1", "c2"], ["cat"], axis=1),
             helper.make_node("Relu", ["cat"], ["r"]),
             helper.make_node("Split", ["r"], ["s0", "s1"], axis=1, num_outputs=2)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 8, 8])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("s0", "s1")],
                              [onnx.numpy_helper.from_array(w1, "w1"), onnx.numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    sess = md.compile(md.import_onnx(model), target="x86")
    oracle = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for n in (1, 3):
        feeds = {"x": _values((n, 3, 8, 8), np.float32)}
        got = sess.run(feeds)
        for name, want in zip(("s0", "s1"), oracle.run(None, feeds)):
            np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5)
    assert _native(sess, {"n": 2}, "concat") == 2 and _native(sess, {"n": 2}, "split") == 2
