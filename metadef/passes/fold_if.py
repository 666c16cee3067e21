"""``fold_if``: an ``If`` whose condition is a constant becomes the branch it would run.

The chosen branch's nodes are inlined into the outer graph: the branch inputs are wired to the
node's captured values (see :mod:`metadef.ops.defs.control`), the branch's constants become
outer constants, and names that are taken outside get a suffix. Nested ``If`` nodes move out
with their branch unchanged (they capture from the branch's inputs, which now are the outer
values); the rewrite engine then folds them too when their condition is constant. Inlined
types are the branch's recorded types with its input symbols bound to the captured values'
types; when the folded ``If`` had merged the two branches' types (its condition was computed
when the graph was typed), the nodes downstream are typed again from the chosen branch.

An ``If`` whose condition is not a constant is refused with the reason "condition is computed
at run time". Run ``fold_constants`` first, so a condition computed from constants is one.

Rule: ``fold_if`` (fuses=False).

Example:
    >>> import numpy as np
    >>> from metadef.ir import GraphBuilder, print_graph
    >>> from metadef.passes.base import PassContext
    >>> from metadef.shape import parse_type
    >>> def branch(op):
    ...     b = GraphBuilder(op.lower())
    ...     x = b.input("x", parse_type("f32[n]"))
    ...     b.output(*b.node(op, [x], name=op.lower()))
    ...     return b.build()
    >>> b = GraphBuilder("g")
    >>> x = b.input("x", parse_type("f32[n]"))
    >>> c = b.const("c", np.array(False))
    >>> y, = b.node("If", [c, x], {"then_branch": branch("Relu"), "else_branch": branch("Neg")},
    ...             name="if", outputs=["y"])
    >>> b.output(y)
    >>> ctx = PassContext()
    >>> print(print_graph(fold_if(b.build(), ctx)), end="")
    graph g(%x: f32[n]) -> (%y) {
      %y: f32[n] = Neg(%x) @neg
      return %y
    }
    >>> ctx.log.lines()
    ['taken fold_if at if']
"""

from __future__ import annotations

from metadef.ir import Graph, Node, Value
from metadef.ops import infer_types
from metadef.ops.defs.control import input_bindings, rebind
from metadef.passes.base import PassContext
from metadef.rewrite import GraphEditor, Match, Refusal, Rule, op, rewrite
from metadef.rewrite.engine import Built

REFUSED_AT_RUN_TIME = "condition is computed at run time"


def _inline(ed: GraphEditor, node: Node, branch: Graph) -> list[Value]:
    """Add the branch's constants and nodes to the editor's graph; its outputs, outside."""
    captured = list(node.inputs[1:])
    bindings, _ = input_bindings(branch, [v.type for v in captured])
    outer: dict[int, Value] = {id(v): c for v, c in zip(branch.inputs, captured)}
    for v in branch.constants:
        outer[id(v)] = ed.const(v.name, v.const)
    for n in branch.nodes:
        types = [rebind(o.type, bindings) for o in n.outputs]
        for t in types:
            for s in (t.free_symbols if t is not None else ()):
                ed.graph.env.declare(s)
        outs = ed.add(n.op, [None if v is None else outer[id(v)] for v in n.inputs], dict(n.attrs),
                      name=n.name, domain=n.domain, n_outputs=len(n.outputs), types=types, meta=n.meta)
        outer.update(zip((id(o) for o in n.outputs), outs))
    return [outer[id(v)] for v in branch.outputs]


def _fold(m: Match, ed: GraphEditor, retyped: list[tuple[Value, Value]]) -> Built:
    node = m.node("root")
    cond = node.inputs[0]
    if cond is None or cond.const is None:
        return Refusal(REFUSED_AT_RUN_TIME)
    if cond.const.size != 1:
        return Refusal(f"condition %{cond.name} holds {cond.const.size} elements, not one")
    chosen = "then_branch" if bool(cond.const.reshape(-1)[0]) else "else_branch"
    outs = _inline(ed, node, node.attrs[chosen])
    retyped.extend((old, new) for old, new in zip(node.outputs, outs) if str(old.type) != str(new.type))
    return outs


def fold_if_rules(retyped: list[tuple[Value, Value]] | None = None) -> list[Rule]:
    """The rule table: one rule, at ``If`` nodes. ``retyped`` collects (old output, new value)
    pairs whose types differ, for :func:`fold_if` to type the nodes downstream again."""
    sink = retyped if retyped is not None else []
    return [Rule("fold_if", op("If", name="root"), lambda m, ed: _fold(m, ed, sink), fuses=False,
                 doc="an If with a constant condition -> the chosen branch, inlined")]


def _retype_downstream(graph: Graph, changed: set[int]) -> None:
    """Infer again the types of nodes that read a value whose type changed (in place: the
    graph is this pass's own new graph)."""
    for n in graph.nodes:
        if not any(v is not None and id(v) in changed for v in n.inputs):
            continue
        types = infer_types(n.metaop, n.name, [None if v is None else v.type for v in n.inputs], n.attrs,
                            [None if v is None else v.const for v in n.inputs], graph.env, len(n.outputs))
        for o, t in zip(n.outputs, types):
            if str(o.type) != str(t):
                o.type = t
                changed.add(id(o))


def fold_if(graph: Graph, ctx: PassContext) -> Graph:
    """A new graph where every ``If`` with a constant condition is its branch (see the module doc)."""
    retyped: list[tuple[Value, Value]] = []
    # A disabled rule stays in the table: the engine logs it as the reason for each refusal.
    new, _ = rewrite(graph, fold_if_rules(retyped), "fold_if", ctx.log, ctx.options)
    if retyped:
        _retype_downstream(new, {id(v) for _, v in retyped})
    return new


__all__ = ["REFUSED_AT_RUN_TIME", "fold_if", "fold_if_rules"]
