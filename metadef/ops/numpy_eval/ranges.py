"""The range of every index variable of a statement, from shapes, bounds and out_shapes.

Rules, strongest first:

1. *Exact* sources: a variable used as a whole index of axis d of tensor T has extent
   ``T.shape[d]``; a bare LHS variable has the extent of ``out_shapes[Y]`` at its axis; a
   reduction bound ``sum[r:R]`` gives ``R``. Sources must agree; a tensor axis of length 1
   broadcasts (numpy-style) and agrees with anything. A disagreement is a SemanticsError
   naming the variable, both sources and both extents.
2. *Deduced* extents, for variables with no exact source: an affine index ``c + k*v + rest``
   of an axis of length D, where every other variable is known, allows ``v`` up to the
   largest value that keeps the index inside the axis on the side it moves toward (no padding
   there): ``(D - 1 - c - max(rest)) // k + 1`` for ``k > 0``, ``(c + min(rest)) // -k + 1``
   for ``k < 0`` (so ``X[4 - i]`` on a length-5 axis gives i the range 5). So
   ``X[n, g*CG + c, ...]`` with ``c`` of range CG gives g the range ``C // CG``, and
   ``X[p*sh + r - pt]`` without out_shapes gives the output positions a valid window reaches.
   When several indices deduce a variable, the smallest extent wins; deduction repeats until
   nothing changes.
3. The ellipsis block is the numpy broadcast of the blocks of every access using ``...`` (and
   of the LHS's block in out_shapes, which must contain them); its axes are labelled
   ``...k`` from the right.

Example:
    >>> from metadef.ops.semantics import parse_semantics
    >>> s = parse_semantics("Y[n, g*KG + kk] = sum[c] X[n, g*CG + c] * W[g*KG + kk, c]")
    >>> infer_ranges(s.statements[0], {"X": (2, 6), "W": (4, 3)}, {"KG": 2, "CG": 3})
    {'n': 2, 'c': 3, 'g': 2, 'kk': 2}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from metadef.core.errors import SemanticsError
from metadef.ops.numpy_eval.labelled import Params, ellipsis_label, linear_form
from metadef.ops.semantics import ELLIPSIS, Access, Affine, Reduce, Statement, Var


@dataclass(frozen=True)
class _Extent:
    size: int
    source: str  # "X.shape[2]", "out_shapes['Y'][1]", "the bound r:R"
    broadcasts: bool  # a tensor axis of length 1


@dataclass(frozen=True)
class _AxisUse:
    """An affine (non-bare) index on an axis of known length."""

    index: Affine
    size: int
    source: str


def check_rank(access: Access, shape: tuple[int, ...], where: str, what: str) -> None:
    """The access has one index per axis (an ellipsis stands for zero or more)."""
    fixed = len(access.indices) - (1 if access.has_ellipsis else 0)
    if len(shape) < fixed or (not access.has_ellipsis and len(shape) != fixed):
        raise SemanticsError(
            f"{where}: {access} needs a tensor of rank {fixed}{' or more' * access.has_ellipsis}"
            f", but {what} has shape {tuple(shape)}")


def _axes(access: Access, shape: tuple[int, ...]) -> list[tuple[int, object]]:
    """(axis, index) pairs for the non-ellipsis indices of an access."""
    block = len(shape) - (len(access.indices) - 1)
    pairs, axis = [], 0
    for idx in access.indices:
        if isinstance(idx, Affine):
            pairs.append((axis, idx))
            axis += 1
        else:
            axis += block
    return pairs


class _RangeBuilder:
    def __init__(self, stmt: Statement, params: Params) -> None:
        self.stmt, self.params = stmt, params
        self.where = f"in {str(stmt)!r}"
        self.exact: dict[str, _Extent] = {}
        self.uses: list[_AxisUse] = []
        self.blocks: list[tuple[str, tuple[int, ...]]] = []

    def add_exact(self, var: str, extent: _Extent) -> None:
        old = self.exact.get(var)
        if old is None or old.broadcasts or (old.size == extent.size and not extent.broadcasts):
            self.exact[var] = extent
        elif not extent.broadcasts and old.size != extent.size:
            raise SemanticsError(
                f"{self.where}: index variable {var} has conflicting extents: {old.source} is "
                f"{old.size} but {extent.source} is {extent.size}")

    def add_access(self, access: Access, shape: tuple[int, ...], name: str,
                   fixed: bool) -> None:
        check_rank(access, shape, self.where, name)
        for axis, idx in _axes(access, shape):
            assert isinstance(idx, Affine)
            source = f"{name}[{axis}]" if fixed else f"{name}.shape[{axis}]"
            var = idx.var_name
            if var is not None:
                self.add_exact(var, _Extent(shape[axis], source, not fixed and shape[axis] == 1))
            elif idx.variables:
                self.uses.append(_AxisUse(idx, shape[axis], source))
        if access.has_ellipsis:
            block = len(shape) - (len(access.indices) - 1)
            start = access.indices.index(ELLIPSIS)
            self.blocks.append((name, tuple(shape[start:start + block])))

    def add_bounds(self) -> None:
        for node in self.stmt.rhs.walk():
            for rv in node.vars if isinstance(node, Reduce) else ():
                if rv.bound is None:
                    continue
                size = rv.bound if isinstance(rv.bound, int) else self.params.get(rv.bound)
                if isinstance(size, bool) or not isinstance(size, (int, np.integer)):
                    raise SemanticsError(
                        f"{self.where}: the bound {rv} needs an integer param {rv.bound}, "
                        f"got {size!r}")
                self.add_exact(rv.name, _Extent(int(size), f"the bound {rv}", False))

    def deduce(self) -> dict[str, int]:
        ranges = {v: e.size for v, e in self.exact.items()}
        while True:
            found: dict[str, int] = {}
            for use in self.uses:
                const, coefs = linear_form(use.index, self.params, self.where)
                unknown = [v for v in coefs if v not in ranges]
                if len(unknown) != 1 or coefs[unknown[0]] == 0:
                    continue
                var, k = unknown[0], coefs[unknown[0]]
                spans = [c * (ranges[v] - 1) for v, c in coefs.items() if v in ranges]
                if k > 0:  # grows toward the end: stay below the axis length
                    size = (use.size - 1 - const - sum(max(0, x) for x in spans)) // k + 1
                else:  # grows toward the start: stay at or above 0
                    size = (const + sum(min(0, x) for x in spans)) // -k + 1
                found[var] = min(max(0, size), found.get(var, max(0, size)))
            if not found:
                return ranges
            ranges.update(found)

    def ellipsis(self, lhs_block: tuple[int, ...] | None) -> dict[str, int]:
        shapes = [b for _, b in self.blocks]
        try:
            block = np.broadcast_shapes(*shapes) if shapes else ()
            if lhs_block is not None:
                if np.broadcast_shapes(block, lhs_block) != tuple(lhs_block):
                    raise ValueError
                block = lhs_block
        except ValueError:
            listed = ", ".join(f"{name}: {b}" for name, b in self.blocks)
            lhs = f" into the output's {lhs_block}" if lhs_block is not None else ""
            raise SemanticsError(
                f"{self.where}: the '...' axes do not broadcast{lhs}: {listed}") from None
        return {ellipsis_label(k): size for k, size in enumerate(reversed(block))}


def infer_ranges(stmt: Statement, shapes: Mapping[str, tuple[int, ...]], params: Params,
                 out_shape: tuple[int, ...] | None = None) -> dict[str, int]:
    """Extents of the statement's index variables and ellipsis axes (see the module rules)."""
    builder = _RangeBuilder(stmt, params)
    for access in stmt.rhs.accesses():
        if access.tensor not in shapes:
            raise SemanticsError(f"{builder.where}: no tensor named {access.tensor} was given "
                                 f"(have {sorted(shapes)})")
        builder.add_access(access, tuple(shapes[access.tensor]), access.tensor, fixed=False)
    lhs_block = None
    if out_shape is not None:
        blocks_before = len(builder.blocks)
        builder.add_access(stmt.lhs, tuple(out_shape), f"out_shapes[{stmt.name!r}]", fixed=True)
        if stmt.lhs.has_ellipsis:
            lhs_block = builder.blocks.pop(blocks_before)[1]
    builder.add_bounds()
    ranges = builder.deduce()
    needed = set(stmt.index_vars) | set(stmt.reduction_vars)
    needed |= {n.name for n in stmt.rhs.walk() if isinstance(n, Var)}
    needed |= {v for a in stmt.rhs.accesses() for v in a.variables}
    for var in sorted(needed - set(ranges)):
        raise SemanticsError(
            f"{builder.where}: cannot tell the range of index variable {var}: use it as a whole "
            f"index of some tensor, give it a bound (sum[{var}:N] ...), or pass out_shapes")
    if stmt.lhs.has_ellipsis:
        ranges.update(builder.ellipsis(lhs_block))
    return ranges


__all__ = ["check_rank", "infer_ranges"]
