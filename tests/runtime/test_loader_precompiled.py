"""Precompiled code in .mdef files: ``save(precompile=["x86"])`` ships the compile cache's
entries; ``load`` uses them only when they are intact, built for this CPU and compiler, and
trusted (built on this machine, or hash pinned); otherwise the model compiles as usual."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import metadef as md
from metadef.cache import Store, environment
from metadef.cache.bundle import pack_bundle, unpack_bundle
from metadef.core.errors import BackendError
from metadef.format import open_mdef, save_graph
from metadef.ir import parse_graph
from metadef.runtime.loader_config import LoaderConfig, LoaderConfigError
from metadef.runtime.precompiled import machine_key, seed_compile_cache

pytestmark = pytest.mark.jit

GRAPH = """graph g(%x: f32[n,8], %y: f32[n,8]) -> (%z) {
  %a: f32[n,8] = Exp(%x) @exp
  %b: f32[n,8] = Mul(%a, %y) @mul
  %z: f32[n,8] = Tanh(%b) @tanh
  return %z }"""

# A fresh process: load the file, compile for x86, run; how many modules LLVM generated.
CHILD = """
import json, sys, numpy as np, metadef as md
from metadef.codegen.jit import generated_count
config = json.loads(sys.argv[2])
session = md.load(sys.argv[1], config=config).compile(target="x86")
at_compile = generated_count()
x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
out = session.run({"x": x, "y": x})["z"]
print(json.dumps({"compile": at_compile, "total": generated_count(),
                  "ok": bool(np.allclose(out, np.tanh(np.exp(x) * x), rtol=1e-5))}))
"""


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("precompiled")


@pytest.fixture(autouse=True)
def this_machine(home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "this-machine"))  # where the machine key lives
    yield


@pytest.fixture(scope="module")
def saved(home: Path) -> Path:
    old = os.environ.get("XDG_CONFIG_HOME")
    os.environ["XDG_CONFIG_HOME"] = str(home / "this-machine")
    try:
        return md.save(parse_graph(GRAPH), home / "g.mdef", precompile=["x86"])
    finally:
        if old is None:
            del os.environ["XDG_CONFIG_HOME"]
        else:
            os.environ["XDG_CONFIG_HOME"] = old


def _fresh_process(path: Path, home: Path, machine: str, config: dict | None = None) -> dict:
    cache = home / f"cache-{machine}-{len(list(home.iterdir()))}"
    env = {**os.environ, "METADEF_CACHE_DIR": str(cache), "XDG_CONFIG_HOME": str(home / machine)}
    done = subprocess.run([sys.executable, "-c", CHILD, str(path), json.dumps(config or {})], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_precompiled_code_compiles_and_runs_with_no_llvm_in_a_fresh_process(saved: Path, home: Path) -> None:
    with open_mdef(saved) as f:
        assert f.code_targets() == ["x86"]
        manifest = unpack_bundle(f.code("x86")).manifest
    assert manifest["environment"] == environment() and manifest["target"] == "x86"
    assert {level for level, *_ in manifest["entries"]} == {"model", "kernel"}
    got = _fresh_process(saved, home, "this-machine")  # an empty METADEF_CACHE_DIR
    assert got == {"compile": 0, "total": 0, "ok": True}


def test_code_from_another_machine_is_ignored_unless_its_hash_is_pinned(saved: Path, home: Path) -> None:
    got = _fresh_process(saved, home, "another-machine")
    assert got["ok"] and got["compile"] > 0  # compiled as usual
    with open_mdef(saved) as f:
        pin = f.code_hash("x86")
    got = _fresh_process(saved, home, "another-machine", {"safety": {"trusted_code_hashes": [pin]}})
    assert got == {"compile": 0, "total": 0, "ok": True}


def _code_end(path: Path) -> int:
    with open_mdef(path) as f:
        return next(e for e in f.sections if e.name == "code:x86").end


def test_a_tampered_code_section_is_refused(saved: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bad = tmp_path / "tampered.mdef"
    data = bytearray(saved.read_bytes())
    data[_code_end(saved) - 50] ^= 0x01  # in an entry's object code
    bad.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, "metadef.runtime"), open_mdef(bad) as f:
        outcome = seed_compile_cache(f, store=Store(tmp_path / "cache"))
    assert outcome["x86"].startswith("refused:") and "checksum mismatch" in outcome["x86"]
    assert "code section 'code:x86' refused" in caplog.text
    with open_mdef(bad, checksum_verify="never") as f:  # no checksum: the MAC still does not match
        assert seed_compile_cache(f, store=Store(tmp_path / "cache"))["x86"] == "ignored: not trusted"
    assert not list((tmp_path / "cache").rglob("*.mdc"))
    session = md.load(bad).compile(target="x86")  # the model itself is intact: it compiles and runs
    x = np.ones((1, 8), np.float32)
    np.testing.assert_allclose(session.run({"x": x, "y": x})["z"], np.tanh(np.exp(x) * x), rtol=1e-5)


def test_code_built_for_another_cpu_is_ignored_and_says_why(saved: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    with open_mdef(saved) as f:
        bundle = unpack_bundle(f.code("x86"))
    entries = [(level, digest, bytes(data)) for level, digest, data in bundle.entries()]
    foreign = {**bundle.manifest, "environment": {**environment(), "cpu_features": "+avx512f,+made-up"}}
    del foreign["entries"]
    path = save_graph(parse_graph(GRAPH), tmp_path / "foreign.mdef",
                      code={"x86": pack_bundle(entries, foreign, machine_key())})
    monkeypatch.setenv("METADEF_DEBUG", "1")
    with caplog.at_level(logging.INFO, "metadef.runtime"), open_mdef(path) as f:
        outcome = seed_compile_cache(f, store=Store(tmp_path / "cache"))
    assert outcome["x86"].startswith("ignored: built elsewhere (cpu_features differ")
    assert "built for another machine or compiler (cpu_features differ" in caplog.text


def test_seeding_installs_once_and_checks_each_entry(saved: Path, tmp_path: Path) -> None:
    store = Store(tmp_path / "cache")
    with open_mdef(saved) as f:
        assert seed_compile_cache(f, store=store)["x86"] == "installed: built on this machine"
        assert seed_compile_cache(f, store=store)["x86"] == "cached already"
        count = len(unpack_bundle(f.code("x86")).manifest["entries"])
    assert len(list(store.entries())) == count


def test_precompile_takes_only_targets_with_a_compile_cache(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="target 'reference' has no compile cache to ship"):
        md.save(parse_graph(GRAPH), tmp_path / "r.mdef", precompile=["reference"])
    assert not list(tmp_path.iterdir())  # nothing left behind


def test_trusted_code_hashes_are_checked() -> None:
    pin = "blake2b-256:" + "ab" * 32
    assert LoaderConfig.from_dict({"safety": {"trusted_code_hashes": [pin]}}).trusted_code_hashes == (pin,)
    with pytest.raises(LoaderConfigError, match="trusted_code_hashes must be a list of"):
        LoaderConfig.from_dict({"safety": {"trusted_code_hashes": ["xxh3:1234"]}})
