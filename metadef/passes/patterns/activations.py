"""Activations that exporters decompose, recognized as one node each.

- ``recognize_gelu``: ``x * 0.5 * (1 + Erf(x / sqrt(2)))`` (Div by sqrt(2) or Mul by
  1/sqrt(2); the 0.5 multiplied first, last, into ``1 + Erf``, or a Div by 2 at the end) ->
  ``Gelu``; ``0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))`` (``x^3`` as Pow or as
  two Muls) -> ``Gelu(approximate="tanh")``. ONNX has Gelu from opset 20: the graph's opset
  import is raised when one is introduced.
- ``recognize_silu``: ``x * Sigmoid(x)`` -> ``ai.metadef::SiLU``.
- ``recognize_hardswish``: ``x * HardSigmoid(x)`` (alpha 1/6, beta 0.5) and
  ``x * Clip(x + 3, 0, 6) / 6`` (Div by 6 or Mul by 1/6, before or after the product) ->
  ``HardSwish``.

Every constant is checked to within 1e-6 relative; a pattern whose constants differ is not
that activation and stays as it is.

Example:
    >>> sorted({r.name for r in activation_rules})
    ['recognize_gelu', 'recognize_hardswish', 'recognize_silu']
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from metadef.passes.patterns.common import about, emit, escaping, scalar
from metadef.rewrite import GraphEditor, Match, Rule, const, op, var
from metadef.rewrite.engine import Built
from metadef.rewrite.pattern import Pattern

SQRT2 = math.sqrt(2.0)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_TANH_CUBIC = 0.044715


def _half_x_times(x: Pattern, p: Pattern) -> Iterator[Pattern]:
    """``0.5 * x * p`` in the orders exporters write it; the root is bound to ``act``."""
    half = const("half", where=scalar(0.5))
    yield op("Mul", op("Mul", x, p, name="x_times", commutative=True), half, name="act", commutative=True)
    yield op("Mul", op("Mul", x, half, name="half_x", commutative=True), p, name="act", commutative=True)
    yield op("Mul", x, op("Mul", p, half, name="half_p", commutative=True), name="act", commutative=True)
    yield op("Div", op("Mul", x, p, name="x_times", commutative=True), const("two", where=scalar(2.0)),
             name="act")


def _plus_one(inner: Pattern) -> Pattern:
    return op("Add", inner, const("one", where=scalar(1.0)), name="plus_one", commutative=True)


def _erf_gelu() -> Iterator[Pattern]:
    x = var("x")
    for arg in (op("Div", x, const("c", where=scalar(SQRT2)), name="scaled"),
                op("Mul", x, const("c", where=scalar(1 / SQRT2)), name="scaled", commutative=True)):
        yield from _half_x_times(x, _plus_one(op("Erf", arg, name="erf")))


def _tanh_gelu() -> Iterator[Pattern]:
    x = var("x")
    for cube in (op("Pow", x, const("three", where=scalar(3.0)), name="cube"),
                 op("Mul", op("Mul", x, x, name="square"), x, name="cube", commutative=True)):
        cubic = op("Mul", cube, const("k", where=scalar(GELU_TANH_CUBIC)), name="cubic", commutative=True)
        inner = op("Add", x, cubic, name="inner", commutative=True)
        scaled = op("Mul", inner, const("c", where=scalar(SQRT_2_OVER_PI)), name="scaled", commutative=True)
        yield from _half_x_times(x, _plus_one(op("Tanh", scaled, name="tanh")))


def _hardswish() -> Iterator[Pattern]:
    x = var("x")
    hard_sigmoid = op("HardSigmoid", x, name="hard_sigmoid", attrs={"alpha": about(1 / 6), "beta": about(0.5)})
    yield op("Mul", x, hard_sigmoid, name="act", commutative=True)
    plus_three = op("Add", x, const("three", where=scalar(3.0)), name="plus_three", commutative=True)
    relu6 = op("Clip", plus_three, const("low", where=scalar(0.0)), const("high", where=scalar(6.0)),
               name="relu6")
    six, sixth = const("six", where=scalar(6.0)), const("sixth", where=scalar(1 / 6))
    yield op("Div", op("Mul", x, relu6, name="x_times", commutative=True), six, name="act")
    yield op("Mul", op("Mul", x, relu6, name="x_times", commutative=True), sixth, name="act", commutative=True)
    yield op("Mul", x, op("Div", relu6, six, name="over_six"), name="act", commutative=True)
    yield op("Mul", x, op("Mul", relu6, sixth, name="over_six", commutative=True), name="act", commutative=True)


def _replace_by(op_name: str, attrs: dict[str, str] | None = None, domain: str = ""):
    """A build function: one ``op_name`` node applied to ``x``."""
    def build(m: Match, ed: GraphEditor) -> Built:
        refusal = escaping(m, ed)
        if refusal is not None:
            return refusal
        return emit(m, ed, op_name, [m.value("x")], dict(attrs or {}), domain)
    return build


_GELU = "x * 0.5 * (1 + Erf(x / sqrt(2))) -> Gelu"
_GELU_TANH = "0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 x^3))) -> Gelu(approximate=tanh)"

gelu_rules = [
    *(Rule("recognize_gelu", p, _replace_by("Gelu", {"approximate": "none"}), doc=_GELU) for p in _erf_gelu()),
    *(Rule("recognize_gelu", p, _replace_by("Gelu", {"approximate": "tanh"}), doc=_GELU_TANH)
      for p in _tanh_gelu()),
]

silu_rules = [
    Rule("recognize_silu", op("Mul", var("x"), op("Sigmoid", var("x"), name="sigmoid"), name="act",
                              commutative=True),
         _replace_by("SiLU", domain="ai.metadef"), doc="x * Sigmoid(x) -> ai.metadef::SiLU"),
]

hardswish_rules = [Rule("recognize_hardswish", p, _replace_by("HardSwish"),
                        doc="x * HardSigmoid(x) | x * Relu6(x + 3) / 6 -> HardSwish") for p in _hardswish()]

activation_rules = [*gelu_rules, *silu_rules, *hardswish_rules]

__all__ = ["activation_rules", "gelu_rules", "hardswish_rules", "silu_rules"]
