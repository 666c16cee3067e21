"""Quantized products on x86: a ``QLinearMatMul`` with constant weights as one ``md_qgemm``.

ONNX Runtime's quantizer writes a quantized layer as ``DequantizeLinear -> MatMul -> QuantizeLinear``
(QDQ), which the optimizer turns into ``QLinearMatMul``
(:mod:`metadef.passes.recognize_quantized`); models in ONNX's QOperator form have the op
itself. Its weights (int8, or uint8 whose values less the zero point fit in int8) are packed
once for :mod:`~metadef.codegen.native_qgemm`'s panels; the activations' zero point and the
weights' become an int32 correction a column, the scales one float32 multiplier a column,
computed as the reference computes them (``a_scale * b_scale / y_scale`` in float32), so the
result is the reference's bit for bit. Activations are uint8 or int8 with one scale and zero
point; the weights' scale and zero point per tensor or per column; ``A`` of any rank (its rows
are the product's rows), ``B`` 2-D. Anything else (no AVX512-VNNI on the host included) says
why and runs its reference kernel.

Example:
    >>> import numpy as np
    >>> from metadef.ir import GraphBuilder
    >>> from metadef.shape import parse_type
    >>> b = GraphBuilder("g")
    >>> c = lambda name, v: b.const(name, np.asarray(v))
    >>> y, = b.node("QLinearMatMul", [b.input("a", parse_type("u8[n,64]")), c("sa", np.float32(0.1)),
    ...     c("za", np.uint8(3)), c("w", np.ones((64, 16), np.int8)), c("sw", np.float32(0.01)),
    ...     c("zw", np.int8(0)), c("sy", np.float32(0.2)), c("zy", np.uint8(128))])
    >>> b.output(y)
    >>> node = b.build().nodes[0]
    >>> plan = qgemm_plan(node, constants(node))
    >>> isinstance(plan, str) or plan.corr[:2].tolist() == [-3 * 64, -3 * 64]
    True
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from metadef.backends.x86.native import PARALLEL_ELEMENTS, Arg, Call, NativeStep, Shape, needing
from metadef.codegen.native import ENTRY, native_function
from metadef.codegen.native_qgemm import MAX_DEPTH, QGEMM_PANEL, has_vnni, pack_qgemm_weights, qgemm_dims
from metadef.ir import Node
from metadef.ops.defs.quantized import qlinear_matmul_reference, saturation


@dataclass(frozen=True)
class QGemmPlan:
    """What ``md_qgemm`` needs of a QLinearMatMul node: the packed weights, the int32
    correction and float32 multiplier a column (padded to whole panels), the output's zero
    point and range, and whether the activations are int8."""

    k: int
    n: int
    packed: np.ndarray
    corr: np.ndarray
    mult: np.ndarray
    zy: float
    lo: float
    hi: float
    flip: bool
    out_dtype: np.dtype

    def dims(self, m: int, task: int = 0, tasks: int = 1) -> tuple[int, ...]:
        return qgemm_dims(m, self.n, self.k, lo=self.lo, hi=self.hi, zy=self.zy, flip=self.flip, task=task,
                          tasks=tasks)

    def tasks(self, m: int, count: int) -> list[tuple[int, ...]] | None:
        panels = -(-self.n // QGEMM_PANEL)
        if count < 2 or panels < count or m * self.n * self.k < 64 * PARALLEL_ELEMENTS:
            return None
        return [self.dims(m, t, count) for t in range(count)]


def _per_tensor(value: np.ndarray | None) -> bool:
    return value is not None and np.size(value) == 1 and np.ndim(value) <= 1


def constants(node: Node) -> list[np.ndarray | None]:
    """The values of ``node``'s constant inputs (None for the others)."""
    return [None if v is None else v.const for v in node.inputs]


def qgemm_plan(node: Node, values: Sequence[np.ndarray | None]) -> QGemmPlan | str:
    """The :class:`QGemmPlan` of a ``QLinearMatMul`` node whose inputs have ``values`` (None:
    not a constant), or why it cannot run as ``md_qgemm``."""
    if not has_vnni():
        return "this CPU has no AVX512-VNNI (md_qgemm's int8 dot products)"
    a = node.inputs[0].type if node.inputs[0] is not None else None
    if a is None or a.shape is None or not a.shape or a.dtype.numpy not in (np.uint8, np.int8):
        return "the activations' type or rank is unknown"
    sa, za, w, sw, zw, sy, zy = (values[i] if i < len(values) else None for i in range(1, 8))
    if w is None or np.ndim(w) != 2:
        return "the weights are not a constant 2-D tensor"
    if not all(_per_tensor(v) for v in (sa, za, sy, zy)):
        return "the activations' or the output's scale or zero point is not one constant"
    k, n = w.shape
    if sw is None or zw is None or np.size(sw) not in (1, n) or np.size(zw) not in (1, n) or np.ndim(sw) > 1:
        return "the weights' scale or zero point is not one constant or one a column"
    if not 4 <= k <= MAX_DEPTH:
        return f"depth {k} is outside md_qgemm's [4, {MAX_DEPTH}]"
    shifted = np.asarray(w, np.int32) - np.asarray(zw, np.int32).reshape(-1)
    if shifted.min(initial=0) < -128 or shifted.max(initial=0) > 127:
        return "the weights less their zero point do not fit in int8"
    flip = a.dtype.numpy == np.int8
    packed, colsum = pack_qgemm_weights(shifted.astype(np.int8))
    width = packed.shape[0] * QGEMM_PANEL
    corr = np.zeros(width, np.int32)
    corr[:n] = -(int(np.asarray(za).reshape(())) + (128 if flip else 0)) * colsum
    mult = np.zeros(width, np.float32)
    # the reference's multiplier exactly: (a_scale * b_scale) / y_scale in float32
    mult[:n] = np.asarray(sa, np.float32).reshape(()) * np.asarray(sw, np.float32).reshape(-1) \
        / np.asarray(sy, np.float32).reshape(())
    out = np.asarray(zy).dtype
    bounds = saturation(out)
    if bounds is None or out not in (np.uint8, np.int8):
        return f"the output is {out}, not uint8 or int8"
    return QGemmPlan(k, n, packed, corr, mult, float(np.asarray(zy).reshape(())), *bounds, flip, out)


def qgemm_function(node: Node) -> Any:
    """The node's product step by step (outside a native program): one ``md_qgemm`` call, its
    plan made from the first call's constants (a group's anchor sees them only then), or the
    reference where they do not fit."""
    address = native_function("md_qgemm")
    plans: list[tuple[Sequence[Any], QGemmPlan | str]] = []

    def run(args: Sequence[np.ndarray | None]) -> np.ndarray:
        if not plans or any(x is not y for x, y in zip(plans[0][0], args[1:])):
            plans[:] = [(list(args[1:]), qgemm_plan(node, [None, *args[1:]]))]
        plan = plans[0][1]
        if isinstance(plan, str):
            return qlinear_matmul_reference(list(args), {})
        a = np.ascontiguousarray(args[0])
        m = a.size // plan.k
        y = np.empty((*a.shape[:-1], plan.n), plan.out_dtype)
        if y.size:
            pointers = (ctypes.c_void_p * 5)(a.ctypes.data, plan.packed.ctypes.data, plan.corr.ctypes.data,
                                             plan.mult.ctypes.data, y.ctypes.data)
            dims = plan.dims(m)
            ENTRY(address)(pointers, (ctypes.c_int64 * len(dims))(*dims))
        return y

    return run


def qgemm_lowering(plan: QGemmPlan, a: Arg, out: Arg) -> Any:
    """The node in a native program: one ``md_qgemm`` call (split over the panels)."""

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape], symbols: Mapping[str, int]
              ) -> NativeStep | str:
        shape = inputs[0]
        if shape is None:
            return "the activations are absent"
        m = math.prod(shape[:-1])
        if m == 0:
            return NativeStep(())
        args = (a, Arg("addr", plan.packed.ctypes.data), Arg("addr", plan.corr.ctypes.data),
                Arg("addr", plan.mult.ctypes.data), out)
        call = Call(native_function("md_qgemm"), args, plan.dims(m), "qgemm own kernel (int8)",
                    lambda count: plan.tasks(m, count))
        return NativeStep((call,), keep=(plan,))

    return needing(lower, "md_qgemm")


def qlinear_matmul_kernel(attrs: Mapping[str, Any], node: Node) -> tuple[Any, str]:
    """``contraction_kernels``' entry: the step-by-step function, or None and why not."""
    values = constants(node)
    plan = qgemm_plan(node, values) if values[3] is not None else None  # (in a group: known at run time)
    if isinstance(plan, str):
        return None, plan
    if not has_vnni():
        return None, "this CPU has no AVX512-VNNI (md_qgemm's int8 dot products)"
    return qgemm_function(node), "md_qgemm (our int8 kernel, AVX512-VNNI)"


def qlinear_matmul_native(node: Node, sources: Sequence[Arg], out: Arg, consts: Sequence[np.ndarray | None]
                          ) -> Any:
    """``native_contractions``' entry: the node's lowering, or None."""
    plan = qgemm_plan(node, consts)
    return None if isinstance(plan, str) else qgemm_lowering(plan, sources[0], out)


__all__ = ["QGemmPlan", "constants", "qgemm_function", "qgemm_lowering", "qgemm_plan", "qlinear_matmul_kernel",
           "qlinear_matmul_native"]
