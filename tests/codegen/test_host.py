"""The host target: LLVM's answer, recorded once per host under the cache directory, and read
back without LLVM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest

from metadef.codegen import host, jit
from metadef.codegen.host import (
    HostTarget,
    beyond_isa,
    cap_features,
    host_fingerprint,
    host_target,
    toolchain,
    widest_vector,
)
from metadef.core.flags import ISA_LEVELS

pytestmark = pytest.mark.jit


@pytest.fixture
def fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty cache directory and no remembered host target (restored afterwards), uncapped."""
    monkeypatch.setenv("METADEF_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("METADEF_MAX_ISA", raising=False)
    host_target.cache_clear()
    yield tmp_path
    host_target.cache_clear()


def _record(root: Path) -> Path:
    fingerprint = host_fingerprint()
    if fingerprint is None:
        pytest.skip("no /proc/cpuinfo here: the host target is asked of LLVM every time")
    return root / "hosts" / f"{fingerprint}.json"


def test_the_first_answer_is_llvms_and_is_recorded(fresh: Path) -> None:
    asked = jit.query_host()
    assert host_target() == asked
    assert json.loads(_record(fresh).read_text()) == asdict(asked)
    assert asked.llvm.count(".") == 2 and asked.has("sse2")


def test_a_recorded_answer_is_used_without_asking_llvm(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _record(fresh)
    path.parent.mkdir(parents=True)
    recorded = HostTarget("somecpu", "+sse2,-avx2,-avx512f", 128, "x86_64-unknown-linux-gnu", "20.1.8")
    path.write_text(json.dumps(asdict(recorded)))
    monkeypatch.setattr(host, "ask_llvm", lambda: pytest.fail("LLVM was asked despite the record"))
    assert host_target() == recorded
    assert toolchain()["cpu_features"] == recorded.features and toolchain()["llvm"] == "20.1.8"


BAD_WIDTH = '{"cpu": "x", "features": "+sse2", "vector_bits": 100, "triple": "t", "llvm": "1.2.3"}'


@pytest.mark.parametrize("damage", ["{not json", '{"cpu": "x"}', BAD_WIDTH])
def test_a_damaged_record_is_asked_again_and_rewritten(fresh: Path, damage: str) -> None:
    path = _record(fresh)
    path.parent.mkdir(parents=True)
    path.write_text(damage)
    assert host_target() == jit.query_host()
    assert json.loads(path.read_text()) == asdict(host_target())


def test_the_fingerprint_is_stable_and_names_this_cpu() -> None:
    assert host_fingerprint() == host_fingerprint()
    fingerprint = host_fingerprint()
    assert fingerprint is None or len(fingerprint) == 16


# ---------------------------------------------------------------------- METADEF_MAX_ISA

AVX512_HOST = ("+sse4.2,+avx,+avx2,+fma,+f16c,+avx512f,+avx512vl,+avx512bw,+avx512vnni,+avxvnni,+evex512,+amx-tile,"
               "+amx-int8,+bmi2,-sse4a")


@pytest.mark.parametrize("level", ISA_LEVELS)
def test_a_cap_turns_off_every_feature_past_its_level_and_nothing_else(level: str) -> None:
    for features in (AVX512_HOST, jit.query_host().features):
        capped = cap_features(features, level)
        before, after = features.split(","), capped.split(",")
        assert [f[1:] for f in before] == [f[1:] for f in after]  # the same features, in the same order
        for was, now in zip(before, after):
            assert now == (f"-{was[1:]}" if was.startswith("+") and beyond_isa(was, level) else was)
        assert cap_features(capped, level) == capped
        newer = ISA_LEVELS[ISA_LEVELS.index(level):]  # a cap keeps no more than a newer one
        assert all(set(cap_features(features, level).split(",")) >= {f for f in cap_features(features, lv).split(",")
                                                                      if f.startswith("-")} for lv in newer)
    on = {f[1:] for f in cap_features(AVX512_HOST, level).split(",") if f.startswith("+")}
    expected = {"sse4.2": {"sse4.2", "bmi2"}, "avx": {"sse4.2", "avx", "f16c", "bmi2"},
                "avx2": {"sse4.2", "avx", "avx2", "fma", "f16c", "bmi2"},
                "avx512": {"sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512vl", "avx512bw", "avx512vnni",
                           "avxvnni", "evex512", "bmi2"}}[level]
    assert on == expected
    assert widest_vector(cap_features(AVX512_HOST, level)) == {"sse4.2": 128, "avx": 256, "avx2": 256,
                                                               "avx512": 512}[level]


def test_the_host_target_under_a_cap_is_llvms_answer_capped(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METADEF_MAX_ISA", "AVX2")
    target = host_target()
    assert target == jit.query_host().capped("avx2")
    assert not target.has("avx512f") and target.vector_bits <= 256
    assert toolchain()["cpu_features"] == target.features  # (compile-cache keys apart from the uncapped host's)
    assert json.loads(_record(fresh).read_text()) == asdict(jit.query_host())  # the record is the CPU's own


def test_an_unknown_isa_level_is_a_clear_error(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METADEF_MAX_ISA", "avx3")
    with pytest.raises(ValueError, match=r"METADEF_MAX_ISA='avx3'.*sse4\.2, avx, avx2, avx512"):
        host_target()
    with pytest.raises(ValueError, match="unknown ISA level 'neon'"):
        beyond_isa("avx2", "neon")


CAPPED_RUN = """
import re, numpy as np, metadef as md
from metadef.codegen.jit import _target_machine, _optimize
from metadef.codegen.native import native_module
from metadef.codegen.native_tile import tile_lanes
from metadef.ir import parse_graph
import llvmlite.binding as llvm
g = parse_graph('''graph g(%x: f32[n,3,9,9]) -> (%z) {
  %w: f32[8,3,3,3] = const
  %m: f32[392,40] = const
  %c: f32[n,8,7,7] = Conv(%x, %w) @conv
  %r: f32[n,8,7,7] = Relu(%c) @relu
  %f: f32[n,392] = Flatten(%r) {axis=1} @flat
  %s: f32[n,392] = Sigmoid(%f) @sig
  %z: f32[n,40] = MatMul(%s, %m) @mm
  return %z }''', constants={"w": np.random.default_rng(1).standard_normal((8, 3, 3, 3)).astype(np.float32),
                            "m": np.random.default_rng(2).standard_normal((392, 40)).astype(np.float32)})
x = np.random.default_rng(0).standard_normal((5, 3, 9, 9)).astype(np.float32)
got = md.compile(g, target="x86").run({"x": x})["z"]
want = md.compile(g, target="reference").run({"x": x})["z"]
m = llvm.parse_assembly(native_module("md_gemm"))
_optimize(m, unroll=False, vectorize=False, light=True)
asm = _target_machine().emit_assembly(m)
evex = re.findall("zmm|ymm(1[6-9]|2[0-9]|3[01])", asm)
print(tile_lanes(), float(np.abs(got - want).max() / np.abs(want).max()), len(evex))
"""


def test_code_generated_under_an_avx2_cap_uses_no_avx512_and_gives_the_same_answers(tmp_path: Path) -> None:
    env = {**os.environ, "METADEF_MAX_ISA": "avx2", "METADEF_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", CAPPED_RUN], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lanes, error, evex = done.stdout.split()
    assert (int(lanes), int(evex)) == (8, 0)  # 256-bit tiles; no zmm register, no ymm16-31 (EVEX-only)
    assert float(error) < 1e-5
