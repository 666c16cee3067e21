"""Symbolic ranges of a statement's index variables, and ``...`` made explicit.

The reference evaluator infers ranges from concrete shapes (:mod:`metadef.ops.numpy_eval.ranges`);
generated code knows only symbolic dims (``batch``, ``seq``, ``768``), so this module applies
the same rules to :mod:`metadef.shape` expressions: a variable used as a whole index takes the
axis' dim (a literal 1 broadcasts and yields to any other source), the output's dim, or its
reduction bound; a variable seen only inside affine indices is deduced from the axis length.

Example:
    >>> from metadef.ops.semantics import parse_semantics
    >>> from metadef.shape import sym
    >>> s = parse_semantics("Y[...] = X[...] + B[...]").statements[0]
    >>> s2 = expand_ellipsis(s, {"X": (sym("n"), 4), "B": (4,)}, None)
    >>> str(s2)
    'Y[_e1, _e0] = X[_e1, _e0] + B[_e0]'
    >>> {v: str(d) for v, d in extents(s2, {"X": (sym("n"), 4), "B": (4,)}, {}, None).items()}
    {'_e1': 'n', '_e0': '4'}
"""

from __future__ import annotations

from collections.abc import Mapping

from metadef.codegen.errors import CodegenUnsupported
from metadef.codegen.exprs import Lin
from metadef.ops.semantics import (
    Access,
    Affine,
    Binary,
    Call,
    EllipsisIndex,
    Expr,
    Reduce,
    Statement,
    Term,
    Unary,
)
from metadef.shape import Dim, floordiv, mul, sub
from metadef.shape import Expr as DimExpr

Shapes = Mapping[str, tuple[Dim, ...]]


def same(a: Dim, b: Dim) -> bool:
    """Structural equality of two dims (``h`` and ``h``, ``768`` and ``768``)."""
    return type(a) is type(b) and a == b


def ellipsis_var(k: int) -> str:
    """The variable standing for the k-th axis of the ``...`` block, from the right."""
    return f"_e{k}"


def _block(access: Access, rank: int) -> int:
    return rank - (len(access.indices) - 1)


def expand_ellipsis(stmt: Statement, shapes: Shapes, out_rank: int | None) -> Statement:
    """``stmt`` with every ``...`` replaced by explicit variables ``_e{k}`` (right-aligned)."""
    if not stmt.lhs.has_ellipsis:
        return stmt
    blocks = [_block(a, len(shapes[a.tensor])) for a in stmt.rhs.accesses() if a.has_ellipsis]
    width = _block(stmt.lhs, out_rank) if out_rank is not None else max(blocks, default=0)
    if any(b > width for b in blocks) or width < 0:
        raise CodegenUnsupported(f"the '...' axes of {stmt} do not fit the output's rank")

    def access(a: Access, rank: int) -> Access:
        if not a.has_ellipsis:
            return a
        count = _block(a, rank)
        idx: list = []
        for i in a.indices:
            if isinstance(i, EllipsisIndex):
                idx += [Affine((Term(1, ellipsis_var(k)),)) for k in range(count - 1, -1, -1)]
            else:
                idx.append(i)
        return Access(a.tensor, tuple(idx))

    def expr(e: Expr) -> Expr:
        if isinstance(e, Access):
            return access(e, len(shapes[e.tensor]))
        if isinstance(e, Unary):
            return Unary(e.op, expr(e.operand))
        if isinstance(e, Binary):
            return Binary(e.op, expr(e.left), expr(e.right))
        if isinstance(e, Call):
            return Call(e.func, tuple(expr(a) for a in e.args))
        if isinstance(e, Reduce):
            return Reduce(e.op, e.vars, expr(e.body))
        return e

    lhs_rank = width + len(stmt.lhs.indices) - 1
    return Statement(access(stmt.lhs, lhs_rank), expr(stmt.rhs))


def to_lin(idx: Affine, params: Mapping[str, object], where: str) -> Lin:
    """An affine index with its params replaced by their (int or symbolic) values."""
    out = Lin()
    for t in idx.terms:
        coef: Dim = t.coef
        for p in t.params:
            value = params.get(p)
            if isinstance(value, bool) or not isinstance(value, (int, DimExpr)):
                raise CodegenUnsupported(f"{where}: index param {p} is {value!r}, not a size")
            coef = mul(coef, value)
        out = out.plus(Lin(((t.var, coef),)) if t.var else Lin.const(coef))
    return out


class _Extents:
    def __init__(self, where: str) -> None:
        self.where = where
        self.found: dict[str, tuple[Dim, bool]] = {}  # var -> (extent, weak: a length-1 axis)

    def add(self, var: str, extent: Dim, weak: bool) -> None:
        old = self.found.get(var)
        if old is None or (old[1] and not weak):
            self.found[var] = (extent, weak)


def _accesses_with_shapes(stmt: Statement, shapes: Shapes) -> list[tuple[Access, tuple[Dim, ...]]]:
    return [(a, tuple(shapes[a.tensor])) for a in stmt.rhs.accesses()]


def extents(stmt: Statement, shapes: Shapes, params: Mapping[str, object],
            out_shape: tuple[Dim, ...] | None) -> dict[str, Dim]:
    """The symbolic extent of every variable of an ellipsis-free statement."""
    where = f"in {str(stmt)!r}"
    found = _Extents(where)
    if out_shape is not None:
        for idx, dim in zip(stmt.lhs.indices, out_shape):
            if isinstance(idx, Affine) and idx.var_name:
                found.add(idx.var_name, dim, False)
    for access, shape in _accesses_with_shapes(stmt, shapes):
        if len(shape) != len(access.indices):
            raise CodegenUnsupported(f"{where}: {access} does not match the rank of {shape}")
        for idx, dim in zip(access.indices, shape):
            if isinstance(idx, Affine) and idx.var_name:
                found.add(idx.var_name, dim, same(dim, 1))
    for node in stmt.rhs.walk():
        for rv in node.vars if isinstance(node, Reduce) else ():
            if rv.bound is not None:
                bound = rv.bound if isinstance(rv.bound, int) else params.get(rv.bound)
                if not isinstance(bound, (int, DimExpr)) or isinstance(bound, bool):
                    raise CodegenUnsupported(f"{where}: the bound {rv} is {bound!r}")
                found.add(rv.name, bound, False)
    result = {v: e for v, (e, _) in found.found.items()}
    _deduce(stmt, shapes, params, result, where)
    return result


def _deduce(stmt: Statement, shapes: Shapes, params: Mapping[str, object],
            result: dict[str, Dim], where: str) -> None:
    """Rule 2 of the evaluator: a variable only in affine indices, from the axis length."""
    uses = [(to_lin(i, params, where), dim) for a, shape in _accesses_with_shapes(stmt, shapes)
            for i, dim in zip(a.indices, shape) if isinstance(i, Affine) and not i.var_name]
    changed = True
    while changed:
        changed = False
        for lin, dim in uses:
            unknown = [v for v in lin.variables if v not in result]
            if len(unknown) != 1:
                continue
            coefs = dict(lin.terms)
            k = coefs[unknown[0]]
            if isinstance(k, int) and k <= 0:
                continue  # symbolic coefficients are sizes: positive
            spans: Dim = 0
            for v, c in lin.terms:
                if v in result:
                    spans = spans + mul(c, sub(result[v], 1))
            room = sub(sub(sub(dim, 1), lin.offset), spans)
            result[unknown[0]] = 1 if same(room, 0) else floordiv(room, k) + 1
            changed = True
    needed = set(stmt.lhs.variables) | set(stmt.reduction_vars)
    needed |= {v for a in stmt.rhs.accesses() for v in a.variables}
    missing = sorted(needed - set(result))
    if missing:
        raise CodegenUnsupported(f"{where}: cannot tell the range of {', '.join(missing)}")


__all__ = ["ellipsis_var", "expand_ellipsis", "extents", "same", "to_lin"]
