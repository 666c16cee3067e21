"""Measure the .mdef files of the zoo models (not a test; prints the figures for BENCHMARKS.md).

    .venv/bin/python tests/format/measure_mdef.py [bert resnet50 ...]

Compares with ``onnx.load`` of the same model and, when installed, safetensors (not a
dependency: ``.venv/bin/pip install safetensors`` to include it). Page cache warm.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROUNDS = 7


def median_ms(fn, rounds: int = ROUNDS) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


RSS_SNIPPET = """
import sys, os
from metadef.format import open_mdef
page = os.sysconf("SC_PAGE_SIZE")
def rss(): return int(open("/proc/self/statm").read().split()[1]) * page
before = rss(); f = open_mdef(sys.argv[1]); after = rss()
print(after - before)
"""


def measure(name: str, workdir: Path) -> None:
    import onnx

    import metadef as md
    from metadef.format import open_mdef, save_graph

    onnx_path = md.zoo.export(name, workdir / f"{name}.onnx")
    graph = md.import_onnx(onnx_path)
    path = save_graph(graph, workdir / f"{name}.mdef")
    weights = sum(v.const.nbytes for v in graph.constants)
    print(f"\n== {name}: {len(graph.nodes)} nodes, {len(graph.constants)} tensors, {weights / 1e6:.1f} MB weights")
    print(f"file size: .mdef {path.stat().st_size / 1e6:.2f} MB, .onnx {onnx_path.stat().st_size / 1e6:.2f} MB")
    open_mdef(path)  # warm the page cache and the imports
    print(f"open .mdef (header+metadata+graph+index): {median_ms(lambda: open_mdef(path)):.2f} ms median")
    print(f"onnx.load:                                {median_ms(lambda: onnx.load(onnx_path), 3):.1f} ms median")
    try:
        from safetensors.numpy import load_file, save_file
        st_path = workdir / f"{name}.safetensors"
        save_file({v.name: np.ascontiguousarray(v.const) for v in graph.constants}, st_path)
        from safetensors import safe_open
        print(f"safetensors safe_open (header only):      {median_ms(lambda: safe_open(st_path, 'np')):.2f} ms median")
        print(f"safetensors load_file (copies all data):  {median_ms(lambda: load_file(st_path), 3):.1f} ms median")
    except ImportError:
        print("safetensors: not installed")
    touch_vs_read(path)
    out = subprocess.run([sys.executable, "-c", RSS_SNIPPET, str(path)], capture_output=True, text=True)
    growth = int(out.stdout.strip() or 0)
    print(f"RSS growth after open, before first use: {growth / 1e6:.2f} MB = {100 * growth / weights:.2f} % of weights")


def touch_vs_read(path: Path) -> None:
    from metadef.format import open_mdef

    f = open_mdef(path, checksum_verify="never")
    infos = [f.tensor_info(n) for n in f.tensor_names()]
    total = sum(i.nbytes for i in infos)
    sink = np.empty(total, np.uint8)

    def plain_read() -> None:
        with open(path, "rb") as fh:
            fh.readinto(memoryview(sink))

    def touch(mode: str) -> None:
        g = open_mdef(path, checksum_verify=mode)
        pos = 0
        for i in infos:
            view = g.tensor(i.name).reshape(-1).view(np.uint8)
            sink[pos:pos + view.size] = view
            pos += view.size

    read_ms = median_ms(plain_read, 5)
    print(f"plain read of {total / 1e6:.1f} MB into a buffer:   {read_ms:.1f} ms")
    for mode in ("never", "on_demand"):
        ms = median_ms(lambda m=mode: touch(m), 5)
        print(f"open + copy out every tensor ({mode:9}):   {ms:.1f} ms = {ms / read_ms:.2f}x the plain read")
    report = open_mdef(path).verify()
    print(f"verify(): {report}")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        for model in sys.argv[1:] or ["mlp", "mobilenetv2", "resnet50", "bert"]:
            measure(model, Path(d))
