"""Claims on kernels: taken once, handed over when their process died, waited for or skipped."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from metadef.cache.claims import Claims
from metadef.codegen.kernel import CompiledElsewhere


def _dead_pid() -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def test_a_claim_is_taken_once_and_dropped_by_its_holder(tmp_path: Path) -> None:
    mine, other = Claims(tmp_path), Claims(tmp_path)
    assert mine.take("k")
    assert mine.holder("k") == os.getpid()
    (tmp_path / "k2").write_text(str(os.getppid()))  # a live process's claim
    assert not other.take("k2")
    other.drop("k2")  # not ours: stays
    assert (tmp_path / "k2").exists()
    mine.drop("k")
    assert mine.holder("k") is None and mine.take("k")


def test_the_claim_of_a_dead_process_or_a_stale_one_is_taken_over(tmp_path: Path) -> None:
    claims = Claims(tmp_path)
    (tmp_path / "dead").write_text(str(_dead_pid()))
    assert claims.take("dead") and claims.holder("dead") == os.getpid()
    stale = tmp_path / "stale"
    stale.write_text(str(os.getppid()))
    old = time.time() - 10_000
    os.utime(stale, (old, old))
    assert claims.take("stale")
    (tmp_path / "garbage").write_text("not a pid")
    assert claims.take("garbage")


def test_a_helper_skips_what_another_process_compiles(tmp_path: Path) -> None:
    (tmp_path / "k").write_text(str(os.getppid()))
    with pytest.raises(CompiledElsewhere, match="kernel k"):
        Claims(tmp_path, skip=True).acquire("k", "kernel k", lambda: None)


def test_the_compiling_process_waits_for_the_entry_and_takes_it(tmp_path: Path) -> None:
    (tmp_path / "k").write_text(str(os.getppid()))
    box: list[str] = []
    threading.Timer(0.05, lambda: box.append("code")).start()
    claims = Claims(tmp_path)
    assert claims.acquire("k", "kernel k", lambda: box[0] if box else None) == "code"
    assert claims.waited >= 0.04


def test_a_claim_whose_holder_dies_while_waiting_falls_to_the_waiter(tmp_path: Path) -> None:
    pid = os.fork()
    if pid == 0:
        time.sleep(0.1)
        os._exit(0)
    (tmp_path / "k").write_text(str(pid))
    claims = Claims(tmp_path)
    assert claims.acquire("k", "kernel k", lambda: None) is None  # ours to compile
    assert claims.holder("k") == os.getpid()


def test_an_entry_saved_between_the_miss_and_the_claim_is_used(tmp_path: Path) -> None:
    claims = Claims(tmp_path)
    assert claims.acquire("k", "kernel k", lambda: "code") == "code"
    assert claims.holder("k") is None  # the claim was given back
