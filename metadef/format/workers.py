"""Background threads for the reader and the loader: a small pool and ``parallel_map``.

Threads pay here because the work runs in C without the GIL: xxh3 (python-xxhash 4.x
releases the GIL on large buffers: two threads hash 400 MB 1.55x faster than one on this
2-core machine, ``bench/mdef_open.py``), ``os.preadv`` and ``madvise`` through ctypes. JSON
and graph decoding hold the GIL, so they stay on the caller's thread.

A :class:`Pool`'s threads are daemons that hold no reference to what they work for while
idle; :meth:`Pool.close` drops queued work and joins them (each finishes the job in hand),
and every pool still open is closed at interpreter exit, before the objects it reads go away.

Example:
    >>> parallel_map(lambda x: x * x, range(5), threads=2)
    [0, 1, 4, 9, 16]
    >>> parallel_map(lambda x: 1 // x, [1, 0], threads=1)[1].__class__.__name__
    'ZeroDivisionError'
"""

from __future__ import annotations

import atexit
import contextlib
import queue
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

_LIVE: weakref.WeakSet[Pool] = weakref.WeakSet()


class Pool:
    """``threads`` daemon threads running submitted callables in order of submission.

    Example:
        >>> pool = Pool(2, "demo")
        >>> done = threading.Event()
        >>> pool.submit(done.set)
        >>> done.wait(5)
        True
        >>> pool.close()
    """

    def __init__(self, threads: int, name: str = "metadef-loader") -> None:
        self.threads = max(1, threads)
        self.name = name
        self._queue: queue.SimpleQueue[Callable[[], Any] | None] = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.closed = False
        _LIVE.add(self)

    def submit(self, job: Callable[[], Any]) -> None:
        """Queue ``job`` (its exceptions are the job's business: wrap it to record them)."""
        with self._lock:
            if self.closed:
                return
            if len(self._workers) < self.threads:  # threads start on first use
                t = threading.Thread(target=_work, args=(self._queue,), name=f"{self.name}-{len(self._workers)}",
                                     daemon=True)
                t.start()
                self._workers.append(t)
        self._queue.put(job)

    def close(self, timeout: float | None = 30.0) -> None:
        """Drop queued jobs and join the threads (each finishes the job it is running)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            workers = list(self._workers)
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        for _ in workers:
            self._queue.put(None)
        for t in workers:
            if t is not threading.current_thread():
                t.join(timeout)


def _work(jobs: queue.SimpleQueue[Callable[[], Any] | None]) -> None:
    while True:
        job = jobs.get()
        if job is None:
            return
        with contextlib.suppress(BaseException):  # a job records its own errors; a pool thread never dies
            job()
        del job


@atexit.register
def _close_all() -> None:
    for pool in list(_LIVE):
        pool.close(timeout=10.0)


def parallel_map(fn: Callable[[T], R], items: Iterable[T], threads: int) -> list[R | BaseException]:
    """``[fn(x) for x in items]`` on up to ``threads`` threads (the caller's among them), in
    order; an exception is returned in the place of its result, not raised.

    Items are handed out one at a time, so a large item does not hold up the others.
    """
    work = list(items)
    results: list[Any] = [None] * len(work)
    next_item = iter(range(len(work)))
    lock = threading.Lock()

    def drain() -> None:
        while True:
            with lock:
                k = next(next_item, None)
            if k is None:
                return
            try:
                results[k] = fn(work[k])
            except Exception as e:  # handed back to the caller
                results[k] = e

    helpers = [threading.Thread(target=drain, name=f"metadef-map-{k}", daemon=True)
               for k in range(min(threads, len(work)) - 1)]
    for t in helpers:
        t.start()
    drain()
    for t in helpers:
        t.join()
    return results


__all__ = ["Pool", "parallel_map"]
