"""A two-operand ``Einsum`` that is one batched product, as one sgemm in the native program.

Attention written with einsum (``bhqd,bhkd->bhqk``, ``bhqk,bhkd->bhqd``), a linear layer
(``bsd,de->bse``) and most einsums of exported models are a batched matrix product whose
operands need no copy: every index is a batch index (in both operands and the output, leading
all three in one order), a row index (one operand and the output), a column index (the other
operand and the output) or a contracted index (both operands, not the output), each group
contiguous. :func:`plan` finds that product on the binding's shapes (``...`` expanded) and
:func:`einsum_lowering` runs it as one ``md_sgemm`` call with the transposes it reads the
operands with (an output of columns before rows: the product of the swapped operands). Any
other einsum (an index summed in one operand alone, a diagonal, broadcast sizes, operands that
would need a copy) runs from Python through ``np.einsum``, with the reason.

Example:
    >>> p = plan("bhqd,bhkd->bhqk", [(2, 3, 5, 4), (2, 3, 7, 4)])
    >>> p.batch, p.m, p.n, p.k, p.trans_a, p.trans_b, p.swap
    (6, 5, 7, 4, False, True, False)
    >>> plan("ii->i", [(3, 3)])
    'the einsum has one operand (it is not a product)'
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from metadef.backends.x86.contractions import cblas_address
from metadef.backends.x86.native import NULL, Arg, Lowering, NativeStep, Shape, needing, sgemm_call


@dataclass(frozen=True)
class Product:
    """An einsum as ``batch`` products ``[m, k] @ [k, n]`` (``swap``: of the operands in the
    other order), each operand read transposed where said."""

    batch: int
    m: int
    n: int
    k: int
    trans_a: bool
    trans_b: bool
    swap: bool


def _terms(equation: str, shapes: Sequence[Shape]) -> tuple[list[str], str] | str:
    """The operands' and the output's index letters, ``...`` replaced by fresh ones."""
    lhs, arrow, out = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        return f"the equation names {len(terms)} operands, the node has {len(shapes)}"
    fresh = [chr(0x3B1 + i) for i in range(16)]  # (Greek letters: never in an ONNX equation)
    widest = 0
    expanded = []
    for term, shape in zip(terms, shapes):
        if "..." in term:
            extra = len(shape) - len(term.replace("...", ""))
            widest = max(widest, extra)
            term = term.replace("...", "".join(fresh[16 - extra:]) if extra else "")
        if len(term) != len(shape):
            return f"operand {term!r} has rank {len(shape)}"
        expanded.append(term)
    ellipsis = "".join(fresh[16 - widest:]) if widest else ""
    if not arrow:  # implicit output: the broadcast axes, then the letters seen once, sorted
        letters = "".join(expanded)
        out = ellipsis + "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c not in ellipsis))
    return expanded, out.replace("...", ellipsis)


def plan(equation: str, shapes: Sequence[Shape]) -> Product | str:
    """The batched product computing ``equation`` on operands of ``shapes``, or why there is none."""
    if len(shapes) != 2:
        return f"the einsum has {'one operand' if len(shapes) == 1 else f'{len(shapes)} operands'} " \
               f"(it is not a product)"
    found = _terms(equation, shapes)
    if isinstance(found, str):
        return found
    (ta, tb), to = found
    if any(len(set(t)) != len(t) for t in (ta, tb, to)):
        return "an index repeats within an operand or the output (a diagonal)"
    size: dict[str, int] = {}
    for term, shape in zip((ta, tb), shapes):
        for c, d in zip(term, shape):
            if size.setdefault(c, int(d)) != int(d):
                return f"index {c!r} has sizes {size[c]} and {d} (broadcast)"
    if any(c not in size for c in to) or any(c not in to and c not in (tb if c in ta else ta) for c in size):
        return "an index is summed in one operand alone"
    batch = [c for c in to if c in ta and c in tb]
    if list(to[:len(batch)]) != batch or ta[:len(batch)] != "".join(batch) or tb[:len(batch)] != "".join(batch):
        return "its batch indices do not lead the operands and the output in one order"
    rest_a, rest_b, rest_o = ta[len(batch):], tb[len(batch):], to[len(batch):]
    rows = "".join(c for c in rest_o if c in ta)
    cols = "".join(c for c in rest_o if c in tb)
    swap = rest_o == cols + rows and rows and cols and rest_o != rows + cols
    if rest_o != rows + cols and not swap:
        return "the output interleaves the indices of its two operands"
    contracted = "".join(c for c in rest_a if c not in to)

    def layout(rest: str, kept: str) -> bool | None:  # contracted indices first, or None: neither
        if rest == kept + contracted:
            return False
        return True if rest == contracted + kept else None

    trans_a, columns_first = layout(rest_a, rows), layout(rest_b, cols)
    if trans_a is None or columns_first is None:
        return "an operand would need a copy (its indices are not grouped as one product reads them)"
    dims = [math.prod(size[c] for c in group) for group in (batch, rows, cols, contracted)]
    # (B stored [n, k], columns then contracted, is read transposed)
    return Product(*dims, trans_a=trans_a, trans_b=not columns_first, swap=bool(swap))


def einsum_lowering(equation: str, a: Arg, b: Arg, out: Arg, dtype: np.dtype) -> Lowering:
    """A float32 two-operand einsum that :func:`plan` finds one product in, as one sgemm."""

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape], symbols: Mapping[str, int]
              ) -> NativeStep | str:
        if dtype != np.float32 or any(s is None for s in inputs):
            return "only a float32 einsum of known shapes runs as one sgemm"
        found = plan(equation, [tuple(s) for s in inputs if s is not None])
        if isinstance(found, str):
            return found
        if 0 in (found.batch, found.m, found.n, found.k):
            return "an empty operand"
        first, second = (b, a) if found.swap else (a, b)
        m, n = (found.n, found.m) if found.swap else (found.m, found.n)
        # swapped: C^T = B^T A^T, each operand read the other way
        trans_a, trans_b = (not found.trans_b, not found.trans_a) if found.swap else (found.trans_a, found.trans_b)
        args = (first, second, out, Arg("addr", cblas_address("sgemm")), NULL, Arg("addr", cblas_address("sgemv")))
        k = found.k
        return NativeStep((sgemm_call(args, found.batch, m, n, k, "einsum as sgemm", trans_a=trans_a,
                                      trans_b=trans_b, strides=(m * k, k * n, m * n)),))

    return needing(lower, "md_sgemm")


__all__ = ["Product", "einsum_lowering", "plan"]
