"""Parallel compile: helper processes share a cold compile through the kernel level; the
executable is the same as a compile in one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import metadef as md
from metadef.backends.x86.parallel import MIN_NODES, compile_workers, helper_order, helpers
from metadef.core.errors import BackendError
from metadef.ir import parse_graph

pytestmark = [pytest.mark.jit, pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")]

# nine nodes of different elementwise kernels, a conv and a matmul: kernels and routines
GRAPH = """graph g(%x: f32[n,4,6,6], %w: f32[6,5]) -> (%y, %z) {
  %k: f32[4,4,3,3] = const
  %c: f32[n,4,6,6] = Conv(%x, %k) {pads=[1,1,1,1]} @conv
  %a: f32[n,4,6,6] = Exp(%c) @exp
  %b: f32[n,4,6,6] = Tanh(%a) @tanh
  %d: f32[n,4,6,6] = Sigmoid(%b) @sig
  %e: f32[n,4,6,6] = Mul(%d, %b) @mul
  %f: f32[n,144] = Flatten(%e) {axis=1} @flat
  %g: f32[n,144] = Softmax(%f) {axis=1} @soft
  %s: i64[3] = const
  %h: f32[n,24,6] = Reshape(%g, %s) @split
  %y: f32[n,24,6] = Abs(%h) @abs
  %z: f32[n,24,5] = MatMul(%h, %w) @mm
  return %y, %z }"""


def _graph() -> md.Graph:
    k = np.random.default_rng(0).standard_normal((4, 4, 3, 3)).astype(np.float32) * 0.2
    return parse_graph(GRAPH, constants={"k": k, "s": np.array([-1, 24, 6], np.int64)})


def _feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {"x": rng.standard_normal((2, 4, 6, 6)).astype(np.float32),
            "w": rng.standard_normal((6, 5)).astype(np.float32)}


SCRIPT = """
import json, sys
import numpy as np
sys.path.insert(0, {here!r})
from test_parallel_compile import _feeds, _graph
from metadef.backends.x86 import X86Backend, conv1x1, gemm
from metadef.codegen.jit import generated_count
# kernel choices fixed: measured ones may differ between two processes, and so would the
# outputs' last bits, which the tests compare exactly
conv1x1.PREFER, gemm.PREFER = conv1x1.BLAS, gemm.BLAS
exe = X86Backend().compile(_graph())
outs = exe.run(_feeds(), {{"n": 2}})
print(json.dumps({{"plan": [[p.node, p.kind, p.strategy, list(p.kernels)] for p in exe.plan],
                  "generated": generated_count(), "outs": [o.tolist() for o in outs]}}))
"""


def _compile_in_a_process(cache: Path, workers: int) -> dict:
    env = {**os.environ, "METADEF_CACHE_DIR": str(cache), "METADEF_COMPILE_WORKERS": str(workers)}
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(here=str(Path(__file__).parent))], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _kernels(cache: Path) -> set[str]:
    return {p.name for p in (cache / "v1" / "kernel").glob("*.mdc")}


def test_helpers_share_the_compile_and_the_executable_is_the_same(tmp_path: Path) -> None:
    assert len(_graph().nodes) >= MIN_NODES
    alone = _compile_in_a_process(tmp_path / "one", 1)
    shared = _compile_in_a_process(tmp_path / "two", 2)
    assert shared["plan"] == alone["plan"]  # kinds, strategies, kernel keys
    assert shared["outs"] == alone["outs"]
    # every kernel is on disk; the helper compiled some (the compiling process linked them)
    assert _kernels(tmp_path / "one") == _kernels(tmp_path / "two")
    assert shared["generated"] < alone["generated"]
    assert not list((tmp_path / "two" / "v1" / "claims").glob("*"))  # every claim given back


def test_a_claim_left_by_a_dead_process_does_not_stop_the_compile(tmp_path: Path) -> None:
    alone = _compile_in_a_process(tmp_path / "one", 1)
    claims = tmp_path / "two" / "v1" / "claims"
    claims.mkdir(parents=True)
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    for name in _kernels(tmp_path / "one"):  # every kernel claimed by a process that is gone
        (claims / name.removesuffix(".mdc")).write_text(str(pid))
    shared = _compile_in_a_process(tmp_path / "two", 2)
    assert shared["plan"] == alone["plan"] and shared["outs"] == alone["outs"]


def test_no_helpers_for_small_graphs_one_worker_or_no_store(monkeypatch: pytest.MonkeyPatch) -> None:
    g = _graph()
    with helpers(g, workers=1) as started:
        assert started == 0
    with helpers(g, workers=2) as started:  # no kernel store in effect here
        assert started == 0
    small = parse_graph("graph s(%x: f32[n]) -> (%y) { %y: f32[n] = Relu(%x) return %y }")
    with helpers(small, workers=2) as started:
        assert started == 0


def test_the_worker_count_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METADEF_COMPILE_WORKERS", "3")
    assert compile_workers() == 3
    monkeypatch.delenv("METADEF_COMPILE_WORKERS")
    assert 1 <= compile_workers() <= 4
    for bad in ("two", "0"):
        monkeypatch.setenv("METADEF_COMPILE_WORKERS", bad)
        with pytest.raises(BackendError, match="METADEF_COMPILE_WORKERS"):
            compile_workers()


def test_helpers_start_at_different_nodes_and_walk_toward_the_process_below() -> None:
    nodes = list(range(9))
    orders = [helper_order(nodes, r, 3) for r in range(1, 3)]
    assert [o[0] for o in orders] == [5, 8]  # (the compiling process starts at node 0)
    assert orders[0][:3] == [5, 4, 3] and orders[1][:3] == [8, 7, 6]
    assert all(sorted(o) == nodes for o in orders)


def test_a_routine_another_process_compiles_is_left_for_later_when_not_waiting(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import metadef.codegen.native as native
    from metadef.cache import DiskKernelStore, Store, kernel_key
    from metadef.codegen.kernel import CompiledElsewhere, kernel_store

    monkeypatch.setattr(native, "_ADDRESSES", {})  # as in a process that has linked nothing yet
    store = DiskKernelStore(Store(tmp_path))
    claims = store.share_compile(helper=False)
    digest = kernel_key("md_native runtime md_copy").digest
    (claims.root / digest).parent.mkdir(parents=True, exist_ok=True)
    (claims.root / digest).write_text(str(os.getppid()))  # a live process compiles it
    with kernel_store(store):
        with pytest.raises(CompiledElsewhere, match="md_copy"):
            native.native_function("md_copy", wait=False)
        (claims.root / digest).unlink()  # it gave up: this process compiles it
        assert native.native_function("md_copy", wait=False) != 0


def test_a_helper_goes_on_past_a_routine_another_process_claimed(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from metadef.backends.x86 import parallel
    from metadef.codegen.kernel import CompiledElsewhere

    built: list[str] = []

    def native_function(routine: str) -> int:
        if routine == "md_conv1x1":  # (claimed by the compiling process)
            raise CompiledElsewhere(routine)
        built.append(routine)
        return 1

    def choose(node: str) -> SimpleNamespace:
        if node == "broken":
            raise BackendError("no kernel")
        return SimpleNamespace(native=node)

    monkeypatch.setattr(parallel, "native_function", native_function)
    monkeypatch.setattr(parallel, "choose", choose)
    monkeypatch.setattr(parallel, "needs", lambda native: {"conv": ("md_conv1x1", "md_conv1x1t", "md_transpose"),
                                                          "fc": ("md_gemm",)}.get(native, ()))
    parallel._compile_nodes(["conv", "broken", "fc"], ("md_copy",))
    assert built == ["md_copy", "md_conv1x1t", "md_transpose", "md_gemm"]
