"""``recognize_quantized``: quantized layers written as QDQ become the quantized op they mean.

ONNX Runtime's quantizer (``quantize_static``, QDQ format, its default) writes a quantized
MatMul as float ops between ``DequantizeLinear`` and ``QuantizeLinear``: the product of
dequantized activations and dequantized weights, quantized again. Run as written, every
layer is a float product with quantize passes around it (slower than the float model); read
as what it means, it is one integer product requantized once, which ONNX Runtime runs the
same way (its QDQ selectors). This pass runs first, before constant folding turns the int8
weights into float32 ones.

- ``recognize_qlinear_matmul``: ``QuantizeLinear(MatMul(DequantizeLinear(a), DequantizeLinear(W)))``
  with constant int8/uint8 weights ``W`` and constant scales and zero points (the activations'
  and the output's per tensor, the weights' per tensor or per column of a 2-D ``W``) ->
  ``QLinearMatMul``.
- ``recognize_qlinear_conv``: ``QuantizeLinear(Conv(DequantizeLinear(x), DequantizeLinear(W)
  (, DequantizeLinear(B))))`` with constant 8-bit weights (scale per tensor or per output
  channel), an ungrouped Conv, and a bias of int32 at scale ``x_scale * w_scale`` (ONNX
  Runtime's) -> ``QLinearConv`` (grouped and depthwise convs too: ``exact_depthwise_qlinear_conv``
  then gives a depthwise one to the float depthwise kernels, exactly).
- ``recognize_qgemm``: the same around ``Gemm`` (``transA`` 0, ``beta`` 1, its bias int32 at
  ``a_scale * w_scale``) -> ONNX Runtime's ``com.microsoft::QGemm`` (PyTorch exports a Linear
  layer on 2-D inputs as Gemm).
- ``recognize_matmul_integer_to_float``: ``Mul(Cast(MatMulInteger(a, W, za, zw)), Mul(a_scale,
  w_scale))`` with constant 8-bit ``W`` (what ``quantize_dynamic`` writes after each
  ``DynamicQuantizeLinear``; ``a_scale`` and ``za`` are computed at run time) -> ONNX Runtime's
  ``com.microsoft::MatMulIntegerToFloat``, and an ``Add`` of a constant bias a column after it
  into its ``bias`` (as ONNX Runtime's own fusion does). Exact: the same int32 sum, scaled and
  biased in the same float32 steps.
- ``exact_depthwise_qlinear_conv``: a depthwise ``QLinearConv`` (ONNX Runtime's QOperator form
  has them; its QDQ form keeps them float) -> the same sums in float32, exactly: ``Conv`` of
  ``x - x_zero_point`` and ``W - w_zero_point`` (8-bit values: every partial sum an integer
  below 2**24), then the reference's requantization (int32 bias, ``x_scale * w_scale / y_scale``
  in float32, ``Round``, the zero point, ``Clip``), so the float depthwise kernels run it and the
  result is the reference's byte for byte.
- ``exact_activations_qlinear_matmul``: a ``QLinearMatMul`` of two activations (attention's
  ``Q Kᵀ`` and ``P V`` in a QOperator transformer) of depth at most 258 -> the same sums in
  float32, exactly (``MatMul`` of ``a - a_zero_point`` and ``b - b_zero_point``: every partial
  sum an integer below 2**24), then the reference's requantization, so the float batched
  products and a generated epilogue run it, byte for byte the reference's.
- ``drop_qdq_around_moves``: ``QuantizeLinear(M(DequantizeLinear(x), ...))`` where ``M`` only
  moves or selects values (MaxPool, Reshape, Transpose, Flatten, Squeeze, Unsqueeze, Gather,
  Slice, Expand, DepthToSpace, SpaceToDepth, a nearest Resize) and both sides have the same
  scale and zero point -> ``M(x, ...)`` on the 8-bit values, as ONNX Runtime's QDQ selectors drop
  them: the result is the same byte for byte (``(x - z) * s / s`` rounds back to ``x - z``), at a
  quarter of the memory traffic.

Numerics: the product is exact in int32 and requantized with ``a_scale * w_scale / y_scale``
in float32, as ONNX Runtime does; the float form rounds its sum along the way. Where the two
land on either side of a rounding boundary, an element differs by one quantization step.
Disable the rule (``--disable-rule recognize_qlinear_matmul``) to keep the float form.

Example:
    >>> import numpy as np
    >>> from metadef.ir import GraphBuilder
    >>> from metadef.passes.base import PassContext
    >>> from metadef.shape import parse_type
    >>> b = GraphBuilder("g")
    >>> c = lambda name, v: b.const(name, np.asarray(v))
    >>> a = b.input("a", parse_type("u8[n,64]"))
    >>> x, = b.node("DequantizeLinear", [a, c("sa", np.float32(0.1)), c("za", np.uint8(3))])
    >>> w, = b.node("DequantizeLinear", [c("w", np.ones((64, 16), np.int8)), c("sw", np.float32(0.01)),
    ...                                  c("zw", np.int8(0))])
    >>> p, = b.node("MatMul", [x, w])
    >>> y, = b.node("QuantizeLinear", [p, c("sy", np.float32(0.2)), c("zy", np.uint8(128))])
    >>> b.output(y)
    >>> new = recognize_quantized(b.build(), PassContext())
    >>> [n.op for n in new.nodes]
    ['QLinearMatMul']
"""

from __future__ import annotations

import numpy as np

from metadef.ir import Graph, Value
from metadef.passes.base import PassContext
from metadef.passes.patterns.common import emit, escaping, fused_name
from metadef.rewrite import GraphEditor, Match, Refusal, Rule, const, op, rewrite, var
from metadef.rewrite.engine import Built
from metadef.rewrite.pattern import Pattern

_PLAIN = {"block_size": 0}


def _one(v: Value) -> bool:
    return v.const is not None and np.size(v.const) == 1


def _operands(m: Match, rank: int, axis: int, what: str) -> Refusal | int:
    """The outputs (along the weights' ``axis``) of a match whose weights are ``rank``-D 8-bit
    with a scale and zero point per tensor or per output (a ``what``), and whose activations and
    output are 8-bit; else the refusal."""
    w, sw, zw = (np.asarray(m.value(n).const) for n in ("w", "sw", "zw"))
    if w.ndim != rank or w.dtype not in (np.int8, np.uint8):
        return Refusal(f"the weights are {w.dtype}[{', '.join(map(str, w.shape))}], not {rank}-D 8-bit")
    n = w.shape[axis]
    if sw.size not in (1, n) or zw.size != sw.size or sw.ndim > 1:
        return Refusal(f"the weights' scale and zero point are not one value or one a {what}")
    given = int(m.node("dq_w").attrs.get("axis", 1)) % rank
    if sw.size > 1 and given != axis:
        return Refusal(f"the weights' scales run along axis {given}, not along their {what}s (axis {axis})")
    a = m.value("a").type
    if a is None or np.dtype(a.dtype.numpy) not in (np.uint8, np.int8):
        return Refusal("the activations are not 8-bit")
    if np.asarray(m.value("zy").const).dtype not in (np.uint8, np.int8):
        return Refusal("the output is not 8-bit")
    return n


def _qlinear_matmul(m: Match, ed: GraphEditor) -> Built:
    refusal = escaping(m, ed, shared=("dq_a", "dq_w"))
    if refusal is not None:
        return refusal
    n = _operands(m, 2, 1, "column")
    if isinstance(n, Refusal):
        return n
    return emit(m, ed, "QLinearMatMul", [m.value(x) for x in ("a", "sa", "za", "w", "sw", "zw", "sy", "zy")])


def _qlinear_conv(m: Match, ed: GraphEditor) -> Built:
    refusal = escaping(m, ed, shared=("dq_a", "dq_w", "dq_b"))
    if refusal is not None:
        return refusal
    conv = m.node("conv")
    k = _operands(m, 4, 0, "output channel")
    if isinstance(k, Refusal):
        return k
    inputs = [m.value(n) for n in ("a", "sa", "za", "w", "sw", "zw", "sy", "zy")]
    if m.has("b"):
        refusal = _bias(m, k)
        if refusal is not None:
            return refusal
        inputs.append(m.value("b"))
    return emit(m, ed, "QLinearConv", inputs, dict(conv.attrs))


def _bias(m: Match, k: int) -> Refusal | None:
    """Refuse unless the bound bias ``b`` is int32 ``[k]`` at scale ``a_scale * w_scale``, zero point 0."""
    b, sb, zb = (np.asarray(m.value(n).const) for n in ("b", "sb", "zb"))
    want = np.asarray(m.value("sa").const, np.float32).reshape(()) \
        * np.asarray(m.value("sw").const, np.float32).reshape(-1)
    if b.dtype != np.int32 or b.shape != (k,) or np.any(zb != 0) \
            or not np.allclose(np.broadcast_to(sb.reshape(-1), (k,)), want, rtol=1e-6, atol=0):
        return Refusal("the bias is not int32 at the scale x_scale * w_scale with zero point 0")
    return None


def _qgemm(m: Match, ed: GraphEditor) -> Built:
    refusal = escaping(m, ed, shared=("dq_a", "dq_w", "dq_b"))
    if refusal is not None:
        return refusal
    gemm = m.node("gemm")
    trans_b = int(gemm.attrs.get("transB", 0) or 0)
    if int(gemm.attrs.get("transA", 0) or 0):
        return Refusal("a Gemm of A transposed keeps its float form")
    n = _operands(m, 2, 0 if trans_b else 1, "output column")
    if isinstance(n, Refusal):
        return n
    bias = None
    if m.has("b"):
        if float(gemm.attrs.get("beta", 1.0)) != 1.0:
            return Refusal("beta is not 1")
        refusal = _bias(m, n)
        if refusal is not None:
            return refusal
        bias = m.value("b")
    inputs = [m.value(x) for x in ("a", "sa", "za", "w", "sw", "zw")] + [bias, m.value("sy"), m.value("zy")]
    attrs = {"alpha": float(gemm.attrs.get("alpha", 1.0)), "transA": 0, "transB": trans_b}
    return emit(m, ed, "QGemm", inputs, attrs, domain="com.microsoft")


def _integer_to_float(m: Match, ed: GraphEditor) -> Built:
    refusal = escaping(m, ed, shared=("scales",))
    if refusal is not None:
        return refusal
    w, sw = np.asarray(m.value("w").const), np.asarray(m.value("sw").const)
    if w.ndim != 2 or w.dtype not in (np.int8, np.uint8):
        return Refusal(f"the weights are {w.dtype}[{', '.join(map(str, w.shape))}], not 2-D 8-bit")
    n = w.shape[1]
    zw = np.asarray(m.value("zw").const) if m.has("zw") else None
    if sw.dtype != np.float32 or sw.size not in (1, n) or sw.ndim > 1 or (zw is not None and zw.size not in (1, n)):
        return Refusal("the weights' scale or zero point is not one value or one a column")
    sa = m.value("sa").type
    if sa is None or sa.dtype.numpy != np.float32 or sa.shape is None or any(d != 1 for d in sa.shape):
        return Refusal("the activations' scale is not one float32 value")
    za = m.value("za") if m.has("za") else None
    if za is not None and (za.type is None or za.type.shape is None or any(d != 1 for d in za.type.shape)):
        return Refusal("the activations' zero point is not one value (per tensor)")
    inputs = [m.value(x) for x in ("a", "w", "sa", "sw")] + [za, m.value("zw") if m.has("zw") else None]
    while inputs[-1] is None:
        inputs.pop()
    return emit(m, ed, "MatMulIntegerToFloat", inputs, domain="com.microsoft")


def _float_bias(m: Match, ed: GraphEditor) -> Built:
    refusal = escaping(m, ed)
    if refusal is not None:
        return refusal
    product, bias = m.node("product"), np.asarray(m.value("bias").const)
    y = product.outputs[0].type
    if len(product.inputs) > 6 and product.inputs[6] is not None:
        return None
    if y is None or y.shape is None or not y.shape or bias.dtype != np.float32 or bias.shape != (y.shape[-1],):
        return Refusal(f"the bias {bias.dtype}[{', '.join(map(str, bias.shape))}] is not float32, one a column")
    inputs = list(product.inputs) + [None] * (6 - len(product.inputs))
    return emit(m, ed, "MatMulIntegerToFloat", [*inputs, m.value("bias")], domain="com.microsoft")


_ONNX_FLOAT, _ONNX_INT32 = 1, 6
_ONNX_CODES = {np.dtype(np.uint8): 2, np.dtype(np.int8): 3}


def _depthwise_in_float(m: Match, ed: GraphEditor) -> Built:
    conv = m.node("conv")
    x, w = m.value("x"), np.asarray(m.value("w").const)
    k = w.shape[0] if w.ndim == 4 else 0
    group = int(conv.attrs.get("group", 1) or 1)
    if w.ndim != 4 or w.shape[1] != 1 or group != k or group == 1:
        return Refusal("not a depthwise conv (one input channel per group)")
    if 255 * 128 * w.shape[2] * w.shape[3] >= 2**24:
        return Refusal(f"a {w.shape[2]}x{w.shape[3]} window's sums may not be exact in float32")
    sx, zx, sw, zw, sy, zy = (np.asarray(m.value(n).const) for n in ("sx", "zx", "sw", "zw", "sy", "zy"))
    if any(v.size != 1 for v in (sx, zx, sy, zy)) or sw.size not in (1, k) or zw.size not in (1, k):
        return Refusal("the scales and zero points are not per tensor (the weights': or per channel)")
    shifted = np.asarray(w, np.float32) - np.asarray(zw, np.float32).reshape(-1, 1, 1, 1)
    if np.abs(shifted).max(initial=0) > 128 or zy.dtype not in _ONNX_CODES:
        return Refusal("the weights less their zero point are not 8-bit, or the output is not")
    bias = np.asarray(m.value("b").const) if m.has("b") else None
    name = fused_name(conv, "DepthwiseInFloat")
    xf, = ed.add("Cast", [x], {"to": _ONNX_FLOAT}, name=name)
    xs, = ed.add("Sub", [xf, ed.const("zx", np.float32(zx.reshape(())))], name=name)
    attrs = {a: v for a, v in conv.attrs.items() if a in ("auto_pad", "dilations", "group", "kernel_shape", "pads",
                                                          "strides")}
    sums, = ed.add("Conv", [xs, ed.const("w", shifted)], attrs, name=name)
    acc, = ed.add("Cast", [sums], {"to": _ONNX_INT32}, name=name)
    if bias is not None:
        acc, = ed.add("Add", [acc, ed.const("bias", np.asarray(bias, np.int32).reshape(-1, 1, 1))], name=name)
    # the reference's multiplier exactly: (x_scale * w_scale) / y_scale in float32
    mult = np.float32(sx.reshape(())) * np.broadcast_to(np.asarray(sw, np.float32).reshape(-1), (k,)) \
        / np.float32(sy.reshape(()))
    f, = ed.add("Cast", [acc], {"to": _ONNX_FLOAT}, name=name)
    return _requantized(ed, name, f, mult.astype(np.float32).reshape(-1, 1, 1), zy)


def _requantized(ed: GraphEditor, name: str, sums: Value, mult: np.ndarray, zy: np.ndarray) -> Value:
    """The reference's requantization of exact float32 sums: ``Round(sums * mult)``, the zero
    point added, clipped to its type's range, cast to it."""
    rounded, = ed.add("Round", [ed.add("Mul", [sums, ed.const("mult", mult)], name=name)[0]], name=name)
    shifted, = ed.add("Add", [rounded, ed.const("zy", np.float32(zy.reshape(())))], name=name)
    info = np.iinfo(zy.dtype)
    clipped, = ed.add("Clip", [shifted, ed.const("lo", np.float32(info.min)), ed.const("hi", np.float32(info.max))],
                      name=name)
    y, = ed.add("Cast", [clipped], {"to": _ONNX_CODES[zy.dtype]}, name=name)
    return y


def _activations_in_float(m: Match, ed: GraphEditor) -> Built:
    node = m.node("qmm")
    a, b = m.value("a"), m.value("b")
    if b.const is not None:
        return Refusal("B is a constant (the integer product kernels take it)")
    depth = a.type.shape[-1] if a.type is not None and a.type.shape else None
    if not isinstance(depth, int) or depth * 255 * 255 >= 2**24:
        return Refusal(f"a depth of {depth}: the sums may not be exact in float32 (at most 258)")
    sa, za, sb, zb, sy, zy = (np.asarray(m.value(n).const) for n in ("sa", "za", "sb", "zb", "sy", "zy"))
    if any(v.size != 1 for v in (sa, za, sb, zb, sy, zy)) or zy.dtype not in _ONNX_CODES:
        return Refusal("the scales and zero points are not per tensor, or the output is not 8-bit")
    name = fused_name(node, "ActivationsInFloat")
    shifted = []
    for x, z in ((a, za), (b, zb)):
        xf, = ed.add("Cast", [x], {"to": _ONNX_FLOAT}, name=name)
        xs, = ed.add("Sub", [xf, ed.const("zero", np.float32(z.reshape(())))], name=name)
        shifted.append(xs)
    sums, = ed.add("MatMul", shifted, name=name)
    # the reference's multiplier exactly: (a_scale * b_scale) / y_scale in float32
    mult = np.float32(sa.reshape(())) * np.float32(sb.reshape(())) / np.float32(sy.reshape(()))
    return _requantized(ed, name, sums, np.asarray(mult, np.float32), zy)


def _moved(m: Match, ed: GraphEditor) -> Built:
    refusal = escaping(m, ed, shared=("dq_a",))
    if refusal is not None:
        return refusal
    move = m.node("move")
    (sa, za), (sy, zy) = ((np.asarray(m.value(n).const) for n in pair) for pair in (("sa", "za"), ("sy", "zy")))
    if za.dtype != zy.dtype or sa.astype(np.float32).item() != sy.astype(np.float32).item() or za.item() != zy.item():
        return Refusal(f"the scale and zero point change across the {move.op} "
                       f"({sa.item():g}, {za.item()} -> {sy.item():g}, {zy.item()})")
    if any(o is not move.outputs[0] and (ed.num_uses(o) or ed.is_output(o)) for o in move.outputs):
        return Refusal(f"the {move.op}'s other outputs are read")
    if move.op == "Resize" and move.attrs.get("mode", "nearest") != "nearest":
        return Refusal(f"a Resize in mode {move.attrs.get('mode')!r} computes new values")
    return emit(m, ed, move.op, [m.value("a"), *move.inputs[1:]], dict(move.attrs), domain=move.domain)


_MOVES = {"MaxPool": (0,), "Reshape": (1,), "Transpose": (0,), "Flatten": (0,), "Squeeze": (0, 1), "Unsqueeze": (0, 1),
          "Gather": (1,), "Slice": (2, 3, 4), "Expand": (1,), "DepthToSpace": (0,), "SpaceToDepth": (0,),
          "Resize": (1, 2, 3)}
"""The ops that only move or select their first input's values, and how many other inputs each takes."""

_DQ_A = op("DequantizeLinear", var("a"), const("sa", where=_one), const("za", where=_one), name="dq_a",
           attrs=_PLAIN)
_DQ_W = op("DequantizeLinear", const("w"), const("sw"), const("zw"), name="dq_w", attrs=_PLAIN)

_DQ_CW = op("DequantizeLinear", const("w"), const("sw"), const("zw"), name="dq_w", attrs=_PLAIN)
_DQ_B = op("DequantizeLinear", const("b"), const("sb"), const("zb"), name="dq_b", attrs=_PLAIN)


def _quantized(inner: Pattern) -> Pattern:
    return op("QuantizeLinear", inner, const("sy", where=_one), const("zy", where=_one), name="quantize",
              attrs={"block_size": 0, "precision": 0})


_SCALES = op("Mul", var("sa"), const("sw"), name="scales", commutative=True)


def _scaled(*operands: Pattern) -> Pattern:
    product = op("MatMulInteger", var("a"), const("w"), *operands, name="mmi")
    return op("Mul", op("Cast", product, name="cast", attrs={"to": 1}), _SCALES, name="mul", commutative=True)


quantized_rules = [
    Rule("recognize_qlinear_matmul",
         op("QuantizeLinear", op("MatMul", _DQ_A, _DQ_W, name="matmul"), const("sy", where=_one),
            const("zy", where=_one), name="quantize", attrs={"block_size": 0, "precision": 0}),
         _qlinear_matmul, doc="QuantizeLinear(MatMul(DequantizeLinear(a), DequantizeLinear(W))) -> QLinearMatMul"),
    *(Rule("recognize_qgemm", _quantized(op("Gemm", *operands, name="gemm")), _qgemm,
           doc="QuantizeLinear(Gemm(DequantizeLinear(a), DequantizeLinear(W), DequantizeLinear(B))) -> QGemm")
      for operands in ((_DQ_A, _DQ_CW, _DQ_B), (_DQ_A, _DQ_CW))),
    *(Rule("recognize_qlinear_conv", _quantized(op("Conv", *operands, name="conv")), _qlinear_conv,
           doc="QuantizeLinear(Conv(DequantizeLinear(x), DequantizeLinear(W), DequantizeLinear(B))) -> QLinearConv")
      for operands in ((_DQ_A, _DQ_CW, _DQ_B), (_DQ_A, _DQ_CW))),
    *(Rule("recognize_matmul_integer_to_float", _scaled(*operands), _integer_to_float,
           doc="Mul(Cast(MatMulInteger(a, W, za, zw)), Mul(a_scale, w_scale)) -> MatMulIntegerToFloat")
      for operands in ((var("za"), const("zw")), (var("za"),), ())),
    Rule("recognize_matmul_integer_to_float",
         op("Add", op("MatMulIntegerToFloat", name="product", domain="com.microsoft"), const("bias"), name="add",
            commutative=True),
         _float_bias, doc="Add(MatMulIntegerToFloat(...), bias) -> MatMulIntegerToFloat(..., bias)"),
    *(Rule("exact_depthwise_qlinear_conv",
           op("QLinearConv", var("x"), *(const(n) for n in ("sx", "zx", "w", "sw", "zw", "sy", "zy")), *bias,
              name="conv"),
           _depthwise_in_float, doc="a depthwise QLinearConv -> its exact sums as a float Conv, requantized")
      for bias in ((const("b"),), ())),
    Rule("exact_activations_qlinear_matmul",
         op("QLinearMatMul", var("a"), *(const(n) for n in ("sa", "za")), var("b"),
            *(const(n) for n in ("sb", "zb", "sy", "zy")), name="qmm"),
         _activations_in_float,
         doc="a QLinearMatMul of two activations -> its exact sums as a float MatMul, requantized"),
    *(Rule("drop_qdq_around_moves", _quantized(op(move, _DQ_A, *(var() for _ in range(rest)), name="move")), _moved,
           doc="QuantizeLinear(M(DequantizeLinear(x), ...)) at one scale -> M(x, ...), M only moving values")
      for move, counts in _MOVES.items() for rest in counts),
]


def recognize_quantized(graph: Graph, ctx: PassContext) -> Graph:
    """A new graph with ``quantized_rules`` applied (see the module doc)."""
    rules = [r for r in quantized_rules if r.name not in ctx.options.disabled]
    new, _ = rewrite(graph, rules, "recognize_quantized", ctx.log, ctx.options)
    return new


__all__ = ["quantized_rules", "recognize_quantized"]
