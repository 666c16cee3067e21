"""``eliminate_dead_code``: drop the nodes and constants that no graph output depends on.

Every editor's ``finish()`` already drops dead code; this pass makes it an explicit, logged
stage: one ``remove_dead_node`` decision per node removed, and a summary decision
(``eliminate_dead_code`` at the graph) with the counts. Graph inputs stay, used or not: they
are the model's interface.

Example:
    >>> from metadef.ir import parse_graph
    >>> from metadef.passes.base import PassContext
    >>> g = parse_graph('''graph g(%x: f32[n]) -> (%y) {
    ...   %w: f32[] = const [2.0]
    ...   %unused: f32[n] = Mul(%x, %w) @mul
    ...   %y: f32[n] = Relu(%x) @relu
    ...   return %y
    ... }''')
    >>> ctx = PassContext()
    >>> [n.op for n in eliminate_dead_code(g, ctx).nodes]
    ['Relu']
    >>> ctx.log.lines()
    ['taken remove_dead_node at mul', 'taken eliminate_dead_code at g: removed 1 nodes and 1 constants']
"""

from __future__ import annotations

import logging

from metadef.ir import Graph
from metadef.passes.base import PassContext
from metadef.rewrite import GraphEditor

log = logging.getLogger("metadef.passes")


def eliminate_dead_code(graph: Graph, ctx: PassContext) -> Graph:
    """A new graph without dead nodes and constants (see the module doc)."""
    work = graph.clone()
    before_nodes = list(work.nodes)
    before_constants = len(work.constants)
    new = GraphEditor(work).finish()
    live = {id(n) for n in new.nodes}
    dead = [n for n in before_nodes if id(n) not in live]
    for n in dead:
        ctx.log.record("eliminate_dead_code", "remove_dead_node", n.name, [n.name], True)
    removed_constants = before_constants - len(new.constants)
    if dead or removed_constants:
        summary = f"removed {len(dead)} nodes and {removed_constants} constants"
        ctx.log.record("eliminate_dead_code", "eliminate_dead_code", graph.name, [], True, summary)
        log.info("eliminate_dead_code on %s: %s", graph.name, summary)
    return new


__all__ = ["eliminate_dead_code"]
