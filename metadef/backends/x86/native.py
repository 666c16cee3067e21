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
from metadef.codegen.native_gemm import gemm_lda, transpose_dims

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
    rows: PixelRows | None = field(default=None, repr=False, compare=False)
    """How the step would read and write its values pixel-major (None: only as they are)."""


@dataclass(frozen=True)
class PixelRows:
    """A step that computes with the pixels of 4-D float32 values as its tile's rows (a
    pointwise conv through ``md_conv1x1t`` or ``md_gemm``; a depthwise conv through
    ``md_depthwise_rows``), and so could read or write them *pixel-major*:
    ``[n, h*w, ld]``, each pixel's ``c`` channels a row :func:`pixel_stride` floats long,
    instead of NCHW. The program stores a value pixel-major where its producer and every
    consumer agree (:func:`metadef.backends.x86.layouts.agree`): no transpose between two such
    convs, and the producer's stores go row by row.

    ``reads``: the step inputs it reads as pixel rows (in place when pixel-major);
    ``residual``: the step input it adds to its output (pixel-major allowed: with an NCHW
    output it is transposed back first); ``writes``: the step output it can store pixel-major
    (only when its residual, if any, is pixel-major too); ``lower(args)``: the step with the
    args in ``args`` (``("in", i)`` / ``("out", j)``) pixel-major.

    Example:
        >>> rows = PixelRows(reads=(0,), residual=1, writes=0, lower=lambda args: NativeStep(()))
        >>> rows.lower(frozenset({("in", 0)})).calls
        ()
    """

    reads: tuple[int, ...]
    residual: int | None
    writes: int | None
    lower: Callable[[frozenset[tuple[str, int]]], NativeStep] = field(repr=False, compare=False)
    cost: Callable[[frozenset[tuple[str, int]]], int] | None = field(default=None, repr=False, compare=False)
    """What the step costs with ``args`` pixel-major, in transposes (None: a transpose for each
    read that is not, and one for a residual in the other layout than the output): a step that
    runs as well in either layout counts one where its input and output differ, a pointwise
    conv whose product on pixel rows outruns its kernel on NCHW counts NCHW as one."""


def pixel_stride(channels: int) -> int:
    """The floats from one pixel's channels to the next in a pixel-major value (and in the
    transposed copies pointwise convs make): the channels, one cache line more where rows a
    multiple of 4 KB apart would all fall in one set of the L1 cache.

    Example:
        >>> pixel_stride(256), pixel_stride(1024)
        (256, 1040)
    """
    return gemm_lda(channels)


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


def transpose_call(source: Arg, target: Arg, n: int, rows: int, cols: int, what: str, *, ld: int | None = None,
                   xs: int | None = None) -> Call:
    """One ``md_transpose`` call (``n`` items of ``[rows, cols]`` into ``[cols, rows]``, rows
    ``xs`` and ``ld`` floats apart as :func:`.native_gemm.transpose_dims` says) that splits
    across the worker pool by 8-column blocks where it pays.

    Example:
        >>> call = transpose_call(Arg("in", 0), Arg("out", 0), 1, 512, 196, "t")
        >>> call.dims[:3], [dims[3:5] for dims in call.tasks(2)]
        ((1, 512, 196), [(0, 2), (1, 2)])
    """
    def tasks(count: int) -> list[tuple[int, ...]] | None:
        if count < 2 or n * rows * cols < PARALLEL_ELEMENTS or n * -(-cols // 8) < count:
            return None
        return [transpose_dims(n, rows, cols, t, count, ld, xs) for t in range(count)]

    return Call(native_function("md_transpose"), (source, target), transpose_dims(n, rows, cols, ld=ld, xs=xs),
                what, tasks)


def bmm_call(args: tuple[Arg, ...], batch: int, m: int, n: int, k: int, what: str, **options: Any) -> Call:
    """One ``md_bmm`` call (``options``: ``trans_b``, ``alpha``) that splits across the worker
    pool by batch items.

    Example:
        >>> call = bmm_call((Arg("in", 0), Arg("in", 1), Arg("out", 0)), 12, 128, 128, 64, "scores")
        >>> [dims[9:11] for dims in call.tasks(2)]
        [(0, 2), (1, 2)]
    """
    def tasks(count: int) -> list[tuple[int, ...]] | None:
        if count < 2 or batch < count or batch * m * n * k < PARALLEL_FLOPS:
            return None
        return [bmm_dims(batch, m, n, k, **options, task=t, tasks=count) for t in range(count)]

    return Call(native_function("md_bmm"), args, bmm_dims(batch, m, n, k, **options), what, tasks)


def matmul_lowering(a: Arg, b: Arg, out: Arg, dtype: np.dtype) -> Lowering:
    """``A @ B`` as one sgemm when B is a matrix (A's batch axes fold into M); with the same
    batch axes on both, as our ``md_bmm`` or one sgemm per batch item, whichever
    :func:`batched_products` measured faster; other broadcasts run from Python."""

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
            batch = math.prod(sa[:-2])
            if dtype == np.float32 and batched_products(batch, m, n, k) == OWN_PRODUCTS:
                return NativeStep((bmm_call((a, b, out), batch, m, n, k, "batched products (md_bmm)"),))
            return NativeStep((sgemm_call(args, batch, m, n, k, "sgemm", strides=(m * k, k * n, m * n)),))
        return f"MatMul batch axes {list(sa[:-2])} and {list(sb[:-2])} differ"

    return needing(lower, "md_sgemm", "md_bmm")


OWN_PRODUCTS = "own micro-kernel (md_bmm)"
"""The name of ``md_bmm`` among the candidates of a batched product's measured choice."""


def batched_products(batch: int, m: int, n: int, k: int) -> str:
    """:data:`OWN_PRODUCTS` or ``"sgemm"`` for ``batch`` products ``[m, k] @ [k, n]`` of two
    activations (a transformer's ``Q Kᵀ`` or ``P V`` outside a recognized attention, a quantized
    one's exact sums): measured once per shape (:func:`measured_choice`) where an item's packed
    ``b`` fits ``md_bmm``'s stack buffer, else OpenBLAS. (QOperator BERT's ``Q Kᵀ``, 12 heads
    of 128 x 64 @ 64 x 128: sgemm 0.31 ms a layer, md_bmm 0.25.)"""
    if bmm_packed_floats(n, k) > BMM_STACK_FLOATS:
        return "sgemm"
    key = ("batched products", batch, m, n, k)
    known = known_choice(key, (OWN_PRODUCTS, "sgemm"))
    if known is not None:
        return known
    a, b, y = (np.ones((batch, rows, cols), np.float32) for rows, cols in ((m, k), (k, n), (m, n)))
    own = timed_call(native_function("md_bmm"), [a.ctypes.data, b.ctypes.data, y.ctypes.data],
                     bmm_dims(batch, m, n, k))
    library = timed_call(native_function("md_sgemm"), [a.ctypes.data, b.ctypes.data, y.ctypes.data,
                                                       blas.cblas_address("sgemm"), 0, blas.cblas_address("sgemv")],
                         sgemm_dims(batch, m, n, k, strides=(m * k, k * n, m * n)))
    return measured_choice(key, {OWN_PRODUCTS: own, "sgemm": library})[0]


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


def measured_choice(key: tuple[Any, ...], candidates: Mapping[str, Callable[[], None]],
                    handicaps: Mapping[str, float] | None = None) -> tuple[str, str]:
    """The fastest of ``candidates`` (name -> one run on the shapes ``key`` names), timed once
    (:func:`race`, after a warm-up) and remembered in this process and in the compile cache's
    shape level, so a new process on this machine does not time it again: ``(name, the
    timings as text)``. ``handicaps``: factors a candidate's time is multiplied by before the
    comparison (one that is known to lose in a model what it ties in a race, its data in
    cache). The decision is logged under ``METADEF_DEBUG=1``. Choices are made one at a time
    (a lock): two kernels timed at once would slow each other."""
    with _CHOICE_LOCK:
        found = _known_choice(key, candidates)
        if found is None:
            found = remember_choice(key, candidates, race(candidates), handicaps)
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


def remember_choice(key: tuple[Any, ...], names: Collection[str], times: Mapping[str, float],
                    handicaps: Mapping[str, float] | None = None) -> tuple[str, str]:
    """The fastest of ``times`` (each multiplied by its handicap, if it has one) as the choice
    for ``key`` among ``names``, kept in this process and in the compile cache's shape level
    (what :func:`known_choice` finds later), and logged."""
    factor = handicaps or {}
    winner = min(times, key=lambda name: times[name] * factor.get(name, 1.0))
    text = ", ".join(f"{n} {1e3 * t:.2f} ms" + (f" (x{factor[n]:g} to win)" if n in factor else "")
                     for n, t in sorted(times.items(), key=lambda x: x[1]))
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


__all__ = ["ALIAS", "OWN_PRODUCTS", "Arg", "Call", "Lowering", "NULL", "NativeStep", "PixelRows", "batched_products",
           "binding_threads", "bmm_call", "gemm_lowering",
           "kernel_lowering", "kernel_tasks", "known_choice", "matmul_lowering", "measured_choice", "needing", "needs",
           "pixel_stride", "sequence", "sgemm_call", "sgemm_dims", "timed_call", "transpose_call", "transposed_once"]
