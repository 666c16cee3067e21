"""optimize_layout: the Transpose round trips of an NHWC (TensorFlow-style) model disappear,
outputs unchanged; a Transpose is pushed only toward its inverse, and never copied."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import metadef as md
from metadef.ir import parse_graph, print_graph, verify
from metadef.passes.base import PassContext
from metadef.passes.optimize_layout import optimize_layout
from metadef.rewrite import RewriteOptions
from metadef.testing.oracle import compare_with_onnxruntime

TO_NCHW, TO_NHWC = [0, 3, 1, 2], [0, 2, 3, 1]


def nhwc_model() -> onnx.ModelProto:
    """x (NHWC) -> [T -> Conv -> Relu -> T] -> Add(bias) -> Mul(scale) -> Sigmoid
    -> [T -> Conv -> T] -> Relu: two convolutions wrapped the way TensorFlow exports them."""
    rng = np.random.default_rng(0)

    def init(name, shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    nodes = [
        helper.make_node("Transpose", ["x"], ["x_nchw"], perm=TO_NCHW, name="in/T"),
        helper.make_node("Conv", ["x_nchw", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Transpose", ["r1"], ["r1_nhwc"], perm=TO_NHWC, name="conv1/T_out"),
        helper.make_node("Add", ["r1_nhwc", "bias"], ["a1"], name="add"),
        helper.make_node("Mul", ["a1", "scale"], ["m1"], name="mul"),
        helper.make_node("Sigmoid", ["m1"], ["s1"], name="sigmoid"),
        helper.make_node("Transpose", ["s1"], ["s1_nchw"], perm=TO_NCHW, name="conv2/T_in"),
        helper.make_node("Conv", ["s1_nchw", "w2"], ["c2"], name="conv2"),
        helper.make_node("Transpose", ["c2"], ["c2_nhwc"], perm=TO_NHWC, name="out/T"),
        helper.make_node("Relu", ["c2_nhwc"], ["y"], name="relu_out"),
    ]
    graph = helper.make_graph(
        nodes, "nhwc",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8, 8, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8, 8, 4])],
        [init("w1", (4, 3, 3, 3)), init("b1", (4,)), init("bias", (4,)), init("scale", (1, 1, 1, 4)),
         init("w2", (4, 4, 1, 1))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_nhwc_round_trips_are_gone_and_outputs_unchanged():
    proto = nhwc_model()
    g = md.import_onnx(proto)
    ctx = PassContext()
    after = optimize_layout(g, ctx)
    verify(after, types=True)
    assert [n.op for n in g.nodes].count("Transpose") == 4
    assert [n.op for n in after.nodes] == ["Transpose", "Conv", "Relu", "Add", "Mul", "Sigmoid", "Conv",
                                           "Transpose", "Relu"]
    assert ctx.log.lines() == ["taken push_transpose at add", "taken push_transpose at mul",
                               "taken push_transpose at sigmoid",
                               "taken cancel_transpose at conv2/T_in (conv2/T_in, sigmoid/transpose)"]
    assert [str(c.type) for c in after.constants if c.name.startswith(("add", "mul"))] == \
        ["f32[1,4,1,1]", "f32[1,4,1,1]"]
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 8, 8, 3)).astype(np.float32)}
    before_out = md.compile(g, target="reference").run(feeds)["y"]
    np.testing.assert_array_equal(md.compile(after, target="reference").run(feeds)["y"], before_out)
    assert compare_with_onnxruntime(proto, feeds, graph=after).ok


def apply(before, **ctx_args):
    ctx = PassContext(**ctx_args)
    after = optimize_layout(parse_graph(before), ctx)
    verify(after, types=True)
    return print_graph(after), ctx.log.lines()


CLIP = """graph g(%x: f32[n,3,4]) -> (%y) {
  %lo: f32[] = const [0.0]
  %hi: f32[] = const [6.0]
  %t: f32[n,4,3] = Transpose(%x) {perm=[0,2,1]} @tr
  %c: f32[n,4,3] = Clip(%t, %lo, %hi) @clip
  %y: f32[n,3,4] = Transpose(%c) {perm=[0,2,1]} @back
  return %y
}
"""


def test_scalar_operands_stay_scalars():
    text, log = apply(CLIP)
    assert text == """graph g(%x: f32[n,3,4]) -> (%y) {
  %lo: f32[] = const [0.0]
  %hi: f32[] = const [6.0]
  %y: f32[n,3,4] = Clip(%x, %lo, %hi) @clip
  return %y
}
"""
    assert log == ["taken push_transpose at clip", "taken cancel_transpose at back (back, clip/transpose)"]
    feeds = {"x": np.linspace(-8, 8, 24, dtype=np.float32).reshape(2, 3, 4)}
    np.testing.assert_array_equal(md.compile(parse_graph(text), target="reference").run(feeds)["y"],
                                  md.compile(parse_graph(CLIP), target="reference").run(feeds)["y"])


def test_a_transpose_with_two_readers_is_not_copied():
    before = """graph g(%x: f32[n,3,4]) -> (%y, %z) {
  %t: f32[n,4,3] = Transpose(%x) {perm=[0,2,1]} @tr
  %r: f32[n,4,3] = Relu(%t) @relu
  %y: f32[n,3,4] = Transpose(%r) {perm=[0,2,1]} @back
  %z: f32[n,4,3] = Neg(%t) @neg
  return %y, %z
}
"""
    text, log = apply(before)
    assert text == before
    assert log == ["refused push_transpose at relu: %t has 2 consumers: pushing would copy the Transpose"]


def test_a_transpose_that_meets_no_inverse_stays_put():
    before = """graph g(%x: f32[n,3,4]) -> (%y) {
  %t: f32[n,4,3] = Transpose(%x) {perm=[0,2,1]} @tr
  %y: f32[n,4,3] = Relu(%t) @relu
  return %y
}
"""
    assert apply(before) == (before, [])
    other = before.replace("%y: f32[n,4,3] = Relu(%t) @relu", "%r: f32[n,4,3] = Relu(%t) @relu\n"
                           "  %y: f32[4,n,3] = Transpose(%r) {perm=[1,0,2]} @other")
    assert apply(other) == (other, [])


def test_rules_can_be_disabled():
    text, log = apply(CLIP, options=RewriteOptions(disabled=frozenset({"push_transpose"})))
    assert text == CLIP and log == []


def test_the_zoo_models_have_no_round_trips():
    for name in ("mlp", "mobilenetv2"):
        g = md.import_onnx(md.zoo.build(name))
        ctx = PassContext()
        assert optimize_layout(g, ctx).op_counts() == g.op_counts() and ctx.log.lines() == []
