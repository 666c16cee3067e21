"""Make tests/data/golden_v1.mdef, the file that pins the 1.0 byte layout (docs/format.md).

Run it only when the format changes on purpose (and add a version history line):

    .venv/bin/python tests/format/make_golden.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from metadef.format import save_graph
from metadef.ir import Graph, parse_graph

GOLDEN_PATH = Path(__file__).resolve().parents[1] / "data" / "golden_v1.mdef"

GOLDEN_TEXT = """graph golden(%x: f32[batch,seq*2,4], %q: i8[3]) -> (%y, %z) {
  %w: f32[4,3] = const
  %b: f16[3] = const
  %k: i64[] = const [1]
  %h: f32[batch,seq*2,3] = MatMul(%x, %w) @"/fc/MatMul"
  %bf: f32[3] = Cast(%b) {to=1} @/fc/cast
  %h2: f32[batch,seq*2,3] = Add(%h, %bf) @/fc/Add
  %y: f32[batch,seq*2,3] = LeakyRelu(%h2) {alpha=0.1} @/act !no_fuse
  %z: f32[batch,seq*2,3] = Softmax(%y) {axis=-1} @/softmax
  return %y, %z
}
"""

GOLDEN_METADATA = {
    "hardware": {"cpu_features": ["avx2"]},
    "parameters": {"tensors": {"w": {"layout": "row-major", "note": "golden"}}},
    "auxiliary": {"training_dataset": "none (golden file)", "labels": ["a", "b", "c"],
                  "input_normalization": {"mean": [0.5], "std": [0.25]}},
    "namespaces": {"tests/v1": {"answer": 42}},
}

GOLDEN_CODE = {"x86-64-avx2": bytes(range(16))}


def golden_graph() -> Graph:
    """The golden graph with its deterministic constants and symbol constraints."""
    constants = {"w": np.arange(12, dtype=np.float32).reshape(4, 3) / 8,
                 "b": np.array([0.5, -1.0, 2.0], np.float16)}
    g = parse_graph(GOLDEN_TEXT, constants)
    g.env.constrain("seq", lo=1, hi=256)
    g.env.constrain("batch", lo=1, multiple_of=2)
    g.metadata["producer"] = "tests/format/make_golden.py"
    return g


def write_golden(path: Path = GOLDEN_PATH) -> Path:
    """Write the golden file to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_graph(golden_graph(), path, metadata=GOLDEN_METADATA, code=GOLDEN_CODE)


if __name__ == "__main__":
    out = write_golden(Path(sys.argv[1]) if len(sys.argv) > 1 else GOLDEN_PATH)
    print(f"wrote {out} ({out.stat().st_size} bytes)")
