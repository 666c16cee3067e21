"""The rewrite engine: patterns, fixpoint, soft refusals, disabled rules, new graphs."""

import numpy as np
import pytest

import metadef as md
from metadef.core.errors import GraphError
from metadef.ir import parse_graph, print_graph, verify
from metadef.ops import Role
from metadef.rewrite import (
    DecisionLog,
    GraphEditor,
    Refusal,
    RewriteOptions,
    Rule,
    const,
    match,
    op,
    rewrite,
    var,
)

BEFORE = """graph g(%x: f32[n,4], %b: f32[4]) -> (%y, %z) {
  %s: f32[n,4] = Add(%x, %b) @add
  %y: f32[n,4] = Relu(%s) @relu
  %z: f32[n,4] = Neg(%s) @neg
  return %y, %z
}
"""


ADD_RELU = Rule("add_relu", op("Relu", op("Add", var("x"), var("b"), name="add", single_use=True),
                               name="relu"), lambda m, ed: ed.add("Relu", [m.value("x")], name="r2")[0])


def test_soft_condition_refuses_with_a_reason_and_keeps_the_graph():
    g = parse_graph(BEFORE)
    new, log = rewrite(g, [ADD_RELU], "fuse")
    assert print_graph(new) == print_graph(g)
    assert log.lines() == ["refused add_relu at relu: %s has 2 consumers"]


def test_disabled_rule_and_no_fuse_are_reasons():
    g = parse_graph(BEFORE.replace("  %z: f32[n,4] = Neg(%s) @neg\n", "").replace("(%y, %z)", "(%y)")
                    .replace("return %y, %z", "return %y"))
    _, log = rewrite(g, [ADD_RELU], "fuse", options=RewriteOptions(disabled=frozenset({"add_relu"})))
    assert log.lines() == ["refused add_relu at relu: rule add_relu is disabled"]
    g.node("add").meta["no_fuse"] = True
    _, log = rewrite(g, [ADD_RELU], "fuse")
    assert log.lines() == ["refused add_relu at relu: add is marked no_fuse"]
    g.node("add").meta.clear()
    new, log = rewrite(g, [ADD_RELU], "fuse")
    assert log.lines() == ["taken add_relu at relu (relu, add)"]
    assert [n.op for n in new.nodes] == ["Relu"] and new.outputs[0].name == "y"


def test_input_graph_is_never_mutated_and_fixpoint_is_reached():
    text = """graph g(%x: f32[n]) -> (%y) {
  %a: f32[n] = Identity(%x)
  %b: f32[n] = Identity(%a)
  %c: f32[n] = Identity(%b)
  %y: f32[n] = Relu(%c)
  return %y
}
"""
    g = parse_graph(text)
    text = print_graph(g)
    rules = [Rule("drop_identity", op("Identity", var("v")), lambda m, ed: m.value("v"), fuses=False)]
    new, log = rewrite(g, rules, "cleanup")
    assert print_graph(g) == text  # untouched
    assert [n.op for n in new.nodes] == ["Relu"] and len(log.taken()) == 3
    verify(new, types=True)


def test_commutative_const_and_role_patterns():
    g = parse_graph("""graph g(%x: f32[n]) -> (%y) {
  %k: f32[] = const [2.0]
  %m: f32[n] = Mul(%k, %x) @mul
  %y: f32[n] = Sigmoid(%m) @sig
  return %y
}""")
    pat = op(None, op("Mul", var("x"), const("k"), name="mul", commutative=True), role=Role.ELEMENTWISE)
    m = match(pat, g.value("y"), lambda v: 1)
    assert m is not None and m.value("x").name == "x" and float(m.value("k").const) == 2.0
    assert match(op("Mul", var("x"), const("k")), g.value("m"), lambda v: 1) is None  # order matters
    assert match(op(None, role=Role.CONTRACTION), g.value("y"), lambda v: 1) is None


def test_refusal_from_build_is_logged():
    g = parse_graph(BEFORE)
    rules = [Rule("never", op("Neg", var("v")), lambda m, ed: Refusal("weights are not constant"))]
    _, log = rewrite(g, rules, "p")
    assert log.lines() == ["refused never at neg: weights are not constant"]


def test_replacing_a_graph_output_keeps_its_name_and_numerics():
    g = parse_graph(BEFORE)
    rules = [Rule("neg_to_mul", op("Neg", var("v"), name="neg"),
                  lambda m, ed: ed.add("Mul", [m.value("v"), ed.const("minus1", np.float32(-1))], name="negmul")[0],
                  fuses=False)]
    new, _ = rewrite(g, rules, "p")
    assert [v.name for v in new.outputs] == ["y", "z"]
    feeds = {"x": np.arange(8, dtype=np.float32).reshape(2, 4) - 3, "b": np.ones(4, np.float32)}
    want = md.compile(g).run(feeds)
    got = md.compile(new).run(feeds)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


def test_editor_refuses_dtype_changing_replacement_and_detects_cycles():
    g = parse_graph("""graph g(%x: f32[n]) -> (%y) {
  %c: i64[n] = Cast(%x) {to=7}
  %y: f32[n] = Relu(%x)
  return %y
}""")
    ed = GraphEditor(g.clone())
    with pytest.raises(GraphError, match="dtypes differ"):
        ed.replace_uses(ed.graph.value("y"), ed.graph.value("c"))


def test_decision_log_jsonl(tmp_path):
    log = DecisionLog()
    log.record("fuse", "r", "n1", ["n1", "n2"], True)
    log.record("fuse", "r", "n3", ["n3"], False, "why")
    log.record("fuse", "r", "n3", ["n3"], False, "why")  # refusals are recorded once
    path = log.write_jsonl(tmp_path / "d.jsonl")
    rows = path.read_text().splitlines()
    assert len(rows) == 2 and '"taken": false' in rows[1] and '"reason": "why"' in rows[1]


def test_debug_flag_logs_each_decision(monkeypatch, caplog):
    monkeypatch.setenv("METADEF_DEBUG", "1")
    with caplog.at_level("INFO", logger="metadef.fusion"):
        rewrite(parse_graph(BEFORE), [ADD_RELU], "fuse")
    assert "[fuse] refused add_relu at relu: %s has 2 consumers" in caplog.text
