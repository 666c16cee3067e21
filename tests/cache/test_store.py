"""The on-disk store and the keys: atomic entries, damage detection, eviction, miss reasons."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from metadef.cache import Store, kernel_key, model_key, shape_key
from metadef.cache.store import decode_entry
from metadef.cli_cache import cache_group
from metadef.codegen.host import record_folder

ENV = {"metadef": "0.1.0", "llvm": "22.1.0", "triple": "x86_64-unknown-linux-gnu",
       "cpu_features": "+avx2,+fma,-avx512f,-avx512bw", "pipeline": "O3"}


def _put(store: Store, structure: str, size: int = 100, env: dict[str, str] = ENV) -> Path:
    key = kernel_key(structure, env)
    store.put(key, {"symbol": structure}, {"object": bytes(size)})
    return store.path(key)


def test_round_trip_and_levels(cache_dir: Path) -> None:
    store = Store()
    k = kernel_key("Relu", ENV)
    s = shape_key(k, {"batch": 1, "seq": 128})
    m = model_key("graph-hash", "x86", {"threads": None}, ENV)
    for key in (k, s, m):
        assert store.get(key) is None
        store.put(key, {"level": key.level}, {"object": key.digest.encode()})
    for key in (k, s, m):
        entry = store.get(key)
        assert entry is not None and entry.blobs["object"] == key.digest.encode()
    assert s.digest != shape_key(k, {"batch": 1, "seq": 64}).digest
    info = store.info()
    assert {lv: info["levels"][lv]["entries"] for lv in ("model", "kernel", "shape")} == \
        {"model": 1, "kernel": 1, "shape": 1}
    assert str(store.root).startswith(str(cache_dir))


@pytest.mark.parametrize("damage", ["truncate", "bitflip", "empty"])
def test_damaged_entry_is_detected_deleted_and_rebuilt(damage: str, caplog: pytest.LogCaptureFixture) -> None:
    store = Store()
    path = _put(store, "Exp", 4096)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "bitflip":
        data[-100] ^= 0x10
    else:
        data = bytearray()
    path.write_bytes(bytes(data))
    key = kernel_key("Exp", ENV)
    with caplog.at_level(logging.WARNING, "metadef.cache"):
        assert store.get(key) is None
    assert "damaged" in caplog.text and not path.exists()
    store.put(key, {"symbol": "Exp"}, {"object": bytes(4096)})  # the rebuild
    assert store.get(key) is not None
    assert store.stats()["kernel.corrupt"] == 1


def test_eviction_keeps_the_cache_under_its_cap() -> None:
    store = Store(max_bytes=5000)
    paths = []
    for i in range(10):
        paths.append(_put(store, f"k{i}", 1000))
        os.utime(paths[-1], ns=(i * 10**9, i * 10**9))  # a strict LRU order
    assert store.info()["bytes"] <= 5000
    assert paths[-1].exists() and not paths[0].exists()
    # a hit refreshes an entry: it outlives newer ones
    survivor = next(p for p in paths if p.exists())
    assert store.get(kernel_key(f"k{paths.index(survivor)}", ENV)) is not None
    oldest_other = next(p for p in paths if p.exists() and p != survivor)
    _put(store, "k10", 1000)
    assert survivor.exists() and not oldest_other.exists() and store.info()["bytes"] <= 5000


def test_miss_names_the_differing_key_part(monkeypatch: pytest.MonkeyPatch,
                                            caplog: pytest.LogCaptureFixture) -> None:
    store = Store()
    _put(store, "Relu")
    store.put(model_key("g", "x86", {"threads": 1}, ENV), {}, {})
    monkeypatch.setenv("METADEF_DEBUG", "1")
    other = {**ENV, "cpu_features": "+avx2,+fma,+avx512f,-avx512bw"}
    with caplog.at_level(logging.INFO, "metadef.cache"):
        assert store.get(kernel_key("Relu", other)) is None
        assert store.get(model_key("g", "x86", {"threads": 2}, ENV)) is None
        assert store.get(model_key("g", "arm", {"threads": 1}, ENV)) is None
    lines = [r.getMessage() for r in caplog.records]
    assert any("miss kernel" in line and "cpu_features differ (+avx512f vs -avx512f)" in line for line in lines)
    assert any('options differ ({"threads":2} vs {"threads":1})' in line for line in lines)
    assert any("target differs (arm vs x86)" in line for line in lines)


def test_entry_header_checks_the_stored_key() -> None:
    store = Store()
    a = _put(store, "A")
    b = store.path(kernel_key("B", ENV))
    b.write_bytes(a.read_bytes())  # a valid entry under the wrong name
    assert decode_entry(b.read_bytes()).manifest["symbol"] == "A"
    assert store.get(kernel_key("B", ENV)) is None and not b.exists()


def test_stats_persist_and_cli_info_clear() -> None:
    store = Store()
    _put(store, "Relu")
    store.get(kernel_key("Relu", ENV))
    store.get(kernel_key("Missing", ENV))
    store.flush_stats()
    assert Store().stats()["kernel.hits"] == 1
    runner = CliRunner()
    out = runner.invoke(cache_group, ["info"])
    assert out.exit_code == 0 and "kernel" in out.output
    row = next(line for line in out.output.splitlines() if line.startswith("kernel"))
    assert row.split()[1:2] == ["1"]
    records = record_folder()
    records.mkdir(parents=True, exist_ok=True)
    (records / "0123456789abcdef.json").write_text("{}")  # a host record: cleared too
    out = runner.invoke(cache_group, ["clear"])
    assert out.exit_code == 0 and "removed 1 entries" in out.output
    assert Store().info()["levels"]["kernel"]["entries"] == 0
    assert not list(records.glob("*.json"))
