"""The optimization levels: random small graphs evaluate equal at every level; zoo models
optimized at every level still match ONNX Runtime; decisions and options are honoured."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import metadef as md
from metadef.core.errors import MetadefError
from metadef.ir import GraphBuilder, verify
from metadef.passes import LEVELS, optimize
from metadef.rewrite import DecisionLog
from metadef.shape import parse_type
from metadef.testing.oracle import compare_with_onnxruntime

UNARY = ["Relu", "Sigmoid", "Tanh", "Neg", "Abs", "Exp", "Identity"]
BINARY = ["Add", "Sub", "Mul", "Max", "Min"]


@st.composite
def small_graphs(draw):
    """A random DAG of elementwise, broadcast, reshape and matmul nodes over f32[2,4]."""
    b = GraphBuilder("rand")
    x = b.input("x", parse_type("f32[n,4]"))
    pool = [x]
    rng = np.random.default_rng(draw(st.integers(0, 1000)))
    for i in range(draw(st.integers(1, 10))):
        kind = draw(st.sampled_from(["unary", "binary", "const", "matmul", "transpose2"]))
        a = draw(st.sampled_from(pool))
        if kind == "unary":
            v, = b.node(draw(st.sampled_from(UNARY)), [a], name=f"u{i}")
        elif kind == "binary":
            other = draw(st.sampled_from(pool))
            v, = b.node(draw(st.sampled_from(BINARY)), [a, other], name=f"b{i}")
        elif kind == "const":
            c = b.const(f"c{i}", rng.standard_normal(4).astype(np.float32))
            v, = b.node(draw(st.sampled_from(BINARY)), [a, c], name=f"k{i}")
        elif kind == "matmul":
            w = b.const(f"w{i}", (rng.standard_normal((4, 4)) * 0.5).astype(np.float32))
            v, = b.node("MatMul", [a, w], name=f"m{i}")
        else:
            t, = b.node("Transpose", [a], {"perm": (1, 0)}, name=f"t{i}a")
            v, = b.node("Transpose", [t], {"perm": (1, 0)}, name=f"t{i}b")
        pool.append(v)
    outs = draw(st.lists(st.sampled_from(pool[1:] or pool), min_size=1, max_size=2, unique_by=id))
    b.output(*outs)
    return b.build()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_graphs(), st.sampled_from(["safe", "moderate", "aggressive"]))
def test_random_graphs_evaluate_equal_at_every_level(graph, level):
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    want = md.compile(graph).run({"x": x})
    new = optimize(graph, level=level)
    verify(new, types=True)
    got = md.compile(new).run({"x": x})
    assert list(got) == list(want)
    for k in want:
        if level == "safe":
            np.testing.assert_array_equal(got[k], want[k])
        else:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)


def test_unknown_level_and_unmatched_no_fuse_are_clear_errors():
    g = md.import_onnx(md.zoo.build("mlp"))
    with pytest.raises(MetadefError, match="unknown optimization level 'fast'; choose one of"):
        optimize(g, level="fast")
    with pytest.raises(MetadefError, match="no node name matches"):
        optimize(g, level="aggressive", no_fuse=["/nothing/*"])
    assert set(LEVELS) >= {"safe", "moderate", "aggressive"}


@pytest.mark.slow
@pytest.mark.parametrize("level", ["safe", "moderate", "aggressive"])
@pytest.mark.parametrize("name", ["mlp", "resnet50", "mobilenetv2", "bert"])
def test_zoo_models_match_onnxruntime_at_every_level(name, level):
    proto = md.zoo.build(name)
    graph = optimize(md.import_onnx(proto, name=name), level=level)
    verify(graph, types=True)
    dims = {"batch": 2, "seq": 37} if name == "bert" else {"batch": 2}
    check = compare_with_onnxruntime(proto, md.zoo.describe(name).example_inputs(**dims), graph=graph)
    assert check.ok, check.outputs


@pytest.mark.slow
def test_resnet_and_mobilenet_have_no_batchnorm_and_no_loose_activation():
    for name in ("resnet50", "mobilenetv2"):
        g = optimize(md.import_onnx(md.zoo.build(name)), level="aggressive")
        ops = g.op_counts()
        assert "BatchNormalization" not in ops
        assert "Relu" not in ops and "Clip" not in ops, ops


@pytest.mark.slow
def test_bert_patterns_are_recognized():
    g = optimize(md.import_onnx(md.zoo.build("bert")), level="moderate")
    ops = g.op_counts()
    assert ops.get("ai.metadef::Attention") == 12
    assert ops.get("LayerNormalization") == 25
    assert ops.get("Gelu") == 12
    assert ops.get("Shape") == 1  # the position-embedding Slice needs seq at run time
    assert "Erf" not in ops and "Concat" not in ops


def test_no_fuse_and_disable_rule_change_the_result_and_say_so():
    g = md.import_onnx(md.zoo.build("mlp"))
    full_log = DecisionLog()
    full = optimize(g, level="aggressive", log=full_log)
    assert full_log.taken()
    first = full_log.taken()[-1]
    log = DecisionLog()
    kept = optimize(g, level="aggressive", disable_rules=[first.rule], log=log)
    assert any(f"rule {first.rule} is disabled" in line for line in log.lines())
    assert kept.op_counts() != full.op_counts()
    log = DecisionLog()
    optimize(g, level="aggressive", no_fuse=[first.at], log=log)
    assert any(f"{first.at} is marked no_fuse" in line for line in log.lines())
