"""Fuzz the .mdef reader: truncated, bit-flipped and overwritten files give typed errors only.

The normal suite runs a bounded number of cases; a longer run is one command:

    METADEF_FUZZ_EXAMPLES=20000 .venv/bin/pytest tests/format/test_mdef_fuzz.py -q

Every case must end in success (the damage landed in padding, or checksums were off and the
damage is in data) or in a ``FormatError`` subclass; never another exception, never a hang
(hypothesis' deadline) and never a large allocation (tracemalloc's peak).
"""

from __future__ import annotations

import os
import tempfile
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metadef.core.errors import FormatError
from metadef.format import open_mdef
from tests.format.make_golden import GOLDEN_CODE, GOLDEN_METADATA, golden_graph

EXAMPLES = int(os.environ.get("METADEF_FUZZ_EXAMPLES", "200"))
ALLOCATION_LIMIT = 32 * 2**20  # bytes; the file is 2.5 KB

_dir = tempfile.TemporaryDirectory(prefix="mdef-fuzz-")
_valid = None


def _valid_bytes() -> bytes:
    global _valid
    if _valid is None:
        from metadef.format import save_graph
        path = save_graph(golden_graph(), Path(_dir.name) / "valid.mdef", metadata=GOLDEN_METADATA,
                          code=GOLDEN_CODE)
        _valid = path.read_bytes()
    return _valid


_SIZE = 2544  # roughly the golden file's size; offsets are taken modulo the real size

_truncate = st.tuples(st.just("truncate"), st.integers(0, _SIZE))
_flips = st.tuples(st.just("flip"), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 7)),
                                              min_size=1, max_size=8))
_overwrite = st.tuples(st.just("overwrite"), st.tuples(st.integers(0, 10**6), st.binary(min_size=1, max_size=64)))
_mutations = st.lists(st.one_of(_truncate, _flips, _overwrite), min_size=1, max_size=3)


def _mutate(data: bytes, mutations: list) -> bytes:
    buf = bytearray(data)
    for kind, arg in mutations:
        if not buf:
            break
        if kind == "truncate":
            del buf[arg % (len(buf) + 1):]
        elif kind == "flip":
            for offset, bit in arg:
                buf[offset % len(buf)] ^= 1 << bit
        else:
            offset, blob = arg
            start = offset % len(buf)
            buf[start:start + len(blob)] = blob[:len(buf) - start]
    return bytes(buf)


def _read_everything(path: Path, mode: str) -> None:
    f = open_mdef(path, checksum_verify=mode)
    for name in f.tensor_names():
        f.tensor(name).sum()
    graph = f.graph()
    for v in graph.constants:
        _ = v.const
    str(graph)
    for target in f.code_targets():
        f.code(target)
    f.verify()


@pytest.mark.parametrize("mode", ["always", "never"])
@settings(max_examples=EXAMPLES, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(mutations=_mutations)
def test_damaged_files_raise_format_errors_only(mode: str, mutations: list) -> None:
    data = _mutate(_valid_bytes(), mutations)
    path = Path(_dir.name) / f"case-{mode}.mdef"
    path.write_bytes(data)
    tracemalloc.start()
    try:
        _read_everything(path, mode)
    except FormatError:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < ALLOCATION_LIMIT, f"reading a {len(data)}-byte file allocated {peak} bytes"


def test_fuzz_base_file_is_valid() -> None:
    path = Path(_dir.name) / "base.mdef"
    path.write_bytes(_valid_bytes())
    _read_everything(path, "always")
