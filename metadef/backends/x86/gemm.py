"""Products with constant weights through our own micro-kernel, bias and activation in its stores.

A float32 ``MatMul`` or ``Gemm`` (no ``transA``, ``alpha`` 1) whose weights are a constant matrix
runs as one ``md_gemm`` call (:mod:`metadef.codegen.native_gemm`) when it measures faster than
OpenBLAS on the binding's shapes: the weights packed once in panels of
:func:`~metadef.codegen.native_gemm.gemm_panel` columns (32 with AVX-512, else 16), and the group's
epilogue, when it is ``act(y + bias (+ residual))`` (a constant bias per column, from Gemm's
``C`` or an ``Add``; a residual: an ``Add`` of a tensor of the output's shape, a transformer's
skip connection; ``act``: Relu or Clip with constant bounds, or nothing), applied before the
store.
Where it wins: few rows (a batch-8 linear layer: ~1.7x OpenBLAS's sgemm here), where
OpenBLAS's packing costs more than the product, and BERT's 128-row products (4-8 % faster); it
is tried up to :data:`MAX_ROWS` rows. Where ``k`` is a multiple of 1024 (BERT's ``3072``), the
rows of ``x`` are first copied to a stride one cache line longer (a scratch buffer), so that
the tile's rows do not all fall in one L1 set (:func:`~metadef.codegen.native_gemm.gemm_lda`).

Example:
    >>> import numpy as np
    >>> from metadef.ir import parse_graph
    >>> g = parse_graph('''graph g(%x: f32[n,2]) -> (%z) {
    ...   %w: f32[2,3] = const [0.5, 0.5, 0.5, 0.5, 0.5, 0.5]
    ...   %b: f32[3] = const [1.0, 1.0, 1.0]
    ...   %y: f32[n,3] = MatMul(%x, %w) @mm
    ...   %s: f32[n,3] = Add(%y, %b) @add
    ...   %z: f32[n,3] = Relu(%s) @relu
    ...   return %z }''')
    >>> bias, lo, hi = bias_form(g.nodes[1:], g.nodes[0].outputs[0], g.outputs[0])
    >>> bias.tolist(), lo, hi
    ([1.0, 1.0, 1.0], 0.0, inf)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from metadef.backends.x86 import contractions as blas
from metadef.backends.x86.conv1x1 import activation_form
from metadef.backends.x86.native import (
    NULL,
    Arg,
    Call,
    Lowering,
    NativeStep,
    Shape,
    known_choice,
    measured_choice,
    needing,
    needs,
    sgemm_call,
    sgemm_dims,
    timed_call,
)
from metadef.codegen.native import native_function
from metadef.codegen.native_gemm import gemm_dims, gemm_lda, gemm_panel, pack_gemm_weights
from metadef.format import release_mapped
from metadef.ir import Node, Value

OWN = "own micro-kernel, epilogue fused"
BLAS = "sgemm"

PREFER: str | None = None
"""Set to ``OWN`` or ``BLAS`` to take that path for every product without measuring (tests)."""

MAX_ROWS = 4096
"""Products with more rows than this take OpenBLAS without measuring (the measuring arrays and
the product grow with the rows). Up to here the two race on the binding's shapes, however
small: the MLP's last layer (1 x 256 -> 10) loses to OpenBLAS by a hair, but as one call of
``sgemv`` with its bias (0.74 us) rather than the group's ``sgemm`` and bias pass (1.3 us), which
it took unmeasured while products under 4,096 multiply-adds were not raced. Ours keeps
a second, packed copy of the weights (BERT-base: 340 MB more, packed on the first run of a
binding) and skips OpenBLAS's packing of them on every call: ~1.7x OpenBLAS at 8 rows, and
0.92-0.96x its time at BERT's 128 x 768 x {768, 3072} (2026-12-01; the two were level on the
host of an earlier session, when this cap was 32 rows)."""


def weights_of(node: Node, consts: Sequence[np.ndarray | None]) -> np.ndarray | None:
    """The constant ``W [k, n]`` of a MatMul (``x @ W``) or Gemm (``x W'``, no transA, alpha 1),
    float32; None when the node is not such a product."""
    w = consts[1] if len(consts) > 1 else None
    if w is None or w.ndim != 2 or w.dtype != np.float32:
        return None
    if node.op == "MatMul":
        return w
    if node.op == "Gemm" and not node.attrs.get("transA") and float(node.attrs.get("alpha", 1.0)) == 1.0:
        return w.T if node.attrs.get("transB") else w
    return None


def gemm_bias(node: Node, consts: Sequence[np.ndarray | None], n: int) -> np.ndarray | None:
    """Gemm's ``beta * C`` as a bias per column (zeros for none, and for a MatMul), or None when
    ``C`` is not a constant that broadcasts along the rows."""
    if node.op != "Gemm" or len(node.inputs) < 3 or node.inputs[2] is None or float(node.attrs.get("beta", 1.0)) == 0:
        return np.zeros(n, np.float32)
    c = consts[2] if len(consts) > 2 else None
    if c is None or c.size not in (1, n) or (c.ndim == 2 and c.shape[0] != 1) or c.ndim > 2:
        return None
    return np.broadcast_to(np.asarray(c, np.float32).reshape(-1) * float(node.attrs.get("beta", 1.0)), (n,)).copy()


def bias_form(nodes: Sequence[Node], y: Value, out: Value, known: Mapping[int, np.ndarray | None] | None = None
              ) -> tuple[np.ndarray | None, float, float] | None:
    """``(bias, lo, hi)`` when ``nodes`` compute ``out = clip(y (+ bias), lo, hi)`` from ``y``,
    the bias a constant per column (an ``Add`` of a ``[n]`` or ``[1, n]`` constant: a constant
    value, or one whose ``id`` ``known`` maps to its value), else None."""
    found = residual_form(nodes, y, out, known)
    return None if found is None or found[1] is not None else (found[0], found[2], found[3])


def residual_form(nodes: Sequence[Node], y: Value, out: Value, known: Mapping[int, np.ndarray | None] | None = None
                  ) -> tuple[np.ndarray | None, Value | None, float, float] | None:
    """``(bias, residual, lo, hi)`` when ``nodes`` compute ``out = clip(y (+ bias) (+ residual),
    lo, hi)`` from ``y`` (the bias as in :func:`bias_form`; the residual an ``Add`` of a value of
    ``y``'s shape and dtype, a transformer's skip connection), else None."""
    ops, bias, current = list(nodes), None, y
    const = _const_operand(ops[0], current, known) if ops and ops[0].op == "Add" else None
    if const is not None:
        n = current.type.shape[-1] if current.type is not None and current.type.shape else None
        if not isinstance(n, int) or np.size(const) not in (1, n) or np.ndim(const) > 2 \
                or (np.ndim(const) == 2 and np.shape(const)[0] != 1):
            return None
        bias = np.broadcast_to(np.asarray(const, np.float32).reshape(-1), (n,)).copy()
        current, ops = ops[0].outputs[0], ops[1:]
    residual = None
    if ops and ops[0].op == "Add":
        a, b = ops[0].inputs
        other = b if a is current else a if b is current else None
        if other is None or other is current or _const_operand(ops[0], current, known) is not None \
                or other.type is None or current.type is None or other.type.shape != current.type.shape \
                or other.type.dtype != current.type.dtype:
            return None
        residual, current, ops = other, ops[0].outputs[0], ops[1:]
    found = activation_form(ops, current, out)
    return None if found is None else (bias, residual, *found)


def _const_operand(node: Node, current: Value, known: Mapping[int, np.ndarray | None] | None) -> Any:
    """The constant value of ``node``'s operand other than ``current`` (None: not a constant)."""
    a, b = node.inputs
    other = b if a is current else a if b is current else None
    return None if other is None else other.const if other.const is not None else (known or {}).get(id(other))


def gemm_lowering(weight: np.ndarray, bias: np.ndarray, x: Arg, out: Arg, bounds: tuple[float, float],
                  otherwise: Lowering, residual: Arg | None = None) -> Lowering:
    """``clip(x @ weight + bias (+ residual), bounds)`` as one ``md_gemm`` call writing ``out``
    where it measures faster than ``otherwise`` (OpenBLAS and the epilogue's pass), else
    ``otherwise``."""
    has_res = residual is not None
    packed: list[np.ndarray] = []

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape], symbols: Mapping[str, int]
              ) -> NativeStep | str:
        sx = inputs[0]
        k, n = weight.shape
        if sx is None or len(sx) < 2 or sx[-1] != k or math.prod(sx) == 0:
            return otherwise(inputs, outputs, symbols)
        m = math.prod(sx[:-1])
        if PREFER is None and m > MAX_ROWS:
            return otherwise(inputs, outputs, symbols)
        choice = PREFER or known_choice(_choice_key(m, n, k, bounds, has_res), (OWN, BLAS))
        if (choice or _measured(m, n, k, bounds, has_res)) != OWN:  # (decided before: nothing to pack)
            fallback = None if has_res else _sgemm_with_bias(weight, bias, x, out, m, bounds)
            return fallback or otherwise(inputs, outputs, symbols)
        if not packed:  # packed for our kernel only once it has won
            packed.append(pack_gemm_weights(weight))
            padded = np.zeros(packed[0].shape[0] * packed[0].shape[2], np.float32)
            padded[:n] = bias
            packed.append(padded)
            release_mapped(weight)  # a weight mapped from a .mdef file: its pages leave the RSS
        panels, lda = -(-n // gemm_panel()), gemm_lda(k)

        def tasks(count: int) -> list[tuple[int, ...]] | None:
            if count < 2 or m * n * k < 1 << 18 or panels < count:
                return None
            return [gemm_dims(m, n, k, lo=bounds[0], hi=bounds[1], task=t, tasks=count, lda=lda, residual=has_res)
                    for t in range(count)]

        fused = " + epilogue" if bounds != (-math.inf, math.inf) or bias.any() or has_res else ""
        rows, scratch = (x, ()) if lda == k else (Arg("scratch", 0), (4 * m * lda,))
        call = Call(native_function("md_gemm"), (rows, Arg("addr", packed[0].ctypes.data),
                                                 Arg("addr", packed[1].ctypes.data), out,
                                                 *((residual,) if residual is not None else ())),
                    gemm_dims(m, n, k, lo=bounds[0], hi=bounds[1], lda=lda, residual=has_res),
                    "gemm own kernel" + fused, tasks)
        if lda == k:
            return NativeStep((call,), (), tuple(packed))
        restride = Call(native_function("md_copy_rows"), (x, rows), (m, 4 * k, 4 * k, 4 * lda),
                        "gemm rows to a padded stride")
        return NativeStep((restride, call), scratch, tuple(packed))

    return needing(lower, *needs(otherwise), "md_gemm", "md_sgemm", "md_copy", "md_copy_rows")


def _sgemm_with_bias(weight: np.ndarray, bias: np.ndarray, x: Arg, out: Arg, m: int,
                     bounds: tuple[float, float]) -> NativeStep | None:
    """``x @ weight + bias`` as one sgemm writing ``out``, the bias broadcast into it first (as
    :func:`_measured` timed OpenBLAS), where no bounds follow; None where they do (the group's
    own lowering applies bias and bounds in one pass after the sgemm)."""
    if bounds != (-math.inf, math.inf):
        return None
    k, n = weight.shape
    trans_b = not weight.flags.c_contiguous and weight.T.flags.c_contiguous  # Gemm's transB: [n, k] as stored
    w = weight.T if trans_b else np.ascontiguousarray(weight)
    b = np.ascontiguousarray(bias, np.float32)
    zero = not b.any()
    args = (x, Arg("addr", w.ctypes.data), out, Arg("addr", blas.cblas_address("sgemm")),
            NULL if zero else Arg("addr", b.ctypes.data), Arg("addr", blas.cblas_address("sgemv")))
    call = sgemm_call(args, 1, m, n, k, "sgemm" if zero else "sgemm + bias", trans_b=trans_b,
                      bias=None if zero else (0, 1))
    return NativeStep((call,), (), (w, b))


def _choice_key(m: int, n: int, k: int, bounds: tuple[float, float], residual: bool = False) -> tuple[Any, ...]:
    return ("gemm", m, n, k, *bounds, *(("residual",) if residual else ()))


def _measured(m: int, n: int, k: int, bounds: tuple[float, float], residual: bool = False) -> str:
    """Ours (epilogue included) or OpenBLAS (the bias written first, sgemm, and for an
    activation or a residual one more pass over the output, timed as a copy), measured once per
    shape, on weights of ones in either layout (so the loser's weights are never packed)."""
    key = _choice_key(m, n, k, bounds, residual)
    width, lda = gemm_panel(), gemm_lda(k)
    panels = -(-n // width)
    x = np.zeros((m, k), np.float32)
    rows = x if lda == k else np.zeros((m, lda), np.float32)
    y = np.empty((m, n), np.float32)
    z = np.empty((m, n), np.float32)
    w, packed = np.ones((k, n), np.float32), np.ones((panels, k, width), np.float32)
    bias = np.ones(panels * width, np.float32)
    product = timed_call(native_function("md_gemm"), [rows.ctypes.data, packed.ctypes.data, bias.ctypes.data,
                                                      y.ctypes.data, z.ctypes.data],
                         gemm_dims(m, n, k, lo=bounds[0], hi=bounds[1], lda=lda, residual=residual))
    restride = timed_call(native_function("md_copy_rows"), [x.ctypes.data, rows.ctypes.data],
                          (m, 4 * k, 4 * k, 4 * lda))
    own = product if lda == k else lambda: (restride(), product())
    sgemm = timed_call(native_function("md_sgemm"), [x.ctypes.data, w.ctypes.data, y.ctypes.data,
                                                     blas.cblas_address("sgemm"), bias.ctypes.data,
                                                     blas.cblas_address("sgemv")],
                       sgemm_dims(1, m, n, k, bias=(0, 1)))
    epilogue = timed_call(native_function("md_copy"), [y.ctypes.data, z.ctypes.data], (y.nbytes,))
    pass_after = residual or bounds != (-math.inf, math.inf)
    return measured_choice(key, {OWN: own, BLAS: (lambda: (sgemm(), epilogue())) if pass_after else sgemm})[0]


def product_lowering(node: Node, consts: Sequence[np.ndarray | None], x: Arg, out: Arg,
                     epilogue: tuple[np.ndarray | None, float, float] | None, otherwise: Lowering,
                     residual: Arg | None = None) -> Lowering:
    """A MatMul/Gemm node (with its group's ``epilogue``: bias, bounds, and ``residual``, a
    tensor of the output's shape added before the bounds) through ``md_gemm`` where that can
    be, else ``otherwise`` unchanged."""
    weight = weights_of(node, consts)
    if weight is None or x is NULL:
        return otherwise
    n = weight.shape[1]
    bias = gemm_bias(node, consts, n)
    if bias is None:
        return otherwise
    extra, lo, hi = epilogue if epilogue is not None else (None, -math.inf, math.inf)
    total = bias if extra is None else bias + extra
    return gemm_lowering(weight, total, x, out, (lo, hi), otherwise, residual)


__all__ = ["BLAS", "OWN", "bias_form", "gemm_bias", "gemm_lowering", "product_lowering", "residual_form",
           "weights_of"]
