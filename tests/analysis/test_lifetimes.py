"""Tensor lifetimes, live bytes per step, lower bounds and the memory-aware schedule."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import metadef as md
from metadef.analysis import (
    is_topological,
    lifetimes,
    live_memory,
    lower_bound,
    memory_order,
    size_in_bytes,
)
from metadef.analysis.lifetimes import dfs_order, dominates, level_order, peak
from metadef.core.errors import GraphError, ShapeError
from metadef.ir import GraphBuilder, Value, parse_graph
from metadef.shape import evaluate, parse_type, sym

# Steps: 0 a=Relu(x)  1 b=Exp(a)  2 c=Neg(x)  3 d=Mul(a,c)  4 z=Add(b,d); a is read at 1 and 3.
TINY = """graph tiny(%x: f32[n,4]) -> (%z) {
  %a: f32[n,4] = Relu(%x) @relu
  %b: f32[n,8] = Concat(%a, %a) {axis=1} @cat
  %c: f32[n,4] = Neg(%x) @neg
  %d: f32[n,8] = Concat(%a, %c) {axis=1} @cat2
  %z: f32[n,8] = Add(%b, %d) @add
  return %z
}"""
BERT_BINDINGS = {"batch": 1, "seq": 128}


@functools.cache
def zoo_graph(name: str) -> md.Graph:
    return md.import_onnx(md.zoo.build(name))


def test_tiny_lifetimes_are_exact():
    g = parse_graph(TINY)
    got = [(t.value.name, t.kind, t.start, t.end, str(t.size), t.is_output) for t in lifetimes(g)]
    assert got == [
        ("x", "input", 0, 2, "n*16", False),
        ("a", "node", 0, 3, "n*16", False),
        ("b", "node", 1, 4, "n*32", False),
        ("c", "node", 2, 3, "n*16", False),
        ("d", "node", 3, 4, "n*32", False),
        ("z", "node", 4, 4, "n*32", True),
    ]


def test_tiny_live_memory_and_lower_bound():
    g = parse_graph(TINY)
    # step 0: a | 1: a,b | 2: a,b,c | 3: a,b,c,d | 4: b,d,z  (units of n*16 bytes: 1, 3, 4, 6, 6)
    assert live_memory(g, {"n": 1}) == [16, 48, 64, 96, 96]
    assert lower_bound(g, {"n": 2}) == 192
    assert [str(d) for d in live_memory(g)] == ["n*16", "n*48", "n*64", "n*96", "n*96"]
    assert str(lower_bound(g)) == "n*96"
    with_inputs = live_memory(g, {"n": 1}, kinds=("node", "input"))
    assert with_inputs == [32, 64, 80, 96, 96]


def test_order_changes_the_lower_bound():
    g = parse_graph(TINY)
    relu, cat, neg, cat2, add = g.nodes
    order = [neg, relu, cat2, cat, add]           # c first: a and c both die at cat2
    assert is_topological(g, order)
    assert live_memory(g, {"n": 1}, order) == [16, 32, 64, 80, 96]
    assert lower_bound(g, {"n": 1}, order) == 96


def test_bad_orders_are_refused():
    g = parse_graph(TINY)
    relu, cat, *_ = g.nodes
    with pytest.raises(GraphError, match="not topological"):
        lifetimes(g, [cat, relu, *g.nodes[2:]])
    with pytest.raises(GraphError, match="each of its 5 nodes once"):
        lifetimes(g, g.nodes[:3])
    assert not is_topological(g, list(reversed(g.nodes)))


def test_dead_values_and_constants():
    g = parse_graph("""graph g(%x: f32[4]) -> (%y) {
      %w: f32[4] = const [1, 2, 3, 4]
      %dead: f32[4] = Exp(%x) @exp
      %y: f32[4] = Add(%x, %w) @add
      return %y
    }""")
    by_name = {t.value.name: t for t in lifetimes(g)}
    assert (by_name["w"].kind, by_name["w"].start, by_name["w"].end) == ("const", 0, 1)
    assert (by_name["dead"].start, by_name["dead"].end) == (0, 0)
    assert live_memory(g, {}) == [16, 16]
    assert live_memory(g, {}, kinds=("node", "const")) == [32, 32]


def test_sizes_in_bytes():
    assert size_in_bytes(Value("h", parse_type("f32[batch,seq,3072]"))) == sym("batch") * sym("seq") * 12288
    assert size_in_bytes(Value("q", parse_type("i4[3]"))) == 2            # 1.5 bytes, rounded up
    assert size_in_bytes(Value("q", parse_type("u4[4,4]"))) == 8
    half = size_in_bytes(Value("q", parse_type("i4[n]")))
    assert [evaluate(half, {"n": k}) for k in (1, 2, 3)] == [1, 1, 2]
    assert size_in_bytes(Value("s", parse_type("f16[]"))) == 2
    with pytest.raises(ShapeError, match="no known shape"):
        size_in_bytes(Value("u", parse_type("f32[?]")))


def test_peak_drops_dominated_steps():
    n, m = sym("n"), sym("m")
    assert dominates(n * 8 + 1, n * 8) and not dominates(n * 8, m * 8)
    assert str(peak([n * 4, n * 8, n * 2 + 1])) == "max(n*2 + 1, n*8)"   # n*4 is dominated by n*8
    assert peak([n * 4, n * 8 + 2]) == n * 8 + 2
    assert peak([]) == 0


def test_memory_order_frees_early():
    g = parse_graph("""graph g(%x: f32[n,4]) -> (%z) {
      %w1: f32[n,16] = Concat(%x, %x, %x, %x) {axis=1}
      %w2: f32[n,16] = Concat(%x, %x, %x, %x) {axis=1}
      %r1: f32[1,1] = ReduceSum(%w1)
      %r2: f32[1,1] = ReduceSum(%w2)
      %z: f32[1,1] = Add(%r1, %r2)
      return %z
    }""")
    order = memory_order(g, {"n": 8})
    assert is_topological(g, order)
    assert lower_bound(g, {"n": 8}, order) == 520 < lower_bound(g, {"n": 8}) == 1028


# -- random DAGs ---------------------------------------------------------------------------

@st.composite
def random_dags(draw: st.DrawFn) -> md.Graph:
    """A random DAG of Relu / Add / Concat over f32[n,w] values, built with the GraphBuilder."""
    b = GraphBuilder("random")
    values = [b.input("x", parse_type("f32[n,4]"))]
    for k in range(draw(st.integers(1, 14))):
        kind = draw(st.sampled_from(["relu", "add", "concat"]))
        a = values[draw(st.integers(0, len(values) - 1))]
        other = values[draw(st.integers(0, len(values) - 1))]
        if kind == "add" and other.type == a.type:
            out, = b.node("Add", [a, other], name=f"add{k}")
        elif kind == "concat" and a.type.shape[1] + other.type.shape[1] <= 32:
            out, = b.node("Concat", [a, other], {"axis": 1}, name=f"cat{k}")
        else:
            out, = b.node("Relu", [a], name=f"relu{k}")
        values.append(out)
    b.output(values[-1])
    return b.build()


@settings(max_examples=60, deadline=None)
@given(random_dags(), st.integers(1, 5))
def test_memory_order_is_topological_and_no_worse(g: md.Graph, n: int):
    order = memory_order(g, {"n": n})
    assert is_topological(g, order)
    assert lower_bound(g, {"n": n}, order) <= lower_bound(g, {"n": n})
    for other in (level_order(g), dfs_order(g)):
        assert is_topological(g, other)


@settings(max_examples=40, deadline=None)
@given(random_dags(), st.integers(1, 5))
def test_live_memory_matches_brute_force(g: md.Graph, n: int):
    spans = [t for t in lifetimes(g) if t.kind == "node"]
    brute = [sum(evaluate(t.size, {"n": n}) for t in spans if t.live_at(step)) for step in range(len(g.nodes))]
    assert live_memory(g, {"n": n}) == brute
    assert evaluate(lower_bound(g), {"n": n}) == max(brute)


# -- the zoo -------------------------------------------------------------------------------

ZOO = ["mlp", "mobilenetv2", "resnet50", pytest.param("bert", marks=pytest.mark.slow)]


@pytest.mark.parametrize("name", ZOO)
def test_zoo_memory_order(name: str):
    g = zoo_graph(name)
    order = memory_order(g, BERT_BINDINGS)
    assert is_topological(g, order)
    before, after = lower_bound(g, BERT_BINDINGS), lower_bound(g, BERT_BINDINGS, order)
    assert 0 < after <= before
    assert evaluate(lower_bound(g), BERT_BINDINGS) == before        # the symbolic form agrees


@pytest.mark.slow
def test_bert_ffn_activation_size():
    g = zoo_graph("bert")
    ffn = g.node("/encoder/layer/0/intermediate/dense/MatMul").outputs[0]
    assert str(size_in_bytes(ffn)) == "batch*seq*12288"              # batch*seq*3072 floats
    assert np.isclose(lower_bound(g, BERT_BINDINGS) / 2**20, 4.875, atol=0.5)
