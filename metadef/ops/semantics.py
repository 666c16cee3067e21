"""Semantic index expressions: what an operator computes, written once as a comprehension.

The numpy reference evaluator (``metadef.ops.numpy_eval.evaluate``) and the code generator
both read the immutable tree that :func:`parse_semantics` builds, so they cannot disagree.

Example:
    >>> prog = parse_semantics("Y[m,n] = alpha * sum[k] A[m,k] * B[k,n] + beta * C[m,n]")
    >>> str(prog)
    'Y[m, n] = alpha * (sum[k] A[m, k] * B[k, n]) + beta * C[m, n]'
    >>> prog.outputs, prog.inputs, sorted(prog.params())
    (('Y',), ('A', 'B', 'C'), ['alpha', 'beta'])

Grammar (EBNF; statements are separated by ``;`` or newlines, ``#`` starts a comment)::

    program    := stmt { (';' | NEWLINE) stmt }
    stmt       := access '=' expr
    expr       := and_expr { 'or' and_expr }
    and_expr   := not_expr { 'and' not_expr }
    not_expr   := 'not' not_expr | comparison
    comparison := additive [ ('<'|'<='|'>'|'>='|'=='|'!=') additive ]
    additive   := term { ('+'|'-') term }
    term       := unary { ('*'|'/'|'%') unary }
    unary      := '-' unary | reduction | power
    reduction  := ('sum'|'max'|'min'|'prod'|'mean') '[' rvar { ',' rvar } ']' unary { '*' unary }
    rvar       := NAME [ ':' (NAME | INT) ]
    power      := atom [ '**' unary ]
    atom       := NUMBER | 'inf' | 'nan' | NAME | access | NAME '(' [expr {',' expr}] ')'
                | '(' expr ')'
    access     := NAME '[' [ index { ',' index } ] ']'
    index      := '...' | iexpr
    iexpr      := iterm { ('+'|'-') iterm }
    iterm      := ifactor { '*' ifactor }
    ifactor    := '-' ifactor | INT | NAME | '(' iexpr ')'

A reduction's body is the *product* that follows it: ``sum[k] A[k] * B[k] + C`` is
``(sum[k] A[k] * B[k]) + C`` and ``sum[k] X[k] / N`` is ``(sum[k] X[k]) / N``; parenthesize
to reduce more (``sum[k] (A[k] + B[k])``).

Names in indices: a name is an *index variable* when a reduction binds it, or when it starts
with a lower-case letter or ``_`` and either appears in the left-hand side or is a whole index
by itself somewhere in the statement. Every other name in an index is an integer *param*
(``sh``, ``pt``, ``KG``). In value position an index-variable name reads the index itself.

Outputs and temporaries: every left-hand-side name that starts with an upper-case letter is an
output (:attr:`Program.outputs`); lower-case ones (``t_max``) are temporaries. When no name is
upper-case, the last statement's tensor is the output. Each tensor is defined once, and a
statement may read only inputs and tensors defined by earlier statements.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from metadef.core.errors import DSLSyntaxError
from metadef.ops.semantic_tree import (
    ACCESS_FUNCTIONS,
    CAST_DTYPE_NAMES,
    ELLIPSIS,
    FUNCTION_ARITIES,
    FUNCTION_NAMES,
    KEYWORDS,
    REDUCTIONS,
    Access,
    Affine,
    Binary,
    Call,
    EllipsisIndex,
    Expr,
    Index,
    Number,
    Param,
    Program,
    Reduce,
    ReduceVar,
    Statement,
    Term,
    Unary,
    Var,
    is_lower_name,
)

_TOKEN_RE = re.compile(r"""
    (?P<skip>[ \t\r]+|\#[^\n]*)
  | (?P<newline>\n)
  | (?P<number>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>\.\.\.|\*\*|<=|>=|==|!=|[-+*/%<>=()\[\],:;])
""", re.VERBOSE)
_COMPARISONS = frozenset({"<", "<=", ">", ">=", "==", "!="})

Poly = dict[tuple[str, ...], int]
"""An index while parsing: sorted names of a monomial -> integer coefficient."""


@dataclass(frozen=True)
class _Token:
    kind: str  # number | name | op | sep | end
    text: str
    pos: int


def _syntax_error(text: str, pos: int, message: str) -> DSLSyntaxError:
    line_no = text.count("\n", 0, pos) + 1
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    line = text[start:len(text) if end < 0 else end]
    col = pos - start
    return DSLSyntaxError(
        f"{message} at line {line_no}, column {col + 1}:\n    {line}\n    {' ' * col}^")


def _tokenize(text: str) -> list[_Token]:
    """Tokens; a newline outside brackets separates statements, like ``;``."""
    tokens: list[_Token] = []
    depth, pos = 0, 0
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if m is None:
            raise _syntax_error(text, pos, f"unexpected character {text[pos]!r}")
        kind, value = m.lastgroup or "", m.group()
        if value in ("(", "["):
            depth += 1
        elif value in (")", "]"):
            depth = max(0, depth - 1)
        if value == ";" or (kind == "newline" and depth == 0):
            tokens.append(_Token("sep", value, pos))
        elif kind not in ("skip", "newline"):
            tokens.append(_Token(kind, value, pos))
        pos = m.end()
    tokens.append(_Token("end", "", len(text)))
    return tokens


def _describe(tok: _Token) -> str:
    if tok.kind == "end":
        return "the end of the text"
    return "the end of the statement" if tok.kind == "sep" else repr(tok.text)


class _Parser:
    """Recursive descent over the grammar in the module docstring."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.i = 0

    # -- token helpers
    def peek(self, ahead: int = 0) -> _Token:
        return self.tokens[min(self.i + ahead, len(self.tokens) - 1)]

    def take(self) -> _Token:
        tok = self.peek()
        self.i = min(self.i + 1, len(self.tokens) - 1)
        return tok

    def accept(self, text: str, kind: str = "op") -> bool:
        if self.peek().kind == kind and self.peek().text == text:
            self.i += 1
            return True
        return False

    def expect(self, text: str) -> None:
        if not self.accept(text):
            self.fail(f"expected {text!r} but found {_describe(self.peek())}")

    def fail(self, message: str, tok: _Token | None = None) -> NoReturn:
        raise _syntax_error(self.text, (tok or self.peek()).pos, message)

    # -- statements
    def program(self) -> tuple[Statement, ...]:
        statements = []
        while True:
            while self.peek().kind == "sep":
                self.take()
            if self.peek().kind == "end":
                break
            statements.append(self.statement())
            if self.peek().kind not in ("sep", "end"):
                self.fail(f"expected ';' or a new line but found {_describe(self.peek())}")
        if not statements:
            self.fail("a semantic program needs at least one statement")
        return tuple(statements)

    def statement(self) -> Statement:
        start = self.peek()
        if start.kind != "name" or self.peek(1).text != "[":
            self.fail("a statement starts with the tensor it defines, like Y[i, j] = ...")
        lhs = self.access()
        self.expect("=")
        rhs = self.expr()
        source = self.text[start.pos:self.peek().pos].strip()

        def fail(message: str) -> NoReturn:
            raise _syntax_error(self.text, start.pos, f"{message} in {source!r}")

        return _resolve_statement(lhs, rhs, fail)

    # -- expressions, lowest precedence first
    def expr(self) -> Expr:
        left = self.and_expr()
        while self.accept("or", "name"):
            left = Binary("or", left, self.and_expr())
        return left

    def and_expr(self) -> Expr:
        left = self.not_expr()
        while self.accept("and", "name"):
            left = Binary("and", left, self.not_expr())
        return left

    def not_expr(self) -> Expr:
        if self.accept("not", "name"):
            return Unary("not", self.not_expr())
        return self.comparison()

    def comparison(self) -> Expr:
        left = self.additive()
        tok = self.peek()
        if tok.kind != "op" or tok.text not in _COMPARISONS:
            return left
        self.take()
        right = self.additive()
        if self.peek().text in _COMPARISONS:
            self.fail("comparisons do not chain: combine them with 'and'")
        return Binary(tok.text, left, right)

    def binary_chain(self, ops: tuple[str, ...], operand: Callable[[], Expr]) -> Expr:
        left = operand()
        while self.peek().kind == "op" and self.peek().text in ops:
            left = Binary(self.take().text, left, operand())
        return left

    def additive(self) -> Expr:
        return self.binary_chain(("+", "-"), self.term)

    def term(self) -> Expr:
        return self.binary_chain(("*", "/", "%"), self.unary)

    def unary(self) -> Expr:
        if self.accept("-"):
            return Unary("-", self.unary())
        if self.peek().text in REDUCTIONS and self.peek(1).text == "[":
            return self.reduction()
        base = self.atom()
        return Binary("**", base, self.unary()) if self.accept("**") else base

    def reduction(self) -> Reduce:
        op = self.take().text
        self.expect("[")
        rvars = [self.reduce_var()]
        while self.accept(","):
            rvars.append(self.reduce_var())
        self.expect("]")
        return Reduce(op, tuple(rvars), self.binary_chain(("*",), self.unary))

    def reduce_var(self) -> ReduceVar:
        tok = self.take()
        if tok.kind != "name" or tok.text in KEYWORDS:
            self.fail(f"expected a variable to reduce but found {_describe(tok)}", tok)
        if not self.accept(":"):
            return ReduceVar(tok.text)
        bound = self.take()
        if bound.kind == "name" and bound.text not in KEYWORDS:
            return ReduceVar(tok.text, bound.text)
        if bound.kind == "number" and bound.text.isdigit():
            return ReduceVar(tok.text, int(bound.text))
        self.fail(f"a range bound is a param or an integer, not {_describe(bound)}", bound)

    def atom(self) -> Expr:
        tok = self.take()
        if tok.kind == "number":
            is_float = any(c in tok.text for c in ".eE")
            return Number(float(tok.text) if is_float else int(tok.text))
        if tok.kind == "op" and tok.text == "(":
            inner = self.expr()
            self.expect(")")
            return inner
        if tok.kind == "name" and tok.text in ("inf", "nan"):
            return Number(float(tok.text))
        if tok.kind == "name" and tok.text not in KEYWORDS:
            if self.peek().text == "[":
                self.i -= 1
                return self.access()
            if self.peek().text == "(":
                return self.call(tok)
            return Param(tok.text)
        self.fail(f"expected a value but found {_describe(tok)}", tok)

    def call(self, name: _Token) -> Call:
        self.expect("(")
        args: list[Expr] = []
        if not self.accept(")"):
            args.append(self.expr())
            while self.accept(","):
                args.append(self.expr())
            self.expect(")")
        arity = FUNCTION_ARITIES.get(name.text)
        if arity is None:
            near = difflib.get_close_matches(name.text, FUNCTION_NAMES, n=3)
            hint = f"; did you mean {', '.join(near)}?" if near else ""
            self.fail(f"unknown function {name.text!r}{hint}", name)
        if len(args) != arity:
            self.fail(f"{name.text} takes {arity} argument(s), got {len(args)}", name)
        if name.text in ACCESS_FUNCTIONS and not isinstance(args[0], Access):
            self.fail(f"the first argument of {name.text} must be a tensor access", name)
        return Call(name.text, tuple(args))

    # -- accesses and integer indices
    def access(self) -> Access:
        name = self.take()
        self.expect("[")
        indices: list[Index] = []
        if not self.accept("]"):
            indices.append(self.index())
            while self.accept(","):
                indices.append(self.index())
            self.expect("]")
        if indices.count(ELLIPSIS) > 1:
            self.fail(f"{name.text} uses '...' more than once", name)
        return Access(name.text, tuple(indices))

    def index(self) -> Index:
        if self.accept("..."):
            return ELLIPSIS
        poly = self.index_sum()
        return Affine(tuple(Term(c, None, names) for names, c in poly.items() if c != 0))

    def index_sum(self) -> Poly:
        poly = self.index_product()
        while self.peek().text in ("+", "-"):
            sign = 1 if self.take().text == "+" else -1
            for names, c in self.index_product().items():
                poly[names] = poly.get(names, 0) + sign * c
        return poly

    def index_product(self) -> Poly:
        poly = self.index_factor()
        while self.accept("*"):
            other = self.index_factor()
            product: Poly = {}
            for n1, c1 in poly.items():
                for n2, c2 in other.items():
                    key = tuple(sorted(n1 + n2))
                    product[key] = product.get(key, 0) + c1 * c2
            poly = product
        return poly

    def index_factor(self) -> Poly:
        if self.accept("-"):
            return {names: -c for names, c in self.index_factor().items()}
        tok = self.take()
        if tok.kind == "number" and tok.text.isdigit():
            return {(): int(tok.text)}
        if tok.kind == "name" and tok.text not in KEYWORDS:
            return {(tok.text,): 1}
        if tok.text == "(":
            poly = self.index_sum()
            self.expect(")")
            return poly
        self.fail(f"expected an integer index (variables, params, integers, + - *) "
                  f"but found {_describe(tok)}", tok)


# ------------------------------------------------------------------ naming and scope rules

Fail = Callable[[str], NoReturn]


def _statement_variables(lhs: Access, rhs: Expr) -> set[str]:
    """Index-variable names: reduced ones, and lower-case names in the LHS or used bare."""
    names = {v for node in rhs.walk() if isinstance(node, Reduce) for v in node.var_names}
    for idx in lhs.indices:
        if isinstance(idx, Affine):
            names |= {n for t in idx.terms for n in t.params if is_lower_name(n)}
    for access in (lhs, *rhs.accesses()):
        for idx in access.indices:
            if isinstance(idx, Affine) and len(idx.terms) == 1:
                t = idx.terms[0]
                if t.coef == 1 and len(t.params) == 1 and is_lower_name(t.params[0]):
                    names.add(t.params[0])
    return names


def _resolve_affine(idx: Index, variables: set[str], fail: Fail) -> Index:
    if isinstance(idx, EllipsisIndex):
        return idx
    terms = []
    for t in idx.terms:
        found = [n for n in t.params if n in variables]
        if len(found) > 1:
            fail(f"index {idx} multiplies index variables {' and '.join(found)} "
                 f"(indices must be affine)")
        params = list(t.params)
        if found:
            params.remove(found[0])
        terms.append(Term(t.coef, found[0] if found else None, tuple(params)))
    return Affine(tuple(terms))


def _resolve_expr(e: Expr, variables: set[str], fail: Fail) -> Expr:
    """Rebuild ``e`` with names classified as index variables or params."""
    def again(x: Expr) -> Expr:
        return _resolve_expr(x, variables, fail)

    if isinstance(e, Param):
        return Var(e.name) if e.name in variables else e
    if isinstance(e, Access):
        return Access(e.tensor, tuple(_resolve_affine(i, variables, fail) for i in e.indices))
    if isinstance(e, Unary):
        return Unary(e.op, again(e.operand))
    if isinstance(e, Binary):
        return Binary(e.op, again(e.left), again(e.right))
    if isinstance(e, Call):
        return Call(e.func, tuple(again(a) for a in e.args))
    if isinstance(e, Reduce):
        return Reduce(e.op, e.vars, again(e.body))
    return e


def _check_scope(e: Expr, bound: frozenset[str], outputs: frozenset[str], fail: Fail) -> None:
    """Every variable read is an output index or bound by an enclosing reduction."""
    used = e.variables if isinstance(e, Access) else (e.name,) if isinstance(e, Var) else ()
    for v in used:
        if v not in bound and v not in outputs:
            fail(f"index variable {v} is neither an output index nor bound by an enclosing "
                 f"reduction (reduce it with sum[{v}] ..., or make it a param by spelling it "
                 f"with an upper-case first letter)")
    if isinstance(e, Reduce):
        names = e.var_names
        if len(set(names)) != len(names):
            fail(f"{e.op}[{', '.join(names)}] names a variable twice")
        for v in names:
            if v in outputs:
                fail(f"reduction variable {v} is also an output index")
        bound = bound | frozenset(names)
    if isinstance(e, Access) and e.has_ellipsis and "..." not in outputs:
        fail(f"{e} uses '...' but the left-hand side does not")
    for child in e.children():
        _check_scope(child, bound, outputs, fail)


def _check_lhs(lhs: Access, fail: Fail) -> None:
    seen: set[str] = set()
    for idx in lhs.indices:
        if isinstance(idx, Affine) and not idx.variables:
            fail(f"output index {idx} of {lhs.tensor} has no index variable (write a keep-dims "
                 f"axis as a variable whose range 1 comes from out_shapes)")
        for v in idx.variables if isinstance(idx, Affine) else ():
            if v in seen:
                fail(f"output index variable {v} appears twice in {lhs}")
            seen.add(v)


def _resolve_statement(lhs: Access, rhs: Expr, fail: Fail) -> Statement:
    variables = _statement_variables(lhs, rhs)
    lhs_resolved = _resolve_expr(lhs, variables, fail)
    assert isinstance(lhs_resolved, Access)
    stmt = Statement(lhs_resolved, _resolve_expr(rhs, variables, fail))
    _check_lhs(stmt.lhs, fail)
    outputs = frozenset(stmt.index_vars) | ({"..."} if stmt.lhs.has_ellipsis else frozenset())
    _check_scope(stmt.rhs, frozenset(), outputs, fail)
    return stmt


# ------------------------------------------------------------------------------- programs


@functools.lru_cache(maxsize=1024)
def parse_semantics(text: str) -> Program:
    """Parse a semantic program; a :class:`DSLSyntaxError` points at the faulty spot.

    Example:
        >>> str(parse_semantics("Y[j,i]=X[i,j]"))
        'Y[j, i] = X[i, j]'
        >>> parse_semantics("Y[i] = X[i] +")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        metadef.core.errors.DSLSyntaxError: expected a value but found the end of the text ...
    """
    statements = _Parser(text).program()
    _check_program(statements)
    return Program(statements)


def _check_program(statements: tuple[Statement, ...]) -> None:
    """Each tensor is defined once, and read only after its statement."""
    defined: set[str] = set()
    all_defined = {s.name for s in statements}
    for s in statements:
        if s.name in defined:
            raise DSLSyntaxError(f"tensor {s.name} is defined twice (again in {str(s)!r})")
        for a in s.rhs.accesses():
            if a.tensor in all_defined and a.tensor not in defined:
                raise DSLSyntaxError(
                    f"{str(s)!r} reads {a.tensor} before its defining statement has run")
        defined.add(s.name)


__all__ = [
    "ACCESS_FUNCTIONS", "CAST_DTYPE_NAMES", "ELLIPSIS", "FUNCTION_ARITIES", "FUNCTION_NAMES",
    "KEYWORDS", "REDUCTIONS", "Access", "Affine", "Binary", "Call", "EllipsisIndex", "Expr",
    "Index", "Number", "Param", "Program", "Reduce", "ReduceVar", "Statement", "Term", "Unary",
    "Var", "parse_semantics",
]
