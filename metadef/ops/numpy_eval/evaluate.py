"""Evaluate a semantic program with vectorized numpy: the reference oracle.

No loop runs over elements. Accesses become strided views (:mod:`.labelled`), elementwise
operators broadcast label-aligned arrays, ``sum`` over a product of factors is one
``np.einsum`` (so conv and matmul never materialize the product), other reductions reduce
the evaluated body. Ranges come from :mod:`.ranges`.

Dtypes: arithmetic follows numpy's promotion of the arrays; literals and params are Python
scalars, so they do not upcast (numpy 2's weak scalars); comparisons give bool; ``/`` truncates
toward zero for integers; ``%`` is numpy's ``mod`` (the sign of the divisor); index variables
read as values are int64. Sums, products and means of float16, bfloat16 and float8 accumulate
in float32 and are cast back; integer sums and products keep their dtype; ``mean`` of integers
is float64 (numpy's rule). Each result is cast to ``out_dtypes[name]`` when given.

Example:
    >>> import numpy as np
    >>> x = np.arange(6.0).reshape(2, 3)
    >>> evaluate("Y[] = sum[i, j] X[i, j]", {"X": x}, {})["Y"]
    array(15.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from metadef.core.errors import MetadefError, SemanticsError
from metadef.ops.numpy_eval.functions import (
    binary_operators,
    functions,
    numpy_dtype,
    unary_operators,
)
from metadef.ops.numpy_eval.labelled import (
    LOW_FLOATS,
    Labelled,
    Params,
    apply,
    broadcast_full,
    ellipsis_label,
    inbounds_mask,
    linear_form,
    strided_view,
    union_labels,
)
from metadef.ops.numpy_eval.ranges import infer_ranges
from metadef.ops.semantics import (
    Access,
    Affine,
    Binary,
    Call,
    Expr,
    Number,
    Param,
    Program,
    Reduce,
    Statement,
    Unary,
    Var,
    parse_semantics,
)

_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def evaluate(program: Program | str, tensors: Mapping[str, np.ndarray],
             params: Mapping[str, int | float], out_shapes: Mapping[str, tuple[int, ...]]
             | None = None, out_dtypes: Mapping[str, Any] | None = None,
             ) -> dict[str, np.ndarray]:
    """Run ``program`` on ``tensors``; return ``{name: array}`` for ``program.outputs``.

    ``out_shapes`` (by LHS name) fixes output ranges and broadcasts results to them;
    ``out_dtypes`` casts results. Raises :class:`SemanticsError` naming the statement.

    Example:
        >>> a, b = np.ones((2, 3), np.float32), np.ones((3, 4), np.float32)
        >>> y = evaluate("Y[m, n] = sum[k] A[m, k] * B[k, n]", {"A": a, "B": b}, {})["Y"]
        >>> y.shape, y.dtype, float(y[0, 0])
        ((2, 4), dtype('float32'), 3.0)
    """
    if isinstance(program, str):
        program = parse_semantics(program)
    env = {name: np.asarray(t) for name, t in tensors.items()}
    scalars = {k: v.item() if isinstance(v, np.generic) else v for k, v in params.items()}
    for stmt in program.statements:
        shape = (out_shapes or {}).get(stmt.name)
        dtype = (out_dtypes or {}).get(stmt.name)
        env[stmt.name] = run_statement(stmt, env, scalars, shape, dtype)
    return {name: env[name] for name in program.outputs}


def run_statement(stmt: Statement, env: Mapping[str, np.ndarray], params: Params,
                  out_shape: tuple[int, ...] | None = None, out_dtype: Any = None) -> np.ndarray:
    """Evaluate one statement to a fresh C-contiguous array.

    Example:
        >>> s = parse_semantics("Y[j, i] = X[i, j]").statements[0]
        >>> run_statement(s, {"X": np.arange(6).reshape(2, 3)}, {}).shape
        (3, 2)
    """
    where = f"in {str(stmt)!r}"
    try:
        with np.errstate(all="ignore"):
            shapes = {name: a.shape for name, a in env.items()}
            ranges = infer_ranges(stmt, shapes, params, out_shape)
            value = _Evaluator(env, params, ranges, where).eval(stmt.rhs)
            result = _assemble(value, stmt.lhs, ranges, params, out_shape, where)
            if out_dtype is not None:
                dtype = numpy_dtype(out_dtype) if isinstance(out_dtype, str) else out_dtype
                result = result.astype(dtype, copy=False)
            return result
    except MetadefError:
        raise
    except (ArithmeticError, ValueError, TypeError, IndexError, MemoryError) as e:
        raise SemanticsError(f"{where}: numpy failed: {type(e).__name__}: {e}") from e


class _Evaluator:
    """Evaluates expressions of one statement to :class:`Labelled` values."""

    def __init__(self, env: Mapping[str, np.ndarray], params: Params,
                 ranges: Mapping[str, int], where: str) -> None:
        self.env, self.params, self.ranges, self.where = env, params, ranges, where

    def eval(self, e: Expr) -> Labelled:
        return eval_rules[type(e)](self, e)

    def number(self, e: Number) -> Labelled:
        return Labelled(e.value)

    def param(self, e: Param) -> Labelled:
        if e.name not in self.params:
            raise SemanticsError(f"{self.where}: param {e.name} has no value "
                                 f"(have {sorted(self.params)})")
        return Labelled(self.params[e.name])

    def var(self, e: Var) -> Labelled:
        return Labelled(np.arange(self.ranges[e.name]), (e.name,))

    def access(self, e: Access, fill: Any = 0) -> Labelled:
        return strided_view(self.env[e.tensor], e, self.ranges, self.params, fill, self.where)

    def unary(self, e: Unary) -> Labelled:
        return apply(unary_operators[e.op], self.eval(e.operand))

    def binary(self, e: Binary) -> Labelled:
        return apply(binary_operators[e.op], self.eval(e.left), self.eval(e.right))

    def call(self, e: Call) -> Labelled:
        special = _access_functions.get(e.func)
        if special is not None:
            return special(self, e)
        _, func = functions[e.func]
        return apply(func, *(self.eval(a) for a in e.args))

    def fill(self, e: Call) -> Labelled:
        fill = self.eval(e.args[1])
        if fill.labels or np.ndim(fill.value) != 0:
            raise SemanticsError(f"{self.where}: the fill value {e.args[1]} must be a scalar")
        assert isinstance(e.args[0], Access)
        return self.access(e.args[0], fill.value)

    def inbounds(self, e: Call) -> Labelled:
        access = e.args[0]
        assert isinstance(access, Access)
        return inbounds_mask(self.env[access.tensor], access, self.ranges, self.params,
                             self.where)

    def reduce(self, e: Reduce) -> Labelled:
        names = e.var_names
        if e.op == "sum":
            factors = [self.eval(f) for f in e.factors()]
            wide_type = _accumulator(factors)
            if wide_type is not None:  # multiply and add wider, round once
                dtype = np.result_type(*(f.value for f in factors if not f.is_weak))
                wide = [f if f.is_weak else Labelled(np.asarray(f.value, wide_type), f.labels)
                        for f in factors]
                result = _einsum_sum(wide, names, self.ranges)
                return Labelled(np.asarray(result.value).astype(dtype), result.labels)
            if _einsum_ready(factors):
                return _einsum_sum(factors, names, self.ranges)
            body = factors[0]
            for f in factors[1:]:
                body = apply(np.multiply, body, f)
        else:
            body = self.eval(e.body)
        return _reduce(e.op, body, names, self.ranges, self.where)


eval_rules: dict[type, Callable[[_Evaluator, Any], Labelled]] = {
    Number: _Evaluator.number, Param: _Evaluator.param, Var: _Evaluator.var,
    Access: _Evaluator.access, Unary: _Evaluator.unary, Binary: _Evaluator.binary,
    Call: _Evaluator.call, Reduce: _Evaluator.reduce,
}
"""Expression node type -> how to evaluate it."""

_access_functions: dict[str, Callable[[_Evaluator, Call], Labelled]] = {
    "fill": _Evaluator.fill, "inbounds": _Evaluator.inbounds,
}


# ------------------------------------------------------------------------------ reductions


def _einsum_ready(factors: list[Labelled]) -> bool:
    """einsum accumulates these factors correctly: native ints, float32/64 or complex."""
    arrays = [np.asarray(f.value) for f in factors if not f.is_weak]
    return bool(arrays) and all(
        a.dtype.kind in "iuc" or (a.dtype.kind == "f" and a.dtype.itemsize >= 4)
        for a in arrays)


def _accumulator(factors: list[Labelled]) -> type | None:
    """The wider float type a contraction of these factors (two or more float tensors, none
    wider than float32) is multiplied and summed in before one rounding, or None.

    float16/bfloat16/float8 products go through float32, as numpy's, ONNX Runtime's and the
    x86 backend's matmuls do (not rounded per product). float32 contractions go through
    float64: the reference is the oracle the compiled targets are checked against, so its
    sums should be as exact as is cheap, and their result must not depend on the order
    BLAS takes them in. OpenBLAS's sgemm rounds a row differently depending on its place in
    a micro-kernel tile (rows 6-11 of ``W @ X`` differ from rows 0-5 for identical
    weights), so identical output channels would not come out identical; a float64 sum is
    rounded to float32 the same way whatever its order, except within 2**-29 of a float32
    rounding boundary.
    """
    arrays = [np.asarray(f.value) for f in factors if not f.is_weak]
    if len(arrays) < 2 or not all(a.dtype in LOW_FLOATS or a.dtype == np.float32 for a in arrays):
        return None
    return np.float32 if any(a.dtype in LOW_FLOATS for a in arrays) else np.float64


def _einsum_sum(factors: list[Labelled], names: tuple[str, ...],
                ranges: Mapping[str, int]) -> Labelled:
    """``sum[names]`` of the product of ``factors`` as one einsum (BLAS where it can)."""
    arrays = [f for f in factors if not f.is_weak]
    labels = union_labels(arrays)
    kept = tuple(lab for lab in labels if lab not in names)
    if len(labels) > len(_LETTERS):
        raise SemanticsError(f"a reduction over {len(labels)} axes is more than einsum takes")
    letter = dict(zip(labels, _LETTERS))
    spec = ",".join("".join(letter[lab] for lab in f.labels) for f in arrays)
    spec += "->" + "".join(letter[lab] for lab in kept)
    result: Any = np.einsum(spec, *(np.asarray(f.value) for f in arrays), optimize=True)
    for name in names:
        if name not in labels:  # the body does not depend on it: each term repeats
            result = result * ranges[name]
    for f in factors:
        if f.is_weak:
            result = result * f.value
    return Labelled(result, kept)


def _reduce(op: str, body: Labelled, names: tuple[str, ...], ranges: Mapping[str, int],
            where: str) -> Labelled:
    """Reduce ``body`` over ``names`` (broadcasting it over the ones it lacks)."""
    sizes = [ranges[n] for n in names]
    if body.is_weak:
        return Labelled(_reduce_scalar(op, body.value, int(np.prod(sizes)), names, where))
    labels = body.labels + tuple(n for n in names if n not in body.labels)
    array = broadcast_full(body, labels, ranges)
    axes = tuple(labels.index(n) for n in names)
    if array.size == 0 and op in ("max", "min") and 0 in sizes:
        raise SemanticsError(f"{where}: {op} over an empty range of {', '.join(names)}")
    result = reducers[op](array, axes)
    return Labelled(result, tuple(lab for lab in labels if lab not in names))


def _reduce_scalar(op: str, value: Any, count: int, names: tuple[str, ...], where: str) -> Any:
    if op == "sum":
        return value * count
    if op == "prod":
        return value ** count
    if count == 0:
        raise SemanticsError(f"{where}: {op} over an empty range of {', '.join(names)}")
    return value


def _accumulating(numpy_reduce: Callable[..., Any]) -> Callable[[np.ndarray, tuple[int, ...]], Any]:
    """A sum/prod/mean that accumulates low-precision floats in float32 and keeps int dtypes."""
    def reduce(array: np.ndarray, axes: tuple[int, ...]) -> Any:
        if array.dtype in LOW_FLOATS:
            return numpy_reduce(array, axis=axes, dtype=np.float32).astype(array.dtype)
        if array.dtype.kind in "iu" and numpy_reduce is not np.mean:
            return numpy_reduce(array, axis=axes, dtype=array.dtype)
        return numpy_reduce(array, axis=axes)
    return reduce


reducers: dict[str, Callable[[np.ndarray, tuple[int, ...]], Any]] = {
    "sum": _accumulating(np.sum), "prod": _accumulating(np.prod),
    "mean": _accumulating(np.mean),
    "max": lambda a, axes: np.max(a, axis=axes), "min": lambda a, axes: np.min(a, axis=axes),
}
"""Reduction name -> numpy reducer over the given axes."""


# ------------------------------------------------------------------------ the left side


def _lhs_order(lhs: Access, ranges: Mapping[str, int], params: Params,
               where: str) -> list[tuple[str, ...]]:
    """Labels per LHS index, in row-major order; checks merged indices like ``g*KG + kk``."""
    groups: list[tuple[str, ...]] = []
    block = sum(1 for lab in ranges if lab.startswith("..."))
    for idx in lhs.indices:
        if not isinstance(idx, Affine):
            groups += [(ellipsis_label(k),) for k in range(block - 1, -1, -1)]
            continue
        const, coefs = linear_form(idx, params, where)
        order = sorted(coefs, key=lambda v: -coefs[v])
        expected, ok = 1, const == 0
        for v in reversed(order):
            ok = ok and coefs[v] == expected
            expected *= ranges[v]
        if not ok:
            sizes = ", ".join(f"{v} in [0, {ranges[v]})" for v in order)
            raise SemanticsError(
                f"{where}: output index {idx} is not a row-major merge of its variables "
                f"({sizes}): each coefficient must be the product of the ranges after it")
        groups.append(tuple(order))
    return groups


def _assemble(value: Labelled, lhs: Access, ranges: Mapping[str, int], params: Params,
              out_shape: tuple[int, ...] | None, where: str) -> np.ndarray:
    """Transpose, merge and broadcast the RHS value into the LHS tensor."""
    groups = _lhs_order(lhs, ranges, params, where)
    labels = tuple(lab for group in groups for lab in group)
    array = broadcast_full(value, labels, ranges)
    array = array.reshape(tuple(int(np.prod([ranges[lab] for lab in g])) for g in groups))
    if out_shape is not None and array.shape != tuple(out_shape):
        try:
            array = np.broadcast_to(array, tuple(out_shape))
        except ValueError:
            raise SemanticsError(f"{where}: the result has shape {array.shape}, which does not "
                                 f"broadcast to out_shapes[{lhs.tensor!r}] = "
                                 f"{tuple(out_shape)}") from None
    return np.array(array, copy=True, order="C")


__all__ = ["eval_rules", "evaluate", "functions", "reducers", "run_statement"]
