"""The semantic index-expression language: parsing, printing, naming rules and queries."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metadef.core.errors import DSLSyntaxError
from metadef.ops.semantics import (
    ACCESS_FUNCTIONS,
    ELLIPSIS,
    FUNCTION_ARITIES,
    REDUCTIONS,
    Access,
    Affine,
    Binary,
    Call,
    Expr,
    Number,
    Param,
    Program,
    Reduce,
    ReduceVar,
    Statement,
    Term,
    Unary,
    Var,
    parse_semantics,
)

CONV = "Y[n,k,p,q] = B[k] + sum[c,r,s] X[n,c,p*sh+r*dh-pt,q*sw+s*dw-pl] * W[k,c,r,s]"
GROUPED = ("Y[n, g*KG+kk, p, q] = sum[c,r,s] X[n, g*CG+c, p*sh+r*dh-pt, q*sw+s*dw-pl]"
           " * W[g*KG+kk, c, r, s]")
SOFTMAX = ("t_max[...] = max[a] X[...,a]\n"
           "t_e[...,a] = exp(X[...,a] - t_max[...])\n"
           "Y[...,a] = t_e[...,a] / sum[b] t_e[...,b]")
EXAMPLES = [
    CONV, GROUPED, SOFTMAX,
    "Y[...] = A[...] + B[...]",
    "Y[...] = where(C[...], A[...], B[...])",
    "Y[...] = where(X[...] < 0, alpha * X[...], X[...])",
    "Y[...] = X[...] * 0.5 * (1 + erf(X[...] / 1.4142135623730951))",
    "Y[...,m,n] = sum[k] A[...,m,k] * B[...,k,n]",
    "Y[m,n] = alpha * sum[k] A[m,k] * B[n,k] + beta * C[m,n]",
    "Y[n,c,p,q] = max[r:KH, s:KW] fill(X[n,c,p*sh+r*dh-pt, q*sw+s*dw-pl], -inf)",
    "Y[n,c,p,q] = sum[r:KH, s:KW] X[n,c,p*sh+r-pt, q*sw+s-pl] / "
    "sum[r:KH, s:KW] inbounds(X[n,c,p*sh+r-pt, q*sw+s-pl])",
    "Y[a,z,c] = sum[b] X[a,b,c]",
    "Y[j,i] = X[i,j]", "Y[i] = X[i,i]", "Y[] = sum[i,j] X[i,j]",
    "Y[i, j] = where(j >= i + K, X[i, j], 0)",
    "Y[i] = not X[i] < 1 and X[i] > 0 or X[i] == 3",
    "Y[i] = -X[i] ** 2 ** -e + (sum[j] Z[i, j]) * 2 - -cast_float32(X[i]) % 3",
    "Y[i] = X[2*i + 1, K] + X[-i, (i + 1)*2] + 1e-12 + 1e20 + inf + nan",
]


def rhs(text: str) -> Expr:
    return parse_semantics(text).statements[0].rhs


# ------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("text", EXAMPLES)
def test_examples_print_canonically_and_reparse_equal(text: str) -> None:
    program = parse_semantics(text)
    printed = str(program)
    assert parse_semantics(printed) == program
    assert str(parse_semantics(printed)) == printed
    assert hash(parse_semantics(printed)) == hash(program)


def test_canonical_text_of_gemm_and_conv() -> None:
    assert str(parse_semantics("Y[m,n]=alpha*sum[k] A[m,k]*B[n,k]+beta*C[m,n]")) == (
        "Y[m, n] = alpha * (sum[k] A[m, k] * B[n, k]) + beta * C[m, n]")
    assert str(parse_semantics(CONV)) == (
        "Y[n, k, p, q] = B[k] + (sum[c, r, s] X[n, c, p*sh + r*dh - pt, q*sw + s*dw - pl]"
        " * W[k, c, r, s])")


def test_parse_is_cached() -> None:
    assert parse_semantics(CONV) is parse_semantics(CONV)


# ---------------------------------------------------------------------------- precedence


def test_reduction_body_is_the_following_product() -> None:
    e = rhs("Y[m,n] = alpha * sum[k] A[m,k] * B[n,k] + beta * C[m,n]")
    assert isinstance(e, Binary) and e.op == "+"
    left = e.left
    assert isinstance(left, Binary) and left.op == "*" and left.left == Param("alpha")
    assert isinstance(left.right, Reduce) and len(left.right.factors()) == 2
    avg = rhs("Y[i] = sum[j] X[i,j] / sum[j] M[i,j]")
    assert isinstance(avg, Binary) and avg.op == "/"
    assert isinstance(avg.left, Reduce) and isinstance(avg.right, Reduce)
    inner = rhs("Y[i] = sum[j] (A[i,j] + B[i,j])")
    assert isinstance(inner, Reduce) and isinstance(inner.body, Binary)


def test_power_is_right_associative_and_binds_tighter_than_unary_minus() -> None:
    e = rhs("Y[i] = -X[i] ** 2 ** 3")
    assert isinstance(e, Unary) and e.op == "-"
    power = e.operand
    assert isinstance(power, Binary) and power.op == "**"
    assert power.right == Binary("**", Number(2), Number(3))


def test_numbers_keep_their_kind() -> None:
    e = rhs("Y[] = 1 + 0.5 + 1e-12 + inf")
    numbers = [n.value for n in e.walk() if isinstance(n, Number)]
    assert numbers == [1, 0.5, 1e-12, float("inf")]
    assert isinstance(numbers[0], int) and isinstance(numbers[1], float)


# ------------------------------------------------------------------ variables and params


def test_conv_classifies_variables_and_params() -> None:
    stmt = parse_semantics(CONV).statements[0]
    x = next(a for a in stmt.rhs.accesses() if a.tensor == "X")
    spatial = x.indices[2]
    assert isinstance(spatial, Affine)
    assert spatial.terms == (Term(1, "p", ("sh",)), Term(1, "r", ("dh",)), Term(-1, None, ("pt",)))
    assert spatial.linear_form({"sh": 2, "dh": 3, "pt": 1}) == (-1, {"p": 2, "r": 3})
    assert stmt.index_vars == ("n", "k", "p", "q")
    assert stmt.reduction_vars == ("c", "r", "s")
    assert stmt.rhs.params() == {"sh", "dh", "pt", "sw", "dw", "pl"}


def test_grouped_conv_merges_upper_case_params_with_lower_case_variables() -> None:
    stmt = parse_semantics(GROUPED).statements[0]
    merged = stmt.lhs.indices[1]
    assert isinstance(merged, Affine)
    assert merged.terms == (Term(1, "g", ("KG",)), Term(1, "kk"))
    assert stmt.index_vars == ("n", "g", "kk", "p", "q")
    assert parse_semantics(GROUPED).params() == {"KG", "CG", "sh", "dh", "pt", "sw", "dw", "pl"}


def test_bare_upper_case_name_is_a_constant_index_and_variables_read_as_values() -> None:
    e = rhs("Y[i, j] = where(j >= i + K, X[i, j], X[i, K])")
    assert Var("j") in set(e.walk()) and Param("K") in set(e.walk())
    last = e.accesses()[-1]
    assert last.indices[1] == Affine((Term(1, None, ("K",)),))


def test_like_terms_combine() -> None:
    access = rhs("Y[i] = X[i + i - 3 + 1]")
    assert isinstance(access, Access)
    assert access.indices == (Affine((Term(2, "i"), Term(-2))),)
    assert str(access) == "X[2*i - 2]"


# --------------------------------------------------------------------------------- queries


def test_program_outputs_inputs_and_temporaries() -> None:
    program = parse_semantics(SOFTMAX)
    assert program.outputs == ("Y",)
    assert program.temporaries == ("t_max", "t_e")
    assert program.inputs == ("X",)
    assert program.statement("t_e").lhs.has_ellipsis
    two = parse_semantics("Mean[i] = mean[j] X[i,j]; Y[i,j] = X[i,j] - Mean[i]")
    assert two.outputs == ("Mean", "Y")  # an output may also feed a later statement
    assert parse_semantics("y[i] = x[i]").outputs == ("y",)


def test_elementwise_and_contraction_queries() -> None:
    def stmt(text: str) -> Statement:
        return parse_semantics(text).statements[0]

    assert stmt("Y[...] = A[...] + B[...]").is_elementwise()
    assert stmt("Y[n,c,h,w] = X[n,c,h,w] * S[h,w] + T[]").is_elementwise()
    assert not stmt("Y[...,a] = X[...,a] - M[...]").is_elementwise()
    assert not stmt("Y[j,i] = X[i,j]").is_elementwise()
    assert not stmt("Y[i] = sum[j] X[i,j]").is_elementwise()
    assert stmt("Y[...,m,n] = sum[k] A[...,m,k] * B[...,k,n]").is_contraction()
    assert not stmt("Y[i] = sum[j] X[i,j]").is_contraction()
    assert not stmt(CONV).is_contraction()  # the bias makes it a sum of two terms
    conv = stmt(CONV).rhs
    assert isinstance(conv, Binary) and isinstance(conv.right, Reduce)
    assert conv.right.is_contraction()


def test_accesses_are_listed_in_reading_order() -> None:
    e = rhs("Y[i] = fill(A[i - 1], 2) + inbounds(B[i]) * A[i]")
    assert [str(a) for a in e.accesses()] == ["A[i - 1]", "B[i]", "A[i]"]


def test_reduce_vars_carry_bounds() -> None:
    e = rhs("Y[p] = max[r:KH, s:3] X[p + r, s]")
    assert isinstance(e, Reduce)
    assert e.vars == (ReduceVar("r", "KH"), ReduceVar("s", 3))
    assert e.params() == {"KH"}


# ---------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(("text", "message"), [
    ("Y[i] = X[i] +", "expected a value"),
    ("Y[i] = X[i] $ 2", "unexpected character"),
    ("Y[i] = exq(X[i])", "did you mean exp"),
    ("Y[i] = where(X[i], 1)", "where takes 3 argument"),
    ("Y[i] = fill(X[i] + 1, 0)", "must be a tensor access"),
    ("Y[i, j] = X[i*j]", "multiplies index variables"),
    ("Y[i] = X[i, j]", "index variable j is neither an output index"),
    ("Y[i] = X[...]", "uses '...' but the left-hand side does not"),
    ("Y[..., ...] = X[...]", "more than once"),
    ("Y[i, 0] = X[i]", "has no index variable"),
    ("Y[i, i] = X[i]", "appears twice"),
    ("Y[i] = sum[i] X[i]", "also an output index"),
    ("Y[i] = sum[j, j] X[i, j]", "names a variable twice"),
    ("Y[i] = X[i] < 1 < 2", "do not chain"),
    ("Y[i] = X[i + 0.5]", "integer index"),
    ("Y[i] = X[i", "expected ']'"),
    ("Y = X[i]", "starts with the tensor it defines"),
    ("Y[i] = X[i] Z[i]", "expected ';' or a new line"),
    ("", "at least one statement"),
    ("Y[i] = X[i]; Y[i] = X[i]", "defined twice"),
    ("Y[i] = t[i]; t[i] = X[i]", "before its defining statement"),
])
def test_syntax_errors_say_what_and_where(text: str, message: str) -> None:
    with pytest.raises(DSLSyntaxError, match=message):
        parse_semantics(text)


def test_syntax_error_points_at_the_column() -> None:
    with pytest.raises(DSLSyntaxError) as info:
        parse_semantics("Y[i] = X[i] $ 2")
    assert "line 1, column 13" in str(info.value)
    assert str(info.value).splitlines()[-1].index("^") == 4 + 12


def test_function_table_has_arity_for_every_name() -> None:
    assert FUNCTION_ARITIES["where"] == 3 and FUNCTION_ARITIES["max"] == 2
    assert FUNCTION_ARITIES["cast_bfloat16"] == 1 and set(FUNCTION_ARITIES) >= ACCESS_FUNCTIONS
    assert {"sum", "max", "min", "prod", "mean"} == REDUCTIONS


# ----------------------------------------------------------- property: print / parse trips

LHS_VARS = ("i", "j")
REDUCED = ("r", "s", "t")
FUNCS = sorted(n for n in FUNCTION_ARITIES if n not in ACCESS_FUNCTIONS)
BINARY_OPS = ("+", "-", "*", "/", "%", "**", "<", "<=", ">", ">=", "==", "!=", "and", "or")


@st.composite
def affines(draw: st.DrawFn, scope: tuple[str, ...]) -> Affine:
    terms: list[Term] = []
    for _ in range(draw(st.integers(0, 3))):
        var = draw(st.sampled_from((None, *scope)))
        params = tuple(sorted(draw(st.lists(st.sampled_from(("SH", "PT")), max_size=2))))
        if all((t.var, t.params) != (var, params) for t in terms):
            terms.append(Term(draw(st.integers(-4, 4).filter(bool)), var, params))
    return Affine(tuple(terms))


@st.composite
def accesses(draw: st.DrawFn, scope: tuple[str, ...], ellipsis: bool) -> Access:
    indices: list = draw(st.lists(affines(scope), max_size=3))
    if ellipsis and draw(st.booleans()):
        indices.insert(draw(st.integers(0, len(indices))), ELLIPSIS)
    return Access(draw(st.sampled_from(("X", "W", "b_t"))), tuple(indices))


@st.composite
def leaves(draw: st.DrawFn, scope: tuple[str, ...], ellipsis: bool) -> Expr:
    number = st.one_of(st.integers(0, 1000), st.floats(0, 1e30, allow_nan=False),
                       st.just(float("inf"))).map(Number)
    choices = [number, st.sampled_from(("alpha", "N")).map(Param), accesses(scope, ellipsis),
               st.sampled_from(scope).map(Var)]
    return draw(st.one_of(choices))


@st.composite
def exprs(draw: st.DrawFn, depth: int, scope: tuple[str, ...], ellipsis: bool) -> Expr:
    kind = "leaf" if depth == 0 else draw(st.sampled_from(
        ("leaf", "unary", "binary", "binary", "call", "reduce", "fill")))
    sub = exprs(depth - 1, scope, ellipsis)
    if kind == "unary":
        return Unary(draw(st.sampled_from(("-", "not"))), draw(sub))
    if kind == "binary":
        return Binary(draw(st.sampled_from(BINARY_OPS)), draw(sub), draw(sub))
    if kind == "call":
        name = draw(st.sampled_from(FUNCS))
        return Call(name, tuple(draw(sub) for _ in range(FUNCTION_ARITIES[name])))
    if kind == "fill":
        return Call("fill", (draw(accesses(scope, ellipsis)), draw(sub)))
    free = [v for v in REDUCED if v not in scope]
    if kind == "reduce" and free:
        var = draw(st.sampled_from(free))
        bound = draw(st.sampled_from((None, 3, "KH")))
        body = draw(exprs(depth - 1, (*scope, var), ellipsis))
        return Reduce(draw(st.sampled_from(sorted(REDUCTIONS))), (ReduceVar(var, bound),), body)
    return draw(leaves(scope, ellipsis))


@st.composite
def programs(draw: st.DrawFn) -> Program:
    ellipsis = draw(st.booleans())
    lhs = tuple(Affine((Term(1, v),)) for v in LHS_VARS)
    lhs = (ELLIPSIS, *lhs) if ellipsis else lhs
    return Program((Statement(Access("Y", lhs), draw(exprs(4, LHS_VARS, ellipsis))),))


@settings(max_examples=300, deadline=None)
@given(programs())
def test_printing_then_parsing_gives_the_same_tree(program: Program) -> None:
    text = str(program)
    assert parse_semantics(text) == program, text
    assert str(parse_semantics(text)) == text
