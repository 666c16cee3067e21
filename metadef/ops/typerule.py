"""The type-rule DSL: shape and dtype inference written the way a paper writes it.

::

    rule conv2d_type_infer:
      input:  tensor<N,C,H,W; T>
      weight: tensor<K,CG,R,S; T>
      output: tensor<N,K,P,Q; T>
      where P = (H + pads[0] + pads[2] - dilations[0]*(R-1) - 1) / strides[0] + 1
            Q = (W + pads[1] + pads[3] - dilations[1]*(S-1) - 1) / strides[1] + 1
            require C == CG * group

A clause ``label: tensor<dims; dtype>`` binds one parameter of the op: the one whose name
matches the label (case-insensitive), else the next unbound one (inputs, then outputs).
``label?:`` marks an optional input. Dims are names (bound on first sight, checked for
agreement after), integers, ``_`` (anything), ``*G`` (a group of leading dims, broadcast
numpy-style where two inputs share it) or, in outputs, any dimension expression. The compact
form ``tensor<NCHW, float32>`` (one letter a dim) is accepted too. In ``where``, ``X = expr``
defines a name and ``require a == b`` (or ``!=``, ``<=``, ``<``) checks a constraint; ``/`` is
floor division; names resolve to bound dims, then to ``params`` given by the caller, then to
attributes (``strides[0]`` indexes a list attribute). ``dtype`` is a type variable or a
concrete dtype name (outputs only; inputs are checked by the op's constraints).

Example:
    >>> r = compile_rule('''rule mm: a: tensor<*B,M,K; T>
    ...                     b: tensor<*B,K,N; T>
    ...                     y: tensor<*B,M,N; T>''')
    >>> [c.label for c in r.clauses]
    ['a', 'b', 'y']
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from metadef.core.dtypes import dtype as lookup_dtype
from metadef.core.errors import DSLSyntaxError, ShapeError
from metadef.shape import (
    Decision,
    Dim,
    TensorType,
    broadcast_shapes,
    equal,
    parse_dim_with,
    sub,
)

if TYPE_CHECKING:
    from metadef.ops.infer import InferContext


@dataclass(frozen=True)
class DimPattern:
    """One dim of a clause: a name, an int, ``_``, a group ``*G``, or an expression (outputs)."""

    text: str
    group: bool = False

    @property
    def is_name(self) -> bool:
        return re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.text) is not None and self.text != "_"


@dataclass(frozen=True)
class Clause:
    label: str
    optional: bool
    dims: tuple[DimPattern, ...] | None   # None: any shape (``tensor<?; T>``)
    dtype: str | None


@dataclass(frozen=True)
class Where:
    kind: str          # "let" or "require"
    lhs: str
    op: str
    rhs: str


_HEADER = re.compile(r"^\s*rule\s+([A-Za-z_][A-Za-z0-9_]*)\s*:\s*")
_CLAUSE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\??)\s*:\s*tensor\s*<([^>]*)>")
_REQUIRE = re.compile(r"^\s*require\s+(.+?)\s*(==|!=|<=|<)\s*(.+?)\s*$")
_LET = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.+?)\s*$")
_INDEXED = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\[(-?\d+)\]")


@dataclass(frozen=True)
class TypeRule:
    """A compiled type rule; call it with an InferContext to get the output types."""

    name: str
    clauses: tuple[Clause, ...]
    wheres: tuple[Where, ...]
    text: str

    def __call__(self, ctx: InferContext, params: Mapping[str, Any] | None = None) -> list[Any]:
        return _apply(self, ctx, dict(params or {}))


def _parse_dims(body: str, where: str) -> tuple[tuple[DimPattern, ...] | None, str | None]:
    if ";" in body:
        dims_text, dt_text = body.rsplit(";", 1)
    else:  # compact form: tensor<NCHW, float32>, or tensor<N,C,H,W> with no dtype
        parts = [p.strip() for p in body.split(",")]
        if len(parts) == 2 and re.fullmatch(r"[A-Z]+", parts[0]) and re.fullmatch(r"[a-z][a-z0-9_]*", parts[1]):
            return tuple(DimPattern(ch) for ch in parts[0]), parts[1]
        dims_text, dt_text = body, ""
    dims_text = dims_text.strip()
    dt_name = dt_text.strip() or None
    if dims_text == "?":
        return None, dt_name
    if not dims_text:
        return (), dt_name
    dims: list[DimPattern] = []
    depth, start = 0, 0
    pieces = []
    for i, ch in enumerate(dims_text):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            pieces.append(dims_text[start:i])
            start = i + 1
    pieces.append(dims_text[start:])
    for piece in (p.strip() for p in pieces):
        if not piece:
            raise DSLSyntaxError(f"empty dim in {where}: tensor<{body}>")
        if piece.startswith("*"):
            dims.append(DimPattern(piece[1:].strip(), group=True))
        else:
            dims.append(DimPattern(piece))
    if sum(d.group for d in dims) > 1:
        raise DSLSyntaxError(f"at most one *group per tensor in {where}: tensor<{body}>")
    return tuple(dims), dt_name


def compile_rule(text: str) -> TypeRule:
    """Parse a rule; syntax errors name the rule and the offending line."""
    m = _HEADER.match(text)
    if m is None:
        raise DSLSyntaxError(f"a type rule starts with 'rule NAME:', got {text.strip()[:40]!r}")
    name = m.group(1)
    body = text[m.end():]
    where_at = re.search(r"(^|\s)where\s", body)
    head, tail = (body[:where_at.start()], body[where_at.end():]) if where_at else (body, "")
    clauses = []
    pos = 0
    for cm in _CLAUSE.finditer(head):
        gap = head[pos:cm.start()].strip()
        if gap:
            raise DSLSyntaxError(f"rule {name}: cannot read {gap!r} (expected 'label: tensor<...>')")
        dims, dt_name = _parse_dims(cm.group(3), f"rule {name}, clause {cm.group(1)}")
        clauses.append(Clause(cm.group(1), cm.group(2) == "?", dims, dt_name))
        pos = cm.end()
    if head[pos:].strip():
        raise DSLSyntaxError(f"rule {name}: cannot read {head[pos:].strip()!r}")
    if not clauses:
        raise DSLSyntaxError(f"rule {name} has no tensor clauses")
    wheres = []
    for line in filter(None, (ln.strip() for ln in re.split(r"\n|;", tail))):
        if (rm := _REQUIRE.match(line)) is not None:
            wheres.append(Where("require", rm.group(1), rm.group(2), rm.group(3)))
        elif (lm := _LET.match(line)) is not None:
            wheres.append(Where("let", lm.group(1), "=", lm.group(2)))
        else:
            raise DSLSyntaxError(f"rule {name}: cannot read where-line {line!r} "
                                 "(expected 'NAME = expr' or 'require a == b')")
    rule = TypeRule(name, tuple(clauses), tuple(wheres), text)
    for w in rule.wheres:  # check the expressions parse (names unresolved become symbols)
        for side in (w.lhs, w.rhs) if w.kind == "require" else (w.rhs,):
            parse_dim_with(_INDEXED.sub(lambda mm: f"{mm.group(1)}__{mm.group(2).replace('-', 'm')}", side), {})
    return rule


def _eval(text: str, names: dict[str, Any], ctx: InferContext, rule: TypeRule) -> Dim:
    def indexed(mm: re.Match) -> str:
        attr, idx = mm.group(1), int(mm.group(2))
        value = names.get(attr, ctx.attrs.get(attr))
        if not isinstance(value, (tuple, list)) or not -len(value) <= idx < len(value):
            ctx.fail(f"rule {rule.name} reads {attr}[{idx}] but {attr} is {value!r}")
        key = f"{attr}__{str(idx).replace('-', 'm')}"
        names[key] = value[idx]
        return key

    resolved = _INDEXED.sub(indexed, text)
    scope = {k: v for k, v in ctx.attrs.items() if isinstance(v, int) and not isinstance(v, bool)}
    scope.update(names)
    return parse_dim_with(resolved, scope)


def _bind_params(rule: TypeRule, ctx: InferContext) -> list[tuple[Clause, str, int]]:
    """Pair each clause with ("in"|"out", index) of the op parameter it describes."""
    params = [("in", i, p.name) for i, p in enumerate(ctx.op.inputs)]
    params += [("out", i, p.name) for i, p in enumerate(ctx.op.outputs)]
    taken: set[int] = set()
    pairs: list[tuple[Clause, str, int]] = []
    for clause in rule.clauses:
        hit = next((k for k, (_s, _i, n) in enumerate(params)
                    if k not in taken and n.lower() == clause.label.lower()), None)
        if hit is None:
            hit = next((k for k in range(len(params)) if k not in taken), None)
        if hit is None:
            raise DSLSyntaxError(f"rule {rule.name} has more clauses than {ctx.op.name} has parameters")
        taken.add(hit)
        pairs.append((clause, params[hit][0], params[hit][1]))
    return pairs


def _unify(rule: TypeRule, ctx: InferContext, clause: Clause, shape: Sequence[Dim],
           names: dict[str, Any], where_seen: dict[str, str]) -> None:
    dims = clause.dims or ()
    fixed = [d for d in dims if not d.group]
    has_group = any(d.group for d in dims)
    if (len(shape) < len(fixed)) if has_group else (len(shape) != len(fixed)):
        want = f"at least {len(fixed)}" if has_group else str(len(fixed))
        ctx.fail(f"{clause.label} must have rank {want} (rule {rule.name}: "
                 f"tensor<{', '.join(('*' if d.group else '') + d.text for d in dims)}>), got rank {len(shape)}")
    group_len = len(shape) - len(fixed)
    axis = 0
    for pat in dims:
        if pat.group:
            part = tuple(shape[axis:axis + group_len])
            axis += group_len
            key = "*" + pat.text
            if key in names:
                try:
                    names[key], _undecided = broadcast_shapes(names[key], part)
                except ShapeError:
                    ctx.fail(f"the leading dims *{pat.text} of {where_seen[key]} {_fmt(names[key])} and "
                             f"{clause.label} {_fmt(part)} cannot broadcast")
            else:
                names[key] = part
                where_seen[key] = clause.label
            continue
        dim = shape[axis]
        here = f"{clause.label} dim {axis}"
        axis += 1
        if pat.text == "_":
            continue
        if pat.is_name and pat.text not in names:
            names[pat.text] = dim
            where_seen[pat.text] = here
            continue
        want = names[pat.text] if pat.is_name else _eval(pat.text, names, ctx, rule)
        if equal(want, dim) is Decision.FALSE:
            source = where_seen.get(pat.text, "the rule")
            ctx.fail(f"expects {pat.text} to agree: got {want} ({source}) and {dim} ({here})")


def _fmt(dims: Sequence[Dim]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _apply(rule: TypeRule, ctx: InferContext, params: dict[str, Any]) -> list[Any]:
    names: dict[str, Any] = dict(params)
    where_seen: dict[str, str] = {k: "a parameter" for k in params}
    pairs = _bind_params(rule, ctx)
    unknown_rank = False
    for clause, side, idx in pairs:
        if side != "in" or clause.dims is None:
            continue
        t = ctx.inputs[idx] if idx < len(ctx.inputs) else None
        if t is None:
            if not clause.optional and not ctx.op.inputs[idx].optional:
                ctx.fail(f"input {clause.label} is required by rule {rule.name}")
            continue
        if t.shape is None:
            unknown_rank = True
            continue
        _unify(rule, ctx, clause, t.shape, names, where_seen)
    if not unknown_rank:
        for w in rule.wheres:
            if w.kind == "let":
                names[w.lhs] = _eval(w.rhs, names, ctx, rule)
                where_seen[w.lhs] = f"where {w.lhs} = {w.rhs}"
                continue
            lhs, rhs = _eval(w.lhs, names, ctx, rule), _eval(w.rhs, names, ctx, rule)
            ok = _compare(lhs, w.op, rhs)
            if ok is Decision.FALSE:
                ctx.fail(f"constraint {w.lhs} {w.op} {w.rhs} failed: {lhs} {w.op} {rhs} is false")
    outs: list[Any] = []
    for clause, side, idx in pairs:
        if side != "out":
            continue
        shape = None if (unknown_rank or clause.dims is None) else _build(clause, names, ctx, rule)
        dt_name = clause.dtype
        if dt_name and ctx.op.interface.allowed(dt_name) is None:
            outs.append(TensorType(lookup_dtype(dt_name), shape))
        else:
            outs.append(ctx.output_type(idx, shape))
    return outs


def _build(clause: Clause, names: dict[str, Any], ctx: InferContext, rule: TypeRule) -> tuple[Dim, ...]:
    out: list[Dim] = []
    for pat in clause.dims or ():
        if pat.group:
            out.extend(names.get("*" + pat.text, ()))
        elif pat.is_name and pat.text in names:
            out.append(names[pat.text])
        else:
            out.append(_eval(pat.text, names, ctx, rule))
    return tuple(out)


def _compare(a: Dim, op: str, b: Dim) -> Decision:
    if op == "==":
        return equal(a, b)
    if op == "!=":
        d = equal(a, b)
        return Decision.UNKNOWN if d is Decision.UNKNOWN else Decision.of(d is Decision.FALSE)
    diff = sub(b, a)
    if isinstance(diff, int):
        return Decision.of(diff >= 0 if op == "<=" else diff > 0)
    return Decision.UNKNOWN


__all__ = ["Clause", "DimPattern", "TypeRule", "Where", "compile_rule"]
