"""The pattern language: what a rewrite rule looks for.

A pattern matches a *value* (an edge): ``op(...)`` matches a value produced by a node of that
op (or, with ``role=``, of any op of that fusion role), ``var()`` matches any value, ``const()``
a compile-time constant. Patterns bind names; predicates look at attributes, shapes, dtypes,
constness and the number of consumers.

Some conditions are *soft*: when everything else matches but an interior value has other
consumers, or a node is marked ``no_fuse``, the match is returned with the reasons, so the
engine can log "refused ... because ..." instead of staying silent.

Example:
    >>> from metadef.ir import parse_graph
    >>> g = parse_graph('''graph g(%x: f32[n], %b: f32[n]) -> (%y) {
    ...   %s: f32[n] = Add(%x, %b) @add
    ...   %y: f32[n] = Relu(%s) @relu
    ...   return %y
    ... }''')
    >>> pat = op("Relu", op("Add", var("x"), var("b"), name="add", single_use=True), name="relu")
    >>> m = match(pat, g.value("y"), lambda v: 1)
    >>> m.node("add").name, m.value("x").name, m.refusals
    ('add', 'x', [])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from metadef.ir import Node, Value
from metadef.ops import Role

Predicate = Callable[..., bool]


@dataclass(frozen=True)
class Pattern:
    """Base of all patterns."""


@dataclass(frozen=True)
class VarPattern(Pattern):
    """Any value (optionally: a constant, or one satisfying ``where(value)``)."""

    name: str | None = None
    where: Predicate | None = None
    constant: bool = False


@dataclass(frozen=True)
class OpPattern(Pattern):
    """A value produced by a node of ``op`` (or of fusion ``role``) whose inputs match ``inputs``.

    ``inputs=None`` accepts any inputs; otherwise the node's inputs (trailing omitted optional
    inputs ignored) must match one for one, in either order when ``commutative``. ``attrs``
    maps an attribute to a required value or a predicate of the value; ``where(node)`` is any
    other check. ``single_use``: the value must have exactly one reader (soft).
    """

    op: str | None = None
    inputs: tuple[Pattern, ...] | None = None
    name: str | None = None
    role: Role | None = None
    domain: str = ""
    attrs: Mapping[str, Any] = field(default_factory=dict)
    where: Predicate | None = None
    commutative: bool = False
    single_use: bool = False
    output: int = 0


def op(op_name: str | None, *inputs: Pattern, name: str | None = None, **kw: Any) -> OpPattern:
    """``op("Relu", var("x"), name="relu")``: a node of op Relu whose one input is bound to x;
    the node is bound to ``name``. Without inputs, any inputs match.
    ``op(None, role=Role.ELEMENTWISE)`` matches by fusion role."""
    return OpPattern(op_name, tuple(inputs) if inputs else None, name, **kw)


def var(name: str | None = None, where: Predicate | None = None) -> VarPattern:
    """Any value, bound to ``name``."""
    return VarPattern(name, where)


def const(name: str | None = None, where: Predicate | None = None) -> VarPattern:
    """A constant value (weights, folded shapes), bound to ``name``."""
    return VarPattern(name, where, constant=True)


@dataclass
class Match:
    """Bindings of a successful match, the nodes it covers, and soft reasons to refuse it."""

    bindings: dict[str, Value | Node] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)

    def node(self, name: str) -> Node:
        got = self.bindings[name]
        assert isinstance(got, Node), f"{name} is bound to a value, not a node"
        return got

    def value(self, name: str) -> Value:
        """A bound value; for a bound node, its first output."""
        got = self.bindings[name]
        return got.outputs[0] if isinstance(got, Node) else got

    def has(self, name: str) -> bool:
        return name in self.bindings

    def copy(self) -> Match:
        return Match(dict(self.bindings), list(self.nodes), list(self.refusals))


def _attr_ok(node: Node, key: str, want: Any) -> bool:
    have = node.attrs.get(key)
    if have is None:
        spec = node.metaop.attrs.get(key)
        have = None if spec is None else spec.default
    if callable(want):
        return bool(want(have))
    if isinstance(want, list):
        want = tuple(want)
    return have == want


def _bind(m: Match, name: str | None, thing: Value | Node) -> bool:
    if name is None:
        return True
    seen = m.bindings.get(name)
    if seen is not None:
        return seen is thing
    m.bindings[name] = thing
    return True


def _match_var(p: VarPattern, v: Value | None, m: Match) -> Match | None:
    if v is None:
        return None
    if p.constant and v.const is None:
        return None
    if p.where is not None and not p.where(v):
        return None
    return m if _bind(m, p.name, v) else None


def _node_ok(p: OpPattern, n: Node) -> bool:
    if p.op is not None and (n.op != p.op or (n.domain or "") != p.domain):
        return False
    if p.role is not None and n.metaop.role is not p.role:
        return False
    if any(not _attr_ok(n, k, want) for k, want in p.attrs.items()):
        return False
    return p.where is None or bool(p.where(n))


def _match_op(p: OpPattern, v: Value | None, m: Match, uses: Callable[[Value], int], root: bool) -> Match | None:
    if v is None or v.producer is None:
        return None
    n = v.producer
    if p.output >= len(n.outputs) or n.outputs[p.output] is not v or not _node_ok(p, n):
        return None
    if not _bind(m, p.name, n):
        return None
    if n not in m.nodes:
        m.nodes.append(n)
    if not root:
        if p.single_use and uses(v) != 1:
            m.refusals.append(f"%{v.name} has {uses(v)} consumers")
        if n.meta.get("no_fuse"):
            m.refusals.append(f"{n.name} is marked no_fuse")
    if p.inputs is None:
        return m
    actual = list(n.inputs)
    while actual and actual[-1] is None:
        actual.pop()
    if len(actual) != len(p.inputs):
        return None
    orders = [list(p.inputs)]
    if p.commutative and len(p.inputs) == 2:
        orders.append(list(reversed(p.inputs)))
    for order in orders:
        trial: Match | None = m.copy()
        for sub, val in zip(order, actual):
            trial = _match(sub, val, trial, uses, root=False) if trial is not None else None
        if trial is not None:
            return trial
    return None


def _match(p: Pattern, v: Value | None, m: Match, uses: Callable[[Value], int], root: bool) -> Match | None:
    if isinstance(p, VarPattern):
        return _match_var(p, v, m)
    if isinstance(p, OpPattern):
        return _match_op(p, v, m, uses, root)
    raise TypeError(f"not a pattern: {p!r}")


def match(p: Pattern, value: Value, uses: Callable[[Value], int]) -> Match | None:
    """Match ``p`` against ``value``; ``uses(v)`` counts the readers of a value. A root node
    marked no_fuse is checked by the engine (it knows whether the rule fuses)."""
    return _match(p, value, Match(), uses, root=True)


def root_ops(p: Pattern) -> Sequence[str] | None:
    """The op names a pattern's root can have (None: any), to index rules by op."""
    if isinstance(p, OpPattern) and p.op is not None:
        return (p.op,)
    return None


__all__ = ["Match", "OpPattern", "Pattern", "VarPattern", "const", "match", "op", "root_ops", "var"]
