"""The kernel expression IR: what one output element is, in terms of loop variables.

Lowering (:mod:`metadef.codegen.lower`) composes the semantic programs of a group's nodes
into one tree per group output, with every intermediate inlined. The nodes are frozen
dataclasses, so equal subtrees compare (and hash) equal: the emitter computes each once per
loop level, and a reduction that several consumers read (softmax's max, layer norm's mean) is
one loop.

Integer indices are :class:`Lin`: affine forms whose coefficients are symbolic dims
(:mod:`metadef.shape`), evaluated at run time from the sizes the kernel receives.

A value's dtype is a numpy dtype, or None for a *weak* Python scalar (a literal or a param),
which takes the dtype of what it meets (numpy 2's promotion rules, as the reference evaluator).

Example:
    >>> x = Load(0, (Axis(Lin.var("i"), 4, "plain"),), np.dtype("float32"))
    >>> y = Op("*", (x, Const(2.0)), np.dtype("float32"))
    >>> sorted(free_vars(y)), y.dtype.name
    (['i'], 'float32')
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from metadef.shape import Dim, add, mul

INT64 = np.dtype(np.int64)

# ------------------------------------------------------------------------------- indices


@dataclass(frozen=True)
class Lin:
    """``offset + sum(coef * var)``; terms sorted by variable name, no zero coefficients.

    Example:
        >>> str(Lin.var("i").scale(2).plus(Lin.const(1)))
        '1 + 2*i'
    """

    terms: tuple[tuple[str, Dim], ...] = ()
    offset: Dim = 0

    @staticmethod
    def var(name: str) -> Lin:
        return Lin(((name, 1),))

    @staticmethod
    def const(value: Dim) -> Lin:
        return Lin((), value)

    def plus(self, other: Lin) -> Lin:
        coefs = dict(self.terms)
        for v, c in other.terms:
            coefs[v] = add(coefs.get(v, 0), c)
        return Lin(_clean(coefs), add(self.offset, other.offset))

    def scale(self, factor: Dim) -> Lin:
        if _is(factor, 0):
            return Lin()
        return Lin(_clean({v: mul(c, factor) for v, c in self.terms}), mul(self.offset, factor))

    def substitute(self, env: dict[str, Lin]) -> Lin:
        """Replace variables by forms (variables missing from ``env`` stay)."""
        out = Lin((), self.offset)
        for v, c in self.terms:
            out = out.plus(env[v].scale(c) if v in env else Lin(((v, c),)))
        return out

    @property
    def variables(self) -> tuple[str, ...]:
        return tuple(v for v, _ in self.terms)

    @property
    def bare(self) -> str | None:
        """The variable when the form is exactly ``1*v``."""
        if len(self.terms) == 1 and _is(self.terms[0][1], 1) and _is(self.offset, 0):
            return self.terms[0][0]
        return None

    def is_const(self) -> bool:
        return not self.terms

    def __str__(self) -> str:
        parts = [] if _is(self.offset, 0) else [str(self.offset)]
        parts += [v if _is(c, 1) else f"{c}*{v}" for v, c in self.terms]
        return " + ".join(parts) or "0"


def _is(d: Dim, value: int) -> bool:
    return isinstance(d, int) and d == value


def _clean(coefs: dict[str, Dim]) -> tuple[tuple[str, Dim], ...]:
    return tuple(sorted(((v, c) for v, c in coefs.items() if not _is(c, 0)), key=lambda t: t[0]))


@dataclass(frozen=True)
class Axis:
    """How a load indexes one axis of its tensor (of length ``dim``).

    ``mode``: ``plain`` (in bounds by construction), ``zero`` (a length-1 axis that
    broadcasts: the index is ignored), ``maybe`` (broadcasts when the run-time dim is 1),
    ``checked`` (may fall outside: read ``fill`` there).
    """

    index: Lin
    dim: Dim
    mode: str


# ---------------------------------------------------------------------------- expressions


class Node:
    """Base class of the expression nodes; ``dtype`` None means a weak Python scalar."""

    dtype: np.dtype | None

    def children(self) -> tuple[Node, ...]:
        return ()


@dataclass(frozen=True)
class Const(Node):
    """A literal; ``dtype`` None keeps it weak (``0.5`` next to float16 stays float16)."""

    value: int | float | bool
    dtype: np.dtype | None = None


@dataclass(frozen=True)
class Size(Node):
    """A symbolic size used as a value (a weak int known at run time)."""

    dim: Dim
    dtype: np.dtype | None = None


@dataclass(frozen=True)
class IndexValue(Node):
    """An index read as a value (int64)."""

    index: Lin
    dtype: np.dtype | None = INT64


@dataclass(frozen=True)
class Load(Node):
    """Element ``axes`` of kernel input ``tensor``; ``fill`` where a checked axis is outside."""

    tensor: int
    axes: tuple[Axis, ...]
    dtype: np.dtype | None
    fill: int | float | bool = 0


@dataclass(frozen=True)
class InBounds(Node):
    """1 (in ``dtype``) where every checked axis of the access is inside, else 0."""

    axes: tuple[Axis, ...]
    dtype: np.dtype | None


@dataclass(frozen=True)
class Op(Node):
    """An operator or function of the semantic language (``+``, ``exp``, ``cast``, ...)."""

    name: str
    args: tuple[Node, ...]
    dtype: np.dtype | None

    def children(self) -> tuple[Node, ...]:
        return self.args


@dataclass(frozen=True)
class Reduce(Node):
    """``op`` over ``vars`` (extents ``extents``) of ``body``, accumulated in ``acc``."""

    op: str
    vars: tuple[str, ...]
    extents: tuple[Dim, ...]
    body: Node
    acc: np.dtype
    dtype: np.dtype | None

    def children(self) -> tuple[Node, ...]:
        return (self.body,)


def _index_vars(node: Node) -> set[str]:
    if isinstance(node, (Load, InBounds)):
        return {v for a in node.axes if a.mode != "zero" for v in a.index.variables}
    if isinstance(node, IndexValue):
        return set(node.index.variables)
    return set()


@lru_cache(maxsize=1 << 16)
def free_vars(node: Node) -> frozenset[str]:
    """Loop variables the value depends on (a reduction's own variables excluded)."""
    found = _index_vars(node)
    for child in node.children():
        found |= free_vars(child)
    if isinstance(node, Reduce):
        found -= set(node.vars)
    return frozenset(found)


def walk(node: Node) -> list[Node]:
    """Every node, children first (post-order), each distinct subtree once."""
    seen: dict[Node, None] = {}

    def visit(n: Node) -> None:
        if n in seen:
            return
        for c in n.children():
            visit(c)
        seen[n] = None
    visit(node)
    return list(seen)


__all__ = ["Axis", "Const", "InBounds", "IndexValue", "Lin", "Load", "Node", "Op", "Reduce",
           "Size", "free_vars", "walk"]
