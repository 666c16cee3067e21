"""What a node costs to compute again, read off its semantics: for fusion decisions.

A reduction group inlines its prologue into each statement of the anchor that reads it
(Softmax reads its input three times: the maximum, the sum, the output), so an expensive
producer absorbed there is computed three times per element where, left outside, it would be
computed once and read back. :func:`passes_over` counts the anchor's statements that read an
input; :func:`expression_cost` weighs a node's index expressions (a transcendental function
:data:`TRANSCENDENTAL_COST` steps, a division :data:`DIVISION_COST`, any other operation one).
Both come from the semantics layer, not from op names.

Example:
    >>> from metadef.ir import parse_graph
    >>> g = parse_graph('''graph g(%x: f32[n,8]) -> (%y) {
    ...   %e: f32[n,8] = Tanh(%x) @tanh
    ...   %y: f32[n,8] = Softmax(%e) @softmax
    ...   return %y }''')
    >>> passes_over(g.nodes[1], 0), expression_cost(g.nodes[0])
    (3, 8)
"""

from __future__ import annotations

from metadef.analysis.programs import program_of
from metadef.ir import Node
from metadef.ops.numpy_eval.run import tensor_names
from metadef.ops.semantic_tree import Binary, Call, Unary

TRANSCENDENTAL = frozenset({"exp", "expm1", "log", "tanh", "erf", "ndtr", "sigmoid", "softplus", "sin", "cos",
                            "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "pow"})
"""Functions whose vector code is a polynomial and a range reduction: tens of instructions."""

TRANSCENDENTAL_COST = 8
DIVISION_COST = 4
"""A division takes several times an addition's throughput (``vdivps``)."""


def passes_over(node: Node, index: int) -> int:
    """How many of ``node``'s statements read its input ``index`` (1 where its semantics are
    not known here).

    Example:
        >>> from metadef.ir import parse_graph
        >>> g = parse_graph("graph g(%x: f32[n,8]) -> (%y) { %y: f32[n] = ReduceSum(%x) return %y }")
        >>> passes_over(g.nodes[0], 0)
        1
    """
    program = program_of(node)
    if program is None:
        return 1
    name = tensor_names(node.metaop, len(node.inputs))[index]
    return max(1, sum(any(a.tensor == name for a in s.rhs.accesses()) for s in program.statements))


def expression_cost(node: Node) -> int | None:
    """The operations ``node``'s statements take an element, weighted (see the module doc);
    None where its semantics are not known here.

    Example:
        >>> from metadef.ir import parse_graph
        >>> g = parse_graph("graph g(%x: f32[n]) -> (%y) { %y: f32[n] = Relu(%x) return %y }")
        >>> expression_cost(g.nodes[0])
        1
    """
    program = program_of(node)
    if program is None:
        return None
    cost = 0
    for statement in program.statements:
        for e in statement.rhs.walk():
            if isinstance(e, Call):
                cost += TRANSCENDENTAL_COST if e.func in TRANSCENDENTAL else 1
            elif isinstance(e, Binary):
                cost += DIVISION_COST if e.op == "/" else 1
            elif isinstance(e, Unary):
                cost += 1
    return cost


__all__ = ["DIVISION_COST", "TRANSCENDENTAL", "TRANSCENDENTAL_COST", "expression_cost", "passes_over"]
