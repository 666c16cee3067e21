"""The ``If`` meta-op: registration, the shape rule (constant condition, merged branch types,
errors), its numpy reference, the verifier and the printer."""

from __future__ import annotations

import numpy as np
import pytest

import metadef as md
from metadef.core.errors import ShapeError
from metadef.ir import Graph, GraphBuilder, print_graph, verify
from metadef.ops import Role, get_op, infer_types
from metadef.ops.defs.control import If, captured_start, merge_types
from metadef.shape import parse_type, sym

BOOL = parse_type("bool[]")


def body(name: str, ops: list[str], types: tuple[str, ...] = ("f32[n,3]",), const: float | None = None) -> Graph:
    """A branch over captured inputs of ``types``: ops applied in a chain to the first input
    (``Concat`` doubles the last axis; a ``const`` is added as a branch-local constant)."""
    b = GraphBuilder(name)
    ins = [b.input(f"x{i}", parse_type(t)) for i, t in enumerate(types)]
    v = ins[0]
    for op in ops:
        v, = b.node(op, [v, v], {"axis": -1}) if op == "Concat" else b.node(op, [v])
    if const is not None:
        v, = b.node("Add", [v, b.const("k", np.float32(const))])
    b.output(v)
    return b.build()


def attrs(then: Graph, other: Graph) -> dict:
    return {"then_branch": then, "else_branch": other}


def infer(cond: str, captured: list[str], then: Graph, other: Graph, cond_value=None) -> list[str]:
    types = [parse_type(cond), *map(parse_type, captured)]
    values = [cond_value] + [None] * len(captured)
    return [str(t) for t in infer_types(If, "/if", types, attrs(then, other), values)]


def test_registered_opaque_with_two_required_branches():
    assert get_op("If") is If
    assert If.role is Role.OPAQUE and If.semantics.opaque
    assert set(If.attrs) == {"then_branch", "else_branch"}
    assert all(spec.required for spec in If.attrs.values())
    assert captured_start(If) == 1 and captured_start(get_op("Relu")) is None


def test_equal_branch_types_are_kept():
    assert infer("bool[]", ["f32[n,3]"], body("t", ["Relu"]), body("e", ["Neg"])) == ["f32[n,3]"]


def test_a_known_condition_takes_the_chosen_branch_types():
    then, other = body("t", ["Relu"]), body("e", ["Concat"])
    assert infer("bool[]", ["f32[n,3]"], then, other, np.array(True)) == ["f32[n,3]"]
    assert infer("bool[1]", ["f32[n,3]"], then, other, np.array([False])) == ["f32[n,6]"]


def test_differing_dims_become_a_fresh_symbol_and_differing_ranks_an_unknown_rank():
    got, = infer("bool[]", ["f32[n,3]"], body("t", ["Relu"]), body("e", ["Concat"]))
    assert got.startswith("f32[n,if_")
    scalar = GraphBuilder("f")
    x = scalar.input("x0", parse_type("f32[n,3]"))
    scalar.output(*scalar.node("ReduceSum", [x], {"keepdims": 0}))
    assert infer("bool[]", ["f32[n,3]"], body("t", ["Relu"]), scalar.build()) == ["f32[?]"]
    assert str(merge_types(parse_type("f32[2,3]"), parse_type("f32[2,3]"), lambda: sym("u"))) == "f32[2,3]"


def test_branch_dtypes_must_agree_and_the_error_names_both():
    cast = GraphBuilder("e")
    x = cast.input("x0", parse_type("f32[n,3]"))
    cast.output(*cast.node("Cast", [x], {"to": 7}))
    with pytest.raises(ShapeError, match=r"f32\[n,3\] in then_branch but i64\[n,3\] in else_branch"):
        infer("bool[]", ["f32[n,3]"], body("t", ["Relu"]), cast.build())


def test_cond_must_hold_one_element():
    with pytest.raises(ShapeError, match="exactly one element"):
        infer("bool[2]", ["f32[n,3]"], body("t", ["Relu"]), body("e", ["Neg"]))


def test_cond_must_be_bool():
    with pytest.raises(md.MetadefError, match="bool"):
        infer("f32[]", ["f32[n,3]"], body("t", ["Relu"]), body("e", ["Neg"]))


def test_the_captured_count_must_match_the_branch_inputs():
    with pytest.raises(ShapeError, match="captures 2 values but then_branch takes 1"):
        infer("bool[]", ["f32[n,3]", "f32[n,3]"], body("t", ["Relu"]), body("e", ["Neg"]))


def test_concrete_captured_types_bind_the_branch_symbols():
    assert infer("bool[]", ["f32[5,3]"], body("t", ["Relu"]), body("e", ["Concat"]), np.array(False)) \
        == ["f32[5,6]"]
    with pytest.raises(ShapeError, match="captured input 0 has type f32\\[5,4\\]"):
        infer("bool[]", ["f32[5,4]"], body("t", ["Relu"]), body("e", ["Neg"]))


def test_no_captured_values_is_fine():
    b = GraphBuilder("c")
    b.output(b.const("one", np.ones(2, np.float32)))
    branch = b.build()
    assert [str(t) for t in infer_types(If, "/if", [BOOL], attrs(branch, branch))] == ["f32[2]"]


def test_the_reference_runs_the_chosen_branch_with_its_constants():
    then, other = body("t", ["Relu"], const=10.0), body("e", ["Neg"])
    x = np.array([[-1.0, 2.0, -3.0]], np.float32)
    got, = If.semantics.reference([np.array(True), x], attrs(then, other))
    np.testing.assert_array_equal(got, [[10.0, 12.0, 10.0]])
    got, = If.semantics.reference([np.array([False]), x], attrs(then, other))
    np.testing.assert_array_equal(got, -x)


def outer_graph(inner_cond: bool | None = None) -> Graph:
    """x -> If(c, x) whose else branch holds another If on a branch-computed condition."""
    inner = GraphBuilder("else")
    xi = inner.input("x0", parse_type("f32[n,3]"))
    s, = inner.node("ReduceSum", [xi], {"keepdims": 0})
    ci, = inner.node("Greater", [s, inner.const("zero", np.float32(0))])
    y, = inner.node("If", [ci, xi], attrs(body("it", ["Relu"]), body("ie", ["Neg"])), name="inner")
    inner.output(y)
    b = GraphBuilder("g")
    x, c = b.input("x", parse_type("f32[n,3]")), b.input("c", parse_type("bool[]"))
    out, = b.node("If", [c, x], attrs(body("t", ["Sigmoid"]), inner.build()), name="outer", outputs=["y"])
    b.output(out)
    return b.build()


def test_nested_ifs_run_on_the_reference_backend_and_verify():
    g = outer_graph()
    verify(g, types=True)
    sess = md.compile(g, target="reference")
    for x in (np.full((2, 3), 2.0, np.float32), np.full((4, 3), -2.0, np.float32)):
        np.testing.assert_allclose(sess.run({"x": x, "c": np.array(True)})["y"], 1 / (1 + np.exp(-x)), rtol=1e-6)
        want = np.maximum(x, 0) if x.sum() > 0 else -x
        np.testing.assert_array_equal(sess.run({"x": x, "c": np.array(False)})["y"], want)


def test_the_printer_nests_the_branches():
    text = print_graph(outer_graph())
    assert "%y: f32[n,3] = If(%c, %x) {then_branch=graph t(%x0: f32[n,3]) -> (%" in text
    assert "        graph it(%x0: f32[n,3])" not in text  # nested one level deeper each time
    assert "If(%Greater_1_out, %x0) {then_branch=graph it(" in text
