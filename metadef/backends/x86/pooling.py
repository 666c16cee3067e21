"""Max pools through ``md_maxpool3x3`` / ``md_maxpool5x5`` / ``md_maxpool7x7``: such a window
once (any stride and padding), a larger odd window at stride 1 as repeated smaller windows.

``md_maxpool3x3`` (``md_depthwise``'s walk over padded planes, taking maxima) runs a float32
2-D MaxPool with a 3x3 window, dilation 1 and no Indices output; ``md_maxpool5x5`` and
``md_maxpool7x7`` the 5x5 and 7x7 windows (YOLO's SPPF: three 5x5 pools in a row), four output
rows at a time, each line's maximum across the window taken once for the rows it feeds. A
larger odd ``k x k`` window at stride 1 padded by ``(k - 1) / 2`` on every side (SPP's 9 and 13)
is such pools in a row, exactly: the maximum over a 9x9 window is the maximum over the 5x5
windows of the 5x5 maxima, and the padding is -inf for all: 9 and 13 as two and three 5x5
passes, other sizes as ``(k - 1) / 2`` 3x3 passes. The generated window kernel ran a 5x5 pool
of ``[8, 256, 20, 20]`` at 6.2x ONNX Runtime's time, two 3x3 passes at 1.6-2.1x.

Example:
    >>> chained_passes({"kernel_shape": [5, 5], "strides": [1, 1], "pads": [2, 2, 2, 2]})
    2
    >>> chained_passes({"kernel_shape": [5, 5], "strides": [2, 2], "pads": [2, 2, 2, 2]}) is None
    True
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from metadef.backends.x86.conv1x1 import in_place_routine, routine_fits, static_planes
from metadef.backends.x86.native import NULL, PARALLEL_ELEMENTS, Arg, Call, Lowering, NativeStep, Shape, needing, needs
from metadef.codegen.native import native_function
from metadef.codegen.native_depthwise import DEPTHWISE_KERNELS, depthwise_dims, depthwise_routine, maxpool_routine
from metadef.codegen.native_qpool import qmaxpool_dims
from metadef.ir import Node
from metadef.ops.defs.nn_pool import window


def chained_passes(attrs: Mapping[str, Any]) -> int | None:
    """How many 3x3 stride-1 pools (one pixel of padding) make this pool: ``(k - 1) / 2`` for an
    odd ``k x k`` window at stride 1 with ``(k - 1) / 2`` pixels of explicit padding on every
    side and dilation 1; else None."""
    kernel = list(attrs.get("kernel_shape") or [])
    if len(kernel) != 2 or kernel[0] != kernel[1] or kernel[0] % 2 == 0 or kernel[0] < 5:
        return None
    k = int(kernel[0])
    if any(s != 1 for s in attrs.get("strides") or [1, 1]) or any(d != 1 for d in attrs.get("dilations") or [1, 1]):
        return None
    if attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "") or list(attrs.get("pads") or []) != [(k - 1) // 2] * 4:
        return None
    return (k - 1) // 2


def maxpool_lowering(node: Node, otherwise: Lowering) -> Lowering:
    """A float32 2-D MaxPool with no Indices output as ``md_maxpool3x3`` calls: one for a 3x3
    window with dilation 1; :func:`chained_passes` of them (between two scratch planes) for a
    larger odd window at stride 1; ``otherwise`` (the generated kernel) for any other pool or
    shape."""
    attrs = node.attrs
    out_type = node.outputs[0].type if node.outputs and node.outputs[0] is not None else None
    if node.qualop != "MaxPool" or len([v for v in node.outputs if v is not None]) != 1 or out_type is None:
        return otherwise
    if out_type.dtype.numpy in (np.uint8, np.int8):
        return byte_maxpool_lowering(node, otherwise)
    if out_type.dtype.numpy != np.float32:
        return otherwise
    kernel = list(attrs.get("kernel_shape") or [])
    chained = chained_passes(attrs)
    if len(kernel) == 2 and kernel[0] == kernel[1] and kernel[0] in DEPTHWISE_KERNELS \
            and all(d == 1 for d in attrs.get("dilations") or [1, 1]):
        passes, pool, k = 1, attrs, int(kernel[0])
    elif chained is not None:  # (9x9, 13x13: 5x5 passes; 11x11 and larger: 3x3 ones)
        k = 5 if (kernel[0] - 1) % 4 == 0 else 3
        passes, pool = (kernel[0] - 1) // (k - 1), {"kernel_shape": [k, k], "strides": [1, 1], "pads": [k // 2] * 4}
    else:
        return otherwise

    def geometry(hw: Sequence[int]) -> tuple[tuple[int, int], tuple[int, int]]:
        win = window(pool, tuple(hw), (k, k))
        return (int(win.begin[0]), int(win.begin[1])), (int(win.strides[0]), int(win.strides[1]))

    planes = static_planes(node)
    routine = maxpool_routine(k)
    if planes is not None and k == 3:
        routine = in_place_routine(routine, planes[0], planes[1] if passes == 1 else planes[0], *geometry(planes[0]))

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape], symbols: Mapping[str, int]
              ) -> NativeStep | str:
        sx = inputs[0]
        if sx is None or len(sx) != 4 or len(outputs[0]) != 4:
            return otherwise(inputs, outputs, symbols)
        begin, strides = geometry(sx[2:])
        n, c, h, w = sx
        out_hw = (int(outputs[0][2]), int(outputs[0][3]))
        if min(begin) < 0 or not routine_fits(routine, (h, w), out_hw, strides, begin, k) or 0 in (*sx, *out_hw):
            return otherwise(inputs, outputs, symbols)
        dims = depthwise_dims(n, c, (h, w), out_hw, strides, begin)

        def tasks(count: int) -> list[tuple[int, ...]] | None:
            if count < 2 or n * c < count or n * c * out_hw[0] * out_hw[1] < PARALLEL_ELEMENTS:
                return None
            return [depthwise_dims(n, c, (h, w), out_hw, strides, begin, task=t, tasks=count) for t in range(count)]

        # pass i reads the input or a scratch plane and writes the next scratch plane or the output
        places = [Arg("in", 0), *(Arg("scratch", i % 2) for i in range(passes - 1)), Arg("out", 0)]
        calls = tuple(Call(native_function(routine), (source, NULL, NULL, target), dims, f"maxpool {k}x{k}", tasks)
                      for source, target in itertools.pairwise(places))
        scratch = (4 * n * c * h * w,) * min(passes - 1, 2)
        return NativeStep(calls, scratch)

    return needing(lower, *needs(otherwise), routine)


def byte_maxpool_lowering(node: Node, otherwise: Lowering) -> Lowering:
    """A 2-D MaxPool of 8-bit planes (a quantized model's) as ``md_qmaxpool`` calls, any window,
    stride, dilation and padding; ``otherwise`` for other ranks."""
    flip = node.outputs[0].type.dtype.numpy == np.int8  # type: ignore[union-attr]

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape], symbols: Mapping[str, int]
              ) -> NativeStep | str:
        sx = inputs[0]
        kernel = tuple(int(k) for k in node.attrs.get("kernel_shape") or ())
        if sx is None or len(sx) != 4 or len(outputs[0]) != 4 or len(kernel) != 2:
            return otherwise(inputs, outputs, symbols)
        win = window(node.attrs, tuple(sx[2:]), kernel)
        planes, out_hw = int(sx[0] * sx[1]), (int(outputs[0][2]), int(outputs[0][3]))
        if min(int(v) for v in win.begin) < 0 or 0 in (planes, *sx[2:], *out_hw):
            return otherwise(inputs, outputs, symbols)

        def dims(task: int = 0, tasks: int = 1) -> tuple[int, ...]:
            return qmaxpool_dims(planes, (int(sx[2]), int(sx[3])), out_hw, kernel,  # type: ignore[arg-type]
                                 tuple(int(v) for v in win.strides), tuple(int(v) for v in win.dilations),
                                 (int(win.begin[0]), int(win.begin[1])), flip=flip, task=task, tasks=tasks)

        def tasks(count: int) -> list[tuple[int, ...]] | None:
            if count < 2 or planes < count or planes * out_hw[0] * out_hw[1] < PARALLEL_ELEMENTS:
                return None
            return [dims(t, count) for t in range(count)]

        return NativeStep((Call(native_function("md_qmaxpool"), (Arg("in", 0), Arg("out", 0)), dims(),
                                "maxpool (8-bit)", tasks),), ())

    return needing(lower, *needs(otherwise), "md_qmaxpool")


def avgpool_lowering(node: Node, otherwise: Lowering) -> Lowering:
    """A float32 2-D AveragePool of a 3x3, 5x5 or 7x7 window (dilation 1, no ceil mode) whose
    divisor is always the window's size (``count_include_pad``, or no padding) as one
    ``md_depthwise`` / ``md_depthwise{k}`` call with every tap ``1 / k**2`` (PyTorch's
    ``AvgPool2d(3, 1, 1)`` exports so: Inception's branches); ``otherwise`` (the generated
    kernel, whose padded windows take checked loads) for any other pool or shape."""
    attrs = node.attrs
    kernel = list(attrs.get("kernel_shape") or [])
    out_type = node.outputs[0].type if node.outputs and node.outputs[0] is not None else None
    if node.qualop != "AveragePool" or out_type is None or out_type.dtype.numpy != np.float32 \
            or len(kernel) != 2 or kernel[0] != kernel[1] or kernel[0] not in DEPTHWISE_KERNELS \
            or any(d != 1 for d in attrs.get("dilations") or [1, 1]) or attrs.get("ceil_mode"):
        return otherwise
    k = int(kernel[0])
    planes = static_planes(node)
    routine = depthwise_routine(k)

    def geometry(hw: Sequence[int]) -> tuple[tuple[int, int], tuple[int, int], bool]:
        win = window(attrs, tuple(hw), (k, k))
        return ((int(win.begin[0]), int(win.begin[1])), (int(win.strides[0]), int(win.strides[1])),
                any(int(p) != 0 for p in (*win.begin, *win.end)))

    if planes is not None and k == 3:
        routine = in_place_routine(routine, planes[0], planes[1], *geometry(planes[0])[:2])

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape], symbols: Mapping[str, int]
              ) -> NativeStep | str:
        sx = inputs[0]
        if sx is None or len(sx) != 4 or len(outputs[0]) != 4:
            return otherwise(inputs, outputs, symbols)
        begin, strides, padded = geometry(sx[2:])
        n, c, h, w = sx
        out_hw = (int(outputs[0][2]), int(outputs[0][3]))
        if (padded and not attrs.get("count_include_pad")) or min(begin) < 0 or 0 in (*sx, *out_hw) \
                or not routine_fits(routine, (h, w), out_hw, strides, begin, k):
            return otherwise(inputs, outputs, symbols)
        taps, zeros = np.full((c, k * k), 1.0 / (k * k), np.float32), np.zeros(c, np.float32)

        def tasks(count: int) -> list[tuple[int, ...]] | None:
            if count < 2 or n * c < count or n * c * out_hw[0] * out_hw[1] < PARALLEL_ELEMENTS:
                return None
            return [depthwise_dims(n, c, (h, w), out_hw, strides, begin, task=t, tasks=count) for t in range(count)]

        call = Call(native_function(routine), (Arg("in", 0), Arg("addr", taps.ctypes.data),
                                               Arg("addr", zeros.ctypes.data), Arg("out", 0)),
                    depthwise_dims(n, c, (h, w), out_hw, strides, begin), f"avgpool {k}x{k}", tasks)
        return NativeStep((call,), keep=(taps, zeros))

    return needing(lower, *needs(otherwise), routine)


__all__ = ["avgpool_lowering", "chained_passes", "maxpool_lowering"]
