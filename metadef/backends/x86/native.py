"""How a step runs natively: its lowering to calls of kernels and native routines.

A :class:`Lowering` takes a step's concrete input and output shapes (once per binding of the
symbolic dims) and returns the :class:`NativeStep` that computes it: calls in the kernels'
calling convention (:data:`metadef.codegen.native.ENTRY`), whose pointer arguments are
:class:`Arg` references resolved by the program (a step input or output, a scratch buffer of
the step, or a fixed address), or a ``str`` saying why this step runs from Python instead.
:data:`ALIAS` marks a step whose output is its input's memory under another shape (Reshape,
Flatten, ...): no call at all.

Example:
    >>> import numpy as np
    >>> from metadef.ir import parse_graph
    >>> from metadef.backends.x86.mapping import choose
    >>> g = parse_graph('''graph g(%a: f32[n,3], %b: f32[3,2]) -> (%y) {
    ...   %y: f32[n,2] = MatMul(%a, %b) @mm
    ...   return %y }''')
    >>> step = choose(g.nodes[0]).native([(4, 3), (3, 2)], [(4, 2)], {'n': 4})
    >>> [a.kind for a in step.calls[0].args][:3], step.calls[0].dims[:4]
    (['in', 'in', 'out'], (1, 4, 2, 3))
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import logging
import math
import struct
import threading
import time
import weakref
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from metadef.backends.x86 import contractions as blas
from metadef.cache import Store, kernel_key, shape_key
from metadef.codegen.native import (
    ENTRY,
    SGEMM_DIMS,
    native_function,
)
from metadef.codegen.native_bmm import BMM_STACK_FLOATS, bmm_dims, bmm_packed_floats
from metadef.codegen.native_softmax import softmax_dims
from metadef.core.errors import MetadefError

log = logging.getLogger("metadef.backends.x86")

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Arg:
    """A pointer argument: ``in``/``out`` (the step's input / output ``index``), ``scratch``
    (the step's scratch buffer ``index``), ``addr`` (a fixed address in ``index``) or ``null``;
    ``offset`` bytes past it (an image of a batch)."""

    kind: str
    index: int = 0
    offset: int = 0

    def __repr__(self) -> str:
        return f"{self.kind}{self.index}" + (f"+{self.offset}" if self.offset else "")

    def at(self, offset: int) -> Arg:
        """This argument ``offset`` more bytes along (null stays null)."""
        return self if self.kind == "null" else Arg(self.kind, self.index, self.offset + offset)


NULL = Arg("null")


@dataclass(frozen=True)
class Call:
    """One entry of a native program; ``tasks(n)``, when given, splits it into ``n`` calls
    that may run at once (their dims; the args are shared), or says None (not worth it).
    ``joins``: the call runs in the same group of the worker pool as the call before it (it
    neither reads what that call writes nor writes what it reads or writes): no barrier between
    them, and their tasks are shared out together."""

    address: int
    args: tuple[Arg, ...]
    dims: tuple[int, ...]
    what: str = ""
    tasks: Callable[[int], list[tuple[int, ...]] | None] | None = field(default=None, compare=False)
    joins: bool = False
    steps: tuple[Call, ...] = ()
    """A sequence (:func:`sequence`): these calls, one after the other, as one task."""


BINDING_THREADS: contextvars.ContextVar[int] = contextvars.ContextVar("metadef_x86_binding_threads", default=1)
"""The threads of the program being bound while its steps are lowered (a lowering that lays
out work per thread reads it: :func:`binding_threads`)."""


def binding_threads() -> int:
    """The thread count of the program whose steps are being lowered (1 outside a binding).

    Example:
        >>> binding_threads()
        1
    """
    return BINDING_THREADS.get()


def sequence(calls: Sequence[Call], joins: bool = False) -> Call:
    """One task of the worker pool that runs ``calls`` in order (``md_run_sequence``; none of
    them split): with ``joins``, several such tasks side by side in one group, each its own
    chain of calls (an image band's im2col, then its product, on one core).

    Example:
        >>> a = Call(1, (), (), "im2col"); b = Call(2, (), (), "product")
        >>> [c.what for c in sequence([a, b]).steps], sequence([a, b]).dims
        (['im2col', 'product'], (2,))
    """
    return Call(native_function("md_run_sequence"), (), (len(calls),), " then ".join(c.what for c in calls),
                joins=joins, steps=tuple(calls))


PARALLEL_ELEMENTS = 16384
"""A generated kernel splits across threads when it writes at least this many elements."""


def kernel_tasks(kernel: Any, inputs: Sequence[Shape], outputs: Sequence[Shape]
                 ) -> Callable[[int], list[tuple[int, ...]] | None]:
    """How a generated kernel's call splits into ``n`` tasks on these shapes."""

    def split(n: int) -> list[tuple[int, ...]] | None:
        if n < 2 or sum(math.prod(o) for o in outputs) < PARALLEL_ELEMENTS:
            return None
        splits, fewest = kernel.split_plan(inputs, outputs)
        if fewest < n:
            return None
        return [tuple(kernel.dims_for(inputs, outputs, t, n, splits)) for t in range(n)]

    return split


@dataclass(frozen=True)
class NativeStep:
    """The calls that compute one step, and the scratch buffers (bytes) they use."""

    calls: tuple[Call, ...]
    scratch: tuple[int, ...] = ()
    keep: tuple[Any, ...] = field(default=(), repr=False)
    """Objects whose memory a call reads by address (kept alive with the step)."""
    checks: tuple[tuple[np.ndarray, Callable[[int], str]], ...] = field(default=(), repr=False)
    """Status words the calls write (int64 ``[flag, value]``) and the message for a raised flag:
    the program reads them after every run (an index out of range, say) and raises InputError."""


Lowering = Callable[[Sequence[Shape | None], Sequence[Shape], Mapping[str, int]], "NativeStep | str"]
"""(input shapes, None for an absent input; output shapes; the symbols' values) -> the step."""


class _Alias:
    def __repr__(self) -> str:
        return "ALIAS"


ALIAS: Any = _Alias()
"""The lowering of a step whose (only) output is its first input's memory, reshaped."""


def needing(lower: Lowering, *routines: str) -> Lowering:
    """``lower``, marked with the native routines its calls use (``lower.needs``), so that a
    compile makes them ready and a run compiles nothing."""
    lower.needs = tuple(routines)  # type: ignore[attr-defined]
    return lower


def needs(lower: Any) -> tuple[str, ...]:
    """The native routines a lowering's calls use (none for a generated kernel's)."""
    return tuple(getattr(lower, "needs", ()))


def _blas(routine: str = "sgemm") -> tuple[Arg]:
    return (Arg("addr", blas.cblas_address(routine)),)


def _f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def sgemm_dims(batch: int, m: int, n: int, k: int, *, trans_a: bool = False, trans_b: bool = False,
               lda: int | None = None, ldb: int | None = None, ldc: int | None = None,
               strides: tuple[int, int, int] = (0, 0, 0), bias: tuple[int, int] | None = None,
               alpha: float = 1.0, beta: float = 1.0, split: int = 0, task: int = 0,
               tasks: int = 1) -> tuple[int, ...]:
    """The dims of ``md_sgemm`` (row-major; ``bias``: its row and column strides; ``split``,
    ``task``, ``tasks``: which share this call computes, see :data:`SGEMM_DIMS`).

    Example:
        >>> sgemm_dims(1, 2, 3, 4)[:7]
        (1, 2, 3, 4, 4, 3, 3)
    """
    values = {"batch": batch, "m": m, "n": n, "k": k,
              "lda": lda if lda is not None else (m if trans_a else k),
              "ldb": ldb if ldb is not None else (k if trans_b else n), "ldc": ldc if ldc is not None else n,
              "trans_a": int(trans_a), "trans_b": int(trans_b), "stride_a": strides[0], "stride_b": strides[1],
              "stride_c": strides[2], "bias_row_stride": bias[0] if bias else 0,
              "bias_col_stride": bias[1] if bias else 0, "has_bias": int(bias is not None),
              "alpha": _f32_bits(alpha), "beta": _f32_bits(beta), "split": split, "task": task, "tasks": tasks}
    return tuple(values[name] for name in SGEMM_DIMS)


PARALLEL_FLOPS = 1 << 21
"""An sgemm splits across threads when it has at least this many multiply-adds (~30 µs on
one core here); below, the split costs more than it saves."""

SPLIT_MIN = 16
"""The fewest rows or columns of C a task of a split sgemm gets (a micro-panel of OpenBLAS)."""


def sgemm_call(args: tuple[Arg, ...], batch: int, m: int, n: int, k: int, what: str, **options: Any) -> Call:
    """One ``md_sgemm`` call (``options``: the rest of :func:`sgemm_dims`) that splits across
    the worker pool by batch, else by the columns of C when A is the smaller operand (each task
    packs all of A), else by its rows.

    Example:
        >>> call = sgemm_call((Arg("in", 0), Arg("in", 1), Arg("out", 0)), 1, 128, 768, 768, "sgemm")
        >>> [dims[-3:] for dims in call.tasks(2)]
        [(1, 0, 2), (1, 1, 2)]
    """

    def tasks(count: int) -> list[tuple[int, ...]] | None:
        if count < 2 or batch * m * n * k < PARALLEL_FLOPS:
            return None
        if batch >= count:
            split = 0
        else:
            # each task packs its own share of one operand and all of the other: split the one
            # whose whole copy would cost more (columns of C share A [m, k]; rows share B [k, n])
            by_columns = m * k <= k * n
            if (n if by_columns else m) < SPLIT_MIN * count:
                by_columns = not by_columns
                if (n if by_columns else m) < SPLIT_MIN * count:
                    return None
            split = 1 if by_columns else 2
        return [sgemm_dims(batch, m, n, k, **options, split=split, task=t, tasks=count) for t in range(count)]

    return Call(native_function("md_sgemm"), args, sgemm_dims(batch, m, n, k, **options), what, tasks)


def _bias_strides(shape: Shape, m: int, n: int) -> tuple[int, int] | str:
    """Row and column strides reading a bias of ``shape`` broadcast to ``[m, n]``."""
    if len(shape) > 2:
        return f"a bias of rank {len(shape)}"
    full = (1,) * (2 - len(shape)) + tuple(shape)
    if full[0] not in (1, m) or full[1] not in (1, n):
        return f"a bias of shape {list(shape)} does not broadcast to [{m}, {n}]"
    return (full[1] if full[0] == m and m != 1 else 0, 1 if full[1] == n and n != 1 else 0)


def _f32(shapes_ok: bool, dtypes: Sequence[np.dtype | None]) -> str | None:
    if any(d is not None and d != np.float32 for d in dtypes):
        return "native BLAS calls take float32 only"
    return None if shapes_ok else "shapes unknown"


def matmul_lowering(a: Arg, b: Arg, out: Arg, dtype: np.dtype) -> Lowering:
    """``A @ B`` as one sgemm when B is a matrix (A's batch axes fold into M) or as one
    sgemm per batch when both have the same batch axes; other broadcasts run from Python."""

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape],
              symbols: Mapping[str, int]) -> NativeStep | str:
        sa, sb = inputs[0], inputs[1]
        why = _f32(sa is not None and sb is not None, [dtype])
        if why:
            return why
        assert sa is not None and sb is not None
        if len(sa) < 2 or len(sb) < 2:
            return "a 1-D MatMul operand"
        m, k, n = sa[-2], sa[-1], sb[-1]
        args = (a, b, out, *_blas(), NULL, *_blas("sgemv"))
        if len(sb) == 2:
            return NativeStep((sgemm_call(args, 1, math.prod(sa[:-1]), n, k, "sgemm"),))
        if sa[:-2] == sb[:-2]:
            return NativeStep((sgemm_call(args, math.prod(sa[:-2]), m, n, k, "sgemm",
                                          strides=(m * k, k * n, m * n)),))
        return f"MatMul batch axes {list(sa[:-2])} and {list(sb[:-2])} differ"

    return needing(lower, "md_sgemm")


PRETRANSPOSE_BYTES = 64 << 20
"""A constant ``B`` that Gemm reads transposed is stored transposed once, up to this size (a
second copy of the weights): OpenBLAS's small-M sgemm is ~25 % faster on ``[K, N]``."""


_TRANSPOSED: dict[int, tuple[weakref.ref[np.ndarray], np.ndarray]] = {}
_TRANSPOSED_LOCK = threading.Lock()


def transposed_once(weight: np.ndarray) -> np.ndarray:
    """``weight.T`` as a contiguous copy, made once per weight array for every lowering that
    reads it so (made when a binding first needs it, not at compile time).

    Example:
        >>> w = np.arange(6, dtype=np.float32).reshape(2, 3)
        >>> transposed_once(w) is transposed_once(w), transposed_once(w).shape
        (True, (3, 2))
    """
    with _TRANSPOSED_LOCK:
        found = _TRANSPOSED.get(id(weight))
        if found is None or found[0]() is not weight:
            found = _TRANSPOSED[id(weight)] = (weakref.ref(weight), np.ascontiguousarray(weight.T))
            weakref.finalize(weight, _TRANSPOSED.pop, id(weight), None)  # the copy lives as long as the weight
        return found[1]


def gemm_lowering(attrs: Mapping[str, Any], sources: Sequence[Arg], out: Arg, dtype: np.dtype,
                  weight: np.ndarray | None = None) -> Lowering:
    """``alpha * A' B' + beta * C`` as one sgemm (C broadcast into the output first); a
    constant ``B`` read transposed (``transB``, a linear layer's ``[N, K]``) is transposed once
    here (see :data:`PRETRANSPOSE_BYTES`)."""
    alpha, beta = float(attrs["alpha"]), float(attrs["beta"])
    trans_a, trans_b = bool(attrs["transA"]), bool(attrs["transB"])
    pretranspose = trans_b and weight is not None and weight.ndim == 2 and weight.dtype == np.float32 \
        and weight.nbytes <= PRETRANSPOSE_BYTES

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape],
              symbols: Mapping[str, int]) -> NativeStep | str:
        why = _f32(inputs[0] is not None and inputs[1] is not None, [dtype])
        if why:
            return why
        sa, sb = inputs[0], inputs[1]
        assert sa is not None and sb is not None
        if len(sa) != 2 or len(sb) != 2:
            return "Gemm operands are not matrices"
        keep: tuple[Any, ...] = ()
        b_arg, b_trans = sources[1], trans_b
        if pretranspose:
            copy = transposed_once(weight)  # type: ignore[arg-type]
            keep, b_arg, b_trans = (copy,), Arg("addr", copy.ctypes.data), False
            sb = (sb[1], sb[0])  # the shape of the transposed copy
        m, k = (sa[1], sa[0]) if trans_a else sa
        n = sb[0] if b_trans else sb[1]
        c = inputs[2] if len(inputs) > 2 else None
        bias = None
        if c is not None and beta != 0.0:
            found = _bias_strides(c, m, n)
            if isinstance(found, str):
                return found
            bias = found
        args = (sources[0], b_arg, out, *_blas(), sources[2] if bias is not None else NULL,
                *_blas("sgemv"))
        call = sgemm_call(args, 1, m, n, k, "sgemm", trans_a=trans_a, trans_b=b_trans, bias=bias, alpha=alpha,
                          beta=beta)
        return NativeStep((call,), (), keep)

    return needing(lower, "md_sgemm")


MEASURED_ROUNDS = 3
"""Each candidate of a measured choice runs this many times, interleaved; its best time counts."""
DROPPED_AFTER = 1.3
"""A candidate whose best time is more than this times the best one's after a round runs no
more rounds (a cold start measures ResNet-50's conv choices in about half the time)."""

_CONV_CHOICES: dict[tuple[int, ...], tuple[str, str]] = {}
_CHOICE_LOCK = threading.Lock()


def measured_choice(key: tuple[Any, ...], candidates: Mapping[str, Callable[[], None]]) -> tuple[str, str]:
    """The fastest of ``candidates`` (name -> one run on the shapes ``key`` names), timed once
    (:func:`race`, after a warm-up) and remembered in this process and in the compile cache's
    shape level, so a new process on this machine does not time it again: ``(name, the
    timings as text)``. The decision is logged under ``METADEF_DEBUG=1``. Choices are made one
    at a time (a lock): two kernels timed at once would slow each other."""
    with _CHOICE_LOCK:
        found = _known_choice(key, candidates)
        if found is None:
            found = remember_choice(key, candidates, race(candidates))
        return found


def race(candidates: Mapping[str, Callable[[], None]], rounds: int = MEASURED_ROUNDS,
         warm_up: bool = True) -> dict[str, float]:
    """Each candidate's best time (s) over ``rounds`` interleaved rounds (a burst of foreign
    load hits all alike), after one untimed run of each unless ``warm_up`` is False; a
    candidate :data:`DROPPED_AFTER` times behind the best after a round runs no more."""
    times = dict.fromkeys(candidates, math.inf)
    for run in candidates.values() if warm_up else ():
        run()
    racing = dict(candidates)
    for _ in range(rounds):
        for name, run in racing.items():
            t0 = time.perf_counter()
            run()
            times[name] = min(times[name], time.perf_counter() - t0)
        best = min(times.values())
        racing = {name: run for name, run in racing.items() if times[name] <= DROPPED_AFTER * best}
    return times


def remember_choice(key: tuple[Any, ...], names: Collection[str], times: Mapping[str, float]) -> tuple[str, str]:
    """The fastest of ``times`` as the choice for ``key`` among ``names``, kept in this process
    and in the compile cache's shape level (what :func:`known_choice` finds later), and logged."""
    winner = min(times, key=times.__getitem__)
    text = ", ".join(f"{n} {1e3 * t:.2f} ms" for n, t in sorted(times.items(), key=lambda x: x[1]))
    found = (winner, text)
    with contextlib.suppress(OSError, ValueError, TypeError):
        Store().put(_choice_key(key, names), {"winner": winner, "timings": text}, {})
    _CONV_CHOICES[key] = found
    log.debug("x86: %s: %s chosen by measurement (%s)", key, *found)
    return found


def _choice_key(key: tuple[Any, ...], names: Iterable[str]) -> Any:
    return shape_key(kernel_key(f"measured choice {key!r} among {sorted(names)}"), {})


def _known_choice(key: tuple[Any, ...], names: Collection[str]) -> tuple[str, str] | None:
    found = _CONV_CHOICES.get(key)
    if found is None:
        found = _stored_choice(_choice_key(key, names), names)
        if found is not None:
            _CONV_CHOICES[key] = found
    return found


def known_choice(key: tuple[Any, ...], names: Collection[str]) -> str | None:
    """The winner of a :func:`measured_choice` among ``names`` already made for ``key`` (in this
    process or stored in the cache), else None: callers check it before they allocate the
    arrays that measuring needs."""
    with _CHOICE_LOCK:
        found = _known_choice(key, names)
    return None if found is None else found[0]


def _stored_choice(cache_key: Any, candidates: Collection[str]) -> tuple[str, str] | None:
    try:
        entry = Store().get(cache_key)
    except (OSError, ValueError):
        return None
    if entry is None or entry.manifest.get("winner") not in candidates:
        return None
    return str(entry.manifest["winner"]), f"{entry.manifest.get('timings', '')}; stored"


def timed_call(address: int, pointers: Sequence[int], dims: Sequence[int]) -> Callable[[], None]:
    """One call of the native function at ``address``, ready to time (for :func:`measured_choice`)."""
    args = (ctypes.c_void_p * len(pointers))(*pointers)
    values = (ctypes.c_int64 * len(dims))(*dims)
    fn = ENTRY(address)
    return lambda: fn(args, values)


def attention_lowering(attrs: Mapping[str, Any], sources: Sequence[Arg], out: Arg, dtype: np.dtype,
                       softmax: Any) -> Lowering:
    """``softmax(scale * Q Kᵀ + mask) V`` as a batched product into a scratch ``S``, the
    generated ``softmax`` kernel (its inputs: ``S`` and, when present, the mask; the mask add
    fused) into a scratch ``P``, and a batched product ``P V`` into the output. The products
    are ``md_bmm`` (our micro-kernel, each head's second operand packed on the stack) or
    OpenBLAS's batched sgemm, whichever measures faster on the shapes (:func:`attention_products`)."""
    scale = float(attrs["scale"])

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape],
              symbols: Mapping[str, int]) -> NativeStep | str:
        q, k, v = inputs[0], inputs[1], inputs[2]
        why = _f32(q is not None and k is not None and v is not None, [dtype])
        if why:
            return why
        assert q is not None and k is not None and v is not None
        if len(q) < 2 or not (q[:-2] == k[:-2] == v[:-2]):
            return f"Attention batch axes differ: Q {list(q)}, K {list(k)}, V {list(v)}"
        batch, m, d, n, dv = math.prod(q[:-2]), q[-2], q[-1], k[-2], v[-1]
        mask = inputs[3] if len(inputs) > 3 else None
        scores = (*q[:-1], n)
        try:
            dims = softmax.dims_for([scores, *([mask] if mask is not None else [])], [scores])
        except MetadefError as e:
            return f"the softmax kernel does not take these shapes ({e})"
        s_arg, p_arg = Arg("scratch", 0), Arg("scratch", 1)
        products = attention_products(batch, m, n, d, dv)
        heads = q[-3] if len(q) > 2 else 1
        strides = mask_strides(q[:-2], m, n, mask)
        chunk = attention_chunk(batch, heads, m, n, binding_threads()) if strides != "unsupported" else batch
        if chunk < batch:  # in sequences of a few heads each: S and P stay in the core's cache
            return _attention_chunks(sources, out, batch, heads, (m, n, d, dv), scale, products, chunk,
                                     None if strides is None else strides, softmax)
        soft = softmax_rows_call(q[:-2], m, n, mask, s_arg, sources[3] if mask is not None else NULL, p_arg)
        if soft is None:  # (a mask md_softmax_rows cannot walk: the generated kernel broadcasts any)
            soft = Call(softmax.address, (s_arg, *([sources[3]] if mask is not None else []),
                                          *(Arg("addr", a) for a in softmax.constant_pointers), p_arg),
                        tuple(dims), "attention softmax",
                        kernel_tasks(softmax, [scores, *([mask] if mask is not None else [])], [scores]))
        calls = _attention_products(sources, out, batch, (m, n, d, dv), scale, products, s_arg, p_arg, soft)
        size = 4 * batch * m * n
        return NativeStep(calls, (size, size), (softmax,))

    return needing(lower, "md_sgemm", "md_bmm", "md_softmax_rows", "md_run_program")


def _attention_products(sources: Sequence[Arg], out: Arg, batch: int, sizes: tuple[int, int, int, int], scale: float,
                        products: str, s_arg: Arg, p_arg: Arg, soft: Call) -> tuple[Call, Call, Call]:
    """Scores into ``s_arg``, ``soft``, then values from ``p_arg`` into ``out``, for ``batch``
    items from ``sources`` (Q, K, V) as they are given (offsets included)."""
    m, n, d, dv = sizes
    if products == OWN_PRODUCTS:
        return (bmm_call((sources[0], sources[1], s_arg), batch, m, n, d, "attention scores own kernel",
                         trans_b=True, alpha=scale),
                soft,
                bmm_call((p_arg, sources[2], out), batch, m, dv, n, "attention values own kernel"))
    gemm, gemv = _blas(), _blas("sgemv")
    return (sgemm_call((sources[0], sources[1], s_arg, *gemm, NULL, *gemv), batch, m, n, d,
                       "attention scores", trans_b=True, strides=(m * d, n * d, m * n), alpha=scale),
            soft,
            sgemm_call((p_arg, sources[2], out, *gemm, NULL, *gemv), batch, m, dv, n, "attention values",
                       strides=(m * n, n * dv, m * dv)))


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
                      softmax: Any) -> NativeStep:
    """Attention in sequences of ``chunk`` heads (scores, ``md_softmax_rows``, values on one
    thread), as many side by side as the binding has threads, each with its own ``S`` and
    ``P``: they stay in that core's cache (BERT at batch 8: 6.3 MB each, through memory)."""
    m, n, d, dv = sizes
    width = max(1, binding_threads())
    per = 4 * chunk * m * n
    calls = []
    for u, i0 in enumerate(range(0, batch, chunk)):
        count, j = min(chunk, batch - i0), u % width
        s_arg, p_arg = Arg("scratch", 0).at(j * per), Arg("scratch", 1).at(j * per)
        items = (sources[0].at(4 * i0 * m * d), sources[1].at(4 * i0 * n * d), sources[2].at(4 * i0 * n * dv))
        if strides is None:
            mask, dims = NULL, softmax_dims(count, count, m, n)
        else:
            m_outer, m_head, m_row = strides
            if chunk % heads == 0:  # whole batch items: the mask's outer index moves with them
                base, dims = (i0 // heads) * m_outer, softmax_dims(count, heads, m, n, mask=strides)
            else:  # a few heads of one batch item
                base = (i0 // heads) * m_outer + (i0 % heads) * m_head
                dims = softmax_dims(count, count, m, n, mask=(0, m_head, m_row))
            mask = sources[3].at(4 * base)
        soft = Call(native_function("md_softmax_rows"), (s_arg, mask, p_arg), dims, "attention softmax rows")
        steps = _attention_products(items, out.at(4 * i0 * m * dv), count, sizes, scale, products, s_arg, p_arg, soft)
        calls.append(sequence(steps, joins=j > 0))
    return NativeStep(tuple(calls), (width * per, width * per), (softmax,))


def mask_strides(batch: Shape, m: int, n: int, mask: Shape | None) -> tuple[int, int, int] | str | None:
    """The strides ``(m_outer, m_head, m_row)`` at which ``md_softmax_rows`` walks ``mask`` for
    scores ``[*batch, m, n]`` (see :func:`softmax_rows_call`), None without a mask, or
    ``"unsupported"``.

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


def softmax_rows_call(batch: Shape, m: int, n: int, mask: Shape | None, scores: Arg, mask_arg: Arg,
                      out: Arg) -> Call | None:
    """``md_softmax_rows`` over scores ``[*batch, m, n]`` (contiguous at ``scores``), the mask
    (``mask_arg``, of shape ``mask``: numpy-broadcast to the scores) added first, when the mask
    reduces to the routine's strides (its batch axes flattened to ``(outer, heads)``, ``heads``
    the last; each axis either whole or of size 1, the outer ones all whole or all 1); else None.

    Example:
        >>> call = softmax_rows_call((2, 12), 128, 128, (2, 1, 1, 128), Arg("scratch", 0), Arg("in", 3),
        ...                          Arg("scratch", 1))
        >>> call.dims[:8]
        (24, 12, 128, 128, 128, 0, 0, 1)
    """
    items = math.prod(batch)
    heads = batch[-1] if batch else 1
    strides = mask_strides(batch, m, n, mask)
    if isinstance(strides, str):
        return None

    def tasks(count: int) -> list[tuple[int, ...]] | None:
        if count < 2 or items * m * n < PARALLEL_ELEMENTS or items * m < count:
            return None
        return [softmax_dims(items, heads, m, n, mask=strides, task=t, tasks=count) for t in range(count)]

    return Call(native_function("md_softmax_rows"), (scores, mask_arg, out),
                softmax_dims(items, heads, m, n, mask=strides), "attention softmax rows", tasks)


OWN_PRODUCTS = "own micro-kernel (md_bmm)"


def bmm_call(args: tuple[Arg, ...], batch: int, m: int, n: int, k: int, what: str, **options: Any) -> Call:
    """One ``md_bmm`` call (``options``: ``trans_b``, ``alpha``) that splits across the worker
    pool by batch items.

    Example:
        >>> call = bmm_call((Arg("in", 0), Arg("in", 1), Arg("out", 0)), 12, 128, 128, 64, "scores")
        >>> [dims[-2:] for dims in call.tasks(2)]
        [(0, 2), (1, 2)]
    """
    def tasks(count: int) -> list[tuple[int, ...]] | None:
        if count < 2 or batch < count or batch * m * n * k < PARALLEL_FLOPS:
            return None
        return [bmm_dims(batch, m, n, k, **options, task=t, tasks=count) for t in range(count)]

    return Call(native_function("md_bmm"), args, bmm_dims(batch, m, n, k, **options), what, tasks)


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


def kernel_lowering(kernel: Any, inputs: Sequence[int], outputs: Sequence[int]) -> Lowering:
    """A generated kernel reading the step inputs at positions ``inputs`` and writing the
    step outputs at ``outputs``."""

    def lower(in_shapes: Sequence[Shape | None], out_shapes: Sequence[Shape],
              symbols: Mapping[str, int]) -> NativeStep | str:
        shapes = [in_shapes[i] for i in inputs]
        if any(s is None for s in shapes):
            return "an input of the kernel is absent"
        outs = [out_shapes[o] for o in outputs]
        dims = kernel.dims_for(shapes, outs)
        args = (*(Arg("in", i) for i in inputs), *(Arg("addr", p) for p in kernel.constant_pointers),
                *(Arg("out", o) for o in outputs))
        return NativeStep((Call(kernel.address, args, tuple(dims), kernel.name, kernel_tasks(kernel, shapes, outs)),),
                          (), (kernel,))

    return lower


__all__ = ["ALIAS", "OWN_PRODUCTS", "Arg", "Call", "Lowering", "NULL", "NativeStep", "attention_lowering",
           "attention_products", "bmm_call",
           "gemm_lowering", "kernel_lowering", "kernel_tasks", "matmul_lowering", "measured_choice", "needing",
           "binding_threads", "known_choice", "needs", "sequence", "softmax_rows_call", "sgemm_call", "sgemm_dims",
           "timed_call", "transposed_once"]
