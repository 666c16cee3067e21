"""Graph passes (L5): one pass per file, and the optimization levels as named pipelines.

Example:
    >>> import metadef as md
    >>> g = optimize(md.import_onnx(md.zoo.build("mlp")), level="safe")
    >>> len(g.nodes) <= 7
    True
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from metadef.core.errors import MetadefError
from metadef.ir import Graph
from metadef.passes.base import GraphPass, PassContext, mark_no_fuse, run_pipeline
from metadef.passes.pipelines import LEVELS, PIPELINES
from metadef.rewrite import DecisionLog, RewriteOptions


def optimize(graph: Graph, level: str = "moderate", *, no_fuse: Iterable[str] = (),
             disable_rules: Iterable[str] = (), log: DecisionLog | None = None,
             debug_log: str | os.PathLike | None = None) -> Graph:
    """Optimize a graph at a level (``safe``, ``moderate``, ``aggressive``); returns a new graph.

    ``no_fuse``: node names or globs excluded from fusion; ``disable_rules``: rule names not to
    apply; ``log``: a DecisionLog to fill with every decision; ``debug_log``: also write the
    decisions there as JSON lines. Under ``METADEF_DEBUG=1`` each decision is logged.
    """
    if level not in PIPELINES:
        raise MetadefError(f"unknown optimization level {level!r}; choose one of {', '.join(LEVELS)}")
    ctx = PassContext(log=log if log is not None else DecisionLog(),
                      options=RewriteOptions(disabled=frozenset(disable_rules)), level=level)
    work = graph.clone()
    patterns = list(no_fuse)
    if patterns:
        marked = mark_no_fuse(work, patterns)
        if not marked:
            raise MetadefError(f"--no-fuse {patterns}: no node name matches; node names look like "
                               f"{', '.join(n.name for n in work.nodes[:3])}")
    result = run_pipeline(work, PIPELINES[level], ctx)
    if debug_log is not None:
        ctx.log.write_jsonl(debug_log)
    return result


__all__ = ["GraphPass", "LEVELS", "PIPELINES", "PassContext", "mark_no_fuse", "optimize", "run_pipeline"]
