"""The host target: LLVM's answer, recorded once per host under the cache directory, and read
back without LLVM."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest

from metadef.codegen import host, jit
from metadef.codegen.host import HostTarget, host_fingerprint, host_target, toolchain

pytestmark = pytest.mark.jit


@pytest.fixture
def fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty cache directory and no remembered host target (restored afterwards)."""
    monkeypatch.setenv("METADEF_CACHE_DIR", str(tmp_path))
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
