"""Convolutions lowered to native calls: im2col + split sgemm per image, Winograd F(2x2, 3x3)
or F(4x4, 3x3) (:mod:`.winograd`, whichever measures fastest), our kernels on each image's
im2col or on a padded copy of the input read in place (:mod:`.conv_direct`), grouped convs through
``md_conv2d``, depthwise convs through a padded copy and a generated kernel (the 3x3 ones take
our own ``md_depthwise``, see :mod:`.conv1x1`).

Example:
    >>> im2col_bands(27, (14, 14))
    [(0, 14)]
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from metadef.backends.x86 import contractions as blas
from metadef.backends.x86.conv1x1 import BLAS, ORDERS, OWN_T, PRODUCT_ROUTINES, WeightProduct
from metadef.backends.x86.conv_direct import ROUTINES as DIRECT_ROUTINES
from metadef.backends.x86.conv_direct import direct_step, pad_call
from metadef.backends.x86.native import (
    NULL,
    PARALLEL_ELEMENTS,
    Arg,
    Call,
    Lowering,
    NativeStep,
    PixelRows,
    Shape,
    _blas,
    _f32,
    binding_threads,
    kernel_tasks,
    needing,
    needs,
    pixel_stride,
    sequence,
    sgemm_call,
    timed_call,
)
from metadef.backends.x86.winograd import (
    WINOGRAD_ROUTINES,
    WinogradWeights,
    im2col_values,
    winograd_choice,
    winograd_possible,
    winograd_step,
)
from metadef.codegen.native import CONV2D_DIMS, IM2COL_DIMS, native_function
from metadef.codegen.native_gemm import conv1x1_width
from metadef.ops.defs.nn_pool import window


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
    winograd = WinogradWeights(weight) if weight is not None else None

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
            step = winograd_step(sx, sw, (oh, ow), begin, has_bias, sources, bias, out, winograd)
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

    routines = ["md_im2col_task", "md_sgemm", *(PRODUCT_ROUTINES + DIRECT_ROUTINES if product is not None else ())]
    if group > 1:  # a depthwise conv (one input channel per output channel) pads; others: md_conv2d
        depthwise_only = weight is not None and weight.shape[1] == 1 and weight.shape[0] == group
        routines += ["md_pad2d"] if depthwise_only else ["md_pad2d", "md_conv2d"]
    elif winograd_possible(attrs, weight):
        routines += [*WINOGRAD_ROUTINES, *PRODUCT_ROUTINES]
    return needing(lower, *routines)


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
    values = im2col_values(sx, kernel, win.strides, win.dilations, begin, out_hw)
    tasks = functools.partial(_im2col_tasks, values, c, c * taps * pixels)
    cols = Arg("scratch", 0)
    calls = []
    for i in range(n):
        calls.append(Call(native_function("md_im2col_task"), (sources[0].at(4 * i * c * h * w), cols),
                          tuple(values[d] for d in IM2COL_DIMS), "conv2d im2col", tasks))
        calls.append(sgemm_call((sources[1], cols, out.at(4 * i * k * pixels), *_blas(), bias, *_blas("sgemv")), 1,
                                k, pixels, c * taps, "conv2d sgemm", bias=(1, 0) if bias is not NULL else None))
    return NativeStep(tuple(calls), (c * taps * pixels * 4,))


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
    winograd = WinogradWeights(weight)  # (made when the group takes Winograd)

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
            step = winograd_step(sx, sw, out_hw, begin, bias is not NULL, sources, bias, out, winograd, bounds)
            return step if step is not None else otherwise(inputs, outputs, symbols)
        step = im2col_product(product, sx, kernel, win, begin, out_hw, sources[0], residual, out)
        return step if step is not None else otherwise(inputs, outputs, symbols)

    routines = WINOGRAD_ROUTINES if winograd_possible(attrs, weight) else ()
    return needing(lower, *needs(otherwise), "md_im2col_task", *routines, *PRODUCT_ROUTINES, *DIRECT_ROUTINES)


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
    bands = _shared_out(im2col_bands(c * taps, out_hw, 4 * product.cout * product.depth), n, out_hw,
                        binding_threads())
    kind = product.choice(pixels, [rows * out_hw[1] for _, rows in bands] if len(bands) > 1 else ())
    values = im2col_values(sx, kernel, win.strides, win.dilations, begin, out_hw)

    def im2col_call(image: np.ndarray, columns: np.ndarray) -> Callable[[], None]:
        return timed_call(native_function("md_im2col_task"), [image.ctypes.data, columns.ctypes.data],
                          tuple(values[d] for d in IM2COL_DIMS))

    # a strided pointwise conv halving its input exactly can read a pixel-major input in place
    stride = int(win.strides[0])
    gathers = kernel == (1, 1) and tuple(win.dilations) == (1, 1) and not any(begin) and stride > 1 \
        and tuple(win.strides) == (stride, stride) and (h, w) == (stride * out_hw[0], stride * out_hw[1]) \
        and x.kind == "in" and not x.offset
    direct = direct_step(product, sx, kernel, win, begin, out_hw, x, residual, out, kind, im2col_call)
    if (direct is not None and not gathers) or kind == BLAS:
        return direct
    plain = out.kind == "out" and not out.offset \
        and (residual is None or (residual.kind == "in" and not residual.offset))

    def step(pixel_major: frozenset[tuple[str, int]] = frozenset()) -> NativeStep:
        named = {"x": x, "residual": residual, "out": out}
        rows_of = [name for name, arg in named.items() if arg is not None and (arg.kind, arg.index) in pixel_major]
        if "x" in rows_of:  # (the input read in place: no im2col, no transpose)
            calls, work = product.calls(OWN_T, n, pixels, x, residual, out, Arg("scratch", 0), "conv2d",
                                        rows=rows_of, gather=(out_hw[0], stride, w))
            return NativeStep(tuple(calls), (work,) if work else (), product.keep(), rows=form)
        if not rows_of and direct is not None:  # (as the race chose)
            return dataclasses.replace(direct, rows=form)
        # (an argument pixel-major: pixels as rows, an image a unit)
        return _im2col_units(product, kind if not rows_of else OWN_T, bands if not rows_of else [(0, out_hw[0])],
                             sx, out_hw, values, x, residual, out, rows_of, form)

    form = None
    if plain and (kind == OWN_T or gathers):
        form = PixelRows((x.index,) if gathers else (), None if residual is None else residual.index, out.index,
                         step)
    return step()


def _im2col_units(product: WeightProduct, kind: str, bands: list[tuple[int, int]], sx: Shape,
                  out_hw: tuple[int, int], values: Mapping[str, int], x: Arg, residual: Arg | None, out: Arg,
                  rows_of: Sequence[str], form: PixelRows | None) -> NativeStep:
    """Each image's (or band's) im2col, then its product of ``kind`` (see :func:`im2col_product`;
    ``rows_of``: the product's pixel-major arguments, as :meth:`WeightProduct.calls` takes them)."""
    n, c, h, w = sx
    pixels = out_hw[0] * out_hw[1]
    taps = values["kh"] * values["kw"]
    if kind not in ORDERS:
        bands = [(0, out_hw[0])]
    units = [(i, y0, rows) for i in range(n) for y0, rows in bands]
    cols = c * taps * max(rows for _, rows in bands) * out_hw[1] * 4
    chains = len(units) > 1 and kind in ORDERS  # (one product call a unit)
    width = max(1, binding_threads()) if chains else 1  # column buffers: units side by side in a group
    # (an image's output: channels-major, or pixel-major rows of pixel_stride(cout) floats)
    image = 4 * pixels * (pixel_stride(product.cout) if "out" in rows_of else product.cout)

    def unit(u: int, buffer: Arg) -> tuple[list[Call], int]:
        i, y0, rows = units[u]
        band = {**values, "y0": y0, "oh": rows}
        at = i * image + 4 * y0 * out_hw[1]
        tasks = None if chains else functools.partial(_im2col_tasks, band, c, c * taps * rows * out_hw[1])
        im2col = Call(native_function("md_im2col_task"), (x.at(4 * i * c * h * w), buffer),
                      tuple(band[d] for d in IM2COL_DIMS), "conv2d im2col", tasks)
        more, work = product.calls(kind, 1, rows * out_hw[1], buffer,
                                   None if residual is None else residual.at(at), out.at(at), Arg("scratch", 1),
                                   "conv2d", None if len(bands) == 1 else pixels, rows=rows_of)
        return [im2col, *more], work

    calls: list[Call] = []
    work = 0
    for u in range(len(units)):
        if chains:  # each unit's im2col then product on one thread, the next units beside it
            j = u % width
            more, _ = unit(u, Arg("scratch", 0).at(j * cols))
            calls.append(sequence(more, joins=j > 0))
        else:
            more, work = unit(u, Arg("scratch", 0))
            calls += more
    return NativeStep(tuple(calls), (width * cols, *((work,) if work else ())), product.keep(), rows=form)


def _shared_out(bands: list[tuple[int, int]], n: int, out_hw: tuple[int, int], threads: int) -> list[tuple[int, int]]:
    """``bands`` of each of ``n`` images, or more of them, so that few units (images x bands)
    share out evenly over ``threads`` (three bands on two threads: one thread's two took twice
    the other's one), each still a block of the kernel's pixels wide.

    Example:
        >>> _shared_out([(0, 10), (10, 10), (20, 8)], 1, (28, 28), 2)
        [(0, 7), (7, 7), (14, 7), (21, 7)]
        >>> _shared_out([(0, 10), (10, 10), (20, 8)], 8, (28, 28), 2)[:1]
        [(0, 10)]
    """
    (oh, width), count = out_hw, len(bands)
    if threads < 2 or count < 2 or (n * count) % threads == 0 or n * count >= 4 * threads:
        return bands
    widest = max(r for _, r in bands)
    step = threads // math.gcd(n, threads)  # (n images of `count` bands: a multiple of threads)
    for total in range(-(-count // step) * step, oh + 1, step):
        rows = -(-oh // total)
        if rows < widest // 2:  # (narrower bands read the weights more often: not below half)
            break
        if -(-oh // rows) == total and (oh - (total - 1) * rows) * width >= conv1x1_width():
            return [(y0, min(rows, oh - y0)) for y0 in range(0, oh, rows)]
    return bands


BAND_BYTES = 192 << 10
"""An image whose im2col (for our own kernel, pixels as the tile's columns) takes more than this
is done in bands of output rows, each band's columns then its product: the columns stay in
L2 (ResNet-50's first conv: 7.4 MB of columns, read 147 rows at a time, a stream each)."""


BAND_WEIGHTS = 2
"""A band holds at least this many times its product's weights in columns (see :func:`im2col_bands`)."""


def im2col_bands(depth: int, out_hw: tuple[int, int], weight_bytes: int = 0) -> list[tuple[int, int]]:
    """``(first output row, rows)`` of each band of an image whose columns are ``depth`` rows
    deep: about :data:`BAND_BYTES` of columns a band, or twice the product's weights
    (``weight_bytes``) where they weigh more (every band's product reads all the weights:
    ResNet-50's layer2/0/conv2, 590 KB of weights, took 14 bands of 56 pixels, its product
    reading 8.3 MB of weights an image), each band at least one block of the kernel's pixels
    wide, the last no narrower (a short remainder joins the band before it).

    Example:
        >>> im2col_bands(147, (112, 112))[:2], len(im2col_bands(147, (112, 112)))
        ([(0, 2), (2, 2)], 56)
        >>> im2col_bands(1152, (28, 28), weight_bytes=1152 * 128 * 4)
        [(0, 9), (9, 9), (18, 10)]
        >>> im2col_bands(27, (14, 14))
        [(0, 14)]
    """
    oh, ow = out_hw
    rows = max(1, max(BAND_BYTES, BAND_WEIGHTS * weight_bytes) // (4 * depth * ow), -(-conv1x1_width() // ow))
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
        calls.append(pad_call(x, Arg("scratch", 0), n * c, (h, w), begin, (hp, wp), "pad2d"))
        x = Arg("scratch", 0)
    ins = [padded, tuple(sw)] + ([(sw[0],)] if bias is not NULL else [])
    args = (x, sources[1], *([bias] if bias is not NULL else []),
            *(Arg("addr", p) for p in kernel.constant_pointers), out)
    calls.append(Call(kernel.address, args, tuple(kernel.dims_for(ins, [out_shape])), "depthwise kernel",
                      kernel_tasks(kernel, ins, [out_shape])))
    scratch = (n * c * hp * wp * 4,) if len(calls) == 2 else ()
    return NativeStep(tuple(calls), scratch, (kernel,))


__all__ = ["SPLIT_IM2COL", "conv_lowering", "fused_im2col_lowering", "im2col_product", "weight_product"]
