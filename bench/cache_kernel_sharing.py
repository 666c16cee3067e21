"""Kernel-level cache sharing across models: ResNet-101 compiled after ResNet-50.

A fresh process compiles ResNet-50 for x86 with an empty ``METADEF_CACHE_DIR``; a second
fresh process compiles ResNet-101 with the same cache: its model level misses (another graph),
and every fused group whose structure ResNet-50 already had (ops, attributes, dtypes, the
symbolic shape form) is a kernel-level hit. The table gives each process's kernel hits and
misses (from the cache's own counters), its LLVM modules and its compile time.

    .venv/bin/python bench/cache_kernel_sharing.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

CHILD = """
import json, logging, time
logging.disable(logging.WARNING)
import metadef as md
from metadef.cache import Store
from metadef.codegen.jit import generated_count, host_target
from metadef.zoo import resnet
import metadef.backends.x86
host_target()
graph = md.optimize(md.import_onnx(resnet.build(0, depth={depth})), level="aggressive")
before = Store().stats()
t0 = time.perf_counter()
md.compile(graph, target="x86")
ms = (time.perf_counter() - t0) * 1e3
store = Store()
after = store.stats()
print(json.dumps({{"ms": ms, "llvm": generated_count(), "nodes": len(graph.nodes),
                  "hits": after.get("kernel.hits", 0) - before.get("kernel.hits", 0),
                  "misses": after.get("kernel.misses", 0) - before.get("kernel.misses", 0)}}))
"""


def _child(depth: int, cache_dir: str) -> dict:
    env = {**os.environ, "METADEF_CACHE_DIR": cache_dir}
    done = subprocess.run([sys.executable, "-c", CHILD.format(depth=depth)], env=env, capture_output=True,
                          text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    print("| model | nodes (aggressive) | kernel hits | kernel misses | hit rate | LLVM modules | compile ms |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as cache_dir:
        for depth in (50, 101):
            row = _child(depth, cache_dir)
            total = row["hits"] + row["misses"]
            rate = row["hits"] / total if total else 0.0
            print(f"| resnet{depth} | {row['nodes']} | {row['hits']} | {row['misses']} | {rate:.0%} | "
                  f"{row['llvm']} | {row['ms']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
