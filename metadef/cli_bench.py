"""``metadef bench``: metadef's x86 backend against ONNX Runtime and PyTorch, side by side, in one run.

Two kinds of figures, each measured in one place:

- **metadef's own figures** (cold and warm load, optimize, compile with an empty and with a
  filled cache, p50/p90/p99 latency, throughput, peak memory) come from the benchmark API,
  :class:`metadef.benchmark.TestScenario`, which measures in fresh processes (at the first
  batch size and thread count given).
- **the side by side latency**: for each (batch, threads) configuration the runtimes run turn
  by turn in this process (peers first, then metadef, ``runs`` rounds at least: interleaved,
  so a burst of foreign load hits all alike, which is what makes the ratios trustworthy on a
  shared machine); the report holds each runtime's p50 and p90 and the ratio metadef / peer
  of the p50s (below 1.0: metadef is faster), and each peer's setup time (ORT: session
  creation with ORT_ENABLE_ALL; torch: the model converted to torch ops). Timing loops and
  the foreign-load guard are :mod:`metadef.testing.timing`'s: above
  :data:`FOREIGN_LOAD_LIMIT` cores of other processes' CPU on average a configuration is
  measured again, at most :data:`MAX_REPEATS` times, and the least loaded attempt kept.

Peers (``--vs``, repeatable): ``onnxruntime`` and ``torch`` (PyTorch, eager, from the ONNX
model through :mod:`metadef.frontends.torch_peer`; optional: without it ``--vs torch``
says ``pip install torch==2.13.0``). Peers' worker threads are told not to spin between
runs (ORT's ``allow_spinning=0``; for torch, ``OMP_WAIT_POLICY=PASSIVE`` unless set, which
takes effect only when torch is first imported by the bench), as metadef's pool does not.

Example:
    $ metadef bench mlp --vs onnxruntime --vs torch --batch 1 8 --threads 1 2 --runs 20
    $ metadef bench model.mdef --json

    >>> foreign_cpu_s(CpuSample(10.0, 4.0), CpuSample(12.0, 5.0))
    1.0
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click
import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import metadef as md
from metadef.backends.x86.threads import set_threads
from metadef.benchmark import Metrics, TestScenario, example_inputs
from metadef.cli_progress import StageProgress, progress_option, show_progress, stage_bars
from metadef.core.errors import InputError
from metadef.frontends.torch_peer import load_torch, torch_module
from metadef.testing.cpu_meter import FOREIGN_LOAD_LIMIT, MAX_REPEATS, CpuSample, cpu_sample, foreign_cpu_s
from metadef.testing.timing import InterleavedSample, LatencyStats, guarded, time_interleaved

console = Console(width=None if sys.stdout.isatty() else 120)

METADEF = "metadef"
"""The name metadef's own runs go under in the figures."""


# ------------------------------------------------------------------------------- the model


@dataclass
class BenchModel:
    """The model under test: its name, the optimized graph, the ONNX bytes the peers load,
    and whether it is a zoo model."""

    name: str
    graph: md.Graph
    onnx_bytes: bytes
    zoo: bool


def load_model(model: str, level: str = "aggressive") -> BenchModel:
    """An ``.onnx`` file, a zoo name or an ``.mdef`` file (the peers get the graph re-exported).

    Example:
        >>> load_model("mlp").name
        'mlp'
    """
    path = Path(model)
    if model in md.zoo.names() and not path.exists():
        proto = md.zoo.build(model)
        data, zoo, name = proto.SerializeToString(), True, model
        graph = md.import_onnx(proto, name=model)
    elif path.suffix == ".mdef" and path.exists():
        graph = md.load(path).graph
        with tempfile.TemporaryDirectory() as tmp:  # the peers read the graph as ONNX
            data = md.export_onnx(graph, Path(tmp) / f"{path.stem}.onnx").read_bytes()
        zoo, name = False, path.stem
    elif path.exists():
        data, zoo, name = path.read_bytes(), False, path.stem
        graph = md.import_onnx(str(path))
    else:
        raise InputError(f"bench: {model!r} is neither a file nor a zoo model "
                         f"({', '.join(md.zoo.names())}); give an .onnx or .mdef path")
    return BenchModel(name, md.optimize(graph, level=level), data, zoo)


# ----------------------------------------------------------------------------- the peers


Runner = Callable[[Mapping[str, np.ndarray]], object]
"""One inference of a peer on inputs by name."""


def ort_session(data: bytes, threads: int) -> Any:
    """The ONNX Runtime peer: ORT_ENABLE_ALL, ``threads`` intra-op threads, workers that do not
    spin between runs (the runs are measured interleaved with metadef's).

    Example:
        >>> import metadef as md
        >>> ort_session(md.zoo.build("mlp").SerializeToString(), 1).get_inputs()[0].name
        'x'
    """
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


def _ort_runner(data: bytes, threads: int) -> Runner:
    session = ort_session(data, threads)
    return lambda feeds: session.run(None, feeds)


def _torch_runner(data: bytes, threads: int) -> Runner:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read when torch's OpenMP starts
    module = torch_module(data, threads=threads)
    return module.run


peer_runners: dict[str, Callable[[bytes, int], Runner]] = {"onnxruntime": _ort_runner, "torch": _torch_runner}
"""Peer name -> how to make its runner from the ONNX bytes and a thread count."""

PEER_LABELS = {METADEF: "metadef", "onnxruntime": "ORT", "torch": "torch"}


def check_peers(peers: Sequence[str]) -> None:
    """Fail early, with what to install, when a peer's runtime is missing.

    Example:
        >>> check_peers(["onnxruntime"])
    """
    unknown = [p for p in peers if p not in peer_runners]
    if unknown:
        raise InputError(f"bench: unknown peer(s) {unknown}; choose from {', '.join(peer_runners)}")
    if "torch" in peers:
        load_torch()


# ---------------------------------------------------------------------------- measurement


@dataclass
class BenchRow:
    """One configuration's side by side figures: each runtime's latency (``metadef`` and the
    peers, by name), the ratio metadef p50 / peer p50 per peer, each peer's setup time (s),
    and the foreign load the kept attempt ran under."""

    model: str
    batch: int
    threads: int
    dims: dict[str, int]
    latency: dict[str, LatencyStats]
    ratio: dict[str, float]
    setup_s: dict[str, float]
    foreign_cpu_s: float
    foreign_cores: float
    attempts: int
    warnings: list[str] = field(default_factory=list)
    runs_as: str = "whole"
    """How metadef ran the batch: ``whole``, or the pieces its first run chose (``1 on 2 threads``)."""


def run_bench(model: str, batches: Sequence[int] = (1,), threads: Sequence[int] = (1,), runs: int = 10,
              warmup: int = 2, peers: Sequence[str] = ("onnxruntime",), echo: Callable[[str], None] | None = None,
              progress: StageProgress | None = None) -> list[BenchRow]:
    """Measure every (threads, batch) configuration side by side; see the module doc.
    ``progress(stage, done, total)``: ``compile`` per node, ``measure`` per configuration.

    Example:
        >>> rows = run_bench("mlp", runs=2, warmup=0)
        >>> rows[0].model, rows[0].batch, rows[0].threads, rows[0].ratio["onnxruntime"] > 0
        ('mlp', 1, 1, True)
    """
    check_peers(peers)
    bm = load_model(model)
    on_node = None if progress is None else (lambda done, total, _node: progress("compile", done, total))
    sess = md.compile(bm.graph, target="x86", progress=on_node)
    rows: list[BenchRow] = []
    total = len(threads) * len(batches)
    for t in threads:
        runners, setup_s = {}, {}
        for peer in peers:
            t0 = time.perf_counter()
            runners[peer] = peer_runners[peer](bm.onnx_bytes, t)
            setup_s[peer] = time.perf_counter() - t0
        set_threads(t)
        for batch in batches:
            rows.append(_measure(bm, sess, runners, setup_s, batch, t, runs, warmup, echo))
            if progress is not None:
                progress("measure", len(rows), total)
    return rows


def _measure(bm: BenchModel, sess: md.Session, peers: Mapping[str, Runner], setup_s: dict[str, float],
             batch: int, threads: int, runs: int, warmup: int, echo: Callable[[str], None] | None) -> BenchRow:
    """One configuration: the runtimes interleaved (peers first), guarded against foreign load."""
    feeds, symbols = example_inputs(sess.inputs, batch=batch, zoo_name=bm.graph.name, env=sess.env)
    calls: dict[str, Callable[[], object]] = {name: (lambda run=run: run(feeds)) for name, run in peers.items()}
    calls[METADEF] = lambda: sess.run(feeds)
    warmups = [warmup]  # the first attempt warms up; a repeat under foreign load need not

    def attempt() -> InterleavedSample:
        return time_interleaved(calls, warmups.pop() if warmups else 0, runs)

    sample, warnings, attempts = guarded(attempt, f"batch {batch} threads {threads}")
    if echo is not None:
        for note in warnings:
            echo(f"warning: {note}")
    batch_size = symbols.get("batch", batch)
    latency = {name: LatencyStats.of(times, batch_size) for name, times in sample.times.items()}
    latency = {METADEF: latency.pop(METADEF), **latency}
    ratio = {p: latency[METADEF].p50_ms / latency[p].p50_ms for p in peers}
    pieces_for = getattr(sess.executable, "pieces_for", None)
    way = pieces_for(symbols) if pieces_for is not None else None
    return BenchRow(bm.name, batch, threads, symbols, latency, ratio, setup_s, sample.foreign_s,
                    sample.foreign_cores, attempts, warnings, "whole" if way is None else f"pieces of {way}")


@dataclass
class BenchReport:
    """What ``metadef bench`` measured: metadef's own figures (None with ``--latency-only``)
    and the side by side rows."""

    model: str
    peers: list[str]
    metrics: Metrics | None
    rows: list[BenchRow]

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-able data (what ``--json`` prints).

        Example:
            >>> BenchReport("mlp", ["onnxruntime"], None, []).to_dict()
            {'model': 'mlp', 'peers': ['onnxruntime'], 'metadef': None, 'configurations': []}
        """
        return {"model": self.model, "peers": list(self.peers),
                "metadef": None if self.metrics is None else self.metrics.to_dict(),
                "configurations": [asdict(r) for r in self.rows]}


def bench_model(model: str, batches: Sequence[int] = (1,), threads: Sequence[int] = (1,), runs: int = 10,
                warmup: int = 2, peers: Sequence[str] = ("onnxruntime",), latency_only: bool = False,
                echo: Callable[[str], None] | None = None, progress: StageProgress | None = None) -> BenchReport:
    """Everything ``metadef bench`` measures: :class:`~metadef.benchmark.TestScenario` at the
    first batch and thread count (unless ``latency_only``), then :func:`run_bench`.

    Example:
        >>> report = bench_model("mlp", runs=2, warmup=0, latency_only=True)
        >>> report.metrics is None, len(report.rows)
        (True, 1)
    """
    check_peers(peers)
    metrics = None
    if not latency_only:
        scenario = TestScenario(model, warmup=warmup, iterations=runs, batch=batches[0], threads=threads[0])
        on_phase = None if progress is None else (lambda done, total, _what: progress("load+compile", done, total))
        metrics = scenario.run(mem_profile=True, progress=on_phase)
    rows = run_bench(model, batches, threads, runs, warmup, peers, echo, progress)
    return BenchReport(rows[0].model if rows else model, list(peers), metrics, rows)


# ------------------------------------------------------------------------------- display


def metrics_table(m: Metrics) -> Table:
    """metadef's own figures (from TestScenario) as one row."""
    table = Table(title=f"{escape(m.model)}: metadef {m.target} in fresh processes (TestScenario), batch {m.batch}, "
                        f"{m.threads or 'default'} thread(s); times in ms, peak RSS in MB")
    cells = [("cold load", f"{m.cold_load_ms:.2f}"), ("warm load", f"{m.warm_load_ms:.2f}"),
             ("optimize", f"{m.optimize_ms:.1f}"), ("compile cold", f"{m.compile_ms_cold:.1f}"),
             ("compile cached", f"{m.compile_ms_cached:.1f}"), ("p50", f"{m.p50_ms:.3f}"),
             ("p90", f"{m.p90_ms:.3f}"), ("p99", f"{m.p99_ms:.3f}"), ("inferences/s", f"{m.throughput:.1f}"),
             ("peak MB", "-" if m.mem_peak is None else f"{m.mem_peak / 2**20:.0f}")]
    for name, _ in cells:
        table.add_column(name, justify="right", no_wrap=True)
    table.add_row(*(value for _, value in cells))
    return table


def rows_table(rows: Sequence[BenchRow]) -> Table:
    """The side by side table: a row per configuration and runtime, with metadef's ratio to
    each peer (a section per configuration)."""
    peers = list(rows[0].ratio) if rows else []
    names = " and ".join(PEER_LABELS[p] for p in peers) or "no peer"
    table = Table(title=f"metadef x86 vs {names}, interleaved; times in ms; "
                        "ratio = metadef p50 / peer p50 (< 1: metadef faster)")
    for name in ("batch", "threads", "runtime", "p50", "p90", "p99", "inferences/s", "ratio", "setup s",
                 "foreign cores", "attempts"):
        table.add_column(name, justify="left" if name == "runtime" else "right", no_wrap=True)
    for r in rows:
        for name, stats in r.latency.items():
            ratio = ""
            if name in r.ratio:
                ratio = f"[{'green' if r.ratio[name] <= 1.0 else 'red'}]{r.ratio[name]:.2f}[/]"
            first = name == METADEF
            table.add_row(str(r.batch) if first else "", str(r.threads) if first else "", PEER_LABELS[name],
                          f"{stats.p50_ms:.3f}", f"{stats.p90_ms:.3f}", f"{stats.p99_ms:.3f}",
                          f"{stats.throughput:.1f}", ratio, f"{r.setup_s[name]:.2f}" if name in r.setup_s else "",
                          f"{r.foreign_cores:.2f}" if first else "", str(r.attempts) if first else "")
        table.add_section()
    return table


def print_report(report: BenchReport) -> None:
    """The tables, the peers' setup times and the foreign-load warnings."""
    if report.metrics is not None:
        console.print(metrics_table(report.metrics))
        for w in report.metrics.warnings:
            console.print(f"[yellow]warning[/]: {escape(w)}")
    console.print(rows_table(report.rows))
    console.print("setup s: ORT's session creation, torch's conversion to torch ops; metadef's compile is in "
                  "the first table")
    for r in report.rows:
        if r.runs_as != "whole":
            console.print(f"batch {r.batch}, {r.threads} thread(s): metadef ran the batch in {r.runs_as} "
                          "(chosen by timing its first run; metadef.backends.x86.pieces)")
    loaded = [r for r in report.rows if r.attempts > 1]
    if loaded:
        console.print(f"[yellow]warning[/]: {len(loaded)} of {len(report.rows)} configurations ran under foreign "
                      f"load and were measured again (at most {MAX_REPEATS} times; the least loaded attempt is "
                      "shown; --json lists each attempt's load)")


# -------------------------------------------------------------------------------- command


class _ListOptions(click.Command):
    """Lets ``--batch 1 8 --threads 1 2 --vs onnxruntime torch`` mean each option repeated."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        lists = {"--batch": str.isdigit, "--threads": str.isdigit, "--vs": peer_runners.__contains__}
        return super().parse_args(ctx, spread_list_options(args, lists))


def spread_list_options(args: Sequence[str], names: Sequence[str] | Mapping[str, Callable[[str], bool]]) -> list[str]:
    """Repeat a list option before each of the words that follow it and belong to it (for
    ``names`` given as a list: numbers; as a mapping: the words its test accepts).

    Example:
        >>> spread_list_options(["m", "--batch", "1", "8", "--json"], ["--batch"])
        ['m', '--batch', '1', '--batch', '8', '--json']
        >>> spread_list_options(["m", "--vs", "a", "b", "c"], {"--vs": lambda w: w in ("a", "b")})
        ['m', '--vs', 'a', '--vs', 'b', 'c']
    """
    accepts = dict(names) if isinstance(names, Mapping) else dict.fromkeys(names, str.isdigit)
    out: list[str] = []
    current: str | None = None
    for a in args:
        if a in accepts:
            current = a
            out.append(a)
        elif current is not None and accepts[current](a) and out[-1] != current:
            out += [current, a]
        else:
            if current is not None and out[-1] != current:
                current = None
            out.append(a)
    return out


@click.command("bench", cls=_ListOptions)
@click.argument("model")
@click.option("--vs", "peers", type=click.Choice(list(peer_runners)), multiple=True,
              help="the runtime(s) to compare with (repeat the option, or list them: --vs onnxruntime torch; "
                   "default: onnxruntime)")
@click.option("--batch", "batches", type=int, multiple=True, default=(1,), show_default=True,
              help="batch sizes (repeat the option, or list them: --batch 1 8)")
@click.option("--threads", "threads", type=int, multiple=True, default=(1,), show_default=True,
              help="thread counts (every runtime; repeatable)")
@click.option("--runs", type=int, default=10, show_default=True,
              help="timed runs per configuration, at least (fast models run for 0.25 s)")
@click.option("--warmup", type=int, default=2, show_default=True, help="untimed runs first")
@click.option("--latency-only", is_flag=True,
              help="only the side by side latency: skip metadef's load / compile / memory figures")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@progress_option
def bench_command(model: str, peers: tuple[str, ...], batches: tuple[int, ...], threads: tuple[int, ...], runs: int,
                  warmup: int, latency_only: bool, as_json: bool, progress: bool | None) -> None:
    """Load, compile and run times and memory of MODEL (.onnx, .mdef or a zoo name) on
    metadef's x86 backend, and its latency side by side with ONNX Runtime and/or PyTorch,
    measured in one run.

    Example: metadef bench resnet50 --vs onnxruntime --vs torch --batch 1 8 --threads 1 2 --runs 20
    """
    if runs < 1 or warmup < 0 or min(*batches, *threads) < 1:
        raise click.BadParameter("--runs, --batch and --threads take positive numbers")

    with stage_bars(["load+compile", "compile", "measure"], show_progress(progress, as_json)) as bar:
        report = bench_model(model, batches, threads, runs, warmup, list(dict.fromkeys(peers)) or ["onnxruntime"],
                             latency_only, progress=bar)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=1))
        return
    print_report(report)


__all__ = ["FOREIGN_LOAD_LIMIT", "MAX_REPEATS", "METADEF", "PEER_LABELS", "BenchModel", "BenchReport", "BenchRow",
           "CpuSample", "bench_command", "bench_model", "check_peers", "cpu_sample", "foreign_cpu_s", "load_model",
           "metrics_table", "ort_session", "peer_runners", "print_report", "rows_table", "run_bench",
           "spread_list_options"]
