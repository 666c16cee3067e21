"""The benchmark API: load, compile and run times of one model, its memory, and where time goes.

``TestScenario(model, device="cpu", warmup=..., iterations=...).run(mem_profile=..., trace_level=...)``
returns :class:`Metrics`. The model is an ``.mdef`` file (a zoo name or an ``.onnx`` file is
converted to one first, in a temporary directory). Everything is measured in fresh processes
(``sys.executable -c ...``), so nothing the caller has imported, mapped or compiled helps or
pollutes the figures:

1. The *measuring* process, with ``METADEF_CACHE_DIR`` pointed at a new, empty directory,
   imports metadef and the backend (not timed), then times
   ``load`` (``metadef.load`` and the graph decoded) the first time, with the file not yet
   mapped in this process (**cold**; the OS page cache may still hold the file: dropping it
   needs root), and again (**warm**); ``optimize`` at ``level`` (fused groups are formed at
   compile time, not stored in the file); the backend's ``compile`` with the empty compile
   cache (**cold**); then ``warmup`` untimed runs and at least ``iterations`` timed ones
   (p50/p90/p99/mean latency, throughput = batch / mean). ``mem_peak`` is this process's peak
   RSS (``VmHWM``), imports included.
2. A second fresh process reusing that cache directory times ``compile`` again (**cached**:
   a model-level hit, kernels linked from disk).

The machines are shared, so the timed runs also measure the CPU time that *other* processes
used meanwhile (``/proc/stat`` less this process's own; :mod:`metadef.testing.timing`, the
timing loop ``metadef bench`` uses too): above :data:`~metadef.testing.cpu_meter.FOREIGN_LOAD_LIMIT`
cores on average, the runs are measured again (at most
:data:`~metadef.testing.cpu_meter.MAX_REPEATS` times), the least loaded attempt is kept, and
``Metrics.warnings`` says so. ``trace_level=1`` adds the
time per op type, ``trace_level=2`` also the time per step (``group_ms``: each fused group or
node by name), from the executable's step-by-step path with each step's kernel timed.

Example:
    >>> import tempfile, pathlib, metadef as md
    >>> from metadef.ir import parse_graph
    >>> g = parse_graph("graph tiny(%x: f32[batch,16]) -> (%y) { %y: f32[batch,16] = Relu(%x) @relu return %y }")
    >>> path = md.save(g, pathlib.Path(tempfile.mkdtemp()) / "tiny.mdef")
    >>> m = TestScenario(path, warmup=1, iterations=3, batch=2).run(mem_profile=True, trace_level=2)
    >>> m.p50_ms <= m.p90_ms <= m.p99_ms, m.mem_peak > 0, m.runs >= 3, list(m.group_ms)
    (True, True, True, ['relu'])
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import metadef as md
from metadef.backends import get_backend
from metadef.convert import convert
from metadef.core.errors import BackendError, InputError, MetadefError
from metadef.runtime.session import IOSpec, Session
from metadef.shape import ShapeEnv, bind_shape, evaluate_shape, free_symbols
from metadef.testing.cpu_meter import DEFAULT_SEQ
from metadef.testing.timing import LatencySample, LatencyStats, guarded, time_runs

DEVICES = {"cpu": "x86"}
"""Benchmark device -> the backend that runs on it."""
TRACE_RUNS = 10
"""Step-by-step runs timed for a trace (at most; fewer when ``iterations`` is smaller)."""
RESULT_MARK = "metadef-benchmark-result: "
"""The line prefix under which a measuring process prints its JSON result."""


# ------------------------------------------------------------------------------- metrics


@dataclass(frozen=True)
class Metrics:
    """What :meth:`TestScenario.run` measured. Times in ms, memory in bytes.

    Example:
        >>> m = Metrics(model="mlp", p50_ms=1.0, p90_ms=1.5, p99_ms=2.0, mean_ms=1.1, throughput=909.1)
        >>> m.to_dict()["p90_ms"], Metrics.from_json(m.to_json()) == m
        (1.5, True)
    """

    model: str = ""
    device: str = "cpu"
    target: str = "x86"
    batch: int = 1
    dims: dict[str, int] = field(default_factory=dict)
    """The value of every symbolic dim of the inputs (``batch``, ``seq``, ...)."""
    threads: int | None = None
    warmup: int = 0
    iterations: int = 0
    runs: int = 0
    """Timed runs made: at least ``iterations`` (a fast model runs until the window is long
    enough for the foreign-load figure to mean something)."""
    cold_load_ms: float = 0.0
    """``metadef.load`` + graph decode in a fresh process (the OS page cache may hold the file)."""
    warm_load_ms: float = 0.0
    """The same load again, in the same process."""
    optimize_ms: float = 0.0
    compile_ms_cold: float = 0.0
    """The backend's compile with an empty compile cache (optimize not included)."""
    compile_ms_cached: float = 0.0
    """The backend's compile in a fresh process, from the cache the cold compile filled."""
    p50_ms: float = 0.0
    p90_ms: float = 0.0
    p99_ms: float = 0.0
    mean_ms: float = 0.0
    min_ms: float = 0.0
    throughput: float = 0.0
    """Inferences per second: batch / mean latency."""
    mem_peak: int | None = None
    """Peak RSS of the measuring process (imports included); None without ``mem_profile``."""
    mem_rss: dict[str, int] | None = None
    """RSS after each phase (``imports``, ``load``, ``compile``, ``runs``), with ``mem_profile``."""
    op_ms: dict[str, float] | None = None
    """Time per op type (summed medians of its steps), at ``trace_level >= 1``."""
    group_ms: dict[str, float] | None = None
    """Time per step (fused group or node, by name; medians), at ``trace_level == 2``."""
    foreign_load: float = 0.0
    """CPU cores that other processes used on average during the timed runs."""
    attempts: int = 1
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The metrics as JSON-able data."""
        return asdict(self)

    def to_json(self, indent: int | None = 1) -> str:
        """The metrics as JSON text."""
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> Metrics:
        """Metrics read back from :meth:`to_json`."""
        return cls(**json.loads(text))

    def __str__(self) -> str:
        dims = ", ".join(f"{k}={v}" for k, v in self.dims.items()) or f"batch={self.batch}"
        rows = [
            ("cold load", f"{self.cold_load_ms:.2f} ms", "fresh process (the OS page cache may hold the file)"),
            ("warm load", f"{self.warm_load_ms:.2f} ms", "the same process, again"),
            ("optimize", f"{self.optimize_ms:.1f} ms", ""),
            ("compile, cold", f"{self.compile_ms_cold:.1f} ms", "empty compile cache"),
            ("compile, cached", f"{self.compile_ms_cached:.1f} ms", "fresh process, cache filled"),
            ("latency p50", f"{self.p50_ms:.3f} ms", f"{self.runs} runs after {self.warmup} warmup"),
            ("latency p90", f"{self.p90_ms:.3f} ms", ""),
            ("latency p99", f"{self.p99_ms:.3f} ms", ""),
            ("latency mean", f"{self.mean_ms:.3f} ms", f"min {self.min_ms:.3f} ms"),
            ("throughput", f"{self.throughput:.1f} /s", f"batch {self.batch} / mean"),
            ("peak memory", "-" if self.mem_peak is None else f"{self.mem_peak / 2**20:.1f} MB",
             "peak RSS of the measuring process"),
            ("foreign load", f"{self.foreign_load:.2f} cores", f"{self.attempts} attempt(s)"),
        ]
        width = max(len(r[0]) for r in rows)
        value_width = max(len(r[1]) for r in rows)
        lines = [f"metadef benchmark: {self.model} on {self.device} ({self.target}), {dims}"
                 + (f", {self.threads} threads" if self.threads else "")]
        lines += [f"  {name:<{width}}  {value:>{value_width}}  {note}".rstrip() for name, value, note in rows]
        for title, table in (("time per op type", self.op_ms), ("time per step (slowest first)", self.group_ms)):
            if table:
                lines.append(f"{title}:")
                top = sorted(table.items(), key=lambda kv: -kv[1])
                shown = top[:15]
                name_width = max(len(k) for k, _ in shown)
                lines += [f"  {k:<{name_width}}  {v:9.3f} ms" for k, v in shown]
                if len(top) > len(shown):
                    lines.append(f"  ... {len(top) - len(shown)} more ({sum(v for _, v in top[15:]):.3f} ms)")
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)


# ------------------------------------------------------------------------------ scenario


class TestScenario:
    """One benchmark: a model, a device and how to run it; :meth:`run` measures it.

    ``model``: an ``.mdef`` path, a zoo name (``"resnet50"``) or an ``.onnx`` path.
    ``batch`` / ``dims``: the values of the inputs' symbolic dims (default: batch 1, other
    dims the zoo's example sizes or 128); ``threads``: the backend's thread count;
    ``level``: the optimization level before compiling; ``timeout_s``: per process.

    Example:
        >>> s = TestScenario("resnet50.mdef", device="cpu", warmup=100, iterations=500)
        >>> s.target, s.warmup, s.iterations
        ('x86', 100, 500)
    """

    __test__ = False  # not a pytest test class, whatever its name says

    def __init__(self, model: str | os.PathLike[str], device: str = "cpu", warmup: int = 10,
                 iterations: int = 100, batch: int | None = None, dims: Mapping[str, int] | None = None,
                 threads: int | None = None, *, level: str = "aggressive", timeout_s: float | None = None) -> None:
        if device not in DEVICES:
            raise InputError(f"device {device!r} cannot be benchmarked yet; devices: {', '.join(DEVICES)}")
        if warmup < 0 or iterations < 1 or (batch is not None and batch < 1) or (threads is not None and threads < 1):
            raise InputError(f"warmup ({warmup}) must be >= 0; iterations ({iterations}), batch ({batch}) "
                             f"and threads ({threads}) must be >= 1")
        self.model = os.fspath(model)
        self.device = device
        self.target = DEVICES[device]
        self.warmup = warmup
        self.iterations = iterations
        self.batch = batch
        self.dims = dict(dims or {})
        self.threads = threads
        self.level = level
        self.timeout_s = timeout_s

    def __repr__(self) -> str:
        return (f"TestScenario({self.model!r}, device={self.device!r}, warmup={self.warmup}, "
                f"iterations={self.iterations}, batch={self.batch}, dims={self.dims}, threads={self.threads})")

    def run(self, mem_profile: bool = False, trace_level: int = 0,
            progress: Callable[[int, int, str], None] | None = None) -> Metrics:
        """Measure (see the module doc). ``mem_profile``: record peak and per-phase RSS;
        ``trace_level``: 0 none, 1 time per op type, 2 also time per step (fused group);
        ``progress(done, total, what)`` is called after each measuring process."""
        if trace_level not in (0, 1, 2):
            raise InputError(f"trace_level is 0, 1 or 2, got {trace_level!r}")
        with tempfile.TemporaryDirectory(prefix="metadef-bench-") as tmp:
            path = self._model_file(Path(tmp))
            cache = Path(tmp) / "cache"
            cache.mkdir()
            spec = {"path": str(path), "target": self.target, "level": self.level, "threads": self.threads,
                    "batch": self.batch, "dims": self.dims, "warmup": self.warmup, "iterations": self.iterations,
                    "mem_profile": mem_profile, "trace_level": trace_level}
            full = run_child({**spec, "mode": "full"}, cache, self.timeout_s)
            if progress is not None:
                progress(1, 2, "load, compile (cold cache) and timed runs")
            cached = run_child({**spec, "mode": "compile"}, cache, self.timeout_s)
            if progress is not None:
                progress(2, 2, "compile (cached)")
        return Metrics(model=self.model, device=self.device, target=self.target,
                       compile_ms_cached=cached["compile_ms"],
                       threads=self.threads, warmup=self.warmup, iterations=self.iterations,
                       **{k: v for k, v in full.items() if k in _CHILD_FIELDS})

    def _model_file(self, tmp: Path) -> Path:
        """The .mdef file to measure: the given one, or a zoo model / ONNX file converted."""
        path = Path(self.model)
        if path.suffix == ".mdef" and path.is_file():
            return path.resolve()
        if path.exists() or self.model in md.zoo.names():
            out = tmp / f"{path.stem if path.exists() else self.model}.mdef"
            convert(self.model, out, verify=False)
            return out
        raise InputError(f"benchmark: {self.model!r} is neither a file nor a zoo model "
                         f"({', '.join(md.zoo.names())}); give an .mdef or .onnx path")


_CHILD_FIELDS = ("batch", "dims", "runs", "cold_load_ms", "warm_load_ms", "optimize_ms", "compile_ms_cold",
                 "p50_ms", "p90_ms", "p99_ms", "mean_ms", "min_ms", "throughput", "mem_peak", "mem_rss",
                 "op_ms", "group_ms", "foreign_load", "attempts", "warnings")


# ---------------------------------------------------------------------- the child process


def run_child(spec: Mapping[str, Any], cache_dir: Path, timeout_s: float | None = None) -> dict[str, Any]:
    """Run :func:`measure` in a fresh Python process with ``METADEF_CACHE_DIR=cache_dir``."""
    package_root = str(Path(md.__file__).resolve().parents[1])
    env = {**os.environ, "METADEF_CACHE_DIR": str(cache_dir),
           "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)}
    code = "import sys; from metadef.benchmark import child_main; child_main(sys.argv[1])"
    try:
        done = subprocess.run([sys.executable, "-c", code, json.dumps(spec)], env=env, capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        raise MetadefError(f"benchmark of {spec['path']} ({spec['mode']}) ran past {timeout_s} s") from e
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith(RESULT_MARK)]
    if done.returncode != 0 or not lines:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise MetadefError(f"benchmark of {spec['path']} ({spec['mode']}) failed in its process "
                           f"(exit {done.returncode}):\n{tail}")
    return json.loads(lines[-1][len(RESULT_MARK):])


def child_main(spec_json: str) -> None:
    """The measuring process's entry point: print :func:`measure`'s result as one JSON line."""
    print(RESULT_MARK + json.dumps(measure(json.loads(spec_json))), flush=True)


def measure(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Load, compile and (``mode == "full"``) run one model in this process; see the module doc.

    Call it in a fresh process: a load or compile that this process has done before is not cold.
    """
    get_backend(spec["target"])  # the backend is imported now, not inside the compile's time
    rss: dict[str, int] = {"imports": rss_bytes()}
    t0 = time.perf_counter()
    model = md.load(spec["path"])
    graph = model.graph
    cold_ms = _ms_since(t0)
    rss["load"] = rss_bytes()
    t0 = time.perf_counter()
    with md.load(spec["path"]) as again:
        _ = again.graph
    warm_ms = _ms_since(t0)
    t0 = time.perf_counter()
    optimized = md.optimize(graph, level=spec["level"])
    optimize_ms = _ms_since(t0)
    options = {"threads": spec["threads"]} if spec["threads"] else {}
    t0 = time.perf_counter()
    session = md.compile(optimized, target=spec["target"], **options)
    compile_ms = _ms_since(t0)
    rss["compile"] = rss_bytes()
    if spec["mode"] == "compile":
        return {"compile_ms": compile_ms}
    feeds, symbols = example_inputs(session.inputs, batch=spec["batch"] or 1, dims=spec["dims"],
                                    zoo_name=graph.name, env=session.env)
    warmups = [spec["warmup"]]  # the first attempt warms up; a repeat under foreign load need not

    def timed() -> LatencySample:
        return time_runs(lambda: session.run(feeds), warmups.pop() if warmups else 0, spec["iterations"])

    sample, warnings, attempts = guarded(timed, "the timed runs")
    rss["runs"] = rss_bytes()
    batch = symbols.get("batch", spec["batch"] or 1)
    result: dict[str, Any] = {
        **asdict(LatencyStats.of(sample.times, batch)), "batch": batch, "dims": symbols,
        "cold_load_ms": cold_ms, "warm_load_ms": warm_ms, "optimize_ms": optimize_ms, "compile_ms_cold": compile_ms,
        "foreign_load": sample.foreign_cores, "attempts": attempts, "warnings": warnings}
    if spec["trace_level"]:
        steps = step_times(session, feeds, symbols, runs=min(spec["iterations"], TRACE_RUNS))
        if steps is None:
            warnings.append(f"trace: the {spec['target']} executable has no step-by-step path; no times per step")
        else:
            result["op_ms"] = _per_op(session, steps)
            if spec["trace_level"] >= 2:
                result["group_ms"] = steps
    if spec["mem_profile"]:
        result["mem_peak"] = peak_rss_bytes()
        result["mem_rss"] = rss
    return result


def _ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3


# --------------------------------------------------------------------------------- inputs


def example_inputs(inputs: Sequence[IOSpec], *, batch: int = 1, dims: Mapping[str, int] | None = None,
                   zoo_name: str | None = None, env: ShapeEnv | None = None,
                   seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """Inputs for a session's input specs, and the value of each symbolic dim they bind.

    A zoo model (``zoo_name``, its inputs matching by name and dtype) gets the zoo's example
    inputs (valid token ids for BERT). Otherwise the symbol ``batch`` (or, without one, the
    leading dim of the first input) is ``batch``; other symbols take ``dims``, else
    :data:`~metadef.testing.cpu_meter.DEFAULT_SEQ` (raised to the symbol's minimum and rounded up to
    its multiple, at most its maximum); float inputs are random normal, the others zeros.

    Example:
        >>> from metadef.ir import parse_graph
        >>> g = parse_graph("graph g(%x: f32[n,seq*2], %i: i64[n]) -> (%y) { %y: f32[n,seq*2] = Relu(%x) return %y }")
        >>> feeds, symbols = example_inputs(md.compile(g).inputs, batch=3, dims={"seq": 5})
        >>> feeds["x"].shape, feeds["i"].dtype, symbols
        ((3, 10), dtype('int64'), {'n': 3, 'seq': 5})
    """
    dims = dict(dims or {})
    zoo = _zoo_match(inputs, zoo_name)
    if zoo is not None:
        has_seq = any(d == "seq" for _, _, shape in zoo.inputs for d in shape)
        seq = dims.get("seq") if has_seq else None
        feeds = zoo.example_inputs(batch=batch, seq=seq, seed=seed)
        symbols: dict[str, int] = {}
        for spec in inputs:
            if spec.shape is not None:
                bind_shape(spec.shape, feeds[spec.name].shape, symbols)
        return feeds, symbols
    symbols = _symbol_values(inputs, batch, dims, env or ShapeEnv())
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in inputs:
        shape = evaluate_shape(spec.shape or (), symbols)
        dtype = spec.dtype.numpy
        feeds[spec.name] = (rng.standard_normal(shape).astype(dtype) if np.issubdtype(dtype, np.floating)
                            else np.zeros(shape, dtype))
    return feeds, symbols


def _zoo_match(inputs: Sequence[IOSpec], name: str | None) -> Any:
    """The zoo model ``name`` when its inputs are these (by name and dtype), else None."""
    if name not in md.zoo.names():
        return None
    zoo = md.zoo.describe(name)
    if [(n, t) for n, t, _ in zoo.inputs] != [(s.name, s.dtype.numpy.name) for s in inputs]:
        return None
    return zoo


def _symbol_values(inputs: Sequence[IOSpec], batch: int, dims: Mapping[str, int], env: ShapeEnv) -> dict[str, int]:
    names = list(dict.fromkeys(s for spec in inputs for d in spec.shape or () for s in sorted(free_symbols(d))))
    batch_name = "batch" if "batch" in names else None
    first = inputs[0].shape if inputs and inputs[0].shape else ()
    if batch_name is None and first and not isinstance(first[0], int) and len(free_symbols(first[0])) == 1:
        batch_name = next(iter(free_symbols(first[0])))
    values: dict[str, int] = {}
    for name in names:
        if name in dims:
            values[name] = dims[name]
        elif name == batch_name:
            values[name] = batch
        else:
            info = env.symbols.get(name)
            value = max(DEFAULT_SEQ, info.lo if info else 1)
            if info is not None:
                value = -(-value // info.multiple_of) * info.multiple_of
                if info.hi is not None:
                    value = min(value, info.hi)
            values[name] = value
    return values


# ---------------------------------------------------------------------------- measurement


def step_times(session: Session, feeds: Mapping[str, np.ndarray], symbols: Mapping[str, int],
               runs: int = TRACE_RUNS) -> dict[str, float] | None:
    """The median time (ms) of each step, by node name, in step order: from
    :meth:`Session.profile` where the executable runs native programs (each group of native
    calls timed as it runs in a whole run; a step's groups summed), else from its step-by-step
    path (``run_steps``), each step's kernel wrapped in a timer for the duration (one untimed
    run first). None when the executable has neither.

    Example:
        >>> from metadef.ir import parse_graph
        >>> g = parse_graph("graph g(%x: f32[n]) -> (%y) { %t: f32[n] = Neg(%x) @neg "
        ...                 "%y: f32[n] = Relu(%t) @relu return %y }")
        >>> sorted(step_times(md.compile(g, target="x86"), {"x": np.ones(4, np.float32)}, {"n": 4}, runs=2))
        ['neg', 'relu']
    """
    exe = session.executable
    steps = getattr(exe, "steps", None)
    if steps is None or not hasattr(exe, "run_steps"):
        return None
    if getattr(exe, "programs", None) is not None:
        try:
            profile = session.profile(feeds, runs=max(1, runs), warmup=1)
        except BackendError:  # (shapes that depend on values: the step-by-step path below)
            profile = None
        if profile is not None:
            per_node: dict[str, float] = {}
            for row in profile.rows:
                per_node[row.node] = per_node.get(row.node, 0.0) + row.seconds
            return _by_step(steps, [1e3 * per_node.pop(step.node.name, 0.0) for step in steps])
    originals = [step.kernel for step in steps]
    timings: list[list[float]] = [[] for _ in steps]

    def timed(kernel: Callable[..., Any], slot: list[float]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            t = time.perf_counter()
            try:
                return kernel(*args)
            finally:
                slot.append(time.perf_counter() - t)
        return run

    exe.run_steps(feeds, symbols)
    try:
        for step, slot in zip(steps, timings):
            step.kernel = timed(step.kernel, slot)
        for _ in range(max(1, runs)):
            exe.run_steps(feeds, symbols)
    finally:
        for step, kernel in zip(steps, originals):
            step.kernel = kernel
    return _by_step(steps, [1e3 * statistics.median(slot) if slot else 0.0 for slot in timings])


def _by_step(steps: Sequence[Any], ms: Sequence[float]) -> dict[str, float]:
    """Each step's time by its node's name (``name#2``, ... for a name seen before), in order."""
    out: dict[str, float] = {}
    for step, value in zip(steps, ms):
        name = step.node.name or step.node.op
        key, k = name, 1
        while key in out:
            k += 1
            key = f"{name}#{k}"
        out[key] = value
    return out


def _per_op(session: Session, steps: Mapping[str, float]) -> dict[str, float]:
    """Step times summed by op type (``steps`` in the executable's step order)."""
    totals: dict[str, float] = {}
    for step, ms in zip(session.executable.steps, steps.values()):  # type: ignore[attr-defined]
        totals[step.node.op] = totals.get(step.node.op, 0.0) + ms
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def rss_bytes() -> int:
    """This process's resident set size now (``/proc/self/statm``; the peak where unreadable)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return peak_rss_bytes()


def peak_rss_bytes() -> int:
    """This process's peak resident set size (``VmHWM``, else ``getrusage``).

    Example:
        >>> peak_rss_bytes() >= rss_bytes() > 0
        True
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib if sys.platform == "darwin" else kib * 1024


__all__ = ["DEVICES", "TRACE_RUNS", "LatencySample", "LatencyStats", "Metrics", "TestScenario", "child_main",
           "example_inputs", "guarded", "measure", "peak_rss_bytes", "rss_bytes", "run_child", "step_times",
           "time_runs"]
