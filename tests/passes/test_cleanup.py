"""Cleanup passes: simplify (each rule, Before -> Expected), dead code, common subexpressions,
and a property test: random small graphs keep their outputs exactly through every pass."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import metadef as md
from metadef.ir import GraphBuilder, parse_graph, print_graph, verify
from metadef.passes.base import PassContext
from metadef.passes.eliminate_common_subexpressions import eliminate_common_subexpressions
from metadef.passes.eliminate_dead_code import eliminate_dead_code
from metadef.passes.fold_constants import fold_constants
from metadef.passes.fold_shape_arithmetic import fold_shape_arithmetic
from metadef.passes.optimize_layout import optimize_layout
from metadef.passes.simplify import simplify
from metadef.rewrite import RewriteOptions
from metadef.shape import parse_type


def run(graph, feeds):
    return md.compile(graph, target="reference").run(feeds)


def apply(pass_, before, **ctx_args):
    """Run a pass on IR text; verify the result; return (text, log lines)."""
    ctx = PassContext(**ctx_args)
    after = pass_(parse_graph(before), ctx)
    verify(after, types=True)
    return print_graph(after), ctx.log.lines()


def check_exact(before, after_text, feeds):
    a, b = run(parse_graph(before), feeds), run(parse_graph(after_text), feeds)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


X = {"x": np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)}

# --- simplify: one test per rule -------------------------------------------------------------

IDENTITY = """graph g(%x: f32[n,4]) -> (%y) {
  %i: f32[n,4] = Identity(%x) @id
  %y: f32[n,4] = Relu(%i) @relu
  return %y
}
"""

RELU_OF_X = """graph g(%x: f32[n,4]) -> (%y) {
  %y: f32[n,4] = Relu(%x) @relu
  return %y
}
"""


def test_remove_identity():
    text, log = apply(simplify, IDENTITY)
    assert text == RELU_OF_X and log == ["taken remove_identity at id"]
    check_exact(IDENTITY, text, X)


def test_identity_carrying_an_output_name_from_an_input_stays():
    before = "graph g(%x: f32[n,4]) -> (%y) {\n  %y: f32[n,4] = Identity(%x) @id\n  return %y\n}\n"
    assert apply(simplify, before) == (before, [])


def test_disabled_rule_is_skipped():
    text, log = apply(simplify, IDENTITY, options=RewriteOptions(disabled=frozenset({"remove_identity"})))
    assert text == IDENTITY and log == []


DROPOUT = """graph g(%x: f32[n,4]) -> (%y) {
  %d: f32[n,4] = Dropout(%x) @drop
  %y: f32[n,4] = Relu(%d) @relu
  return %y
}
"""


def test_remove_dropout_and_refuse_when_its_mask_is_used():
    text, log = apply(simplify, DROPOUT)
    assert text == RELU_OF_X and log == ["taken remove_dropout at drop"]
    check_exact(DROPOUT, text, X)
    masked = """graph g(%x: f32[n,4]) -> (%y, %m) {
  %d: f32[n,4], %m: b8[n,4] = Dropout(%x) @drop
  %y: f32[n,4] = Relu(%d) @relu
  return %y, %m
}
"""
    text, log = apply(simplify, masked)
    assert text == masked and log == ["refused remove_dropout at drop: its mask output %m is used"]


def test_remove_noop_cast_keeps_a_real_cast():
    before = """graph g(%x: f32[n,4]) -> (%y) {
  %c: f32[n,4] = Cast(%x) {to=1} @cast
  %h: f16[n,4] = Cast(%c) {to=10} @half
  %y: f16[n,4] = Relu(%h) @relu
  return %y
}
"""
    text, log = apply(simplify, before)
    assert text == """graph g(%x: f32[n,4]) -> (%y) {
  %h: f16[n,4] = Cast(%x) {to=10} @half
  %y: f16[n,4] = Relu(%h) @relu
  return %y
}
"""
    assert log == ["taken remove_noop_cast at cast"]
    check_exact(before, text, X)


def test_castlike_becomes_the_cast_it_is():
    before = """graph g(%x: f32[n,4], %like: f16[1]) -> (%y) {
  %h: f16[n,4] = CastLike(%x, %like) {saturate=1} @castlike
  %y: f16[n,4] = Relu(%h) @relu
  return %y
}
"""
    text, log = apply(simplify, before)
    assert text == """graph g(%x: f32[n,4], %like: f16[1]) -> (%y) {
  %h: f16[n,4] = Cast(%x) {to=10, saturate=1} @castlike
  %y: f16[n,4] = Relu(%h) @relu
  return %y
}
"""
    assert log == ["taken castlike_to_cast at castlike"]
    check_exact(before, text, {**X, "like": np.zeros(1, np.float16)})


def test_auto_pad_becomes_the_pads_it_means():
    """SAME_UPPER puts the odd pad after, SAME_LOWER before, VALID none; a Conv's kernel comes
    from its weights' type; dims not known (a symbolic width) leave auto_pad with the reason."""
    before = """graph g(%x: f32[n,4,9,8], %w: f32[4,1,4,4], %z: f32[n,4,7,w]) -> (%y, %p, %v, %q) {
  %y: f32[n,4,5,4] = Conv(%x, %w) {group=4, strides=[2, 2], auto_pad="SAME_UPPER"} @conv
  %p: f32[n,4,9,8] = MaxPool(%x) {kernel_shape=[2, 3], auto_pad="SAME_LOWER"} @pool
  %v: f32[n,4,7,6] = AveragePool(%x) {kernel_shape=[3, 3], auto_pad="VALID"} @avg
  %q: f32[n,4,7,w] = MaxPool(%z) {kernel_shape=[3, 3], auto_pad="SAME_UPPER"} @sym
  return %y, %p, %v, %q
}
"""
    text, log = apply(simplify, before)
    assert 'Conv(%x, %w) {group=4, strides=[2,2], pads=[1,1,2,1]} @conv' in text
    assert 'MaxPool(%x) {kernel_shape=[2,3], pads=[1,1,0,1]} @pool' in text
    assert 'AveragePool(%x) {kernel_shape=[3,3], pads=[0,0,0,0]} @avg' in text
    assert 'auto_pad="SAME_UPPER"} @sym' in text
    assert log[:3] == ["taken explicit_pads at conv", "taken explicit_pads at pool", "taken explicit_pads at avg"]
    assert log[3].startswith("refused explicit_pads at sym: auto_pad=SAME_UPPER over spatial dims [7, w]")
    rng = np.random.default_rng(1)
    check_exact(before, text, {"x": rng.standard_normal((2, 4, 9, 8)).astype(np.float32),
                               "w": rng.standard_normal((4, 1, 4, 4)).astype(np.float32),
                               "z": rng.standard_normal((2, 4, 7, 5)).astype(np.float32)})


def test_remove_noop_reshape_flatten_squeeze_unsqueeze_expand():
    before = """graph g(%x: f32[n,4]) -> (%y) {
  %s: i64[2] = const [0, 4]
  %e: i64[1] = const [4]
  %r: f32[n,4] = Reshape(%x, %s) @reshape
  %f: f32[n,4] = Flatten(%r) {axis=1} @flatten
  %x2: f32[n,4] = Expand(%f, %e) @expand
  %y: f32[n,4] = Relu(%x2) @relu
  return %y
}
"""
    text, log = apply(simplify, before)
    assert text == RELU_OF_X
    assert log == ["taken remove_noop_reshape at reshape", "taken remove_noop_reshape at flatten",
                   "taken remove_noop_expand at expand"]
    check_exact(before, text, X)


def test_fold_reshape_pair_keeps_the_last_and_refuses_an_unknown_copy():
    before = """graph g(%x: f32[n,3,4]) -> (%y) {
  %s1: i64[2] = const [0, 12]
  %s2: i64[3] = const [0, 2, 6]
  %a: f32[n,12] = Reshape(%x, %s1) @r1
  %y: f32[n,2,6] = Reshape(%a, %s2) @r2
  return %y
}
"""
    text, log = apply(simplify, before)
    assert text == """graph g(%x: f32[n,3,4]) -> (%y) {
  %s2: i64[3] = const [0, 2, 6]
  %y: f32[n,2,6] = Reshape(%x, %s2) @r2
  return %y
}
"""
    assert log == ["taken fold_reshape_pair at r2 (r2, r1)"]
    check_exact(before, text, {"x": np.arange(24, dtype=np.float32).reshape(2, 3, 4)})
    copies = """graph g(%x: f32[a,b]) -> (%y) {
  %s1: i64[1] = const [-1]
  %s2: i64[2] = const [0, 1]
  %f: f32[a*b] = Reshape(%x, %s1) @r1
  %y: f32[a*b,1] = Reshape(%f, %s2) @r2
  return %y
}
"""
    text, log = apply(simplify, copies)
    assert text == copies
    assert log == ["refused fold_reshape_pair at r2: target dim 0 copies a*b from %f, "
                   "which %x (f32[a,b]) does not have at that position"]


def test_fold_transpose_pair_composes_or_cancels():
    before = """graph g(%x: f32[a,b,c]) -> (%y) {
  %t: f32[a,c,b] = Transpose(%x) {perm=[0,2,1]} @t1
  %y: f32[c,a,b] = Transpose(%t) {perm=[1,0,2]} @t2
  return %y
}
"""
    text, log = apply(simplify, before)
    assert text == """graph g(%x: f32[a,b,c]) -> (%y) {
  %y: f32[c,a,b] = Transpose(%x) {perm=[2,0,1]} @t2
  return %y
}
"""
    assert log == ["taken fold_transpose_pair at t2 (t2, t1)"]
    check_exact(before, text, {"x": np.arange(24, dtype=np.float32).reshape(2, 3, 4)})


NEUTRAL = """graph g(%x: f32[n,4]) -> (%y) {
  %zero: f32[] = const [0.0]
  %one: f32[4] = const [1.0, 1.0, 1.0, 1.0]
  %a: f32[n,4] = Add(%zero, %x) @add
  %s: f32[n,4] = Sub(%a, %zero) @sub
  %m: f32[n,4] = Mul(%s, %one) @mul
  %d: f32[n,4] = Div(%m, %one) @div
  %y: f32[n,4] = Relu(%d) @relu
  return %y
}
"""


def test_remove_add_zero_and_mul_one():
    text, log = apply(simplify, NEUTRAL)
    assert text == RELU_OF_X
    assert log == ["taken remove_add_zero at add", "taken remove_add_zero at sub",
                   "taken remove_mul_one at mul", "taken remove_mul_one at div"]
    check_exact(NEUTRAL, text, X)


def test_neutral_constant_that_broadcasts_to_a_larger_shape_stays():
    before = """graph g(%x: f32[4]) -> (%y) {
  %zeros: f32[3,4] = const [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
  %two: f32[] = const [2.0]
  %a: f32[3,4] = Add(%x, %zeros) @add
  %y: f32[3,4] = Sub(%two, %a) @sub
  return %y
}
"""
    assert apply(simplify, before) == (before, [])


def test_remove_noop_pad_slice_concat_transpose():
    before = """graph g(%x: f32[n,4]) -> (%y) {
  %pads: i64[4] = const [0, 0, 0, 0]
  %starts: i64[1] = const [0]
  %ends: i64[1] = const [9223372036854775807]
  %axes: i64[1] = const [1]
  %p: f32[n,4] = Pad(%x, %pads) @pad
  %s: f32[n,4] = Slice(%p, %starts, %ends, %axes) @slice
  %c: f32[n,4] = Concat(%s) {axis=0} @concat
  %t: f32[n,4] = Transpose(%c) {perm=[0,1]} @transpose
  %y: f32[n,4] = Relu(%t) @relu
  return %y
}
"""
    text, log = apply(simplify, before)
    assert text == RELU_OF_X
    assert log == ["taken remove_noop_pad at pad", "taken remove_noop_slice at slice",
                   "taken remove_single_concat at concat", "taken remove_noop_transpose at transpose"]
    check_exact(before, text, X)


def test_slice_that_drops_elements_stays():
    before = """graph g(%x: f32[n,4]) -> (%y) {
  %starts: i64[1] = const [1]
  %ends: i64[1] = const [4]
  %axes: i64[1] = const [1]
  %y: f32[n,3] = Slice(%x, %starts, %ends, %axes) @slice
  return %y
}
"""
    assert apply(simplify, before) == (before, [])


# --- dead code ---------------------------------------------------------------------------------


def test_eliminate_dead_code_logs_what_it_removes():
    before = """graph g(%x: f32[n,4]) -> (%y) {
  %w: f32[] = const [2.0]
  %m: f32[n,4] = Mul(%x, %w) @mul
  %z: f32[n,4] = Neg(%m) @neg
  %y: f32[n,4] = Relu(%x) @relu
  return %y
}
"""
    text, log = apply(eliminate_dead_code, before)
    assert text == RELU_OF_X
    assert log == ["taken remove_dead_node at mul", "taken remove_dead_node at neg",
                   "taken eliminate_dead_code at g: removed 2 nodes and 1 constants"]
    assert apply(eliminate_dead_code, RELU_OF_X) == (RELU_OF_X, [])


def test_unused_graph_inputs_stay():
    before = "graph g(%x: f32[n], %unused: f32[n]) -> (%y) {\n  %y: f32[n] = Relu(%x) @relu\n  return %y\n}\n"
    assert apply(eliminate_dead_code, before) == (before, [])


# --- common subexpressions ---------------------------------------------------------------------

CSE_BEFORE = """graph g(%x: f32[n,4]) -> (%y) {
  %c1: f32[4] = const [1.0, 2.0, 3.0, 4.0]
  %c2: f32[4] = const [1.0, 2.0, 3.0, 4.0]
  %c3: f64[4] = const [1.0, 2.0, 3.0, 4.0]
  %a: f32[n,4] = Mul(%x, %c1) @mul1
  %b: f32[n,4] = Mul(%x, %c2) @mul2
  %s1: f32[n,4] = Softmax(%a) @sm1
  %s2: f32[n,4] = Softmax(%b) {axis=-1} @sm2
  %s3: f32[n,4] = Softmax(%b) {axis=0} @sm3
  %c: f32[4] = Cast(%c3) {to=1} @cast
  %t: f32[n,4] = Add(%s1, %s2) @add1
  %u: f32[n,4] = Add(%t, %s3) @add2
  %y: f32[n,4] = Add(%u, %c) @add3
  return %y
}
"""


def test_cse_merges_equal_nodes_and_constants_by_value():
    text, log = apply(eliminate_common_subexpressions, CSE_BEFORE)
    assert text == """graph g(%x: f32[n,4]) -> (%y) {
  %c1: f32[4] = const [1.0, 2.0, 3.0, 4.0]
  %c3: f64[4] = const [1.0, 2.0, 3.0, 4.0]
  %a: f32[n,4] = Mul(%x, %c1) @mul1
  %s1: f32[n,4] = Softmax(%a) @sm1
  %s3: f32[n,4] = Softmax(%a) {axis=0} @sm3
  %c: f32[4] = Cast(%c3) {to=1} @cast
  %t: f32[n,4] = Add(%s1, %s1) @add1
  %u: f32[n,4] = Add(%t, %s3) @add2
  %y: f32[n,4] = Add(%u, %c) @add3
  return %y
}
"""
    assert log == ["taken merge_duplicate_constant at c2 (c2, c1)", "taken merge_duplicate_node at mul2 (mul2, mul1)",
                   "taken merge_duplicate_node at sm2 (sm2, sm1)"]
    check_exact(CSE_BEFORE, text, X)


def test_cse_keeps_both_output_names():
    before = """graph g(%x: f32[n,4]) -> (%y, %z) {
  %y: f32[n,4] = Relu(%x) @r1
  %z: f32[n,4] = Relu(%x) @r2
  return %y, %z
}
"""
    text, log = apply(eliminate_common_subexpressions, before)
    assert [line.split(" = ")[1] for line in text.splitlines()[1:3]] == ["Relu(%x) @r1", "Identity(%y) @z_keep"]
    assert log == ["taken merge_duplicate_node at r2 (r2, r1)"]
    check_exact(before, text, X)


def test_cse_is_deterministic():
    once = apply(eliminate_common_subexpressions, CSE_BEFORE)
    assert all(apply(eliminate_common_subexpressions, CSE_BEFORE) == once for _ in range(3))


# --- every pass keeps random graphs' outputs exactly --------------------------------------------

PASSES = [simplify, fold_shape_arithmetic, fold_constants, eliminate_common_subexpressions, eliminate_dead_code,
          optimize_layout]
UNARY = ["Relu", "Neg", "Sigmoid", "Identity", "Abs", "Dropout"]
BINARY = ["Add", "Sub", "Mul", "Div"]


def _const_operand(draw, b, shape):
    """A constant that broadcasts against ``shape``: a scalar, the last dim, or ones."""
    last = shape[-1] if shape and isinstance(shape[-1], int) else None
    options = [()] + ([(last,)] if last else []) + [(1,) * len(shape)]
    cshape = draw(st.sampled_from(options))
    fill = draw(st.sampled_from(["zeros", "ones", "random"]))
    arr = {"zeros": np.zeros, "ones": np.ones}.get(fill, lambda s: np.arange(1, 1 + int(np.prod(s))).reshape(s) / 7)(
        cshape).astype(np.float32)
    return b.const("c", arr)


def _reshape(draw, b, v):
    shape = v.type.shape
    rest = int(np.prod(shape[1:]))
    splits = [d for d in (2, 3, 4, 6) if rest % d == 0]
    target = draw(st.sampled_from([[0, rest], [0, -1]] + [[0, d, rest // d] for d in splits]))
    if draw(st.booleans()):  # the exporters' run-time form: Concat(Unsqueeze(Gather(Shape(v), 0)), rest)
        dim0, = b.node("Gather", [b.node("Shape", [v])[0], b.const("i0", np.array(0, np.int64))], {"axis": 0})
        dim1, = b.node("Unsqueeze", [dim0, b.const("ax", np.array([0], np.int64))])
        target_v, = b.node("Concat", [dim1, b.const("rest", np.array(target[1:], np.int64))], {"axis": 0})
    else:
        target_v = b.const("shape", np.array(target, np.int64))
    return b.node("Reshape", [v, target_v])[0]


def _step(draw, b, values):
    kind = draw(st.sampled_from(["unary", "const_binary", "binary", "transpose_pair", "reshape", "cast",
                                      "folded_const"]))
    v = draw(st.sampled_from(values))
    shape = v.type.shape
    if kind == "unary":
        return b.node(draw(st.sampled_from(UNARY)), [v])[0]
    if kind == "const_binary":
        c = _const_operand(draw, b, shape)
        inputs = [v, c] if draw(st.booleans()) else [c, v]
        return b.node(draw(st.sampled_from(BINARY)), inputs)[0]
    if kind == "binary":
        same = [w for w in values if w.type == v.type]
        return b.node(draw(st.sampled_from(BINARY)), [v, draw(st.sampled_from(same))])[0]
    if kind == "transpose_pair":
        perm = draw(st.permutations(range(len(shape))))
        t, = b.node("Transpose", [v], {"perm": list(perm)})
        mid, = b.node(draw(st.sampled_from(["Relu", "Neg"])), [t])
        if draw(st.booleans()):
            mid, = b.node("Mul", [mid, _const_operand(draw, b, mid.type.shape)])
        return b.node("Transpose", [mid], {"perm": list(np.argsort(perm))})[0]
    if kind == "reshape" and shape and str(shape[0]) == "n":
        return _reshape(draw, b, v)
    if kind == "cast":
        return b.node("Cast", [v], {"to": 1})[0]
    if kind == "folded_const" and shape and isinstance(shape[-1], int):
        c = b.const("k", np.linspace(-1, 1, shape[-1], dtype=np.float32))
        k, = b.node("Neg", [b.node("Exp", [c])[0]])
        return b.node("Add", [v, k])[0]
    return b.node("Relu", [v])[0]


class Sample:
    """A generated graph that shows as IR text in hypothesis' reports."""

    def __init__(self, graph):
        self.graph = graph

    def __repr__(self):
        return "\n" + print_graph(self.graph)


@st.composite
def random_graphs(draw):
    b = GraphBuilder("random")
    values = [b.input("x", parse_type("f32[n,3,4]"))]
    for _ in range(draw(st.integers(1, 7))):
        values.append(_step(draw, b, values))
    b.output(values[-1])
    if draw(st.booleans()) and values[-2] is not values[-1] and len(values) > 2:
        b.output(values[-2])
    return Sample(b.build())


@pytest.mark.parametrize("pass_", PASSES, ids=lambda p: p.__name__)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sample=random_graphs(), n=st.sampled_from([1, 2, 5]))
def test_passes_keep_random_graphs_exact(pass_, sample, n):
    graph = sample.graph
    feeds = {"x": np.random.default_rng(n).standard_normal((n, 3, 4)).astype(np.float32)}
    before = run(graph, feeds)
    text = print_graph(graph)
    after = pass_(graph, PassContext())
    assert print_graph(graph) == text, "the pass mutated its input"
    verify(after, types=True)
    got = run(after, feeds)
    for name, value in before.items():
        np.testing.assert_array_equal(got[name], value, err_msg=f"{pass_.__name__}: {name}\n{text}")

