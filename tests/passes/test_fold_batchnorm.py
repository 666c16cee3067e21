"""fold_batchnorm: Before/Expected IR per rule, decisions taken and refused, numerics, the zoo."""

from collections import Counter

import numpy as np
import pytest

import metadef as md
from metadef.ir import Graph, parse_graph, print_graph, verify
from metadef.passes.base import PassContext
from metadef.passes.fold_batchnorm import batchnorm_rules, fold_batchnorm
from metadef.rewrite import RewriteOptions
from metadef.testing.oracle import compare_with_onnxruntime

RNG = np.random.default_rng(0)
EPS = 1e-3


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _stats(c):
    return {"s": _f32(c), "b": _f32(c), "mu": _f32(c), "var": (RNG.random(c) + 0.5).astype(np.float32)}


def _folded(consts, w, axis, bias=None):
    """The reference fold, in float64: (w * s along axis, bias * s + B - mu * s) as float32."""
    s = consts["s"].astype(np.float64) / np.sqrt(consts["var"].astype(np.float64) + EPS)
    shape = [1] * w.ndim
    shape[axis] = s.size
    t = consts["b"] - consts["mu"].astype(np.float64) * s
    b = t if bias is None else bias.astype(np.float64) * s + t
    return (w.astype(np.float64) * s.reshape(shape)).astype(np.float32), b.astype(np.float32)


BN_CONSTS = """  %s: f32[{c}] = const
  %b: f32[{c}] = const
  %mu: f32[{c}] = const
  %var: f32[{c}] = const
"""
BN = "BatchNormalization(%h, %s, %b, %mu, %var) {{epsilon=0.001}} @bn"


def _run(g: Graph, feeds):
    return md.compile(g, target="reference").run(feeds)


def _check(before: Graph, expected: str, consts, feeds, log_lines):
    ctx = PassContext()
    text = print_graph(before)
    after = fold_batchnorm(before, ctx)
    verify(after, types=True)
    assert print_graph(before) == text, "the input graph was mutated"
    assert print_graph(after) == print_graph(parse_graph(expected, constants=consts))
    assert ctx.log.lines() == log_lines
    want, got = _run(before, feeds), _run(after, feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5)
    return after


# ------------------------------------------------------------------------------- Conv

CONV_BEFORE = """graph g(%x: f32[n,4,8,8]) -> (%y) {{
  %w: f32[4,2,3,3] = const
{bias_decl}{bn}  %h: f32[n,4,4,4] = Conv(%x, %w{bias}) {{dilations=[2,2], group=2, pads=[2,2,2,2], strides=[2,2]}} @conv
  %y: f32[n,4,4,4] = {BN}
  return %y
}}
"""

CONV_EXPECTED = """graph g(%x: f32[n,4,8,8]) -> (%y) {{
  %w_bn: f32[4,2,3,3] = const
  %{bias_name}: f32[4] = const
  %y: f32[n,4,4,4] = Conv(%x, %w_bn, %{bias_name}) {{dilations=[2,2], group=2, pads=[2,2,2,2], strides=[2,2]}} @conv_bn
  return %y
}}
"""


@pytest.mark.parametrize("with_bias", [False, True])
def test_fold_into_conv(with_bias):
    consts = {"w": _f32(4, 2, 3, 3), **_stats(4)}
    if with_bias:
        consts["cb"] = _f32(4)
    before = parse_graph(CONV_BEFORE.format(
        bias_decl="  %cb: f32[4] = const\n" if with_bias else "", bn=BN_CONSTS.format(c=4),
        bias=", %cb" if with_bias else "", BN=BN.format()), constants=consts)
    w, b = _folded(consts, consts["w"], 0, consts.get("cb"))
    bias_name = "cb_bn" if with_bias else "conv_bias_bn"
    _check(before, CONV_EXPECTED.format(bias_name=bias_name), {"w_bn": w, bias_name: b},
           {"x": _f32(2, 4, 8, 8)}, ["taken fold_bn_into_conv at bn (bn, conv)"])


# ------------------------------------------------------------------------------- Gemm

GEMM_BEFORE = """graph g(%x: f32[n,3]) -> (%y) {{
  %w: f32[{wshape}] = const
{c_decl}{bn}  %h: f32[n,4] = Gemm(%x, %w{c}) {{alpha=0.5, beta={beta}, transB={trans_b}}} @gemm
  %y: f32[n,4] = {BN}
  return %y
}}
"""

GEMM_EXPECTED = """graph g(%x: f32[n,3]) -> (%y) {{
  %w_bn: f32[{wshape}] = const
  %{c_name}: f32[{cshape}] = const
  %y: f32[n,4] = Gemm(%x, %w_bn, %{c_name}) {{alpha=0.5, beta=1.0, transB={trans_b}}} @gemm_bn
  return %y
}}
"""


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("c_shape", [None, (4,), (1, 4)])
def test_fold_into_gemm(trans_b, c_shape):
    wshape = (4, 3) if trans_b else (3, 4)
    consts = {"w": _f32(*wshape), **_stats(4)}
    beta = 2.0
    if c_shape is not None:
        consts["c"] = _f32(*c_shape)
    before = parse_graph(GEMM_BEFORE.format(
        wshape=",".join(map(str, wshape)), bn=BN_CONSTS.format(c=4), BN=BN.format(), beta=beta, trans_b=trans_b,
        c_decl=f"  %c: f32[{','.join(map(str, c_shape))}] = const\n" if c_shape else "",
        c=", %c" if c_shape else ""), constants=consts)
    w, b = _folded(consts, consts["w"], 0 if trans_b else 1, None if c_shape is None else beta * consts["c"])
    c_name = "c_bn" if c_shape else "gemm_bias_bn"
    expected = GEMM_EXPECTED.format(wshape=",".join(map(str, wshape)), c_name=c_name,
                                    cshape=",".join(map(str, b.shape)), trans_b=trans_b)
    _check(before, expected, {"w_bn": w, c_name: b}, {"x": _f32(5, 3)},
           ["taken fold_bn_into_gemm at bn (bn, gemm)"])


# ----------------------------------------------------------------------------- MatMul

MATMUL_BEFORE = """graph g(%x: f32[n,3]) -> (%y) {{
  %w: f32[3,4] = const
{bn}  %h: f32[n,4] = MatMul(%x, %w) @mm
  %y: f32[n,4] = {BN}
  return %y
}}
"""

MATMUL_EXPECTED = """graph g(%x: f32[n,3]) -> (%y) {
  %w_bn: f32[3,4] = const
  %mm_bias_bn: f32[4] = const
  %mm_bn_out: f32[n,4] = MatMul(%x, %w_bn) @mm_bn
  %y: f32[n,4] = Add(%mm_bn_out, %mm_bias_bn) @mm_bn_add
  return %y
}
"""


def _matmul_graph(**overrides) -> tuple[Graph, dict]:
    consts = {"w": _f32(3, 4), **_stats(4), **overrides}
    return parse_graph(MATMUL_BEFORE.format(bn=BN_CONSTS.format(c=4), BN=BN.format()), constants=consts), consts


def test_fold_into_matmul_gives_matmul_plus_bias():
    before, consts = _matmul_graph()
    w, b = _folded(consts, consts["w"], 1)
    _check(before, MATMUL_EXPECTED, {"w_bn": w, "mm_bias_bn": b}, {"x": _f32(5, 3)},
           ["taken fold_bn_into_matmul at bn (bn, mm)"])


def test_matmul_with_a_rank3_output_is_refused():
    text = """graph g(%x: f32[n,4,3]) -> (%y) {
  %w: f32[3,5] = const
  %s: f32[4] = const
  %b: f32[4] = const
  %mu: f32[4] = const
  %var: f32[4] = const
  %h: f32[n,4,5] = MatMul(%x, %w) @mm
  %y: f32[n,4,5] = BatchNormalization(%h, %s, %b, %mu, %var) @bn
  return %y
}"""
    g = parse_graph(text, constants={"w": _f32(3, 5), **_stats(4)})
    ctx = PassContext()
    after = fold_batchnorm(g, ctx)
    assert print_graph(after) == print_graph(g)
    assert ctx.log.lines() == ["refused fold_bn_into_matmul at bn: BatchNormalization normalizes axis 1 of "
                               "the rank-3 MatMul output %h, which is not the weight's columns"]


# --------------------------------------------------------------------------- refusals


def _refusal(g: Graph, options: RewriteOptions | None = None) -> list[str]:
    ctx = PassContext(options=options or RewriteOptions())
    after = fold_batchnorm(g, ctx)
    verify(after, types=True)
    assert Counter(n.op for n in after.nodes) == Counter(n.op for n in g.nodes)
    return ctx.log.lines()


def test_producer_with_two_consumers_is_refused():
    text = MATMUL_BEFORE.format(bn=BN_CONSTS.format(c=4), BN=BN.format()).replace(
        "-> (%y)", "-> (%y, %z)").replace("  return %y", "  %z: f32[n,4] = Relu(%h) @relu\n  return %y, %z")
    g = parse_graph(text, constants={"w": _f32(3, 4), **_stats(4)})
    assert _refusal(g) == ["refused fold_bn_into_matmul at bn: %h has 2 consumers"]


def test_no_fuse_marks_and_disabled_rule_are_reasons():
    g, _ = _matmul_graph()
    g.node("mm").meta["no_fuse"] = True
    assert _refusal(g) == ["refused fold_bn_into_matmul at bn: mm is marked no_fuse"]
    g.node("mm").meta.clear()
    g.node("bn").meta["no_fuse"] = True
    assert _refusal(g) == ["refused fold_bn_into_matmul at bn: bn is marked no_fuse"]
    g.node("bn").meta.clear()
    disabled = RewriteOptions(disabled=frozenset({"fold_bn_into_matmul"}))
    assert _refusal(g, disabled) == ["refused fold_bn_into_matmul at bn: rule fold_bn_into_matmul is disabled"]


def test_statistics_and_weights_must_be_constants():
    text = MATMUL_BEFORE.format(bn=BN_CONSTS.format(c=4), BN=BN.format())
    as_input = text.replace("  %var: f32[4] = const\n", "").replace("(%x: f32[n,3])", "(%x: f32[n,3], %var: f32[4])")
    g = parse_graph(as_input, constants={"w": _f32(3, 4), **_stats(4)})
    assert _refusal(g) == ["refused fold_bn_into_matmul at bn: BatchNormalization var %var is not a constant"]
    w_input = text.replace("  %w: f32[3,4] = const\n", "").replace("(%x: f32[n,3])", "(%x: f32[n,3], %w: f32[3,4])")
    g = parse_graph(w_input, constants=_stats(4))
    assert _refusal(g) == ["refused fold_bn_into_matmul at bn: the MatMul weight %w is not a constant"]


def test_rule_names():
    assert [r.name for r in batchnorm_rules] == ["fold_bn_into_conv", "fold_bn_into_gemm", "fold_bn_into_matmul"]


# ------------------------------------------------------------------------------- zoo

ZOO_COUNTS = {  # (nodes before, nodes after)
    "resnet50": (175, 122),
    "mobilenetv2": (152, 100),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ZOO_COUNTS))
def test_zoo_has_no_batchnorm_left_and_matches_onnxruntime(name):
    proto = md.zoo.build(name)
    graph = md.import_onnx(proto)
    ctx = PassContext()
    after = fold_batchnorm(graph, ctx)
    verify(after, types=True)
    ops = Counter(n.op for n in after.nodes)
    assert "BatchNormalization" not in ops
    assert (len(graph.nodes), len(after.nodes)) == ZOO_COUNTS[name]
    assert len(ctx.log.taken("fold_bn_into_conv")) == ops["Conv"] and not ctx.log.refused()
    check = compare_with_onnxruntime(proto, md.zoo.describe(name).example_inputs(batch=2), graph=after)
    assert check.ok, [o for o in check.outputs if not o.ok]
