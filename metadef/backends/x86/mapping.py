"""The x86 backend's op mapping table: for each node, how it runs.

Dispatch is data (STYLE rule 2): ``op_strategies`` (by qualified op name) is looked up first,
then ``role_strategies`` (by the meta-op's fusion role). A strategy returns a :class:`Choice`
or, when it does not apply or cannot compile the node, a ``str``: the reason. Strategies are
tried in order; when all refuse, the node runs on its reference kernel (the numpy oracle)
with every reason recorded: no silent fallback. A node that reads or writes string tensors
(in a nested body too) is not offered to the strategies: x86 kernels take numbers, so it runs
on its reference kernel, the reason saying so. ``contraction_kernels`` maps each contraction
meta-op to its BLAS-backed kernel; a ``Fused`` group anchored by a contraction runs that
kernel and then its epilogue as one generated kernel.

Example:
    >>> from metadef.ir import parse_graph
    >>> g = parse_graph("graph g(%x: f32[n,4]) -> (%y) { %y: i64[n,1] = ArgMax(%x) {axis=1} return %y }")
    >>> choose(g.nodes[0]).kind
    'reference'
    >>> sorted(contraction_kernels)[:5], len(contraction_kernels)
    (['Conv', 'ConvInteger', 'ConvTranspose', 'Einsum', 'Gemm'], 11)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import numpy as np

from metadef.backends.x86 import attention, conv1x1, conv_transpose, gemm, movement, native, pointwise
from metadef.backends.x86 import contractions as blas
from metadef.backends.x86.choice import Choice, StepKernel, Strategy, attrs_of, reference
from metadef.backends.x86.conv_lowering import conv_lowering, fused_im2col_lowering, weight_product
from metadef.backends.x86.depthwise import depthwise_function, depthwise_routine
from metadef.backends.x86.einsum import einsum_lowering
from metadef.backends.x86.epilogue import Epilogue, split_epilogue
from metadef.backends.x86.indexing import gather_elements_node, gather_nd_node, scatter_elements_node, scatter_nd_node
from metadef.backends.x86.lookup import lookup_node
from metadef.backends.x86.native import NULL, Arg, Lowering, NativeStep
from metadef.backends.x86.pooling import avgpool_lowering, maxpool_lowering
from metadef.backends.x86.quantized import (
    qlinear_conv_kernel,
    qlinear_conv_native,
    qlinear_matmul_kernel,
    qlinear_matmul_native,
)
from metadef.backends.x86.quantized_float import (
    conv_integer_kernel,
    conv_integer_native,
    qattention_node,
    qgemmf_kernel,
    qgemmf_native,
)
from metadef.backends.x86.recurrent import recurrent_node
from metadef.backends.x86.resize import resize_node
from metadef.backends.x86.softmax import softmax_node
from metadef.backends.x86.topk import topk_node
from metadef.backends.x86.transpose import transpose_lowering
from metadef.core.dtypes import FLOAT32
from metadef.ir import Graph, GraphBuilder, Node
from metadef.ops import Role
from metadef.ops.defs.fused import run_body
from metadef.shape import TensorType, evaluate_shape

try:  # codegen is the only home of llvmlite: without it, everything runs on the other kernels
    from metadef.codegen import CodegenUnsupported, compile_group, compile_node
    CODEGEN_MISSING: str | None = None
except ImportError as _e:  # pragma: no cover - depends on the installation
    CodegenUnsupported = compile_group = compile_node = None  # type: ignore[assignment,misc]
    CODEGEN_MISSING = f"metadef.codegen is not available ({_e})"

def _empty(types: Sequence[TensorType]) -> list[np.ndarray]:
    return [np.empty(tuple(t.shape), t.dtype.numpy) for t in types]


def _generated(kernel: Any) -> StepKernel:
    def run(args: Sequence[np.ndarray | None], out_types: Sequence[TensorType]) -> list[np.ndarray]:
        outs = _empty(out_types)
        kernel(list(args), outs)
        return outs

    return run


def _compiled(compile_fn: Callable[[], Any]) -> Any:
    """The codegen kernel, or the reason it cannot be had (a ``str``)."""
    if CODEGEN_MISSING is not None:
        return CODEGEN_MISSING
    try:
        return compile_fn()
    except CodegenUnsupported as e:
        return f"codegen: {e}"


# ------------------------------------------------------------------------------ strategies


def generated_node(node: Node) -> Choice | str:
    """One generated kernel for a single node (from its semantic expression)."""
    if node.metaop.semantics.opaque:
        return f"{node.qualop} is opaque (no index expression to generate code from)"
    kernel = _compiled(lambda: compile_node(node))
    if isinstance(kernel, str):
        return kernel
    present = [i for i, v in enumerate(node.inputs) if v is not None]
    lowering = native.kernel_lowering(kernel, present, range(len(node.outputs)))
    own = routine_lowerings.get(node.qualop)
    return Choice(_generated(kernel), "generated", f"{node.metaop.role.value} node: one LLVM kernel",
                  native=lowering if own is None else own(node, lowering))


routine_lowerings: dict[str, Callable[[Node, Lowering], Lowering]] = {
    "MaxPool": maxpool_lowering, "AveragePool": avgpool_lowering, "Transpose": transpose_lowering}
"""Ops whose native step may call a hand-written routine instead of the node's generated
kernel: op -> (node, the generated kernel's lowering) -> the lowering that decides per shape."""


def generated_group(node: Node) -> Choice | str:
    """One generated kernel for a whole fused group body."""
    kernel = _compiled(lambda: compile_group(node.attrs["body"], node.name))
    if isinstance(kernel, str):
        return kernel
    return Choice(_generated(kernel), "generated", f"fused group ({node.attrs.get('kind')}): one LLVM kernel",
                  native=native.kernel_lowering(kernel, range(len(node.inputs)), range(len(node.outputs))))


def _attention(attrs: Mapping[str, Any], anchor: Node) -> tuple[blas.ContractionFn, str]:
    kernel = _attention_softmax(anchor)  # the same kernel the native lowering calls
    if kernel is None:
        return blas.attention_kernel(attrs), "batched sgemm + numpy softmax"

    def softmax(s: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        out = np.empty_like(s)
        kernel([s] if mask is None else [s, mask], [out])
        return out

    return blas.attention_kernel(attrs, softmax), "batched sgemm + generated mask-add + softmax"


def _conv(attrs: Mapping[str, Any], anchor: Node) -> tuple[blas.ContractionFn, str]:
    """im2col + sgemm, or for a depthwise conv a generated kernel (compiled here when the
    shapes but the batch are known, else on first use per shape)."""
    x, w = (v.type for v in anchor.inputs[:2])
    shapes = [None if t is None or t.shape is None else t.shape for t in (x, w)]
    static = all(s is not None and all(isinstance(d, int) for d in s[1:]) for s in shapes)
    fn = blas.conv_kernel(attrs, depthwise=None if CODEGEN_MISSING is not None else compile_node)
    if not static:
        return fn, "chosen per shape"
    x_shape, w_shape = (1, *shapes[0][1:]), tuple(shapes[1])
    own = depthwise_function(attrs, w_shape, conv1x1.static_planes(anchor), blas.conv_kernel(attrs)) \
        if x.dtype == FLOAT32 else None
    if own is not None:  # (the routine its native step calls: no generated kernel to compile for it)
        return own, f"depthwise {w_shape[2]}x{w_shape[3]}: {depthwise_routine(w_shape[2])} (our kernel)"
    generated = False
    if w_shape[1] == 1 and int(attrs.get("group") or 1) > 1 and w_shape[0] == x_shape[1] \
            and CODEGEN_MISSING is None and x.dtype == FLOAT32:
        try:  # compile now (one run on zeros), so that the first real run compiles nothing
            bias = [np.zeros(w_shape[0], np.float32)] if len(anchor.inputs) > 2 and anchor.inputs[2] is not None else []
            fn([np.zeros(x_shape, np.float32), np.zeros(w_shape, np.float32), *bias])
            generated = not getattr(fn, "depthwise_refusals", [])
        except Exception as e:  # the numpy path still runs; say why
            return fn, f"{blas.conv_variant(attrs, x_shape, w_shape)} (prewarm failed: {e})"
    return fn, blas.conv_variant(attrs, x_shape, w_shape, generated)


# contraction meta-op -> (builder of its kernel from attrs and node -> (kernel, description))
contraction_kernels: dict[str, Callable[[Mapping[str, Any], Node], tuple[blas.ContractionFn | None, str]]] = {
    "MatMul": lambda attrs, node: (blas.matmul_kernel(attrs), "blas sgemm (np.matmul)"),
    "Gemm": lambda attrs, node: (blas.gemm_kernel(attrs), "blas sgemm (np.matmul) + alpha/beta*C"),
    "Conv": _conv,
    "Einsum": lambda attrs, node: (blas.einsum_kernel(attrs), "np.einsum(optimize=True)")
    if _dtype_of(node) in (np.float32, np.float64) else (None, f"np.einsum does not take {_dtype_of(node)}"),
    "ai.metadef::Attention": _attention,
    "ConvTranspose": conv_transpose.convtranspose_kernel,
    "QLinearMatMul": qlinear_matmul_kernel,
    "QLinearConv": qlinear_conv_kernel,
    "com.microsoft::QGemm": qgemmf_kernel,
    "com.microsoft::MatMulIntegerToFloat": qgemmf_kernel,
    "ConvInteger": conv_integer_kernel,
}


def library_contraction(node: Node) -> Choice | str:
    """A contraction node through its BLAS-backed kernel."""
    build = contraction_kernels.get(node.qualop)
    if build is None:
        return f"no x86 contraction kernel for {node.qualop}"
    fn, how = build(attrs_of(node), node)
    if fn is None:
        return how
    fn = blas.widened(fn)

    def run(args: Sequence[np.ndarray | None], out_types: Sequence[TensorType]) -> list[np.ndarray]:
        return [fn(args).astype(out_types[0].dtype.numpy, copy=False)]

    sources = [NULL if v is None else Arg("in", i) for i, v in enumerate(node.inputs)]
    consts = [None if v is None else v.const for v in node.inputs]
    return Choice(run, "blas", how, native=_native_contraction(node, sources, Arg("out", 0), consts))


def contraction_group(node: Node) -> Choice | str:
    """A fused group anchored by a contraction: BLAS, then the epilogue as one kernel."""
    kind = str(node.attrs.get("kind", ""))
    if Role.CONTRACTION.value not in kind.split("+"):
        return f"group kind {kind!r} has no contraction anchor"
    split = split_epilogue(node)
    if isinstance(split, str):
        return split
    build = contraction_kernels.get(split.anchor.qualop)
    if build is None:
        return f"no x86 contraction kernel for the anchor {split.anchor.qualop}"
    fn, how = build(attrs_of(split.anchor), split.anchor)
    if fn is None:
        return how
    fn = blas.widened(fn)
    consts = [const if pos is None else node.inputs[pos].const for pos, const in split.anchor_sources]
    if split.body is None:
        return Choice(_with_epilogue(fn, split, None), "blas", how, native=_group_lowering(split, None, consts, node))
    kernel = _compiled(lambda: compile_group(split.body, f"{node.name}/epilogue"))
    if isinstance(kernel, str):
        return Choice(_with_epilogue(fn, split, None), "blas+reference epilogue",
                      f"{how}; epilogue on the reference: {kernel}", fallback=True)
    return Choice(_with_epilogue(fn, split, kernel), "blas+generated epilogue", f"{how}; epilogue: one LLVM kernel",
                  native=_group_lowering(split, kernel, consts, node))


def _with_epilogue(fn: blas.ContractionFn, split: Epilogue, kernel: Any) -> StepKernel:
    def run(args: Sequence[np.ndarray | None], out_types: Sequence[TensorType]) -> list[np.ndarray]:
        y = fn(split.anchor_args(args))
        if split.body is None:
            return [y]
        epi_args = [y, *split.epilogue_args(args)]
        if kernel is None:
            epi_outs = run_body(split.body, epi_args)
        else:
            epi_outs = _empty([out_types[i] for i in split.epilogue_positions])
            kernel(epi_args, epi_outs)
        return split.assemble(y, epi_outs)

    return run


# ------------------------------------------------------------------------- native lowerings


def _dtype_of(node: Node) -> np.dtype:
    t = node.outputs[0].type
    return t.dtype.numpy if t is not None else np.dtype(np.float32)


_MADE: ContextVar[dict[tuple[str, int], Any] | None] = ContextVar("metadef_x86_made", default=None)


@contextmanager
def _one_choice() -> Iterator[None]:
    """While one strategy runs for a node: what its parts build twice (the attention softmax
    kernel, for the Python kernel and the native lowering) is built once, so that the node
    compiles (and a stored plan records) each kernel once."""
    token = _MADE.set({})
    try:
        yield
    finally:
        _MADE.reset(token)


def _attention_softmax(node: Node) -> Any:
    """A generated ``softmax(S + mask)`` over the last axis for an Attention node's scores
    ``S`` (symbolic shape ``[*B, M, N]``), or None when it cannot be had."""
    made = _MADE.get()
    if made is None:
        return _softmax_kernel(node)
    key = ("attention softmax", id(node))
    if key not in made:
        made[key] = _softmax_kernel(node)
    return made[key]


def _softmax_kernel(node: Node) -> Any:
    q, k = node.inputs[0].type, node.inputs[1].type
    mask = node.inputs[3] if len(node.inputs) > 3 else None
    if q is None or k is None or q.shape is None or k.shape is None or CODEGEN_MISSING is not None:
        return None
    b = GraphBuilder(f"{node.name}/softmax")
    heads_after = node.attrs.get("layout", "bhsd") == "bshd"  # (Q [*B, M, H, D]: the scores [*B, H, M, N])
    scores = (*q.shape[:-3], q.shape[-2], q.shape[-3], k.shape[-3]) if heads_after else (*q.shape[:-1], k.shape[-2])
    s = b.input("scores", TensorType(q.dtype, scores))
    if mask is not None:
        if mask.type is None or mask.type.shape is None:
            return None
        s, = b.node("Add", [s, b.input("mask", mask.type)])
    p, = b.node("Softmax", [s], {"axis": -1})
    b.output(p)
    compiled = _compiled(lambda: compile_group(b.build(), f"{node.name}/softmax"))
    return None if isinstance(compiled, str) else compiled


def _conv_lowering(node: Node, sources: Sequence[Arg], out: Arg, consts: Sequence[np.ndarray | None],
                   epilogue: tuple[Arg | None, float, float] = (None, -math.inf, math.inf)) -> Lowering:
    """A Conv node's lowering: a pointwise conv through our own kernel (with ``epilogue``: its
    residual and bounds) where it measures faster, else im2col / Winograd / depthwise."""
    attrs, weight = attrs_of(node), consts[1] if len(consts) > 1 else None
    bias = sources[2] if len(sources) > 2 else NULL
    general = conv_lowering(attrs, sources, out, _dtype_of(node), None if CODEGEN_MISSING is not None else compile_node,
                            weight, weight_product(attrs, weight, consts, bias, _dtype_of(node)))
    side = _depthwise_window(node, consts)
    if side is not None:
        return conv1x1.depthwise_lowering(attrs, sources[0], sources[1], bias, out, epilogue[1:], general,
                                          conv1x1.static_planes(node), side, weight,
                                          consts[2] if len(consts) > 2 else None)
    if weight is None or not conv1x1.pointwise(attrs, weight, _dtype_of(node)):
        return general
    return pointwise.pointwise_lowering(attrs, weight, sources[0], bias, epilogue[0], out, epilogue[1:], general,
                                      consts[2] if len(consts) > 2 else None)


def _depthwise_window(node: Node, consts: Sequence[np.ndarray | None]) -> int | None:
    if not conv1x1.DEPTHWISE:
        return None
    w = node.inputs[1].type if len(node.inputs) > 1 and node.inputs[1] is not None else None
    shape = tuple(consts[1].shape) if len(consts) > 1 and consts[1] is not None else \
        tuple(w.shape) if w is not None and w.shape is not None and all(isinstance(d, int) for d in w.shape) else None
    return conv1x1.depthwise_window(attrs_of(node), shape, _dtype_of(node))


def _native_attention(node: Node, sources: Sequence[Arg], out: Arg,
                      consts: Sequence[np.ndarray | None]) -> Lowering | None:
    softmax = _attention_softmax(node)
    return None if softmax is None else attention.attention_lowering(attrs_of(node), sources, out,
                                                                     _dtype_of(node), softmax)


native_contractions: dict[str, Callable[[Node, Sequence[Arg], Arg, Sequence[np.ndarray | None]],
                                        Lowering | None]] = {
    "MatMul": lambda node, src, out, consts: gemm.product_lowering(
        node, consts, src[0], out, None, native.matmul_lowering(src[0], src[1], out, _dtype_of(node))),
    "Gemm": lambda node, src, out, consts: gemm.product_lowering(
        node, consts, src[0], out, None,
        native.gemm_lowering(attrs_of(node), src, out, _dtype_of(node), consts[1] if len(consts) > 1 else None)),
    "Conv": lambda node, src, out, consts: _conv_lowering(node, src, out, consts),
    "ai.metadef::Attention": _native_attention,
    "ConvTranspose": conv_transpose.convtranspose_lowering,
    "Einsum": lambda node, src, out, consts: einsum_lowering(
        str(attrs_of(node)["equation"]), src[0], src[1] if len(src) > 1 else NULL, out, _dtype_of(node)),
    "QLinearMatMul": qlinear_matmul_native,
    "QLinearConv": qlinear_conv_native,
    "com.microsoft::QGemm": qgemmf_native,
    "com.microsoft::MatMulIntegerToFloat": qgemmf_native,
    "ConvInteger": conv_integer_native,
}
"""Contraction meta-op -> the lowering of a node of it to native calls (``sources``: its
inputs as pointer arguments, ``out``: where its output goes, ``consts``: the values of its
constant inputs, None for the others)."""


def _native_contraction(node: Node, sources: Sequence[Arg], out: Arg,
                        consts: Sequence[np.ndarray | None]) -> Lowering | None:
    build = native_contractions.get(node.qualop)
    return None if build is None else build(node, sources, out, consts)


_Y = Arg("scratch", 1 << 20)  # the anchor's output before it has a scratch index


def _renumber(calls: Sequence[native.Call], old: Arg, new: Arg) -> tuple[native.Call, ...]:
    """``calls`` with every argument ``old`` (at any offset) now ``new``, also inside a
    sequence's calls; all else kept (a sequence rebuilt without its calls ran
    ``md_run_sequence`` on nothing: a segfault when a conv's epilogue was not fused and the conv
    went image by image)."""
    def arg(a: Arg) -> Arg:
        return Arg(new.kind, new.index, a.offset) if (a.kind, a.index) == (old.kind, old.index) else a

    return tuple(dataclasses.replace(c, args=tuple(arg(a) for a in c.args), steps=_renumber(c.steps, old, new))
                 for c in calls)


def _group_lowering(split: Epilogue, kernel: Any, consts: Sequence[np.ndarray | None], node: Node
                    ) -> Lowering | None:
    """A contraction group (the Fused ``node``) natively: the anchor's calls, then the epilogue
    kernel's; or one call of our own kernels where the epilogue fits in their stores."""
    keep = [None if const is None else np.ascontiguousarray(const) for _, const in split.anchor_sources]
    sources = [Arg("in", pos) if pos is not None else NULL if const is None else Arg("addr", const.ctypes.data)
               for (pos, _), const in zip(split.anchor_sources, keep)]
    to_output = bool(split.anchor_positions)
    y_arg = Arg("out", split.anchor_positions[0]) if to_output else _Y
    anchor = _native_contraction(split.anchor, sources, y_arg, consts)
    if anchor is None:
        return None
    y_type = split.anchor.outputs[0].type

    def lower(ins: Sequence[native.Shape | None], outs: Sequence[native.Shape],
              symbols: Mapping[str, int]) -> NativeStep | str:
        anchor_shapes = [ins[pos] if pos is not None else None if const is None else const.shape
                         for (pos, _), const in zip(split.anchor_sources, keep)]
        if y_type is None or y_type.shape is None:
            return "the anchor's output has no shape"
        y_shape = tuple(evaluate_shape(y_type.shape, symbols))
        step = anchor(anchor_shapes, [y_shape], symbols)
        if isinstance(step, str):
            return step
        scratch = list(step.scratch)
        calls = list(step.calls)
        y = y_arg
        if not to_output:
            y = Arg("scratch", len(scratch))
            scratch.append(4 * math.prod(y_shape) if y_shape else 4)
            calls = list(_renumber(step.calls, _Y, y))
        copy = native.native_function("md_copy")
        for p in split.anchor_positions[1:]:
            calls.append(native.Call(copy, (y, Arg("out", p)), (4 * math.prod(y_shape),), "copy"))
        if kernel is not None:
            shapes = [y_shape, *(ins[i] for i in split.input_positions)]
            if any(s is None for s in shapes):
                return "an epilogue input is absent"
            epilogue_outs = [outs[p] for p in split.epilogue_positions]
            dims = kernel.dims_for(shapes, epilogue_outs)
            args = (y, *(Arg("in", i) for i in split.input_positions),
                    *(Arg("addr", a) for a in kernel.constant_pointers),
                    *(Arg("out", p) for p in split.epilogue_positions))
            calls.append(native.Call(kernel.address, args, tuple(dims), "epilogue",
                                     native.kernel_tasks(kernel, shapes, epilogue_outs)))
        return NativeStep(tuple(calls), tuple(scratch), (*step.keep, keep, kernel))

    lower = native.needing(lower, *native.needs(anchor), "md_copy")
    fused = _fused_epilogue(split, sources, consts, node, lower)
    return lower if fused is None else fused


def _fused_epilogue(split: Epilogue, sources: Sequence[Arg], consts: Sequence[np.ndarray | None], node: Node,
                    otherwise: Lowering) -> Lowering | None:
    """A group whose epilogue fits in the stores of one of our kernels, as one call writing the
    group's output (``otherwise`` where that does not pay), else None: a conv whose epilogue is
    ``act(y + residual)`` (``act``: Relu, Clip or nothing) anchored by a pointwise conv
    (``md_conv1x1``) or a 3x3 depthwise conv without residual (``md_depthwise``); a product
    with constant weights whose epilogue is ``act(y + bias (+ residual))`` (``md_gemm``)."""
    anchor, body = split.anchor, split.body
    if body is None or split.anchor_positions or len(split.epilogue_positions) != 1:
        return None
    if anchor.op in ("MatMul", "Gemm") and _dtype_of(anchor) == np.float32:
        # the body's inputs past the anchor's output are the Fused node's inputs: their values
        known = {id(v): node.inputs[pos].const for v, pos in zip(body.inputs[1:], split.input_positions)
                 if node.inputs[pos] is not None}
        found = gemm.residual_form(body.nodes, body.inputs[0], body.outputs[0], known)
        if found is None:
            return None
        extra, value, lo, hi = found
        at = None if value is None else next((i for i, v in enumerate(body.inputs) if v is value), None)
        if value is not None and not at:  # (the residual must be one of the group's inputs)
            return None
        residual = None if at is None else Arg("in", split.input_positions[at - 1])
        lowered = gemm.product_lowering(anchor, consts, sources[0], Arg("out", split.epilogue_positions[0]),
                                        (extra, lo, hi), otherwise, residual)
        return None if lowered is otherwise else lowered
    if anchor.op != "Conv":
        return None
    form = conv1x1.epilogue_form(body.nodes, body.inputs[0], body.outputs[0])
    if form is None:
        return None
    value, lo, hi = form
    bias = sources[2] if len(sources) > 2 else NULL
    out = Arg("out", split.epilogue_positions[0])
    side = _depthwise_window(anchor, consts) if value is None else None
    if side is not None:
        return conv1x1.depthwise_lowering(attrs_of(anchor), sources[0], sources[1], bias, out, (lo, hi), otherwise,
                                          conv1x1.static_planes(anchor), side, consts[1] if len(consts) > 1 else None,
                                          consts[2] if len(consts) > 2 else None)
    weight, residual = consts[1] if len(consts) > 1 else None, None
    if value is not None:
        at = next((i for i, v in enumerate(body.inputs) if v is value), None)
        if at is None or at == 0:
            return None
        residual = Arg("in", split.input_positions[at - 1])
    if weight is None or not conv1x1.pointwise(attrs_of(anchor), weight, _dtype_of(anchor)):
        return fused_im2col_lowering(attrs_of(anchor), weight, consts, sources, residual, out, (lo, hi), otherwise)
    return pointwise.pointwise_lowering(attrs_of(anchor), weight, sources[0], bias, residual, out, (lo, hi),
                                      otherwise, consts[2] if len(consts) > 2 else None)


def castlike_node(node: Node) -> Choice | str:
    """CastLike as the generated kernel of the Cast it is: its target's dtype is known here."""
    x, like = (v.type if v is not None else None for v in node.inputs[:2])
    if x is None or like is None:
        return "its input types are unknown"
    b = GraphBuilder(f"{node.name}/cast")
    attrs = attrs_of(node)
    y, = b.node("Cast", [b.input("x", x)], {"to": like.dtype.onnx, "saturate": attrs["saturate"],
                                          "round_mode": attrs["round_mode"]}, name=node.name)
    b.output(y)
    got = generated_node(b.build().nodes[0])
    if isinstance(got, str):
        return got

    def run(args: Sequence[np.ndarray | None], out_types: Sequence[TensorType]) -> list[np.ndarray]:
        return got.kernel(args[:1], out_types)

    return Choice(run, got.kind, f"CastLike as Cast to {like.dtype.name}: one LLVM kernel", native=got.native)


# --------------------------------------------------------------------------------- tables

op_strategies: dict[str, tuple[Strategy, ...]] = {
    "ai.metadef::Fused": (contraction_group, generated_group),
    **{op: (movement.view_node,) for op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")},
    "CastLike": (castlike_node,),
    **{op: (softmax_node, generated_node) for op in ("Softmax", "LogSoftmax")},
    "TopK": (topk_node,),
    "ai.metadef::Lookup": (lookup_node,),
    "com.microsoft::QAttention": (qattention_node,),
    **{op: (recurrent_node,) for op in ("RNN", "GRU", "LSTM")},
    "Concat": (movement.concat_node,),
    "Split": (movement.split_node,),
    "Slice": (movement.slice_node,),
    "Pad": (movement.pad_node, movement.pad_planes_node),
    **{op: (movement.nearest_resize_node, resize_node) for op in ("Resize", "Upsample")},
    "Gather": (movement.gather_node,),
    "GatherElements": (gather_elements_node,),
    "GatherND": (gather_nd_node,),
    "ScatterND": (scatter_nd_node,),
    **{op: (scatter_elements_node,) for op in ("ScatterElements", "Scatter")},
    "Dropout": (movement.inference_dropout,),
    **{op: (movement.shape_node,) for op in ("Shape", "Size")},
}

role_strategies: dict[Role, tuple[Strategy, ...]] = {
    Role.ELEMENTWISE: (generated_node,),
    Role.BROADCAST: (generated_node,),
    Role.INJECTIVE: (generated_node,),
    Role.REDUCTION: (generated_node,),
    Role.CONTRACTION: (library_contraction,),
    Role.OPAQUE: (),
}


def string_values(node: Node) -> list[str]:
    """The names of the string tensors ``node`` reads or writes, in its nested bodies too.

    Example:
        >>> from metadef.ir import parse_graph
        >>> g = parse_graph("graph g(%x: str[n]) -> (%y) { %y: b8[n] = Equal(%x, %x) @eq return %y }")
        >>> string_values(g.nodes[0]), choose(g.nodes[0]).reason
        (['x'], 'string tensors (%x): x86 kernels take numbers; runs on its reference kernel')
    """
    values = [v for v in (*node.inputs, *node.outputs) if v is not None]
    for body in node.attrs.values():
        if isinstance(body, Graph):
            values.extend(body.values())
    names = (v.name for v in values if v.type is not None and v.type.dtype.is_string)
    return list(dict.fromkeys(names))


def choose(node: Node) -> Choice:
    """The first strategy that takes the node, else its reference kernel with the reasons."""
    strings = string_values(node)
    if strings:
        listed = ", ".join(f"%{name}" for name in strings[:3]) + (", ..." if len(strings) > 3 else "")
        return reference(node, f"string tensors ({listed}): x86 kernels take numbers; runs on its reference kernel")
    strategies = op_strategies.get(node.qualop)
    if strategies is None:
        strategies = role_strategies.get(node.metaop.role, ())
    reasons: list[str] = []
    for strategy in strategies:
        with _one_choice():
            got = strategy(node)
        if isinstance(got, Choice):
            reason = "; ".join([*reasons, got.reason]) if got.fallback and reasons else got.reason
            return Choice(got.kernel, got.kind, reason, got.fallback, strategy.__name__, got.native)
        reasons.append(got)
    if not strategies:
        reasons.append(f"{node.metaop.role.value} op {node.qualop}: no x86 kernel (runs alone, from its reference)")
    return reference(node, "; ".join(reasons))


def strategy_named(name: str) -> Strategy | None:
    """The strategy of the two tables called ``name`` (a stored plan names each node's)."""
    tables: list[Mapping[Any, tuple[Strategy, ...]]] = [op_strategies, role_strategies]
    return next((s for table in tables for group in table.values() for s in group if s.__name__ == name), None)


def replay(node: Node, strategy: str, reason: str, fallback: bool) -> Choice | str:
    """The choice a stored plan made for ``node``, rebuilt by running only the named
    strategy (no search through the tables), or why it cannot be (a ``str``)."""
    if strategy == "reference":
        return reference(node, reason)
    run = strategy_named(strategy)
    if run is None:
        return f"no strategy named {strategy!r} in the x86 tables"
    with _one_choice():
        got = run(node)
    if isinstance(got, str):
        return f"{strategy} refused {node.name}: {got}"
    return Choice(got.kernel, got.kind, reason, fallback, strategy, got.native)


__all__ = ["CODEGEN_MISSING", "Choice", "Epilogue", "StepKernel", "Strategy", "attrs_of", "castlike_node", "choose",
           "contraction_group", "contraction_kernels", "generated_group", "generated_node",
           "library_contraction", "native_contractions", "op_strategies", "reference", "replay",
           "role_strategies", "routine_lowerings", "split_epilogue", "string_values",
           "strategy_named"]
