"""Data movement inside the native program (``metadef.backends.x86.movement``) against ONNX
Runtime: Concat and Split on every axis and several dtypes, constant Slices (hypothesis),
Gather with its index checks, Shape and Size; new batch sizes compile nothing."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import metadef as md
from metadef.codegen.jit import compile_count
from metadef.core.errors import InputError

pytestmark = pytest.mark.jit

RNG = np.random.default_rng(7)
ONNX_TYPES = {np.float32: TensorProto.FLOAT, np.int64: TensorProto.INT64, np.bool_: TensorProto.BOOL,
              np.float16: TensorProto.FLOAT16, np.uint8: TensorProto.UINT8, np.int32: TensorProto.INT32}


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


# ------------------------------------------------------------------ Slice, Gather, Shape, Size

def _slice_model(shape: list, starts: list[int], ends: list[int], axes: list[int], steps: list[int]
                 ) -> onnx.ModelProto:
    consts = [onnx.numpy_helper.from_array(np.array(v, np.int64), name)
              for name, v in (("starts", starts), ("ends", ends), ("axes", axes), ("steps", steps))]
    node = helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@st.composite
def _slices(draw: st.DrawFn) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    rank = draw(st.integers(1, 4))
    shape: list = [draw(st.integers(1, 6)) for _ in range(rank)]
    # a batch dim (symbolic, never sliced: inference assumes a bound lies inside a symbolic dim)
    batch = rank > 1 and draw(st.booleans())
    first = int(batch)
    axes = draw(st.lists(st.integers(first, rank - 1), min_size=1, max_size=rank - first, unique=True))
    axes = [a - rank if draw(st.booleans()) else a for a in axes]
    if batch:
        shape[0] = "n"
    bound = st.integers(-8, 8) | st.sampled_from([2**62, -(2**62)])
    starts = [draw(bound) for _ in axes]
    ends = [draw(bound) for _ in axes]
    steps = [draw(st.sampled_from([1, 1, 2, 3, -1, -2])) for _ in axes]
    return shape, starts, ends, axes, steps


@settings(max_examples=60, deadline=None)
@given(_slices())
def test_a_constant_slice_matches_onnxruntime(case: tuple) -> None:
    shape, starts, ends, axes, steps = case
    model = _slice_model(shape, starts, ends, axes, steps)
    sess = md.compile(md.import_onnx(model), target="x86")
    oracle = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for n in (1, 3):
        x = _values(tuple(n if d == "n" else d for d in shape), np.float32)
        np.testing.assert_array_equal(sess.run({"x": x})["y"], oracle.run(None, {"x": x})[0])


def test_slices_that_are_row_copies_run_natively() -> None:
    # BERT's position ids (a prefix of a constant row), the CLS token, a channel window of an image
    for shape, starts, ends, axes, steps in (([1, 512], [0], [7], [1], [1]), (["n", 9, 4], [0], [1], [1], [1]),
                                             (["n", 8, 5, 5], [2, 1], [6, -1], [1, 2], [1, 1]),
                                             (["n", 8, 5, 5], [-1], [-9], [1], [-2])):
        sess = md.compile(md.import_onnx(_slice_model(shape, starts, ends, axes, steps)), target="x86")
        assert _native(sess, {"n": 3}, "slice") >= 1


def test_a_step_on_the_last_axis_runs_from_its_reference_and_says_why() -> None:
    sess = md.compile(md.import_onnx(_slice_model(["n", 6], [0], [6], [1], [2])), target="x86")
    program = sess.executable.programs.bound({"n": 2})
    try:
        assert program.python_steps == 1 and "element gather" in program.python_reasons[0][1]
    finally:
        sess.executable.programs.give_back(program)
    x = _values((2, 6), np.float32)
    np.testing.assert_array_equal(sess.run({"x": x})["y"], x[:, ::2])


@pytest.mark.parametrize("index_dtype", [np.int64, np.int32])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_matches_onnxruntime(axis: int, index_dtype: type) -> None:
    data = _values((7, 5, 3), np.float32)
    node = helper.make_node("Gather", ["data", "i"], ["y"], axis=axis)
    index_type = TensorProto.INT64 if index_dtype is np.int64 else TensorProto.INT32
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("i", index_type, ["a", 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [onnx.numpy_helper.from_array(data, "data")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    rows = data.shape[axis]
    feed_sets = [{"i": RNG.integers(-rows, rows, (a, 2)).astype(index_dtype)} for a in (1, 4, 0)]
    sess = _check(model, feed_sets)
    assert _native(sess, {"a": 3}, "gather") == 1


def test_an_index_out_of_range_raises_naming_the_node_and_the_range() -> None:
    node = helper.make_node("Gather", ["table", "i"], ["y"], name="lookup")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("i", TensorProto.INT64, ["a"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [onnx.numpy_helper.from_array(_values((4, 2), np.float32), "table")])
    sess = md.compile(md.import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])),
                      target="x86")
    for bad in (4, -5, 2**40):
        with pytest.raises(InputError, match=rf"Gather lookup: index {bad} is out of range .* -4 to 3"):
            sess.run({"i": np.array([1, bad, 0], np.int64)})
    np.testing.assert_array_equal(sess.run({"i": np.array([-1], np.int64)})["y"].shape, (1, 2))  # usable again


def test_shape_and_size_follow_the_binding() -> None:
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Shape", ["x"], ["t"], start=-2, end=10),
             helper.make_node("Size", ["x"], ["z"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, "m"])],
                              [helper.make_tensor_value_info(v, TensorProto.INT64, None) for v in "stz"])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    sess = _check(model, [{"x": _values((n, 3, m), np.float32)} for n, m in ((1, 2), (4, 7), (0, 3))])
    assert _native(sess, {"n": 2, "m": 5}, "shape") == 2 and _native(sess, {"n": 2, "m": 5}, "size") == 1


@pytest.mark.parametrize("training", [None, False])
def test_dropout_at_inference_is_a_view_of_its_input(training: bool | None) -> None:
    inputs = ["x", "ratio", "training"] if training is not None else ["x"]
    nodes = [helper.make_node("Dropout", inputs, ["d"]), helper.make_node("Relu", ["d"], ["y"])]
    consts = [onnx.numpy_helper.from_array(np.array(0.3, np.float32), "ratio"),
              onnx.numpy_helper.from_array(np.array(training), "training")] if training is not None else []
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    sess = _check(model, [{"x": _values((n, 4), np.float32)} for n in (1, 3)])
    assert [p.kind for p in sess.executable.plan] == ["view", "generated"]
    program = sess.executable.programs.bound({"n": 2})
    try:
        assert program.views == 1 and program.python_steps == 0
    finally:
        sess.executable.programs.give_back(program)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_dropout_with_its_mask_copies_and_fills_true_natively(dtype: type) -> None:
    nodes = [helper.make_node("Dropout", ["x"], ["d", "mask"]), helper.make_node("Relu", ["d"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", ONNX_TYPES[dtype], ["n", 5])],
                              [helper.make_tensor_value_info("y", ONNX_TYPES[dtype], None),
                               helper.make_tensor_value_info("mask", TensorProto.BOOL, None),
                               helper.make_tensor_value_info("d", ONNX_TYPES[dtype], None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    sess = _check(model, [{"x": _values((n, 5), dtype)} for n in (1, 3, 0)])
    assert [p.kind for p in sess.executable.plan] == ["native", "generated"]
    assert _native(sess, {"n": 2}, "dropout mask") == 1


def _pad_model(shape: list, pads: list[int], axes: list[int] | None, value: float | None, dtype: type = np.float32,
               mode: str = "constant") -> onnx.ModelProto:
    t = ONNX_TYPES[dtype]
    inputs = ["x", "pads", "value" if value is not None else "", *(["axes"] if axes is not None else [])]
    consts = [onnx.numpy_helper.from_array(np.array(pads, np.int64), "pads")]
    consts += [onnx.numpy_helper.from_array(np.array(a, np.int64), "axes") for a in [axes] if a is not None]
    graph_inputs = [helper.make_tensor_value_info("x", t, shape)]
    if value is not None:
        graph_inputs.append(helper.make_tensor_value_info("value", t, []))
    graph = helper.make_graph([helper.make_node("Pad", inputs, ["y"], mode=mode)], "g", graph_inputs,
                              [helper.make_tensor_value_info("y", t, None)], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8])
@pytest.mark.parametrize(("shape", "pads", "axes"), [
    (["n", 3, 5, 5], [0, 0, 1, 1, 0, 0, 1, 1], None),          # a conv's padding, as tf2onnx writes it
    (["n", 3, 5, 5], [0, 2, 0, 1, 0, 0, 3, 2], None),          # channels and width, unequal
    (["n", 4], [2, 3], [1]),                                   # the last axis only, through axes
    (["n", 2, 3], [0, 0, 0, 0, 0, 0], None),                   # nothing to pad: one copy
])
def test_a_constant_pad_matches_onnxruntime(shape: list, pads: list[int], axes: list[int] | None,
                                           dtype: type) -> None:
    for value in (None, 7):
        model = _pad_model(shape, pads, axes, value, dtype)
        feed_sets = [{"x": _values(tuple(n if d == "n" else d for d in shape), dtype),
                      **({"value": np.array(value, dtype)} if value is not None else {})} for n in (1, 3)]
        sess = _check(model, feed_sets)
        assert _native(sess, {"n": 2}, "pad") >= 1


@pytest.mark.parametrize("mode", ["reflect", "edge", "wrap"])
@pytest.mark.parametrize(("shape", "pads", "axes"), [
    (["n", 3, 9, 7], [0, 0, 2, 1, 0, 0, 1, 3], None),          # a style-transfer net's reflect padding
    (["n", 5], [0, 2, 0, 1], None),                            # rank 2: the "plane" is the whole tensor
    (["n", 3, 6], [1, 2], [2]),                                # the last axis only, through axes
])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_reflect_edge_and_wrap_pads_are_pixel_maps(mode: str, shape: list, pads: list[int], axes: list[int] | None,
                                                   dtype: type) -> None:
    model = _pad_model(shape, pads, axes, None, dtype, mode)
    feed_sets = [{"x": _values(tuple(n if d == "n" else d for d in shape), dtype)} for n in (1, 3)]
    sess = _check(model, feed_sets)
    assert _native(sess, {"n": 2}, f"pad {mode}") == 1


def test_other_pads_run_from_their_reference_and_say_why() -> None:
    leading = _pad_model(["n", 4, 3], [1, 0, 0, 0, 0, 0], None, None, mode="reflect")
    sess = _check(leading, [{"x": _values((2, 4, 3), np.float32)}])
    assert "it pads more than the last two axes" in sess.executable.plan[0].reason
    wide = _pad_model(["n", 4], [0, 1, 0, 2], None, None, np.int64, mode="edge")
    sess = _check(wide, [{"x": _values((2, 4), np.int64)}])
    assert "mode 'edge' of 8-byte elements" in sess.executable.plan[0].reason
    crop = _pad_model(["n", 4], [0, -1, 0, 1], None, None)
    sess = _check(crop, [{"x": _values((2, 4), np.float32)}])
    assert "negative" in sess.executable.plan[0].reason


@pytest.mark.parametrize(("source", "target"), [(np.float32, np.float16), (np.float32, np.int64),
                                                (np.int64, np.float32), (np.uint8, np.bool_)])
def test_castlike_runs_as_the_generated_cast_it_is(source: type, target: type) -> None:
    node = helper.make_node("CastLike", ["x", "like"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", ONNX_TYPES[source], ["n", 3])],
                              [helper.make_tensor_value_info("y", ONNX_TYPES[target], None)],
                              [onnx.numpy_helper.from_array(np.zeros(1, target), "like")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    values = [_values((n, 3), source) * (100 if source is np.float32 else 1) for n in (1, 4)]
    sess = _check(model, [{"x": v.astype(source)} for v in values])
    assert sess.executable.plan[0].kind == "generated"
    program = sess.executable.programs.bound({"n": 2})
    try:
        assert program.python_steps == 0
    finally:
        sess.executable.programs.give_back(program)


def _resize_model(shape: list, scales: list[float] | None, sizes: list[int] | None, dtype: type = np.float32,
                  **attrs: Any) -> onnx.ModelProto:
    consts = [onnx.numpy_helper.from_array(np.array(scales, np.float32), "scales")] if scales else []
    consts += [onnx.numpy_helper.from_array(np.array(sizes, np.int64), "sizes")] if sizes else []
    node = helper.make_node("Resize", ["x", "", "scales" if scales else "", *(["sizes"] if sizes else [])], ["y"],
                            mode="nearest", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", ONNX_TYPES[dtype], shape)],
                              [helper.make_tensor_value_info("y", ONNX_TYPES[dtype], None)], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


@pytest.mark.parametrize(("ctm", "rounding"), [("asymmetric", "floor"), ("half_pixel", "round_prefer_floor"),
                                               ("align_corners", "round_prefer_ceil"), ("pytorch_half_pixel", "ceil")])
@pytest.mark.parametrize(("scales", "sizes"), [([1, 1, 2, 2], None), ([1, 1, 0.5, 1.5], None),
                                               (None, [2, 3, 7, 5])])
def test_a_nearest_resize_with_constant_parameters_runs_natively(ctm: str, rounding: str, scales: list | None,
                                                                 sizes: list | None) -> None:
    batch: Any = 2 if sizes else "n"
    model = _resize_model([batch, 3, 6, 4], scales, sizes, coordinate_transformation_mode=ctm, nearest_mode=rounding)
    sess = _check(model, [{"x": _values((2, 3, 6, 4), np.float32)}, *([{"x": _values((5, 3, 6, 4), np.float32)}]
                                                                      if not sizes else [])])
    assert sess.executable.plan[0].kind == "native"
    assert _native(sess, {"n": 2} if not sizes else {}, "resize nearest") == 1


def test_yolo_style_upsampling_of_int32_and_the_old_upsample() -> None:
    sess = _check(_resize_model(["n", 8, 5, 5], [1, 1, 2, 2], None, np.int32), [{"x": _values((3, 8, 5, 5), np.int32)}])
    assert _native(sess, {"n": 3}, "resize nearest") == 1
    node = helper.make_node("Upsample", ["x", "scales"], ["y"], mode="nearest")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2, 3, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [onnx.numpy_helper.from_array(np.array([1, 1, 3, 2], np.float32), "scales")])
    upsample = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    sess = md.compile(md.import_onnx(upsample), target="x86")
    x = _values((2, 2, 3, 3), np.float32)
    np.testing.assert_array_equal(sess.run({"x": x})["y"], x.repeat(3, axis=2).repeat(2, axis=3))
    assert _native(sess, {"n": 2}, "resize nearest") == 1


def test_a_pixel_map_of_whole_rows_with_the_columns_kept_is_copied_by_rows() -> None:
    """A reflect Pad's map (each output row one input row, its columns kept as one block between
    a few reflected ones) runs as ``md_map_rows``; a nearest 2x upsampling's map (columns
    repeated) keeps the per-pixel gather."""
    from metadef.backends.x86.movement import _mapped_rows
    from metadef.codegen.native import native_function
    h, w = 4, 5
    rows, cols = np.array([1, 0, 1, 2, 3, 2]), np.array([2, 1, 0, 1, 2, 3, 4, 3])  # reflect pads 1/1, 2/1
    step = _mapped_rows((rows[:, None] * w + cols[None, :]).astype(np.int32).reshape(-1), (h, w), (3, 6, 8), "pad")
    assert step is not None and step.calls[0].address == native_function("md_map_rows")
    assert step.calls[0].dims[:6] == (3, h, w, 6, 8, 2)
    up = (np.repeat(np.arange(h), 2)[:, None] * w + np.repeat(np.arange(w), 2)[None, :]).astype(np.int32)
    assert _mapped_rows(up.reshape(-1), (h, w), (3, 8, 10), "resize") is None
