"""Node counts of the zoo models before and after each optimization level, next to ONNX
Runtime's own optimized graph (ORT_ENABLE_ALL, saved with ``optimized_model_filepath``), and the
time each level takes, measured in the same run.

Run:  .venv/bin/python bench/optimizer_counts.py [model ...]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import onnx
import onnxruntime as ort

import metadef as md


def ort_optimized_nodes(proto: onnx.ModelProto) -> tuple[int, float]:
    """Nodes in ONNX Runtime's ORT_ENABLE_ALL graph, and its session-creation time (s)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "opt.onnx"
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.optimized_model_filepath = str(out)
        so.log_severity_level = 3
        t0 = time.perf_counter()
        ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
        elapsed = time.perf_counter() - t0
        return len(onnx.load(str(out), load_external_data=False).graph.node), elapsed


def main(names: list[str]) -> None:
    print(f"{'model':12} {'ONNX nodes':>10} {'imported':>9} {'safe':>6} {'moderate':>9} {'aggressive':>11} "
          f"{'ORT_ENABLE_ALL':>15} {'aggressive time':>16} {'ORT session':>12}")
    for name in names:
        proto = md.zoo.build(name)
        graph = md.import_onnx(proto, name=name)
        counts = {}
        times = []
        for level in ("safe", "moderate", "aggressive"):
            runs = []
            for _ in range(3):
                t0 = time.perf_counter()
                out = md.optimize(graph, level=level)
                runs.append(time.perf_counter() - t0)
            counts[level] = len(out.nodes)
            times = runs
        ort_nodes, ort_s = ort_optimized_nodes(proto)
        print(f"{name:12} {len(proto.graph.node):>10} {len(graph.nodes):>9} {counts['safe']:>6} "
              f"{counts['moderate']:>9} {counts['aggressive']:>11} {ort_nodes:>15} "
              f"{statistics.median(times) * 1e3:>13.0f} ms {ort_s * 1e3:>9.0f} ms")


if __name__ == "__main__":
    main(sys.argv[1:] or md.zoo.names())
