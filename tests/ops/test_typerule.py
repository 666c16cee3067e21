"""The type-rule DSL: parsing (both spellings), unification, where-clauses, error texts."""

import pytest

from metadef.core.errors import DSLSyntaxError, ShapeError
from metadef.ops import Role, compile_rule, get_op, infer_types, metaop
from metadef.shape import parse_type

CONV2D = """
rule conv2d_type_infer:
  input:  tensor<N,C,H,W; T>
  weight: tensor<K,CG,R,S; T>
  output: tensor<N,K,P,Q; T>
  where P = (H + pads[0] + pads[2] - dilations[0]*(R-1) - 1) / strides[0] + 1
        Q = (W + pads[1] + pads[3] - dilations[1]*(S-1) - 1) / strides[1] + 1
        require C == CG * group
"""

ISSUE_FORM = """rule conv2d_type_infer: input: tensor<NCHW, float32>
  weight: tensor<KCRS, float32> output: tensor<NKPQ, float32> where P = (H - R + pad_h) / stride_h + 1
  Q = (W - S + pad_w) / stride_w + 1"""


def _op(name, rule, attrs=None, inputs=("X", "W"), outputs=("Y",)):
    from metadef.ops.interface import int_, ints

    spec = {"pads": ints((0, 0, 0, 0)), "strides": ints((1, 1)), "dilations": ints((1, 1)), "group": int_(1)}
    return metaop(name, domain="test.typerule", inputs=inputs, outputs=outputs, attrs=attrs or spec,
                  types="T in {float}", rule=rule, reference=lambda ins, a: ins[0],
                  role=Role.CONTRACTION, register=False)


def test_both_spellings_parse():
    r = compile_rule(CONV2D)
    assert [c.label for c in r.clauses] == ["input", "weight", "output"]
    assert [w.kind for w in r.wheres] == ["let", "let", "require"]
    compact = compile_rule(ISSUE_FORM)
    assert [d.text for d in compact.clauses[0].dims] == ["N", "C", "H", "W"]
    assert compact.clauses[0].dtype == "float32"


def test_conv_rule_infers_symbolic_and_static_dims():
    op = _op("Conv2dT", CONV2D)
    attrs = {"pads": (3, 3, 3, 3), "strides": (2, 2)}
    out, = infer_types(op, "/conv1", [parse_type("f32[batch,3,224,224]"), parse_type("f32[64,3,7,7]")], attrs)
    assert str(out) == "f32[batch,64,112,112]"
    out, = infer_types(op, "/conv1", [parse_type("f32[b,3,h,w]"), parse_type("f32[64,3,7,7]")], attrs)
    assert str(out) == "f32[b,64,floor((h - 1)/2) + 1,floor((w - 1)/2) + 1]"


def test_issue_form_with_params_from_python():
    op = _op("Conv2dIssue", ISSUE_FORM, attrs={})
    rule = op.rule
    from metadef.ops.infer import InferContext

    ctx = InferContext(op, "/c", [parse_type("f32[1,3,32,32]"), parse_type("f32[8,3,3,3]")], {}, [])
    out, = rule(ctx, params={"pad_h": 2, "stride_h": 1, "pad_w": 2, "stride_w": 1})
    assert str(out) == "f32[1,8,32,32]"


def test_failed_constraint_names_node_shapes_and_rule():
    op = _op("Conv2dBad", CONV2D)
    with pytest.raises(ShapeError) as e:
        infer_types(op, "/layer1/conv2", [parse_type("f32[1,16,8,8]"), parse_type("f32[4,8,3,3]")], {})
    text = str(e.value)
    assert "Conv2dBad (node /layer1/conv2)" in text
    assert "f32[1,16,8,8]" in text and "f32[4,8,3,3]" in text
    assert "C == CG * group" in text and "16 == 8" in text


def test_matmul_inner_dimension_mismatch():
    with pytest.raises(ShapeError) as e:
        infer_types(get_op("MatMul"), "/enc/MatMul_7",
                    [parse_type("f32[b,128,768]"), parse_type("f32[512,64]")], {})
    text = str(e.value)
    assert "MatMul (node /enc/MatMul_7)" in text
    assert "expects K to agree: got 768 (a dim 2) and 512 (b dim 0)" in text


def test_matmul_batch_groups_broadcast():
    out, = infer_types(get_op("MatMul"), "mm", [parse_type("f32[2,1,b,4]"), parse_type("f32[5,4,6]")], {})
    assert str(out) == "f32[2,5,b,6]"


def test_syntax_errors_point_at_the_problem():
    with pytest.raises(DSLSyntaxError, match="starts with 'rule NAME:'"):
        compile_rule("input: tensor<N>")
    with pytest.raises(DSLSyntaxError, match="cannot read where-line"):
        compile_rule("rule r: a: tensor<N; T> where N >> 2")
    with pytest.raises(DSLSyntaxError, match="at most one"):
        compile_rule("rule r: a: tensor<*A, *B; T>")
