"""recognize_patterns: Before/Expected IR per rule and variant, refusals, numerics, ONNX export
(run in ONNX Runtime where the op is standard), and the effect on the zoo."""

import time
from collections import Counter

import numpy as np
import onnx
import pytest

import metadef as md
from metadef.frontends.onnx import to_onnx
from metadef.ir import Graph, parse_graph, print_graph, verify
from metadef.ir.verify import problems
from metadef.passes.base import PassContext
from metadef.passes.fold_batchnorm import fold_batchnorm
from metadef.passes.recognize_patterns import recognition_rules, recognize_patterns
from metadef.rewrite import RewriteOptions
from metadef.testing.oracle import compare_with_onnxruntime, run_onnxruntime

RNG = np.random.default_rng(0)


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _recognize(g: Graph, options: RewriteOptions | None = None) -> tuple[Graph, list[str]]:
    ctx = PassContext(options=options or RewriteOptions())
    text = print_graph(g)
    after = recognize_patterns(g, ctx)
    verify(after, types=True)
    assert print_graph(g) == text, "the input graph was mutated"
    return after, ctx.log.lines()


def _same_numbers(before: Graph, after: Graph, feeds, rtol=1e-5):
    want = md.compile(before, target="reference").run(feeds)
    got = md.compile(after, target="reference").run(feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=rtol, atol=1e-5)


def _ops(g: Graph) -> list[str]:
    return [n.qualop for n in g.nodes]


# -------------------------------------------------------------------------- LayerNorm


def _layernorm(square="pow", normalize="div", gamma=True, beta=True, axes=(-1,)) -> str:
    """A decomposed LayerNorm over x: f32[n,4,8] in one of its variants."""
    red = "n,1,1" if len(axes) == 2 else "n,4,1"
    lines = [f"  %axes: i64[{len(axes)}] = const [{', '.join(map(str, axes))}]",
             "  %two: f32[] = const [2.0]", "  %eps: f32[] = const [0.001]"]
    lines += ["  %gamma: f32[8] = const"] * gamma + ["  %beta: f32[8] = const"] * beta
    lines += [f"  %mean: f32[{red}] = ReduceMean(%x, %axes) @mean",
              "  %d: f32[n,4,8] = Sub(%x, %mean) @sub",
              "  %sq: f32[n,4,8] = " + ("Pow(%d, %two) @pow" if square == "pow" else "Mul(%d, %d) @pow"),
              f"  %var: f32[{red}] = ReduceMean(%sq, %axes) @var",
              f"  %ve: f32[{red}] = Add(%eps, %var) @add_eps",
              f"  %std: f32[{red}] = Sqrt(%ve) @sqrt"]
    last = "nrm"
    if normalize == "div":
        lines.append("  %nrm: f32[n,4,8] = Div(%d, %std) @div")
    else:
        lines += [f"  %inv: f32[{red}] = Reciprocal(%std) @inv", "  %nrm: f32[n,4,8] = Mul(%inv, %d) @div"]
    if gamma:
        lines.append("  %g: f32[n,4,8] = Mul(%gamma, %nrm) @mul")
        last = "g"
    if beta:
        lines.append(f"  %b: f32[n,4,8] = Add(%{last}, %beta) @add")
        last = "b"
    body = "\n".join(lines).replace(f"%{last}: ", "%y: ").replace(f"%{last})", "%y)")
    return f"graph g(%x: f32[n,4,8]) -> (%y) {{\n{body}\n  return %y\n}}\n"


LN_CONSTS = {"gamma": _f32(8) + 1, "beta": _f32(8)}
LN_EXPECTED = """graph g(%x: f32[n,4,8]) -> (%y) {{
{consts}  %y: f32[n,4,8] = LayerNormalization(%x, {args}) {{axis={axis}, epsilon={eps}}} @{root}/LayerNormalization
  return %y
}}
"""
EPS32 = float(np.float32(0.001))


@pytest.mark.parametrize("square", ["pow", "mul"])
@pytest.mark.parametrize("normalize", ["div", "reciprocal"])
@pytest.mark.parametrize("gamma,beta", [(True, True), (True, False), (False, True), (False, False)])
def test_layernorm_variants(square, normalize, gamma, beta):
    g = parse_graph(_layernorm(square, normalize, gamma, beta), constants=LN_CONSTS)
    after, log = _recognize(g)
    root = "add" if beta else "mul" if gamma else "div"
    scale = "gamma" if gamma else "layernorm_unit_scale"
    consts = {"gamma": LN_CONSTS["gamma"], "beta": LN_CONSTS["beta"], "layernorm_unit_scale": np.ones(8, np.float32)}
    decls = [f"  %{scale}: f32[8] = const\n"] + ["  %beta: f32[8] = const\n"] * beta
    decls = "".join(decls if gamma else decls[::-1])  # the unit scale is made after the graph's own
    args = f"%{scale}" + (", %beta" if beta else "")
    expected = LN_EXPECTED.format(consts=decls, args=args, axis=2, eps=EPS32, root=root)
    assert print_graph(after) == print_graph(parse_graph(expected, constants=consts))
    assert len(log) == 1 and log[0].startswith(f"taken recognize_layernorm at {root} (")
    _same_numbers(g, after, {"x": _f32(3, 4, 8)})


def test_layernorm_over_two_trailing_axes_broadcasts_gamma():
    g = parse_graph(_layernorm(axes=(-2, 2)), constants=LN_CONSTS)
    after, log = _recognize(g)
    node, = after.nodes
    assert node.op == "LayerNormalization" and node.attrs["axis"] == 1
    assert node.inputs[1].type.shape == (4, 8) and log[0].startswith("taken recognize_layernorm at add")
    _same_numbers(g, after, {"x": _f32(3, 4, 8)})


@pytest.mark.parametrize("change", [
    ("%two: f32[] = const [2.0]", "%two: f32[] = const [3.0]"),            # not a square
    ("%axes: i64[1] = const [-1]", "%axes: i64[1] = const [1]"),          # not the trailing axis
])
def test_layernorm_needs_the_right_constants(change):
    g = parse_graph(_layernorm().replace(*change), constants=LN_CONSTS, types="infer")
    after, log = _recognize(g)
    assert print_graph(after) == print_graph(g) and log == []


def test_layernorm_refusals():
    text = _layernorm().replace("-> (%y)", "-> (%y, %d)").replace("return %y", "return %y, %d")
    _, log = _recognize(parse_graph(text, constants=LN_CONSTS))
    assert log == ["refused recognize_layernorm at add: %d has 3 consumers (1 outside the pattern)"]
    g = parse_graph(_layernorm(), constants=LN_CONSTS)
    g.node("sqrt").meta["no_fuse"] = True
    _, log = _recognize(g)  # the engine checks no_fuse before a rule can defer: each root reports it
    assert log == [f"refused recognize_layernorm at {root}: sqrt is marked no_fuse" for root in ("div", "mul", "add")]
    g.node("sqrt").meta.clear()
    after, log = _recognize(g, RewriteOptions(disabled=frozenset({"recognize_layernorm"})))
    assert log == [f"refused recognize_layernorm at {root}: rule recognize_layernorm is disabled"
                   for root in ("div", "mul", "add")]
    assert len(after.nodes) == len(g.nodes)


# ------------------------------------------------------------------------ activations

ERF_GELU = {
    "mul_last": ["%a: f32[n,8] = Div(%x, %c)", "%e: f32[n,8] = Erf(%a)", "%p: f32[n,8] = Add(%e, %one)",
                 "%t: f32[n,8] = Mul(%x, %p)", "%y: f32[n,8] = Mul(%t, %half) @act"],
    "mul_first": ["%a: f32[n,8] = Mul(%x, %cinv)", "%e: f32[n,8] = Erf(%a)", "%p: f32[n,8] = Add(%one, %e)",
                  "%t: f32[n,8] = Mul(%half, %x)", "%y: f32[n,8] = Mul(%p, %t) @act"],
    "half_into_p": ["%a: f32[n,8] = Div(%x, %c)", "%e: f32[n,8] = Erf(%a)", "%p: f32[n,8] = Add(%e, %one)",
                    "%t: f32[n,8] = Mul(%p, %half)", "%y: f32[n,8] = Mul(%x, %t) @act"],
    "div_by_two": ["%a: f32[n,8] = Div(%x, %c)", "%e: f32[n,8] = Erf(%a)", "%p: f32[n,8] = Add(%e, %one)",
                   "%t: f32[n,8] = Mul(%x, %p)", "%y: f32[n,8] = Div(%t, %two) @act"],
}
TANH_GELU = {
    "pow": ["%x3: f32[n,8] = Pow(%x, %three)", "%k3: f32[n,8] = Mul(%k, %x3)", "%in: f32[n,8] = Add(%x, %k3)",
            "%s: f32[n,8] = Mul(%in, %s2pi)", "%th: f32[n,8] = Tanh(%s)", "%p: f32[n,8] = Add(%th, %one)",
            "%t: f32[n,8] = Mul(%x, %p)", "%y: f32[n,8] = Mul(%t, %half) @act"],
    "muls": ["%x2: f32[n,8] = Mul(%x, %x)", "%x3: f32[n,8] = Mul(%x2, %x)", "%k3: f32[n,8] = Mul(%x3, %k)",
             "%in: f32[n,8] = Add(%k3, %x)", "%s: f32[n,8] = Mul(%s2pi, %in)", "%th: f32[n,8] = Tanh(%s)",
             "%p: f32[n,8] = Add(%one, %th)", "%t: f32[n,8] = Mul(%half, %x)", "%y: f32[n,8] = Mul(%t, %p) @act"],
}
SCALARS = {"c": np.sqrt(2.0), "cinv": 1 / np.sqrt(2.0), "one": 1.0, "half": 0.5, "two": 2.0, "three": 3.0,
           "six": 6.0, "sixth": 1 / 6, "zero": 0.0, "k": 0.044715, "s2pi": np.sqrt(2 / np.pi)}


def _activation(lines: list[str], scalars=SCALARS) -> Graph:
    consts = "".join(f"  %{k}: f32[] = const\n" for k in scalars)
    body = "".join(f"  {line}\n" for line in lines)
    return parse_graph(f"graph g(%x: f32[n,8]) -> (%y) {{\n{consts}{body}  return %y\n}}",
                       constants={k: np.asarray(v, np.float32) for k, v in scalars.items()})


def _single(op: str, attrs: str = "") -> str:
    node = f"%y: f32[n,8] = {op}(%x){attrs} @act/{op.split('::')[-1]}"
    return f"graph g(%x: f32[n,8]) -> (%y) {{\n  {node}\n  return %y\n}}\n"


@pytest.mark.parametrize("form", sorted(ERF_GELU))
def test_gelu_erf_forms(form):
    g = _activation(ERF_GELU[form])
    after, log = _recognize(g)
    assert print_graph(after) == print_graph(parse_graph(_single("Gelu", ' {approximate="none"}')))
    assert after.opset[""] == 21 and log[0].startswith("taken recognize_gelu at act")
    _same_numbers(g, after, {"x": 3 * _f32(4, 8)})


@pytest.mark.parametrize("form", sorted(TANH_GELU))
def test_gelu_tanh_forms(form):
    g = _activation(TANH_GELU[form])
    after, _ = _recognize(g)
    assert print_graph(after) == print_graph(parse_graph(_single("Gelu", ' {approximate="tanh"}')))
    _same_numbers(g, after, {"x": 3 * _f32(4, 8)})


def test_gelu_constants_are_checked():
    off = {**SCALARS, "c": np.sqrt(2.0) * (1 + 1e-5)}
    g = _activation(ERF_GELU["mul_last"], off)
    after, log = _recognize(g)
    assert len(after.nodes) == len(g.nodes) and log == []


def test_gelu_refuses_when_an_interior_value_escapes():
    g = _activation([*ERF_GELU["mul_last"], "%z: f32[n,8] = Neg(%e)"])
    g = parse_graph(print_graph(g).replace("-> (%y)", "-> (%y, %z)").replace("return %y", "return %y, %z"),
                    constants={k: np.asarray(v, np.float32) for k, v in SCALARS.items()})
    _, log = _recognize(g)
    assert log == ["refused recognize_gelu at act: %e has 2 consumers (1 outside the pattern)"]


@pytest.mark.parametrize("lines", [["%s: f32[n,8] = Sigmoid(%x)", "%y: f32[n,8] = Mul(%x, %s) @act"],
                                   ["%s: f32[n,8] = Sigmoid(%x)", "%y: f32[n,8] = Mul(%s, %x) @act"]])
def test_silu(lines):
    g = _activation(lines, {})
    after, log = _recognize(g)
    assert print_graph(after) == print_graph(parse_graph(_single("ai.metadef::SiLU")))
    assert log == ["taken recognize_silu at act (act, Sigmoid_0)"] and after.opset["ai.metadef"] == 1
    _same_numbers(g, after, {"x": _f32(4, 8)})


def test_silu_of_another_value_is_not_silu():
    g = _activation(["%n: f32[n,8] = Neg(%x)", "%s: f32[n,8] = Sigmoid(%n)", "%y: f32[n,8] = Mul(%x, %s) @act"], {})
    assert _recognize(g)[1] == []


HARDSWISH = {
    "hardsigmoid": ["%h: f32[n,8] = HardSigmoid(%x) {alpha=0.16666667, beta=0.5}", "%y: f32[n,8] = Mul(%h, %x) @act"],
    "div_after": ["%a: f32[n,8] = Add(%x, %three)", "%r: f32[n,8] = Clip(%a, %zero, %six)",
                  "%m: f32[n,8] = Mul(%x, %r)", "%y: f32[n,8] = Div(%m, %six) @act"],
    "mul_after": ["%a: f32[n,8] = Add(%three, %x)", "%r: f32[n,8] = Clip(%a, %zero, %six)",
                  "%m: f32[n,8] = Mul(%r, %x)", "%y: f32[n,8] = Mul(%sixth, %m) @act"],
    "div_before": ["%a: f32[n,8] = Add(%x, %three)", "%r: f32[n,8] = Clip(%a, %zero, %six)",
                   "%m: f32[n,8] = Div(%r, %six)", "%y: f32[n,8] = Mul(%x, %m) @act"],
    "mul_before": ["%a: f32[n,8] = Add(%x, %three)", "%r: f32[n,8] = Clip(%a, %zero, %six)",
                   "%m: f32[n,8] = Mul(%r, %sixth)", "%y: f32[n,8] = Mul(%m, %x) @act"],
}


@pytest.mark.parametrize("form", sorted(HARDSWISH))
def test_hardswish_forms(form):
    g = _activation(HARDSWISH[form])
    after, log = _recognize(g)
    assert print_graph(after) == print_graph(parse_graph(_single("HardSwish")))
    assert log[0].startswith("taken recognize_hardswish at act")
    _same_numbers(g, after, {"x": 4 * _f32(4, 8)})


def test_hardsigmoid_with_other_constants_is_not_hardswish():
    g = _activation(["%h: f32[n,8] = HardSigmoid(%x) {alpha=0.2, beta=0.5}", "%y: f32[n,8] = Mul(%h, %x) @act"], {})
    assert _recognize(g)[1] == []


# -------------------------------------------------------------------------- attention

ATTENTION = """graph g(%q: f32[b,2,s,4], %kh: f32[b,s,2,4], %v: f32[b,2,s,3], %mask: f32[{mask}]) -> (%y) {{
  %c: f32[] = const [{c}]
  %kt: f32[b,2,4,s] = Transpose(%kh) {{perm=[0,2,3,1]}} @k_transpose
  %scores: f32[b,2,s,s] = MatMul(%q, %kt) @scores
  %scaled: f32[b,2,s,s] = {scale}(%scores, %c) @scaled
  %masked: f32[b,2,s,s] = Add(%scaled, %mask) @masked
  %probs: f32[b,2,s,s] = Softmax(%masked) {{axis=-1}} @softmax
  %y: f32[b,2,s,3] = MatMul(%probs, %v) @attn/MatMul
  return %y
}}
"""
ATTENTION_EXPECTED = """graph g(%q: f32[b,2,s,4], %kh: f32[b,s,2,4], %v: f32[b,2,s,3], %mask: f32[b,1,1,s]) -> (%y) {
  %attn/keys_out: f32[b,2,s,4] = Transpose(%kh) {perm=[0,2,1,3]} @attn/keys
  %y: f32[b,2,s,3] = ai.metadef::Attention(%q, %attn/keys_out, %v, %mask) {scale=0.5} @attn/Attention
  return %y
}
"""


def _attention_feeds(mask_shape=(2, 1, 1, 5)):
    return {"q": _f32(2, 2, 5, 4), "kh": _f32(2, 5, 2, 4), "v": _f32(2, 2, 5, 3), "mask": _f32(*mask_shape)}


@pytest.mark.parametrize("scale,c", [("Div", 2.0), ("Mul", 0.5)])
def test_attention_absorbs_the_key_transpose(scale, c):
    g = parse_graph(ATTENTION.format(mask="b,1,1,s", c=c, scale=scale))
    after, log = _recognize(g)
    assert print_graph(after) == print_graph(parse_graph(ATTENTION_EXPECTED))
    assert log == ["taken recognize_attention at attn/MatMul (attn/MatMul, softmax, masked, scaled, scores)"]
    assert after.opset["ai.metadef"] == 1
    _same_numbers(g, after, _attention_feeds())


def test_attention_without_scale_or_transpose_inserts_one_and_widens_a_1d_mask():
    g = parse_graph("""graph g(%q: f32[5,4], %kt: f32[4,6], %v: f32[6,3], %mask: f32[6]) -> (%y) {
  %scores: f32[5,6] = MatMul(%q, %kt)
  %masked: f32[5,6] = Add(%mask, %scores)
  %probs: f32[5,6] = Softmax(%masked) {axis=1}
  %y: f32[5,3] = MatMul(%probs, %v) @attn
  return %y
}""")
    after, _ = _recognize(g)
    assert _ops(after) == ["Transpose", "Unsqueeze", "ai.metadef::Attention"]
    assert after.nodes[0].attrs["perm"] == [1, 0] and after.nodes[-1].attrs["scale"] == 1.0
    _same_numbers(g, after, {"q": _f32(5, 4), "kt": _f32(4, 6), "v": _f32(6, 3), "mask": _f32(6)})


def test_attention_refuses_when_the_probabilities_are_also_an_output():
    text = ATTENTION.format(mask="b,1,1,s", c=2.0, scale="Div").replace("-> (%y)", "-> (%y, %probs)")
    g = parse_graph(text.replace("return %y", "return %y, %probs"))
    after, log = _recognize(g)
    assert log == ["refused recognize_attention at attn/MatMul: %probs has 2 consumers (1 outside the pattern)"]
    assert "ai.metadef::Attention" not in _ops(after)


def test_softmax_over_another_axis_is_not_attention():
    g = parse_graph(ATTENTION.format(mask="b,1,1,s", c=2.0, scale="Div").replace("axis=-1", "axis=2"))
    assert _recognize(g)[1] == []


HEADS = """graph g(%x: f32[b,s,8], %m: f32[b,1,1,s]) -> (%y) {
  %shape: i64[4] = const [0, 0, 2, 4]
  %merged: i64[3] = const [0, 0, 8]
  %q4: f32[b,s,2,4] = Reshape(%x, %shape) @q_heads
  %k4: f32[b,s,2,4] = Reshape(%x, %shape) @k_heads
  %v4: f32[b,s,2,4] = Reshape(%x, %shape) @v_heads
  %q: f32[b,2,s,4] = Transpose(%q4) {perm=[0,2,1,3]} @q_t
  %kt: f32[b,2,4,s] = Transpose(%k4) {perm=[0,2,3,1]} @k_t
  %v: f32[b,2,s,4] = Transpose(%v4) {perm=[0,2,1,3]} @v_t
  %scores: f32[b,2,s,s] = MatMul(%q, %kt) @scores
  %masked: f32[b,2,s,s] = Add(%scores, %m) @masked
  %probs: f32[b,2,s,s] = Softmax(%masked) {axis=-1} @softmax
  %a: f32[b,2,s,4] = MatMul(%probs, %v) @attn/MatMul
  %at: f32[b,s,2,4] = Transpose(%a) {perm=[0,2,1,3]} @attn/merge
  %y: f32[b,s,8] = Reshape(%at, %merged) @y
  return %y
}"""


def test_attention_reads_its_heads_in_place_when_transposes_surround_it():
    """A transformer's heads: ``[b, s, h, d]`` swapped to ``[b, h, s, d]`` for the attention and
    back after it: the Transposes fold into ``layout="bshd"``, and the numbers stay."""
    g = parse_graph(HEADS)
    after, log = _recognize(g)
    assert _ops(after) == ["Reshape", "Reshape", "Reshape", "ai.metadef::Attention", "Reshape"]
    assert after.nodes[3].attrs == {"scale": 1.0, "layout": "bshd"}
    assert [line.split(" at ")[0] for line in log] == ["taken recognize_attention", "taken fold_attention_transposes"]
    _same_numbers(g, after, {"x": _f32(2, 5, 8), "m": _f32(2, 1, 1, 5)})


def test_attention_keeps_its_layout_when_its_heads_first_output_is_read_elsewhere():
    g = parse_graph(HEADS.replace("-> (%y)", "-> (%y, %a)").replace("return %y", "return %y, %a"))
    after, log = _recognize(g)
    assert after.nodes[-3].attrs.get("layout", "bhsd") == "bhsd" and "Transpose" in _ops(after)
    assert log[-1].startswith("refused fold_attention_transposes") and "other readers" in log[-1]


def test_rule_names():
    assert sorted({r.name for r in recognition_rules}) == [
        "expand_ort_attention", "fold_attention_transposes", "recognize_attention", "recognize_gelu",
        "recognize_hardswish", "recognize_layernorm", "recognize_onnx_attention", "recognize_silu"]


# ------------------------------------------------------------------------ ONNX export


@pytest.mark.parametrize("graph,opset", [
    (lambda: parse_graph(_layernorm(), constants=LN_CONSTS), 17),
    (lambda: _activation(ERF_GELU["mul_last"]), 20),
    (lambda: _activation(TANH_GELU["pow"]), 20),
    (lambda: _activation(HARDSWISH["div_after"]), 14),
])
def test_recognized_standard_ops_run_in_onnxruntime(graph, opset):
    g = graph()
    g.opset[""] = opset - 1 if opset > 17 else 13  # an older model: the pass raises the import
    after, _ = _recognize(g)
    assert after.opset[""] == opset
    model = to_onnx(after)
    onnx.checker.check_model(model)
    x = 3 * _f32(2, 4, 8) if "LayerNormalization" in _ops(after) else 3 * _f32(4, 8)
    want = md.compile(g, target="reference").run({"x": x})["y"]
    np.testing.assert_allclose(run_onnxruntime(model, {"x": x})["y"], want, rtol=1e-5, atol=1e-5)


def test_metadef_ops_export_with_their_domain():
    after, _ = _recognize(parse_graph(ATTENTION.format(mask="b,1,1,s", c=2.0, scale="Div")))
    model = to_onnx(after)
    assert {(o.domain, o.version) for o in model.opset_import} >= {("ai.metadef", 1)}
    assert [n.domain for n in model.graph.node if n.op_type == "Attention"] == ["ai.metadef"]


# -------------------------------------------------------------------------------- zoo

ZOO = {  # nodes before -> after fold_batchnorm + recognize_patterns
    "mlp": (7, 7), "resnet50": (175, 122), "mobilenetv2": (152, 100), "bert": (960, 616),
}


def _optimized(name):
    proto = md.zoo.build(name)
    graph = md.import_onnx(proto)
    ctx = PassContext()
    t0 = time.perf_counter()
    after = recognize_patterns(fold_batchnorm(graph, ctx), ctx)
    return proto, graph, after, ctx, time.perf_counter() - t0


@pytest.mark.slow
def test_bert_is_recognized():
    _, graph, after, ctx, seconds = _optimized("bert")
    ops = Counter(_ops(after))
    assert ops["ai.metadef::Attention"] == 12 and ops["LayerNormalization"] == 25 and ops["Gelu"] == 12
    assert not {"ReduceMean", "Softmax", "Erf", "Pow", "Sqrt"} & set(ops) and not ctx.log.refused()
    assert after.opset == {"": 20, "ai.metadef": 1}
    assert set(problems(after, types=True)) <= set(problems(graph, types=True))  # Reshape re-inference
    print(f"fold_batchnorm + recognize_patterns on BERT: {seconds:.2f} s")
    assert seconds < 5


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_still_matches_onnxruntime(name):
    proto, graph, after, _, _ = _optimized(name)
    assert (len(graph.nodes), len(after.nodes)) == ZOO[name]
    dims = {"batch": 2, "seq": 24} if name == "bert" else {"batch": 2}
    check = compare_with_onnxruntime(proto, md.zoo.describe(name).example_inputs(**dims), graph=after)
    assert check.ok, [o for o in check.outputs if not o.ok]


def _onnx_attention(inputs: list[str], shapes: dict[str, list], **attrs) -> onnx.ModelProto:
    from onnx import TensorProto, helper
    node = helper.make_node("Attention", inputs, ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, shapes[n])
                                            for n in inputs if n],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 23)])


@pytest.mark.parametrize("target", ["reference", "x86"])
@pytest.mark.parametrize(("inputs", "attrs"), [(["q", "k", "v"], {}), (["q", "k", "v", "mask"], {"scale": 0.3})])
def test_onnx_attention_in_its_plain_form_becomes_ours(inputs: list[str], attrs: dict, target: str) -> None:
    shapes = {"q": ["b", 2, "s", 8], "k": ["b", 2, "t", 8], "v": ["b", 2, "t", 5], "mask": ["b", 1, "s", "t"]}
    model = _onnx_attention(inputs, shapes, **attrs)
    graph = md.optimize(md.import_onnx(model))
    assert _ops(graph) == ["ai.metadef::Attention"]
    sess = md.compile(graph, target=target)
    for b, s, t in ((1, 3, 4), (2, 5, 7)):
        sizes = {"b": b, "s": s, "t": t}
        feeds = {n: _f32(*(sizes.get(d, d) for d in shapes[n])) for n in inputs}
        want = run_onnxruntime(model, feeds)
        np.testing.assert_allclose(sess.run(feeds)["y"], want["y"] if isinstance(want, dict) else want[0],
                                   rtol=1e-4, atol=1e-5)
    if target == "x86":
        assert not any(p.fallback for p in sess.executable.plan)


@pytest.mark.parametrize(("attrs", "why"), [({"is_causal": 1}, "is_causal=1"), ({"softcap": 2.0}, "softcap=2.0")])
def test_onnx_attention_in_another_form_stays_and_says_why(attrs: dict, why: str) -> None:
    shapes = {"q": [1, 2, 3, 8], "k": [1, 2, 3, 8], "v": [1, 2, 3, 8]}
    ctx = PassContext()
    after = recognize_patterns(md.import_onnx(_onnx_attention(["q", "k", "v"], shapes, **attrs)), ctx)
    assert _ops(after) == ["Attention"] and why in ctx.log.lines()[0]
