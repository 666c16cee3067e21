"""Parallel compile: helper processes compile a graph's kernels while this process compiles them too.

LLVM work dominates a cold compile (ResNet-50: ~1.6 s of ~2 s), and llvmlite serializes every
call into LLVM behind one process-wide lock, so threads cannot share it. Instead, while the
x86 backend builds an executable with the kernel level of the compile cache in effect,
``helpers - 1`` forked processes walk the same graph, each starting at another node and going
backward (helper ``k`` of ``n`` from node ``(k + 1) * len / n - 1``, wrapping around; see
:func:`helper_order`), and compile what those nodes need:
group kernels, node kernels and native routines. Every compiled kernel goes to the on-disk
kernel level, and each is claimed before it is compiled (:mod:`metadef.cache.claims`): a
helper skips a kernel another process is compiling, this process waits for it, and then
links the stored object code. The executable is built here, exactly as without helpers;
helpers only move LLVM work to other cores (their plans are thrown away).

Helpers run only on a cold compile (a model-level hit replays the stored plan), on systems
with ``fork``, for graphs of at least :data:`MIN_NODES` nodes, with the kernel level on disk.
``METADEF_COMPILE_WORKERS`` sets how many processes share a compile (1: no helpers; default:
the cores this process may run on, at most :data:`MAX_WORKERS`).

Example:
    >>> compile_workers() >= 1
    True
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence

from metadef.backends.x86.mapping import choose
from metadef.backends.x86.native import needs
from metadef.codegen.kernel import current_store
from metadef.codegen.native import native_function
from metadef.core.errors import BackendError
from metadef.ir import Graph, Node

log = logging.getLogger("metadef.backends.x86")

MIN_NODES = 8
"""Smaller graphs compile in well under the cost of forking."""
MAX_WORKERS = 4
"""The default never uses more processes than this."""
HELPER_TIMEOUT_S = 30.0
"""How long a helper may take to exit once the compile is done and has asked it to stop;
after that it is killed."""
BASE_ROUTINES = ("md_run_program", "md_run_tasks", "md_copy")
"""The routines every executable links (the first helper compiles them first)."""


def compile_workers() -> int:
    """How many processes share a cold compile (``METADEF_COMPILE_WORKERS``; see the module doc)."""
    text = os.environ.get("METADEF_COMPILE_WORKERS")
    if text is not None:
        try:
            workers = int(text)
        except ValueError:
            raise BackendError(f"METADEF_COMPILE_WORKERS={text!r}: give a whole number of processes "
                               "(1: compile in this process only)") from None
        if workers < 1:
            raise BackendError(f"METADEF_COMPILE_WORKERS={workers}: give at least 1")
        return workers
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_WORKERS))


def helper_order(nodes: Sequence[Node], rank: int, workers: int) -> list[Node]:
    """The nodes in the order helper ``rank`` (of ``workers`` processes; 0 is the compiling
    process, which goes forward from the first node) visits them: backward from the last node
    of its share (``[rank * len / workers, (rank + 1) * len / workers)``), wrapping around. Each
    share is walked from its top down toward the process below it, and the graph's last nodes
    are a helper's first: walked forward like the compiling process, the helper reached them
    last too, and ResNet-50's classifier (the only node that needs ``md_gemm``, 0.4 s of
    LLVM) was compiled by both at the end, waited for by the compile.

    Example:
        >>> helper_order(list("abcdef"), 1, 2)
        ['f', 'e', 'd', 'c', 'b', 'a']
        >>> helper_order(list("abcdef"), 1, 3)
        ['d', 'c', 'b', 'a', 'f', 'e']
    """
    top = (rank + 1) * len(nodes) // workers
    return [*reversed(nodes[:top]), *reversed(nodes[top:])]


def _compile_nodes(nodes: Sequence[Node], routines: Sequence[str]) -> None:
    """A helper's work: each node's kernels and routines, skipping whatever fails (claimed by
    another process, or refused: the compiling process meets it and reports it) one routine
    at a time: a node's routines go on past one that another process has claimed (skipping the
    rest of the node, helpers compiled ResNet-50's md_gemm and max pool and little else: every
    conv needs md_conv1x1 first, which the compiling process had claimed)."""
    for routine in routines:
        if _STOPPING[0]:
            return
        with contextlib.suppress(Exception):
            native_function(routine)
    for node in nodes:
        if _STOPPING[0]:
            return
        try:
            choice = choose(node)
        except Exception:
            continue
        for routine in needs(choice.native):
            if _STOPPING[0]:
                return
            with contextlib.suppress(Exception):
                native_function(routine)


@contextlib.contextmanager
def helpers(graph: Graph, workers: int | None = None) -> Iterator[int]:
    """Fork helper processes for the compile of ``graph`` done inside the block (see the
    module doc); yields how many were started (0 when helpers do not apply)."""
    workers = compile_workers() if workers is None else workers
    store = current_store()
    share = getattr(store, "share_compile", None)
    if workers < 2 or len(graph.nodes) < MIN_NODES or share is None or not hasattr(os, "fork"):
        yield 0
        return
    pids: list[int] = []
    for rank in range(1, workers):
        order = helper_order(graph.nodes, rank, workers)
        pid = os.fork()
        if pid == 0:  # the helper: compile, and leave without running anything of the parent's
            code = 0
            try:
                signal.signal(signal.SIGTERM, _stop)
                share(helper=True)
                _compile_nodes(order, BASE_ROUTINES if rank == 1 else ())
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        pids.append(pid)
    claims = share(helper=False)
    log.debug("x86: %d helper processes compile %s along with this one", len(pids), graph.name)
    try:
        yield len(pids)
    finally:
        store.claims = None
        _reap(pids)
        log.debug("x86: compile of %s waited %.3f s for kernels its helpers compiled", graph.name, claims.waited)


_STOPPING: list[bool] = [False]
"""Set in a helper by SIGTERM: it leaves before its next node or routine."""


def _stop(signum: int, frame: object) -> None:
    # (not SystemExit here: raised between any two bytecodes, it could leave a claim behind,
    # taken but never given back, e.g. while a kernel's entry was being saved)
    _STOPPING[0] = True


def _reap(pids: list[int]) -> None:
    """Stop the helpers (what they have left to do is linking stored kernels, or compiling
    ones this process did not need): SIGTERM has a helper finish the kernel it compiles (so
    that its entry is saved and its claim given back) and leave; a daemon thread reaps each."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
        threading.Thread(target=_wait, args=(pid,), daemon=True, name=f"metadef-reap-{pid}").start()


def _wait(pid: int) -> None:
    deadline = time.monotonic() + HELPER_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # already reaped (a claim check found it exited)
            return
        if done == pid:
            return
        time.sleep(0.01)
    log.warning("x86: compile helper %d still runs %.0f s after the compile: killing it", pid, HELPER_TIMEOUT_S)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


__all__ = ["BASE_ROUTINES", "HELPER_TIMEOUT_S", "MAX_WORKERS", "MIN_NODES", "compile_workers", "helper_order",
           "helpers"]
