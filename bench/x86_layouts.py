"""Values between pointwise convs pixel-major or NCHW (metadef.backends.x86.layouts), against ONNX Runtime.

For each model, batch and thread count, in one process: the model compiled twice with the same
kernel choices (the second compile finds them measured), one binding with the layouts agreed
(``layouts.ENABLED``), one with every value NCHW, and ONNX Runtime (ORT_ENABLE_ALL), run
interleaved in rounds of ``--runs`` runs each; medians of the rounds, each against ORT, and the
median over rounds of pixel-major / NCHW.

    .venv/bin/python bench/x86_layouts.py                                  # resnet50, b1 and b8, 1 thread
    .venv/bin/python bench/x86_layouts.py --models resnet50 mobilenetv2 --batches 1 8 --threads 1 2
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import metadef as md
from metadef.backends.x86 import layouts
from metadef.backends.x86.threads import set_threads
from metadef.cli_bench import ort_session


def bench(name: str, batch: int, threads: int, rounds: int, runs: int) -> None:
    set_threads(threads)
    proto = md.zoo.build(name)
    graph = md.optimize(md.import_onnx(proto), level="aggressive")
    feeds = md.zoo.describe(name).example_inputs(batch=batch)
    sessions = {}
    for enabled in (False, True):  # (the layouts are agreed when a binding first runs)
        layouts.ENABLED = enabled
        try:
            sessions[enabled] = md.compile(graph, target="x86", cache=not enabled)
            sessions[enabled].run(feeds)
        finally:
            layouts.ENABLED = True
    values = sessions[True].executable.programs.bound({"batch": batch}).pixel_major
    ort = ort_session(proto.SerializeToString(), threads)
    calls: dict[str, Callable[[], object]] = {"NCHW": lambda: sessions[False].run(feeds),
                                              "pixel-major": lambda: sessions[True].run(feeds),
                                              "ORT": lambda: ort.run(None, feeds)}
    medians: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(rounds):
        for k, call in calls.items():
            call()
            times = []
            for _ in range(runs):
                t0 = time.perf_counter()
                call()
                times.append(time.perf_counter() - t0)
            medians[k].append(1e3 * statistics.median(times))
    ms = {k: statistics.median(v) for k, v in medians.items()}
    gain = statistics.median(p / n for p, n in zip(medians["pixel-major"], medians["NCHW"]))
    print(f"{name} batch {batch} threads {threads}: {values} values pixel-major; ORT {ms['ORT']:.2f} ms; "
          f"NCHW {ms['NCHW']:.2f} ms ({ms['NCHW'] / ms['ORT']:.3f}); pixel-major {ms['pixel-major']:.2f} ms "
          f"({ms['pixel-major'] / ms['ORT']:.3f}); pixel-major / NCHW {gain:.3f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["resnet50"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--threads", nargs="+", type=int, default=[1])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--runs", type=int, default=5, help="runs a round (median)")
    args = ap.parse_args(argv)
    for name in args.models:
        for batch in args.batches:
            for t in args.threads:
                bench(name, batch, t, args.rounds, args.runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
