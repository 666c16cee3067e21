"""The warm path: weights in the model key by type only, the executable rebuilt from the
stored plan (no mapping search, no structural keys, no LLVM), and a plan that does not fit
falling back to the normal compile."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import metadef as md
from metadef.backends.x86.backend import backend_source
from metadef.cache import Store, forget_in_memory, graph_hash, model_key
from metadef.codegen.jit import generated_count
from metadef.ir import Graph, GraphBuilder
from metadef.shape import parse_type

pytestmark = pytest.mark.jit


def _graph(scale: float, bias: np.ndarray) -> Graph:
    """exp(x * scale) + bias, fused: ``scale`` is compiled into the group's kernel, ``bias``
    is a weight passed to it at run time."""
    b = GraphBuilder("warm")
    x = b.input("x", parse_type("f32[n,8]"))
    k = b.const("k", np.float32(scale))
    w = b.const("w", bias)
    y, = b.node("Mul", [x, k])
    z, = b.node("Exp", [y])
    out, = b.node("Add", [z, w])
    b.output(out)
    return md.optimize(b.build(), level="aggressive")


X = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
BIAS = np.arange(8, dtype=np.float32)


def _model_entries(cache_dir: Path) -> list[Path]:
    folder = cache_dir / "v1" / "model"
    return sorted(folder.glob("*.mdc")) if folder.is_dir() else []


def _run(graph: Graph) -> np.ndarray:
    session = md.compile(graph, target="x86")
    return next(iter(session.run({"x": X}).values()))


def test_weights_count_by_type_compiled_in_constants_by_value() -> None:
    g = _graph(2.0, BIAS)
    assert graph_hash(g, weights=False) == graph_hash(_graph(2.0, BIAS + 1), weights=False)
    assert graph_hash(g) != graph_hash(_graph(2.0, BIAS + 1))  # the content hash keeps them
    assert graph_hash(g, weights=False) != graph_hash(_graph(3.0, BIAS), weights=False)
    assert graph_hash(g, weights=False) != graph_hash(_graph(2.0, BIAS[None]), weights=False)  # shape counts


def _power(exponent: float) -> Graph:
    """One node ``x ** exponent`` (not fused): the scalar is a top-level constant, which the
    node's kernel compiles in (``x * x`` for 2)."""
    b = GraphBuilder("power")
    y, = b.node("Pow", [b.input("x", parse_type("f32[n,8]")), b.const("e", np.float32(exponent))])
    b.output(y)
    return b.build()


def test_a_top_level_scalar_counts_by_value_and_runs_with_its_own_kernel(cache_dir: Path) -> None:
    """Two graphs that differ only in a scalar constant share no compiled model (in this
    process or on disk): each runs with its own value."""
    assert graph_hash(_power(2.0), weights=False) != graph_hash(_power(3.0), weights=False)
    np.testing.assert_allclose(_run(_power(2.0)), X ** 2, rtol=1e-6)
    np.testing.assert_allclose(_run(_power(3.0)), X ** 3, rtol=1e-6)
    forget_in_memory()
    np.testing.assert_allclose(_run(_power(3.0)), X ** 3, rtol=1e-6)


def test_a_changed_weight_hits_the_model_and_runs_with_the_new_values(cache_dir: Path) -> None:
    np.testing.assert_allclose(_run(_graph(2.0, BIAS)), np.exp(X * 2) + BIAS, rtol=1e-5)
    forget_in_memory()
    generated = generated_count()
    np.testing.assert_allclose(_run(_graph(2.0, BIAS * 10)), np.exp(X * 2) + BIAS * 10, rtol=1e-5)
    assert generated_count() == generated and len(_model_entries(cache_dir)) == 1
    assert Store().stats()["model.hits"] == 1


def test_a_changed_compiled_in_constant_misses_and_recompiles(cache_dir: Path) -> None:
    _run(_graph(2.0, BIAS))
    forget_in_memory()
    generated = generated_count()
    np.testing.assert_allclose(_run(_graph(3.0, BIAS)), np.exp(X * 3) + BIAS, rtol=1e-5)
    assert generated_count() == generated + 1 and len(_model_entries(cache_dir)) == 2


SCRIPT = """
import json, numpy as np, metadef as md, sys
sys.path.insert(0, {tests!r})
from test_warm_start import _graph, X, BIAS
from metadef.codegen.jit import generated_count
exe = md.compile(_graph(2.0, BIAS), target="x86")
out = next(iter(exe.run({{"x": X}}).values()))
print(json.dumps({{"generated": generated_count(), "out": out.tolist(),
                  "plan": [[p.strategy, p.kind, len(p.kernels)] for p in exe.executable.plan]}}))
"""


def _process(cache_dir: Path) -> dict:
    env = {**os.environ, "METADEF_CACHE_DIR": str(cache_dir)}
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(tests=str(Path(__file__).parent))], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_new_process_rebuilds_the_executable_from_the_stored_plan(cache_dir: Path) -> None:
    cold = _process(cache_dir)
    warm = _process(cache_dir)
    assert cold["generated"] == 4 and warm["generated"] == 0  # the kernel, the driver, the pool, copy
    assert warm["plan"] == cold["plan"] == [["generated_group", "generated", 1]]
    np.testing.assert_allclose(warm["out"], np.exp(X * 2) + BIAS, rtol=1e-5)
    assert Store().stats()["model.hits"] == 1


@pytest.mark.parametrize("damage", ["strategy", "nodes", "kernel"])
def test_a_plan_that_does_not_fit_falls_back_and_says_why(cache_dir: Path, damage: str,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    g = _graph(2.0, BIAS)
    _run(g)
    forget_in_memory()
    store = Store()
    key = model_key(graph_hash(g, weights=False), "x86", {"threads": None}, backend=backend_source())
    entry = store.get(key)
    assert entry is not None
    plan = entry.manifest["plan"]
    if damage == "strategy":
        plan[0]["strategy"] = "no_such_strategy"
    elif damage == "nodes":
        plan = plan * 2
    else:
        plan[0]["kernels"] = ["0" * 32]
    store.put(key, {**{k: v for k, v in entry.manifest.items() if k not in ("key", "blobs", "level")},
                    "plan": plan}, {})
    with caplog.at_level(logging.WARNING, "metadef.cache"):
        np.testing.assert_allclose(_run(g), np.exp(X * 2) + BIAS, rtol=1e-5)
    assert any("does not fit" in r.getMessage() for r in caplog.records)
    assert Store().get(key).manifest["plan"][0]["strategy"] == "generated_group"  # written again


def test_a_plan_whose_nodes_share_a_kernel_under_other_symbols_replays(caplog: pytest.LogCaptureFixture) -> None:
    # three Adds of one structure, each over its own symbols: one kernel, made for the first
    from metadef.ir import parse_graph

    g = parse_graph("""graph g(%a: f32[p], %b: f32[q], %c: f32[r], %d: f32[s]) -> (%x, %y, %z) {
      %x: f32[max(p, q)] = Add(%a, %b) @add0
      %y: f32[max(q, r)] = Add(%b, %c) @add1
      %z: f32[max(r, s)] = Add(%c, %d) @add2
      return %x, %y, %z }""")
    feeds = {k: np.arange(4, dtype=np.float32) + i for i, k in enumerate("abcd")}
    first = md.compile(g, target="x86")
    assert len({p.kernels for p in first.executable.plan}) == 1
    forget_in_memory()
    before = generated_count()
    with caplog.at_level(logging.WARNING, "metadef.cache"):
        again = md.compile(g, target="x86")
    assert not [r for r in caplog.records if "does not fit" in r.getMessage()]
    assert generated_count() == before  # rebuilt from the plan: no LLVM
    for name, want in first.run(feeds).items():
        np.testing.assert_array_equal(again.run(feeds)[name], want)


def test_kernels_compiled_without_the_cache_reach_it_when_a_cached_compile_uses_them(
        caplog: pytest.LogCaptureFixture) -> None:
    g = _graph(3.0, BIAS)
    md.compile(g, target="x86", cache=False)  # its kernels live in this process only
    md.compile(g, target="x86")  # hits them in memory: the store must get them too
    forget_in_memory()
    before = generated_count()
    with caplog.at_level(logging.WARNING, "metadef.cache"):
        md.compile(g, target="x86")
    assert not [r for r in caplog.records if "does not fit" in r.getMessage()]
    assert generated_count() == before
