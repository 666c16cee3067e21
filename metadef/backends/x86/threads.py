"""Threads for generated code: a pool of workers that native programs drive.

The workers are Python threads parked in the native ``md_worker`` loop (ctypes releases the
GIL for the whole call), so a parallel group of calls runs with no Python in between: the
program's caller publishes the group, the workers and the caller take its calls by
compare-and-swap, and the caller waits for the last one (see
:func:`metadef.codegen.native._pool_module`). Idle workers spin some tens of microseconds
(:data:`~metadef.codegen.native_pool.SPIN`), then sleep on a futex.

``set_threads(n)`` is process-wide. There is one pool: the sgemm calls of a program split
across it like the generated kernels (see :func:`metadef.backends.x86.native.sgemm_call`), and
OpenBLAS itself is set to one thread, as its own workers would spin for their next call on
the cores the pool computes on (with two pools on two cores, a run slowed down up to 5x when
another process took a core). numpy's matmul elsewhere in the process is then single-threaded
too. The default is the cores this process may run on.

Example:
    >>> set_threads(2)
    >>> current_threads(), worker_pool(2).threads
    (2, 2)
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import threading

from metadef.backends.x86.contractions import blas_threads, set_blas_threads
from metadef.codegen.native import POOL, POOL_WORDS, native_function
from metadef.codegen.native_pool import SPIN
from metadef.core.errors import BackendError

_LOCK = threading.Lock()
_POOLS: dict[int, WorkerPool] = {}
_THREADS: list[int] = []
_RUN_TASKS = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
_WORKER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_LIBC = ctypes.CDLL(None, use_errno=True)


class WorkerPool:
    """``threads - 1`` workers and the shared state ``md_run_tasks`` publishes groups in."""

    def __init__(self, threads: int) -> None:
        if threads < 1:
            raise BackendError(f"threads={threads}: give a positive number of threads")
        self.threads = threads
        self.state = (ctypes.c_int64 * POOL_WORDS)()
        self.state[POOL["syscall"]] = ctypes.cast(_LIBC.syscall, ctypes.c_void_p).value or 0
        self.state[POOL["spin"]] = SPIN
        self.address = ctypes.addressof(self.state)
        self.run_tasks = _RUN_TASKS(native_function("md_run_tasks"))
        worker = _WORKER(native_function("md_worker"))
        self._workers = [threading.Thread(target=worker, args=(self.address,), daemon=True,
                                          name=f"metadef-x86-{i + 1}") for i in range(threads - 1)]
        for t in self._workers:
            t.start()

    def close(self) -> None:
        """Stop the workers (they leave their loop at the next wake-up) and join them."""
        self.state[POOL["stop"]] = 1
        high = ctypes.addressof(self.state) + 8 * POOL["next"] + 4
        self.state[POOL["next"]] += 1 << 32  # a new generation wakes the spinners
        _LIBC.syscall(ctypes.c_long(202), ctypes.c_void_p(high), ctypes.c_int(129), ctypes.c_int(0x7FFFFFFF),
                      None, None, ctypes.c_int(0))
        for t in self._workers:
            t.join(timeout=5)


def worker_pool(threads: int) -> WorkerPool:
    """The process's pool of ``threads`` threads (started on first use)."""
    with _LOCK:
        pool = _POOLS.get(threads)
        if pool is None:
            pool = _POOLS[threads] = WorkerPool(threads)
        return pool


def set_threads(n: int) -> None:
    """Threads for native programs, process-wide (OpenBLAS: one; the pool runs its calls)."""
    if n < 1:
        raise BackendError(f"threads={n}: give a positive number of threads")
    _single_threaded_blas()
    _THREADS[:] = [n]


def current_threads() -> int:
    """The thread count native programs bind with (:func:`set_threads`, else the cores this
    process may run on)."""
    if not _THREADS:
        _single_threaded_blas()
        _THREADS.append(max(1, len(os.sched_getaffinity(0))))
    return _THREADS[0]


def _single_threaded_blas() -> None:
    with contextlib.suppress(BackendError):  # no OpenBLAS: nothing spins
        if blas_threads() != 1:
            set_blas_threads(1)


@atexit.register
def _close_all() -> None:
    for pool in list(_POOLS.values()):
        pool.close()


__all__ = ["WorkerPool", "current_threads", "set_threads", "worker_pool"]
