"""``decompose``: GroupNormalization as LayerNormalization and Tile as Expand, each against the
original op on the reference backend (and ONNX Runtime through the x86 backend)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import metadef as md
from metadef.ir import parse_graph, verify
from metadef.passes.base import PassContext
from metadef.passes.decompose import decompose
from metadef.testing.onnx_cases import one_node_model

RNG = np.random.default_rng(2)


def _decomposed(graph: md.Graph) -> tuple[md.Graph, list[str]]:
    ctx = PassContext()
    after = decompose(graph, ctx)
    verify(after, types=True)
    return after, ctx.log.lines()


@pytest.mark.parametrize("shape,groups,opset", [((2, 8, 5, 7), 4, 21), ((3, 6, 10), 3, 21), ((2, 8, 5, 7), 2, 18),
                                                ((2, 4, 3, 3), 4, 21)])
def test_group_normalization_as_layer_normalization(shape: tuple[int, ...], groups: int, opset: int) -> None:
    x = (RNG.standard_normal(shape) * 3 + 1).astype(np.float32)
    affine = shape[1] if opset == 21 else groups
    scale, bias = RNG.standard_normal(affine).astype(np.float32), RNG.standard_normal(affine).astype(np.float32)
    model = one_node_model("GroupNormalization", {"x": x}, {"scale": scale, "bias": bias}, opset=opset,
                           num_groups=groups, epsilon=1e-3)
    graph = md.import_onnx(model)
    after, log = _decomposed(graph)
    assert "GroupNormalization" not in [n.op for n in after.nodes] and log[0].startswith("taken groupnorm_as_layernorm")
    want = md.compile(graph, target="reference").run({"x": x})["out0"]
    np.testing.assert_allclose(md.compile(after, target="reference").run({"x": x})["out0"], want, rtol=1e-5, atol=1e-5)
    got = md.compile(md.optimize(graph, level="aggressive"), target="x86", cache=False).run({"x": x})["out0"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    if opset == 21:
        theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
        np.testing.assert_allclose(got, theirs[0], rtol=1e-4, atol=1e-4)


def test_group_normalization_with_unknown_channels_is_refused() -> None:
    g = parse_graph("""graph g(%x: f32[n,c,h], %s: f32[c], %b: f32[c]) -> (%y) {
      %y: f32[n,c,h] = GroupNormalization(%x, %s, %b) {num_groups=2} @gn
      return %y }""")
    after, log = _decomposed(g)
    assert [n.op for n in after.nodes] == ["GroupNormalization"]
    assert log == ["refused groupnorm_as_layernorm at gn: the channels (c) are not known to split into 2 groups"]
    per_group = parse_graph("""graph g(%x: f32[n,4,h], %s: f32[4], %b: f32[2]) -> (%y) {
      %y: f32[n,4,h] = GroupNormalization(%x, %s, %b) {num_groups=2} @gn
      return %y }""")
    after, log = _decomposed(per_group)  # (refused after looking at both: nothing added for the scale)
    assert [n.op for n in after.nodes] == ["GroupNormalization"] and not after.constants
    assert log == ["refused groupnorm_as_layernorm at gn: %b holds a value per group and is not a constant"]


@pytest.mark.parametrize("repeats", [(1, 1, 8), (2, 1, 3), (1, 3, 1), (1, 1, 1)])
@pytest.mark.parametrize("batch", ["n", "2"])
def test_tile_as_expand(repeats: tuple[int, ...], batch: str) -> None:
    first = batch if repeats[0] == 1 else str(repeats[0] * 2) if batch == "2" else f"{repeats[0]}*n"
    g = parse_graph(f"""graph g(%x: f32[{batch},5,6]) -> (%y) {{
      %r: i64[3] = const [{', '.join(map(str, repeats))}]
      %y: f32[{first},{5 * repeats[1]},{6 * repeats[2]}] = Tile(%x, %r) @tile
      return %y }}""")
    after, _ = _decomposed(g)
    ops = [n.op for n in after.nodes]
    assert ("Tile" in ops) == (repeats == (1, 1, 1))
    assert ("Concat" in ops) == (sum(r > 1 for r in repeats) == 1)  # one axis: copies side by side
    x = RNG.standard_normal((2, 5, 6)).astype(np.float32)
    np.testing.assert_array_equal(md.compile(after, target="reference").run({"x": x})["y"], np.tile(x, repeats))
    got = md.compile(md.optimize(g, level="aggressive"), target="x86", cache=False).run({"x": x})["y"]
    np.testing.assert_array_equal(got, np.tile(x, repeats))


@pytest.mark.parametrize("op,attrs,shape", [("DepthToSpace", {"blocksize": 2}, (2, 12, 3, 5)),
                                            ("DepthToSpace", {"blocksize": 2, "mode": "CRD"}, (2, 12, 3, 5)),
                                            ("DepthToSpace", {"blocksize": 3}, (1, 18, 2, 2)),
                                            ("SpaceToDepth", {"blocksize": 2}, (2, 3, 6, 4))])
def test_depth_and_space_as_reshape_transpose_reshape(op: str, attrs: dict, shape: tuple[int, ...]) -> None:
    x = RNG.standard_normal(shape).astype(np.float32)
    model = one_node_model(op, {"x": x}, opset=13, **attrs)
    graph = md.import_onnx(model)
    after, log = _decomposed(graph)
    assert [n.op for n in after.nodes] == ["Reshape", "Transpose", "Reshape"], log
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(md.compile(after, target="reference").run({"x": x})["out0"], want)
    got = md.compile(md.optimize(graph, level="aggressive"), target="x86", cache=False).run({"x": x})["out0"]
    np.testing.assert_array_equal(got, want)


def test_conv1d_runs_as_conv2d_with_its_activation_fused_and_rows_between_convs_kept_2d() -> None:
    """Two 1-D convs (strided, grouped, with bias) and a Relu and a scaled Sigmoid between them:
    each conv becomes a 2-D one over planes of one row, the activations move before the
    Squeeze (one-element constants only), and the Squeeze / Unsqueeze between the convs
    cancel; the answers are the original graph's, also through the x86 backend against ORT."""
    graph = parse_graph('''graph g(%x: f32[n,4,t]) -> (%y, %z) {
      %w: f32[6,4,3] = const
      %b: f32[6] = const
      %w2: f32[6,3,5] = const
      %half: f32[] = const [0.5]
      %row: f32[6,1] = const
      %a: f32[n,6,t] = Conv(%x, %w, %b) {pads=[1, 1]} @c1
      %r: f32[n,6,t] = Relu(%a) @relu
      %s: f32[n,6,t] = Mul(%r, %half) @scale
      %y: f32[n,6,?] = Conv(%s, %w2) {pads=[2, 2], strides=[2], group=2} @c2
      %z: f32[n,6,t] = Add(%a, %row) @per_channel
      return %y, %z }'''.replace("?", "floor((t - 1)/2) + 1"),
        constants={k: RNG.standard_normal(shape).astype(np.float32)
                   for k, shape in (("w", (6, 4, 3)), ("b", (6,)), ("w2", (6, 3, 5)), ("row", (6, 1)))})
    after, log = _decomposed(graph)
    ops = [n.op for n in after.nodes]
    assert ops.count("Conv") == 2 and ops.count("Unsqueeze") == 1 and ops.count("Squeeze") == 2, ops
    assert "taken fold_squeeze_pair at c2/rows (c2/rows, scale)" in log and "taken sink_squeeze at relu" in log
    assert any(line.startswith("refused sink_squeeze at per_channel") for line in log)  # ([6, 1] broadcasts by rank)
    x = RNG.standard_normal((2, 4, 11)).astype(np.float32)
    want = md.compile(graph, target="reference").run({"x": x})
    got = md.compile(after, target="reference").run({"x": x})
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5)
    for name, value in md.compile(md.optimize(graph, level="aggressive"), target="x86", cache=False).run(
            {"x": x}).items():
        np.testing.assert_allclose(value, want[name], rtol=1e-4, atol=1e-4)


def test_a_1d_conv_and_its_activation_run_as_one_2d_conv_group_on_x86_as_ort_computes() -> None:
    x = RNG.standard_normal((2, 8, 40)).astype(np.float32)
    model = one_node_model("Conv", {"x": x}, {"w": RNG.standard_normal((16, 8, 5)).astype(np.float32) * 0.3,
                                              "b": RNG.standard_normal(16).astype(np.float32)},
                           opset=17, pads=[2, 2], strides=[2])
    relu = onnx.helper.make_node("Relu", ["out0"], ["act"])
    model.graph.node.append(relu)
    model.graph.output[0].name = "act"
    sess = md.compile(md.optimize(md.import_onnx(model), level="aggressive"), target="x86", cache=False)
    assert [p.kind for p in sess.executable.plan] == ["view", "blas+generated epilogue", "view"]
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(sess.run({"x": x})["act"], theirs[0], rtol=1e-4, atol=1e-5)


def _conv_decomposed_as_the_original_computes(x_shape: tuple[int, ...], w_shape: tuple[int, ...], attrs: dict,
                                              bias: bool) -> tuple[md.Graph, list[str]]:
    """A one-Conv model (its batch symbolic) decomposed: the graph and the log, after checking
    it on the reference against the original, and through x86 at two batches against ORT."""
    x = RNG.standard_normal(x_shape).astype(np.float32)
    consts = {"w": (RNG.standard_normal(w_shape) * 0.3).astype(np.float32),
              **({"b": RNG.standard_normal(w_shape[0]).astype(np.float32)} if bias else {})}
    model = one_node_model("Conv", {"x": x}, consts, opset=17, **attrs)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "n"  # (the batch may vary)
    graph = md.import_onnx(model)
    after, log = _decomposed(graph)
    want = md.compile(graph, target="reference").run({"x": x})["out0"]
    np.testing.assert_allclose(md.compile(after, target="reference").run({"x": x})["out0"], want, rtol=1e-5, atol=1e-5)
    sess = md.compile(md.optimize(graph, level="aggressive"), target="x86", cache=False)
    oracle = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch in (1, 3):
        xb = RNG.standard_normal((batch, *x_shape[1:])).astype(np.float32)
        np.testing.assert_allclose(sess.run({"x": xb})["out0"], oracle.run(None, {"x": xb})[0], rtol=1e-4, atol=1e-4)
    return after, log


@pytest.mark.parametrize(("x_shape", "w_shape", "attrs", "bias"), [
    ((2, 4, 6, 9, 8), (5, 4, 3, 3, 3), {"pads": [1] * 6}, False),
    ((1, 4, 9, 10, 7), (6, 4, 3, 3, 2), {"pads": [1, 0, 1, 2, 1, 0], "strides": [2, 1, 2]}, True),
    ((2, 6, 10, 8, 8), (4, 3, 2, 3, 3), {"dilations": [2, 1, 2], "group": 2, "pads": [0, 1, 2, 0, 1, 2]}, True),
    ((1, 3, 5, 6, 6), (2, 3, 1, 1, 1), {}, False),
])
def test_conv3d_as_2d_convs_over_depth_taps(x_shape: tuple[int, ...], w_shape: tuple[int, ...], attrs: dict,
                                           bias: bool) -> None:
    """A 3-D conv (strides, pads, dilations, groups, a bias) as one 2-D conv a depth tap over the
    volume's planes: the reference's answers, and ONNX Runtime's through x86 at two batches."""
    after, log = _conv_decomposed_as_the_original_computes(x_shape, w_shape, attrs, bias)
    assert log[0] == "taken conv3d_as_conv2d at Conv_0" and [n.op for n in after.nodes].count("Conv") == w_shape[2]


def test_conv3d_over_an_unknown_volume_is_refused() -> None:
    graph = parse_graph('''graph g(%x: f32[n,2,d,4,4]) -> (%y) {
      %w: f32[3,2,3,3,3] = const
      %y: f32[n,3,d,4,4] = Conv(%x, %w) {pads=[1, 1, 1, 1, 1, 1]} @c3
      return %y }''', constants={"w": np.ones((3, 2, 3, 3, 3), np.float32)})
    after, log = _decomposed(graph)
    assert [n.op for n in after.nodes] == ["Conv"] and log[0].startswith("refused conv3d_as_conv2d at c3")


@pytest.mark.parametrize(("x_shape", "w_shape", "attrs", "bias"), [
    ((2, 8, 32, 32), (6, 8, 3, 3), {"dilations": [2, 2], "pads": [2, 2, 2, 2]}, True),
    ((1, 8, 48, 63), (4, 8, 3, 3), {"dilations": [3, 3], "pads": [3, 0, 0, 3]}, False),
    ((1, 8, 32, 32), (8, 2, 3, 3), {"dilations": [2, 2], "pads": [2, 2, 2, 2], "group": 4}, True),
])
def test_dilated_conv_as_a_dense_conv_over_the_input_phases(x_shape: tuple[int, ...], w_shape: tuple[int, ...],
                                                           attrs: dict, bias: bool) -> None:
    after, log = _conv_decomposed_as_the_original_computes(x_shape, w_shape, attrs, bias)
    assert log[0] == "taken dilated_as_dense at Conv_0"
    assert [n.op for n in after.nodes if n.op == "Conv"] == ["Conv"] and "dilations" not in next(
        n for n in after.nodes if n.op == "Conv").attrs


@pytest.mark.parametrize(("x_shape", "attrs", "why"), [
    ((1, 4, 20, 24), {"dilations": [2, 2], "pads": [2, 2, 2, 2]}, "its phases would be 10x12 planes"),
    ((1, 4, 33, 32), {"dilations": [2, 2], "pads": [2, 2, 2, 2]}, "are not known multiples of its dilation 2"),
    ((1, 4, 32, 32), {"dilations": [2, 2], "pads": [1, 1, 1, 1]}, "are not known multiples of its dilation 2"),
])
def test_dilated_convs_that_do_not_split_into_phases_stay(x_shape: tuple[int, ...], attrs: dict, why: str) -> None:
    x = RNG.standard_normal(x_shape).astype(np.float32)
    model = one_node_model("Conv", {"x": x}, {"w": RNG.standard_normal((3, 4, 3, 3)).astype(np.float32)}, opset=17,
                           **attrs)
    after, log = _decomposed(md.import_onnx(model))
    assert [n.op for n in after.nodes] == ["Conv"] and log[0].startswith("refused dilated_as_dense at Conv_0") \
        and why in log[0]


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_concat_as_a_concat_of_requantized_inputs(dtype: type) -> None:
    """ONNX Runtime's QLinearConcat: the input at the output's scale is taken as it is, the others
    requantized (DequantizeLinear, QuantizeLinear): the reference's bytes and ORT's, natively."""
    from onnx import helper

    info = np.iinfo(dtype)
    z = lambda v: np.asarray(v, dtype)  # noqa: E731
    consts = {"sy": np.float32(0.05), "zy": z(4), "s1": np.float32(0.05), "z1": z(4), "s2": np.float32(0.02),
              "z2": z(9), "s3": np.float32(0.3), "z3": z(-7 if dtype is np.int8 else 200)}
    feeds = {f"x{i}": RNG.integers(info.min, int(info.max) + 1, (2, c, 4)).astype(dtype)
             for i, c in ((1, 3), (2, 5), (3, 2))}
    node = helper.make_node("QLinearConcat", ["sy", "zy", "x1", "s1", "z1", "x2", "s2", "z2", "x3", "s3", "z3"],
                            ["y"], domain="com.microsoft", axis=1)
    model = helper.make_model(helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), ["b", v.shape[1], 4])
                      for k, v in feeds.items()], [helper.make_empty_tensor_value_info("y")],
        [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    graph = md.import_onnx(model)
    ctx = PassContext()
    new = decompose(graph, ctx)
    assert sorted(n.op for n in new.nodes) == ["Concat", *["DequantizeLinear"] * 2, *["QuantizeLinear"] * 2], \
        ctx.log.lines()
    assert "taken qlinear_concat_as_concat at " in " ".join(ctx.log.lines())
    want = md.compile(graph, target="reference").run(feeds)["y"]
    np.testing.assert_array_equal(
        want, ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0])
    np.testing.assert_array_equal(md.compile(new, target="reference").run(feeds)["y"], want)
    sess = md.compile(md.optimize(graph, level="aggressive"), target="x86", cache=False)
    np.testing.assert_array_equal(sess.run(feeds)["y"], want)
    assert not [e for e in sess.executable.plan if e.fallback], sess.executable.summary()
