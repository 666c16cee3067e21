"""A batch whole or in pieces (metadef.backends.x86.pieces), against ONNX Runtime, in one process.

For each model and thread count: the x86 executable's whole-batch run (``run_whole``), each
way in pieces (of 1 and 2 samples, one after another and, with 2 threads, on the threads at
once) and ONNX Runtime (ORT_ENABLE_ALL) on the same batch, interleaved, medians; the ratio is
against ORT. What ``session.run`` does for the binding (what its first run measured) is the
last column.

    .venv/bin/python bench/x86_pieces.py                         # mobilenetv2, batch 8
    .venv/bin/python bench/x86_pieces.py --models mobilenetv2 resnet50 --batch 8 --runs 7
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

import metadef as md
from metadef.backends.x86 import pieces
from metadef.backends.x86.threads import set_threads
from metadef.cli_bench import ort_session


def bench(name: str, batch: int, threads: int, runs: int) -> None:
    set_threads(threads)
    proto = md.zoo.build(name)
    sess = md.compile(md.optimize(md.import_onnx(proto), level="aggressive"), target="x86")
    exe = sess.executable
    ort = ort_session(proto.SerializeToString(), threads)
    feeds = md.zoo.describe(name).example_inputs(batch=batch)
    inputs = [np.asarray(v) for v in feeds.values()]
    symbols = {"batch": batch}
    ways = [pieces.Pieces(m, w) for w in dict.fromkeys((1, threads)) for m in pieces.PIECES if m < batch]
    calls: dict[str, Callable[[], object]] = {"ORT": lambda: ort.run(None, feeds),
                                              "whole": lambda: exe.run_whole(inputs, symbols)}
    for way in ways:
        calls[str(way)] = lambda way=way: pieces.run_pieces(exe, inputs, symbols, way)
    sess.run(feeds)  # the session's own choice for this binding
    chosen = exe.pieces_for(symbols)
    for call in calls.values():
        call()
    times: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(runs):
        for k, call in calls.items():
            t0 = time.perf_counter()
            call()
            times[k].append(time.perf_counter() - t0)
    ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    cells = "  ".join(f"{k} {v:.1f} ms ({v / ms['ORT']:.2f})" for k, v in ms.items() if k != "ORT")
    print(f"{name} batch {batch} threads {threads}: ORT {ms['ORT']:.1f} ms; {cells}; session.run: "
          f"{'whole' if chosen is None else chosen}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["mobilenetv2"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args(argv)
    for name in args.models:
        for t in args.threads:
            bench(name, args.batch, t, args.runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
