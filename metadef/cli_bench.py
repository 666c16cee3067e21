"""``metadef bench``: metadef's x86 backend against ONNX Runtime, side by side, in one run.

For each (batch, threads) configuration the two runtimes run one after the other, ``runs``
times each (interleaved, so a burst of foreign load hits both alike); the report holds the
medians, the ratio metadef / ORT (below 1.0: metadef is faster), the compile times (metadef:
optimize at ``aggressive`` + x86 compile; ORT: session creation with ORT_ENABLE_ALL), and the
process's peak RSS. The machines are shared, so each configuration also measures the CPU time
that *other* processes used while it ran (``/proc/stat`` less this process's own CPU time);
above :data:`FOREIGN_LOAD_LIMIT` cores on average it warns and measures the configuration
again, at most :data:`MAX_REPEATS` times, and keeps the least loaded attempt.

Example:
    $ metadef bench mlp --vs onnxruntime --batch 1 8 --threads 1 2 --runs 20
    $ metadef bench model.mdef --json

    >>> foreign_cpu_s(CpuSample(10.0, 4.0), CpuSample(12.0, 5.0))
    1.0
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click
import numpy as np
from rich.console import Console
from rich.table import Table

import metadef as md
from metadef.backends.x86.threads import set_threads
from metadef.core.errors import InputError
from metadef.testing.cpu_meter import (
    DEFAULT_SEQ,
    FOREIGN_LOAD_LIMIT,
    MAX_REPEATS,
    MIN_WINDOW_S,
    CpuSample,
    cpu_sample,
    foreign_cpu_s,
    peak_rss_mb,
)

console = Console(width=None if sys.stdout.isatty() else 120)


# ------------------------------------------------------------------------------- the model


@dataclass
class BenchModel:
    """The model under test: its name, the optimized graph, the ONNX bytes ORT loads, and
    how long metadef took to import and optimize it."""

    name: str
    graph: md.Graph
    onnx_bytes: bytes
    zoo: bool
    optimize_s: float


def load_model(model: str, level: str = "aggressive") -> BenchModel:
    """An ``.onnx`` file, a zoo name or an ``.mdef`` file (ORT gets the graph re-exported).

    Example:
        >>> load_model("mlp").name
        'mlp'
    """
    path = Path(model)
    if model in md.zoo.names() and not path.exists():
        proto = md.zoo.build(model)
        data, zoo, name = proto.SerializeToString(), True, model
        t0 = time.perf_counter()
        graph = md.import_onnx(proto, name=model)
    elif path.suffix == ".mdef" and path.exists():
        t0 = time.perf_counter()
        graph = md.load(path).graph
        with tempfile.TemporaryDirectory() as tmp:  # ORT reads the graph as ONNX
            data = md.export_onnx(graph, Path(tmp) / f"{path.stem}.onnx").read_bytes()
        zoo, name = False, path.stem
    elif path.exists():
        data, zoo, name = path.read_bytes(), False, path.stem
        t0 = time.perf_counter()
        graph = md.import_onnx(str(path))
    else:
        raise InputError(f"bench: {model!r} is neither a file nor a zoo model "
                         f"({', '.join(md.zoo.names())}); give an .onnx or .mdef path")
    graph = md.optimize(graph, level=level)
    return BenchModel(name, graph, data, zoo, time.perf_counter() - t0)


def example_feeds(bm: BenchModel, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for one run: the zoo's examples, or random data with the first symbolic dim set
    to ``batch`` and the others to :data:`DEFAULT_SEQ` (integer inputs are zeros)."""
    if bm.zoo:
        dims = {"seq": DEFAULT_SEQ} if any(d == "seq" for _, _, s in md.zoo.describe(bm.name).inputs
                                           for d in s) else {}
        return md.zoo.describe(bm.name).example_inputs(batch=batch, **dims)
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for v in bm.graph.inputs:
        shape = [d if isinstance(d, int) else (batch if i == 0 else DEFAULT_SEQ)
                 for i, d in enumerate(v.type.shape)]
        dtype = v.type.dtype.numpy
        feeds[v.name] = (rng.standard_normal(shape).astype(dtype) if np.issubdtype(dtype, np.floating)
                         else np.zeros(shape, dtype))
    return feeds


# ---------------------------------------------------------------------------- measurement


@dataclass
class BenchRow:
    """One configuration's figures (times in ms, compile in s, memory in MB)."""

    model: str
    batch: int
    threads: int
    metadef_ms: float
    ort_ms: float
    ratio: float
    metadef_compile_s: float
    ort_session_s: float
    peak_rss_mb: float
    foreign_cpu_s: float
    foreign_cores: float
    attempts: int
    warnings: list[str] = field(default_factory=list)


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure_pair(ours: Callable[[], object], theirs: Callable[[], object], runs: int,
                 warmup: int, min_window_s: float = MIN_WINDOW_S) -> tuple[float, float, float, float]:
    """Interleaved medians (s) of ``ours`` and ``theirs``, the wall time and the foreign CPU s.

    ``runs`` is a minimum: a fast model keeps running (interleaved, every run counted) until
    the window lasts ``min_window_s``, so that the foreign-load figure is more than tick noise.

    Example:
        >>> m, o, wall, foreign = measure_pair(lambda: None, lambda: None, 3, 1, min_window_s=0.0)
        >>> m >= 0 and o >= 0 and wall >= 0 and foreign >= 0
        True
    """
    for _ in range(warmup):
        theirs()
        ours()
    a, b = [], []
    before, t0 = cpu_sample(), time.perf_counter()
    while len(a) < runs or time.perf_counter() - t0 < min_window_s:
        b.append(_timed(theirs))
        a.append(_timed(ours))
    wall = time.perf_counter() - t0
    return statistics.median(a), statistics.median(b), wall, foreign_cpu_s(before, cpu_sample())


def ort_session(data: bytes, threads: int) -> Any:
    """The ONNX Runtime peer: ORT_ENABLE_ALL, ``threads`` intra-op threads, workers that do not
    spin between runs (the runs are measured interleaved with metadef's)."""
    import onnxruntime as ort  # an optional peer: only `metadef bench` needs it

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    # measured interleaved: ORT's idle workers would spin after each run, taking the cores
    # from the next run measured (ours); with one thread there are no workers, no change
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.log_severity_level = 3
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def run_bench(model: str, batches: Sequence[int] = (1,), threads: Sequence[int] = (1,), runs: int = 10,
              warmup: int = 2, echo: Callable[[str], None] | None = None) -> list[BenchRow]:
    """Measure every (threads, batch) configuration; see the module doc.

    Example:
        >>> rows = run_bench("mlp", runs=2, warmup=0)
        >>> rows[0].model, rows[0].batch, rows[0].threads, rows[0].ratio > 0
        ('mlp', 1, 1, True)
    """
    bm = load_model(model)
    t0 = time.perf_counter()
    sess = md.compile(bm.graph, target="x86")
    compile_s = bm.optimize_s + time.perf_counter() - t0
    rows = []
    for t in threads:
        t0 = time.perf_counter()
        ort_sess = ort_session(bm.onnx_bytes, t)
        ort_s = time.perf_counter() - t0
        set_threads(t)
        for batch in batches:
            feeds = example_feeds(bm, batch)

            def ours(feeds: dict[str, np.ndarray] = feeds) -> object:
                return sess.run(feeds)

            def theirs(feeds: dict[str, np.ndarray] = feeds, ort_sess: Any = ort_sess) -> object:
                return ort_sess.run(None, feeds)

            best: tuple[float, float, float, float] | None = None
            warnings: list[str] = []
            attempts = 0
            while attempts <= MAX_REPEATS:
                attempts += 1
                got = measure_pair(ours, theirs, runs, warmup)
                if best is None or got[3] / got[2] < best[3] / best[2]:
                    best = got
                cores = got[3] / got[2] if got[2] > 0 else 0.0
                if cores <= FOREIGN_LOAD_LIMIT:
                    break
                note = (f"batch {batch} threads {t}: other processes used {cores:.2f} cores while it ran "
                        f"(attempt {attempts})" + ("; measuring again" if attempts <= MAX_REPEATS
                                                   else "; keeping the least loaded attempt"))
                warnings.append(note)
                if echo is not None:
                    echo(f"warning: {note}")
            ours_s, theirs_s, wall, foreign = best  # type: ignore[misc]
            rows.append(BenchRow(bm.name, batch, t, 1e3 * ours_s, 1e3 * theirs_s, ours_s / theirs_s, compile_s, ort_s,
                                 peak_rss_mb(), foreign, foreign / wall if wall > 0 else 0.0, attempts, warnings))
    return rows


# -------------------------------------------------------------------------------- command


def rows_table(rows: Sequence[BenchRow]) -> Table:
    """The rich table ``metadef bench`` prints."""
    table = Table("model", "batch", "threads", "metadef ms", "ORT ms", "ratio", "metadef compile s",
                  "ORT session s", "peak RSS MB", "foreign cores", "attempts",
                  title="metadef x86 vs ONNX Runtime (medians; ratio < 1: metadef faster)")
    for r in rows:
        style = "green" if r.ratio <= 1.0 else "red"
        table.add_row(r.model, str(r.batch), str(r.threads), f"{r.metadef_ms:.3f}", f"{r.ort_ms:.3f}",
                      f"[{style}]{r.ratio:.2f}[/]", f"{r.metadef_compile_s:.2f}", f"{r.ort_session_s:.2f}",
                      f"{r.peak_rss_mb:.0f}", f"{r.foreign_cores:.2f}", str(r.attempts))
    return table


class _ListOptions(click.Command):
    """Lets ``--batch 1 8 --threads 1 2`` mean ``--batch 1 --batch 8 --threads 1 --threads 2``."""

    LIST_OPTIONS = ("--batch", "--threads")

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, spread_list_options(args, self.LIST_OPTIONS))


def spread_list_options(args: Sequence[str], names: Sequence[str]) -> list[str]:
    """Repeat a list option before each of the numbers that follow it.

    Example:
        >>> spread_list_options(["m", "--batch", "1", "8", "--json"], ["--batch"])
        ['m', '--batch', '1', '--batch', '8', '--json']
    """
    out: list[str] = []
    current: str | None = None
    for a in args:
        if a in names:
            current = a
            out.append(a)
        elif current is not None and a.isdigit() and out[-1] != current:
            out += [current, a]
        else:
            if current is not None and out[-1] != current:
                current = None
            out.append(a)
    return out


@click.command("bench", cls=_ListOptions)
@click.argument("model")
@click.option("--vs", "peer", type=click.Choice(["onnxruntime"]), default="onnxruntime", show_default=True,
              help="the runtime to compare with")
@click.option("--batch", "batches", type=int, multiple=True, default=(1,), show_default=True,
              help="batch sizes (repeat the option, or list them: --batch 1 8)")
@click.option("--threads", "threads", type=int, multiple=True, default=(1,), show_default=True,
              help="thread counts (both runtimes; repeatable)")
@click.option("--runs", type=int, default=10, show_default=True,
              help="timed runs per configuration, at least (median; fast models run for 0.25 s)")
@click.option("--warmup", type=int, default=2, show_default=True, help="untimed runs first")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def bench_command(model: str, peer: str, batches: tuple[int, ...], threads: tuple[int, ...], runs: int,
                  warmup: int, as_json: bool) -> None:
    """Latency, compile time and memory of MODEL (.onnx, .mdef or a zoo name) on metadef's x86
    backend and on ONNX Runtime, measured in one run.

    Example: metadef bench resnet50 --vs onnxruntime --batch 1 8 --threads 1 2 --runs 20
    """
    if runs < 1 or warmup < 0 or min(*batches, *threads) < 1:
        raise click.BadParameter("--runs, --batch and --threads take positive numbers")

    def echo(line: str) -> None:
        click.echo(line, err=True)

    rows = run_bench(model, batches, threads, runs, warmup, echo=echo)
    if as_json:
        click.echo(json.dumps([asdict(r) for r in rows], indent=1))
        return
    console.print(rows_table(rows))
    loaded = [r for r in rows if r.attempts > 1]
    if loaded:
        console.print(f"[yellow]warning[/]: {len(loaded)} of {len(rows)} configurations ran under foreign "
                      f"load and were measured again (at most {MAX_REPEATS} times; the least loaded "
                      "attempt is shown)")


__all__ = ["FOREIGN_LOAD_LIMIT", "MAX_REPEATS", "BenchModel", "BenchRow", "CpuSample", "bench_command",
           "cpu_sample", "example_feeds", "foreign_cpu_s", "load_model", "measure_pair", "peak_rss_mb",
           "rows_table", "run_bench", "spread_list_options"]
