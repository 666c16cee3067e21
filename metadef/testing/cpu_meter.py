"""A CPU meter for benchmarks on shared machines: how much CPU other processes used while a
measurement ran (``/proc/stat`` less this process's own), and this process's peak RSS.

Example:
    >>> before = cpu_sample()
    >>> foreign_cpu_s(before, cpu_sample()) >= 0.0
    True
"""

from __future__ import annotations

import os
import resource
import sys
from dataclasses import dataclass

FOREIGN_LOAD_LIMIT = 0.25  # other processes' CPU, in cores on average, above which we re-measure
MAX_REPEATS = 2  # re-measurements of one configuration under foreign load, at most
MIN_WINDOW_S = 0.25  # /proc/stat counts in 10 ms ticks: a shorter window says nothing of load
DEFAULT_SEQ = 128  # the value given to symbolic dims other than the batch (BERT's seq)



# ------------------------------------------------------------------------------ CPU meter


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds used so far: by the whole machine (busy, all cores) and by this process."""

    machine_s: float
    process_s: float


def cpu_sample() -> CpuSample:
    """Read ``/proc/stat`` (busy time of all CPUs) and ``/proc/self/stat`` (our own).

    Example:
        >>> s = cpu_sample()
        >>> s.machine_s >= s.process_s >= 0.0
        True
    """
    tick = os.sysconf("SC_CLK_TCK")
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        with open("/proc/self/stat") as f:
            own = f.read().rsplit(")", 1)[1].split()
    except OSError:  # not Linux: no foreign-load figure, only our own CPU time
        t = os.times()
        return CpuSample(t.user + t.system, t.user + t.system)
    busy = sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0)  # less idle, iowait
    if len(fields) > 8:
        busy -= sum(fields[8:10])  # guest time is already counted in user time
    return CpuSample(busy / tick, (int(own[11]) + int(own[12])) / tick)  # utime, stime


def foreign_cpu_s(before: CpuSample, after: CpuSample) -> float:
    """CPU seconds other processes used between two samples (never negative)."""
    return max(0.0, (after.machine_s - before.machine_s) - (after.process_s - before.process_s))


def peak_rss_mb() -> float:
    """This process's peak resident set size so far, in MB (``getrusage``; KiB on Linux)."""
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib / 1024 if sys.platform != "darwin" else kib / 2**20


__all__ = ["DEFAULT_SEQ", "FOREIGN_LOAD_LIMIT", "MAX_REPEATS", "MIN_WINDOW_S", "CpuSample", "cpu_sample",
           "foreign_cpu_s", "peak_rss_mb"]
