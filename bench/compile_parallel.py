"""Cold compile with and without compile helpers: ``METADEF_COMPILE_WORKERS=1`` vs ``=2``.

Each measurement is a fresh process with an empty ``METADEF_CACHE_DIR`` (the child of
``bench/cache_warm_start.py``: the graph built and optimized untimed, LLVM initialized
apart, then ``md.compile(graph, target="x86")`` timed). The two settings alternate, round
after round, so that load from other processes falls on both alike; the CPU time other
processes used during each round is printed (a 2-core machine needs its second core free for
a helper to pay; the measured process and its helpers do not count as other processes).

    .venv/bin/python bench/compile_parallel.py                       # resnet50 bert mobilenetv2
    .venv/bin/python bench/compile_parallel.py --models resnet50 --rounds 7
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile

from cache_warm_start import child

from metadef.testing.cpu_meter import cpu_sample, foreign_cpu_s


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cold_compile_ms(name: str, workers: int) -> tuple[float, float]:
    """One cold compile in a fresh process: (compile ms, CPU seconds other processes used)."""
    with tempfile.TemporaryDirectory() as cache_dir:
        env = {**os.environ, "METADEF_CACHE_DIR": cache_dir, "METADEF_COMPILE_WORKERS": str(workers)}
        before, children = cpu_sample(), _children_cpu_s()
        done = subprocess.run([sys.executable, __file__, "--child", name], env=env, capture_output=True,
                              text=True, check=True)
        foreign = max(0.0, foreign_cpu_s(before, cpu_sample()) - (_children_cpu_s() - children))
    return json.loads(done.stdout.strip().splitlines()[-1])["compile_ms"], foreign


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet50", "bert", "mobilenetv2"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    print(f"{'model':<12}{'1 process ms':>14}{'2 processes ms':>16}{'ratio':>8}{'foreign CPU s/round':>21}")
    for name in args.models:
        one, two, foreign = [], [], []
        for _ in range(args.rounds):
            for workers, times in ((1, one), (2, two)):
                ms, other = cold_compile_ms(name, workers)
                times.append(ms)
                foreign.append(other)
        a, b = statistics.median(one), statistics.median(two)
        print(f"{name:<12}{a:>14.0f}{b:>16.0f}{b / a:>8.2f}{statistics.median(foreign):>21.2f}", flush=True)


if __name__ == "__main__":
    main()
