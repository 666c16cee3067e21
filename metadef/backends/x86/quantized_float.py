"""Integer products scaled to float32 on x86: ``MatMulIntegerToFloat`` (and ``QGemm`` without an
output scale) as one ``md_qgemmf``.

ONNX Runtime's ``quantize_dynamic`` (how most transformers are quantized for the CPU) writes
each linear layer as ``DynamicQuantizeLinear`` (the activations' scale and zero point from
their range, at run time) then ``MatMulInteger -> Cast -> Mul(a_scale * w_scale) -> Add(bias)``,
which the optimizer turns into ``com.microsoft::MatMulIntegerToFloat``
(:mod:`metadef.passes.recognize_quantized`). Its constant 8-bit weights (less their zero point,
which must leave them in int8) are packed once for :mod:`~metadef.codegen.native_qgemm`'s
panels, with their column sums; each call reads the activations' scale and zero point where the
graph computed them, and the kernel makes each panel's correction (``-za * colsum``) and
multiplier (``a_scale * w_scale``) before its tiles run, so the result is the reference's bit
for bit. ``QGemm`` with a float output is the same with both read from constants (``alpha`` in
the activations' scale, its int32 ``C`` in the correction). With neither AVX512-VNNI nor AVX2
the products run exact through float32 sgemm (:func:`~metadef.backends.x86.quantized.exact_product`); anything
else says why and runs its reference kernel.

Example:
    >>> import numpy as np
    >>> from metadef.ir import GraphBuilder
    >>> from metadef.shape import parse_type
    >>> b = GraphBuilder("g")
    >>> y, = b.node("MatMulIntegerToFloat", [b.input("a", parse_type("u8[n,64]")), b.const("w", np.ones((64, 16),
    ...     np.int8)), b.input("sa", parse_type("f32[]")), b.const("sw", np.float32(0.01))], domain="com.microsoft")
    >>> b.output(y)
    >>> node = b.build().nodes[0]
    >>> plan = qgemmf_plan(node, constants(node), native=False)
    >>> plan.k, plan.n, plan.colsum[:2].tolist()
    (64, 16, [64, 64])
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from metadef.backends.x86.choice import Choice, attrs_of
from metadef.backends.x86.native import Arg
from metadef.backends.x86.quantized import (
    NO_INT8,
    QConvPlan,
    _aligned_rows,
    _reference,
    activations_refusal,
    constants,
    exact_product,
    panel_tasks,
    qconv_lowering,
    qlinear_matmul_kernel,
    qlinear_matmul_native,
    rows_lowering,
)
from metadef.codegen.native import ENTRY, native_function
from metadef.codegen.native_qgemm import (
    MAX_DEPTH,
    QGEMM_PANEL,
    has_int8_products,
    int8_isa,
    pack_qgemm_weights,
    qgemmf_dims,
)
from metadef.ir import Node
from metadef.ops.defs.microsoft import attention_of_projection
from metadef.ops.defs.nn_pool import window
from metadef.shape import TensorType


@dataclass(frozen=True)
class QGemmFloatPlan:
    """What ``md_qgemmf`` needs of a node: the packed weights (less their zero point), and a
    column each (padded to whole panels) of the int32 base correction (QGemm's ``C``), the
    weights' int32 sums, their float32 scale and the float32 bias; the activations' scale and
    zero point where they are constants (None: read at run time), and whether they are int8."""

    k: int
    n: int
    packed: np.ndarray | None
    base: np.ndarray
    colsum: np.ndarray
    scale: np.ndarray
    bias: np.ndarray
    a_scale: np.ndarray | None
    a_zero: np.ndarray
    flip: bool
    weights: np.ndarray | None = None
    """Without int8 products (``packed`` None): the weights less their zero point, float32 ``[k, n]``."""
    rowterm: np.ndarray | None = None
    """uint8 weights whose zero point leaves them outside int8 (``wide``): packed as ``W - 128``,
    and ``128 - zero point`` a column, which ``md_qgemmf`` multiplies by each row's byte sum."""

    @property
    def wide(self) -> bool:
        return bool(self.rowterm is not None and self.rowterm.any())

    def dims(self, m: int, task: int = 0, tasks: int = 1) -> tuple[int, ...]:
        return qgemmf_dims(m, self.n, self.k, flip=self.flip, wide=self.wide, task=task, tasks=tasks)

    def tasks(self, m: int, count: int) -> list[tuple[int, ...]] | None:
        return panel_tasks(self, m, count)

    def portable(self, a: np.ndarray, a_scale: Any, a_zero: Any) -> np.ndarray:
        """The product without int8 products: exact int32 sums, scaled and biased as the kernel does."""
        assert self.weights is not None
        rows = np.asarray(a).reshape(-1, self.k).astype(np.float32)
        za = int(np.asarray(a_zero).reshape(())) if a_zero is not None else 0
        acc = exact_product(rows, self.weights) - za * self.colsum[:self.n].astype(np.int64) + self.base[:self.n]
        mult = np.float32(np.asarray(a_scale, np.float32).reshape(())) * self.scale[:self.n]
        y = acc.astype(np.int32).astype(np.float32) * mult + self.bias[:self.n]
        return y.astype(np.float32).reshape(*np.shape(a)[:-1], self.n)


def _padded(v: Any, n: int, dtype: type) -> np.ndarray:
    out = np.zeros(-(-n // QGEMM_PANEL) * QGEMM_PANEL, dtype)
    out[:n] = np.broadcast_to(np.asarray(v, dtype).reshape(-1), (n,))
    return out


def _one(value: np.ndarray | None) -> bool:
    return value is not None and np.size(value) == 1


def float_output(node: Node) -> bool:
    """Whether ``node`` (MatMulIntegerToFloat or QGemm) gives float32 (QGemm: no ``y_scale``)."""
    return node.op == "MatMulIntegerToFloat" or len(node.inputs) < 8 or node.inputs[7] is None


def qgemmf_plan(node: Node, values: Sequence[np.ndarray | None], native: bool = True) -> QGemmFloatPlan | str:
    """The :class:`QGemmFloatPlan` of a ``MatMulIntegerToFloat`` node, or of a ``QGemm`` with a
    float output, whose inputs have ``values`` (None: not a constant), or why it cannot run as
    ``md_qgemmf`` (``native`` False: the plan of the path without int8 products)."""
    refusal = activations_refusal(node, native)
    if refusal:
        return refusal
    a = node.inputs[0].type
    get = list(values) + [None] * (9 - len(values))
    given = [v is not None for v in node.inputs] + [False] * (9 - len(node.inputs))
    base = None
    if node.op == "QGemm":
        attrs = attrs_of(node)
        if attrs["transA"]:
            return "a QGemm of A transposed runs its reference kernel"
        sa, za, w, sw, zw, base = get[1:7]
        if not _one(sa) or (given[2] and not _one(za)) or (given[6] and base is None):
            return "the activations' scale and zero point, or C, are not constants"
        w = None if w is None else (np.asarray(w).T if attrs["transB"] else np.asarray(w))
        # the reference's (alpha * a_scale) * b_scale: alpha goes into the activations' scale
        a_scale: np.ndarray | None = np.float32(attrs["alpha"]) * np.asarray(sa, np.float32).reshape(1)
        bias = None
    else:
        w, sa, sw, za, zw, bias = get[1:7]
        a_scale = None if sa is None else np.asarray(sa, np.float32).reshape(1)
        if given[6] and bias is None:
            return "the bias is not a constant"
    if given[5 if node.op != "QGemm" else 3] and zw is None:
        return "the weights' zero point is not a constant"
    return float_plan(a.dtype.numpy, w, sw, zw, bias, base, a_scale, za, native)


def float_plan(a_dtype: np.dtype, w: np.ndarray | None, sw: np.ndarray | None, zw: np.ndarray | None,
               bias: np.ndarray | None, base: np.ndarray | None, a_scale: np.ndarray | None,
               za: np.ndarray | None, native: bool = True) -> QGemmFloatPlan | str:
    """The :class:`QGemmFloatPlan` of an integer product scaled to float: activations of
    ``a_dtype``, constant weights ``w [k, n]`` with their scale and zero point (``zw`` None: 0),
    a float32 ``bias`` and an int32 ``base`` (each None or a column each); the activations'
    scale and zero point where constant (None: read at run time). Or why it cannot run."""
    if w is None or np.ndim(w) != 2:
        return "the weights are not a constant 2-D tensor"
    k, n = w.shape
    if sw is None or np.size(sw) not in (1, n) or np.ndim(sw) > 1 or (zw is not None and np.size(zw) not in (1, n)):
        return "the weights' scale or zero point is not one constant or one a column"
    if bias is not None and np.size(bias) not in (1, n):
        return "the bias is not one value or one a column"
    if not 4 <= k <= MAX_DEPTH:
        return f"depth {k} is outside md_qgemmf's [4, {MAX_DEPTH}]"
    zeros = np.zeros(n, np.int32) if zw is None else np.broadcast_to(np.asarray(zw, np.int32).reshape(-1), (n,))
    shifted = np.asarray(w, np.int32) - zeros
    rowterm = np.zeros(n, np.int64)
    if shifted.min(initial=0) < -128 or shifted.max(initial=0) > 127:
        if not native or np.asarray(w).dtype != np.uint8 or 4 * 255 * 128 * k >= 2**31:
            return "the weights less their zero point do not fit in int8"
        # (W - zw) = (W - 128) + (128 - zw): the second part times each row's byte sum (md_qgemmf's ``wide``)
        shifted, rowterm = np.asarray(w, np.int32) - 128, 128 - zeros.astype(np.int64)
    flip = a_dtype == np.int8 and native
    packed, colsum = pack_qgemm_weights(shifted.astype(np.int8)) if native else (None, shifted.sum(axis=0))
    colsum = colsum + k * rowterm  # (the row term's share of the zero point's correction)
    c = np.zeros(n, np.int64) if base is None else np.broadcast_to(np.asarray(base, np.int64).reshape(-1), (n,))
    if np.abs(c).max(initial=0) + 256 * np.abs(colsum).max(initial=0) >= 2**31:
        return "C and the zero point's correction may not fit in int32"
    a_zero = np.zeros(1, a_dtype) if za is None else np.asarray(za, a_dtype).reshape(1)
    return QGemmFloatPlan(k, n, packed, _padded(c, n, np.int32), _padded(colsum, n, np.int32),
                          _padded(sw, n, np.float32), _padded(0.0 if bias is None else bias, n, np.float32), a_scale,
                          a_zero, flip, None if native else shifted.astype(np.float32), _padded(rowterm, n, np.int32))


def _runtime(node: Node) -> tuple[int | None, int | None]:
    """The input indices of the activations' scale and zero point, where the op reads them."""
    return (2, 4) if node.op == "MatMulIntegerToFloat" else (1, 2)


def qgemmf_function(node: Node) -> Any:
    """The node's product step by step: one ``md_qgemmf`` call (the plan made from the first
    call's constants), the exact sgemm path without VNNI, or the reference where they do not fit."""
    native = has_int8_products()
    plans: list[tuple[Sequence[Any], QGemmFloatPlan | str]] = []
    at_scale, at_zero = _runtime(node)

    def run(args: Sequence[np.ndarray | None]) -> np.ndarray:
        values = _planned(node, [None, *args[1:]])
        if not plans or any(x is not y for x, y in zip(plans[0][0], values)):
            plans[:] = [(values, qgemmf_plan(node, values, native))]
        plan = plans[0][1]
        if isinstance(plan, str):
            return _reference(node, args)
        sa = plan.a_scale if plan.a_scale is not None else args[at_scale]
        za = None if at_zero >= len(args) else args[at_zero]
        return run_plan(plan, args[0], sa, za)

    return run


def run_plan(plan: QGemmFloatPlan, a: Any, a_scale: Any, a_zero: Any) -> np.ndarray:
    """The plan's product of activations ``a`` (any rank, ``k`` last) with this scale and zero
    point (None: the plan's): one ``md_qgemmf`` call, or without VNNI the exact sgemm path."""
    sa = np.ascontiguousarray(np.asarray(a_scale, np.float32).reshape(1))
    za = plan.a_zero if a_zero is None else np.ascontiguousarray(np.asarray(a_zero).reshape(1))
    a = np.ascontiguousarray(a)
    if plan.weights is not None:
        return plan.portable(a, sa, za)
    m = a.size // plan.k
    y = np.empty((*a.shape[:-1], plan.n), np.float32)
    if y.size:
        pointers = (ctypes.c_void_p * 10)(a.ctypes.data, plan.packed.ctypes.data, plan.base.ctypes.data,
                                          plan.colsum.ctypes.data, plan.scale.ctypes.data, plan.bias.ctypes.data,
                                          plan.rowterm.ctypes.data, sa.ctypes.data, za.ctypes.data, y.ctypes.data)
        dims = plan.dims(m)
        ENTRY(native_function("md_qgemmf"))(pointers, (ctypes.c_int64 * len(dims))(*dims))
    return y


def qgemmf_lowering(node: Node, plan: QGemmFloatPlan, sources: Sequence[Arg], out: Arg) -> Any:
    """The node in a native program: one ``md_qgemmf`` call (split over the panels), the
    activations' scale and zero point read where the graph computes them."""
    at_scale, at_zero = _runtime(node)
    scale = Arg("addr", plan.a_scale.ctypes.data) if plan.a_scale is not None else sources[at_scale]
    zero = sources[at_zero] if at_zero < len(sources) and node.inputs[at_zero] is not None \
        and node.inputs[at_zero].const is None else Arg("addr", plan.a_zero.ctypes.data)

    args = (sources[0], *(Arg("addr", v.ctypes.data) for v in (plan.packed, plan.base, plan.colsum, plan.scale,
                                                                plan.bias, plan.rowterm)), scale, zero, out)
    return rows_lowering("md_qgemmf", plan, args, "qgemm own kernel (int8, float output)")


def _planned(node: Node, values: Sequence[np.ndarray | None]) -> list[np.ndarray | None]:
    """``values`` less MatMulIntegerToFloat's activation scale and zero point: a step reads
    them at each call (a graph computes them; the plan is kept while the others stay)."""
    out = list(values)
    if node.op == "MatMulIntegerToFloat":
        for i in (2, 4):
            if i < len(out):
                out[i] = None
    return out


def qgemmf_kernel(attrs: Mapping[str, Any], node: Node) -> tuple[Any, str]:
    """``contraction_kernels``' entry for MatMulIntegerToFloat, and for QGemm (either output)."""
    if not float_output(node):
        return qlinear_matmul_kernel(attrs, node)
    values = constants(node)
    native = has_int8_products()
    plan = qgemmf_plan(node, _planned(node, values), native) if values[1 if node.op != "QGemm" else 3] is not None \
        else None
    if isinstance(plan, str):
        return None, plan
    if not native:
        return qgemmf_function(node), f"exact integer products through float32 sgemm ({NO_INT8})"
    isa = int8_isa()
    return qgemmf_function(node), f"md_qgemmf (our int8 kernel, {isa}, float output)"


def qgemmf_native(node: Node, sources: Sequence[Arg], out: Arg, consts: Sequence[np.ndarray | None]) -> Any:
    """``native_contractions``' entry for MatMulIntegerToFloat, and for QGemm (either output)."""
    if not float_output(node):
        return qlinear_matmul_native(node, sources, out, consts)
    plan = qgemmf_plan(node, consts)
    return None if isinstance(plan, str) else qgemmf_lowering(node, plan, sources, out)


# -------------------------------------------------------------------------------- QAttention


def qattention_node(node: Node) -> Choice | str:
    """ORT's ``QAttention``: its projection by ``md_qgemmf`` (the input's scale and zero point
    read per run), the attention itself in numpy (batched BLAS products), from Python."""
    x = node.inputs[0].type if node.inputs[0] is not None else None
    if x is None or x.dtype.numpy not in (np.uint8, np.int8):
        return "the input's type is unknown"
    values = constants(node) + [None] * 9
    if node.inputs[2] is None or values[2] is None:
        return "the bias is not a constant"
    if len(node.inputs) > 7 and node.inputs[7] is not None and values[7] is None:
        return "the weights' zero point is not a constant"
    native = has_int8_products()
    plan = float_plan(x.dtype.numpy, values[1], values[4], values[7], values[2], None, None, None, native)
    if isinstance(plan, str):
        return plan
    attrs = attrs_of(node)

    def run(args: Sequence[np.ndarray | None], out_types: Sequence[TensorType]) -> list[np.ndarray]:
        get = list(args) + [None] * 9
        proj = run_plan(plan, get[0], get[3], get[6])
        return list(attention_of_projection(proj, attrs, get[5], get[8], np.float32))[:len(out_types)]

    kernel = "md_qgemmf (our int8 kernel)" if native else f"exact integer products through float32 sgemm ({NO_INT8})"
    return Choice(run, "blas", f"QAttention: the projection by {kernel}, attention by numpy's batched products")


# ------------------------------------------------------------------------------- ConvInteger


def conv_integer_plan(node: Node, values: Sequence[np.ndarray | None]) -> QConvPlan | str:
    """The :class:`~metadef.backends.x86.quantized.QConvPlan` of a ``ConvInteger`` node (the
    int32 sums by ``md_qpack`` + ``md_qconvi``; the activations' zero point a constant, or read
    at run time where ``values`` has None for it), or why it cannot run so."""
    if not has_int8_products():
        return NO_INT8
    x = node.inputs[0].type if node.inputs[0] is not None else None
    if x is None or x.shape is None or len(x.shape) != 4 or x.dtype.numpy not in (np.uint8, np.int8):
        return "only 2-D convolutions of 8-bit activations run as md_qconvi"
    get = list(values) + [None] * (4 - len(values))
    w, za, zw = get[1:4]
    attrs = attrs_of(node)
    groups = int(attrs.get("group") or 1)
    if w is None or np.ndim(w) != 4:
        return "the weights are not a constant 4-D tensor"
    k, depth = w.shape[0], int(np.prod(w.shape[1:]))
    if len(node.inputs) > 3 and node.inputs[3] is not None and (zw is None or np.size(zw) not in (1, k)):
        return "the weights' zero point is not one constant or one an output channel"
    if depth > MAX_DEPTH // 2:
        return f"depth {depth} is above md_qconvi's {MAX_DEPTH // 2}"
    shifted = np.asarray(w, np.int32).reshape(k, depth) - (0 if zw is None else np.asarray(zw, np.int32).reshape(-1, 1))
    if shifted.min(initial=0) < -128 or shifted.max(initial=0) > 127:
        return "the weights less their zero point do not fit in int8"
    runtime = len(node.inputs) > 2 and node.inputs[2] is not None and za is None
    zero = np.zeros(1, x.dtype.numpy) if za is None else np.asarray(za, x.dtype.numpy).reshape(1)
    if np.size(zero) != 1:
        return "the activations' zero point is not one value"
    kernel = tuple(int(v) for v in (attrs.get("kernel_shape") or w.shape[2:]))
    return QConvPlan(attrs, kernel, k, depth, _aligned_rows(shifted.astype(np.int8)),  # type: ignore[arg-type]
                     shifted.sum(axis=1).astype(np.int32), zero, 0.0, 0.0, 0.0, None if runtime else int(zero[0]),
                     x.dtype.numpy == np.int8, np.dtype(np.int32), integer=True, groups=groups)


def conv_integer_function(node: Node) -> Any:
    """The node step by step: ``md_qpack`` and ``md_qconvi`` per image (the plan made from the
    first call's weights), or the reference where they do not fit."""
    plans: list[tuple[Sequence[Any], QConvPlan | str]] = []

    def run(args: Sequence[np.ndarray | None]) -> np.ndarray:
        weights = [None, *args[1:2], None, *args[3:4]]
        if not plans or any(a is not b for a, b in zip(plans[0][0], weights)):
            plans[:] = [(weights, conv_integer_plan(node, weights))]
        plan = plans[0][1]
        if isinstance(plan, str):
            return _reference(node, args)
        x = np.ascontiguousarray(args[0])
        zero = np.ascontiguousarray(args[2] if len(args) > 2 and args[2] is not None else plan.mult,
                                    x.dtype).reshape(1)
        win = window(plan.attrs, x.shape[2:], plan.kernel)
        out_hw = tuple(int((size + int(b0) + int(e0) - d * (kk - 1) - 1) // s + 1) for size, b0, e0, d, kk, s in
                       zip(x.shape[2:], win.begin, win.end, win.dilations, plan.kernel, win.strides))
        steps = plan.steps(x.shape, out_hw)  # type: ignore[arg-type]
        if isinstance(steps, str):
            return _reference(node, args)
        y = np.empty((x.shape[0], plan.channels, *out_hw), np.int32)
        raw = np.empty(plan.scratch(out_hw), np.uint8)  # type: ignore[arg-type]
        scratch = raw[-raw.ctypes.data % 64:]
        cg, kg = x.shape[1] // plan.groups, plan.channels // plan.groups
        for i, (pack, conv) in enumerate(steps):
            for g in range(plan.groups):
                xi, yi = x[i, g * cg:(g + 1) * cg], y[i, g * kg:(g + 1) * kg]
                ENTRY(native_function("md_qpack"))((ctypes.c_void_p * 3)(xi.ctypes.data, scratch.ctypes.data,
                                                                          zero.ctypes.data),
                                                   (ctypes.c_int64 * len(pack))(*pack))
                pointers = (ctypes.c_void_p * 5)(scratch.ctypes.data, plan.weights[g * kg].ctypes.data,
                                                 plan.corr[g * kg:].ctypes.data, zero.ctypes.data, yi.ctypes.data)
                ENTRY(native_function("md_qconvi"))(pointers, (ctypes.c_int64 * len(conv))(*conv))
        return y

    return run


def conv_integer_kernel(attrs: Mapping[str, Any], node: Node) -> tuple[Any, str]:
    """``contraction_kernels``' entry for ConvInteger."""
    values = constants(node)
    plan = conv_integer_plan(node, values) if values[1] is not None else None
    if isinstance(plan, str):
        return None, plan
    return conv_integer_function(node), "md_qconvi (our int8 kernel, AVX512-VNNI, int32 sums), input packed by md_qpack"


def conv_integer_native(node: Node, sources: Sequence[Arg], out: Arg, consts: Sequence[np.ndarray | None]) -> Any:
    """``native_contractions``' entry for ConvInteger."""
    plan = conv_integer_plan(node, consts)
    if isinstance(plan, str):
        return None
    return qconv_lowering(plan, sources[0], out, sources[2] if plan.fill is None else None)


__all__ = ["QGemmFloatPlan", "conv_integer_function", "conv_integer_kernel", "conv_integer_native",
           "conv_integer_plan", "float_output", "float_plan", "qattention_node", "qgemmf_function", "qgemmf_kernel",
           "qgemmf_lowering", "qgemmf_native", "qgemmf_plan", "run_plan"]
