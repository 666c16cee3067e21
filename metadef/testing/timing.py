"""Timing loops for benchmarks on shared machines: one or several runtimes timed interleaved,
the foreign-load guard, and latency percentiles. ``metadef.benchmark`` (one model, in a fresh
process) and ``metadef bench`` (metadef against its peers, side by side) both time with these,
so each figure is measured one way.

The guard: the machines are shared, so every timed window also measures the CPU time that
*other* processes used in it (:mod:`metadef.testing.cpu_meter`); above
:data:`~metadef.testing.cpu_meter.FOREIGN_LOAD_LIMIT` cores on average the window is measured
again, at most :data:`~metadef.testing.cpu_meter.MAX_REPEATS` times, the least loaded attempt
is kept, and a warning says so.

Example:
    >>> s = time_interleaved({"a": lambda: None, "b": lambda: None}, warmup=1, iterations=3, min_window_s=0.0)
    >>> sorted(s.times), len(s.times["a"]) == len(s.times["b"]) >= 3
    (['a', 'b'], True)
    >>> LatencyStats.of([0.001, 0.002, 0.003], batch=2).p50_ms
    2.0
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np

from metadef.testing.cpu_meter import FOREIGN_LOAD_LIMIT, MAX_REPEATS, MIN_WINDOW_S, cpu_sample, foreign_cpu_s


@dataclass(frozen=True)
class LatencySample:
    """Timed runs (s each), the window's wall time (s) and the CPU s other processes used in it."""

    times: list[float]
    wall_s: float
    foreign_s: float

    @property
    def foreign_cores(self) -> float:
        return self.foreign_s / self.wall_s if self.wall_s > 0 else 0.0


@dataclass(frozen=True)
class InterleavedSample:
    """Several runtimes timed in one window, turn by turn: each one's run times (s), by name."""

    times: dict[str, list[float]]
    wall_s: float
    foreign_s: float

    @property
    def foreign_cores(self) -> float:
        return self.foreign_s / self.wall_s if self.wall_s > 0 else 0.0


def time_interleaved(runners: Mapping[str, Callable[[], object]], warmup: int, iterations: int,
                     min_window_s: float = MIN_WINDOW_S) -> InterleavedSample:
    """``warmup`` untimed rounds, then timed rounds, each runner once a round in the given
    order (so a burst of foreign load hits them alike): at least ``iterations`` rounds, and
    for at least ``min_window_s`` (``/proc/stat`` counts in 10 ms ticks), every run counted.

    Example:
        >>> s = time_interleaved({"x": lambda: None}, warmup=0, iterations=4, min_window_s=0.0)
        >>> len(s.times["x"]), s.foreign_cores >= 0.0
        (4, True)
    """
    for _ in range(warmup):
        for run in runners.values():
            run()
    times: dict[str, list[float]] = {name: [] for name in runners}
    slots = [(run, times[name]) for name, run in runners.items()]
    rounds = 0
    before, t0 = cpu_sample(), time.perf_counter()
    while rounds < iterations or time.perf_counter() - t0 < min_window_s:
        for run, slot in slots:
            t = time.perf_counter()
            run()
            slot.append(time.perf_counter() - t)
        rounds += 1
    wall = time.perf_counter() - t0
    return InterleavedSample(times, wall, foreign_cpu_s(before, cpu_sample()))


def time_runs(run_once: Callable[[], object], warmup: int, iterations: int,
              min_window_s: float = MIN_WINDOW_S) -> LatencySample:
    """One runtime timed: :func:`time_interleaved` with a single runner.

    Example:
        >>> s = time_runs(lambda: None, warmup=1, iterations=5, min_window_s=0.0)
        >>> len(s.times), s.foreign_cores >= 0.0
        (5, True)
    """
    sample = time_interleaved({"run": run_once}, warmup, iterations, min_window_s)
    return LatencySample(sample.times["run"], sample.wall_s, sample.foreign_s)


class Loaded(Protocol):
    """A measurement that knows how much foreign load it ran under."""

    @property
    def foreign_cores(self) -> float: ...


SampleT = TypeVar("SampleT", bound=Loaded)


def guarded(measure: Callable[[], SampleT], what: str = "the runs", repeats: int = MAX_REPEATS,
            limit: float = FOREIGN_LOAD_LIMIT) -> tuple[SampleT, list[str], int]:
    """``measure()``, and again (at most ``repeats`` more times) while other processes used
    more than ``limit`` cores on average; the least loaded attempt, the warnings (one per
    loaded attempt, naming ``what``) and the number of attempts.

    Example:
        >>> loads = iter([0.9, 0.1])
        >>> sample, warnings, attempts = guarded(lambda: LatencySample([0.1], 1.0, next(loads)))
        >>> sample.foreign_s, attempts, "measuring again" in warnings[0]
        (0.1, 2, True)
    """
    best: SampleT | None = None
    warnings: list[str] = []
    attempts = 0
    while True:
        attempts += 1
        got = measure()
        if best is None or got.foreign_cores < best.foreign_cores:
            best = got
        if got.foreign_cores <= limit:
            return best, warnings, attempts
        note = (f"{what}: other processes used {got.foreign_cores:.2f} cores on average while it was "
                f"timed (attempt {attempts}, limit {limit})")
        if attempts > repeats:
            warnings.append(f"{note}; still loaded: the figures are from the least loaded attempt "
                            f"({best.foreign_cores:.2f} cores) and may be slower than on a quiet machine")
            return best, warnings, attempts
        warnings.append(f"{note}; measuring again")


@dataclass(frozen=True)
class LatencyStats:
    """Latency percentiles (ms) of timed runs, and the throughput (inferences / s = batch / mean)."""

    runs: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    min_ms: float
    throughput: float

    @classmethod
    def of(cls, times_s: Sequence[float], batch: int = 1) -> LatencyStats:
        """The figures of run times given in seconds.

        Example:
            >>> s = LatencyStats.of([0.002] * 9 + [0.004], batch=4)
            >>> s.p50_ms, s.min_ms <= s.p90_ms <= s.p99_ms, round(s.throughput)
            (2.0, True, 1818)
        """
        ms = np.asarray(times_s, np.float64) * 1e3
        p50, p90, p99 = (float(v) for v in np.percentile(ms, [50, 90, 99]))
        mean = float(ms.mean())
        return cls(len(ms), p50, p90, p99, mean, float(ms.min()), 1e3 * batch / mean if mean > 0 else 0.0)


__all__ = ["InterleavedSample", "LatencySample", "LatencyStats", "Loaded", "guarded", "time_interleaved",
           "time_runs"]
