"""What a pass is, and how a pipeline of passes runs.

A pass is a plain function ``(graph, ctx) -> Graph`` that returns a new graph (it never edits
the one it is given); its name is the function's name, and the name shows up in logs, timings
and errors. A pipeline is a named list of passes (``metadef.passes.PIPELINES``).

Example:
    >>> from metadef.ir import parse_graph
    >>> g = parse_graph("graph g(%x: f32[n]) -> (%y) { %y: f32[n] = Relu(%x) return %y }")
    >>> def nothing(graph, ctx):
    ...     return graph.clone()
    >>> ctx = PassContext()
    >>> run_pipeline(g, [nothing], ctx).nodes[0].op, list(ctx.timings)
    ('Relu', ['nothing', 'refine_types'])
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from metadef.core import flags
from metadef.core.errors import MetadefError
from metadef.ir import Graph, verify
from metadef.passes.refine_types import refine_types
from metadef.rewrite import DecisionLog, RewriteOptions


@dataclass
class PassContext:
    """Shared by the passes of one ``optimize`` call: the decision log, the user's options
    (rules disabled by name), the level, and the time each pass took."""

    log: DecisionLog = field(default_factory=DecisionLog)
    options: RewriteOptions = field(default_factory=RewriteOptions)
    level: str = "moderate"
    verify: bool = field(default_factory=flags.VERIFY.get)
    timings: dict[str, float] = field(default_factory=dict)


GraphPass = Callable[[Graph, PassContext], Graph]


def run_pipeline(graph: Graph, passes: Sequence[GraphPass], ctx: PassContext) -> Graph:
    """Run passes in order, then make value-dependent sizes that folding has made known precise
    (:func:`~metadef.passes.refine_types.refine_types`); with ``ctx.verify``
    (``METADEF_VERIFY=1``) the verifier checks the graph, types included, after every pass
    (refined first) and names the pass that broke it."""
    for p in passes:
        name = getattr(p, "__name__", repr(p))
        t0 = time.perf_counter()
        try:
            graph = p(graph, ctx)
        except MetadefError as e:
            raise type(e)(f"in pass {name}: {e}") from e
        ctx.timings[name] = ctx.timings.get(name, 0.0) + time.perf_counter() - t0
        if ctx.verify:
            graph = refine_types(graph)
            verify(graph, types=True, stage=f"pass {name}")
    if passes and not ctx.verify:
        t0 = time.perf_counter()
        graph = refine_types(graph)
        ctx.timings["refine_types"] = time.perf_counter() - t0
    return graph


def mark_no_fuse(graph: Graph, patterns: Iterable[str]) -> list[str]:
    """Mark the nodes whose name matches any glob in ``patterns`` as excluded from fusion
    (``node.meta["no_fuse"] = True``, as the API would); returns the names marked."""
    pats = list(patterns)
    marked = []
    for n in graph.nodes:
        if any(fnmatch.fnmatchcase(n.name, p) for p in pats):
            n.meta["no_fuse"] = True
            marked.append(n.name)
    return marked


__all__ = ["GraphPass", "PassContext", "mark_no_fuse", "run_pipeline"]
