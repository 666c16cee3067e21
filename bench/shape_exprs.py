"""Symbolic-dimension cost: metadef's hash-consed expressions vs sympy, side by side.

Two measurements, each printed as a ratio against sympy measured in the same run:

1. a micro-workload of the dim operations shape inference does (products, sums, floor
   division that must simplify, equality tests), on the same symbols in both systems;
2. the whole of BERT-base's shape inference as metadef does it (import of the zoo model,
   every node's rule), with the number of dim operations it performed.

Run:  .venv/bin/python bench/shape_exprs.py   (sympy is optional: `pip install sympy` to compare)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import metadef as md
from metadef.shape import floordiv, sym


def _best(fn: Callable[[], Any], repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def workload_metadef(n: int = 2000) -> None:
    b, s = sym("batch"), sym("seq")
    for i in range(n):
        total = b * s * 768
        heads = floordiv(total, 12 * 64)
        assert heads is b * s
        x = (b + i) * 2 - b
        assert (x == b + 2 * i) or True
        floordiv(s + 2 * i, 2)


def workload_sympy(n: int = 2000) -> None:
    import sympy

    b, s = sympy.symbols("batch seq", integer=True, positive=True)
    for i in range(n):
        total = b * s * 768
        heads = sympy.floor(total / (12 * 64))
        assert sympy.simplify(heads - b * s) == 0
        x = sympy.expand((b + i) * 2 - b)
        assert (x == b + 2 * i) or True
        sympy.floor((s + 2 * i) / 2)


def shape_time_share(proto: Any) -> tuple[float, int]:
    """Seconds spent inside metadef/shape during one import (cProfile self time), and calls."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    md.import_onnx(proto)
    prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    total, calls = 0.0, 0
    for (filename, _line, _name), (_cc, nc, tt, _ct, _callers) in stats.items():
        if "/metadef/shape/" in filename:
            total += tt
            calls += nc
    return total, calls


def main() -> None:
    ours = _best(workload_metadef)
    try:
        theirs = _best(workload_sympy, repeat=2)
        print(f"dim workload (2000 iterations): metadef {ours * 1e3:.1f} ms, sympy {theirs * 1e3:.1f} ms, "
              f"sympy/metadef = {theirs / ours:.0f}x")
    except ImportError:
        print(f"dim workload (2000 iterations): metadef {ours * 1e3:.1f} ms (sympy not installed)")

    proto = md.zoo.build("bert")
    runs = []
    for _ in range(3):
        t0 = time.perf_counter()
        graph = md.import_onnx(proto)
        runs.append(time.perf_counter() - t0)
    shape_s, calls = shape_time_share(proto)
    print(f"BERT-base import with symbolic shape inference ({len(graph.nodes)} nodes): "
          f"median {statistics.median(runs) * 1e3:.0f} ms, of which {shape_s * 1e3:.0f} ms "
          f"(profiled) in metadef.shape over {calls} calls")
    print(f"  outputs: {', '.join(f'{v.name}: {v.type}' for v in graph.outputs)}")


if __name__ == "__main__":
    main()
