"""Convolutions lowered to native calls: im2col + split sgemm per image, Winograd F(2x2, 3x3)
or F(4x4, 3x3) in three split phases per image (whichever measures fastest), grouped convs through
``md_conv2d``, depthwise convs through a padded copy and a generated kernel (the 3x3 ones take
our own ``md_depthwise``, see :mod:`.conv1x1`).

Example:
    >>> winograd_weights(np.ones((2, 3, 3, 3), np.float32)).shape
    (16, 2, 3)
    >>> winograd_weights(np.ones((2, 3, 3, 3), np.float32), m=4).shape
    (36, 2, 3)
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from metadef.backends.x86 import contractions as blas
from metadef.backends.x86.conv1x1 import BLAS, OWN, OWN_C, OWN_T, PRODUCT_ROUTINES, WeightProduct
from metadef.backends.x86.native import (
    NULL,
    PARALLEL_ELEMENTS,
    Arg,
    Call,
    Lowering,
    NativeStep,
    Shape,
    _blas,
    _f32,
    binding_threads,
    kernel_tasks,
    known_choice,
    measured_choice,
    needing,
    needs,
    sequence,
    sgemm_call,
    sgemm_dims,
    timed_call,
)
from metadef.codegen.native import CONV2D_DIMS, IM2COL_DIMS, PAD2D_DIMS, native_function
from metadef.codegen.native_gemm import (
    conv1x1_dims,
    conv1x1_rows,
    conv1x1_width,
    conv1x1t_dims,
    gemm_lda,
    gemm_panel,
    transpose_dims,
)
from metadef.codegen.native_winograd import (
    WINOGRAD_SIZES,
    WinogradPlan,
    phase_routine,
    winograd_fits,
    winograd_matrices,
    winograd_plan,
    winograd_workspace,
)
from metadef.core.errors import BackendError
from metadef.format import release_mapped
from metadef.ops.defs.nn_pool import window


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


class _WinogradWeights:
    """A conv's Winograd weights and the products of each tile size, made on first use; once
    the products are packed for our kernels, :meth:`drop` lets the transformed weights go
    (ResNet-50's: 90 MB), and the next :meth:`of` makes them again (a few ms)."""

    def __init__(self, weight: np.ndarray) -> None:
        self.weight = weight
        self.u: dict[int, np.ndarray] = {}
        self.products: dict[int, list[WeightProduct]] = {}

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


def conv_lowering(attrs: Mapping[str, Any], sources: Sequence[Arg], out: Arg, dtype: np.dtype,
                  depthwise: Callable[..., Any] | None, weight: np.ndarray | None = None,
                  product: WeightProduct | None = None) -> Lowering:
    """A 2-D Conv: each image's im2col then a split sgemm (a 1x1 conv: one batched sgemm; a
    grouped conv: ``md_conv2d``) or, for a 3x3 stride-1 conv with constant
    weights, Winograd F(2x2,3x3) (``md_winograd_in``/``_out`` around a batched sgemm) when it
    measures faster on these shapes; for a depthwise
    conv ``md_pad2d`` and a generated window-sum kernel (``depthwise``: the node compiler).
    ``product``: the conv's constant weights, whose im2col products may take our kernels
    where they measure faster than sgemm (:func:`im2col_product`)."""
    group = int(attrs.get("group") or 1)
    winograd = _WinogradWeights(weight) if weight is not None else None

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape],
              symbols: Mapping[str, int]) -> NativeStep | str:
        sx, sw = inputs[0], inputs[1]
        why = _f32(sx is not None and sw is not None, [dtype])
        if why:
            return why
        assert sx is not None and sw is not None
        if len(sx) != 4:
            return f"a {len(sx) - 2}-D Conv (native: 2-D)"
        kernel = tuple(attrs.get("kernel_shape") or sw[2:])
        win = window(attrs, sx[2:], kernel)
        begin, end = [int(v) for v in win.begin], [int(v) for v in win.end]
        if min(*begin, *end) < 0:
            return "negative pads"
        n, c, h, w = sx
        k = sw[0]
        oh, ow = outputs[0][2:]
        has_bias = len(inputs) > 2 and inputs[2] is not None
        bias = sources[2] if has_bias else NULL
        if sw[1] == 1 and group > 1 and k == c and depthwise is not None:
            return _depthwise(sx, sw, win, begin, end, sources, bias, out, dtype, depthwise)
        taps = kernel[0] * kernel[1]
        if kernel == (3, 3) and tuple(win.strides) == (1, 1) and tuple(win.dilations) == (1, 1) and group == 1 \
                and weight is not None and weight.shape == tuple(sw) and min(c, k) >= 8:
            assert winograd is not None
            step = _winograd_or_im2col(sx, sw, (oh, ow), begin, has_bias, sources, bias, out, winograd)
            if step is not None:
                return step
        direct = taps == 1 and tuple(win.strides) == (1, 1) and not any(begin)
        workspace = 0 if direct else (c // group) * taps * oh * ow * 4
        if direct and group == 1:  # W [k, c] times each image's [c, h*w]: one batched sgemm
            return NativeStep((sgemm_call((sources[1], sources[0], out, *_blas(), bias, *_blas("sgemv")), n, k,
                                          h * w, c, "conv2d 1x1 sgemm", strides=(0, c * h * w, k * h * w),
                                          bias=(1, 0) if bias is not NULL else None),))
        if group == 1 and not direct and product is not None:
            step = im2col_product(product, sx, kernel, win, begin, (oh, ow), sources[0], None, out)
            if step is not None:
                return step
        if group == 1 and not direct and SPLIT_IM2COL:
            return _im2col_then_sgemm(sx, sw, kernel, win, begin, (oh, ow), sources, bias, out)
        values = {"n": n, "c": c, "h": h, "w": w, "k": k, "oh": oh, "ow": ow, "kh": kernel[0], "kw": kernel[1],
                  "sh": win.strides[0], "sw": win.strides[1], "dh": win.dilations[0], "dw": win.dilations[1],
                  "pt": begin[0], "pl": begin[1], "group": group, "has_bias": int(has_bias)}
        args = (sources[0], sources[1], out, Arg("scratch", 0) if workspace else NULL,
                *_blas(), bias)
        call = Call(native_function("md_conv2d"), args, tuple(values[d] for d in CONV2D_DIMS),
                    "conv2d " + ("1x1 sgemm" if direct else "im2col + sgemm"))
        return NativeStep((call,), (workspace,) if workspace else ())

    routines = ["md_im2col_task", "md_sgemm", *(PRODUCT_ROUTINES if product is not None else ())]
    if group > 1:  # a depthwise conv (one input channel per output channel) pads; others: md_conv2d
        depthwise_only = weight is not None and weight.shape[1] == 1 and weight.shape[0] == group
        routines += ["md_pad2d"] if depthwise_only else ["md_pad2d", "md_conv2d"]
    elif winograd_possible(attrs, weight):
        routines += [*WINOGRAD_ROUTINES, *PRODUCT_ROUTINES]
    return needing(lower, *routines)


WINOGRAD_ROUTINES = tuple(phase_routine(m, phase) for m in WINOGRAD_SIZES for phase in ("in", "out"))


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


SPLIT_IM2COL = True
"""Each image's im2col runs as its own call, split over the channels across threads."""


def _im2col_then_sgemm(sx: Shape, sw: Shape, kernel: tuple[int, ...], win: Any, begin: list[int],
                       out_hw: tuple[int, int], sources: Sequence[Arg], bias: Arg, out: Arg) -> NativeStep:
    """Each image: its im2col as its own call, which splits over the channels across threads,
    then one sgemm (split over the pixels) with the bias broadcast along each output channel's
    row; one workspace serves every image in turn."""
    n, c, h, w = sx
    k = sw[0]
    taps, pixels = kernel[0] * kernel[1], out_hw[0] * out_hw[1]
    values = _im2col_values(sx, kernel, win.strides, win.dilations, begin, out_hw)
    tasks = functools.partial(_im2col_tasks, values, c, c * taps * pixels)
    cols = Arg("scratch", 0)
    calls = []
    for i in range(n):
        calls.append(Call(native_function("md_im2col_task"), (sources[0].at(4 * i * c * h * w), cols),
                          tuple(values[d] for d in IM2COL_DIMS), "conv2d im2col", tasks))
        calls.append(sgemm_call((sources[1], cols, out.at(4 * i * k * pixels), *_blas(), bias, *_blas("sgemv")), 1,
                                k, pixels, c * taps, "conv2d sgemm", bias=(1, 0) if bias is not NULL else None))
    return NativeStep(tuple(calls), (c * taps * pixels * 4,))


def _bound_bits(bounds: tuple[float, float]) -> tuple[int, int]:
    return tuple(struct.unpack("<I", struct.pack("<f", v))[0] for v in bounds)  # type: ignore[return-value]


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
    one = (1, c, h, w, k, oh, ow, begin[0], begin[1], int(has_bias), *_bound_bits((-math.inf, math.inf)))
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
    values = _im2col_values(sx, (3, 3), (1, 1), (1, 1), begin, (oh, ow))
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
    """``count`` products ``[k, c] x [c, tiles]`` the way a Winograd conv's products run
    (:meth:`WeightProduct.choice` on ones), on arrays of ones: for timing."""
    kind = WeightProduct(np.ones((k, c), np.float32), None, NULL, False, (-math.inf, math.inf)).choice(tiles)
    x, y = np.ones((c, tiles), np.float32), np.ones((k, tiles), np.float32)
    if kind == BLAS:
        u, xs, ys = (np.ones((count, *shape), np.float32) for shape in ((k, c), (c, tiles), (k, tiles)))
        arrays: tuple[np.ndarray, ...] = (u, xs, ys)
        calls = [timed_call(native_function("md_sgemm"), [u.ctypes.data, xs.ctypes.data, ys.ctypes.data,
                                                          blas.cblas_address("sgemm"), 0, blas.cblas_address("sgemv")],
                            sgemm_dims(count, k, tiles, c))]
    elif kind == OWN_T:
        ldx, panel = gemm_lda(c), gemm_panel()
        xt = np.ones((tiles, ldx), np.float32)
        panels = np.ones((-(-k // panel), c, panel), np.float32)
        bias = np.zeros(panels.shape[0] * panel, np.float32)
        arrays = (x, y, xt, panels, bias)
        calls = [timed_call(native_function("md_transpose"), [x.ctypes.data, xt.ctypes.data],
                            transpose_dims(1, c, tiles, ld=ldx)),
                 timed_call(native_function("md_conv1x1t"), [xt.ctypes.data, panels.ctypes.data, bias.ctypes.data, 0,
                                                             y.ctypes.data], conv1x1t_dims(1, c, k, tiles, ldx=ldx))
                 ] * count
    else:
        packed = np.ones((-(-k // conv1x1_rows()), c, conv1x1_rows()), np.float32)
        bias = np.zeros(k, np.float32)
        arrays = (x, y, packed, bias)
        calls = [timed_call(native_function("md_conv1x1"), [x.ctypes.data, packed.ctypes.data, bias.ctypes.data, 0,
                                                            y.ctypes.data],
                            conv1x1_dims(1, c, k, tiles, order=int(kind == OWN_C)))] * count

    def run(arrays: tuple[np.ndarray, ...] = arrays) -> None:  # (the arrays live as long as the timer)
        for call in calls:
            call()
    return run


def _im2col_values(sx: Shape, kernel: tuple[int, ...], strides: Sequence[int], dilations: Sequence[int],
                   begin: Sequence[int], out_hw: tuple[int, int]) -> dict[str, int]:
    """The dims of one image's ``md_im2col_task`` by name (all its output rows, one task)."""
    _, c, h, w = sx
    return {"c": c, "h": h, "w": w, "oh": out_hw[0], "ow": out_hw[1], "kh": kernel[0], "kw": kernel[1],
            "sh": strides[0], "sw": strides[1], "dh": dilations[0], "dw": dilations[1],
            "pt": begin[0], "pl": begin[1], "y0": 0, "task": 0, "tasks": 1}


def weight_product(attrs: Mapping[str, Any], weight: np.ndarray | None, consts: Sequence[np.ndarray | None],
                   bias: Arg, dtype: np.dtype, residual: bool = False,
                   bounds: tuple[float, float] = (-math.inf, math.inf)) -> WeightProduct | None:
    """The :class:`WeightProduct` of an ungrouped float32 Conv with constant 4-D weights
    (``consts``: the node's constant inputs, the bias third), else None."""
    if weight is None or np.ndim(weight) != 4 or int(attrs.get("group") or 1) != 1 or np.dtype(dtype) != np.float32:
        return None
    return WeightProduct(weight, consts[2] if len(consts) > 2 else None, bias, residual, bounds)


def fused_im2col_lowering(attrs: Mapping[str, Any], weight: np.ndarray | None, consts: Sequence[np.ndarray | None],
                          sources: Sequence[Arg], residual: Arg | None, out: Arg, bounds: tuple[float, float],
                          otherwise: Lowering) -> Lowering | None:
    """A fused group ``act(conv(x) (+ residual))`` anchored by an ungrouped conv with constant
    weights: a 3x3 conv that Winograd takes, without a residual, as Winograd with the bounds
    in its output transform; else each image's im2col, then our kernel with the epilogue in its
    stores, where that measures faster than sgemm; else ``otherwise`` (the conv's own lowering
    and the epilogue as a kernel of its own). None: not such a conv."""
    bias = sources[2] if len(sources) > 2 else NULL
    product = weight_product(attrs, weight, consts, bias, np.dtype(np.float32), residual is not None, bounds)
    if product is None or weight is None:
        return None
    shape = weight.shape
    winograd = _WinogradWeights(weight)  # (made when the group takes Winograd)

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape],
              symbols: Mapping[str, int]) -> NativeStep | str:
        sx, sw = inputs[0], inputs[1]
        if sx is None or sw is None or len(sx) != 4 or tuple(sw) != shape or sx[1] != shape[1]:
            return otherwise(inputs, outputs, symbols)
        kernel = tuple(attrs.get("kernel_shape") or sw[2:])
        win = window(attrs, sx[2:], kernel)
        begin, end = [int(v) for v in win.begin], [int(v) for v in win.end]
        out_hw = (int(outputs[0][2]), int(outputs[0][3]))
        if min(*begin, *end) < 0:
            return otherwise(inputs, outputs, symbols)
        if kernel == (3, 3) and tuple(win.strides) == (1, 1) and tuple(win.dilations) == (1, 1) \
                and min(sx[1], sw[0]) >= 8 and winograd_choice(sx, sw, out_hw, begin, bias is not NULL)[0]:
            if residual is not None:  # (the output transform bounds what it stores; it adds nothing)
                return otherwise(inputs, outputs, symbols)
            step = _winograd_or_im2col(sx, sw, out_hw, begin, bias is not NULL, sources, bias, out, winograd, bounds)
            return step if step is not None else otherwise(inputs, outputs, symbols)
        step = im2col_product(product, sx, kernel, win, begin, out_hw, sources[0], residual, out)
        return step if step is not None else otherwise(inputs, outputs, symbols)

    routines = WINOGRAD_ROUTINES if winograd_possible(attrs, weight) else ()
    return needing(lower, *needs(otherwise), "md_im2col_task", *routines, *PRODUCT_ROUTINES)


def im2col_product(product: WeightProduct, sx: Shape, kernel: tuple[int, ...], win: Any, begin: list[int],
                   out_hw: tuple[int, int], x: Arg, residual: Arg | None, out: Arg) -> NativeStep | None:
    """Each image's im2col (or each band's, :func:`im2col_bands`), then its product with the
    weights through our kernels (the epilogue, ``residual`` and ``product.bounds``, in their
    stores), when they measure faster than sgemm on these shapes; else None. With several
    images or bands and pixels as the tile's columns, each unit (image or band) is a
    :func:`sequence` (its im2col, then its product, on one thread), as many units side by side
    in one group of the worker pool as it has threads, each in a column buffer of its own: no
    barrier between a unit's two calls, no columns read from another core's cache (ResNet-50's
    stem, 56 bands, spent 0.97 ms in its im2col calls on two threads, more than on one, and
    2.2-2.3 ms in all)."""
    n, c, h, w = sx
    taps, pixels = kernel[0] * kernel[1], out_hw[0] * out_hw[1]
    if product.depth != c * taps or pixels == 0:
        return None
    bands = im2col_bands(c * taps, out_hw)
    kind = product.choice(pixels, [rows * out_hw[1] for _, rows in bands] if len(bands) > 1 else ())
    if kind == BLAS:
        return None
    if kind not in (OWN, OWN_C):
        bands = [(0, out_hw[0])]
    values = _im2col_values(sx, kernel, win.strides, win.dilations, begin, out_hw)
    units = [(i, y0, rows) for i in range(n) for y0, rows in bands]
    cols = c * taps * max(rows for _, rows in bands) * out_hw[1] * 4
    image = 4 * product.cout * pixels
    chains = len(units) > 1 and kind in (OWN, OWN_C)  # (one product call a unit)
    width = max(2, binding_threads()) if chains else 1  # column buffers: units side by side in a group

    def unit(u: int, buffer: Arg, split: bool) -> tuple[list[Call], int]:
        i, y0, rows = units[u]
        band = {**values, "y0": y0, "oh": rows}
        at = i * image + 4 * y0 * out_hw[1]
        tasks = functools.partial(_im2col_tasks, band, c, c * taps * rows * out_hw[1]) if split else None
        im2col = Call(native_function("md_im2col_task"), (x.at(4 * i * c * h * w), buffer),
                      tuple(band[d] for d in IM2COL_DIMS), "conv2d im2col", tasks)
        more, work = product.calls(kind, 1, rows * out_hw[1], buffer, None if residual is None else residual.at(at),
                                   out.at(at), Arg("scratch", 1), "conv2d", None if len(bands) == 1 else pixels)
        return [im2col, *more], work

    calls: list[Call] = []
    work = 0
    for u in range(len(units)):
        if chains:  # each unit's im2col then product on one thread, the next units beside it
            j = u % width
            more, _ = unit(u, Arg("scratch", 0).at(j * cols), split=False)
            calls.append(sequence(more, joins=j > 0))
        else:
            more, work = unit(u, Arg("scratch", 0), split=True)
            calls += more
    return NativeStep(tuple(calls), (width * cols, *((work,) if work else ())), product.keep())


BAND_BYTES = 192 << 10
"""An image whose im2col (for our own kernel, pixels as the tile's columns) takes more than this
is done in bands of output rows, each band's columns then its product: the columns stay in
L2 (ResNet-50's first conv: 7.4 MB of columns, read 147 rows at a time, a stream each)."""


def im2col_bands(depth: int, out_hw: tuple[int, int]) -> list[tuple[int, int]]:
    """``(first output row, rows)`` of each band of an image whose columns are ``depth`` rows
    deep: about :data:`BAND_BYTES` of columns a band, each at least one 16-pixel block wide
    (the kernel's), the last no narrower (a short remainder joins the band before it).

    Example:
        >>> im2col_bands(147, (112, 112))[:2], len(im2col_bands(147, (112, 112)))
        ([(0, 2), (2, 2)], 56)
        >>> im2col_bands(27, (14, 14))
        [(0, 14)]
    """
    oh, ow = out_hw
    rows = max(1, BAND_BYTES // (4 * depth * ow), -(-conv1x1_width() // ow))
    if rows >= oh:
        return [(0, oh)]
    bands = [(y0, min(rows, oh - y0)) for y0 in range(0, oh, rows)]
    if bands[-1][1] * ow < conv1x1_width() or bands[-1][1] < rows // 2:
        _, last = bands.pop()
        bands[-1] = (bands[-1][0], bands[-1][1] + last)
    return bands


def _im2col_tasks(values: Mapping[str, int], c: int, elements: int, count: int) -> list[tuple[int, ...]] | None:
    """An im2col (``values``: of an image or a band, ``elements`` columns' floats) split over its
    ``c`` channels across ``count`` threads (None: one call)."""
    if count < 2 or c < count or elements < PARALLEL_ELEMENTS:
        return None
    return [tuple({**values, "task": t, "tasks": count}[d] for d in IM2COL_DIMS) for t in range(count)]


def _winograd_or_im2col(sx: Shape, sw: Shape, out_hw: tuple[int, int], begin: list[int], has_bias: bool,
                        sources: Sequence[Arg], bias: Arg, out: Arg, weights: _WinogradWeights,
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
    kind = per_product[0].choice(group * tiles)
    calls: list[Call] = []
    work = 0
    one = (group, c, h, w, k, oh, ow, begin[0], begin[1], int(has_bias), *_bound_bits(bounds))

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


def _depthwise(sx: Shape, sw: Shape, win: Any, begin: list[int], end: list[int], sources: Sequence[Arg],
               bias: Arg, out: Arg, dtype: np.dtype, compile_node: Callable[..., Any]) -> NativeStep | str:
    n, c, h, w = sx
    hp, wp = h + begin[0] + end[0], w + begin[1] + end[1]
    padded = (n, c, hp, wp)
    zero = type(win)(win.kernel, win.strides, win.dilations, (0, 0), (0, 0))
    try:
        kernel = compile_node(blas.depthwise_node(padded, sw, bias is not NULL, np.dtype(dtype), zero))
    except Exception as e:  # a refusal: this step runs from Python
        return f"depthwise kernel: {type(e).__name__}: {e}"
    out_shape = (n, sw[0], *blas._out_sizes((hp, wp), zero))
    calls = []
    x = sources[0]
    if any(begin) or any(end):
        values = {"planes": n * c, "h": h, "w": w, "pt": begin[0], "pl": begin[1], "hp": hp, "wp": wp,
                  "task": 0, "tasks": 1}

        def tasks(count: int) -> list[tuple[int, ...]] | None:
            if count < 2 or n * c < count or n * c * hp * wp < PARALLEL_ELEMENTS:
                return None
            return [tuple({**values, "task": t, "tasks": count}[d] for d in PAD2D_DIMS) for t in range(count)]

        calls.append(Call(native_function("md_pad2d"), (x, Arg("scratch", 0)),
                          tuple(values[d] for d in PAD2D_DIMS), "pad2d", tasks))
        x = Arg("scratch", 0)
    ins = [padded, tuple(sw)] + ([(sw[0],)] if bias is not NULL else [])
    args = (x, sources[1], *([bias] if bias is not NULL else []),
            *(Arg("addr", p) for p in kernel.constant_pointers), out)
    calls.append(Call(kernel.address, args, tuple(kernel.dims_for(ins, [out_shape])), "depthwise kernel",
                      kernel_tasks(kernel, ins, [out_shape])))
    scratch = (n * c * hp * wp * 4,) if len(calls) == 2 else ()
    return NativeStep(tuple(calls), scratch, (kernel,))


__all__ = ["SPLIT_IM2COL", "WINOGRAD_CHOICES", "conv_lowering", "fused_im2col_lowering", "im2col_product",
           "weight_product", "winograd_choice", "winograd_weights"]
