"""Symbolic dims: canonical forms, simplification, evaluation, parsing (with properties)."""

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metadef.core.errors import ShapeError
from metadef.shape import (
    Decision,
    ShapeEnv,
    add,
    bind_shape,
    broadcast_dim,
    broadcast_shapes,
    ceildiv,
    equal,
    floordiv,
    max_,
    min_,
    mod,
    mul,
    parse_dim,
    sub,
    sym,
)

b, s = sym("batch"), sym("seq")


def test_polynomial_canonical_form_and_interning():
    assert b * 64 + b * 2 is b * 66
    assert (b + 1) * (b - 1) is sub(mul(b, b), 1)
    assert str(b * s - s * b) == "0" and b * s - s * b == 0
    assert str(2 * b + s + 3) == "batch*2 + seq + 3"


def test_division_simplifies_exact_parts():
    assert floordiv(b * 4 + 2, 2) is b * 2 + 1
    assert floordiv(b + 2, 2) is floordiv(b, 2) + 1
    assert ceildiv(b * 4 + 3, 4) is b + 1
    assert mod(b * 4 + 3, 4) == 3
    assert floordiv(floordiv(b, 2), 3) is floordiv(b, 6)
    assert floordiv(b * s * 768, 768) is b * s
    with pytest.raises(ShapeError, match="division by zero"):
        floordiv(b, 0)


def test_min_max_fold_when_decidable():
    assert max_(b, b + 1) is b + 1
    assert min_(b, b + 1) is b
    assert min_(3, 5) == 3
    assert str(min_(b, 3, s)) == "min(3, batch, seq)"


def test_equality_has_a_cannot_decide_outcome():
    assert equal(b + 1, b + 1) is Decision.TRUE
    assert equal(b + 1, b) is Decision.FALSE
    assert equal(b, s) is Decision.UNKNOWN
    env = ShapeEnv()
    env.constrain("batch", lo=1)
    assert equal(b * 2, 0, env) is Decision.FALSE


def test_broadcasting():
    assert broadcast_dim(b, 1) == (b, Decision.TRUE)
    assert broadcast_dim(b, 3) == (3, Decision.UNKNOWN)
    assert broadcast_dim(b, s)[1] is Decision.UNKNOWN
    assert broadcast_shapes((b, 1, 4), (3, 1)) == ((b, 3, 4), [])
    with pytest.raises(ShapeError, match="cannot broadcast"):
        broadcast_shapes((2, 3), (4, 3))


def test_bind_shape_checks_symbols_across_inputs():
    bindings: dict[str, int] = {}
    assert bind_shape((b, 3), (5, 3), bindings) is None and bindings == {"batch": 5}
    assert "already 5" in bind_shape((b,), (6,), bindings)
    assert "dim 1 is 4 but 3 expected" in bind_shape((b, 3), (5, 4), bindings)
    assert bind_shape((b, b * 2), (5, 11), bindings) == "dim 1 is 11 but batch*2 = 10 expected"


def test_constraints():
    env = ShapeEnv()
    env.constrain("seq", lo=1, hi=512, multiple_of=2)
    assert env.check({"seq": 128}) == []
    assert env.check({"seq": 513, "batch": 1}) == ["seq=513 is above its maximum 512"]
    assert env.check({"seq": 3}) == ["seq=3 is not a multiple of 2"]
    assert str(env.fresh("n")) == "n_0"


def test_pickle_keeps_interning():
    e = floordiv(b * 3 + s, 2)
    assert pickle.loads(pickle.dumps(e)) is e


# --- properties ------------------------------------------------------------------------

names = st.sampled_from(["batch", "seq", "h"])
leaf = st.one_of(st.integers(-5, 20), names.map(sym))


def _combine(children):
    ops = st.sampled_from(["add", "sub", "mul", "floordiv", "ceildiv", "mod", "min", "max"])
    return st.tuples(ops, children, children)


exprs = st.recursive(leaf, _combine, max_leaves=8)
env_values = st.fixed_dictionaries({n: st.integers(0, 9) for n in ("batch", "seq", "h")})

_PY = {
    "add": lambda a, c: a + c, "sub": lambda a, c: a - c, "mul": lambda a, c: a * c,
    "floordiv": lambda a, c: a // c, "ceildiv": lambda a, c: -((-a) // c), "mod": lambda a, c: a % c,
    "min": min, "max": max,
}
_SYM = {"add": add, "sub": sub, "mul": mul, "floordiv": floordiv, "ceildiv": ceildiv, "mod": mod,
        "min": min_, "max": max_}


def _build(tree, env):
    """(symbolic dim, python value) of a random tree, or None where a divisor is 0 or <0."""
    if not isinstance(tree, tuple):
        if isinstance(tree, int):
            return tree, tree
        return tree, tree.evaluate(env)
    op, left, right = tree
    lsym, lval = _build(left, env) or (None, None)
    rsym, rval = _build(right, env) or (None, None)
    if (lsym is None and lval is None) or (rsym is None and rval is None):
        return None
    if op in ("floordiv", "ceildiv", "mod") and (not isinstance(rsym, int) or rsym <= 0):
        return None
    return _SYM[op](lsym, rsym), _PY[op](lval, rval)


@given(exprs, env_values)
def test_simplification_preserves_value(tree, env):
    built = _build(tree, env)
    if built is None:
        return
    dim, want = built
    got = dim if isinstance(dim, int) else dim.evaluate(env)
    assert got == want


@given(exprs)
def test_print_parse_round_trip(tree):
    built = _build(tree, {"batch": 1, "seq": 1, "h": 1})
    if built is None:
        return
    dim = built[0]
    assert parse_dim(str(dim)) == dim
