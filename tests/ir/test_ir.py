"""Graph IR: builder typing, verifier findings, text form round trip."""

import numpy as np
import pytest

from metadef.core.errors import DSLSyntaxError, GraphError, ShapeError
from metadef.ir import GraphBuilder, Node, Value, parse_graph, print_graph, problems, verify
from metadef.shape import parse_type

TEXT = """graph tiny(%x: f32[batch,4]) -> (%y) {
  %w: f32[4,3] = const [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0]
  %h: f32[batch,3] = MatMul(%x, %w) @"/fc/MatMul"
  %y: f32[batch,3] = Relu(%h) @/fc/Relu !no_fuse
  return %y
}
"""


def _tiny():
    b = GraphBuilder("tiny")
    x = b.input("x", parse_type("f32[batch,4]"))
    w = b.const("w", np.arange(12, dtype=np.float32).reshape(4, 3))
    h, = b.node("MatMul", [x, w], name="/fc/MatMul", outputs=["h"])
    y, = b.node("Relu", [h], name="/fc/Relu", outputs=["y"])
    b.output(y)
    return b.build()


def test_builder_types_every_value():
    g = _tiny()
    assert [str(v.type) for v in g.values()] == ["f32[batch,4]", "f32[4,3]", "f32[batch,3]", "f32[batch,3]"]
    assert g.nodes[0].outputs[0].producer is g.nodes[0]
    assert g.op_counts() == {"MatMul": 1, "Relu": 1}
    assert g.num_parameters() == 12
    verify(g, types=True)


def test_text_round_trip_is_exact():
    g = parse_graph(TEXT)
    TEXT_OUT = TEXT.replace('"/fc/MatMul"', "/fc/MatMul")  # plain names print bare
    assert print_graph(g) == TEXT_OUT
    assert g.nodes[1].meta["no_fuse"] is True
    assert print_graph(parse_graph(print_graph(g))) == TEXT_OUT
    np.testing.assert_array_equal(g.constants[0].const[0], [1, 2, 3])


def test_large_constants_travel_beside_the_text():
    g = _tiny()
    big = GraphBuilder("big")
    x = big.input("x", parse_type("f32[2,64]"))
    w = big.const("w", np.ones((64, 64), np.float32))
    big.output(*big.node("MatMul", [x, w], outputs=["y"]))
    text = print_graph(big.build())
    assert "%w: f32[64,64] = const\n" in text
    with pytest.raises(DSLSyntaxError, match="no inline data"):
        parse_graph(text)
    back = parse_graph(text, {"w": np.ones((64, 64), np.float32)})
    assert print_graph(back) == text
    assert print_graph(g.clone()) == print_graph(g)


def test_types_check_mode_catches_wrong_recorded_types():
    bad = TEXT.replace("%h: f32[batch,3]", "%h: f32[batch,5]")
    parse_graph(bad)  # as written: accepted
    with pytest.raises(GraphError, match=r"recorded as f32\[batch,5\] but its rule infers f32\[batch,3\]"):
        parse_graph(bad, types="check")


def test_verifier_reports_use_before_definition():
    g = _tiny()
    g.nodes.reverse()
    found = problems(g)
    assert any("reads %h (input 0) before it is defined" in p for p in found)
    with pytest.raises(GraphError, match="malformed after my_pass"):
        verify(g, stage="my_pass")


def test_verifier_reports_dangling_output_and_bad_attr():
    g = _tiny()
    g.outputs.append(Value("ghost"))
    g.nodes[1].attrs["alpha"] = 0.5
    found = problems(g)
    assert any("graph output %ghost is not defined" in p for p in found)
    assert any("unknown attribute 'alpha'" in p for p in found)


def test_clone_shares_weights_not_structure():
    g = _tiny()
    c = g.clone()
    assert c.constants[0].const is g.constants[0].const
    assert c.nodes[0] is not g.nodes[0] and c.nodes[0].inputs[1] is c.constants[0]
    c.nodes.pop()
    assert len(g.nodes) == 2


def test_builder_raises_at_the_node_that_breaks_a_rule():
    b = GraphBuilder("bad")
    x = b.input("x", parse_type("f32[batch,4]"))
    w = b.const("w", np.ones((5, 3), np.float32))
    with pytest.raises(ShapeError, match=r"node /enc/MatMul_7.*expects K to agree: got 4 \(a dim 1\) and 5"):
        b.node("MatMul", [x, w], name="/enc/MatMul_7")


def test_node_repr_and_qualified_ops():
    n = Node("Gelu", (), (), domain="com.microsoft", name="g")
    assert n.qualop == "com.microsoft::Gelu" and repr(n) == "Node(g: com.microsoft::Gelu)"
