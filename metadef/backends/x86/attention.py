"""Attention on x86: ``ai.metadef::Attention`` lowered to native calls (see
:func:`attention_lowering`): two batched products (``md_bmm``, our micro-kernel, or OpenBLAS's
sgemm, whichever measures faster) around ``md_softmax_rows`` (or the generated softmax kernel
for a mask it cannot walk); at batch sizes where the scores outgrow a core's cache, in
sequences of a few heads (:func:`attention_chunk`).

Example:
    >>> [attention_chunk(batch, 12, 128, 128, threads) for batch, threads in ((12, 1), (96, 2))]
    [4, 4]
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from metadef.backends.x86 import contractions as blas
from metadef.backends.x86.native import (
    NULL,
    OWN_PRODUCTS,
    PARALLEL_ELEMENTS,
    Arg,
    Call,
    Lowering,
    NativeStep,
    Shape,
    _blas,
    _f32,
    binding_threads,
    bmm_call,
    kernel_tasks,
    known_choice,
    measured_choice,
    needing,
    sequence,
    sgemm_call,
    sgemm_dims,
    timed_call,
)
from metadef.codegen.native import native_function
from metadef.codegen.native_bmm import BMM_STACK_FLOATS, bmm_dims, bmm_packed_floats
from metadef.codegen.native_softmax import softmax_dims
from metadef.core.errors import MetadefError


@dataclass(frozen=True)
class Geometry:
    """Where attention's items (one head of one batch item) lie in Q, K, V and Y: item ``i``
    is head ``i % heads`` of group ``i // heads``; ``strides[t]`` for t in (Q, K, V, Y) is
    ``(group, head, row)`` in floats. Heads first (``[*B, H, S, D]``): one head per group,
    the items one after another; heads after the sequence (``layout="bshd"``, ``[*B, S, H,
    D]``): the heads ``D`` apart, each row ``H * D`` long.

    Example:
        >>> g = Geometry.of("bshd", 12, 128, 128, 64, 64)
        >>> g.strides[0], g.offset(0, 14)
        ((98304, 64, 768), 393728)
    """

    heads: int
    strides: tuple[tuple[int, int, int], ...]

    @staticmethod
    def of(layout: str, heads: int, m: int, n: int, d: int, dv: int) -> Geometry:
        if layout == "bshd":
            return Geometry(heads, tuple((rows * heads * w, w, heads * w) for rows, w in ((m, d), (n, d), (n, dv),
                                                                                           (m, dv))))
        return Geometry(1, tuple((rows * w, 0, w) for rows, w in ((m, d), (n, d), (n, dv), (m, dv))))

    def offset(self, which: int, item: int) -> int:
        """Bytes from tensor ``which``'s start (0-3: Q, K, V, Y) to item ``item``."""
        group, head, _ = self.strides[which]
        return 4 * ((item // self.heads) * group + (item % self.heads) * head)


def attention_lowering(attrs: Mapping[str, Any], sources: Sequence[Arg], out: Arg, dtype: np.dtype,
                       softmax: Any) -> Lowering:
    """``softmax(scale * Q Kᵀ + mask) V`` as a batched product into a scratch ``S``, the
    softmax with the mask added (``md_softmax_rows``; the generated ``softmax`` kernel for a
    mask it cannot walk) into a scratch ``P``, and a batched product ``P V`` into the output;
    where ``S`` and ``P`` outgrow a core's cache, in sequences of a few heads
    (:func:`attention_chunk`). The products are ``md_bmm`` (our micro-kernel, each head's second
    operand packed on the stack) or OpenBLAS's batched sgemm, whichever measures faster on the
    shapes (:func:`attention_products`); with ``layout="bshd"`` both read Q, K, V and write Y
    in place, the rows ``heads * depth`` apart (:class:`Geometry`)."""
    scale, layout = float(attrs["scale"]), attrs.get("layout", "bhsd")

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape],
              symbols: Mapping[str, int]) -> NativeStep | str:
        q, k, v = inputs[0], inputs[1], inputs[2]
        why = _f32(q is not None and k is not None and v is not None, [dtype])
        if why:
            return why
        assert q is not None and k is not None and v is not None
        if layout == "bshd":
            if len(q) < 3 or not (q[:-3] == k[:-3] == v[:-3] and q[-2] == k[-2] == v[-2] and k[-3] == v[-3]):
                return f"Attention (bshd) batch or head axes differ: Q {list(q)}, K {list(k)}, V {list(v)}"
            scores_batch, (m, d, n, dv) = (*q[:-3], q[-2]), (q[-3], q[-1], k[-3], v[-1])
        else:
            if len(q) < 2 or not (q[:-2] == k[:-2] == v[:-2]):
                return f"Attention batch axes differ: Q {list(q)}, K {list(k)}, V {list(v)}"
            scores_batch, (m, d, n, dv) = tuple(q[:-2]), (q[-2], q[-1], k[-2], v[-1])
        batch = math.prod(scores_batch)
        mask = inputs[3] if len(inputs) > 3 else None
        s_arg, p_arg = Arg("scratch", 0), Arg("scratch", 1)
        products = attention_products(batch, m, n, d, dv)
        heads = scores_batch[-1] if scores_batch else 1
        geometry = Geometry.of(layout, heads, m, n, d, dv)
        strides = mask_strides(scores_batch, m, n, mask)
        if isinstance(strides, str):  # (a mask md_softmax_rows cannot walk: the generated kernel broadcasts any)
            scores = (*scores_batch, m, n)
            try:
                dims = softmax.dims_for([scores, *([mask] if mask is not None else [])], [scores])
            except MetadefError as e:
                return f"the softmax kernel does not take these shapes ({e})"
            soft = Call(softmax.address, (s_arg, *([sources[3]] if mask is not None else []),
                                          *(Arg("addr", a) for a in softmax.constant_pointers), p_arg),
                        tuple(dims), "attention softmax",
                        kernel_tasks(softmax, [scores, *([mask] if mask is not None else [])], [scores]))
        else:
            chunk = attention_chunk(batch, heads, m, n, binding_threads())
            if chunk < batch:  # in sequences of a few heads each: S and P stay in the core's cache
                return _attention_chunks(sources, out, batch, heads, (m, n, d, dv), scale, products, chunk, strides,
                                         softmax, geometry)
            soft = softmax_rows_call(batch, heads, m, n, strides, s_arg, sources[3] if mask is not None else NULL,
                                     p_arg)
        calls = _attention_products(sources, out, batch, (m, n, d, dv), scale, products, s_arg, p_arg, soft, geometry)
        size = 4 * batch * m * n
        return NativeStep(calls, (size, size), (softmax,))

    return needing(lower, "md_sgemm", "md_bmm", "md_softmax_rows", "md_run_program")


def _attention_products(sources: Sequence[Arg], out: Arg, batch: int, sizes: tuple[int, int, int, int], scale: float,
                        products: str, s_arg: Arg, p_arg: Arg, soft: Call, geometry: Geometry) -> tuple[Call, ...]:
    """Scores into ``s_arg``, ``soft``, then values from ``p_arg`` into ``out``, for ``batch``
    items from ``sources`` (Q, K, V; offsets included: the first item's) laid out as
    ``geometry`` says; the scores and probabilities ``[batch, m, n]``, dense."""
    m, n, d, dv = sizes
    (qg, qh, qr), (kg, kh, kr), (vg, vh, vr), (yg, yh, yr) = geometry.strides
    heads = geometry.heads
    dense = (heads * m * n, m * n, n)
    if products == OWN_PRODUCTS:
        return (bmm_call((sources[0], sources[1], s_arg), batch, m, n, d, "attention scores own kernel",
                         trans_b=True, alpha=scale, strides=(qg, kg, dense[0]), heads=heads,
                         head_strides=(qh, kh, dense[1]), rows=(qr, kr, n)),
                soft,
                bmm_call((p_arg, sources[2], out), batch, m, dv, n, "attention values own kernel",
                         strides=(dense[0], vg, yg), heads=heads, head_strides=(dense[1], vh, yh), rows=(n, vr, yr)))
    gemm, gemv = _blas(), _blas("sgemv")
    if heads == 1:  # the items one after another: one batched call each
        return (sgemm_call((sources[0], sources[1], s_arg, *gemm, NULL, *gemv), batch, m, n, d,
                           "attention scores", trans_b=True, strides=(qg, kg, m * n), alpha=scale),
                soft,
                sgemm_call((p_arg, sources[2], out, *gemm, NULL, *gemv), batch, m, dv, n, "attention values",
                           strides=(m * n, vg, yg)))
    scores, values = [], []  # heads after the sequence: a batched call per group of heads
    for first in range(0, batch, heads):
        count, at = min(heads, batch - first), (lambda t, i=first: geometry.offset(t, i))
        s_at, p_at = s_arg.at(4 * first * m * n), p_arg.at(4 * first * m * n)
        scores.append(sgemm_call((sources[0].at(at(0)), sources[1].at(at(1)), s_at, *gemm, NULL, *gemv), count,
                                 m, n, d, "attention scores", trans_b=True, strides=(qh, kh, m * n), lda=qr, ldb=kr,
                                 alpha=scale))
        values.append(sgemm_call((p_at, sources[2].at(at(2)), out.at(at(3)), *gemm, NULL, *gemv), count, m, dv, n,
                                 "attention values", strides=(m * n, vh, yh), ldb=vr, ldc=yr))
    return (*scores, soft, *values)


ATTENTION_CHUNK_BYTES = 512 << 10
"""The most scores and probabilities (``S`` and ``P``, float32) a sequence of attention's heads
may hold: they stay in a core's L2 between the products and the softmax."""


def attention_chunk(batch: int, heads: int, m: int, n: int, threads: int) -> int:
    """How many of ``batch`` heads (items) run as one sequence of attention's three calls: a
    divisor of ``heads`` or a multiple of it (so a mask row is found from the first), whose
    ``S`` and ``P`` fit :data:`ATTENTION_CHUNK_BYTES`, the number of sequences a multiple of
    ``threads`` (or at least 4 a thread); ``batch`` itself: one sequence, the calls split
    across the threads instead.

    Example:
        >>> [attention_chunk(batch, 12, 128, 128, threads) for batch, threads in ((12, 1), (12, 2), (96, 2))]
        [4, 3, 4]
    """
    per_item = 8 * m * n
    options = {c for c in range(1, heads + 1) if heads % c == 0}
    options |= {heads * k for k in range(1, batch // max(heads, 1) + 1)}
    fits = sorted(c for c in options if c <= batch and c * per_item <= ATTENTION_CHUNK_BYTES)
    if not fits:
        return 1 if per_item > ATTENTION_CHUNK_BYTES and batch > 1 else batch
    units = {c: -(-batch // c) for c in fits}
    balanced = [c for c in fits if threads == 1 or units[c] % threads == 0 or units[c] >= 4 * threads]
    return max(balanced or fits)


def _attention_chunks(sources: Sequence[Arg], out: Arg, batch: int, heads: int, sizes: tuple[int, int, int, int],
                      scale: float, products: str, chunk: int, strides: tuple[int, int, int] | None,
                      softmax: Any, geometry: Geometry) -> NativeStep:
    """Attention in sequences of ``chunk`` heads (scores, ``md_softmax_rows``, values on one
    thread), as many side by side as the binding has threads, each with its own ``S`` and
    ``P``: they stay in that core's cache (BERT at batch 8: 6.3 MB each, through memory)."""
    m, n = sizes[:2]
    width = max(1, binding_threads())
    per = 4 * chunk * m * n
    calls = []
    for u, i0 in enumerate(range(0, batch, chunk)):
        count, j = min(chunk, batch - i0), u % width
        s_arg, p_arg = Arg("scratch", 0).at(j * per), Arg("scratch", 1).at(j * per)
        items = tuple(sources[t].at(geometry.offset(t, i0)) for t in range(3))
        if strides is None:
            mask, heads_here, strides_here = NULL, count, None
        elif chunk % heads == 0:  # whole batch items: the mask's outer index moves with them
            mask, heads_here, strides_here = sources[3].at(4 * (i0 // heads) * strides[0]), heads, strides
        else:  # a few heads of one batch item
            m_outer, m_head, m_row = strides
            mask = sources[3].at(4 * ((i0 // heads) * m_outer + (i0 % heads) * m_head))
            heads_here, strides_here = count, (0, m_head, m_row)
        soft = softmax_rows_call(count, heads_here, m, n, strides_here, s_arg, mask, p_arg)
        steps = _attention_products(items, out.at(geometry.offset(3, i0)), count, sizes, scale, products, s_arg,
                                    p_arg, soft, geometry)
        calls.append(sequence(steps, joins=j > 0))
    return NativeStep(tuple(calls), (width * per, width * per), (softmax,))


def mask_strides(batch: Shape, m: int, n: int, mask: Shape | None) -> tuple[int, int, int] | str | None:
    """The strides ``(m_outer, m_head, m_row)`` at which ``md_softmax_rows`` walks ``mask``
    (numpy-broadcast to scores ``[*batch, m, n]``), None without a mask, or ``"unsupported"``:
    the mask must reduce to them (the batch axes flattened to ``(outer, heads)``, ``heads`` the
    last; each axis whole or of size 1, the outer ones all whole or all 1; its last axis ``n``).

    Example:
        >>> mask_strides((2, 12), 128, 128, (2, 1, 1, 128)), mask_strides((2, 12), 7, 9, (2, 12, 7, 1))
        ((128, 0, 0), 'unsupported')
    """
    if mask is None:
        return None
    rank = len(batch) + 2
    if len(mask) > rank or not mask or mask[-1] != n or (len(mask) > 1 and mask[-2] not in (1, m)):
        return "unsupported"
    shape = (1,) * (rank - len(mask)) + tuple(mask)
    if any(s not in (1, full) for s, full in zip(shape[:-2], batch)):
        return "unsupported"
    dense = [math.prod(shape[k + 1:]) for k in range(rank)]
    st = [0 if shape[k] == 1 else dense[k] for k in range(rank)]
    outer = shape[:len(batch) - 1]
    if len(outer) > 1 and not (all(s == 1 for s in outer) or tuple(outer) == tuple(batch[:-1])):
        return "unsupported"
    m_outer = st[len(batch) - 2] if len(batch) >= 2 else 0
    return (m_outer, st[len(batch) - 1] if batch else 0, st[rank - 2])


def softmax_rows_call(items: int, heads: int, m: int, n: int, strides: tuple[int, int, int] | None, scores: Arg,
                      mask_arg: Arg, out: Arg, what: str = "attention softmax rows", log: bool = False) -> Call:
    """``md_softmax_rows`` over scores ``[items, m, n]`` (contiguous at ``scores``), the mask at
    ``mask_arg`` walked at ``strides`` (:func:`mask_strides`, items counted in ``heads``; None: no
    mask) added first (``log``: ``log(softmax)`` by ``md_log_softmax_rows``, no mask); split
    across the pool by rows.

    Example:
        >>> call = softmax_rows_call(24, 12, 128, 128, mask_strides((2, 12), 128, 128, (2, 1, 1, 128)),
        ...                          Arg("scratch", 0), Arg("in", 3), Arg("scratch", 1))
        >>> call.dims[:8]
        (24, 12, 128, 128, 128, 0, 0, 1)
    """
    def tasks(count: int) -> list[tuple[int, ...]] | None:
        if count < 2 or items * m * n < PARALLEL_ELEMENTS or items * m < count:
            return None
        return [softmax_dims(items, heads, m, n, mask=strides, task=t, tasks=count) for t in range(count)]

    routine = "md_log_softmax_rows" if log else "md_softmax_rows"
    assert not (log and strides is not None), "md_log_softmax_rows takes no mask"
    return Call(native_function(routine), (scores, mask_arg, out), softmax_dims(items, heads, m, n, mask=strides),
                what, tasks)


def attention_products(batch: int, m: int, n: int, d: int, dv: int) -> str:
    """:data:`OWN_PRODUCTS` or ``"sgemm"`` for attention's two products on these shapes:
    measured once (:func:`measured_choice`) where each head's packed operands fit
    ``md_bmm``'s stack buffer, else OpenBLAS."""
    names = (OWN_PRODUCTS, "sgemm")
    if max(bmm_packed_floats(n, d), bmm_packed_floats(dv, n)) > BMM_STACK_FLOATS:
        return "sgemm"
    key = ("attention products", batch, m, n, d, dv)
    known = known_choice(key, names)
    if known is not None:
        return known
    q, k, v = (np.ones((batch, rows, cols), np.float32) for rows, cols in ((m, d), (n, d), (n, dv)))
    s, out = np.empty((batch, m, n), np.float32), np.empty((batch, m, dv), np.float32)
    bmm, sgemm = native_function("md_bmm"), native_function("md_sgemm")
    gemm, gemv = blas.cblas_address("sgemm"), blas.cblas_address("sgemv")
    own = (timed_call(bmm, [q.ctypes.data, k.ctypes.data, s.ctypes.data], bmm_dims(batch, m, n, d, trans_b=True)),
           timed_call(bmm, [s.ctypes.data, v.ctypes.data, out.ctypes.data], bmm_dims(batch, m, dv, n)))
    library = (timed_call(sgemm, [q.ctypes.data, k.ctypes.data, s.ctypes.data, gemm, 0, gemv],
                          sgemm_dims(batch, m, n, d, trans_b=True, strides=(m * d, n * d, m * n))),
               timed_call(sgemm, [s.ctypes.data, v.ctypes.data, out.ctypes.data, gemm, 0, gemv],
                          sgemm_dims(batch, m, dv, n, strides=(m * n, n * dv, m * dv))))
    return measured_choice(key, {OWN_PRODUCTS: lambda: [c() for c in own],
                                 "sgemm": lambda: [c() for c in library]})[0]


__all__ = ["ATTENTION_CHUNK_BYTES", "OWN_PRODUCTS", "Geometry", "attention_chunk", "attention_lowering",
           "attention_products", "mask_strides", "softmax_rows_call"]
