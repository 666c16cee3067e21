"""fold_shape_arithmetic: the exporters' Shape -> Gather -> Unsqueeze -> Concat chains become
constants (Reshape with 0 / -1, Expand with 1, Slice to the end), static shapes become constants,
what cannot be a constant becomes one Shape node; BERT loses every shape chain; the zoo models,
after the whole cleanup (op counts before -> after), still match ONNX Runtime."""

import functools
import time

import numpy as np
import pytest

import metadef as md
from metadef.ir import parse_graph, print_graph, verify
from metadef.passes.base import PassContext, run_pipeline
from metadef.passes.eliminate_common_subexpressions import eliminate_common_subexpressions
from metadef.passes.eliminate_dead_code import eliminate_dead_code
from metadef.passes.fold_constants import fold_constants
from metadef.passes.fold_shape_arithmetic import LazyShapeValues, fold_shape_arithmetic
from metadef.passes.simplify import simplify
from metadef.rewrite import RewriteOptions
from metadef.testing.oracle import compare_with_onnxruntime

CLEANUP = [simplify, fold_shape_arithmetic, fold_constants, eliminate_common_subexpressions, eliminate_dead_code]


def apply(before, *, disabled=()):
    ctx = PassContext(options=RewriteOptions(disabled=frozenset(disabled)))
    after = fold_shape_arithmetic(parse_graph(before, types="infer"), ctx)
    verify(after, types=True)
    return print_graph(after), ctx.log.lines()


def run(text_or_graph, feeds):
    g = parse_graph(text_or_graph, types="infer") if isinstance(text_or_graph, str) else text_or_graph
    return md.compile(g, target="reference").run(feeds)


ATTENTION = """graph g(%x: f32[batch,seq,768]) -> (%y) {
  %i0: i64[] = const [0]
  %i1: i64[] = const [1]
  %ax: i64[1] = const [0]
  %heads: i64[1] = const [12]
  %width: i64[1] = const [64]
  %s: i64[3] = Shape(%x) @shape
  %b: i64[] = Gather(%s, %i0) {axis=0} @gather_b
  %s2: i64[3] = Shape(%x) @shape_1
  %q: i64[] = Gather(%s2, %i1) {axis=0} @gather_q
  %b1: i64[1] = Unsqueeze(%b, %ax) @unsq_b
  %q1: i64[1] = Unsqueeze(%q, %ax) @unsq_q
  %t: i64[4] = Concat(%b1, %q1, %heads, %width) {axis=0} @concat
  %y: f32[batch,seq,12,64] = Reshape(%x, %t) @reshape
  return %y
}
"""


def test_bert_attention_reshape_becomes_0_0_12_64():
    text, log = apply(ATTENTION)
    assert text == """graph g(%x: f32[batch,seq,768]) -> (%y) {
  %reshape_shape: i64[4] = const [0, 0, 12, 64]
  %y: f32[batch,seq,12,64] = Reshape(%x, %reshape_shape) @reshape
  return %y
}
"""
    assert log == ["taken fold_shape_chain at reshape"]
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 5, 768)).astype(np.float32)}
    np.testing.assert_array_equal(run(text, feeds)["y"], run(ATTENTION, feeds)["y"])


MERGE = """graph g(%x: f32[batch,seq,12,64]) -> (%y) {
  %i0: i64[] = const [0]
  %i1: i64[] = const [1]
  %ax: i64[1] = const [0]
  %c: i64[1] = const [768]
  %s: i64[4] = Shape(%x) @shape
  %b: i64[] = Gather(%s, %i0) {axis=0} @gather_b
  %q: i64[] = Gather(%s, %i1) {axis=0} @gather_q
  %b1: i64[1] = Unsqueeze(%b, %ax) @unsq_b
  %q1: i64[1] = Unsqueeze(%q, %ax) @unsq_q
  %t: i64[3] = Concat(%b1, %q1, %c) {axis=0} @concat
  %r: f32[batch,seq,768] = Reshape(%x, %t) @reshape
  %m: i64[] = Mul(%b, %q) @mul
  %m1: i64[1] = Unsqueeze(%m, %ax) @unsq_m
  %t2: i64[2] = Concat(%m1, %c) {axis=0} @concat2
  %y: f32[batch*seq,768] = Reshape(%r, %t2) @flat
  return %y
}
"""


def test_merge_heads_uses_0_and_a_product_uses_minus_1():
    text, log = apply(MERGE)
    assert text == """graph g(%x: f32[batch,seq,12,64]) -> (%y) {
  %reshape_shape: i64[3] = const [0, 0, 768]
  %flat_shape: i64[2] = const [-1, 768]
  %r: f32[batch,seq,768] = Reshape(%x, %reshape_shape) @reshape
  %y: f32[batch*seq,768] = Reshape(%r, %flat_shape) @flat
  return %y
}
"""
    assert log == ["taken fold_shape_chain at reshape", "taken fold_shape_chain at flat"]


def test_a_static_shape_becomes_a_constant():
    before = """graph g(%x: f32[2,3,4]) -> (%y) {
  %i0: i64[] = const [0]
  %ax: i64[1] = const [0]
  %rest: i64[1] = const [-1]
  %s: i64[3] = Shape(%x) @shape
  %b: i64[] = Gather(%s, %i0) {axis=0} @gather
  %b1: i64[1] = Unsqueeze(%b, %ax) @unsq
  %t: i64[2] = Concat(%b1, %rest) {axis=0} @concat
  %y: f32[2,12] = Reshape(%x, %t) @reshape
  return %y
}
"""
    text, log = apply(before)
    assert text == """graph g(%x: f32[2,3,4]) -> (%y) {
  %concat_value: i64[2] = const [2, -1]
  %y: f32[2,12] = Reshape(%x, %concat_value) @reshape
  return %y
}
"""
    assert log == ["taken fold_static_shape at concat"]


def test_expand_to_a_computed_shape_uses_1_for_dims_it_has():
    before = """graph g(%x: f32[batch,1,4]) -> (%y) {
  %i0: i64[] = const [0]
  %ax: i64[1] = const [0]
  %rest: i64[2] = const [3, 4]
  %s: i64[3] = Shape(%x) @shape
  %b: i64[] = Gather(%s, %i0) {axis=0} @gather
  %b1: i64[1] = Unsqueeze(%b, %ax) @unsq
  %t: i64[3] = Concat(%b1, %rest) {axis=0} @concat
  %y: f32[batch,3,4] = Expand(%x, %t) @expand
  return %y
}
"""
    text, log = apply(before)
    assert text.splitlines()[1:3] == ["  %expand_shape: i64[3] = const [1, 3, 4]",
                                      "  %y: f32[batch,3,4] = Expand(%x, %expand_shape) @expand"]
    assert log == ["taken fold_shape_chain at expand"]
    feeds = {"x": np.arange(8, dtype=np.float32).reshape(2, 1, 4)}
    np.testing.assert_array_equal(run(text, feeds)["y"], run(before, feeds)["y"])


SLICES = """graph g(%x: f32[batch,seq,8], %ids: i64[batch,seq]) -> (%y, %z) {
  %w: f32[4,4] = const [0.0,1.0,2.0,3.0,4.0,5.0,6.0,7.0,8.0,9.0,10.0,11.0,12.0,13.0,14.0,15.0]
  %one: i64[] = const [1]
  %ax: i64[1] = const [0]
  %start: i64[1] = const [1]
  %axis1: i64[1] = const [1]
  %s: i64[3] = Shape(%x) @shape
  %d1: i64[] = Gather(%s, %one) {axis=0} @gather
  %end: i64[1] = Unsqueeze(%d1, %ax) @unsq
  %y: f32[batch,seq - 1,8] = Slice(%x, %start, %end, %axis1) @slice
  %si: i64[2] = Shape(%ids) @shape_ids
  %q: i64[] = Gather(%si, %one) {axis=0} @gather_q
  %q1: i64[1] = Unsqueeze(%q, %ax) @unsq_q
  %z: f32[seq,4] = Slice(%w, %ax, %q1, %ax) @pos
  return %y, %z
}
"""


def test_slice_to_a_whole_dim_and_bert_position_slice():
    """``x[:, 1:seq]`` slices to the end; BERT's ``w[0:seq]`` (w: [4, 4]) cannot be a constant:
    its end becomes one Shape node."""
    text, log = apply(SLICES)
    assert text.splitlines()[5:] == [
        "  %slice_ends: i64[1] = const [9223372036854775807]",
        "  %y: f32[batch,seq - 1,8] = Slice(%x, %start, %slice_ends, %axis1) @slice",
        "  %q1: i64[1] = Shape(%ids) {start=1, end=2} @shape_ids",
        "  %z: f32[seq,4] = Slice(%w, %ax, %q1, %ax) @pos",
        "  return %y, %z", "}"]
    assert log == ["taken fold_shape_chain at slice",
                   "refused fold_shape_chain at pos: end 0 (seq) is not static and not the whole of its axis",
                   "taken shorten_shape_chain at unsq_q"]
    feeds = {"x": np.arange(48, dtype=np.float32).reshape(2, 3, 8), "ids": np.zeros((2, 3), np.int64)}
    before, after = run(SLICES, feeds), run(parse_graph(text), feeds)
    for k in before:
        np.testing.assert_array_equal(after[k], before[k])


PERMUTED = """graph g(%x: f32[a,b,c]) -> (%y) {
  %i0: i64[] = const [0]
  %i1: i64[] = const [1]
  %i2: i64[] = const [2]
  %ax: i64[1] = const [0]
  %s: i64[3] = Shape(%x) @shape
  %da: i64[] = Gather(%s, %i0) {axis=0} @ga
  %db: i64[] = Gather(%s, %i1) {axis=0} @gb
  %dc: i64[] = Gather(%s, %i2) {axis=0} @gc
  %ua: i64[1] = Unsqueeze(%da, %ax) @unsq_a
  %ub: i64[1] = Unsqueeze(%db, %ax) @unsq_b
  %uc: i64[1] = Unsqueeze(%dc, %ax) @unsq_c
  %t: i64[3] = Concat(%uc, %ua, %ub) {axis=0} @concat
  %y: f32[c,a,b] = Reshape(%x, %t) @reshape
  return %y
}
"""


def test_a_target_no_constant_can_express_is_refused_with_the_reason():
    text, log = apply(PERMUTED)
    assert text == print_graph(parse_graph(PERMUTED, types="infer"))
    assert log == ["refused fold_shape_chain at reshape: target dim 1 (a) is not static, not the input's dim 1, "
                   "and a -1 is taken"]


def test_rules_can_be_disabled():
    text, log = apply(ATTENTION, disabled=["fold_shape_chain"])
    assert text == print_graph(parse_graph(ATTENTION, types="infer")) and log == []


# --- BERT, whole ------------------------------------------------------------------------------


@functools.cache
def _bert():
    proto = md.zoo.build("bert")
    return proto, md.import_onnx(proto, name="bert")


@pytest.mark.slow
def test_bert_loses_every_shape_chain():
    _, g = _bert()
    ctx = PassContext()
    t0 = time.perf_counter()
    after = run_pipeline(g, CLEANUP, ctx)
    elapsed = time.perf_counter() - t0
    before_counts, counts = g.op_counts(), after.op_counts()
    assert (before_counts["Shape"], before_counts["Concat"], len(g.nodes)) == (97, 48, 960)
    assert len(after.nodes) == 622 and "Concat" not in counts
    assert counts["Shape"] == 1 and counts["Gather"] == 2 and counts["Unsqueeze"] == 2
    # what remains computes data, not shapes (the word-embedding and pooler Gathers, the mask
    # Unsqueezes), except the one Shape that the position embedding's Slice(w, 0, seq) needs
    values = LazyShapeValues()
    assert [(n.op, n.name) for n in after.nodes if values.computes(n)] == \
        [("Shape", "/embeddings/position_embeddings/Shape")]
    targets = sorted(tuple(n.inputs[1].const.tolist()) for n in after.nodes if n.op == "Reshape")
    assert set(targets) == {(0, 0, 12, 64), (0, 0, 768)} and len(targets) == 48
    verify(after, types=True)
    assert elapsed < 5.0, ctx.timings


@pytest.mark.slow
@pytest.mark.parametrize("dims", [{"batch": 1, "seq": 128}, {"batch": 3, "seq": 37}])
def test_bert_after_cleanup_matches_onnxruntime(dims):
    proto, g = _bert()
    after = run_pipeline(g, CLEANUP, PassContext())
    check = compare_with_onnxruntime(proto, md.zoo.describe("bert").example_inputs(**dims), graph=after)
    assert check.ok, [o for o in check.outputs if not o.ok]


# --- the zoo: op counts before -> after the cleanup passes, outputs still ONNX Runtime's ------------

ZOO_NODES = {"mlp": (7, 7), "resnet50": (175, 175), "mobilenetv2": (152, 152), "bert": (960, 622)}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ZOO_NODES))
def test_zoo_models_after_cleanup(name):
    proto = md.zoo.build(name)
    g = md.import_onnx(proto, name=name)
    after = run_pipeline(g, CLEANUP, PassContext())
    verify(after, types=True)
    assert (len(g.nodes), len(after.nodes)) == ZOO_NODES[name], after.op_counts()
    dims = {"batch": 2, "seq": 19} if name == "bert" else {"batch": 2}
    check = compare_with_onnxruntime(proto, md.zoo.describe(name).example_inputs(**dims), graph=after)
    assert check.ok, [o for o in check.outputs if not o.ok]
