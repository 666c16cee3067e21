"""The rewrite engine: named rule tables applied to a fixpoint, every decision recorded.

A rule is data: a name, a pattern and a ``build`` function (tinygrad's style). ``build(m, ed)``
returns the value(s) that replace the pattern root's output(s), ``None`` for "no match after
all", or a :class:`Refusal` with a reason that goes to the decision log.

Example:
    >>> from metadef.ir import parse_graph, print_graph
    >>> from metadef.rewrite.pattern import op, var
    >>> rules = [Rule("drop_identity", op("Identity", var("x")), lambda m, ed: m.value("x"))]
    >>> g = parse_graph('''graph g(%x: f32[n]) -> (%y) {
    ...   %i: f32[n] = Identity(%x) @id
    ...   %y: f32[n] = Relu(%i) @relu
    ...   return %y
    ... }''')
    >>> new, log = rewrite(g, rules, "cleanup")
    >>> [n.op for n in new.nodes], log.lines()
    (['Relu'], ['taken drop_identity at id'])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from metadef.ir import Graph, Node, Value
from metadef.rewrite.decisions import DecisionLog
from metadef.rewrite.editor import GraphEditor
from metadef.rewrite.pattern import Match, Pattern, match, root_ops

MAX_ROUNDS = 32


@dataclass(frozen=True)
class Refusal:
    """What ``build`` returns to decline a match, with the reason to log."""

    reason: str


Built = Value | Sequence[Value] | Refusal | None


@dataclass(frozen=True)
class Rule:
    """A named rewrite. Any rule can be disabled by name (``--disable-rule``). ``fuses``: the
    rule merges nodes, so ``no_fuse`` marks and the pattern's soft conditions (single use)
    apply to it (cleanup rules set it False)."""

    name: str
    pattern: Pattern
    build: Callable[[Match, GraphEditor], Built]
    fuses: bool = True
    doc: str = ""


@dataclass
class RewriteOptions:
    """What the user asked of the optimizer: rules to skip."""

    disabled: frozenset[str] = frozenset()


def _index(rules: Sequence[Rule]) -> tuple[dict[str, list[Rule]], list[Rule]]:
    by_op: dict[str, list[Rule]] = {}
    anywhere: list[Rule] = []
    for r in rules:
        ops = root_ops(r.pattern)
        if ops is None:
            anywhere.append(r)
        else:
            for o in ops:
                by_op.setdefault(o, []).append(r)
    return by_op, anywhere


def _replace(ed: GraphEditor, node: Node, built: Value | Sequence[Value]) -> None:
    new = [built] if isinstance(built, Value) else list(built)
    for old, value in zip(node.outputs, new):
        ed.replace_uses(old, value)


def _try(rule: Rule, node: Node, ed: GraphEditor, log: DecisionLog, pass_name: str,
         options: RewriteOptions) -> bool:
    m = match(rule.pattern, node.outputs[getattr(rule.pattern, "output", 0)], ed.num_uses)
    if m is None:
        return False
    names = [n.name for n in m.nodes]
    reasons = []
    if rule.name in options.disabled:
        reasons.append(f"rule {rule.name} is disabled")
    if rule.fuses:
        if node.meta.get("no_fuse"):
            reasons.append(f"{node.name} is marked no_fuse")
        reasons.extend(m.refusals)
    if reasons:
        log.record(pass_name, rule.name, node.name, names, False, "; ".join(reasons))
        return False
    built = rule.build(m, ed)
    if built is None:
        return False
    if isinstance(built, Refusal):
        log.record(pass_name, rule.name, node.name, names, False, built.reason)
        return False
    _replace(ed, node, built)
    log.record(pass_name, rule.name, node.name, names, True)
    return True


def apply_rules(ed: GraphEditor, rules: Sequence[Rule], log: DecisionLog, pass_name: str,
                options: RewriteOptions | None = None) -> int:
    """Apply ``rules`` on an editor until nothing fires; returns how many rewrites were taken."""
    options = options or RewriteOptions()
    by_op, anywhere = _index(rules)
    fired = 0
    for _ in range(MAX_ROUNDS):
        changed = False
        for node in list(ed.graph.nodes):
            if ed.is_dead(node) or not any(ed.num_uses(o) for o in node.outputs):
                continue
            for rule in by_op.get(node.op, []) + anywhere:
                if _try(rule, node, ed, log, pass_name, options):
                    fired += 1
                    changed = True
                    break
        if not changed:
            break
        ed.graph = ed.finish()
    return fired


def rewrite(graph: Graph, rules: Sequence[Rule], pass_name: str, log: DecisionLog | None = None,
            options: RewriteOptions | None = None) -> tuple[Graph, DecisionLog]:
    """A new graph with ``rules`` applied to a fixpoint (the input graph is not touched)."""
    log = log if log is not None else DecisionLog()
    ed = GraphEditor(graph.clone())
    apply_rules(ed, rules, log, pass_name, options)
    return ed.finish(), log


__all__ = ["Built", "MAX_ROUNDS", "Refusal", "RewriteOptions", "Rule", "apply_rules", "rewrite"]
