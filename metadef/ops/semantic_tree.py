"""The expression tree of semantic index expressions (see :mod:`metadef.ops.semantics`).

Nodes are frozen dataclasses, so trees are hashable and compare structurally; ``str(node)``
prints canonical text that :func:`metadef.ops.semantics.parse_semantics` reads back equal.
The tree imports nothing but the standard library; the language (lexer, parser, naming rules)
lives in :mod:`metadef.ops.semantics`, which re-exports every name here.

Example:
    >>> from metadef.ops.semantics import parse_semantics
    >>> stmt = parse_semantics("Y[i] = sum[j] X[i, j]").statements[0]
    >>> isinstance(stmt.rhs, Reduce), str(stmt.rhs)
    (True, 'sum[j] X[i, j]')
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

REDUCTIONS = frozenset({"sum", "max", "min", "prod", "mean"})
"""The reduction prefixes: ``sum[vars] body`` and so on."""

CAST_DTYPE_NAMES = frozenset({
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "bfloat16", "float8_e4m3fn", "float8_e4m3fnuz",
    "float8_e5m2", "float8_e5m2fnuz", "complex64", "complex128",
})
"""Dtype names accepted by ``cast_<dtype>(x)`` (numpy spellings, plus ml_dtypes' names)."""

FUNCTION_ARITIES: dict[str, int] = {
    **{name: 1 for name in (
        "exp", "expm1", "log", "sqrt", "rsqrt", "tanh", "erf", "ndtr", "sigmoid", "abs", "neg", "floor", "ceil",
        "round", "sign", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh",
        "acosh", "atanh", "reciprocal", "relu", "softplus", "isnan", "isinf", "inbounds")},
    "where": 3, "max": 2, "min": 2, "pow": 2, "fill": 2,
    **{f"cast_{name}": 1 for name in CAST_DTYPE_NAMES},
}
"""Every function name the language knows, with its number of arguments. ``fill`` and
``inbounds`` take a tensor access as their first argument."""

FUNCTION_NAMES = frozenset(FUNCTION_ARITIES)
ACCESS_FUNCTIONS = frozenset({"fill", "inbounds"})
KEYWORDS = frozenset({"and", "or", "not", "inf", "nan"})


def is_lower_name(name: str) -> bool:
    """True for names that may be index variables: ``p``, ``kk``, ``_t`` (not ``KG``)."""
    return name[0].islower() or name[0] == "_"


# ---------------------------------------------------------------------------------- indices


@dataclass(frozen=True)
class Term:
    """One term ``coef * var * params...`` of an affine index; ``var`` is None for constants.

    Example:
        >>> str(Term(-2, "p", ("SH",)))
        '2*p*SH'
    """

    coef: int
    var: str | None = None
    params: tuple[str, ...] = ()

    def __str__(self) -> str:
        factors = [str(abs(self.coef))] if abs(self.coef) != 1 or not self._names() else []
        return "*".join(factors + list(self._names()))

    def _names(self) -> tuple[str, ...]:
        return ((self.var,) if self.var else ()) + self.params


@dataclass(frozen=True)
class Affine:
    """An integer index: a sum of :class:`Term`, at most one index variable per term.

    Example:
        >>> from metadef.ops.semantics import parse_semantics
        >>> idx = parse_semantics("Y[p] = X[p*sh + 2 - pt]").statements[0].rhs.indices[0]
        >>> str(idx), idx.variables, idx.linear_form({"sh": 2, "pt": 1})
        ('p*sh + 2 - pt', ('p',), (1, {'p': 2}))
    """

    terms: tuple[Term, ...] = ()

    @property
    def variables(self) -> tuple[str, ...]:
        """The index variables of the terms, in order."""
        return tuple(t.var for t in self.terms if t.var is not None)

    @property
    def var_name(self) -> str | None:
        """The variable when the index is a bare variable (``i``), else None."""
        if len(self.terms) == 1 and self.terms[0] == Term(1, self.terms[0].var) and self.variables:
            return self.terms[0].var
        return None

    def params(self) -> frozenset[str]:
        """Param names used by the index."""
        return frozenset(p for t in self.terms for p in t.params)

    def linear_form(self, params: Mapping[str, int]) -> tuple[int, dict[str, int]]:
        """Evaluate params: ``(constant, {var: coefficient})``; a KeyError names a missing one."""
        const, coefs = 0, {}
        for t in self.terms:
            value = t.coef
            for p in t.params:
                value *= params[p]
            if t.var is None:
                const += value
            else:
                coefs[t.var] = coefs.get(t.var, 0) + value
        return const, coefs

    def __str__(self) -> str:
        if not self.terms:
            return "0"
        text = ""
        for n, t in enumerate(self.terms):
            sign = ("-" if t.coef < 0 else "") if n == 0 else (" - " if t.coef < 0 else " + ")
            text += sign + str(t)
        return text


@dataclass(frozen=True)
class EllipsisIndex:
    """``...``: a block of batch axes, aligned to the right and broadcast numpy-style."""

    def __str__(self) -> str:
        return "..."


ELLIPSIS = EllipsisIndex()
Index = Affine | EllipsisIndex

# ------------------------------------------------------------------------------ expressions


class Expr:
    """Base of the expression nodes; printing gives canonical text that re-parses equal.

    Example:
        >>> from metadef.ops.semantics import parse_semantics
        >>> e = parse_semantics("Y[i] = exp(X[i] - M[]) * s").statements[0].rhs
        >>> [str(a) for a in e.accesses()], sorted(e.params())
        (['X[i]', 'M[]'], ['s'])
    """

    def children(self) -> tuple[Expr, ...]:
        """The direct sub-expressions."""
        return ()

    def walk(self) -> Iterator[Expr]:
        """Every node of the tree, pre-order."""
        yield self
        for child in self.children():
            yield from child.walk()

    def accesses(self) -> tuple[Access, ...]:
        """All tensor accesses, in reading order (duplicates kept)."""
        return tuple(node for node in self.walk() if isinstance(node, Access))

    def params(self) -> frozenset[str]:
        """Names of the params read: values, index coefficients and reduction bounds."""
        found: set[str] = set()
        for node in self.walk():
            found |= node._own_params()
        return frozenset(found)

    def _own_params(self) -> frozenset[str]:
        return frozenset()

    def __str__(self) -> str:
        return _format(self, 0)


@dataclass(frozen=True, eq=False)
class Number(Expr):
    """A literal: ``1``, ``0.5``, ``1e-12``, ``inf``. The parser never makes negative ones.

    Equality is by kind and value, so ``1`` and ``1.0`` differ (an int literal does not turn
    an integer tensor into floats) and ``nan`` equals ``nan``.
    """

    value: int | float

    def _key(self) -> tuple[bool, str]:
        return isinstance(self.value, float), _format_number(self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Number) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


@dataclass(frozen=True)
class Param(Expr):
    """A named scalar given at evaluation (``alpha``)."""

    name: str

    def _own_params(self) -> frozenset[str]:
        return frozenset({self.name})


@dataclass(frozen=True)
class Var(Expr):
    """An index variable read as a value (``where(i == j, 1, 0)``)."""

    name: str


@dataclass(frozen=True)
class Access(Expr):
    """A tensor read ``X[n, c, p*sh + r - pt]``; ``S[]`` reads a scalar."""

    tensor: str
    indices: tuple[Index, ...]

    @property
    def variables(self) -> tuple[str, ...]:
        """Index variables used by the access, in order (repeats kept)."""
        return tuple(v for i in self.indices if isinstance(i, Affine) for v in i.variables)

    @property
    def has_ellipsis(self) -> bool:
        """True when one index is ``...``."""
        return ELLIPSIS in self.indices

    def _own_params(self) -> frozenset[str]:
        return frozenset(p for i in self.indices if isinstance(i, Affine) for p in i.params())


@dataclass(frozen=True)
class Unary(Expr):
    """``-x`` (op ``'-'``) or ``not x`` (op ``'not'``)."""

    op: str
    operand: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.operand,)


@dataclass(frozen=True)
class Binary(Expr):
    """``left op right`` for arithmetic, comparison and logic operators."""

    op: str
    left: Expr
    right: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.left, self.right)


@dataclass(frozen=True)
class Call(Expr):
    """A function from :data:`FUNCTION_ARITIES`: ``exp(x)``, ``where(c, a, b)``, ``fill(X[i], 0)``."""

    func: str
    args: tuple[Expr, ...]

    def children(self) -> tuple[Expr, ...]:
        return self.args


@dataclass(frozen=True)
class ReduceVar:
    """A reduced variable with an optional range bound (a param name or a literal)."""

    name: str
    bound: str | int | None = None

    def __str__(self) -> str:
        return self.name if self.bound is None else f"{self.name}:{self.bound}"


@dataclass(frozen=True)
class Reduce(Expr):
    """``op[vars] body`` with op in :data:`REDUCTIONS`.

    Example:
        >>> from metadef.ops.semantics import parse_semantics
        >>> r = parse_semantics("Y[m] = sum[k] A[m,k] * B[k]").statements[0].rhs
        >>> r.op, r.var_names, [str(f) for f in r.factors()], r.is_contraction()
        ('sum', ('k',), ['A[m, k]', 'B[k]'], True)
    """

    op: str
    vars: tuple[ReduceVar, ...]
    body: Expr

    @property
    def var_names(self) -> tuple[str, ...]:
        """The reduced variables' names."""
        return tuple(v.name for v in self.vars)

    def factors(self) -> tuple[Expr, ...]:
        """The body split at its top-level ``*``: ``A * B * C`` gives ``(A, B, C)``."""
        return _factors(self.body)

    def is_contraction(self) -> bool:
        """True for a sum over a product of two or more tensor accesses."""
        fs = self.factors()
        return self.op == "sum" and len(fs) >= 2 and all(isinstance(f, Access) for f in fs)

    def children(self) -> tuple[Expr, ...]:
        return (self.body,)

    def _own_params(self) -> frozenset[str]:
        return frozenset(v.bound for v in self.vars if isinstance(v.bound, str))


def _factors(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Binary) and e.op == "*":
        return _factors(e.left) + (e.right,)
    return (e,)


# ------------------------------------------------------------------------ statements, program


@dataclass(frozen=True)
class Statement:
    """``lhs = rhs``: defines one tensor.

    Example:
        >>> from metadef.ops.semantics import parse_semantics
        >>> s = parse_semantics("Y[n,k] = B[k] + sum[c] X[n,c] * W[k,c]").statements[0]
        >>> s.index_vars, s.reduction_vars, s.is_elementwise(), s.is_contraction()
        (('n', 'k'), ('c',), False, False)
    """

    lhs: Access
    rhs: Expr

    @property
    def name(self) -> str:
        """The tensor the statement defines."""
        return self.lhs.tensor

    @property
    def index_vars(self) -> tuple[str, ...]:
        """The output (free) index variables, in left-hand-side order."""
        return self.lhs.variables

    @property
    def reduction_vars(self) -> tuple[str, ...]:
        """Variables bound by reductions anywhere in the right-hand side, first binding first."""
        names = (v for node in self.rhs.walk() if isinstance(node, Reduce) for v in node.var_names)
        return tuple(dict.fromkeys(names))

    def is_elementwise(self) -> bool:
        """No reductions, and every access's indices equal the LHS's or are a suffix of them."""
        if any(isinstance(node, Reduce) for node in self.rhs.walk()):
            return False
        target = self.lhs.indices
        return all(
            a.indices == target[len(target) - len(a.indices):] for a in self.rhs.accesses())

    def is_contraction(self) -> bool:
        """True when the RHS is ``sum[...] A[...] * B[...] * ...`` (see :meth:`Reduce.is_contraction`)."""
        return isinstance(self.rhs, Reduce) and self.rhs.is_contraction()

    def __str__(self) -> str:
        return f"{self.lhs} = {self.rhs}"


@dataclass(frozen=True)
class Program:
    """Statements run in order; earlier ones define temporaries that later ones read.

    Example:
        >>> from metadef.ops.semantics import parse_semantics
        >>> p = parse_semantics("t_max[...] = max[a] X[...,a]; Y[...,a] = X[...,a] - t_max[...]")
        >>> p.outputs, p.temporaries, p.inputs
        (('Y',), ('t_max',), ('X',))
    """

    statements: tuple[Statement, ...]

    @property
    def outputs(self) -> tuple[str, ...]:
        """Upper-case-initial LHS names; if there are none, the last statement's tensor."""
        names = tuple(s.name for s in self.statements if s.name[0].isupper())
        return names or (self.statements[-1].name,)

    @property
    def temporaries(self) -> tuple[str, ...]:
        """LHS names that are not outputs."""
        return tuple(s.name for s in self.statements if s.name not in self.outputs)

    @property
    def inputs(self) -> tuple[str, ...]:
        """Tensors read that no statement defines, in first-read order."""
        defined = {s.name for s in self.statements}
        read = (a.tensor for s in self.statements for a in s.rhs.accesses())
        return tuple(dict.fromkeys(t for t in read if t not in defined))

    def params(self) -> frozenset[str]:
        """Every param name the program reads."""
        return frozenset().union(*(s.rhs.params() | s.lhs.params() for s in self.statements))

    def statement(self, name: str) -> Statement:
        """The statement that defines tensor ``name`` (KeyError if none)."""
        for s in self.statements:
            if s.name == name:
                return s
        raise KeyError(name)

    def __str__(self) -> str:
        return "; ".join(str(s) for s in self.statements)


# -------------------------------------------------------------------------------- printing

_LEVELS = {"or": 0, "and": 1, "not": 2, "<": 3, "<=": 3, ">": 3, ">=": 3, "==": 3, "!=": 3,
           "+": 4, "-": 4, "*": 5, "/": 5, "%": 5, "**": 7}
_ATOM = 8


def _format(e: Expr, min_level: int) -> str:
    text, level = _format_node(e)
    return f"({text})" if level < min_level else text


def _operand(e: Expr, min_level: int) -> str:
    """An operand of an operator: a reduction always gets parentheses (it extends right)."""
    return f"({e})" if isinstance(e, Reduce) else _format(e, min_level)


def _format_node(e: Expr) -> tuple[str, int]:
    if isinstance(e, Number):
        return _format_number(e.value), _ATOM if e.value >= 0 else -1
    if isinstance(e, (Param, Var)):
        return e.name, _ATOM
    if isinstance(e, Access):
        return f"{e.tensor}[{', '.join(str(i) for i in e.indices)}]", _ATOM
    if isinstance(e, Call):
        return f"{e.func}({', '.join(_format(a, 0) for a in e.args)})", _ATOM
    if isinstance(e, Unary):
        level = _LEVELS["not"] if e.op == "not" else 6
        sep = " " if e.op == "not" else ""
        return f"{e.op}{sep}{_operand(e.operand, level)}", level
    if isinstance(e, Binary):
        level = _LEVELS[e.op]
        left_min, right_min = {3: (4, 4), 7: (_ATOM, 6)}.get(level, (level, level + 1))
        return f"{_operand(e.left, left_min)} {e.op} {_operand(e.right, right_min)}", level
    if isinstance(e, Reduce):
        head = f"{e.op}[{', '.join(str(v) for v in e.vars)}]"
        return f"{head} {' * '.join(_operand(f, 6) for f in e.factors())}", 6
    raise TypeError(f"not a semantic expression node: {e!r}")


def _format_number(value: float) -> str:
    if math.isnan(value):
        return "nan"
    if value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    return repr(value) if isinstance(value, float) else str(int(value))


__all__ = [
    "ACCESS_FUNCTIONS", "CAST_DTYPE_NAMES", "ELLIPSIS", "FUNCTION_ARITIES", "FUNCTION_NAMES",
    "KEYWORDS", "REDUCTIONS", "Access", "Affine", "Binary", "Call", "EllipsisIndex", "Expr",
    "Index", "Number", "Param", "Program", "Reduce", "ReduceVar", "Statement", "Term", "Unary",
    "Var", "is_lower_name",
]
