"""Compile-cache warm start: ``metadef.compile`` to the first output, cold vs a hit in a new process.

For each model the graph is built and optimized (``aggressive``; not timed), then a fresh
process imports the x86 backend and initializes LLVM (timed apart: ``import ms``; with
``PYTHONDONTWRITEBYTECODE=1`` every module is compiled from source here), and times
``md.compile(graph, target="x86")`` and the first ``run`` twice: once with an
empty ``METADEF_CACHE_DIR`` (cold: every kernel goes through LLVM) and once more with the
cache that the first process left (warm: a model-level hit, kernels linked from disk). BERT
runs at batch 1, seq 128; the CNNs at batch 1.

    .venv/bin/python bench/cache_warm_start.py                      # bert resnet50
    .venv/bin/python bench/cache_warm_start.py --models mlp mobilenetv2 bert resnet50
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

import metadef as md
from metadef.codegen.jit import generated_count


def _feeds(name: str) -> dict[str, np.ndarray]:
    feeds = {}
    for input_name, dtype, shape in md.zoo.describe(name).inputs:
        dims = [d if isinstance(d, int) else 128 if d == "seq" else 1 for d in shape]
        feeds[input_name] = (np.ones(dims, dtype) if dtype.startswith("int")
                             else np.random.default_rng(0).standard_normal(dims).astype(dtype))
    return feeds


def child(name: str) -> None:
    """Build the graph (untimed), then time compile and the first run; print one JSON line."""
    graph = md.optimize(md.import_onnx(md.zoo.build(name)), level="aggressive")
    feeds = _feeds(name)
    t0 = time.perf_counter()
    import metadef.backends.x86  # noqa: F401  (Python imports: not the cache's work)
    from metadef.codegen.jit import host_target

    host_target()  # LLVM's initialization, once per process
    import_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    session = md.compile(graph, target="x86")
    t1 = time.perf_counter()
    session.run(feeds)
    t2 = time.perf_counter()
    print(json.dumps({"import_ms": import_ms, "compile_ms": (t1 - t0) * 1e3, "first_run_ms": (t2 - t1) * 1e3,
                      "total_ms": (t2 - t0) * 1e3, "llvm_modules": generated_count()}))


def measure(name: str, cache_dir: str) -> dict:
    env = {**os.environ, "METADEF_CACHE_DIR": cache_dir}
    done = subprocess.run([sys.executable, __file__, "--child", name], env=env, capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["bert", "resnet50"])
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    print(f"{'model':<12}{'':>6}{'import ms':>11}{'compile ms':>12}{'first run ms':>14}{'total ms':>10}"
          f"{'LLVM modules':>14}")
    for name in args.models:
        with tempfile.TemporaryDirectory() as cache_dir:
            cold = measure(name, cache_dir)
            warm = measure(name, cache_dir)
        for label, row in (("cold", cold), ("warm", warm)):
            print(f"{name:<12}{label:>6}{row['import_ms']:>11.1f}{row['compile_ms']:>12.1f}{row['first_run_ms']:>14.1f}"
                  f"{row['total_ms']:>10.1f}{row['llvm_modules']:>14}")
        print(f"{name:<12} ratio: compile {cold['compile_ms'] / warm['compile_ms']:.1f}x, "
              f"to first output {cold['total_ms'] / warm['total_ms']:.1f}x", flush=True)


if __name__ == "__main__":
    main()
