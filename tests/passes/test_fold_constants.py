"""fold_constants: nodes of constants become constants, through the reference semantics; huge
results are refused with their sizes; numerics are exactly those of the unfolded graph."""

import numpy as np

import metadef as md
from metadef.ir import parse_graph, print_graph, verify
from metadef.passes.base import PassContext
from metadef.passes.fold_constants import fold_constants
from metadef.rewrite import RewriteOptions


def apply(before, constants=None, **kw):
    ctx = PassContext(options=kw.pop("options", RewriteOptions()))
    after = fold_constants(parse_graph(before, constants=constants), ctx, **kw)
    verify(after, types=True)
    return after, ctx.log.lines()


def run(graph, feeds):
    return md.compile(graph, target="reference").run(feeds)


CHAIN = """graph g(%x: f32[n,3]) -> (%y) {
  %a: f32[3] = const [1.0, 4.0, 9.0]
  %two: f32[] = const [2.0]
  %s: f32[3] = Sqrt(%a) @sqrt
  %m: f32[3] = Mul(%s, %two) @mul
  %y: f32[n,3] = Add(%x, %m) @add
  return %y
}
"""


def test_a_chain_of_constants_folds_in_one_pass():
    after, log = apply(CHAIN)
    assert print_graph(after) == """graph g(%x: f32[n,3]) -> (%y) {
  %m_folded: f32[3] = const [2.0, 4.0, 6.0]
  %y: f32[n,3] = Add(%x, %m_folded) @add
  return %y
}
"""
    assert log == ["taken fold_constant at sqrt", "taken fold_constant at mul"]
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)}
    np.testing.assert_array_equal(run(after, feeds)["y"], run(parse_graph(CHAIN), feeds)["y"])


def test_the_input_graph_is_not_changed():
    g = parse_graph(CHAIN)
    text = print_graph(g)
    fold_constants(g, PassContext())
    assert print_graph(g) == text


def test_multi_output_and_shape_ops_fold():
    before = """graph g(%x: f32[n,2]) -> (%y) {
  %w: f32[4,2] = const [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
  %four: i64[1] = const [4]
  %b: i64[1] = const [1]
  %e: i64[1] = const [3]
  %lo: f32[2,2], %hi: f32[2,2] = Split(%w) {axis=0, num_outputs=2} @split
  %r: f32[2,2] = Sub(%hi, %lo) @sub
  %f: f32[4] = Reshape(%r, %four) @reshape
  %t: f32[2] = Slice(%f, %b, %e) @slice
  %y: f32[n,2] = Mul(%x, %t) @mul
  return %y
}
"""
    after, log = apply(before)
    assert print_graph(after).splitlines()[1:3] == ["  %t_folded: f32[2] = const [4.0, 4.0]",
                                                   "  %y: f32[n,2] = Mul(%x, %t_folded) @mul"]
    assert log == ["taken fold_constant at split", "taken fold_constant at sub", "taken fold_constant at reshape",
                   "taken fold_constant at slice"]


def test_a_folded_graph_output_keeps_its_name():
    before = """graph g(%x: f32[n]) -> (%y, %k) {
  %a: f32[2] = const [1.0, -2.0]
  %k: f32[2] = Relu(%a) @relu
  %y: f32[n] = Neg(%x) @neg
  return %y, %k
}
"""
    after, log = apply(before)
    assert [v.name for v in after.outputs] == ["y", "k"]
    assert run(after, {"x": np.ones(3, np.float32)})["k"].tolist() == [1.0, 0.0]
    assert log == ["taken fold_constant at relu"]


HUGE = """graph g(%x: f32[n]) -> (%y) {
  %shape: i64[3] = const [4096, 4096, 2]
  %big: f32[4096,4096,2] = ConstantOfShape(%shape) @fill
  %axes: i64[3] = const [0, 1, 2]
  %s: f32[] = ReduceSum(%big, %axes) {keepdims=0} @sum
  %y: f32[n] = Add(%x, %s) @add
  return %y
}
"""


def test_a_huge_result_is_refused_with_its_size():
    after, log = apply(HUGE)
    assert [n.op for n in after.nodes] == ["ConstantOfShape", "ReduceSum", "Add"]
    assert log == ["refused fold_constant at fill: the result would take 128.0 MiB (limit 64.0 MiB) "
                   "where its inputs take 24 B"]


def test_the_limit_is_a_parameter_and_shrinking_folds_are_always_allowed():
    small = HUGE.replace("[4096, 4096, 2]", "[16, 16, 2]").replace("4096,4096,2", "16,16,2")
    after, log = apply(small, limit_bytes=1024)
    assert log[0] == "refused fold_constant at fill: the result would take 2.0 KiB (limit 1.0 KiB) where its " \
                     "inputs take 24 B"
    assert [n.op for n in after.nodes] == ["ConstantOfShape", "ReduceSum", "Add"]
    shrink = """graph g(%x: f32[n]) -> (%y) {
  %w: f32[64,64] = const
  %axes: i64[1] = const [0]
  %s: f32[64] = ReduceSum(%w, %axes) {keepdims=0} @sum
  %y: f32[64] = Add(%s, %x) @add
  return %y
}
""".replace("f32[n]", "f32[64]")
    after, log = apply(shrink, constants={"w": np.ones((64, 64), np.float32)}, limit_bytes=16)
    assert log == ["taken fold_constant at sum"] and after.constants[0].const.tolist() == [64.0] * 64


def test_the_rule_can_be_disabled():
    after, log = apply(CHAIN, options=RewriteOptions(disabled=frozenset({"fold_constant"})))
    assert print_graph(after) == print_graph(parse_graph(CHAIN)) and log == []


def test_nothing_to_fold_in_the_zoo_cnns():
    for name in ("mlp", "mobilenetv2"):
        g = md.import_onnx(md.zoo.build(name))
        ctx = PassContext()
        after = fold_constants(g, ctx)
        assert after.op_counts() == g.op_counts() and ctx.log.lines() == []


def test_random_draws_are_neither_folded_nor_merged() -> None:
    import numpy as np

    import metadef as md
    from metadef.ir import GraphBuilder
    from metadef.shape import parse_type

    b = GraphBuilder("draws")
    x = b.input("x", parse_type("f32[2,3]"))
    c = b.const("c", np.zeros((2, 3), np.float32))
    d1, = b.node("RandomUniformLike", [c], name="first")
    d2, = b.node("RandomUniformLike", [c], name="second")
    s, = b.node("Add", [d1, d2])
    y, = b.node("Add", [s, x])
    b.output(y)
    g = md.optimize(b.build(), level="aggressive")
    assert sum(n.op == "RandomUniformLike" for n in g.nodes) == 2  # two draws, each at run time
    sess = md.compile(g, target="reference")
    feeds = {"x": np.zeros((2, 3), np.float32)}
    first, second = sess.run(feeds)[y.name], sess.run(feeds)[y.name]
    assert not np.array_equal(first, second) and ((first >= 0) & (first < 2)).all()
