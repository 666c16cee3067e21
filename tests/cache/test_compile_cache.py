"""The cache behind ``md.compile(target="x86")``: in-process reuse, reuse by a second process,
concurrent compiles, a damaged entry rebuilt, misses explained."""

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
from metadef.cache import Store, forget_in_memory
from metadef.cache.store import decode_entry
from metadef.codegen.jit import generated_count
from metadef.ir import parse_graph

pytestmark = pytest.mark.jit

GRAPH = """graph g(%x: f32[n,8], %y: f32[n,8]) -> (%z) {
  %a: f32[n,8] = Exp(%x) @exp
  %b: f32[n,8] = Mul(%a, %y) @mul
  %z: f32[n,8] = Tanh(%b) @tanh
  return %z }"""

# A separate process: compile GRAPH, run it, report how many modules LLVM generated.
SCRIPT = f"""
import json, numpy as np, metadef as md
from metadef.codegen.jit import generated_count, compile_count
from metadef.ir import parse_graph
g = parse_graph('''{GRAPH}''')
x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
out = md.compile(g, target="x86").run({{"x": x, "y": x}})["z"]
print(json.dumps({{"generated": generated_count(), "linked": compile_count(), "out": out.tolist()}}))
"""


def _expected() -> np.ndarray:
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
    return np.tanh(np.exp(x) * x)


def _run_process(cache_dir: Path) -> dict:
    env = {**os.environ, "METADEF_CACHE_DIR": str(cache_dir)}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _entries(cache_dir: Path, level: str) -> list[Path]:
    folder = cache_dir / "v1" / level
    return sorted(folder.glob("*.mdc")) if folder.is_dir() else []


def test_same_graph_twice_in_a_process_is_the_same_executable() -> None:
    g = parse_graph(GRAPH)
    a = md.compile(g, target="x86")
    generated = generated_count()
    b = md.compile(parse_graph(GRAPH), target="x86")  # equal content, another object
    assert b.executable is a.executable and generated_count() == generated


def test_a_second_process_reuses_the_cache(cache_dir: Path) -> None:
    first = _run_process(cache_dir)
    assert first["generated"] >= 1
    second = _run_process(cache_dir)
    assert second["generated"] == 0 and second["linked"] == first["generated"]
    np.testing.assert_allclose(second["out"], _expected(), rtol=1e-5)
    info = Store().info()["levels"]
    assert info["model"]["hits"] == 1 and info["kernel"]["hits"] == first["generated"]


def test_four_processes_at_once_leave_one_valid_entry_per_key(cache_dir: Path) -> None:
    env = {**os.environ, "METADEF_CACHE_DIR": str(cache_dir)}
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        np.testing.assert_allclose(json.loads(out.strip().splitlines()[-1])["out"], _expected(), rtol=1e-5)
    # three kernels and three native routines (the program driver, the worker pool, copy)
    assert len(_entries(cache_dir, "model")) == 1 and len(_entries(cache_dir, "kernel")) == 6
    for path in _entries(cache_dir, "model") + _entries(cache_dir, "kernel"):
        decode_entry(path.read_bytes())  # raises if torn
    assert not list((cache_dir / "v1").rglob("*.tmp"))


@pytest.mark.parametrize("damage", ["truncate", "bitflip"])
def test_a_damaged_kernel_entry_is_rebuilt_not_loaded(cache_dir: Path, damage: str) -> None:
    first = _run_process(cache_dir)
    victim = _entries(cache_dir, "kernel")[0]
    data = bytearray(victim.read_bytes())
    if damage == "truncate":
        data = data[: len(data) - 7]
    else:
        data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    again = _run_process(cache_dir)
    assert again["generated"] == 1 and first["generated"] == 6  # three kernels, three native routines
    np.testing.assert_allclose(again["out"], _expected(), rtol=1e-5)
    decode_entry(victim.read_bytes())  # written again, whole
    assert Store().stats()["kernel.corrupt"] == 1


def test_changing_an_option_misses_and_says_why(monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    g = parse_graph(GRAPH)
    md.compile(g, target="x86", threads=1)
    forget_in_memory()
    monkeypatch.setenv("METADEF_DEBUG", "1")
    with caplog.at_level(logging.INFO, "metadef.cache"):
        md.compile(g, target="x86", threads=2)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("miss model")]
    assert lines and 'options differ ({"threads":2} vs {"threads":1})' in lines[0]


def test_a_change_to_the_backends_source_misses_and_says_why(monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    import metadef.backends.x86.backend as x86

    g = parse_graph(GRAPH)
    md.compile(g, target="x86")
    forget_in_memory()
    monkeypatch.setattr(x86, "backend_source", lambda: "0123456789abcdef")
    monkeypatch.setenv("METADEF_DEBUG", "1")
    with caplog.at_level(logging.INFO, "metadef.cache"):
        md.compile(g, target="x86")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("miss model")]
    assert lines and "backend" in lines[0] and "0123456789abcdef" in lines[0]


# The deployment path: a process whose every kernel comes from the cache.
NO_LLVM_SCRIPT = f"""
import json, sys, numpy as np, metadef as md
from metadef.codegen.link import compile_count
from metadef.ir import parse_graph
g = parse_graph('''{GRAPH}''')
x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
out = md.compile(g, target="x86").run({{"x": x, "y": x}})["z"]
print(json.dumps({{"llvm": "llvmlite.binding" in sys.modules, "linked": compile_count(), "out": out.tolist()}}))
"""


def test_a_process_that_only_hits_never_loads_llvm(cache_dir: Path) -> None:
    env = {**os.environ, "METADEF_CACHE_DIR": str(cache_dir)}
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", NO_LLVM_SCRIPT], env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["llvm"] and not second["llvm"]  # the second links stored object code only
    assert second["linked"] == first["linked"] == 6
    np.testing.assert_allclose(second["out"], _expected(), rtol=1e-5)
    assert second["out"] == first["out"]
