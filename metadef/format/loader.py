"""``DynamicLoader``: read an .mdef file's tensors ahead of their use, in the order they are needed.

The loader orders the tensors by when the graph first needs them (:func:`need_order`: the
nodes in execution order, and among the nodes ready at the same time the one on the longest
path to an output first), groups them into batches of at most half of ``budget`` bytes
(:func:`plan_batches`), and, when the caller first uses a tensor of batch *k*, prepares batch
*k* and the next one on ``threads`` background threads: on a mapping, ``madvise(MADV_WILLNEED)``
for the pages not in memory yet (``mincore`` says which; a touch per page where madvise is
missing), so the kernel reads them while the caller works; without a mapping, a read into the
file's private buffer. So no more than ``budget`` bytes are read ahead of the tensor in use.

Checksums: under ``always`` every tensor is checked at open, on the file's ``threads``
threads (xxh3 releases the GIL). Under ``on_demand`` a tensor is checked at its first use, on
the caller's thread, right before the caller reads it (the bytes are then warm in the CPU
cache); ``verify_ahead=True`` checks batches ahead on the background threads instead, which
pays when cores are idle and the caller only takes views (a compile), and costs when they are
busy and the caller reads each tensor at once (measured in ``bench/mdef_open.py``).

A caller that needs a tensor whose job is still queued runs that job itself rather than
wait. A job's error (a checksum mismatch, a file cut short after it was opened) surfaces on
the caller's next use of any tensor, typed (:class:`~metadef.format.errors.ChecksumError`,
:class:`~metadef.format.errors.TruncatedFileError`, else
:class:`~metadef.format.errors.LoaderError`), once; the failed tensor itself is checked again
when it is used (and raises again if its bytes are damaged). Closing the loader (or the
file) drops queued jobs and joins the threads.

Example:
    >>> import tempfile, pathlib, numpy as np
    >>> from metadef.ir import parse_graph
    >>> from metadef.format import open_mdef, save_graph
    >>> g = parse_graph('''graph g(%x: f32[4]) -> (%y) {
    ...   %a: f32[4] = const [1.0, 2.0, 3.0, 4.0]
    ...   %b: f32[4] = const [5.0, 6.0, 7.0, 8.0]
    ...   %t: f32[4] = Add(%x, %a)
    ...   %y: f32[4] = Mul(%t, %b)
    ...   return %y
    ... }''')
    >>> f = open_mdef(save_graph(g, pathlib.Path(tempfile.mkdtemp()) / "g.mdef"))
    >>> with DynamicLoader(f, f.graph(), budget=16, threads=2) as loader:
    ...     loader.order, len(loader.batches)
    ...     f.graph().value("a").const.tolist()
    (['a', 'b'], 2)
    [1.0, 2.0, 3.0, 4.0]
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from metadef.core.errors import FormatError
from metadef.format.errors import LoaderError
from metadef.format.reader import MdefFile
from metadef.format.workers import Pool
from metadef.ir.graph import Graph

log = logging.getLogger("metadef.format")


def need_order(graph: Graph) -> list[str]:
    """The graph's constants in the order execution first needs them.

    Nodes run in a list schedule: among the nodes whose inputs are ready, the one with the
    longest path to a graph output (the critical path) first, ties in graph order. A
    constant's place is its first reader's; constants no node reads come last.

    Example:
        >>> from metadef.ir import parse_graph
        >>> g = parse_graph('''graph g(%x: f32[2]) -> (%y, %z) {
        ...   %s: f32[2] = const [1.0, 1.0]
        ...   %l: f32[2] = const [2.0, 2.0]
        ...   %z: f32[2] = Add(%x, %s)
        ...   %a: f32[2] = Mul(%x, %l)
        ...   %y: f32[2] = Relu(%a)
        ...   return %y, %z
        ... }''')
        >>> need_order(g)  # Mul starts the longer path (Mul -> Relu), so %l comes first
        ['l', 's']
    """
    nodes = graph.nodes
    position = {id(n): k for k, n in enumerate(nodes)}
    readers: list[list[int]] = [[] for _ in nodes]
    waiting = [0] * len(nodes)
    for k, n in enumerate(nodes):
        producers = {position[id(v.producer)] for v in n.inputs
                     if v is not None and v.producer is not None and id(v.producer) in position}
        for p in producers:
            readers[p].append(k)
        waiting[k] = len(producers)
    height = [1] * len(nodes)  # nodes on the longest path from here to an output
    for k in range(len(nodes) - 1, -1, -1):
        if readers[k]:
            height[k] = 1 + max(height[r] for r in readers[k])
    ready = [(-height[k], k) for k in range(len(nodes)) if waiting[k] == 0]
    heapq.heapify(ready)
    constants = {id(v): v.name for v in graph.constants}
    order: dict[str, None] = {}
    while ready:
        _, k = heapq.heappop(ready)
        for v in nodes[k].inputs:
            if v is not None and id(v) in constants:
                order.setdefault(constants[id(v)])
        for r in readers[k]:
            waiting[r] -= 1
            if waiting[r] == 0:
                heapq.heappush(ready, (-height[r], r))
    for name in constants.values():
        order.setdefault(name)
    return list(order)


def plan_batches(sizes: Sequence[int], budget: int) -> list[list[int]]:
    """Consecutive positions grouped so that each batch holds at most ``budget // 2`` bytes
    (a tensor larger than that is a batch of its own): a batch in use and the next one,
    read ahead, stay within ``budget``.

    Example:
        >>> plan_batches([10, 10, 10, 50, 5], budget=40)
        [[0, 1], [2], [3], [4]]
    """
    limit = max(1, budget // 2)
    batches: list[list[int]] = []
    current: list[int] = []
    held = 0
    for k, size in enumerate(sizes):
        if current and held + size > limit:
            batches.append(current)
            current, held = [], 0
        current.append(k)
        held += size
    if current:
        batches.append(current)
    return batches


@dataclass
class LoaderStats:
    """What a loader did: batches started, jobs run on its threads or taken over by the
    caller, how long the caller waited, bytes prepared, how pages came in, errors."""

    batches_started: int = 0
    jobs_background: int = 0
    jobs_by_caller: int = 0
    waits: int = 0
    wait_seconds: float = 0.0
    bytes_prepared: int = 0
    methods: dict[str, int] = field(default_factory=dict)
    errors: int = 0


def split_evenly(sizes: Sequence[int], parts: int) -> list[list[int]]:
    """Consecutive positions in at most ``parts`` runs of about equal total size.

    Example:
        >>> split_evenly([4, 4, 4, 4], 2), split_evenly([9, 1, 1], 2), split_evenly([], 3)
        ([[0, 1], [2, 3]], [[0], [1, 2]], [])
    """
    total = sum(sizes)
    runs: list[list[int]] = []
    current: list[int] = []
    held = 0
    for k, size in enumerate(sizes):
        if current and len(runs) < parts - 1 and held + size / 2 > total * (len(runs) + 1) / parts:
            runs.append(current)
            current = []
        current.append(k)
        held += size
    if current:
        runs.append(current)
    return runs


_QUEUED, _RUNNING, _DONE = 0, 1, 2


class DynamicLoader:
    """Reads an open file's tensors ahead of their first use (see the module docstring).

    ``graph``: the file's graph, for the order (None: the file's own order, which the writer
    made the execution order; the critical-path order replaces it for the tensors not yet
    started when the file's graph is first decoded). ``budget``: bytes read ahead of use
    (``memory.prefetch_buffer``; 0 reads nothing ahead). ``threads``: background threads
    (``execution.max_threads`` when ``execution.parallel_parse``, else 1). ``verify_ahead``:
    check ``on_demand`` checksums on the background threads too (see the module docstring).

    Example:
        >>> import tempfile, pathlib
        >>> from metadef.ir import parse_graph
        >>> from metadef.format import open_mdef, save_graph
        >>> g = parse_graph("graph g(%x: f32[2]) -> (%y) { %w: f32[2] = const [1.0, 2.0] "
        ...                 "%y: f32[2] = Mul(%x, %w) return %y }")
        >>> f = open_mdef(save_graph(g, pathlib.Path(tempfile.mkdtemp()) / "m.mdef"))
        >>> loader = DynamicLoader(f).start()
        >>> loader.wait_idle(10), f.tensor("w").tolist()
        (True, [1.0, 2.0])
        >>> f.close(); loader.closed
        True
    """

    def __init__(self, file: MdefFile, graph: Graph | None = None, *, budget: int = 256 * 10**6,
                 threads: int = 1, verify_ahead: bool = False) -> None:
        self.file = file
        self.budget = max(0, int(budget))
        self.threads = max(1, int(threads))
        self.verify_ahead = verify_ahead
        self.stats = LoaderStats()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a job finished, or the loader closed
        self._sizes: list[int] = file._records["byte_length"].tolist()
        self._state: dict[int, int] = {}  # tensor -> _QUEUED / _RUNNING / _DONE, once its batch started
        self._outcome: dict[int, str | BaseException] = {}
        self._pending = 0
        self._error: BaseException | None = None
        self._current = -1
        self._ahead: dict[int, int] = {}  # batch -> bytes read ahead and not used yet
        self._used: set[int] = set()
        self.batches: list[list[int]] = []
        self.closed = False
        self._pool = Pool(self.threads, f"metadef-loader-{file.path.name}")
        self._finalizer = weakref.finalize(self, self._pool.close)
        self._set_order(need_order(graph) if graph is not None else None)
        file.attach_loader(self)

    # --- order and batches ------------------------------------------------------------------
    def _set_order(self, names: Iterable[str] | None) -> None:
        """Batches for every tensor not started yet, in ``names`` order (None: file order);
        batches already started keep their place in front."""
        count = len(self._sizes)
        started = [b for b, batch in enumerate(self.batches) if any(i in self._state for i in batch)]
        taken = {i for b in started for i in self.batches[b]}
        if names is None:
            order = list(range(count))
        else:
            index = self.file._names
            order = list(dict.fromkeys([index[n] for n in names if n in index] + list(range(count))))
        rest = [i for i in order if i not in taken]
        renumber = {old: new for new, old in enumerate(started)}
        kept = [self.batches[b] for b in started]
        self.order_index = [i for batch in kept for i in batch] + rest
        self.batches = kept + [[rest[k] for k in b] for b in
                               plan_batches([self._sizes[i] for i in rest], self.budget)]
        self._batch_of = {i: b for b, batch in enumerate(self.batches) for i in batch}
        self._current = renumber.get(self._current, -1)
        self._ahead = {renumber[b]: n for b, n in self._ahead.items() if b in renumber}

    @property
    def order(self) -> list[str]:
        """Tensor names in the order they will be prepared."""
        return [self.file._name(i) for i in self.order_index]

    def use_graph(self, graph: Graph) -> None:
        """Order the tensors not started yet by ``graph`` (the file calls this when it decodes its graph)."""
        with self._lock:
            if not self.closed:
                self._set_order(need_order(graph))

    # --- scheduling -------------------------------------------------------------------------
    def start(self) -> DynamicLoader:
        """Prepare the first batch now, before any tensor is used (by default the loader
        starts at the first use, so opening a file reads nothing)."""
        with self._lock:
            if self.batches and not self.closed:
                self._submit(0, ahead=True)
        return self

    def _submit(self, b: int, ahead: bool) -> None:
        """Queue batch ``b``'s tensors not started yet, as one run per thread (under the lock);
        ``ahead``: they count against the budget until the caller uses them."""
        new = [i for i in self.batches[b] if i not in self._state]
        if not new:
            return
        self.stats.batches_started += 1
        for i in new:
            self._state[i] = _QUEUED
        self._pending += len(new)
        if ahead:
            self._ahead[b] = self._ahead.get(b, 0) + sum(self._sizes[i] for i in new)
        for run in split_evenly([self._sizes[i] for i in new], self.threads):
            chunk = [new[k] for k in run]
            self._pool.submit(lambda chunk=chunk: self._run_chunk(chunk))

    def _next_batch(self, b: int) -> int | None:
        for k in range(b + 1, len(self.batches)):
            if any(i not in self._state for i in self.batches[k]):
                return k
        return None

    def before_use(self, i: int) -> None:
        """The file calls this on the first use of tensor ``i``: raise the error a job met
        since the last use, if any; else start the batch after ``i``'s (within the budget),
        then wait for ``i``'s job or run it here."""
        with self._lock:
            error, self._error = self._error, None
            if error is not None:
                raise error
            if self.closed:
                return
            b = self._batch_of.get(i)
            if b is not None and self.budget and b != self._current:
                self._current = b  # batch b is the caller's now: the loader reads the next one
                nxt = self._next_batch(b)
                ahead = sum(n for k, n in self._ahead.items() if k >= b)
                if nxt is not None and ahead + sum(self._sizes[k] for k in self.batches[nxt]) <= self.budget:
                    self._submit(nxt, ahead=True)
            state = self._state.get(i)
            if state is not None and i not in self._used:
                self._used.add(i)
                batch = self._batch_of.get(i, -1)
                if batch in self._ahead:
                    self._ahead[batch] = max(0, self._ahead[batch] - self._sizes[i])
            if state == _QUEUED:
                self._state[i] = _RUNNING
            elif state == _RUNNING:
                start = time.perf_counter()
                self._changed.wait_for(lambda: self._state.get(i) != _RUNNING or self.closed)
                self.stats.waits += 1
                self.stats.wait_seconds += time.perf_counter() - start
        if state == _QUEUED:
            self._finish(i, self._prepare(i), by_caller=True)
        with self._lock:
            if isinstance(self._outcome.get(i), BaseException):  # the file checks it again and raises
                if self._error is self._outcome[i]:
                    self._error = None
                del self._state[i], self._outcome[i]

    def _prepare(self, i: int) -> str | BaseException:
        try:
            return self.file._prepare(i, verify=self.verify_ahead)
        except FormatError as e:
            return e
        except Exception as e:  # an I/O error, a bug: typed, with the tensor and the file
            err = LoaderError(f"{self.file.path}: the loader failed on tensor {self.file._name(i)!r} "
                              f"({type(e).__name__}: {e}); the tensor is read again when used")
            err.__cause__ = e
            return err

    def _run_chunk(self, chunk: list[int]) -> None:
        if not self.verify_ahead and self.file.mmapped:  # advice for the whole run at once
            with self._lock:
                mine = [i for i in chunk if self._state.get(i) == _QUEUED and not self.closed]
                for i in mine:
                    self._state[i] = _RUNNING
            if mine:
                try:
                    how: str | BaseException = self._populate(mine)
                except Exception as e:  # (madvise does not fail on a live mapping)
                    how = LoaderError(f"{self.file.path}: the loader failed to read ahead ({type(e).__name__}: "
                                      f"{e}); the tensors are read when used")
                for i in mine:
                    self._finish(i, how, by_caller=False)
            return
        for i in chunk:
            with self._lock:
                if self.closed:
                    return
                if self._state.get(i) != _QUEUED:  # the caller took it over
                    continue
                self._state[i] = _RUNNING
            self._finish(i, self._prepare(i), by_caller=False)

    def _populate(self, indices: list[int]) -> str:
        """Bring several tensors of a mapped file in with one ``madvise(MADV_POPULATE_READ)``
        (else ``MADV_WILLNEED``) per run of neighbouring tensors: each call from a thread is one
        more wait for the GIL. (POPULATE_READ reads and maps the pages before it returns; on
        this project's test VM it beat WILLNEED, which stalled the kernel's own readahead.)"""
        records = self.file._records
        spans: list[list[int]] = []
        for start, length in sorted((int(records[i]["data_offset"]), self._sizes[i]) for i in indices):
            if spans and start - spans[-1][1] <= 1 << 20:
                spans[-1][1] = max(spans[-1][1], start + length)
            else:
                spans.append([start, start + length])
        how = "nothing"
        for start, end in spans:
            how = self.file._data.populate(start, end - start, advice="populate")
        return how

    def _finish(self, i: int, outcome: str | BaseException, by_caller: bool) -> None:
        with self._lock:
            self._state[i] = _DONE
            self._outcome[i] = outcome
            self._pending -= 1
            if isinstance(outcome, BaseException):
                self.stats.errors += 1
                if not by_caller and self._error is None:
                    self._error = outcome
            else:
                self.stats.methods[outcome] = self.stats.methods.get(outcome, 0) + 1
                if outcome != "cancelled":
                    self.stats.bytes_prepared += self._sizes[i]
            if by_caller:
                self.stats.jobs_by_caller += 1
            else:
                self.stats.jobs_background += 1
            self._changed.notify_all()

    # --- lifetime ---------------------------------------------------------------------------
    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no job is queued or running; False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: self._pending == 0 or self.closed, timeout)

    def close(self) -> None:
        """Drop queued jobs, join the threads (each finishes the tensor in hand); later uses
        of the file read tensors as if no loader were attached."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._changed.notify_all()
        self._pool.close()
        with self._lock:
            for i, state in self._state.items():
                if state == _QUEUED:
                    self._state[i] = _DONE
                    self._outcome[i] = "cancelled"
                    self._pending -= 1
        if self.file.loader is self:
            self.file.attach_loader(None)

    def __enter__(self) -> DynamicLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"DynamicLoader({self.file.path.name}, {len(self.order_index)} tensors in {len(self.batches)} "
                f"batches, budget {self.budget} bytes, {self.threads} threads)")


__all__ = ["DynamicLoader", "LoaderStats", "need_order", "plan_batches", "split_evenly"]
