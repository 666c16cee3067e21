"""``fuse_groups``: each rule with a Before and an Expected graph, the decision log (taken and
refused: consumers, no_fuse, disabled rules, mixed dtypes, cycles), exact numerics, and the
zoo models against the reference backend and ONNX Runtime."""

from __future__ import annotations

import importlib
import inspect

import numpy as np
import pytest

import metadef as md
from metadef.ir import Graph, parse_graph, print_graph, problems, verify
from metadef.ops import Role, all_ops
from metadef.ops.defs.fused import Fused
from metadef.passes.base import PassContext
from metadef.passes.fuse_groups import RULES, _Planner, fuse_groups, group_summary
from metadef.rewrite import RewriteOptions
from metadef.testing.oracle import compare_with_onnxruntime

RNG = np.random.default_rng(3)
fuse_groups_module = importlib.import_module("metadef.passes.fuse_groups")


def check_numerics(before: Graph, after: Graph, symbols: dict[str, int] | None = None) -> None:
    """Random inputs: the fused graph gives exactly the unfused graph's outputs."""
    symbols = {"n": 3, **(symbols or {})}
    feeds = {}
    for v in before.inputs:
        shape = tuple(symbols.get(str(d), d) if not isinstance(d, int) else d for d in v.type.shape)
        feeds[v.name] = (RNG.standard_normal(shape) * 3).astype(v.type.dtype.numpy)
    want, got = md.compile(before).run(feeds), md.compile(after).run(feeds)
    for name in want:
        assert got[name].dtype == want[name].dtype and np.array_equal(got[name], want[name], equal_nan=True), name


def fuse(before: str, disabled: frozenset[str] = frozenset(), no_fuse: tuple[str, ...] = (),
         ) -> tuple[Graph, PassContext]:
    """Run the pass on IR text; verify the result and every body; check numerics."""
    g = parse_graph(before)
    for name in no_fuse:
        g.node(name).meta["no_fuse"] = True
    text = print_graph(g)
    ctx = PassContext(options=RewriteOptions(disabled=disabled))
    after = fuse_groups(g, ctx)
    assert print_graph(g) == text, "the input graph was modified"
    verify(after, types=True)
    for n in after.nodes:
        if n.metaop is Fused:
            verify(n.attrs["body"], types=True)
    check_numerics(g, after)
    return after, ctx


# --- contraction_epilogue ----------------------------------------------------------------

MATMUL_BIAS_RELU = """graph g(%x: f32[n,8], %w: f32[8,4], %b: f32[4]) -> (%y) {
  %lo: f32[] = const [0.0]
  %m: f32[n,4] = MatMul(%x, %w) @mm
  %a: f32[n,4] = Add(%m, %b) @bias
  %y: f32[n,4] = Clip(%a, %lo) @clip
  return %y
}
"""

MATMUL_BIAS_RELU_EXPECTED = """graph g(%x: f32[n,8], %w: f32[8,4], %b: f32[4]) -> (%y) {
  %y: f32[n,4] = ai.metadef::Fused(%x, %w, %b) {body=graph mm/fused(%x: f32[n,8], %w: f32[8,4], %b: f32[4]) -> (%y) {
      %lo: f32[] = const [0.0]
      %m: f32[n,4] = MatMul(%x, %w) @mm
      %a: f32[n,4] = Add(%m, %b) @bias
      %y: f32[n,4] = Clip(%a, %lo) @clip
      return %y
    }, kind="contraction+epilogue"} @mm/fused
  return %y
}
"""


def test_contraction_absorbs_bias_and_activation():
    after, ctx = fuse(MATMUL_BIAS_RELU)
    assert print_graph(after) == MATMUL_BIAS_RELU_EXPECTED
    assert ctx.log.lines() == ["taken contraction_epilogue at mm (mm, bias, clip)"]
    assert group_summary(after) == [("mm/fused", "contraction+epilogue", ["mm", "bias", "clip"])]


RESIDUAL = """graph g(%x: f32[n,4,8,8], %w: f32[4,4,3,3], %r: f32[n,4,8,8]) -> (%y) {
  %c: f32[n,4,8,8] = Conv(%x, %w) {pads=[1,1,1,1]} @conv
  %s: f32[n,4,8,8] = Add(%c, %r) @residual
  %y: f32[n,4,8,8] = Relu(%s) @relu
  return %y
}
"""


def test_a_residual_add_from_outside_joins_the_epilogue():
    after, ctx = fuse(RESIDUAL)
    fused, = after.nodes
    assert [v.name for v in fused.inputs] == ["x", "w", "r"] and fused.meta["anchor"] == "conv"
    assert ctx.log.lines() == ["taken contraction_epilogue at conv (conv, residual, relu)"]


OPERAND = """graph g(%x: f32[n,8], %w: f32[8,8], %r: f32[n,8]) -> (%y, %z) {
  %q: f32[n,8] = Neg(%r) @neg
  %m: f32[n,8] = MatMul(%x, %w) @mm
  %a: f32[n,8] = Add(%m, %q) @add
  %y: f32[n,8] = Relu(%a) @relu
  %z: f32[n,8] = Tanh(%r) @other
  return %y, %z
}
"""


def test_an_epilogue_absorbs_the_one_input_producer_of_its_operand():
    # (a quantized residual: the epilogue dequantizes the 8-bit tensor that the next layer reads too)
    after, ctx = fuse(OPERAND)
    assert group_summary(after) == [("mm/fused", "contraction+epilogue", ["mm", "neg", "add", "relu"])]
    assert [v.name for v in after.nodes[0].inputs] == ["x", "w", "r"]
    assert ctx.log.lines() == ["taken contraction_epilogue at mm (mm, add, relu)",
                               "taken epilogue_operands at mm (neg, add, relu)"]


def test_an_operand_producer_read_elsewhere_or_disabled_stays_out():
    after, _ = fuse(OPERAND.replace("-> (%y, %z)", "-> (%y, %z, %q)").replace("return %y, %z", "return %y, %z, %q"))
    assert group_summary(after) == [("mm/fused", "contraction+epilogue", ["mm", "add", "relu"])]
    after, ctx = fuse(OPERAND, disabled=frozenset({"epilogue_operands"}))
    assert group_summary(after) == [("mm/fused", "contraction+epilogue", ["mm", "add", "relu"])]
    assert "refused epilogue_operands at mm: rule epilogue_operands is disabled" in ctx.log.lines()


TWO_CONSUMERS = """graph g(%x: f32[n,8], %w: f32[8,4], %b: f32[4]) -> (%y, %t) {
  %m: f32[n,4] = MatMul(%x, %w) @mm
  %a: f32[n,4] = Add(%m, %b) @bias
  %y: f32[n,4] = Relu(%a) @relu
  %t: f32[n,4] = Tanh(%a) @tanh
  return %y, %t
}
"""

TWO_CONSUMERS_EXPECTED = """graph g(%x: f32[n,8], %w: f32[8,4], %b: f32[4]) -> (%y, %t) {
  %a: f32[n,4] = ai.metadef::Fused(%x, %w, %b) {body=graph mm/fused(%x: f32[n,8], %w: f32[8,4], %b: f32[4]) -> (%a) {
      %m: f32[n,4] = MatMul(%x, %w) @mm
      %a: f32[n,4] = Add(%m, %b) @bias
      return %a
    }, kind="contraction+epilogue"} @mm/fused
  %y: f32[n,4] = Relu(%a) @relu
  %t: f32[n,4] = Tanh(%a) @tanh
  return %y, %t
}
"""


def test_a_value_with_two_consumers_ends_the_chain():
    after, ctx = fuse(TWO_CONSUMERS)
    assert print_graph(after) == TWO_CONSUMERS_EXPECTED
    assert ctx.log.lines() == ["refused contraction_epilogue at mm: %a has 2 consumers",
                               "taken contraction_epilogue at mm (mm, bias)"]


def test_a_graph_output_counts_as_a_consumer():
    text = MATMUL_BIAS_RELU.replace("-> (%y)", "-> (%y, %a)").replace("return %y", "return %y, %a")
    after, ctx = fuse(text)
    assert [n.op for n in after.nodes] == ["Fused", "Clip"]
    assert ctx.log.refused()[0].reason == "%a has 2 consumers (one is a graph output)"


def test_no_fuse_node_is_never_absorbed():
    after, ctx = fuse(MATMUL_BIAS_RELU, no_fuse=("clip",))
    assert group_summary(after) == [("mm/fused", "contraction+epilogue", ["mm", "bias"])]
    assert ctx.log.lines()[0] == "refused contraction_epilogue at mm: clip is marked no_fuse"
    after, ctx = fuse(MATMUL_BIAS_RELU, no_fuse=("mm",))
    assert group_summary(after) == [("bias/fused", "elementwise", ["bias", "clip"])]
    assert ctx.log.lines() == ["refused contraction_epilogue at mm: mm is marked no_fuse",
                               "taken elementwise_chain at bias (bias, clip)"]


def test_an_op_with_no_index_expression_is_never_grouped():
    """BitwiseAnd is elementwise but opaque: in a group it would send the whole group to the
    reference kernels (code generation needs every member's expression)."""
    after, ctx = fuse("""graph g(%x: i32[n,4], %m: i32[4]) -> (%y) {
  %a: i32[n,4] = Add(%x, %m) @add
  %b: i32[n,4] = BitwiseAnd(%a, %m) @and
  %y: i32[n,4] = Abs(%b) @abs
  return %y
}
""")
    assert group_summary(after) == []
    assert "refused elementwise_chain at add: and (BitwiseAnd) has no index expression to generate code from" \
        in ctx.log.lines()


def test_disabled_rule_is_the_reason_and_the_chain_rule_takes_over():
    after, ctx = fuse(MATMUL_BIAS_RELU, disabled=frozenset({"contraction_epilogue"}))
    assert [n.op for n in after.nodes] == ["MatMul", "Fused"]
    assert ctx.log.lines() == ["refused contraction_epilogue at mm: rule contraction_epilogue is disabled",
                               "taken elementwise_chain at bias (bias, clip)"]
    after, ctx = fuse(MATMUL_BIAS_RELU, disabled=frozenset(RULES))
    assert [n.op for n in after.nodes] == ["MatMul", "Add", "Clip"]
    assert ctx.log.lines()[1] == "refused elementwise_chain at bias: rule elementwise_chain is disabled"


# --- reductions ----------------------------------------------------------------------------

LOGSUMEXP = """graph g(%x: f32[n,8]) -> (%y) {
  %axes: i64[1] = const [1]
  %e: f32[n,8] = Exp(%x) @exp
  %s: f32[n,1] = ReduceSum(%e, %axes) @sum
  %y: f32[n,1] = Log(%s) @log
  return %y
}
"""

LOGSUMEXP_EXPECTED = """graph g(%x: f32[n,8]) -> (%y) {
  %y: f32[n,1] = ai.metadef::Fused(%x) {body=graph sum/fused(%x: f32[n,8]) -> (%y) {
      %axes: i64[1] = const [1]
      %e: f32[n,8] = Exp(%x) @exp
      %s: f32[n,1] = ReduceSum(%e, %axes) @sum
      %y: f32[n,1] = Log(%s) @log
      return %y
    }, kind="prologue+reduction+epilogue"} @sum/fused
  return %y
}
"""


def test_reduction_absorbs_prologue_and_epilogue():
    after, ctx = fuse(LOGSUMEXP)
    assert print_graph(after) == LOGSUMEXP_EXPECTED
    assert ctx.log.lines() == ["taken reduction_prologue at sum (exp, sum)",
                               "taken reduction_epilogue at sum (sum, log)"]


def test_reduction_rules_disabled_one_at_a_time():
    after, ctx = fuse(LOGSUMEXP, disabled=frozenset({"reduction_prologue"}))
    assert group_summary(after) == [("sum/fused", "reduction+epilogue", ["sum", "log"])]
    assert ctx.log.lines()[0] == "refused reduction_prologue at sum: rule reduction_prologue is disabled"
    after, ctx = fuse(LOGSUMEXP, disabled=frozenset({"reduction_epilogue"}))
    assert group_summary(after) == [("sum/fused", "prologue+reduction", ["exp", "sum"])]


def test_a_prologue_read_outside_the_group_stays_out():
    text = LOGSUMEXP.replace("-> (%y)", "-> (%y, %e)").replace("return %y", "return %y, %e")
    after, ctx = fuse(text)
    assert group_summary(after) == [("sum/fused", "reduction+epilogue", ["sum", "log"])]
    assert ctx.log.lines()[0] == "refused reduction_prologue at sum: %e has 2 consumers"


DIAMOND = """graph g(%x: f32[n,8]) -> (%y) {
  %axes: i64[1] = const [1]
  %p: f32[n,8] = Exp(%x) @exp
  %q: f32[n,8] = Neg(%p) @neg
  %r: f32[n,8] = Add(%p, %q) @add
  %y: f32[n,1] = ReduceSum(%r, %axes) @sum
  return %y
}
"""


def test_a_diamond_prologue_joins_whole_and_quietly():
    after, ctx = fuse(DIAMOND)
    assert group_summary(after) == [("sum/fused", "prologue+reduction", ["exp", "neg", "add", "sum"])]
    assert ctx.log.lines() == ["taken reduction_prologue at sum (exp, neg, add, sum)"]


SOFTMAX_OF = """graph g(%x: f32[n,8]) -> (%y) {{
  %m: f32[] = const [2.0]
  %p: f32[n,8] = {op} @pre
  %y: f32[n,8] = Softmax(%p) @softmax
  return %y
}}
"""


@pytest.mark.parametrize(("producer", "joins"), [("Add(%x, %m)", True), ("Tanh(%x)", False), ("Erf(%x)", False)])
def test_a_softmax_takes_a_cheap_prologue_and_leaves_a_costly_one_computed_once(producer: str, joins: bool):
    """Softmax reads its input on three passes, and its group computes a prologue node on each:
    a mask's Add (1 operation an element) joins, a Tanh (a transcendental: 8) stays outside."""
    after, ctx = fuse(SOFTMAX_OF.format(op=producer))
    groups = group_summary(after)
    if joins:
        assert groups == [("softmax/fused", "prologue+reduction", ["pre", "softmax"])]
    else:
        assert groups == []
        assert ctx.log.lines() == ["refused reduction_prologue at softmax: pre costs about 8 operations an element "
                                   "and softmax reads it on 3 passes: computed once outside instead"]


def test_a_one_pass_reduction_takes_even_a_costly_prologue():
    after, _ = fuse(LOGSUMEXP.replace("Exp(%x)", "Tanh(%x)"))
    assert group_summary(after)[0][2] == ["exp", "sum", "log"]


# --- elementwise chains, boundaries ---------------------------------------------------------

SILU = """graph g(%x: f32[n,8], %y: f32[n,8]) -> (%z) {
  %s: f32[n,8] = Add(%x, %y) @add
  %g: f32[n,8] = Sigmoid(%s) @sigmoid
  %z: f32[n,8] = Mul(%s, %g) @mul
  return %z
}
"""

SILU_EXPECTED = """graph g(%x: f32[n,8], %y: f32[n,8]) -> (%z) {
  %s: f32[n,8] = Add(%x, %y) @add
  %z: f32[n,8] = ai.metadef::Fused(%s) {body=graph sigmoid/fused(%s: f32[n,8]) -> (%z) {
      %g: f32[n,8] = Sigmoid(%s) @sigmoid
      %z: f32[n,8] = Mul(%s, %g) @mul
      return %z
    }, kind="elementwise"} @sigmoid/fused
  return %z
}
"""


def test_elementwise_chain_without_anchor():
    after, ctx = fuse(SILU)
    assert print_graph(after) == SILU_EXPECTED
    assert ctx.log.lines() == ["refused elementwise_chain at add: %s has 2 consumers",
                               "taken elementwise_chain at sigmoid (sigmoid, mul)"]


INJECTIVE = """graph g(%x: f32[n,8], %w: f32[8,4], %b: f32[4]) -> (%y) {
  %shape: i64[2] = const [-1, 2]
  %m: f32[n,4] = MatMul(%x, %w) @mm
  %a: f32[n,4] = Add(%m, %b) @bias
  %r: f32[n*2,2] = Reshape(%a, %shape) @reshape
  %y: f32[n*2,2] = Relu(%r) @relu
  return %y
}
"""


def test_injective_ends_a_group_and_a_group_of_one_stays_as_is():
    after, ctx = fuse(INJECTIVE)
    assert [n.op for n in after.nodes] == ["Fused", "Reshape", "Relu"]
    assert ctx.log.lines() == ["taken contraction_epilogue at mm (mm, bias)"]


OPAQUE = """graph g(%x: f32[8]) -> (%y) {
  %axis: i64[] = const [0]
  %a: f32[8] = Relu(%x) @relu
  %c: f32[8] = CumSum(%a, %axis) @cumsum
  %y: f32[8] = Neg(%c) @neg
  return %y
}
"""


def test_opaque_nodes_are_never_grouped():
    after, ctx = fuse(OPAQUE)
    assert print_graph(after) == print_graph(parse_graph(OPAQUE)) and ctx.log.lines() == []


MIXED = """graph g(%m: i64[n,8], %x: f32[n,8]) -> (%y) {
  %c: f32[n,8] = Cast(%m) {to=1} @cast
  %a: f32[n,8] = Add(%c, %x) @add
  %y: f32[n,8] = Relu(%a) @relu
  return %y
}
"""


def test_a_group_may_mix_input_dtypes():
    # (a quantized layer reads 8-bit activations and float scales: one group, one kernel)
    before = parse_graph(MIXED)
    after, _ = fuse(MIXED)
    assert group_summary(after) == [("cast/fused", "elementwise", ["cast", "add", "relu"])]
    assert [v.type.dtype.name for v in after.nodes[0].inputs] == ["int64", "float32"]
    feeds = {"m": np.arange(-8, 8, dtype=np.int64).reshape(2, 8), "x": np.full((2, 8), 0.5, np.float32)}
    want = md.compile(before, target="reference").run(feeds)["y"]
    np.testing.assert_array_equal(md.compile(after, target="reference").run(feeds)["y"], want)


def test_the_cycle_guard_sees_paths_back_into_the_group():
    g = parse_graph("""graph g(%x: f32[n]) -> (%z) {
  %a: f32[n] = Relu(%x) @a
  %b: f32[n] = Neg(%a) @b
  %z: f32[n] = Add(%a, %b) @z
  return %z
}""")
    planner = _Planner(g, PassContext())
    group = planner.start(g.node("a"))
    assert planner.reaches_group(g.node("b"), group)      # Add(a, Neg(a)): b depends on a
    assert not planner.reaches_group(None, group)


def test_the_pass_reads_roles_and_names_no_op():
    source = inspect.getsource(fuse_groups_module)
    assert [op.name for op in all_ops() if f'"{op.name}"' in source] == []
    assert set(fuse_groups_module.anchor_rules) == {Role.CONTRACTION, Role.REDUCTION}
    assert RULES == ("contraction_epilogue", "reduction_prologue", "reduction_epilogue", "epilogue_operands",
                     "elementwise_chain")


# --- the zoo -----------------------------------------------------------------------------


def _outside(graph: Graph) -> set[str]:
    return {n.op for n in graph.nodes if n.metaop is not Fused}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlp", "resnet50", "mobilenetv2", "bert"])
def test_zoo_models_keep_their_outputs(name):
    model = md.zoo.build(name)
    g = md.import_onnx(model)
    ctx = PassContext()
    after = fuse_groups(g, ctx)
    assert problems(after, types=True) == problems(g, types=True)  # BERT's import has its own
    assert not _outside(after) & {"Relu", "Clip", "Tanh"}, "an activation was left outside a group"
    assert len(group_summary(after)) > 0 and len(after.nodes) < len(g.nodes)
    feeds = md.zoo.describe(name).example_inputs(batch=2, **({"seq": 16} if name == "bert" else {}))
    want, got = md.compile(g).run(feeds), md.compile(after).run(feeds)
    assert all(np.array_equal(want[k], got[k]) for k in want)
    assert compare_with_onnxruntime(model, feeds, graph=after).ok


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50", "mobilenetv2"])
def test_zoo_convolutions_after_batchnorm_folding(name):
    fold_batchnorm = pytest.importorskip("metadef.passes.fold_batchnorm").fold_batchnorm
    g = fold_batchnorm(md.import_onnx(md.zoo.build(name)), PassContext())
    after = fuse_groups(g, PassContext())
    verify(after, types=True)
    kinds = {kind for _, kind, _ in group_summary(after)}
    assert kinds == {"contraction+epilogue"} and not _outside(after) & {"Relu", "Clip"}
    feeds = md.zoo.describe(name).example_inputs(batch=1)
    want, got = md.compile(g).run(feeds), md.compile(after).run(feeds)
    assert all(np.array_equal(want[k], got[k]) for k in want)

