"""Contractions: MatMul, Gemm, Einsum.

Each is a ``sum`` over products, generated per node: MatMul from its operands' ranks (numpy's
promotion of 1-D operands), Gemm from ``transA``/``transB`` and the rank of C, Einsum from its
equation (ellipsis axes get named variables, so they may be reduced or broadcast).

Example:
    >>> from metadef.ops import get_op
    >>> get_op("MatMul").role.value
    'contraction'
    >>> einsum_semantics({"equation": "bij,bjk->bik"}, [(2, 3, 4), (2, 4, 5)])
    'Output[vb, vi, vk] = sum[vj] Inputs_0[vb, vi, vj] * Inputs_1[vb, vj, vk]'
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from metadef.core.errors import AttributeError_, ShapeError
from metadef.ops.infer import InferContext
from metadef.ops.interface import REQUIRED, float_, int_, string
from metadef.ops.metaop import metaop
from metadef.ops.strategy import Role
from metadef.ops.typerule import compile_rule
from metadef.shape import Decision, Dim, TensorType, broadcast_shapes, equal, format_shape

# ------------------------------------------------------------------------------- MatMul

MATMUL_RULE = compile_rule("""
rule matmul_type_infer:
  a: tensor<*B, M, K; T>
  b: tensor<*B, K, N; T>
  y: tensor<*B, M, N; T>
""")


def _matmul_infer(ctx: InferContext) -> list[Any]:
    """The DSL rule on numpy-promoted operands: a 1-D A is a row ``[1, K]`` and a 1-D B a
    column ``[K, 1]``; the promoted axes are dropped from the result."""
    a, b = ctx.shape(0), ctx.shape(1)
    if a is None or b is None:
        return [None]
    if not a or not b:
        ctx.fail("MatMul operands must have rank >= 1 (use Mul for scalars)")
    promoted = [TensorType(ctx.dtype(0), (1, *a) if len(a) == 1 else a),
                TensorType(ctx.dtype(1), (*b, 1) if len(b) == 1 else b)]
    y, = MATMUL_RULE(dataclasses.replace(ctx, inputs=promoted))
    shape = list(y.shape)
    if len(b) == 1:
        shape.pop(-1)
    if len(a) == 1:
        shape.pop(-1 if len(b) == 1 else -2)
    return [tuple(shape)]


def matmul_semantics(attrs: Mapping[str, Any], shapes: Sequence[Sequence[Dim] | None]) -> str:
    """``Y[..., m, n] = sum[k] A[..., m, k] * B[..., k, n]``, without ``m`` or ``n`` for 1-D
    operands."""
    a_rows, b_cols = len(shapes[0]) > 1, len(shapes[1]) > 1
    batch = "..., " if a_rows or b_cols else ""
    a = f"A[{batch}m, k]" if a_rows else "A[k]"
    b = f"B[{batch}k, n]" if b_cols else "B[k]"
    out = ", ".join([*(["..."] if batch else []), *(["m"] if a_rows else []),
                     *(["n"] if b_cols else [])])
    return f"Y[{out}] = sum[k] {a} * {b}"


MatMul = metaop(
    "MatMul",
    inputs=("A", "B"), outputs=("Y",),
    types="T in {float, int}",
    rule=_matmul_infer, semantics=matmul_semantics,
    role=Role.CONTRACTION, parallel=("m", "n"),
    since=(1, 9, 13),
)


# --------------------------------------------------------------------------------- Gemm


def _gemm_infer(ctx: InferContext) -> list[Any]:
    a, b = ctx.shape(0), ctx.shape(1)
    if a is None or b is None:
        return [None]
    if len(a) != 2 or len(b) != 2:
        ctx.fail(f"A and B must be matrices (rank 2), got ranks {len(a)} and {len(b)}")
    m, ka = (a[1], a[0]) if ctx.attrs["transA"] else (a[0], a[1])
    kb, n = (b[1], b[0]) if ctx.attrs["transB"] else (b[0], b[1])
    if equal(ka, kb) is Decision.FALSE:
        ctx.fail(f"expects K to agree: got {ka} (A) and {kb} (B)",
                 "check transA/transB")
    c = ctx.shape(2) if ctx.has(2) else None
    if c is not None:
        try:
            out, _ = broadcast_shapes(c, (m, n))
        except ShapeError:
            out = None
        if out is None or len(c) > 2 or any(equal(x, y) is Decision.FALSE
                                           for x, y in zip(out, (m, n))):
            ctx.fail(f"C {format_shape(c)} must broadcast to [M, N] = {format_shape((m, n))}")
    return [(m, n)]


def gemm_semantics(attrs: Mapping[str, Any], shapes: Sequence[Sequence[Dim] | None]) -> str:
    """``Y[m, n] = alpha * sum[k] A[m, k] * B[k, n] + beta * C[..]`` (transposed reads for
    transA/transB; C indexed by its rank: ``C[]``, ``C[n]`` or ``C[m, n]``)."""
    a = "A[k, m]" if attrs["transA"] else "A[m, k]"
    b = "B[n, k]" if attrs["transB"] else "B[k, n]"
    alpha = "" if attrs["alpha"] == 1.0 else "alpha * "
    text = f"Y[m, n] = {alpha}sum[k] {a} * {b}"
    if len(shapes) > 2 and shapes[2] is not None:
        c = f"C[{', '.join(['m', 'n'][2 - len(shapes[2]):])}]"
        text += f" + {c}" if attrs["beta"] == 1.0 else f" + beta * {c}"
    return text


def _gemm_adapt(opset: int, attrs: dict[str, Any], n_inputs: int,
                ) -> tuple[dict[str, Any], dict[int, Any]]:
    """Gemm below opset 7 had ``broadcast`` (C broadcasts either way since)."""
    return {k: v for k, v in attrs.items() if k != "broadcast"}, {}


Gemm = metaop(
    "Gemm",
    inputs=("A", "B", "C?"), outputs=("Y",),
    attrs={"alpha": float_(1.0), "beta": float_(1.0), "transA": int_(0), "transB": int_(0)},
    types="T in {float, int32, int64, uint32, uint64}",
    rule=_gemm_infer, semantics=gemm_semantics, adapt=_gemm_adapt,
    role=Role.CONTRACTION, parallel=("m", "n"),
    since=(1, 6, 7, 9, 11, 13),
)


# ------------------------------------------------------------------------------- Einsum

_TERM = re.compile(r"^[A-Za-z]*(\.\.\.)?[A-Za-z]*$")


@dataclasses.dataclass(frozen=True)
class Equation:
    """A parsed einsum equation: per input its letters (``.`` marks the ellipsis), and the
    output's (None: implicit mode)."""

    inputs: tuple[str, ...]
    output: str | None

    @staticmethod
    def parse(text: str, n_inputs: int) -> Equation:
        eq = text.replace(" ", "")
        lhs, arrow, rhs = eq.partition("->")
        terms = tuple(t.replace("...", ".") for t in lhs.split(","))
        out = rhs.replace("...", ".") if arrow else None
        for t in (*lhs.split(","), *([rhs] if arrow else [])):
            if not _TERM.match(t):
                raise AttributeError_(f"einsum equation {text!r}: bad term {t!r} (letters and "
                                      "at most one '...')")
        if len(terms) != n_inputs:
            raise AttributeError_(f"einsum equation {text!r} has {len(terms)} operands but the "
                                  f"node has {n_inputs} inputs")
        if out is not None and len(set(out)) != len(out):
            raise AttributeError_(f"einsum equation {text!r}: an output letter repeats")
        return Equation(terms, out)

    def ellipsis_rank(self, ranks: Sequence[int]) -> int:
        sizes = [r - (len(t) - 1) for t, r in zip(self.inputs, ranks) if "." in t]
        return max(sizes, default=0)

    def output_letters(self) -> str:
        if self.output is not None:
            return self.output
        counts = "".join(self.inputs)
        once = sorted(c for c in set(counts) if c != "." and counts.count(c) == 1)
        return ("." if "." in counts else "") + "".join(once)


def _einsum_vars(term: str, rank: int, ellipsis: int) -> list[str]:
    """Variable names of a term's axes: ``v<letter>``, and ``e<i>`` for ellipsis axes
    (right-aligned, so they broadcast numpy-style)."""
    names: list[str] = []
    for ch in term:
        if ch == ".":
            own = rank - (len(term) - 1)
            names += [f"e{i}" for i in range(ellipsis - own, ellipsis)]
        else:
            names.append(f"v{ch}")
    return names


def einsum_semantics(attrs: Mapping[str, Any], shapes: Sequence[Sequence[Dim] | None]) -> str:
    """``Output[out vars] = sum[the other vars] Inputs_0[..] * Inputs_1[..] * ...``."""
    eq = Equation.parse(attrs["equation"], len(shapes))
    ranks = [len(s) for s in shapes]
    ell = eq.ellipsis_rank(ranks)
    operands = [_einsum_vars(t, r, ell) for t, r in zip(eq.inputs, ranks)]
    letters = eq.output_letters()
    out = _einsum_vars(letters, len(letters) + (ell - 1 if "." in letters else 0), ell)
    seen = list(dict.fromkeys(v for names in operands for v in names))
    reduced = [v for v in seen if v not in out]
    body = " * ".join(f"Inputs_{i}[{', '.join(names)}]" for i, names in enumerate(operands))
    prefix = f"sum[{', '.join(reduced)}] " if reduced else ""
    return f"Output[{', '.join(out)}] = {prefix}{body}"


def _einsum_infer(ctx: InferContext) -> list[Any]:
    shapes = [ctx.shape(i) for i in range(len(ctx.inputs))]
    if any(s is None for s in shapes):
        return [None]
    try:
        eq = Equation.parse(ctx.attrs["equation"], len(shapes))
    except AttributeError_ as e:
        ctx.fail(str(e))
    ell = eq.ellipsis_rank([len(s) for s in shapes])
    dims: dict[str, Dim] = {}
    blocks = []
    for i, (term, shape) in enumerate(zip(eq.inputs, shapes)):
        fixed = len(term) - ("." in term)
        if len(shape) != fixed and not ("." in term and len(shape) >= fixed):
            ctx.fail(f"operand {i} ({term.replace('.', '...')}) needs rank {fixed}, "
                     f"got rank {len(shape)}")
        for name, d in zip(_einsum_vars(term, len(shape), ell), shape):
            if name.startswith("e"):
                continue
            if name in dims and equal(dims[name], d) is Decision.FALSE and 1 not in (d, dims[name]):
                ctx.fail(f"expects {name[1]} to agree: got {dims[name]} and {d} (operand {i})")
            dims[name] = d if name not in dims or dims[name] == 1 else dims[name]
        if "." in term:
            start = term.index(".")
            blocks.append(tuple(shape[start:start + len(shape) - fixed]))
    try:
        block, _ = broadcast_shapes(*blocks) if blocks else ((), [])
    except ShapeError:
        ctx.fail("the '...' axes " + " and ".join(map(format_shape, blocks)) + " do not broadcast")
    out: list[Dim] = []
    for ch in eq.output_letters():
        if ch == ".":
            out += list(block)
        elif f"v{ch}" not in dims:
            ctx.fail(f"output letter {ch} appears in no operand")
        else:
            out.append(dims[f"v{ch}"])
    return [tuple(out)]


Einsum = metaop(
    "Einsum",
    inputs=("Inputs*",), outputs=("Output",),
    attrs={"equation": string(REQUIRED)},
    types="T in {numeric}",
    rule=_einsum_infer, semantics=einsum_semantics,
    role=Role.CONTRACTION, since=(12, 28),
)

__all__ = ["Equation", "Gemm", "MatMul", "MATMUL_RULE", "einsum_semantics", "gemm_semantics",
           "matmul_semantics"]
