"""``recognize_patterns``: decomposed patterns, as exporters emit them, become one op each.

``recognition_rules`` (rule names as in logs and ``--disable-rule``; the tables live in
``metadef.passes.patterns``):

- ``recognize_layernorm``: ReduceMean, Sub, Pow, ReduceMean, Add(eps), Sqrt, Div, Mul(gamma),
  Add(beta) and its variants -> ``LayerNormalization``;
- ``recognize_gelu``: the Erf form -> ``Gelu``; the tanh approximation ->
  ``Gelu(approximate="tanh")``;
- ``recognize_silu``: ``x * Sigmoid(x)`` -> ``ai.metadef::SiLU``;
- ``recognize_hardswish``: ``x * HardSigmoid(x)``, ``x * Relu6(x + 3) / 6`` -> ``HardSwish``;
- ``recognize_attention``: ``softmax(Q Kt / sqrt(d) + mask) V`` -> ``ai.metadef::Attention``;
- ``recognize_onnx_attention``: ONNX's ``Attention`` (opset 23) in its plain form (no causal
  mask, softcap, window, past or grouped heads) -> ``ai.metadef::Attention``.

A rule refuses, with the reason in the decision log, when a value inside the pattern is also
read outside it or a node is marked ``no_fuse``; it does not fire when a constant differs
from what the op needs (beyond 1e-6 relative).

Opset: introducing an op raises the graph's opset import to the first version that has it
(``LayerNormalization`` 17, ``HardSwish`` 14, ``Gelu`` 20) and imports the ``ai.metadef``
domain for SiLU and Attention. The bump belongs here, with the op's introduction, because
only this pass knows which new ops the graph now holds; ``export_onnx`` writes
``graph.opset`` as it is.

Example:
    >>> from metadef.ir import parse_graph
    >>> from metadef.passes.base import PassContext
    >>> g = parse_graph('''graph g(%x: f32[n]) -> (%y) {
    ...   %s: f32[n] = Sigmoid(%x) @sig
    ...   %y: f32[n] = Mul(%x, %s) @mul
    ...   return %y
    ... }''')
    >>> ctx = PassContext()
    >>> new = recognize_patterns(g, ctx)
    >>> [n.qualop for n in new.nodes], ctx.log.lines(), new.opset["ai.metadef"]
    (['ai.metadef::SiLU'], ['taken recognize_silu at mul (mul, sig)'], 1)
"""

from __future__ import annotations

from metadef.ir import Graph
from metadef.passes.base import PassContext
from metadef.passes.patterns.activations import gelu_rules, hardswish_rules, silu_rules
from metadef.passes.patterns.attention import attention_rules
from metadef.passes.patterns.layernorm import layernorm_rules
from metadef.rewrite import rewrite

recognition_rules = [*layernorm_rules, *gelu_rules, *silu_rules, *hardswish_rules, *attention_rules]


def recognize_patterns(graph: Graph, ctx: PassContext) -> Graph:
    """A new graph with ``recognition_rules`` applied (see the module doc)."""
    new, _ = rewrite(graph, recognition_rules, "recognize_patterns", ctx.log, ctx.options)
    return new


__all__ = ["recognition_rules", "recognize_patterns"]
