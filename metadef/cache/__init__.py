"""The three-level compile cache (L7): whole models, kernels, shape specializations.

A backend wraps its compile in :func:`compile_cached`: the model-level key (graph content
hash, target, options, compiler versions, CPU features) is looked up in this process first
(compiling the same graph twice returns the same executable at once), then on disk; while the
backend builds its executable, every kernel that codegen compiles is looked up on disk by its
structural key (:class:`DiskKernelStore`, handed down through ``codegen.kernel_store``), so a
hit links stored object code and runs neither LLVM's optimizer nor its code generator. Shape
specializations have their key (:func:`shape_key`) and level in the store, ready for a backend
that compiles them.

Example:
    >>> import os, tempfile
    >>> os.environ["METADEF_CACHE_DIR"] = tempfile.mkdtemp()
    >>> from metadef.ir import parse_graph
    >>> g = parse_graph("graph g(%x: f32[n]) -> (%y) { %y: f32[n] = Relu(%x) return %y }")
    >>> calls = []
    >>> exe = compile_cached(g, "toy", {}, lambda: calls.append(1) or "executable")
    >>> exe, compile_cached(g, "toy", {}, lambda: calls.append(1) or "again"), len(calls)
    ('executable', 'executable', 1)
    >>> Store().info()["levels"]["model"]["entries"]
    1
    >>> del os.environ["METADEF_CACHE_DIR"]
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np

from metadef.cache.claims import Claims
from metadef.cache.keys import (
    LEVELS,
    CacheKey,
    environment,
    explain_difference,
    graph_hash,
    kernel_key,
    model_key,
    shape_key,
)
from metadef.cache.store import DEFAULT_MAX_BYTES, Entry, Store
from metadef.codegen.kernel import KernelCode, kernel_store
from metadef.ir import Graph
from metadef.shape import Dim, parse_dim

log = logging.getLogger("metadef.cache")
T = TypeVar("T")

MEMORY_ENTRIES = 32
"""How many compiled models this process keeps in memory (least recently used go first)."""
_MEMORY: OrderedDict[str, Any] = OrderedDict()
_MEMORY_LOCK = threading.Lock()


def _dim(d: Dim) -> int | str:
    return d if isinstance(d, int) else str(d)


def _undim(d: int | str) -> Dim:
    return d if isinstance(d, int) else parse_dim(d)


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return buffer.getvalue()


def encode_kernel(code: KernelCode) -> tuple[dict[str, Any], dict[str, bytes]]:
    """A kernel's code as an entry's manifest (JSON: symbol, output types, size slots) and
    blobs (the object code, each compiled-in constant as ``.npy``): no pickle anywhere."""
    manifest = {"symbol": code.symbol,
                "outputs": [[np.dtype(dt).str, [_dim(d) for d in shape]] for dt, shape in code.outputs],
                "slots": [_dim(d) for d in code.slots],
                "broadcasts": [[_dim(a), _dim(b), where] for a, b, where in code.broadcasts],
                "nests": [[_dim(d) for d in nest] for nest in code.nests],
                "constants": len(code.constants)}
    blobs = {"object": code.object_code, **{f"const{i}": _npy(c) for i, c in enumerate(code.constants)}}
    return manifest, blobs


def decode_kernel(entry: Entry) -> KernelCode:
    """The inverse of :func:`encode_kernel`."""
    m = entry.manifest
    constants = tuple(np.load(io.BytesIO(entry.blobs[f"const{i}"]), allow_pickle=False)
                      for i in range(int(m["constants"])))
    return KernelCode(str(m["symbol"]), entry.blobs["object"],
                      tuple((np.dtype(dt), tuple(_undim(d) for d in shape)) for dt, shape in m["outputs"]),
                      constants, tuple(_undim(d) for d in m["slots"]),
                      tuple((_undim(a), _undim(b), str(w)) for a, b, w in m["broadcasts"]),
                      tuple(tuple(_undim(d) for d in nest) for nest in m.get("nests", [])))


class DiskKernelStore:
    """Codegen's :class:`~metadef.codegen.kernel.KernelStore` on top of the on-disk store; it
    records which kernel key each kernel (by name) used, for the model-level entry."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.used: dict[str, str] = {}
        self.claims: Claims | None = None
        """Set while processes share one compile (:mod:`metadef.cache.claims`)."""

    def load(self, structure: str, name: str) -> KernelCode | None:
        key = kernel_key(structure)
        self.used[name] = key.digest
        try:
            entry = self.store.get(key)
            return None if entry is None else decode_kernel(entry)
        except (OSError, KeyError, ValueError, TypeError) as e:  # a readable but wrong entry: rebuild
            log.warning("cache: kernel entry %s cannot be used (%s): compiling", key.short, e)
            return None

    def save(self, structure: str, name: str, code: KernelCode) -> None:
        key = kernel_key(structure)
        self.used[name] = key.digest
        manifest, blobs = encode_kernel(code)
        try:
            self.store.put(key, {**manifest, "name": name}, blobs)
        except OSError as e:
            log.warning("cache: cannot write kernel %s under %s (%s)", key.short, self.store.root, e)
        if self.claims is not None:
            self.claims.drop(key.digest)

    def claim(self, structure: str, name: str, wait: bool = True) -> KernelCode | None:
        """After a miss: None when this process compiles the kernel (a claim is taken while
        processes share the compile), or the code another process compiled meanwhile
        (``wait=False``: CompiledElsewhere instead of waiting for it)."""
        if self.claims is None:
            return None
        key = kernel_key(structure)
        path = self.store.path(key)
        return self.claims.acquire(key.digest, name, lambda: self.load(structure, name) if path.exists() else None,
                                   wait=wait)

    def release(self, structure: str) -> None:
        """Give back this process's claim on a kernel it failed to compile."""
        if self.claims is not None:
            self.claims.drop(kernel_key(structure).digest)

    def share_compile(self, *, helper: bool) -> Claims:
        """From now on, coordinate with other processes compiling into the same store:
        claim each kernel before compiling it; a ``helper`` skips kernels another process
        compiles instead of waiting for them."""
        self.claims = Claims(self.store.root / "claims", skip=helper)
        return self.claims

    def seen(self, structure: str, name: str, code: KernelCode) -> None:
        """A kernel this process compiled before: stored here too when this store lacks it
        (it was compiled under another cache directory, or without a cache), so that the
        model entry never names a kernel the store does not hold."""
        key = kernel_key(structure)
        self.used[name] = key.digest
        if not self.store.path(key).exists():
            self.save(structure, name, code)


def _plan(executable: Any) -> list[Any]:
    """The executable's plan as JSON would read it back (tuples become lists)."""
    plan = getattr(executable, "plan", None) or []
    return json.loads(json.dumps([dataclasses.asdict(p) if dataclasses.is_dataclass(p) else repr(p) for p in plan]))


def _weights_of(graph: Graph) -> tuple[int, ...]:
    """The identity of the graph's constant arrays: an in-memory hit must hold these very
    weights (the entry keeps them alive, so no other array can take one of their ids)."""
    return tuple(id(v.const) for v in graph.constants)


def _remember(digest: str, executable: Any, weights: tuple[int, ...]) -> None:
    with _MEMORY_LOCK:
        _MEMORY[digest] = (executable, weights)
        _MEMORY.move_to_end(digest)
        while len(_MEMORY) > MEMORY_ENTRIES:
            _MEMORY.popitem(last=False)


class PlanMismatch(Exception):
    """A stored model plan that does not fit the graph, or whose kernels cannot be loaded;
    :func:`compile_cached` logs the reason and compiles as usual."""


KernelLoader = Callable[[str], KernelCode]
"""Loads one kernel's code by the digest of its kernel-level key (raises :class:`PlanMismatch`)."""
Replay = Callable[[list[Any], KernelLoader], T]
"""Rebuilds an executable from a stored plan (as the executable's ``plan`` was written)."""


def _loader(store: Store) -> KernelLoader:
    env = environment()

    def load(digest: str) -> KernelCode:
        try:
            entry = store.get_digest("kernel", digest, env)
            if entry is not None:
                return decode_kernel(entry)
            reason = "missing or damaged"
        except (OSError, KeyError, ValueError, TypeError) as e:
            reason = str(e)
        raise PlanMismatch(f"kernel {digest[:10]} cannot be loaded ({reason})")

    return load


def _replayed(key: CacheKey, graph: Graph, entry: Entry, replay: Replay[T], store: Store) -> T | None:
    """The executable rebuilt from the entry's stored plan, or None (the reason is logged)."""
    plan = entry.manifest.get("plan")
    try:
        if not isinstance(plan, list):
            raise PlanMismatch("the entry has no plan")
        return replay(plan, _loader(store))
    except PlanMismatch as e:
        log.warning("cache: the stored plan %s does not fit %s (%s): compiling", key.short, graph.name, e)
        return None


def compile_cached(graph: Graph, target: str, options: Mapping[str, Any], build: Callable[[], T],
                   store: Store | None = None, *, replay: Replay[T] | None = None,
                   weights: bool = True, backend: str = "") -> T:
    """``build()``'s executable for ``graph``, from memory (when ``graph`` holds the very weight
    arrays of the remembered one: ``weights=False`` keys ignore their values), or built with every kernel looked
    up in (and written to) the on-disk cache; the model-level entry records the kernel keys
    per kernel name and the plan. Cache trouble (an unwritable directory) never fails a compile.

    ``replay``: on a model-level hit on disk, rebuild the executable from the stored plan
    (its kernels load by digest: no structural keys, no LLVM) instead of calling ``build``;
    if the plan does not fit (:class:`PlanMismatch`), say why and build. ``weights=False``:
    the backend passes weights to its kernels at run time, so they count in the model key
    by dtype and shape only (:func:`~metadef.cache.keys.graph_hash`); their values still
    reach each kernel key that compiles them in. ``backend``: a digest of the backend's source
    (:func:`~metadef.cache.keys.model_key`).
    """
    key = model_key(graph_hash(graph, weights), target, options, backend=backend)
    weights_in_memory = () if weights else _weights_of(graph)
    with _MEMORY_LOCK:
        hit = _MEMORY.get(key.digest)
        if hit is not None and hit[1] == weights_in_memory:  # other weights: the disk replays the plan
            _MEMORY.move_to_end(key.digest)
            return hit[0]
    store = store or Store()
    try:
        entry = store.get(key)
    except OSError as e:
        log.warning("cache: cannot read %s (%s): compiling without the cache", store.root, e)
        return build()
    executable = None
    if entry is not None and replay is not None:
        with kernel_store(DiskKernelStore(store)):  # what the replay compiles besides the plan's kernels
            executable = _replayed(key, graph, entry, replay, store)
    if executable is None:
        kernels = DiskKernelStore(store)
        with kernel_store(kernels):
            executable = build()
        plan = _plan(executable)
        if entry is None or entry.manifest.get("kernels") != kernels.used or entry.manifest.get("plan") != plan:
            try:
                store.put(key, {"graph": graph.name, "target": target, "kernels": kernels.used, "plan": plan}, {})
            except (OSError, TypeError, ValueError) as e:
                log.warning("cache: cannot write the model entry for %s (%s)", graph.name, e)
    with contextlib.suppress(OSError):
        store.flush_stats()
    _remember(key.digest, executable, weights_in_memory)
    return executable


def forget_in_memory() -> None:
    """Drop the in-memory model level (the next compile of a graph goes to the disk)."""
    with _MEMORY_LOCK:
        _MEMORY.clear()


__all__ = ["DEFAULT_MAX_BYTES", "LEVELS", "CacheKey", "DiskKernelStore", "Entry", "KernelLoader", "PlanMismatch",
           "Replay", "Store", "compile_cached",
           "decode_kernel", "encode_kernel", "environment", "explain_difference", "forget_in_memory",
           "graph_hash", "kernel_key", "model_key", "shape_key"]
