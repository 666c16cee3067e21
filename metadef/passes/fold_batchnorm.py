"""``fold_batchnorm``: fold an inference BatchNormalization into the Conv, Gemm or MatMul that
feeds it.

BatchNormalization computes ``y = s * x + t`` per channel (axis 1) with
``s = scale / sqrt(var + epsilon)`` and ``t = B - mean * s``. When ``x`` is a contraction whose
output channels are that axis, ``s`` scales the weights along their output-channel axis and
``t`` joins the bias: the BatchNormalization node disappears. The folded weights and bias are
new constants, computed in float64 and cast back to the weight's dtype.

Rules (``batchnorm_rules``; names as in logs and ``--disable-rule``):

- ``fold_bn_into_conv``: any group, stride, dilation and pads; a bias is created if absent.
- ``fold_bn_into_gemm``: ``transB`` 0 or 1, any ``alpha``/``beta``; C (made or updated)
  becomes ``beta * s * C + t`` and ``beta`` becomes 1.
- ``fold_bn_into_matmul``: ``MatMul(x, W)`` with a constant 2-D ``W`` and a 2-D result (so
  axis 1 is W's columns); becomes ``MatMul(x, W * s) + bias``.

Each refuses, with a reason in the decision log, when the BatchNormalization statistics or
the weights are not constants, when the producer's output has other consumers (or is a graph
output), when a node is marked ``no_fuse``, or when the shapes do not line up.

Example:
    >>> import numpy as np
    >>> from metadef.ir import parse_graph
    >>> from metadef.passes.base import PassContext
    >>> ones = np.ones(2, np.float32)
    >>> g = parse_graph('''graph g(%x: f32[n,3]) -> (%y) {
    ...   %w: f32[3,2] = const
    ...   %s: f32[2] = const
    ...   %b: f32[2] = const
    ...   %mu: f32[2] = const
    ...   %var: f32[2] = const
    ...   %h: f32[n,2] = MatMul(%x, %w) @mm
    ...   %y: f32[n,2] = BatchNormalization(%h, %s, %b, %mu, %var) @bn
    ...   return %y
    ... }''', constants={"w": np.ones((3, 2), np.float32), "s": ones, "b": ones, "mu": ones,
    ...                  "var": ones})
    >>> ctx = PassContext()
    >>> [n.op for n in fold_batchnorm(g, ctx).nodes], ctx.log.lines()
    (['MatMul', 'Add'], ['taken fold_bn_into_matmul at bn (bn, mm)'])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from metadef.format import release_mapped
from metadef.ir import Graph, Node, Value
from metadef.passes.base import PassContext
from metadef.rewrite import GraphEditor, Match, Refusal, Rule, op, rewrite, var
from metadef.rewrite.engine import Built
from metadef.rewrite.pattern import Pattern

_STATS = ("scale", "bias", "mean", "var")


def _batchnorm_of(producer: Pattern) -> Pattern:
    """BatchNormalization(producer, scale, B, mean, var), the BN node bound to ``bn``."""
    return op("BatchNormalization", producer, *(var(s) for s in _STATS), name="bn")


def _attr(node: Node, key: str) -> Any:
    """An attribute's value, or the op's default when the node does not set it."""
    if node.attrs.get(key) is not None:
        return node.attrs[key]
    spec = node.metaop.attrs.get(key)
    return None if spec is None else spec.default


def _not_const(value: Value, what: str) -> Refusal:
    return Refusal(f"{what} %{value.name} is not a constant")


def _bn_factors(m: Match, ed: GraphEditor, channels: int) -> tuple[np.ndarray, np.ndarray] | Refusal:
    """``(s, t)`` in float64, each of shape ``[channels]``, or why they cannot be had."""
    bn = m.node("bn")
    if _attr(bn, "training_mode"):
        return Refusal("the BatchNormalization is in training mode (it normalizes with the batch's statistics)")
    for extra in bn.outputs[1:]:
        if ed.num_uses(extra):
            return Refusal(f"the BatchNormalization output %{extra.name} (running statistics) is used")
    arrays = {}
    for stat in _STATS:
        v = m.value(stat)
        if v.const is None:
            return _not_const(v, f"BatchNormalization {stat}")
        arrays[stat] = np.asarray(v.const, np.float64)
        if arrays[stat].shape != (channels,):
            return Refusal(f"BatchNormalization {stat} %{v.name} has shape {list(arrays[stat].shape)}, "
                           f"not [{channels}] (the producer's output channels)")
    s = arrays["scale"] / np.sqrt(arrays["var"] + float(_attr(bn, "epsilon")))
    return s, arrays["bias"] - arrays["mean"] * s


def _scaled(weight: np.ndarray, s: np.ndarray, axis: int) -> np.ndarray:
    """``weight * s`` along ``axis`` in float64, cast back to the weight's dtype."""
    shape = [1] * weight.ndim
    shape[axis] = s.size
    scaled = (np.asarray(weight, np.float64) * s.reshape(shape)).astype(weight.dtype)
    release_mapped(weight)  # mapped from a .mdef file: the folded copy replaces it, its pages leave the RSS
    return scaled


# --------------------------------------------------------------------------------- rules


def _fold_into_conv(m: Match, ed: GraphEditor) -> Built:
    conv = m.node("producer")
    x, w, b = (*conv.inputs, None)[:3]
    if w.const is None:
        return _not_const(w, "the Conv weight")
    if b is not None and b.const is None:
        return _not_const(b, "the Conv bias")
    factors = _bn_factors(m, ed, int(w.const.shape[0]))
    if isinstance(factors, Refusal):
        return factors
    s, t = factors
    bias = t if b is None else np.asarray(b.const, np.float64) * s + t
    new_w = ed.const(f"{w.name}_bn", _scaled(w.const, s, 0))
    new_b = ed.const(f"{b.name}_bn" if b is not None else f"{conv.name}_bias_bn", bias.astype(w.const.dtype))
    y, = ed.add("Conv", [x, new_w, new_b], dict(conv.attrs), name=f"{conv.name}_bn", meta=dict(conv.meta))
    return y


def _fold_into_gemm(m: Match, ed: GraphEditor) -> Built:
    gemm = m.node("producer")
    a, w, c = (*gemm.inputs, None)[:3]
    if w.const is None:
        return _not_const(w, "the Gemm weight B")
    if c is not None and c.const is None:
        return _not_const(c, "the Gemm bias C")
    n_axis = 0 if _attr(gemm, "transB") else 1
    factors = _bn_factors(m, ed, int(w.const.shape[n_axis]))
    if isinstance(factors, Refusal):
        return factors
    s, t = factors
    bias = t if c is None else float(_attr(gemm, "beta")) * np.asarray(c.const, np.float64) * s + t
    new_w = ed.const(f"{w.name}_bn", _scaled(w.const, s, n_axis))
    new_c = ed.const(f"{c.name}_bn" if c is not None else f"{gemm.name}_bias_bn", bias.astype(w.const.dtype))
    attrs = {**gemm.attrs, "beta": 1.0}
    y, = ed.add("Gemm", [a, new_w, new_c], attrs, name=f"{gemm.name}_bn", meta=dict(gemm.meta))
    return y


def _fold_into_matmul(m: Match, ed: GraphEditor) -> Built:
    x, w, out = m.value("x"), m.value("w"), m.value("producer")
    if w.const is None:
        return _not_const(w, "the MatMul weight")
    if w.const.ndim != 2:
        return Refusal(f"the MatMul weight %{w.name} has rank {w.const.ndim}, not 2")
    rank = None if out.type is None or out.type.shape is None else len(out.type.shape)
    if rank != 2:
        return Refusal(f"BatchNormalization normalizes axis 1 of the rank-{rank} MatMul output "
                       f"%{out.name}, which is not the weight's columns")
    factors = _bn_factors(m, ed, int(w.const.shape[1]))
    if isinstance(factors, Refusal):
        return factors
    s, t = factors
    mm = m.node("producer")
    new_w = ed.const(f"{w.name}_bn", _scaled(w.const, s, 1))
    new_b = ed.const(f"{mm.name}_bias_bn", t.astype(w.const.dtype))
    h, = ed.add("MatMul", [x, new_w], dict(mm.attrs), name=f"{mm.name}_bn", meta=dict(mm.meta))
    y, = ed.add("Add", [h, new_b], name=f"{mm.name}_bn_add")
    return y


batchnorm_rules = [
    Rule("fold_bn_into_conv", _batchnorm_of(op("Conv", name="producer", single_use=True)),
         _fold_into_conv, doc="Conv -> BatchNormalization: scale the filters, fold the bias."),
    Rule("fold_bn_into_gemm", _batchnorm_of(op("Gemm", name="producer", single_use=True)),
         _fold_into_gemm, doc="Gemm -> BatchNormalization: scale B's output columns, fold C."),
    Rule("fold_bn_into_matmul",
         _batchnorm_of(op("MatMul", var("x"), var("w"), name="producer", single_use=True)),
         _fold_into_matmul, doc="MatMul(x, const W) -> BatchNormalization: MatMul + Add."),
]


def fold_batchnorm(graph: Graph, ctx: PassContext) -> Graph:
    """A new graph with ``batchnorm_rules`` applied (see the module doc)."""
    new, _ = rewrite(graph, batchnorm_rules, "fold_batchnorm", ctx.log, ctx.options)
    return new


__all__ = ["batchnorm_rules", "fold_batchnorm"]
