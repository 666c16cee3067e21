"""The .mdef writer and reader: round trips, zero-copy views, checksums, versions, typed errors."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest

from metadef.core.errors import FormatError
from metadef.format import (
    BadMagicError,
    ChecksumError,
    CompatError,
    CorruptFileError,
    Feature,
    NotAnMdefFileError,
    TruncatedFileError,
    UnknownSectionError,
    VersionError,
    extra_feature,
    layout,
    open_mdef,
    save_graph,
    write_compat,
    writer,
)
from metadef.ir import parse_graph, print_graph
from tests.format.make_golden import GOLDEN_CODE, GOLDEN_METADATA, golden_graph
from tests.format.mdef_helpers import set_version


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    return save_graph(golden_graph(), tmp_path / "g.mdef", metadata=GOLDEN_METADATA, code=GOLDEN_CODE)


def test_round_trip_graph_text_symbols_and_tensors(saved: Path) -> None:
    g = golden_graph()
    f = open_mdef(saved, checksum_verify="always")
    loaded = f.graph()
    assert print_graph(loaded) == print_graph(g)
    assert loaded.env.symbols == g.env.symbols
    assert loaded.metadata == g.metadata and loaded.opset == g.opset
    for a, b in zip(g.constants, loaded.constants):
        assert a.const.dtype == b.const.dtype and a.const.shape == b.const.shape
        np.testing.assert_array_equal(a.const, b.const)
    assert loaded.node("/act").meta == {"no_fuse": True}


def test_tensors_are_read_only_zero_copy_views_of_the_mapping(saved: Path) -> None:
    f = open_mdef(saved)
    assert f.mmapped
    w = f.tensor("w")
    mapped = np.frombuffer(f._buf, np.uint8)
    assert np.shares_memory(w, mapped) and np.shares_memory(f.graph().value("w").const, mapped)
    assert not w.flags.writeable
    assert f.tensor_info("w").offset % 64 == 0
    with pytest.raises(ValueError):
        w[0, 0] = 1.0


def test_alignment_4096_and_execution_order(tmp_path: Path) -> None:
    f = open_mdef(save_graph(golden_graph(), tmp_path / "a.mdef", alignment=4096))
    offsets = [f.tensor_info(n).offset for n in f.tensor_names()]
    assert all(o % 4096 == 0 for o in offsets) and offsets == sorted(offsets)
    assert f.tensor_names() == ["w", "b", "k"]  # MatMul reads w, Cast reads b, k is unused
    with pytest.raises(FormatError, match="power of two"):
        save_graph(golden_graph(), tmp_path / "b.mdef", alignment=100)


def test_metadata_layers_and_code_sections(saved: Path, tmp_path: Path) -> None:
    f = open_mdef(saved)
    assert f.layers["hardware"]["cpu_features"] == ["avx2"]
    assert f.layers["summary"]["inputs"][0]["shape"] == ["batch", "seq*2", "4"]
    assert f.layers["summary"]["symbols"]["seq"] == {"lo": 1, "hi": 256, "multiple_of": 1}
    assert f.layers["auxiliary"]["namespaces"] == {"tests/v1": {"answer": 42}}
    assert f.user_metadata()["namespaces"] == GOLDEN_METADATA["namespaces"]
    assert f.code_targets() == ["x86-64-avx2"] and bytes(f.code("x86-64-avx2")) == bytes(range(16))
    assert f.code("arm64") is None
    with pytest.raises(FormatError, match="unknown metadata key 'hardwear'"):
        save_graph(golden_graph(), tmp_path / "m.mdef", metadata={"hardwear": {}})


def test_private_buffer_fallback_logs_mmap_failed(saved: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="metadef.format"):
        f = open_mdef(saved, mmap_enabled=False)
    assert not f.mmapped
    assert "MMAP_FAILED" in caplog.text and "permissions -rw" in caplog.text and "size" in caplog.text
    np.testing.assert_array_equal(f.tensor("w"), golden_graph().value("w").const)
    assert not f.tensor("w").flags.writeable


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


def test_bit_flip_in_a_tensor(saved: Path) -> None:
    offset = open_mdef(saved).tensor_info("w").offset + 5
    _flip(saved, offset)
    with pytest.raises(ChecksumError, match=r"tensor 'w' at offset \d+"):
        open_mdef(saved, checksum_verify="always")
    lazy = open_mdef(saved)  # on_demand: opens, fails when w is first used
    with pytest.raises(ChecksumError, match="tensor 'w'"):
        _ = lazy.graph().value("w").const
    assert lazy.tensor("b").shape == (3,)
    assert open_mdef(saved, checksum_verify="never").tensor("w").shape == (4, 3)
    report = lazy.verify()
    assert not report.ok and "tensor 'w'" in str(report)


def test_bit_flip_in_the_graph_section(saved: Path) -> None:
    f = open_mdef(saved)
    graph_entry = next(e for e in f.sections if e.name == "graph")
    _flip(saved, graph_entry.offset + 20)
    with pytest.raises(ChecksumError, match=f"section 'graph' .* at offset {graph_entry.offset}"):
        open_mdef(saved)


def test_truncated_file(saved: Path) -> None:
    data = saved.read_bytes()
    saved.write_bytes(data[:len(data) // 2])
    with pytest.raises(TruncatedFileError, match="cut off"):
        open_mdef(saved)
    saved.write_bytes(data[:70])
    with pytest.raises(TruncatedFileError):
        open_mdef(saved)


def test_wrong_magic_and_not_an_mdef_file(saved: Path, tmp_path: Path) -> None:
    data = saved.read_bytes()
    saved.write_bytes(b"MDEX" + data[4:])
    with pytest.raises(BadMagicError, match="offset 0"):
        open_mdef(saved)
    saved.write_bytes(data[:4] + b"\n\n\x1a\n" + data[8:])
    with pytest.raises(BadMagicError, match="text-mode"):
        open_mdef(saved)
    onnx_file = tmp_path / "model.onnx"
    onnx_file.write_bytes(b"\x08\x07\x12\x07pytorch" + bytes(100))
    with pytest.raises(NotAnMdefFileError, match="ONNX"):
        open_mdef(onnx_file)
    (tmp_path / "empty.mdef").write_bytes(b"")
    with pytest.raises(NotAnMdefFileError):
        open_mdef(tmp_path / "empty.mdef")


def test_versions(saved: Path) -> None:
    set_version(saved, 2, 0)
    with pytest.raises(VersionError, match=r"version 2\.0; this reader reads 1\.0 to 1\.0"):
        open_mdef(saved, version_strict=False)
    set_version(saved, 1, 3)
    with pytest.raises(VersionError, match=r"1\.3, newer than this reader \(1\.0\)"):
        open_mdef(saved)
    with pytest.warns(UserWarning, match="reading the parts this reader knows"):
        f = open_mdef(saved, version_strict=False)
    assert f.version == (1, 3) and f.tensor("w").shape == (4, 3)


def _with_extra_section(monkeypatch: pytest.MonkeyPatch, flags: int) -> None:
    original = writer._small_sections

    def more(*args, **kwargs):
        return [*original(*args, **kwargs), (99, flags, "future-thing", b"hello")]

    monkeypatch.setattr(writer, "_small_sections", more)


def test_unknown_sections(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _with_extra_section(monkeypatch, 0)
    skipped = open_mdef(save_graph(golden_graph(), tmp_path / "opt.mdef"), checksum_verify="always")
    assert [e.name for e in skipped.sections if e.type_id == 99] == []
    _with_extra_section(monkeypatch, layout.REQUIRED)
    with pytest.raises(UnknownSectionError, match=r"'future-thing' \(type 99\)"):
        open_mdef(save_graph(golden_graph(), tmp_path / "req.mdef"))


def test_compat_fails_feature_by_feature(tmp_path: Path) -> None:
    g = golden_graph()
    assert write_compat(g, tmp_path / "ok.mdef", version=(1, 0)).exists()
    future = Feature("fake_future_thing", (1, 1), lambda graph, options: True, "a feature of 1.1")
    with extra_feature(future), pytest.raises(CompatError) as info:
        write_compat(g, tmp_path / "old.mdef", version=(1, 0))
    assert "fake_future_thing (needs 1.1)" in str(info.value)
    assert not (tmp_path / "old.mdef").exists()


def test_failed_write_leaves_no_file(tmp_path: Path) -> None:
    g = parse_graph("graph g(%x: f32[2]) -> (%y) { %y: f32[2] = LeakyRelu(%x) {alpha=0.5} return %y }")
    target = tmp_path / "g.mdef"
    target.write_bytes(b"previous contents")
    g.nodes[0].attrs["alpha"] = object()  # no format can hold this: fails mid-write
    with pytest.raises(CompatError, match="attribute 'alpha'"):
        save_graph(g, target)
    assert target.read_bytes() == b"previous contents"
    assert os.listdir(tmp_path) == ["g.mdef"]


def test_attribute_kinds_round_trip(tmp_path: Path) -> None:
    g = parse_graph("graph g(%x: f32[2]) -> (%y) { %y: f32[2] = Relu(%x) @r return %y }")
    attrs = {"t": (1, (2, 3)), "l": [1.5, float("nan")], "inf": float("-inf"), "s": "é",
             "a": np.arange(6, dtype=np.float16).reshape(2, 3), "n": np.float32(2.5), "by": b"\x00\x01",
             "d": {"k": (1,)}, "flag": True}
    g.nodes[0].attrs.update(attrs)
    back = open_mdef(save_graph(g, tmp_path / "a.mdef")).graph().nodes[0].attrs
    assert back["t"] == (1, (2, 3)) and back["l"][0] == 1.5 and np.isnan(back["l"][1])
    assert back["inf"] == float("-inf") and back["s"] == "é" and back["by"] == b"\x00\x01"
    assert back["a"].dtype == np.float16 and back["a"].tolist() == attrs["a"].tolist()
    assert back["n"] == np.float32(2.5) and back["n"].dtype == np.float32
    assert back["d"] == {"k": (1,)} and back["flag"] is True


def test_bytes_appended_or_bad_offsets_are_corrupt_files(saved: Path) -> None:
    data = saved.read_bytes()
    saved.write_bytes(data + b"extra")
    with pytest.raises(CorruptFileError, match="5 unexpected bytes"):
        open_mdef(saved)
    table = bytearray(data)
    table[64 + 8:64 + 16] = (10**12).to_bytes(8, "little")  # the first section's offset, far outside
    saved.write_bytes(bytes(table))
    with pytest.raises(CorruptFileError, match=r"section 'hardware' .* outside"):
        open_mdef(saved, checksum_verify="never")
