"""Convolutions lowered to native calls: im2col + split sgemm per image, Winograd F(2x2, 3x3)
in three split phases per image (when it measures faster), grouped convs through
``md_conv2d``, depthwise convs through a padded copy and a generated kernel (the 3x3 ones take
our own ``md_depthwise``, see :mod:`.conv1x1`).

Example:
    >>> winograd_weights(np.ones((2, 3, 3, 3), np.float32)).shape
    (16, 2, 3)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from metadef.backends.x86 import contractions as blas
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
    kernel_tasks,
    measured_choice,
    needing,
    sgemm_call,
    sgemm_dims,
    timed_call,
)
from metadef.codegen.native import CONV2D_DIMS, IM2COL_DIMS, PAD2D_DIMS, native_function, winograd_workspace
from metadef.ops.defs.nn_pool import window

WINOGRAD_G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]])


def winograd_weights(w: np.ndarray) -> np.ndarray:
    """``U = G g Gᵀ`` for each 3x3 filter of ``w [K, C, 3, 3]``, laid out ``[16, K, C]``.

    Example:
        >>> winograd_weights(np.ones((2, 3, 3, 3), np.float32)).shape
        (16, 2, 3)
    """
    k, c = w.shape[:2]
    # U[a*4+b, k, c] = sum_ij G[a,i] G[b,j] g[k,c,i,j]: one product with kron(G, G), written
    # straight in its final layout (no transposed copies of the weights)
    both = np.kron(WINOGRAD_G, WINOGRAD_G).astype(np.float32)  # [16, 9]
    filters = np.ascontiguousarray(w, np.float32).reshape(k * c, 9)
    return np.matmul(both, filters.T).reshape(16, k, c)


def conv_lowering(attrs: Mapping[str, Any], sources: Sequence[Arg], out: Arg, dtype: np.dtype,
                  depthwise: Callable[..., Any] | None, weight: np.ndarray | None = None) -> Lowering:
    """A 2-D Conv: each image's im2col then a split sgemm (a 1x1 conv: one batched sgemm; a
    grouped conv: ``md_conv2d``) or, for a 3x3 stride-1 conv with constant
    weights, Winograd F(2x2,3x3) (``md_winograd_in``/``_out`` around a batched sgemm) when it
    measures faster on these shapes; for a depthwise
    conv ``md_pad2d`` and a generated window-sum kernel (``depthwise``: the node compiler)."""
    group = int(attrs.get("group") or 1)
    transformed: list[np.ndarray] = []

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
            if not transformed:
                transformed.append(winograd_weights(weight))
            step = _winograd_or_im2col(sx, sw, (oh, ow), begin, has_bias, sources, bias, out, transformed[0])
            if step is not None:
                return step
        direct = taps == 1 and tuple(win.strides) == (1, 1) and not any(begin)
        workspace = 0 if direct else (c // group) * taps * oh * ow * 4
        if direct and group == 1:  # W [k, c] times each image's [c, h*w]: one batched sgemm
            return NativeStep((sgemm_call((sources[1], sources[0], out, *_blas(), bias, *_blas("sgemv")), n, k,
                                          h * w, c, "conv2d 1x1 sgemm", strides=(0, c * h * w, k * h * w),
                                          bias=(1, 0) if bias is not NULL else None),))
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

    routines = ["md_im2col_task", "md_sgemm"]
    strides, dilations = attrs.get("strides") or [1, 1], attrs.get("dilations") or [1, 1]
    if group > 1:  # a depthwise conv (one input channel per output channel) pads; others: md_conv2d
        depthwise_only = weight is not None and weight.shape[1] == 1 and weight.shape[0] == group
        routines += ["md_pad2d"] if depthwise_only else ["md_pad2d", "md_conv2d"]
    elif weight is not None and weight.shape[2:] == (3, 3) and list(strides) == [1, 1] and list(dilations) == [1, 1]:
        routines += ["md_winograd_in", "md_winograd_out"]
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
    oh, ow = out_hw
    taps, pixels = kernel[0] * kernel[1], oh * ow
    values = {"c": c, "h": h, "w": w, "oh": oh, "ow": ow, "kh": kernel[0], "kw": kernel[1],
              "sh": win.strides[0], "sw": win.strides[1], "dh": win.dilations[0], "dw": win.dilations[1],
              "pt": begin[0], "pl": begin[1], "task": 0, "tasks": 1}

    def tasks(n: int) -> list[tuple[int, ...]] | None:
        if n < 2 or c < n or c * taps * pixels < PARALLEL_ELEMENTS:
            return None
        return [tuple({**values, "task": t, "tasks": n}[d] for d in IM2COL_DIMS) for t in range(n)]

    cols = Arg("scratch", 0)
    calls = []
    for i in range(n):
        calls.append(Call(native_function("md_im2col_task"), (sources[0].at(4 * i * c * h * w), cols),
                          tuple(values[d] for d in IM2COL_DIMS), "conv2d im2col", tasks))
        calls.append(sgemm_call((sources[1], cols, out.at(4 * i * k * pixels), *_blas(), bias, *_blas("sgemv")), 1,
                                k, pixels, c * taps, "conv2d sgemm", bias=(1, 0) if bias is not NULL else None))
    return NativeStep(tuple(calls), (c * taps * pixels * 4,))


def _winograd_or_im2col(sx: Shape, sw: Shape, out_hw: tuple[int, int], begin: list[int], has_bias: bool,
                        sources: Sequence[Arg], bias: Arg, out: Arg, u: np.ndarray) -> NativeStep | None:
    """The Winograd step when it measures faster than im2col + sgemm on these shapes, else None:
    per image, the input transform split over the channels, the 16 products as one batched
    sgemm split over them, the output transform split over the output channels."""
    n, c, h, w = sx
    k = sw[0]
    oh, ow = out_hw
    tiles = ((oh + 1) // 2) * ((ow + 1) // 2)
    one = (1, c, h, w, k, oh, ow, begin[0], begin[1], int(has_bias))
    wino_work = 4 * winograd_workspace(c, k, oh, ow)
    m_offset = 4 * max(16 * c, 4 * k) * tiles  # M: after V's region (see winograd_workspace)
    gemm, gemv = blas.cblas_address("sgemm"), blas.cblas_address("sgemv")
    products = {"strides": (k * c, c * tiles, k * tiles)}

    def split(extent: int) -> Callable[[int], list[tuple[int, ...]] | None]:
        def tasks(count: int) -> list[tuple[int, ...]] | None:
            if count < 2 or extent < count:
                return None
            return [(*one, t, count) for t in range(count)]
        return tasks

    # timed on one image: both candidates loop over the images
    x = np.zeros((1, *sx[1:]), np.float32)
    y = np.empty((1, k, oh, ow), np.float32)
    wt = np.zeros(sw, np.float32)
    b = np.zeros(k, np.float32)
    work = np.empty(max(wino_work, c * 9 * oh * ow * 4) // 4 + 1, np.float32)
    cols_dims = (c, h, w, oh, ow, 3, 3, 1, 1, 1, 1, begin[0], begin[1], 0, 1)
    im2col = timed_call(native_function("md_im2col_task"), [x.ctypes.data, work.ctypes.data], cols_dims)
    product = timed_call(native_function("md_sgemm"), [wt.ctypes.data, work.ctypes.data, y.ctypes.data, gemm,
                                                       b.ctypes.data, 0], sgemm_dims(1, k, oh * ow, c * 9, bias=(1, 0)))
    phases = (timed_call(native_function("md_winograd_in"), [x.ctypes.data, work.ctypes.data], (*one, 0, 1)),
              timed_call(native_function("md_sgemm"), [u.ctypes.data, work.ctypes.data, work.ctypes.data + m_offset,
                                                       gemm, 0, gemv], sgemm_dims(16, k, tiles, c, **products)),
              timed_call(native_function("md_winograd_out"), [work.ctypes.data, y.ctypes.data, b.ctypes.data],
                         (*one, 0, 1)))
    winner, timings = measured_choice(("conv2d 3x3 per image", *one[1:]), {
        "winograd": lambda: [phase() for phase in phases], "im2col": lambda: (im2col(), product())})
    if winner != "winograd":
        return None
    scratch = Arg("scratch", 0)
    what = f"conv2d winograd F(2x2,3x3) (measured: {timings})"
    calls: list[Call] = []
    for i in range(n):
        calls.append(Call(native_function("md_winograd_in"), (sources[0].at(4 * i * c * h * w), scratch),
                          (*one, 0, 1), what + " input", split(c)))
        calls.append(sgemm_call((Arg("addr", u.ctypes.data), scratch, scratch.at(m_offset), *_blas(), NULL,
                                 *_blas("sgemv")), 16, k, tiles, c, what + " products", **products))
        calls.append(Call(native_function("md_winograd_out"), (scratch, out.at(4 * i * k * oh * ow), bias),
                          (*one, 0, 1), what + " output", split(k)))
    return NativeStep(tuple(calls), (wino_work,), (u,))


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


__all__ = ["SPLIT_IM2COL", "WINOGRAD_G", "conv_lowering", "winograd_weights"]
