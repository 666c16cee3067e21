"""The DynamicLoader: need order, batches under the budget, background prefetch and checks,
errors surfacing typed on the caller's next use, clean shutdown, and ``metadef.load`` wiring."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

import metadef as md
from metadef.format import (
    ChecksumError,
    ClosedFileError,
    DynamicLoader,
    LoaderError,
    TruncatedFileError,
    need_order,
    open_mdef,
    save_graph,
)
from metadef.format.loader import plan_batches
from metadef.ir import Graph, GraphBuilder, parse_graph
from metadef.shape import parse_type

N = 8           # layers
SIZE = 4096     # bytes per weight (1024 float32)


def _chain() -> Graph:
    """x -> Add(w0) -> Add(w1) -> ... -> Add(w7): one weight per layer, used in order."""
    b = GraphBuilder("chain")
    h = b.input("x", parse_type("f32[1024]"))
    for k in range(N):
        w = b.const(f"w{k}", np.full(1024, k, np.float32))
        h, = b.node("Add", [h, w], name=f"add{k}")
    b.output(h)
    return b.build()


@pytest.fixture
def chain_file(tmp_path: Path) -> Path:
    return save_graph(_chain(), tmp_path / "chain.mdef")


def _loader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("metadef-loader")]


def test_need_order_follows_execution_and_puts_the_critical_path_first() -> None:
    g = parse_graph("""graph g(%x: f32[2]) -> (%y, %z) {
      %u: f32[2] = const [0.0, 0.0]
      %s: f32[2] = const [1.0, 1.0]
      %l: f32[2] = const [2.0, 2.0]
      %m: f32[2] = const [3.0, 3.0]
      %z: f32[2] = Add(%x, %s)
      %a: f32[2] = Mul(%x, %l)
      %b: f32[2] = Sub(%a, %m)
      %y: f32[2] = Relu(%b)
      return %y, %z
    }""")
    # Add and Mul are ready together; Mul heads the longer path (Mul -> Sub -> Relu)
    assert need_order(g) == ["l", "m", "s", "u"]
    assert need_order(_chain()) == [f"w{k}" for k in range(N)]


def test_batches_hold_half_the_budget_and_big_tensors_alone() -> None:
    assert plan_batches([SIZE] * N, budget=4 * SIZE) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert plan_batches([10, 100, 10], budget=40) == [[0], [1], [2]]
    assert plan_batches([], budget=40) == []


@pytest.mark.parametrize("mmap_enabled", [True, False])
@pytest.mark.parametrize("mode", ["on_demand", "always", "never"])
@pytest.mark.parametrize("threads", [1, 2])
def test_every_tensor_reads_back_through_the_loader(chain_file: Path, mode: str, mmap_enabled: bool,
                                                    threads: int) -> None:
    f = open_mdef(chain_file, checksum_verify=mode, mmap_enabled=mmap_enabled, threads=threads)
    with DynamicLoader(f, f.graph(), budget=4 * SIZE, threads=threads, verify_ahead=threads > 1) as loader:
        for k, v in enumerate(f.graph().constants):
            np.testing.assert_array_equal(v.const, np.full(1024, k, np.float32))
        assert loader.wait_idle(30)
        assert loader.stats.errors == 0
        assert loader.stats.jobs_background + loader.stats.jobs_by_caller == N - 2  # all but batch 0
    f.close()


def test_using_batch_k_prepares_batch_k_plus_1_and_no_further(chain_file: Path) -> None:
    f = open_mdef(chain_file)
    loader = DynamicLoader(f, f.graph(), budget=4 * SIZE, threads=2, verify_ahead=True)
    assert loader.batches == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert not f._verified  # opening reads nothing ahead
    f.tensor("w0")
    assert loader.wait_idle(30)
    assert f._verified == {0, 2, 3}  # w0 at its use; batch 0 in use, so batch 1 is read ahead
    f.tensor("w2")
    assert loader.wait_idle(30)
    assert f._verified == {0, 2, 3, 4, 5}  # batch 1 in use: batch 2 ahead, never more than 4 * SIZE bytes
    loader.start()  # batch 0 too, as if before any use
    assert loader.wait_idle(30) and f._verified == {0, 1, 2, 3, 4, 5}
    f.close()


def test_without_verify_ahead_the_loader_brings_pages_in_and_checks_stay_at_first_use(chain_file: Path) -> None:
    f = open_mdef(chain_file)
    loader = DynamicLoader(f, f.graph(), budget=4 * SIZE, threads=2)
    f.tensor("w0")
    assert loader.wait_idle(30)
    assert f._verified == {0}
    assert sum(loader.stats.methods.values()) == 2  # batch 1
    assert set(loader.stats.methods) <= {"populate", "willneed", "touch"}
    f.close()


def test_the_graph_reorders_what_is_not_started_yet(tmp_path: Path) -> None:
    g = parse_graph("""graph g(%x: f32[2]) -> (%y, %z) {
      %s: f32[2] = const [1.0, 1.0]
      %l: f32[2] = const [2.0, 2.0]
      %z: f32[2] = Add(%x, %s)
      %a: f32[2] = Mul(%x, %l)
      %y: f32[2] = Relu(%a)
      return %y, %z
    }""")
    f = open_mdef(save_graph(g, tmp_path / "g.mdef"))
    loader = DynamicLoader(f)  # no graph yet: the file's order
    assert loader.order == ["s", "l"]
    f.graph()  # decoding the graph hands it to the loader
    assert loader.order == ["l", "s"]
    f.close()


def test_private_buffers_hold_only_what_was_read(chain_file: Path) -> None:
    f = open_mdef(chain_file, mmap_enabled=False)
    DynamicLoader(f, f.graph(), budget=4 * SIZE, threads=1)
    f.tensor("w0")
    assert f.loader is not None and f.loader.wait_idle(30)
    data_reads = {key for key in f._data._loaded if key[1] == SIZE}
    assert data_reads == {(f.tensor_info(f"w{k}").offset, SIZE) for k in (0, 2, 3)}  # w0 and batch 1
    f.close()


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x04
    path.write_bytes(bytes(data))


def test_a_background_checksum_error_surfaces_on_the_next_use(chain_file: Path) -> None:
    _flip(chain_file, open_mdef(chain_file).tensor_info("w3").offset + 9)
    f = open_mdef(chain_file)
    loader = DynamicLoader(f, f.graph(), budget=4 * SIZE, threads=1, verify_ahead=True)
    f.tensor("w0")  # batch 0 in use; batch 1 (w2, w3) is checked in the background
    assert loader.wait_idle(30) and loader.stats.errors == 1
    with pytest.raises(ChecksumError, match=r"tensor 'w3' at offset \d+"):
        f.tensor("w1")  # the next use, whichever tensor it is
    np.testing.assert_array_equal(f.tensor("w1"), np.full(1024, 1, np.float32))  # raised once
    with pytest.raises(ChecksumError, match="tensor 'w3'"):
        f.tensor("w3")  # and again where the damage is
    np.testing.assert_array_equal(f.tensor("w4"), np.full(1024, 4, np.float32))
    f.close()


def test_a_failure_that_is_not_the_files_is_a_loader_error(chain_file: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    f = open_mdef(chain_file, mmap_enabled=False)  # (read tensor by tensor: one fails)
    loader = DynamicLoader(f, f.graph(), budget=4 * SIZE, threads=1)
    prepare = f._prepare

    def flaky(i: int, verify: bool = False) -> str:
        if i == 2:
            raise OSError(5, "Input/output error")
        return prepare(i, verify)

    monkeypatch.setattr(f, "_prepare", flaky)
    f.tensor("w0")
    assert loader.wait_idle(30)
    with pytest.raises(LoaderError, match=r"tensor 'w2' \(OSError: \[Errno 5\] Input/output error\)"):
        f.tensor("w1")
    np.testing.assert_array_equal(f.tensor("w2"), np.full(1024, 2, np.float32))  # read again, fine
    f.close()


def test_a_file_cut_short_after_open_is_a_typed_error(chain_file: Path) -> None:
    f = open_mdef(chain_file, mmap_enabled=False)
    DynamicLoader(f, f.graph(), budget=4 * SIZE, threads=1)
    os.truncate(chain_file, f.tensor_info("w1").offset)
    with pytest.raises(TruncatedFileError, match="became shorter after it was opened"):
        for k in range(N):
            f.tensor(f"w{k}")
    f.close()


def test_closing_stops_the_threads_and_later_uses_are_typed_errors(chain_file: Path) -> None:
    before = len(_loader_threads())
    f = open_mdef(chain_file)
    loader = DynamicLoader(f, f.graph(), budget=4 * SIZE, threads=2)
    w0 = f.tensor("w0")
    assert len(_loader_threads()) > before
    f.close()
    assert loader.closed and f.loader is None and len(_loader_threads()) == before
    np.testing.assert_array_equal(w0, np.zeros(1024, np.float32))  # views handed out stay valid
    with pytest.raises(ClosedFileError, match=r"is closed: tensor 'w5' cannot be read"):
        f.tensor("w5")


def test_load_wires_the_config_keys(tmp_path: Path) -> None:
    path = save_graph(_chain(), tmp_path / "chain.mdef")
    with md.load(path, config={"memory": {"prefetch_buffer": 4 * SIZE},
                               "execution": {"max_threads": 3}}) as model:
        loader = model.file.loader
        assert loader is not None and loader.budget == 4 * SIZE and loader.threads == 3
        assert model.file.threads == 3
        out = model.compile().run({"x": np.zeros(1024, np.float32)})
        assert float(next(iter(out.values()))[0]) == sum(range(N))
        assert loader.wait_idle(30) and loader.order == [f"w{k}" for k in range(N)]
    with md.load(path, config={"execution": {"parallel_parse": False, "max_threads": 3},
                               "memory": {"prefetch_buffer": "1MB"}}) as model:
        assert model.file.loader is not None and model.file.loader.threads == 1 and model.file.threads == 1
    for config in ({"memory": {"prefetch_buffer": 0}}, None):  # off unless asked for
        with md.load(path, config=config) as model:
            assert model.file.loader is None


def test_always_checks_every_tensor_at_open_on_all_threads(chain_file: Path) -> None:
    _flip(chain_file, open_mdef(chain_file).tensor_info("w6").offset + 1)
    with pytest.raises(ChecksumError, match="tensor 'w6'"):
        md.load(chain_file, config={"safety": {"checksum_verify": "always"}, "execution": {"max_threads": 2}})
    report = open_mdef(chain_file, threads=2).verify()
    assert report.tensors == N and len(report.failures) == 1 and "'w6'" in report.failures[0]
