"""``metadef report``: one self-contained HTML page about a model, with four figures.

1. **The optimized graph** (``aggressive``), laid out by topological depth in columns, each
   fused group a box labelled with its member ops and colored by its kind
   (:mod:`~metadef.report.layout`, :func:`~metadef.report.figures.graph_figure`).
2. **The memory timeline**: each intermediate tensor's lifetime against its offset in the
   planned arena, with the planned peak and the lifetime lower bound
   (:func:`~metadef.report.collect.memory_timeline`).
3. **Time per fused group** on the x86 backend, the slowest first
   (:func:`metadef.benchmark.step_times`).
4. **metadef against ONNX Runtime**: median latencies and their ratio
   (:func:`metadef.cli_bench.run_bench`).

A header names the model, its inputs, the node counts before and after optimization, the
metadef version and the machine; tables under each figure hold the numbers behind it. The
figures are inline (``data:`` URIs: the page needs nothing else) and also written as PNGs to
``<stem>_files/`` beside the page.

Example:
    >>> import tempfile, pathlib
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "report.html"
    >>> result = write_report("mlp", out, runs=2, threads=[1], bench=False)
    >>> result.html.name, [p.name for p in result.figures.values()]
    ('report.html', ['graph.png', 'memory.png', 'steps.png'])

    $ metadef report resnet50 -o resnet50.html --threads 1 2 --runs 20
"""

from metadef.report.build import FIGURES, STAGES, ReportResult, write_report
from metadef.report.command import report_command

__all__ = ["FIGURES", "STAGES", "ReportResult", "report_command", "write_report"]
