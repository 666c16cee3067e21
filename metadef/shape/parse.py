"""Parse dimension expressions from text: the inverse of ``str(expr)``.

Grammar (``/`` is floor division, as dims are non-negative integers)::

    expr   := term (('+' | '-') term)*
    term   := unary (('*' | '/' | '%') unary)*
    unary  := '-' unary | power
    power  := atom ('^' INT)?
    atom   := INT | NAME | NAME '(' args ')' | '(' expr ')'      NAME(...) in floor, ceil, min, max

``floor(a/b)`` and ``ceil(a/b)`` take one division as their argument.

Example:
    >>> str(parse_dim("batch*64 + 2*batch"))
    'batch*66'
    >>> parse_dim("12")
    12
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import lru_cache

from metadef.core.errors import DSLSyntaxError
from metadef.shape.expr import (
    Dim,
    add,
    ceildiv,
    floordiv,
    max_,
    min_,
    mod,
    mul,
    sub,
    sym,
)

_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z_0-9.]*)|(\S))")


def _tokens(text: str) -> list[tuple[str, str, int]]:
    out: list[tuple[str, str, int]] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            break
        if m.group(1):
            out.append(("int", m.group(1), m.start(1)))
        elif m.group(2):
            out.append(("name", m.group(2), m.start(2)))
        else:
            out.append(("op", m.group(3), m.start(3)))
        pos = m.end()
    out.append(("end", "", len(text)))
    return out


class _Parser:
    """A tiny recursive-descent parser; ``resolve`` maps a name to a dim (default: a symbol)."""

    def __init__(self, text: str, resolve: Callable[[str], Dim]) -> None:
        self.text = text
        self.toks = _tokens(text)
        self.i = 0
        self.resolve = resolve

    def error(self, what: str) -> DSLSyntaxError:
        pos = self.toks[self.i][2]
        return DSLSyntaxError(f"{what} in dimension expression {self.text!r} at column {pos + 1}:\n"
                              f"    {self.text}\n    {' ' * pos}^")

    def peek(self) -> tuple[str, str, int]:
        return self.toks[self.i]

    def take(self, value: str | None = None) -> tuple[str, str, int]:
        tok = self.toks[self.i]
        if value is not None and tok[1] != value:
            raise self.error(f"expected {value!r}, found {tok[1] or 'end of text'!r}")
        self.i += 1
        return tok

    def parse(self) -> Dim:
        value = self.expr()
        if self.peek()[0] != "end":
            raise self.error(f"unexpected {self.peek()[1]!r}")
        return value

    def expr(self) -> Dim:
        value = self.term()
        while self.peek()[1] in ("+", "-"):
            op = self.take()[1]
            rhs = self.term()
            value = add(value, rhs) if op == "+" else sub(value, rhs)
        return value

    def term(self) -> Dim:
        value = self.unary()
        while self.peek()[1] in ("*", "/", "%"):
            op = self.take()[1]
            rhs = self.unary()
            value = mul(value, rhs) if op == "*" else floordiv(value, rhs) if op == "/" else mod(value, rhs)
        return value

    def unary(self) -> Dim:
        if self.peek()[1] == "-":
            self.take()
            return mul(self.unary(), -1)
        return self.power()

    def power(self) -> Dim:
        base = self.atom()
        if self.peek()[1] == "^":
            self.take()
            kind, text, _ = self.take()
            if kind != "int":
                self.i -= 1
                raise self.error("expected an integer exponent")
            value: Dim = 1
            for _ in range(int(text)):
                value = mul(value, base)
            return value
        return base

    def atom(self) -> Dim:
        kind, text, _ = self.peek()
        if kind == "int":
            self.take()
            return int(text)
        if text == "(":
            self.take()
            value = self.expr()
            self.take(")")
            return value
        if kind == "name":
            self.take()
            if self.peek()[1] == "(" and text in ("floor", "ceil", "min", "max"):
                return self.call(text)
            return self.resolve(text)
        raise self.error(f"unexpected {text or 'end of text'!r}")

    def call(self, name: str) -> Dim:
        self.take("(")
        if name in ("floor", "ceil"):
            num = self.term_no_div()
            self.take("/")
            den = self.unary()
            self.take(")")
            return floordiv(num, den) if name == "floor" else ceildiv(num, den)
        args = [self.expr()]
        while self.peek()[1] == ",":
            self.take()
            args.append(self.expr())
        self.take(")")
        return min_(*args) if name == "min" else max_(*args)

    def term_no_div(self) -> Dim:
        # Inside floor(...)/ceil(...): the numerator is everything up to the top-level '/'.
        value = self.unary()
        while self.peek()[1] in ("*", "%", "+", "-"):
            op = self.take()[1]
            rhs = self.unary()
            value = {"*": mul, "%": mod, "+": add, "-": sub}[op](value, rhs)
        return value


@lru_cache(maxsize=4096)
def parse_dim(text: str) -> Dim:
    """Parse one dimension; unknown names become symbols.

    Example:
        >>> str(parse_dim("floor((seq + 1)/2)"))
        'floor((seq + 1)/2)'
    """
    return _Parser(str(text), sym).parse()


def parse_dim_with(text: str, names: Mapping[str, Dim]) -> Dim:
    """Parse a dimension, resolving names through ``names`` first (others become symbols).

    Example:
        >>> parse_dim_with("(H - R) / s + 1", {"H": 56, "R": 3, "s": 1})
        54
    """
    return _Parser(str(text), lambda n: names[n] if n in names else sym(n)).parse()


__all__ = ["parse_dim", "parse_dim_with"]
