"""Winograd convolutions on x86: a 3x3 stride-1 conv as F(2x2, 3x3) or F(4x4, 3x3) (the
transforms: :mod:`metadef.codegen.native_winograd`), chosen against im2col by measurement per
shape (:func:`winograd_choice`), in three phases per image: the input transform split over
the channels, the ``a²`` products (our kernels as one pool group, or a batched sgemm), the
output transform split over the output channels (:func:`winograd_step`). Where the transformed
weights outweigh an image's tiles, the images of a batch share each product
(:func:`winograd_group`). A conv whose channels fill whole vectors runs on pixel rows instead
(:func:`winograd_rows_step`): the transforms go a vector of channels at a time and lay V and M
out as the products' rows, so no plane is transposed before its product; between pixel-major
values (a ResNet stage's pointwise convs on pixel rows: its :class:`.native.PixelRows` form) it
reads and writes them in place, between planes it transposes its input and output
(:data:`ROWS_BETWEEN_PLANES`). ResNet-50, one core: the transforms and transposes of a 14x14
conv 0.13-0.16 -> 0.03-0.04 ms; a 56x56 conv 0.72 -> 0.51 ms with its transposes.

Example:
    >>> winograd_weights(np.ones((2, 3, 3, 3), np.float32)).shape
    (16, 2, 3)
    >>> winograd_weights(np.ones((2, 3, 3, 3), np.float32), m=4).shape
    (36, 2, 3)
"""

from __future__ import annotations

import dataclasses
import math
import os
import struct
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from metadef.backends.x86 import contractions as blas
from metadef.backends.x86.conv1x1 import BLAS, OWN_T, WeightProduct, pack_back_to_back
from metadef.backends.x86.native import (
    NULL,
    PARALLEL_ELEMENTS,
    Arg,
    Call,
    NativeStep,
    PixelRows,
    Shape,
    _blas,
    known_choice,
    measured_choice,
    pixel_stride,
    sgemm_call,
    sgemm_dims,
    timed_call,
    transpose_call,
)
from metadef.codegen.native import IM2COL_DIMS, native_function
from metadef.codegen.native_gemm import (
    gemm_lda,
)
from metadef.codegen.native_tile import tile_lanes
from metadef.codegen.native_winograd import (
    WINOGRAD_SIZES,
    WINOGRAD_SKEW,
    WinogradPlan,
    phase_routine,
    winograd_fits,
    winograd_matrices,
    winograd_plan,
    winograd_workspace,
)
from metadef.codegen.native_winograd_rows import WINOGRAD_ROWS_DIMS, WINOGRAD_ROWS_ROUTINES, rows_routine
from metadef.core.errors import BackendError
from metadef.format import release_mapped


def winograd_weights(w: np.ndarray, m: int = 2) -> np.ndarray:
    """``U = G g Gᵀ`` of F(m x m, 3x3) for each 3x3 filter of ``w [K, C, 3, 3]``, laid out
    ``[a², K, C]`` (``a = m + 2``).

    Example:
        >>> winograd_weights(np.ones((2, 3, 3, 3), np.float32))[:, 0, 0].reshape(4, 4)[0].tolist()
        [1.0, 1.5, 0.5, 1.0]
    """
    k, c = w.shape[:2]
    g = np.array(winograd_matrices(m)[1])
    # U[a*A+b, k, c] = sum_ij G[a,i] G[b,j] g[k,c,i,j]: one float32 product with kron(G, G)
    # (sgemm: a float64 one, or the weights cast, took ResNet-50's first run 0.34 s), written
    # straight in its final layout (no transposed copies of the weights)
    both = np.kron(g, g).astype(np.float32)  # [a², 9]
    filters = np.ascontiguousarray(w, np.float32).reshape(k * c, 9)
    u = np.matmul(both, filters.T).reshape(len(both), k, c)
    release_mapped(w)  # a weight mapped from a .mdef file: its pages leave the RSS
    return u


class WinogradWeights:
    """A conv's Winograd weights and the products of each tile size, made on first use; once
    the products are packed for our kernels, :meth:`drop` lets the transformed weights go
    (ResNet-50's: 90 MB), and the next :meth:`of` makes them again (a few ms)."""

    def __init__(self, weight: np.ndarray) -> None:
        self.weight = weight
        self.u: dict[int, np.ndarray] = {}
        self.products: dict[int, list[WeightProduct]] = {}
        self.lock = threading.Lock()
        """Held while a binding makes, packs and drops the weights (:func:`winograd_step`)."""

    def of(self, m: int) -> tuple[np.ndarray, list[WeightProduct]]:
        if m not in self.u:
            self.u[m] = u = winograd_weights(np.asarray(self.weight, np.float32), m)
            if m not in self.products:
                self.products[m] = [WeightProduct(u[t], None, NULL, False, (-math.inf, math.inf))
                                    for t in range(len(u))]
            for t, product in enumerate(self.products[m]):
                product.weight = u[t]
        return self.u[m], self.products[m]

    def drop(self, m: int) -> None:
        """Let the transformed weights of ``m`` go (the products' packed copies are kept)."""
        for product in self.products.get(m, ()):
            product.drop_weights()
        self.u.pop(m, None)



WINOGRAD_ROUTINES = (*(phase_routine(m, phase) for m in WINOGRAD_SIZES for phase in ("in", "out")),
                     *WINOGRAD_ROWS_ROUTINES)


def winograd_possible(attrs: Mapping[str, Any], weight: np.ndarray | None) -> bool:
    """Whether a conv may take Winograd at some input size: ungrouped, 3x3, stride and dilation
    1 (its routines are compiled only then: ~0.6 s of LLVM that MobileNetV2 has no use for).

    Example:
        >>> winograd_possible({}, np.zeros((8, 8, 3, 3), np.float32))
        True
        >>> winograd_possible({"strides": [2, 2]}, np.zeros((8, 8, 3, 3), np.float32))
        False
    """
    strides, dilations = attrs.get("strides") or [1, 1], attrs.get("dilations") or [1, 1]
    return weight is not None and np.ndim(weight) == 4 and tuple(weight.shape[2:]) == (3, 3) \
        and int(attrs.get("group") or 1) == 1 and list(strides) == [1, 1] and list(dilations) == [1, 1]



def bound_bits(bounds: tuple[float, float]) -> tuple[int, int]:
    return tuple(struct.unpack("<I", struct.pack("<f", v))[0] for v in bounds)  # type: ignore[return-value]


PIXEL_ROWS = True
"""False: Winograd convs offer no pixel-rows form and take planes (for A/B runs)."""

ROWS_BETWEEN_PLANES = True
"""Between NCHW values too, a Winograd conv whose channels fill whole vectors transposes its
input into pixel rows, runs the pixel-rows routines and transposes its output back, rather than
take the planes' routines (False: the planes'). ResNet-50's 56x56 and 28x28 stages, one core,
in the model: a conv 0.72 -> 0.51 ms and 0.58 -> 0.45 (the planes' transforms 0.18-0.29 ms, the
pixel rows' with both transposes 0.08-0.18, and ``md_gemm`` on the tiles' rows 0.33 against
``md_conv1x1``'s 0.43 at 56x56); the whole model (``bench/x86_ab.py --control``, Zen 5): 0.981
of the time at one thread, 0.977 at two, 0.990 capped at AVX2, 0.974 at batch 8."""

WINOGRAD_SPLIT = 1 << 18
"""A Winograd product splits across threads from this many multiply-adds (a quarter of other
products' threshold): F(4x4) makes 36 small products a conv, ResNet-50's 56x56 layers 64 x 64
by 64 x 196 each (0.8 M, ~8 us); on one thread each, they took 2.3-2.6 ms of its 45 on two
threads, split 1.8."""

WINOGRAD_CHOICES = {"im2col": 0, "winograd": 2, "winograd4": 4}
"""The candidates :func:`winograd_choice` races and the output tile each means (0: im2col)."""


def winograd_limit() -> int:
    """The largest Winograd output tile a conv may take: ``METADEF_WINOGRAD`` (4, the default;
    2: F(2x2) only, whose rounding error is the direct conv's; 0: no Winograd).

    Example:
        >>> winograd_limit() in (0, 2, 4)
        True
    """
    text = os.environ.get("METADEF_WINOGRAD", "4").strip()
    if text not in ("0", "2", "4"):
        raise BackendError(f"METADEF_WINOGRAD={text!r}: give 0 (no Winograd), 2 (F(2x2) only) or 4 (the default)")
    return int(text)


def winograd_choice(sx: Shape, sw: Shape, out_hw: tuple[int, int], begin: list[int], has_bias: bool
                    ) -> tuple[int, str]:
    """``m`` of the Winograd F(m x m, 3x3) that measures fastest for a 3x3 stride-1 conv on
    these shapes, or 0 where im2col + sgemm does (timed on one image of ones, once per shape),
    and the timings. Each Winograd candidate runs its input transform, its ``a²`` products the
    way its products would run (:func:`_product_timer`: our kernels or sgemm, whichever its
    :class:`WeightProduct` takes on this many tiles) and its output transform. F(4x4) has 4x
    fewer multiplications than the direct conv, against F(2x2)'s 2.25x, but 2.25x more weights
    to read and fewer, wider tiles (ResNet-50's 14x14 and 7x7 images make 16 and 4)."""
    _, c, h, w = sx
    k = sw[0]
    oh, ow = out_hw
    one = (1, c, h, w, k, oh, ow, begin[0], begin[1], int(has_bias), *bound_bits((-math.inf, math.inf)))
    key = ("conv2d 3x3 per image", *one[1:10])
    names = [name for name, m in WINOGRAD_CHOICES.items() if not m or (m <= winograd_limit() and winograd_fits(m, ow))]
    if names == ["im2col"]:
        return 0, "METADEF_WINOGRAD=0"
    known = known_choice(key, names)
    if known is not None:
        return WINOGRAD_CHOICES[known], "stored"
    x = np.ones((1, *sx[1:]), np.float32)
    y = np.empty((1, k, oh, ow), np.float32)
    wt = np.ones(sw, np.float32)
    b = np.zeros(k, np.float32)
    plans = {m: winograd_plan(c, k, oh, ow, m) for m in WINOGRAD_SIZES}
    work = np.ones(max(max(4 * p.floats for p in plans.values()), c * 9 * oh * ow * 4) // 4 + 1, np.float32)
    values = im2col_values(sx, (3, 3), (1, 1), (1, 1), begin, (oh, ow))
    cols_dims = tuple(values[d] for d in IM2COL_DIMS)
    im2col = timed_call(native_function("md_im2col_task"), [x.ctypes.data, work.ctypes.data], cols_dims)
    product = timed_call(native_function("md_sgemm"), [wt.ctypes.data, work.ctypes.data, y.ctypes.data,
                                                       blas.cblas_address("sgemm"), b.ctypes.data, 0],
                         sgemm_dims(1, k, oh * ow, c * 9, bias=(1, 0)))
    candidates: dict[str, Callable[[], Any]] = {"im2col": lambda: (im2col(), product())}
    for name in names:
        m = WINOGRAD_CHOICES[name]
        if m:
            plan = plans[m]
            phases = (timed_call(native_function(phase_routine(m, "in")), [x.ctypes.data, work.ctypes.data],
                                 (*one, 0, 0, 1)),
                      _product_timer(c, k, plan.tiles, (m + 2) ** 2),
                      timed_call(native_function(phase_routine(m, "out")), [work.ctypes.data, y.ctypes.data,
                                                                           b.ctypes.data], (*one, 0, 0, 1)))
            candidates[name] = lambda phases=phases: [phase() for phase in phases]
    winner, timings = measured_choice(key, candidates)
    return WINOGRAD_CHOICES[winner], timings


def _product_timer(c: int, k: int, tiles: int, count: int) -> Callable[[], None]:
    """``count`` products ``[k, c] x [c, tiles]`` the way a Winograd conv's products run (the
    kind :meth:`WeightProduct.choice` takes, timed as it times it), on arrays of ones."""
    product = WeightProduct(np.ones((k, c), np.float32), None, NULL, False, (-math.inf, math.inf))
    kind = product.choice(tiles, fresh=True)
    candidates, arrays = product.timers(tiles, kinds=(kind, BLAS))
    once = candidates.get(kind, candidates[BLAS])  # (a kind forced from outside may not run here)

    def run(arrays: tuple[Any, ...] = arrays) -> None:  # (the arrays live as long as the timer)
        for _ in range(count):
            once()
    return run


def im2col_values(sx: Shape, kernel: tuple[int, ...], strides: Sequence[int], dilations: Sequence[int],
                   begin: Sequence[int], out_hw: tuple[int, int]) -> dict[str, int]:
    """The dims of one image's ``md_im2col_task`` by name (all its output rows, one task)."""
    _, c, h, w = sx
    return {"c": c, "h": h, "w": w, "oh": out_hw[0], "ow": out_hw[1], "kh": kernel[0], "kw": kernel[1],
            "sh": strides[0], "sw": strides[1], "dh": dilations[0], "dw": dilations[1],
            "pt": begin[0], "pl": begin[1], "y0": 0, "task": 0, "tasks": 1}



def winograd_step(sx: Shape, sw: Shape, out_hw: tuple[int, int], begin: list[int], has_bias: bool,
                  sources: Sequence[Arg], bias: Arg, out: Arg, weights: WinogradWeights,
                  bounds: tuple[float, float] = (-math.inf, math.inf)) -> NativeStep | None:
    """The Winograd step when F(2x2) or F(4x4) measures faster than im2col + sgemm on these
    shapes (:func:`winograd_choice`), else None: per image, the input transform split over the
    channels, the ``a²`` products (``U_t V_t``: the transformed weights times the transformed
    input) as one batched sgemm split over them, or as ``a²`` calls of our kernels where they
    measure faster (``weights``: the transformed weights and their :class:`WeightProduct` s,
    made once), the output transform split over the output channels (``bounds``: a fused Relu
    or Clip, applied as it stores)."""
    m, timings = winograd_choice(sx, sw, out_hw, begin, has_bias)
    if not m:
        return None
    if not winograd_fits(m, out_hw[1]) or m > winograd_limit():  # (a choice forced from outside)
        m = 2
    x = sources[0]
    if not (PIXEL_ROWS and x.kind == "in" and out.kind == "out" and not x.offset and not out.offset
            and sx[1] % tile_lanes() == 0 and sw[0] % tile_lanes() == 0):
        with weights.lock:  # (programs may be bound in several threads at once: weights made, packed, dropped)
            return _winograd_calls(sx, sw, out_hw, begin, has_bias, sources, bias, out, weights, bounds, m, timings)
    what = f"conv2d winograd F({m}x{m},3x3) on pixel rows"

    def rows(reads: bool, writes: bool) -> NativeStep:
        with weights.lock:
            return winograd_rows_step(sx, sw[0], out_hw, begin, x, bias, out, weights, bounds, m, what, reads, writes)

    if ROWS_BETWEEN_PLANES:
        base = rows(False, False)
    else:
        with weights.lock:
            base = _winograd_calls(sx, sw, out_hw, begin, has_bias, sources, bias, out, weights, bounds, m, timings)

    def lower(args: frozenset[tuple[str, int]]) -> NativeStep:
        reads, writes = ("in", x.index) in args, ("out", out.index) in args
        return rows(reads, writes) if reads or writes else base

    return dataclasses.replace(base, rows=PixelRows((x.index,), None, out.index, lower, _rows_cost(x.index, out.index)))


def _rows_cost(x: int, out: int) -> Callable[[frozenset[tuple[str, int]]], int]:
    """The cost of a Winograd conv's pixel-rows form in transposes: none with its input and
    output both pixel-major, one otherwise. (Counting each NCHW side, the transposes
    :data:`ROWS_BETWEEN_PLANES` makes, drew ResNet's 56x56 pointwise convs onto pixel rows with
    their residuals transposed into the workspace, 9.6 MB at batch 3: an arena 1.11x the lower
    bound in most bindings.)"""
    return lambda args: int(not (("in", x) in args and ("out", out) in args))


def winograd_rows_step(sx: Shape, k: int, out_hw: tuple[int, int], begin: Sequence[int], x: Arg, bias: Arg,
                       out: Arg, weights: WinogradWeights, bounds: tuple[float, float], m: int, what: str,
                       reads: bool = True, writes: bool = True) -> NativeStep:
    """A Winograd conv between pixel-major values (:mod:`.native_winograd_rows`), ``weights``'
    lock held: per group of images, the input transform into V's rows, the ``a²`` products on
    them (``md_gemm``, V read and M stored in place, one pool group), the output transform
    (+ bias, ``bounds``); the input transposed into pixel rows first where it is NCHW
    (``reads`` False), the output back into planes after where it is (``writes`` False)."""
    per_product = weights.products.get(m, [])
    if not per_product or not all(product.is_packed(OWN_T) for product in per_product):
        _, per_product = weights.of(m)  # (made again only to pack them: the planes' way took another kind)
    pack_back_to_back(per_product, OWN_T)
    n, c, h, w = sx
    oh, ow = out_hw
    a, group = m + 2, winograd_group(n, c, k, oh, ow, m)
    tiles = -(-oh // m) * -(-ow // m)
    ldx, ldy = pixel_stride(c), pixel_stride(k)
    v_plane, m_plane = group * tiles * ldx + WINOGRAD_SKEW, group * tiles * ldy + WINOGRAD_SKEW
    zeros = np.zeros(k, np.float32)
    bias = bias if bias is not NULL else Arg("addr", zeros.ctypes.data)
    work, used = Arg("scratch", 0), 4 * a * a * (v_plane + m_plane)
    v, mm = work, work.at(4 * a * a * v_plane)
    # an NCHW side passes through the workspace a group of images at a time, as pixel rows: the
    # input where M will be (read before the products write M), the output where V was (written
    # after the products read V), else past both
    rows_in, rows_out = mm, v
    if 4 * group * h * w * ldx > 4 * a * a * m_plane:
        rows_in, used = work.at(used), used + 4 * group * h * w * ldx
    if 4 * group * oh * ow * ldy > 4 * a * a * v_plane:
        rows_out, used = work.at(used), used + 4 * group * oh * ow * ldy
    calls: list[Call] = []
    for first in range(0, n, group):
        images = min(group, n - first)
        values = {"n": images, "c": c, "h": h, "w": w, "k": k, "oh": oh, "ow": ow, "pt": begin[0], "pl": begin[1],
                  "ldx": ldx, "ldv": ldx, "v_plane": v_plane, "ldm": ldy, "m_plane": m_plane, "ldy": ldy,
                  "lo": bound_bits(bounds)[0], "hi": bound_bits(bounds)[1], "task": 0, "tasks": 1}
        source = x.at(4 * first * h * w * ldx) if reads else rows_in
        if not reads:
            calls.append(transpose_call(x.at(4 * first * c * h * w), rows_in, images, c, h * w,
                                        what + " input transpose", ld=ldx))
        calls.append(_rows_phase(m, "in", (source, v), values, images * tiles, images * tiles * c * a * a,
                                 what + " input"))
        for t, product in enumerate(per_product):
            more, per = product.calls(OWN_T, 1, images * tiles, v.at(4 * t * v_plane), None, mm.at(4 * t * m_plane),
                                      Arg("scratch", 1), what + " product", split_from=WINOGRAD_SPLIT,
                                      rows=("x", "out"))
            assert per == 0 and len(more) == 1, (per, more)
            calls.append(dataclasses.replace(more[0], joins=t > 0))
        target = out.at(4 * first * oh * ow * ldy) if writes else rows_out
        calls.append(_rows_phase(m, "out", (mm, target, bias), values, images * tiles, images * tiles * k * m * m,
                                 what + " output"))
        if not writes:
            calls.append(transpose_call(rows_out, out.at(4 * first * k * oh * ow), images, oh * ow, k,
                                        what + " output transpose", xs=ldy))
    keep = (*(a for product in per_product for a in product.packed(OWN_T)), zeros)
    weights.drop(m)
    return NativeStep(tuple(calls), (used,), keep)


def _rows_phase(m: int, phase: str, args: tuple[Arg, ...], values: dict[str, int], units: int, elements: int,
                what: str) -> Call:
    """One phase's call over all its tiles, split among the threads by tiles where it pays."""
    def tasks(count: int) -> list[tuple[int, ...]] | None:
        if count < 2 or units < count or elements < PARALLEL_ELEMENTS:
            return None
        return [tuple({**values, "task": t, "tasks": count}[d] for d in WINOGRAD_ROWS_DIMS) for t in range(count)]

    return Call(native_function(rows_routine(m, phase)), args, tuple(values[d] for d in WINOGRAD_ROWS_DIMS), what,
                tasks)


def _winograd_calls(sx: Shape, sw: Shape, out_hw: tuple[int, int], begin: list[int], has_bias: bool,
                    sources: Sequence[Arg], bias: Arg, out: Arg, weights: WinogradWeights,
                    bounds: tuple[float, float], m: int, timings: str) -> NativeStep:
    """:func:`winograd_step`'s calls for F(m x m), ``weights``' lock held."""
    u, per_product = weights.of(m)
    n, c, h, w = sx
    k = sw[0]
    oh, ow = out_hw
    group = winograd_group(n, c, k, oh, ow, m)
    plan = winograd_plan(c, k, oh, ow, m, group)
    tiles, wino_work, m_offset = plan.tiles, 4 * plan.floats, 4 * plan.m_offset
    products = {"strides": (k * c, plan.v_stride, plan.m_stride)}
    scratch = Arg("scratch", 0)
    what = f"conv2d winograd F({m}x{m},3x3) (measured: {timings})"
    kind = per_product[0].choice(group * tiles, fresh=True)
    calls: list[Call] = []
    work = 0
    one = (group, c, h, w, k, oh, ow, begin[0], begin[1], int(has_bias), *bound_bits(bounds))

    def split(extent: int, image: int) -> Callable[[int], list[tuple[int, ...]] | None]:
        def tasks(count: int) -> list[tuple[int, ...]] | None:
            if count < 2 or extent < count:
                return None
            return [(*one, image, t, count) for t in range(count)]
        return tasks

    for first in range(0, n, group):
        images = min(group, n - first)  # (the last group may be smaller: its planes keep the stride)
        for j in range(images):
            i = first + j
            calls.append(Call(native_function(phase_routine(m, "in")), (sources[0].at(4 * i * c * h * w), scratch),
                              (*one, j, 0, 1), what + " input", split(c, j)))
        if kind == BLAS:
            calls.append(sgemm_call((Arg("addr", u.ctypes.data), scratch, scratch.at(m_offset), *_blas(), NULL,
                                     *_blas("sgemv")), len(u), k, group * tiles, c, what + " products", **products))
        if kind != BLAS:
            pack_back_to_back(per_product, kind)
            more, work = _joined_products(per_product, kind, group * tiles, scratch, plan)
            calls += more
        for j in range(images):
            i = first + j
            calls.append(Call(native_function(phase_routine(m, "out")), (scratch, out.at(4 * i * k * oh * ow), bias),
                              (*one, j, 0, 1), what + " output", split(k, j)))
    if kind == BLAS:
        keep: tuple[Any, ...] = (u,)
    else:  # (the calls read the packed weights: the transformed ones can go)
        keep = tuple(a for product in per_product for a in product.keep())
        weights.drop(m)
    return NativeStep(tuple(calls), (wino_work, *((work,) if work else ())), keep)


def _joined_products(per_product: list[WeightProduct], kind: str, p: int, scratch: Arg,
                     plan: WinogradPlan) -> tuple[list[Call], int]:
    """The ``a²`` products ``M_t = U_t V_t`` of a Winograd conv through our kernels, as one
    group of the worker pool (they are independent: one barrier, not ``a²``; their tasks are
    shared out together), and the bytes of workspace they need. With the pixels as rows, each
    product's ``V_t`` is first transposed into a workspace of its own, the transposes one group
    before the products."""
    m_offset, flips, products = 4 * plan.m_offset, [], []
    work = 4 * gemm_lda(per_product[0].depth) * p if kind == OWN_T else 0  # (what each transpose fills)
    for t, product in enumerate(per_product):
        more, per = product.calls(kind, 1, p, scratch.at(4 * t * plan.v_stride), None,
                                  scratch.at(m_offset + 4 * t * plan.m_stride), Arg("scratch", 1).at(t * work),
                                  "conv2d winograd product", split_from=WINOGRAD_SPLIT)
        assert per == work, (per, work)
        *flip, last = more
        flips += [dataclasses.replace(c, joins=bool(flips)) for c in flip]
        products.append(dataclasses.replace(last, joins=bool(products)))
    return flips + products, work * len(per_product)


WINOGRAD_GROUP_BYTES = 16 << 20
"""The most workspace a group of images sharing Winograd's products may take."""


def winograd_group(n: int, c: int, k: int, oh: int, ow: int, m: int) -> int:
    """How many of ``n`` images share each Winograd product (their tiles side by side): one,
    unless the transformed weights (``a² K C`` floats) outweigh an image's transformed input
    (``a² C tiles``), i.e. ``K > tiles``; then as many as fit :data:`WINOGRAD_GROUP_BYTES`, so
    the weights are read once a group rather than once an image (ResNet-50's 14x14 and 7x7
    layers: 9.4 and 16.8 MB of them, read 8 times a batch of 8).

    Example:
        >>> winograd_group(8, 512, 512, 7, 7, 2), winograd_group(8, 64, 64, 56, 56, 4)
        (8, 1)
    """
    tiles = winograd_plan(c, k, oh, ow, m).tiles
    if n < 2 or k <= tiles:
        return 1
    group = n
    while group > 1 and 4 * winograd_workspace(c, k, oh, ow, m, group) > WINOGRAD_GROUP_BYTES:
        group -= 1
    return group


__all__ = ["WINOGRAD_CHOICES", "WINOGRAD_ROUTINES", "WinogradWeights", "bound_bits", "im2col_values", "winograd_choice",
           "winograd_group", "winograd_limit", "winograd_possible", "winograd_step", "winograd_weights"]
