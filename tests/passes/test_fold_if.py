"""fold_if: an If with a constant condition becomes its chosen branch, inlined (Before graphs
built with the builder, since the IR text parser cannot read graph attributes; the After text
is compared); a run-time condition is refused with its reason; numerics are unchanged."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh

import metadef as md
from metadef.ir import Graph, GraphBuilder, print_graph, verify
from metadef.passes.base import PassContext, run_pipeline
from metadef.passes.eliminate_dead_code import eliminate_dead_code
from metadef.passes.fold_constants import fold_constants
from metadef.passes.fold_if import REFUSED_AT_RUN_TIME, fold_if
from metadef.rewrite import RewriteOptions
from metadef.shape import parse_type

X = parse_type("f32[n,3]")


def branch(name: str, build) -> Graph:
    """A branch taking the captured (%x: f32[n,3], %w: f32[3])."""
    b = GraphBuilder(name)
    x, w = b.input("x", X), b.input("w", parse_type("f32[3]"))
    b.output(*build(b, x, w))
    return b.build()


def scale(b, x, w):  # (x + w) * 2, with a branch constant named like an outer one
    s, = b.node("Add", [x, w], name="add")
    return b.node("Mul", [s, b.const("w", np.float32(2))], name="scale")


def widen(b, x, w):
    return b.node("Concat", [x, x], {"axis": 1}, name="wide")


def before(cond) -> Graph:
    """z = Relu(If(cond, x, w)); the If node is named like a node of its then branch."""
    b = GraphBuilder("g")
    x = b.input("x", X)
    w = b.const("w", np.arange(3, dtype=np.float32))
    c = b.input("c", parse_type("bool[]")) if cond is None else b.const("c", np.array(cond))
    y, = b.node("If", [c, x, w], {"then_branch": branch("then", scale), "else_branch": branch("else", widen)},
                name="add", outputs=["y"])
    b.output(*b.node("Relu", [y], name="relu", outputs=["z"]))
    return b.build()


def apply(graph: Graph, **options) -> tuple[Graph, list[str]]:
    ctx = PassContext(options=RewriteOptions(**options))
    after = fold_if(graph, ctx)
    verify(after)
    return after, ctx.log.lines()


def same_numbers(a: Graph, b: Graph, feeds: dict[str, np.ndarray]) -> None:
    want = md.compile(a, target="reference").run(feeds)
    got = md.compile(b, target="reference").run(feeds)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


def test_a_true_condition_inlines_the_then_branch_with_unique_names():
    g = before(True)
    after, log = apply(g)
    verify(after, types=True)
    assert print_graph(after) == """graph g(%x: f32[n,3]) -> (%z) {
  %w: f32[3] = const [0.0, 1.0, 2.0]
  %w_1: f32[] = const [2.0]
  %add_1_out: f32[n,3] = Add(%x, %w) @add_1
  %scale_out: f32[n,3] = Mul(%add_1_out, %w_1) @scale
  %z: f32[n,3] = Relu(%scale_out) @relu
  return %z
}
"""
    assert log == ["taken fold_if at add"]
    same_numbers(g, after, {"x": np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)})


def test_a_false_condition_inlines_the_else_branch():
    after, log = apply(before(False))
    verify(after, types=True)
    assert print_graph(after) == """graph g(%x: f32[n,3]) -> (%z) {
  %wide_out: f32[n,6] = Concat(%x, %x) {axis=1} @wide
  %z: f32[n,6] = Relu(%wide_out) @relu
  return %z
}
"""
    assert log == ["taken fold_if at add"]


def test_a_run_time_condition_is_refused_with_its_reason():
    g = before(None)
    after, log = apply(g)
    assert print_graph(after) == print_graph(g)
    assert log == [f"refused fold_if at add: {REFUSED_AT_RUN_TIME}"]


def test_the_rule_can_be_disabled_by_name():
    after, log = apply(before(True), disabled=frozenset({"fold_if"}))
    assert [n.op for n in after.nodes] == ["If", "Relu"]
    assert log == ["refused fold_if at add: rule fold_if is disabled"]


def test_a_condition_computed_from_constants_folds_after_fold_constants_and_retypes_downstream():
    b = GraphBuilder("g")
    x = b.input("x", X)
    w = b.const("w", np.arange(3, dtype=np.float32))
    c, = b.node("Not", [b.const("t", np.array(True))], name="not")
    y, = b.node("If", [c, x, w], {"then_branch": branch("then", scale), "else_branch": branch("else", widen)},
                name="if", outputs=["y"])
    b.output(*b.node("Relu", [y], name="relu", outputs=["z"]))
    g = b.build()
    assert str(g.outputs[0].type).startswith("f32[n,if_")  # merged: the condition was not known
    ctx = PassContext(verify=False)
    after = run_pipeline(g, [fold_constants, fold_if, eliminate_dead_code], ctx)
    verify(after, types=True)
    assert print_graph(after) == """graph g(%x: f32[n,3]) -> (%z) {
  %wide_out: f32[n,6] = Concat(%x, %x) {axis=1} @wide
  %z: f32[n,6] = Relu(%wide_out) @relu
  return %z
}
"""
    assert ctx.log.lines() == ["taken fold_constant at not", "taken fold_if at if"]


def test_a_branch_returning_a_captured_value_keeps_the_graph_output_name():
    b = GraphBuilder("g")
    x = b.input("x", X)
    w = b.const("w", np.arange(3, dtype=np.float32))
    y, = b.node("If", [b.const("c", np.array(True)), x, w],
                {"then_branch": branch("then", lambda b, x, w: (x,)), "else_branch": branch("else", widen)},
                name="if", outputs=["y"])
    b.output(y)
    after, log = apply(b.build())
    verify(after, types=True)
    assert print_graph(after) == """graph g(%x: f32[n,3]) -> (%y) {
  %y: f32[n,3] = Identity(%x) @y_keep
  return %y
}
"""
    assert log == ["taken fold_if at if"]


def nested_model(outer: bool, inner: bool) -> onnx.ModelProto:
    """If(outer) { x + w } else { k = inner (a branch Constant); If(k) { Relu(x) } else { x - w } }."""
    def body(name, nodes, output):
        return h.make_graph(nodes, name, [], [h.make_tensor_value_info(output, TensorProto.FLOAT, ["n", 3])])

    inner_if = h.make_node("If", ["k"], ["e"], then_branch=body("it", [h.make_node("Relu", ["x"], ["it"])], "it"),
                           else_branch=body("ie", [h.make_node("Sub", ["x", "w"], ["ie"])], "ie"))
    other = body("else", [h.make_node("Constant", [], ["k"], value=nh.from_array(np.array(inner))), inner_if], "e")
    then = body("then", [h.make_node("Add", ["x", "w"], ["t"])], "t")
    g = h.make_graph([h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], "m",
                     [h.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
                     [h.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
                     [nh.from_array(np.array([1.0, 2.0, 3.0], np.float32), "w"), nh.from_array(np.array(outer), "c")])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 21)], ir_version=8)


def test_nested_ifs_fold_all_the_way_down():
    g = md.import_onnx(nested_model(outer=False, inner=False))
    after, log = apply(g)
    verify(after, types=True)
    assert print_graph(after) == """graph m(%x: f32[n,3]) -> (%y) {
  %w: f32[3] = const [1.0, 2.0, 3.0]
  %y: f32[n,3] = Sub(%x, %w) @Sub_0
  return %y
}
"""
    assert log == ["taken fold_if at If_0", "taken fold_if at If_1"]
    same_numbers(g, after, {"x": np.ones((2, 3), np.float32)})


def test_folding_an_imported_model_matches_the_unfolded_one_for_every_condition():
    x = np.random.default_rng(1).standard_normal((3, 3)).astype(np.float32)
    for outer in (True, False):
        for inner in (True, False):
            g = md.import_onnx(nested_model(outer, inner))
            after, _ = apply(g)
            assert all(n.op != "If" for n in after.nodes)
            same_numbers(g, after, {"x": x})
