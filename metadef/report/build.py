"""``write_report``: measure a model, draw the four figures, write the page and its PNGs.

The steps, in order (each reported to ``progress``): load the model
(:func:`metadef.cli_bench.load_model`) and optimize it at ``aggressive``; compile it for x86;
time each step (:func:`metadef.benchmark.step_times`); plan the arena of the intermediates
(:mod:`metadef.analysis`); measure metadef against ONNX Runtime
(:func:`metadef.cli_bench.run_bench`, unless ``bench=False``); draw; write. The PNGs go to
``<stem>_files/`` next to the page, then the page; each file is written to a temporary name
and renamed, so no half-written file is ever left under the final name.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import metadef as md
from metadef.backends.x86.threads import current_threads, set_threads
from metadef.benchmark import TRACE_RUNS, example_inputs
from metadef.cli_bench import BenchRow, load_model, run_bench
from metadef.cli_progress import StageProgress
from metadef.core.errors import InputError, MetadefError
from metadef.ir import Graph
from metadef.passes.fuse_groups import group_summary
from metadef.report.collect import (
    NodeInfo,
    ReportData,
    describe_node,
    io_info,
    memory_timeline,
    step_timeline,
)

FIGURES = ("graph", "memory", "steps", "bench")
"""The figures' names: their PNG files are ``<name>.png``."""
STAGES = ("load", "compile", "time steps", "bench compile", "bench measure", "draw")
"""The stages :func:`write_report` reports progress for, in order."""


@dataclass(frozen=True)
class ReportResult:
    """What :func:`write_report` wrote and the main numbers behind it (times in ms or s,
    memory in bytes).

    Example:
        >>> r = ReportResult(Path("r.html"), {"graph": Path("r_files/graph.png")}, "mlp", {"batch": 1}, 9, 4, 2,
        ...                  3072, 3072, 0.3)
        >>> r.to_dict()["figures"], r.nodes_before - r.nodes_after
        ({'graph': 'r_files/graph.png'}, 5)
    """

    html: Path
    figures: dict[str, Path]
    model: str
    bindings: dict[str, int]
    nodes_before: int
    nodes_after: int
    fused_groups: int
    arena_peak: int
    arena_lower_bound: int
    steps_ms: float
    bench: list[BenchRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """The result as JSON-able data (paths as strings)."""
        data = asdict(self)
        data["html"] = str(self.html)
        data["figures"] = {k: str(v) for k, v in self.figures.items()}
        return data


def _check_options(model: str, runs: int, threads: Sequence[int], batch: int, top: int) -> None:
    if model not in md.zoo.names() and not Path(model).is_file():
        raise InputError(f"report: {model!r} is neither a file nor a zoo model ({', '.join(md.zoo.names())}); "
                         "give an .onnx or .mdef path, or a name from `metadef zoo list`")
    if runs < 1 or batch < 1 or top < 1 or not threads or min(threads) < 1:
        raise InputError(f"report: runs ({runs}), batch ({batch}), top ({top}) and each thread count "
                         f"({', '.join(map(str, threads)) or 'none given'}) must be at least 1")


def _quiet(stage: str, done: int, total: int) -> None:
    """A progress callback that shows nothing."""


def write_report(model: str | os.PathLike[str], path: str | os.PathLike[str], *, runs: int = 10,
                 threads: Sequence[int] = (1, 2), batch: int = 1, bench: bool = True, top: int = 20,
                 progress: StageProgress | None = None, echo: Callable[[str], None] | None = None) -> ReportResult:
    """Write an HTML report on ``model`` (a zoo name, an ``.onnx`` or an ``.mdef`` path) to
    ``path``, its figures as PNGs in ``<stem>_files/`` beside it; see :mod:`metadef.report`.

    ``runs``: timed runs per benchmark configuration (and, up to 10, profiled runs);
    ``threads``: the thread counts benchmarked; ``batch``: the batch size everywhere;
    ``bench=False`` skips the ONNX Runtime comparison (the page says so); ``top``: how many
    steps figure 3 shows. ``progress(stage, done, total)`` hears of each stage of
    :data:`STAGES` (:func:`metadef.cli_progress.stage_bars` draws them); ``echo`` gets the
    benchmark's warnings (foreign load) as lines.

    Example:
        >>> import tempfile, pathlib
        >>> out = pathlib.Path(tempfile.mkdtemp()) / "mlp.html"
        >>> result = write_report("mlp", out, bench=False, runs=2)
        >>> result.html.exists(), sorted(result.figures), result.nodes_before > result.nodes_after
        (True, ['graph', 'memory', 'steps'], True)
    """
    _check_options(str(model), runs, threads, batch, top)
    started = time.perf_counter()
    step = progress or _quiet
    data = _measure(str(model), runs, tuple(threads), batch, bench, step, echo)
    step("draw", 0, len(FIGURES))
    # matplotlib takes about half a second to import: only a report pays for it, not every command
    from metadef.report import page

    pngs, widths = page.draw(data, _graph_items(data.graph, data.infos), top,
                             lambda done: step("draw", done, len(FIGURES)))
    target = Path(path)
    files = target.with_name(f"{target.stem}_files")
    files.mkdir(parents=True, exist_ok=True)
    figures = {name: _write_atomic(files / f"{name}.png", png) for name, png in pngs.items()}
    _write_atomic(target, page.compose(data, pngs, widths, top).encode("utf-8"))
    step("draw", len(FIGURES), len(FIGURES))
    return ReportResult(target, figures, data.name, data.bindings, len(data.before.nodes), len(data.graph.nodes),
                        len(group_summary(data.graph)), data.memory.peak, data.memory.lower_bound,
                        sum(s.ms for s in data.steps), data.rows, data.notes, time.perf_counter() - started)


def _measure(model: str, runs: int, threads: tuple[int, ...], batch: int, bench: bool, step: StageProgress,
             echo: Callable[[str], None] | None) -> ReportData:
    step("load", 0, 1)
    t0 = time.perf_counter()
    loaded = load_model(model, level="none")
    graph = md.optimize(loaded.graph, level="aggressive")
    optimize_s = time.perf_counter() - t0
    step("load", 1, 1)
    t0 = time.perf_counter()
    session = md.compile(graph, target="x86", progress=lambda done, total, _node: step("compile", done, total))
    compile_s = time.perf_counter() - t0
    feeds, bindings = example_inputs(session.inputs, batch=batch, zoo_name=loaded.name if loaded.zoo else None,
                                     env=session.env)
    step_runs = min(runs, TRACE_RUNS)
    step("time steps", 0, 1)
    steps = step_timeline(session, feeds, bindings, step_runs)
    step("time steps", 1, 1)
    memory = memory_timeline(graph, bindings)
    notes: list[str] = []
    rows: list[BenchRow] = []
    if bench:
        rows = _bench(model, runs, threads, batch, notes, step, echo)
    else:
        notes.append("the comparison with ONNX Runtime was skipped (--no-bench)")
    source = "zoo model (built by metadef, deterministic weights)" if loaded.zoo else str(Path(model).resolve())
    return ReportData(loaded.name, source, loaded.graph, graph, [describe_node(n) for n in graph.nodes], bindings,
                      feeds, optimize_s, compile_s, steps, step_runs, memory, _program_arena(session, bindings),
                      rows, notes)


def _bench(model: str, runs: int, threads: tuple[int, ...], batch: int, notes: list[str], step: StageProgress,
           echo: Callable[[str], None] | None) -> list[BenchRow]:
    """:func:`~metadef.cli_bench.run_bench` against ONNX Runtime; the process's thread count is
    put back afterwards (the bench sets it for each configuration)."""
    saved = current_threads()
    try:
        rows = run_bench(model, (batch,), threads, runs, warmup=2, peers=("onnxruntime",), echo=echo,
                         progress=lambda stage, done, total: step(f"bench {stage}", done, total))
    except ImportError as e:  # onnxruntime is an optional peer
        notes.append(f"the comparison with ONNX Runtime was skipped: {e} (pip install onnxruntime)")
        return []
    finally:
        set_threads(saved)
    notes += [w for r in rows for w in r.warnings]
    return rows


def _program_arena(session: md.Session, bindings: dict[str, int]) -> int | None:
    """The arena the x86 program itself plans for ``bindings`` (views share their input's
    bytes; kernels' scratch buffers included), or None when it has none."""
    pool = getattr(session.executable, "programs", None)
    if pool is None:
        return None
    try:
        program = pool.bound(bindings)
    except MetadefError:
        return None
    try:
        return int(program.plan.peak)
    finally:
        pool.give_back(program)


def _graph_items(graph: Graph, infos: list[NodeInfo]) -> tuple[list[NodeInfo], list[list[int]]]:
    """The graph figure's boxes (inputs, nodes, outputs) and what each reads (by box index)."""
    index = {id(v): k for k, v in enumerate(graph.inputs)}
    items = [io_info(v, "input") for v in graph.inputs] + list(infos)
    parents: list[list[int]] = [[] for _ in graph.inputs]
    for k, node in enumerate(graph.nodes):
        box = len(graph.inputs) + k
        parents.append(list(dict.fromkeys(index[id(v)] for v in node.inputs if v is not None and id(v) in index)))
        for v in node.outputs:
            index[id(v)] = box
    for v in graph.outputs:
        items.append(io_info(v, "output"))
        parents.append([index[id(v)]] if id(v) in index else [])
    return items, parents


def _write_atomic(path: Path, data: bytes) -> Path:
    """Write ``data`` to a temporary file beside ``path``, then rename it to ``path``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o644)  # mkstemp makes 0o600; a report is meant to be shared
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


__all__ = ["FIGURES", "STAGES", "ReportResult", "write_report"]
