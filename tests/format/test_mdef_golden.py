"""The golden file pins the 1.0 byte layout: reading it, and re-encoding what was read, byte for byte.

If a change to the writer breaks these tests, the format changed: bump the version, add a
line to the history in docs/format.md and regenerate with ``tests/format/make_golden.py``.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from metadef.format import open_mdef, save_graph
from metadef.ir import print_graph
from tests.format.make_golden import GOLDEN_PATH, GOLDEN_TEXT, golden_graph, write_golden


def test_golden_file_reads_back() -> None:
    f = open_mdef(GOLDEN_PATH, checksum_verify="always")
    assert f.version == (1, 0) and f.verify().ok
    assert print_graph(f.graph()) == print_graph(golden_graph())
    assert [line.split("=")[0] for line in print_graph(f.graph()).splitlines()] == \
        [line.split("=")[0] for line in GOLDEN_TEXT.splitlines()]
    np.testing.assert_array_equal(f.tensor("w"), np.arange(12, dtype=np.float32).reshape(4, 3) / 8)


def test_golden_header_and_trailer_bytes() -> None:
    data = GOLDEN_PATH.read_bytes()
    assert data[:8] == b"MDEF\r\n\x1a\n" and data[-4:] == b"MDEF"
    assert struct.unpack_from("<HHBBHII", data, 8) == (1, 0, 1, 0, 64, 0, 8)
    assert struct.unpack_from("<QQ", data, 24) == (64, len(data))
    assert struct.unpack_from("<QQQ", data, len(data) - 40)[1:] == (64, len(data))


def test_writer_reproduces_the_golden_file(tmp_path: Path) -> None:
    assert write_golden(tmp_path / "g.mdef").read_bytes() == GOLDEN_PATH.read_bytes()


def test_reencoding_the_golden_file_gives_identical_bytes(tmp_path: Path) -> None:
    f = open_mdef(GOLDEN_PATH)
    code = {t: bytes(f.code(t)) for t in f.code_targets()}
    again = save_graph(f.graph(), tmp_path / "again.mdef", metadata=f.user_metadata(),
                       alignment=f.alignment, code=code)
    assert again.read_bytes() == GOLDEN_PATH.read_bytes()
