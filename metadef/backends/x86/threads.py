"""Threads for generated code: a pool of workers that native programs drive.

The workers are Python threads parked in the native ``md_worker`` loop (ctypes releases the
GIL for the whole call), so a parallel group of calls runs with no Python in between: the
program's caller publishes the group, the workers and the caller take its calls by
compare-and-swap, and the caller waits for the last one (see
:func:`metadef.codegen.native._pool_module`). Idle workers spin a few microseconds, then
sleep on a futex.

``set_threads(n)`` is process-wide, as OpenBLAS's thread count is: it sets both, so BLAS
calls and generated code agree. The default is OpenBLAS's own (the machine's cores).

Example:
    >>> set_threads(2)
    >>> current_threads(), worker_pool(2).threads
    (2, 2)
"""

from __future__ import annotations

import atexit
import ctypes
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
    """Threads for generated code and for OpenBLAS, process-wide."""
    set_blas_threads(n)
    _THREADS[:] = [n]


def current_threads() -> int:
    """The thread count native programs bind with (:func:`set_threads`, else OpenBLAS's
    when this process first asked: read once, it costs a look at the loaded libraries)."""
    if not _THREADS:
        try:
            _THREADS.append(max(1, blas_threads()))
        except BackendError:
            _THREADS.append(1)
    return _THREADS[0]


@atexit.register
def _close_all() -> None:
    for pool in list(_POOLS.values()):
        pool.close()


__all__ = ["WorkerPool", "current_threads", "set_threads", "worker_pool"]
