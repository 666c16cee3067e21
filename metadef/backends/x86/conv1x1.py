"""Pointwise convolutions through our own micro-kernel, with the group's epilogue in its stores.

A 1x1, stride-1, unpadded, ungrouped float32 Conv with constant weights runs as one
``md_conv1x1`` call (:mod:`metadef.codegen.native_gemm`): the input read in place, the weights
packed once, and, when the fused group's epilogue is ``act(y + residual)`` (``act``: nothing,
Relu or Clip with constant bounds; the residual: a tensor of the output's shape), the epilogue
applied in registers before the one store. Against OpenBLAS (bias written first, sgemm, then
the epilogue as its own kernel: three passes over the output) it is chosen by measurement on
one image of the real shape, like the Winograd convs (:func:`.native.measured_choice`).

Example:
    >>> import numpy as np
    >>> from metadef.ir import parse_graph
    >>> g = parse_graph('''graph g(%x: f32[1,8,4,4], %r: f32[1,4,4,4]) -> (%z) {
    ...   %w: f32[4,8,1,1] = const
    ...   %y: f32[1,4,4,4] = Conv(%x, %w) @conv
    ...   %s: f32[1,4,4,4] = Add(%y, %r) @add
    ...   %z: f32[1,4,4,4] = Relu(%s) @relu
    ...   return %z }''', constants={"w": np.full((4, 8, 1, 1), 0.5, np.float32)})
    >>> epilogue_form(g.nodes[1:], g.nodes[0].outputs[0], g.outputs[0])
    (Value(%r: f32[1,4,4,4]), 0.0, inf)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
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
    measured_choice,
    needing,
    needs,
    sgemm_dims,
    timed_call,
)
from metadef.codegen.native import native_function
from metadef.codegen.native_depthwise import depthwise_dims, stack_floats
from metadef.codegen.native_gemm import NR, conv1x1_dims, pack_conv1x1_weights
from metadef.ir import Node, Value

OWN = "own micro-kernel, epilogue fused"
MIN_PIXELS = 64
"""Below this many pixels an image's row of 16-pixel blocks wastes too much on its overlapped
last block (7x7: 64 computed for 49), and OpenBLAS wins at every shape measured: no measuring."""

PREFER: str | None = None
"""Set to ``OWN`` or ``BLAS`` to take that path for every pointwise conv without measuring
(tests; benchmarks that compare the two)."""

DEPTHWISE = True
STACK_FLOATS = 1 << 16
"""The largest padded plane (floats) ``md_depthwise`` puts on a thread's stack; larger planes
take the padded copy and the generated kernel."""
"""3x3 depthwise convs run as ``md_depthwise`` (False: padded copy + generated kernel + epilogue)."""
BLAS = "sgemm"


def _constant(v: Value | None) -> float | None:
    if v is None or v.const is None or np.size(v.const) != 1:
        return None
    return float(np.asarray(v.const).reshape(()))


def epilogue_form(nodes: Sequence[Node], y: Value, out: Value) -> tuple[Value | None, float, float] | None:
    """``(residual, lo, hi)`` when ``nodes`` compute ``out = clip(y (+ residual), lo, hi)`` from
    ``y`` (Add of a same-shaped tensor, then at most one Relu or Clip with constant bounds),
    else None."""
    current, residual = y, None
    ops = list(nodes)
    if ops and ops[0].op == "Add":
        a, b = ops[0].inputs
        other = b if a is current else a if b is current else None
        if other is None or other is current or other.type is None or current.type is None \
                or other.type.shape != current.type.shape or other.type.dtype != current.type.dtype:
            return None
        residual, current = other, ops[0].outputs[0]
        ops = ops[1:]
    found = activation_form(ops, current, out)
    return None if found is None else (residual, *found)


def activation_form(nodes: Sequence[Node], y: Value, out: Value) -> tuple[float, float] | None:
    """``(lo, hi)`` when ``nodes`` are nothing (``out`` is ``y``), one Relu, or one Clip with
    constant bounds, from ``y`` to ``out``; else None."""
    lo, hi, current, ops = -math.inf, math.inf, y, list(nodes)
    if ops and ops[0].op in ("Relu", "Clip") and ops[0].inputs[0] is current:
        if ops[0].op == "Relu":
            lo = 0.0
        else:
            bounds = list(ops[0].inputs[1:]) + [None, None]
            found = [_constant(v) for v in bounds[:2]]
            if any(v is not None and f is None for v, f in zip(bounds[:2], found)):
                return None
            lo = -math.inf if found[0] is None else found[0]
            hi = math.inf if found[1] is None else found[1]
        current, ops = ops[0].outputs[0], ops[1:]
    if ops or current is not out:
        return None
    return lo, hi


def pointwise(attrs: Mapping[str, Any], weight: np.ndarray | None, dtype: np.dtype) -> bool:
    """Whether a Conv node can run as ``md_conv1x1`` (before its shapes are known)."""
    kernel = tuple(attrs.get("kernel_shape") or (weight.shape[2:] if weight is not None else ()))
    return (weight is not None and weight.ndim == 4 and weight.shape[2:] == (1, 1) and kernel == (1, 1)
            and dtype == np.float32 and int(attrs.get("group") or 1) == 1
            and list(attrs.get("strides") or [1, 1]) == [1, 1] and not any(attrs.get("pads") or [0])
            and str(attrs.get("auto_pad") or "NOTSET") in ("NOTSET", "VALID"))


def conv1x1_step(weight: np.ndarray, packed: list[np.ndarray], x: Arg, bias: Arg, residual: Arg | None,
                 out: Arg, sx: Shape, bounds: tuple[float, float]) -> NativeStep | None:
    """The one-call step of a pointwise conv of input shape ``sx`` (None: too few pixels, or
    OpenBLAS measures faster here); ``packed`` holds the packed weights once made."""
    n, cin, h, w = sx
    cout, p = weight.shape[0], h * w
    if p < MIN_PIXELS or weight.shape[1] != cin:
        return None
    if not packed:
        packed.append(pack_conv1x1_weights(weight))
        packed.append(np.zeros(cout, np.float32))  # the bias of a conv without one
    lo, hi = bounds
    if _measured(cin, cout, p, residual is not None, bounds, weight, packed[0]) != OWN:
        return None
    keep = (packed[0], packed[1])
    bias_arg = bias if bias is not NULL else Arg("addr", packed[1].ctypes.data)
    args = (x, Arg("addr", packed[0].ctypes.data), bias_arg, residual if residual is not None else NULL, out)
    base = {"residual": residual is not None, "lo": lo, "hi": hi}

    def tasks(count: int) -> list[tuple[int, ...]] | None:
        if count < 2 or n * cout * p < PARALLEL_ELEMENTS or n * -(-p // NR) < count:
            return None
        return [conv1x1_dims(n, cin, cout, p, **base, task=t, tasks=count) for t in range(count)]

    call = Call(native_function("md_conv1x1"), args, conv1x1_dims(n, cin, cout, p, **base),
                "conv2d 1x1 own kernel" + (" + epilogue" if residual is not None or bounds != (-math.inf, math.inf)
                                           else ""), tasks)
    return NativeStep((call,), (), keep)


def _measured(cin: int, cout: int, p: int, residual: bool, bounds: tuple[float, float], weight: np.ndarray,
              packed: np.ndarray) -> str:
    """Which of our kernel (epilogue included) and OpenBLAS (bias, sgemm, and for a group the
    epilogue's pass over the output, timed as a copy) is faster on one image of this shape,
    measured once per shape and kept in the cache."""
    if PREFER is not None:
        return PREFER
    key = ("conv1x1 per image", cin, cout, p, residual, *bounds)
    x = np.zeros((cin, p), np.float32)
    y = np.empty((cout, p), np.float32)
    res = np.zeros((cout, p), np.float32)
    bias = np.zeros(cout, np.float32)
    w = np.ascontiguousarray(weight, np.float32)
    own = conv1x1_dims(1, cin, cout, p, residual=residual, lo=bounds[0], hi=bounds[1])
    sgemm = timed_call(native_function("md_sgemm"), [w.ctypes.data, x.ctypes.data, y.ctypes.data,
                                                     blas.cblas_address("sgemm"), bias.ctypes.data, 0],
                       sgemm_dims(1, cout, p, cin, bias=(1, 0)))
    # the BLAS path's epilogue is a kernel of its own: one more pass over the output
    epilogue = timed_call(native_function("md_copy"), [y.ctypes.data, res.ctypes.data], (y.nbytes,))
    fused = residual or bounds != (-math.inf, math.inf)
    return measured_choice(key, {
        OWN: timed_call(native_function("md_conv1x1"), [x.ctypes.data, packed.ctypes.data, bias.ctypes.data,
                                                        res.ctypes.data if residual else 0, y.ctypes.data], own),
        BLAS: (lambda: (sgemm(), epilogue())) if fused else sgemm,
    })[0]


def pointwise_lowering(attrs: Mapping[str, Any], weight: np.ndarray, x: Arg, bias: Arg, residual: Arg | None,
                       out: Arg, bounds: tuple[float, float], otherwise: Lowering) -> Lowering:
    """A pointwise conv (``pointwise(...)`` holds) as one ``md_conv1x1`` call writing ``out``
    (its epilogue: ``residual``, ``bounds``), or ``otherwise`` where that does not pay."""
    packed: list[np.ndarray] = []

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape], symbols: Mapping[str, int]
              ) -> NativeStep | str:
        sx = inputs[0]
        if sx is not None and len(sx) == 4:
            step = conv1x1_step(weight, packed, x, bias, residual, out, sx, bounds)
            if step is not None:
                return step
        return otherwise(inputs, outputs, symbols)

    return needing(lower, *needs(otherwise), "md_conv1x1", "md_sgemm", "md_copy")




def depthwise3x3(attrs: Mapping[str, Any], sw: Shape | None, dtype: np.dtype) -> bool:
    """Whether a Conv node is a 3x3, dilation-1 depthwise conv that ``md_depthwise`` runs."""
    kernel = tuple(attrs.get("kernel_shape") or (sw[2:] if sw is not None else ()))
    group = int(attrs.get("group") or 1)
    return (sw is not None and len(sw) == 4 and sw[1] == 1 and sw[0] == group and group > 1 and kernel == (3, 3)
            and dtype == np.float32 and list(attrs.get("dilations") or [1, 1]) == [1, 1]
            and str(attrs.get("auto_pad") or "NOTSET") == "NOTSET")


def depthwise_lowering(attrs: Mapping[str, Any], x: Arg, w: Arg, bias: Arg, out: Arg, bounds: tuple[float, float],
                       otherwise: Lowering) -> Lowering:
    """A 3x3 depthwise conv (``depthwise3x3`` holds for its shapes) as one ``md_depthwise``
    call writing ``out`` with its bounds (Relu, Clip) applied; ``otherwise`` for other shapes."""
    zeros: list[np.ndarray] = []
    pads = list(attrs.get("pads") or [0, 0, 0, 0])
    strides = tuple(attrs.get("strides") or (1, 1))

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape], symbols: Mapping[str, int]
              ) -> NativeStep | str:
        sx, sw = inputs[0], inputs[1]
        if sx is None or len(sx) != 4 or not depthwise3x3(attrs, sw, np.dtype(np.float32)) or sx[1] != sw[0]:
            return otherwise(inputs, outputs, symbols)
        n, c, h, wd = sx
        out_hw = tuple(outputs[0][2:])
        if stack_floats((h, wd), out_hw, strides, (pads[0], pads[1])) > STACK_FLOATS:
            return otherwise(inputs, outputs, symbols)
        if not zeros:
            zeros.append(np.zeros(c, np.float32))
        b = bias if bias is not NULL else Arg("addr", zeros[0].ctypes.data)
        base = dict(lo=bounds[0], hi=bounds[1])

        def tasks(count: int) -> list[tuple[int, ...]] | None:
            if count < 2 or n * c < count or n * c * out_hw[0] * out_hw[1] < PARALLEL_ELEMENTS:
                return None
            return [depthwise_dims(n, c, (h, wd), out_hw, strides, (pads[0], pads[1]), **base, task=t, tasks=count)
                    for t in range(count)]

        call = Call(native_function("md_depthwise"), (x, w, b, out),
                    depthwise_dims(n, c, (h, wd), out_hw, strides, (pads[0], pads[1]), **base),
                    "depthwise 3x3" + (" + bounds" if bounds != (-math.inf, math.inf) else ""), tasks)
        return NativeStep((call,), (), tuple(zeros))

    return needing(lower, *needs(otherwise), "md_depthwise")


__all__ = ["activation_form", "conv1x1_step", "depthwise3x3", "depthwise_lowering", "epilogue_form", "pointwise",
           "pointwise_lowering"]
