"""Latency of the zoo models: metadef's x86 backend vs ONNX Runtime, measured interleaved.

For each model, batch size and thread count, ONNX Runtime (ORT_ENABLE_ALL,
intra_op_num_threads = threads) and metadef x86 (optimized at ``aggressive``, ``threads=``
setting numpy's OpenBLAS threads) run one after the other, N rounds and at least 0.25 s
(``metadef.testing.timing.time_interleaved``), in the same process; the table shows the
medians and the ratio metadef / ORT (below 1.0: metadef is faster), and the compile times
(metadef: optimize + x86 compile; ORT: session creation). BERT runs at seq 128.

    .venv/bin/python bench/x86_latency.py                       # every model, batch 1 and 8
    .venv/bin/python bench/x86_latency.py --models mlp resnet50 --batches 1 --runs 20

The x86 backend runs each model as native programs over a planned arena (one ctypes call per
run of native steps); BLAS calls use ``threads``, generated code one thread.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time

import numpy as np
import onnxruntime as ort

import metadef as md
from metadef.backends.x86 import X86Backend
from metadef.backends.x86.contractions import blas_info
from metadef.backends.x86.threads import set_threads
from metadef.cli_bench import ort_session
from metadef.runtime.session import Session
from metadef.testing.timing import time_interleaved


def bench_model(name: str, batches: list[int], threads: list[int], runs: int, warmup: int) -> list[dict]:
    """One row per (batch, threads): medians in ms, the ratio, and compile times in s."""
    proto = md.zoo.build(name)
    t0 = time.perf_counter()
    graph = md.optimize(md.import_onnx(proto), level="aggressive")
    t_opt = time.perf_counter() - t0
    t0 = time.perf_counter()
    exe = X86Backend().compile(graph)
    t_compile = time.perf_counter() - t0
    sess = Session(graph, exe, "x86")
    print(f"\n{name}: optimize {t_opt:.2f} s, x86 compile {t_compile:.3f} s", flush=True)
    print("  " + exe.summary().replace("\n", "\n  "), flush=True)
    data = proto.SerializeToString()
    rows = []
    for t in threads:
        t0 = time.perf_counter()
        ort_sess = ort_session(data, t)
        t_ort = time.perf_counter() - t0
        set_threads(t)
        for batch in batches:
            dims = {"seq": 128} if name == "bert" else {}
            feeds = md.zoo.describe(name).example_inputs(batch=batch, **dims)
            # interleaved (foreign load hits both alike), at least `runs` rounds and 0.25 s:
            # the MLP's runs take microseconds, and a median of 9 of them moved by 10 %
            sample = time_interleaved({"ORT": functools.partial(ort_sess.run, None, feeds),
                                       "metadef": functools.partial(sess.run, feeds)}, warmup, runs)
            theirs, ours = sample.times["ORT"], sample.times["metadef"]
            row = {"model": name, "batch": batch, "threads": t,
                   "metadef_ms": 1e3 * statistics.median(ours), "ort_ms": 1e3 * statistics.median(theirs),
                   "metadef_compile_s": t_opt + t_compile, "ort_session_s": t_ort}
            row["ratio"] = row["metadef_ms"] / row["ort_ms"]
            rows.append(row)
            print(f"  batch {batch:2d} threads {t}: metadef {row['metadef_ms']:9.3f} ms   "
                  f"ORT {row['ort_ms']:9.3f} ms   ratio {row['ratio']:6.2f}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=md.zoo.names())
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--runs", type=int, default=10, help="timed runs per measurement (median)")
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args(argv)
    info = blas_info()
    print(f"onnxruntime {ort.__version__}, numpy {np.__version__} with {info.name} {info.version}")
    rows = []
    for name in args.models:
        rows += bench_model(name, args.batches, args.threads, args.runs, args.warmup)
    print("\n| model | batch | threads | metadef x86 ms | ORT ms | ratio | metadef compile s | ORT session s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['batch']} | {r['threads']} | {r['metadef_ms']:.3f} | {r['ort_ms']:.3f} | "
              f"{r['ratio']:.2f} | {r['metadef_compile_s']:.2f} | {r['ort_session_s']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
