"""The ``Fused`` meta-op: registration, its shape rule, its body-interpreting reference, the
verifier and the printer."""

from __future__ import annotations

import numpy as np
import pytest

import metadef as md
from metadef.core.errors import ShapeError
from metadef.ir import Graph, GraphBuilder, parse_graph, print_graph, verify
from metadef.ops import Role, get_op, infer_types
from metadef.ops.defs.fused import Fused, run_body
from metadef.shape import parse_type

RNG = np.random.default_rng(7)

BODY = """graph body(%x: f32[n,8], %w: f32[8,4], %b: f32[4]) -> (%y) {
  %lo: f32[] = const [0.0]
  %hi: f32[] = const [6.0]
  %m: f32[n,4] = MatMul(%x, %w) @mm
  %a: f32[n,4] = Add(%m, %b) @bias
  %y: f32[n,4] = Clip(%a, %lo, %hi) @clip
  return %y
}
"""

UNFUSED = BODY.replace("graph body", "graph g")


def fused_graph(body: Graph, types: list[str] | None = None) -> Graph:
    """An outer graph with one Fused node whose inputs mirror the body's inputs."""
    b = GraphBuilder("g")
    ins = [b.input(v.name, parse_type(t) if types else v.type)
           for v, t in zip(body.inputs, types or [None] * len(body.inputs))]
    attrs = {"body": body, "kind": "contraction+epilogue"}
    outs = b.node("Fused", ins, attrs, domain="ai.metadef", name="mm/fused",
                  outputs=[o.name for o in body.outputs])
    b.output(*outs)
    return b.build()


def test_registered_opaque_in_the_metadef_domain():
    assert get_op("Fused", "ai.metadef") is Fused
    assert Fused.role is Role.OPAQUE and Fused.semantics.opaque
    assert set(Fused.attrs) == {"body", "kind"}


def test_outputs_take_the_body_output_types_and_the_verifier_accepts_it():
    g = fused_graph(parse_graph(BODY))
    verify(g, types=True)
    assert [str(o.type) for o in g.outputs] == ["f32[n,4]"]


def test_concrete_inputs_bind_the_body_symbols():
    body = parse_graph(BODY)
    out, = infer_types(Fused, "/f", [parse_type("f32[3,8]"), parse_type("f32[8,4]"), parse_type("f32[4]")],
                       {"body": body, "kind": "k"})
    assert str(out) == "f32[3,4]"
    out, = infer_types(Fused, "/f", [parse_type("f32[batch,8]"), parse_type("f32[8,4]"), parse_type("f32[4]")],
                       {"body": body, "kind": "k"})
    assert str(out) == "f32[batch,4]"


@pytest.mark.parametrize(("types", "message"), [
    (["f32[n,8]", "f32[8,5]", "f32[4]"], "input 1 (body input %w) has type f32[8,5] but the body's input is f32[8,4]"),
    (["f32[n,8]", "f32[8,4]", "f32[4,1]"], "(rank differs)"),
    (["f16[n,8]", "f16[8,4]", "f16[4]"], "has dtype float16 but the body's input is float32"),
    (["f32[n,8]", "f32[8,4]"], "the node has 2 inputs but its body has 3"),
])
def test_input_types_that_disagree_with_the_body_fail_clearly(types, message):
    with pytest.raises(ShapeError, match="Cannot infer output shape for op Fused") as e:
        infer_types(Fused, "/f", [parse_type(t) for t in types], {"body": parse_graph(BODY), "kind": "k"})
    assert message in str(e.value)


def test_reference_interprets_the_body_exactly_like_the_unfused_nodes():
    feeds = {"x": RNG.standard_normal((5, 8)).astype(np.float32) * 4,
             "w": RNG.standard_normal((8, 4)).astype(np.float32),
             "b": RNG.standard_normal(4).astype(np.float32)}
    want = md.compile(parse_graph(UNFUSED)).run(feeds)["y"]
    got = md.compile(fused_graph(parse_graph(BODY))).run(feeds)["y"]
    assert got.dtype == np.float32 and np.array_equal(got, want)
    assert np.array_equal(run_body(parse_graph(BODY), list(feeds.values()))[0], want)


def test_sizes_that_depend_on_values_are_inferred_from_the_arrays():
    body = parse_graph("""graph body(%x: f32[n], %s: i64[2]) -> (%y) {
  %e: f32[expand_0,expand_1] = Expand(%x, %s) @expand
  %y: f32[expand_0,expand_1] = Relu(%e) @relu
  return %y
}""")
    x = np.array([-1.0, 2.0, -3.0], np.float32)
    y, = Fused.semantics.reference([x, np.array([2, 3])], {"body": body, "kind": "elementwise"})
    assert np.array_equal(y, np.maximum(np.broadcast_to(x, (2, 3)), 0))


def test_multiple_outputs_and_the_nested_text_form():
    body = parse_graph("""graph body(%x: f32[n]) -> (%r, %t) {
  %r: f32[n] = Relu(%x) @relu
  %t: f32[n] = Tanh(%x) @tanh
  return %r, %t
}""")
    g = fused_graph(body)
    verify(g, types=True)
    x = RNG.standard_normal(6).astype(np.float32)
    out = md.compile(g).run({"x": x})
    assert np.array_equal(out["r"], np.maximum(x, 0)) and np.array_equal(out["t"], np.tanh(x))
    text = print_graph(g)
    assert 'ai.metadef::Fused(%x) {body=graph body(%x: f32[n]) -> (%r, %t) {' in text
    assert '%t: f32[n] = Tanh(%x) @tanh' in text and 'kind="contraction+epilogue"' in text
