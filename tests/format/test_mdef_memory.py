"""Mapped weights leave the process's RSS once they are checked or copied: the pages of a
read-only mapping are unmapped (``MADV_DONTNEED``) and read back, unchanged, on their next
use. Residency is read from ``/proc/self/smaps`` (the pages of this mapping, in this process)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

import metadef as md
from metadef.format import open_mdef, release_mapped
from metadef.format.storage import PAGE, FileBytes
from metadef.ir import GraphBuilder
from metadef.shape import parse_type

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
RNG = np.random.default_rng(3)


def _resident(address: int) -> int:
    """The bytes of the mapping holding ``address`` that this process has resident."""
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "Rss:":
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no mapping holds {address:#x}")


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def test_forget_unmaps_a_range_and_a_read_maps_it_again(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    data = RNG.integers(0, 255, 8 << 20, dtype=np.uint8)
    path.write_bytes(data.tobytes())
    mapped = FileBytes.open(path)
    view = np.frombuffer(mapped.buf, np.uint8)
    assert int(view[::PAGE].sum()) >= 0  # touch every page
    assert _resident(_address(view)) >= 8 << 20
    assert mapped.forget(100, (4 << 20) - 100) == (4 << 20) - PAGE  # the whole pages inside only
    assert _resident(_address(view)) <= (4 << 20) + 2 * PAGE
    np.testing.assert_array_equal(view, data)  # read back from the file, unchanged
    assert release_mapped(view[1 << 20:3 << 20]) == 2 << 20
    assert release_mapped(data) == 0  # not a mapping of a file
    mapped.close()


def _weighted(k: int, n: int) -> md.Graph:
    g = GraphBuilder("big")
    y, = g.node("MatMul", [g.input("x", parse_type(f"f32[b,{k}]")),
                           g.const("w", RNG.standard_normal((k, n), dtype=np.float32))])
    y, = g.node("Add", [y, g.const("bias", RNG.standard_normal(n, dtype=np.float32))])
    g.output(y)
    return g.build()


def test_a_checked_weight_leaves_the_rss_until_it_is_used(tmp_path: Path) -> None:
    path = md.save(_weighted(512, 1024), tmp_path / "m.mdef")  # a 2 MiB weight
    f = open_mdef(path)
    weight = f.graph().constants[0].const if f.graph().constants[0].name == "w" else f.graph().constants[1].const
    assert weight.nbytes == 2 << 20
    assert _resident(_address(weight)) < 1 << 20  # checked on first use, then let go
    assert math.isfinite(float(weight.sum()))  # a use maps it again
    assert _resident(_address(weight)) >= 2 << 20
    f.close()


def test_weights_packed_for_our_gemm_leave_the_rss(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from metadef.backends.x86 import gemm
    monkeypatch.setattr(gemm, "PREFER", gemm.OWN)
    graph = _weighted(512, 1024)
    path = md.save(graph, tmp_path / "m.mdef")
    model = md.load(path).optimize_for(level="aggressive")
    weight = next(v.const for v in model.graph.constants if v.name == "w")
    session = model.compile(target="x86", cache=False)
    x = RNG.standard_normal((8, 512), dtype=np.float32)
    got = session.run({"x": x})
    want = md.compile(graph, target="reference").run({"x": x})
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4)
    kinds = session.executable.programs.bound({"b": 8}).call_kinds
    assert any(k.startswith("gemm own kernel") for k in kinds), kinds
    assert _resident(_address(weight)) < 1 << 20  # our kernel reads its packed copy only
