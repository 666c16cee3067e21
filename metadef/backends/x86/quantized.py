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
are the product's rows), ``B`` 2-D. Without AVX512-VNNI the kernels run on AVX2 (their 8-bit dot
products as 16-bit ones, as exact); anything else (a host with neither included) says why and
runs its reference kernel.

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

from metadef.backends.x86.choice import attrs_of
from metadef.backends.x86.native import PARALLEL_ELEMENTS, Arg, Call, NativeStep, Shape, needing
from metadef.backends.x86.quantized_activations import activations_lowering, activations_product
from metadef.codegen.native import ENTRY, native_function
from metadef.codegen.native_qconv import qconv_dims, qconv_units, qconvi_dims, qpack_dims
from metadef.codegen.native_qgemm import (
    MAX_DEPTH,
    QGEMM_PANEL,
    has_int8_products,
    int8_isa,
    pack_qgemm_weights,
    qgemm_dims,
)
from metadef.core.dtypes import from_numpy
from metadef.ir import Node
from metadef.ops import infer_types
from metadef.ops.defs.nn_pool import window
from metadef.ops.defs.quantized import saturation
from metadef.ops.numpy_eval import run_node
from metadef.shape import TensorType


@dataclass(frozen=True)
class QGemmPlan:
    """What ``md_qgemm`` needs of a QLinearMatMul node: the packed weights, the int32
    correction and float32 multiplier a column (padded to whole panels), the output's zero
    point and range, and whether the activations are int8."""

    k: int
    n: int
    packed: np.ndarray | None
    corr: np.ndarray
    mult: np.ndarray
    zy: float
    lo: float
    hi: float
    flip: bool
    out_dtype: np.dtype
    weights: np.ndarray | None = None
    """Without int8 products (``packed`` None): the weights less their zero point, float32 ``[k, n]``."""

    def dims(self, m: int, task: int = 0, tasks: int = 1) -> tuple[int, ...]:
        return qgemm_dims(m, self.n, self.k, lo=self.lo, hi=self.hi, zy=self.zy, flip=self.flip, task=task,
                          tasks=tasks)

    def tasks(self, m: int, count: int) -> list[tuple[int, ...]] | None:
        return panel_tasks(self, m, count)


NO_INT8 = "this CPU has neither AVX512-VNNI nor AVX2 (md_qgemm's and md_qconv's int8 dot products)"

EXACT_DEPTH = 512
"""Depths over which float32 sums products of 8-bit values exactly (255 * 128 * 512 < 2**24)."""


def exact_product(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``a @ w`` for float32 matrices of 8-bit integer values (``a`` 0..255 or -128..127, ``w``
    -128..127), exact, in int64: float32 products (BLAS) over chunks of :data:`EXACT_DEPTH`
    depths, each sum exact, added as integers. The path of a host with neither AVX512-VNNI nor AVX2.

    Example:
        >>> a = np.full((1, 2000), 255, np.float32)
        >>> int(exact_product(a, np.full((2000, 1), 127, np.float32))[0, 0]) == 255 * 127 * 2000
        True
    """
    acc = np.zeros((a.shape[0], w.shape[1]), np.int64)
    for k0 in range(0, a.shape[1], EXACT_DEPTH):
        acc += (a[:, k0:k0 + EXACT_DEPTH] @ w[k0:k0 + EXACT_DEPTH]).astype(np.int64)
    return acc


def requantized(acc: np.ndarray, mult: np.ndarray, plan: Any) -> np.ndarray:
    """The reference's requantization of int32 sums ``acc`` with ``mult`` (broadcast on the last axis)."""
    scaled = np.rint(acc.astype(np.int32).astype(np.float32) * mult) + np.float32(plan.zy)
    return np.clip(scaled, plan.lo, plan.hi).astype(plan.out_dtype)


def _per_tensor(value: np.ndarray | None) -> bool:
    return value is not None and np.size(value) == 1 and np.ndim(value) <= 1


def constants(node: Node) -> list[np.ndarray | None]:
    """The values of ``node``'s constant inputs (None for the others)."""
    return [None if v is None else v.const for v in node.inputs]


def activations_refusal(node: Node, native: bool) -> str | None:
    """Why an 8-bit product plan cannot be made for ``node`` before its operands are read: no
    int8 products (:data:`NO_INT8`) where ``native`` is asked for, or activations that are not 8-bit of a known rank."""
    if native and not has_int8_products():
        return NO_INT8
    a = node.inputs[0].type if node.inputs[0] is not None else None
    if a is None or a.shape is None or not a.shape or a.dtype.numpy not in (np.uint8, np.int8):
        return "the activations' type or rank is unknown"
    return None


def qgemm_plan(node: Node, values: Sequence[np.ndarray | None], native: bool = True) -> QGemmPlan | str:
    """The :class:`QGemmPlan` of a ``QLinearMatMul`` or ``com.microsoft::QGemm`` node whose
    inputs have ``values`` (None: not a constant), or why it cannot run as ``md_qgemm``
    (``native`` False: the plan of :func:`exact_product`'s path, which needs no int8 products)."""
    refusal = activations_refusal(node, native)
    if refusal:
        return refusal
    a = node.inputs[0].type
    get = list(values) + [None] * (9 - len(values))
    bias, alpha = None, 1.0
    if node.op == "QGemm":
        attrs = attrs_of(node)
        if attrs["transA"]:
            return "a QGemm of A transposed runs its reference kernel"
        if len(node.inputs) < 8 or node.inputs[7] is None:
            return "a QGemm with a float output runs its reference kernel"
        if len(node.inputs) > 6 and node.inputs[6] is not None and get[6] is None:
            return "the bias C is not a constant"
        sa, za, w, sw, zw, bias, sy, zy = get[1:9]
        w = None if w is None else (np.asarray(w).T if attrs["transB"] else np.asarray(w))
        alpha = float(attrs["alpha"])
    else:
        sa, za, w, sw, zw, sy, zy = get[1:8]
    if w is None or np.ndim(w) != 2:
        return "the weights are not a constant 2-D tensor"
    if not all(_per_tensor(v) for v in (sa, za, sy, zy)):
        return "the activations' or the output's scale or zero point is not one constant"
    k, n = w.shape
    if sw is None or zw is None or np.size(sw) not in (1, n) or np.size(zw) not in (1, n) or np.ndim(sw) > 1:
        return "the weights' scale or zero point is not one constant or one a column"
    if bias is not None and np.size(bias) not in (1, n):
        return "the bias C is not one value or one a column"
    if not 4 <= k <= MAX_DEPTH:
        return f"depth {k} is outside md_qgemm's [4, {MAX_DEPTH}]"
    shifted = np.asarray(w, np.int32) - np.asarray(zw, np.int32).reshape(-1)
    if shifted.min(initial=0) < -128 or shifted.max(initial=0) > 127:
        return "the weights less their zero point do not fit in int8"
    flip = a.dtype.numpy == np.int8 and native
    packed, colsum = pack_qgemm_weights(shifted.astype(np.int8)) if native else (None, shifted.sum(axis=0))
    width = -(-n // QGEMM_PANEL) * QGEMM_PANEL
    corr = np.zeros(width, np.int64)
    corr[:n] = -(int(np.asarray(za).reshape(())) + (128 if flip else 0)) * colsum
    if bias is not None:
        corr[:n] += np.asarray(bias, np.int64).reshape(-1)
    if np.abs(corr).max(initial=0) >= 2**31:
        return "the bias and the zero point's correction do not fit in int32"
    mult = np.zeros(width, np.float32)
    # the reference's multiplier exactly: (a_scale * b_scale) / y_scale in float32 (alpha first for QGemm)
    scale = np.asarray(sa, np.float32).reshape(()) * np.asarray(sw, np.float32).reshape(-1)
    if node.op == "QGemm":
        scale = np.float32(alpha) * np.asarray(sa, np.float32).reshape(()) * np.asarray(sw, np.float32).reshape(-1)
    mult[:n] = scale / np.asarray(sy, np.float32).reshape(())
    out = np.asarray(zy).dtype
    bounds = saturation(out)
    if bounds is None or out not in (np.uint8, np.int8):
        return f"the output is {out}, not uint8 or int8"
    return QGemmPlan(k, n, packed, corr.astype(np.int32), mult, float(np.asarray(zy).reshape(())), *bounds, flip,
                     out, None if native else shifted.astype(np.float32))


def qgemm_function(node: Node) -> Any:
    """The node's product step by step (outside a native program): one ``md_qgemm`` call, its
    plan made from the first call's constants (a group's anchor sees them only then), or the
    reference where they do not fit."""
    native = has_int8_products()
    address = native_function("md_qgemm") if native else 0
    plans: list[tuple[Sequence[Any], QGemmPlan | str]] = []

    def run(args: Sequence[np.ndarray | None]) -> np.ndarray:
        if not plans or any(x is not y for x, y in zip(plans[0][0], args[1:])):
            plans[:] = [(list(args[1:]), qgemm_plan(node, [None, *args[1:]], native))]
        plan = plans[0][1]
        if isinstance(plan, str):
            return activations_product(node, args, _reference)
        if plan.weights is not None:
            a = np.asarray(args[0])
            acc = exact_product(a.reshape(-1, plan.k).astype(np.float32), plan.weights) + plan.corr[:plan.n]
            return requantized(acc, plan.mult[:plan.n], plan).reshape(*a.shape[:-1], plan.n)
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


def panel_tasks(plan: Any, m: int, count: int) -> list[tuple[int, ...]] | None:
    """A product plan's ``count`` calls over ``m`` rows, each a share of the 32-column panels
    (``plan.dims(m, task, tasks)``); None where it is too small to split."""
    panels = -(-plan.n // QGEMM_PANEL)
    if count < 2 or panels < count or m * plan.n * plan.k < 64 * PARALLEL_ELEMENTS:
        return None
    return [plan.dims(m, t, count) for t in range(count)]


def rows_lowering(routine: str, plan: Any, args: tuple[Arg, ...], label: str) -> Any:
    """A product over the activations' rows (all axes but the last) in a native program: one
    ``routine`` call with ``args``, split over the plan's panels (``plan.dims``, ``plan.tasks``)."""

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape], symbols: Mapping[str, int]
              ) -> NativeStep | str:
        shape = inputs[0]
        if shape is None:
            return "the activations are absent"
        m = math.prod(shape[:-1])
        if m == 0:
            return NativeStep(())
        call = Call(native_function(routine), args, plan.dims(m), label, lambda count: plan.tasks(m, count))
        return NativeStep((call,), keep=(plan,))

    return needing(lower, routine)


def qgemm_lowering(plan: QGemmPlan, a: Arg, out: Arg) -> Any:
    """The node in a native program: one ``md_qgemm`` call (split over the panels)."""
    args = (a, Arg("addr", plan.packed.ctypes.data), Arg("addr", plan.corr.ctypes.data),
            Arg("addr", plan.mult.ctypes.data), out)
    return rows_lowering("md_qgemm", plan, args, "qgemm own kernel (int8)")


def qlinear_matmul_kernel(attrs: Mapping[str, Any], node: Node) -> tuple[Any, str]:
    """``contraction_kernels``' entry: the step-by-step function, or None and why not."""
    values = constants(node)
    native = has_int8_products()
    plan = qgemm_plan(node, values, native) if values[3] is not None else None  # (in a group: known at run time)
    b = node.inputs[3].type if len(node.inputs) > 3 and node.inputs[3] is not None else None
    if plan is None and node.op == "QLinearMatMul" and b is not None and b.shape is not None and len(b.shape) != 2:
        return qgemm_function(node), ("exact integer products of two activations: md_widen8, md_bmm, md_requant8 "
                                      "up to a depth of 256, else float32 sgemm in chunks from Python")
    if isinstance(plan, str):
        return None, plan
    if not native:
        return qgemm_function(node), f"exact integer products through float32 sgemm ({NO_INT8})"
    return qgemm_function(node), f"md_qgemm (our int8 kernel, {int8_isa()})"


def qlinear_matmul_native(node: Node, sources: Sequence[Arg], out: Arg, consts: Sequence[np.ndarray | None]
                          ) -> Any:
    """``native_contractions``' entry: the node's lowering, or None."""
    plan = qgemm_plan(node, consts)
    return activations_lowering(node, sources, out, consts) if isinstance(plan, str) else \
        qgemm_lowering(plan, sources[0], out)


# ------------------------------------------------------------------------------- QLinearConv


@dataclass(frozen=True)
class QConvPlan:
    """What ``md_qpack`` and ``md_qconv`` need of a QLinearConv node: its window, the weights
    as int8 rows of ``ceil(depth/4)*4`` (less their zero point), the int32 correction (bias less
    what the activations' zero point takes away) and float32 multiplier a channel, the output's
    zero point and range, the activations' zero point (the padding) and whether they are int8."""

    attrs: Mapping[str, Any]
    kernel: tuple[int, int]
    channels: int
    depth: int
    weights: np.ndarray
    corr: np.ndarray
    mult: np.ndarray
    zy: float
    lo: float
    hi: float
    fill: int | None
    flip: bool
    out_dtype: np.dtype
    portable: bool = False
    """Without int8 products: ``weights`` are float32 and :func:`exact_product` runs the product."""
    pixel_rows: bool = False
    """``md_qconvt`` runs the product (:func:`pixel_rows`): ``weights`` are ``md_qgemm``'s panels,
    ``corr`` and ``mult`` padded to whole panels."""
    integer: bool = False
    """A ``ConvInteger``: ``md_qconvi`` gives the int32 sums; ``corr`` holds each channel's weight
    sum, ``fill`` None where the activations' zero point comes at run time (the third arg of
    ``md_qpack``, the fourth of ``md_qconvi``)."""

    groups: int = 1
    """A grouped conv (depthwise too): each group its own ``md_qpack`` + ``md_qconv`` /
    ``md_qconvi`` calls, over its channels (``channels`` counts all groups' outputs, ``depth``
    one group's taps)."""

    @property
    def routine(self) -> str:
        return "md_qconvi" if self.integer else "md_qconvt" if self.pixel_rows else "md_qconv"

    def units(self, p: int) -> int:
        """What the product's tasks share: panels of 32 channels, or blocks of pixels x chunks of channels."""
        return -(-self.channels // QGEMM_PANEL) if self.pixel_rows else qconv_units(self.channels // self.groups, p)

    def steps(self, x: Sequence[int], out_hw: tuple[int, int]) -> list[tuple[tuple[int, ...], tuple[int, ...]]] | str:
        """Per image: the dims of its ``md_qpack`` and ``md_qconv`` calls (or why not)."""
        n, c, h, w = x
        c //= self.groups
        win = window(self.attrs, (h, w), self.kernel)
        begin = tuple(int(v) for v in win.begin)
        if min(begin) < 0 or min(int(v) for v in win.end) < 0:
            return "negative padding"
        if self.kernel == (1, 1) and tuple(win.strides) == (1, 1) and not any(begin) and out_hw == (h, w):
            h, w, out_hw = 1, h * w, (1, h * w)  # (a pointwise conv packs its planes as one row each)
        pack = qpack_dims(c, h, w, self.kernel, tuple(win.strides), tuple(win.dilations), begin, out_hw,  # type: ignore[arg-type]
                          fill=self.fill, flip=self.flip)
        conv = qconvi_dims(self.channels // self.groups, self.depth, out_hw[0] * out_hw[1], flip=self.flip) \
            if self.integer else \
            qconv_dims(self.channels // self.groups, self.depth, out_hw[0] * out_hw[1], lo=self.lo, hi=self.hi,
                       zy=self.zy)
        return [(pack, conv)] * n

    def scratch(self, out_hw: tuple[int, int]) -> int:
        p = out_hw[0] * out_hw[1]
        return -(-self.depth // 4) * -(-p // QGEMM_PANEL) * QGEMM_PANEL * 4 + 64


def pixel_rows(channels: int, p: int) -> bool:
    """Whether a conv of ``channels`` outputs over ``p`` pixels runs as ``md_qconvt`` (the
    pixels as the tile's rows): where ``md_qconv``'s blocks of 32 pixels would waste a fifth of
    their lanes or more (a 7 x 7 plane: 49 pixels in 64 lanes; ``md_qconvt`` ran ResNet-50's
    layer4 convs 13-20 % faster) and fewer of ``md_qconvt``'s panels of 32 channels.

    Example:
        >>> pixel_rows(2048, 7 * 7), pixel_rows(256, 14 * 14), pixel_rows(8, 7 * 7)
        (True, False, False)
    """
    p32, k32 = -(-p // QGEMM_PANEL) * QGEMM_PANEL, -(-channels // QGEMM_PANEL) * QGEMM_PANEL
    return (p32 - p) * 5 >= p32 and (k32 - channels) * p32 < (p32 - p) * k32


def _padded(v: np.ndarray) -> np.ndarray:
    out = np.zeros(-(-len(v) // QGEMM_PANEL) * QGEMM_PANEL, v.dtype)
    out[:len(v)] = v
    return out


def _aligned_rows(w: np.ndarray) -> np.ndarray:
    """``w [k, q]`` (int8) as rows of ``ceil(q/4)*4`` bytes, zero-padded, 64-byte aligned."""
    k, q = w.shape
    width = -(-q // 4) * 4
    raw = np.zeros(k * width + 64, np.int8)
    start = -raw.ctypes.data % 64
    out = raw[start:start + k * width].reshape(k, width)
    out[:, :q] = w
    return out


def qconv_plan(node: Node, values: Sequence[np.ndarray | None], native: bool = True) -> QConvPlan | str:
    """The :class:`QConvPlan` of a ``QLinearConv`` node whose inputs have ``values`` (None: not
    a constant), or why it cannot run as ``md_qpack`` + ``md_qconv`` (``native`` False: the
    plan of :func:`exact_product`'s path, which needs no int8 products)."""
    if native and not has_int8_products():
        return NO_INT8
    x = node.inputs[0].type if node.inputs[0] is not None else None
    if x is None or x.shape is None or len(x.shape) != 4 or x.dtype.numpy not in (np.uint8, np.int8):
        return "only 2-D convolutions of 8-bit activations run as md_qconv"
    sx, zx, w, sw, zw, sy, zy = (values[i] if i < len(values) else None for i in range(1, 8))
    bias = values[8] if len(values) > 8 else None
    attrs = attrs_of(node)
    groups = int(attrs.get("group") or 1)
    if groups > 1 and not native:
        return "a grouped QLinearConv without int8 products runs its reference kernel"
    if w is None or np.ndim(w) != 4:
        return "the weights are not a constant 4-D tensor"
    if not all(_per_tensor(v) for v in (sx, zx, sy, zy)):
        return "the activations' or the output's scale or zero point is not one constant"
    k = w.shape[0]
    if sw is None or zw is None or np.size(sw) not in (1, k) or np.size(zw) not in (1, k):
        return "the weights' scale or zero point is not one constant or one an output channel"
    if len(node.inputs) > 8 and node.inputs[8] is not None and bias is None:
        return "the bias is not a constant"
    depth = int(np.prod(w.shape[1:]))
    if depth > MAX_DEPTH:
        return f"depth {depth} is above md_qconv's {MAX_DEPTH}"
    shifted = np.asarray(w, np.int32).reshape(k, depth) - np.asarray(zw, np.int32).reshape(-1, 1)
    if shifted.min(initial=0) < -128 or shifted.max(initial=0) > 127:
        return "the weights less their zero point do not fit in int8"
    out = np.asarray(zy).dtype
    bounds = saturation(out)
    if bounds is None or out not in (np.uint8, np.int8):
        return f"the output is {out}, not uint8 or int8"
    flip = x.dtype.numpy == np.int8 and native
    fill = int(np.asarray(zx).reshape(()))
    corr = (np.zeros(k, np.int64) if bias is None else np.asarray(bias, np.int64).reshape(-1)) \
        - (fill + 128 * flip) * shifted.sum(axis=1)
    if np.abs(corr).max(initial=0) >= 2**31:
        return "the bias and the zero point's correction do not fit in int32"
    # the reference's multiplier exactly: (x_scale * w_scale) / y_scale in float32
    mult = np.asarray(sx, np.float32).reshape(()) * np.broadcast_to(np.asarray(sw, np.float32).reshape(-1), (k,)) \
        / np.asarray(sy, np.float32).reshape(())
    kernel = tuple(int(v) for v in (attrs.get("kernel_shape") or w.shape[2:]))
    y = node.outputs[0].type
    hw = tuple(y.shape[2:]) if y is not None and y.shape is not None else ()
    rows = native and groups == 1 and len(hw) == 2 and all(isinstance(v, int) for v in hw) \
        and pixel_rows(k, hw[0] * hw[1])
    corr, mult = corr.astype(np.int32), np.ascontiguousarray(mult, np.float32)
    if rows:
        weights, corr, mult = pack_qgemm_weights(shifted.T.astype(np.int8))[0], _padded(corr), _padded(mult)
    else:
        weights = _aligned_rows(shifted.astype(np.int8)) if native else shifted.T.astype(np.float32)
    return QConvPlan(attrs, kernel, k, depth, weights, corr, mult, float(np.asarray(zy).reshape(())),  # type: ignore[arg-type]
                     *bounds, fill, flip, out, not native, rows, groups=groups)


def _pack_tasks(dims: tuple[int, ...], groups: int, count: int) -> list[tuple[int, ...]] | None:
    if count < 2 or groups < count or groups * dims[-5] * 4 < 4 * PARALLEL_ELEMENTS:
        return None
    return [(*dims[:-2], t, count) for t in range(count)]


def _conv_tasks(dims: tuple[int, ...], units: int, count: int) -> list[tuple[int, ...]] | None:
    if count < 2 or units < count:
        return None
    return [(*dims[:-2], t, count) for t in range(count)]


def qconv_lowering(plan: QConvPlan, x: Arg, out: Arg, zero: Arg | None = None) -> Any:
    """The node in a native program: per image, ``md_qpack`` into the scratch, then ``md_qconv``
    (a ConvInteger: ``md_qconvi``, the activations' zero point read at ``zero``)."""

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape], symbols: Mapping[str, int]
              ) -> NativeStep | str:
        shape = inputs[0]
        if shape is None or len(outputs[0]) != 4:
            return "the activations are absent"
        out_hw = (int(outputs[0][2]), int(outputs[0][3]))
        steps = plan.steps(shape, out_hw)
        if isinstance(steps, str):
            return steps
        _, c, h, w = shape
        p = out_hw[0] * out_hw[1]
        groups, units = -(-plan.depth // 4), plan.units(p)
        scratch = Arg("scratch", 0)
        pack_fn, conv_fn = native_function("md_qpack"), native_function(plan.routine)
        calls = []
        cg, kg, size = c // plan.groups, plan.channels // plan.groups, plan.out_dtype.itemsize
        rows = plan.weights.shape[1] * kg  # (bytes of a group's weights)
        split = plan.groups == 1  # (a group's calls are small: split across threads they ran 30 % slower)
        for i, (pack, conv) in enumerate(steps):
            for g in range(plan.groups):
                calls.append(Call(pack_fn, (x.at((i * c + g * cg) * h * w), scratch,
                                            *(() if zero is None else (zero,))), pack,
                                  "qconv pack (int8)",
                                  lambda count, dims=pack: _pack_tasks(dims, groups, count) if split else None))
                calls.append(Call(conv_fn, (scratch, Arg("addr", plan.weights.ctypes.data + g * rows),
                                            Arg("addr", plan.corr.ctypes.data + 4 * g * kg),
                                            (zero if zero is not None else Arg("addr", plan.mult.ctypes.data))
                                            if plan.integer else Arg("addr", plan.mult.ctypes.data + 4 * g * kg),
                                            out.at((i * plan.channels + g * kg) * p * size)), conv,
                                  "qconv own kernel (int8" + (", pixel rows)" if plan.pixel_rows else
                                                              ", int32 sums)" if plan.integer else ")"),
                                  lambda count, dims=conv: _conv_tasks(dims, units, count) if split else None))
        return NativeStep(tuple(calls), (plan.scratch(out_hw),) if calls else (), keep=(plan,))

    return needing(lower, "md_qpack", plan.routine)


def qconv_function(node: Node) -> Any:
    """The node step by step: ``md_qpack`` and ``md_qconv`` per image, the plan made from the
    first call's constants, or the reference where they do not fit."""
    native = has_int8_products()
    plans: list[tuple[Sequence[Any], QConvPlan | str]] = []

    def run(args: Sequence[np.ndarray | None]) -> np.ndarray:
        if not plans or any(x is not y for x, y in zip(plans[0][0], args[1:])):
            plans[:] = [(list(args[1:]), qconv_plan(node, [None, *args[1:]], native))]
        plan = plans[0][1]
        t = node.outputs[0].type
        if isinstance(plan, str) or t is None or t.shape is None:
            return _reference(node, args)
        x = np.ascontiguousarray(args[0])
        win = window(plan.attrs, x.shape[2:], plan.kernel)
        out_hw = tuple(int((size + int(b0) + int(e0) - d * (kk - 1) - 1) // s + 1) for size, b0, e0, d, kk, s in
                       zip(x.shape[2:], win.begin, win.end, win.dilations, plan.kernel, win.strides))
        if plan.portable:
            return _portable_conv(plan, x, win, out_hw)  # type: ignore[arg-type]
        y = np.empty((x.shape[0], plan.channels, *out_hw), plan.out_dtype)
        steps = plan.steps(x.shape, out_hw)  # type: ignore[arg-type]
        if isinstance(steps, str):
            return _reference(node, args)
        raw = np.empty(plan.scratch(out_hw), np.uint8)
        scratch = raw[-raw.ctypes.data % 64:]
        cg, kg = x.shape[1] // plan.groups, plan.channels // plan.groups
        for i, (pack, conv) in enumerate(steps):
            for g in range(plan.groups):
                xi, yi = x[i, g * cg:(g + 1) * cg], y[i, g * kg:(g + 1) * kg]
                ENTRY(native_function("md_qpack"))((ctypes.c_void_p * 2)(xi.ctypes.data, scratch.ctypes.data),
                                                   (ctypes.c_int64 * len(pack))(*pack))
                pointers = (ctypes.c_void_p * 5)(scratch.ctypes.data, plan.weights[g * kg:].ctypes.data,
                                                 plan.corr[g * kg:].ctypes.data, plan.mult[g * kg:].ctypes.data,
                                                 yi.ctypes.data)
                ENTRY(native_function(plan.routine))(pointers, (ctypes.c_int64 * len(conv))(*conv))
        return y

    return run


def _portable_conv(plan: QConvPlan, x: np.ndarray, win: Any, out_hw: tuple[int, int]) -> np.ndarray:
    """The conv without int8 products: each output pixel's taps (the padding the zero point) as a row,
    times the weights by :func:`exact_product`, requantized per channel."""
    n, c = x.shape[:2]
    (kh, kw), (sh, sw), (dh, dw) = plan.kernel, tuple(win.strides), tuple(win.dilations)
    begin, end = [int(v) for v in win.begin], [int(v) for v in win.end]
    padded = np.pad(x.astype(np.float32), [(0, 0), (0, 0), (begin[0], end[0]), (begin[1], end[1])],
                    constant_values=plan.fill)
    windows = np.lib.stride_tricks.sliding_window_view(padded, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(2, 3))
    taps = windows[:, :, :out_hw[0] * sh:sh, :out_hw[1] * sw:sw, ::dh, ::dw]  # [n, c, oh, ow, kh, kw]
    rows = taps.transpose(0, 2, 3, 1, 4, 5).reshape(n * out_hw[0] * out_hw[1], c * kh * kw)
    acc = exact_product(rows, plan.weights) + plan.corr
    y = requantized(acc, plan.mult, plan).reshape(n, out_hw[0], out_hw[1], plan.channels)
    return np.ascontiguousarray(y.transpose(0, 3, 1, 2))


def _reference(node: Node, args: Sequence[np.ndarray | None]) -> np.ndarray:
    """The node's reference kernel on these arguments (their types concrete)."""
    attrs = attrs_of(node)
    types = [None if a is None else TensorType(from_numpy(a.dtype), a.shape) for a in args]
    outs = infer_types(node.metaop, node.name, types, node.attrs)
    return run_node(node.metaop, attrs, list(args), outs, node.name)[0]


def qlinear_conv_kernel(attrs: Mapping[str, Any], node: Node) -> tuple[Any, str]:
    """``contraction_kernels``' entry for QLinearConv."""
    values = constants(node)
    native = has_int8_products()
    plan = qconv_plan(node, values, native) if values[3] is not None else None
    if isinstance(plan, str):
        return None, plan
    if not native:
        return qconv_function(node), f"exact integer products through float32 sgemm ({NO_INT8})"
    isa = int8_isa()
    kernel = f"md_qconvt (our int8 kernel, {isa}, the pixels as its rows)" if plan is not None \
        and plan.pixel_rows else f"md_qconv (our int8 kernel, {isa})"
    return qconv_function(node), f"{kernel}, input packed by md_qpack"


def qlinear_conv_native(node: Node, sources: Sequence[Arg], out: Arg, consts: Sequence[np.ndarray | None]) -> Any:
    """``native_contractions``' entry for QLinearConv."""
    plan = qconv_plan(node, consts)
    return None if isinstance(plan, str) else qconv_lowering(plan, sources[0], out)


__all__ = ["EXACT_DEPTH", "NO_INT8", "QConvPlan", "QGemmPlan", "constants", "exact_product", "panel_tasks",
           "qconv_lowering", "rows_lowering",
           "qconv_plan", "pixel_rows", "qgemm_function", "qgemm_lowering", "qgemm_plan", "qlinear_conv_kernel",
           "qlinear_conv_native", "qlinear_matmul_kernel", "qlinear_matmul_native", "requantized"]
