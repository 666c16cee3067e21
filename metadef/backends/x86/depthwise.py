"""A depthwise conv (3x3, 5x5, 7x7) from Python through the routine its native step calls.

A depthwise conv whose planes are known before binding runs in programs as ``md_depthwise`` (or
its in-place variant, :func:`.conv1x1.depthwise_lowering`). Its step-by-step kernel (the path of
graphs whose shapes depend on values, and of any step a program runs from Python) used to be a
generated window-sum kernel compiled for it alone at compile time: MobileNetV2's ten took
~0.5 s of LLVM for a path its programs never take. :func:`depthwise_function` calls the same
routine instead, which the compile links anyway.

Example:
    >>> import numpy as np
    >>> run = depthwise_function({"group": 2, "pads": [1, 1, 1, 1]}, (2, 1, 3, 3), ((4, 4), (4, 4)), None)
    >>> run([np.ones((1, 2, 4, 4), np.float32), np.ones((2, 1, 3, 3), np.float32)])[0, 0, 0].tolist()
    [4.0, 6.0, 6.0, 4.0]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from metadef.backends.x86.contractions import ContractionFn
from metadef.backends.x86.conv1x1 import depthwise_window, in_place_routine, routine_fits
from metadef.backends.x86.native import timed_call
from metadef.codegen.native import native_function
from metadef.codegen.native_depthwise import depthwise_dims, depthwise_routine


def depthwise_function(attrs: Mapping[str, Any], w_shape: tuple[int, ...],
                       planes: tuple[tuple[int, int], tuple[int, int]] | None,
                       fallback: ContractionFn | None) -> ContractionFn | None:
    """``conv(x, w, b)`` through the routine :func:`.conv1x1.depthwise_lowering` calls for a
    k x k depthwise conv whose input and output planes are ``planes`` (None where it would not
    take this conv: not a 3x3, 5x5 or 7x7 depthwise conv, planes not known before binding, or not for the
    routine); inputs of other shapes or dtypes go to ``fallback``."""
    k = depthwise_window(attrs, w_shape, np.dtype(np.float32))
    if planes is None or k is None:
        return None
    pads = [int(p) for p in attrs.get("pads") or [0, 0, 0, 0]]
    strides = tuple(int(s) for s in attrs.get("strides") or (1, 1))
    (hw, out_hw), begin = planes, (pads[0], pads[1])
    routine = depthwise_routine(k)
    if k == 3:
        routine = in_place_routine(routine, hw, out_hw, begin, strides)  # (as the lowering picks it)
    if not routine_fits(routine, hw, out_hw, strides, begin, k):
        return None
    channels = w_shape[0]
    zeros = np.zeros(channels, np.float32)

    def run(args: Sequence[np.ndarray | None]) -> np.ndarray:
        x, w = args[0], args[1]
        b = args[2] if len(args) > 2 and args[2] is not None else zeros
        if x is None or w is None or x.dtype != np.float32 or w.dtype != np.float32 or b.dtype != np.float32 \
                or x.ndim != 4 or tuple(x.shape[1:]) != (channels, *hw) or tuple(w.shape) != tuple(w_shape) \
                or b.shape != (channels,):
            if fallback is None:
                raise ValueError(f"depthwise conv: inputs {[None if a is None else a.shape for a in args]} do "
                                 f"not fit the planes {hw} it was compiled for")
            return fallback(args)
        arrays = [np.ascontiguousarray(a) for a in (x, w, b)]
        y = np.empty((x.shape[0], channels, *out_hw), np.float32)
        if y.size:
            timed_call(native_function(routine), [a.ctypes.data for a in (*arrays, y)],
                       depthwise_dims(x.shape[0], channels, hw, out_hw, strides, begin))()
        return y

    return run


__all__ = ["depthwise_function"]
