"""Compile-cache keys: every input that can change the code, by name, and one digest.

A :class:`CacheKey` is a level (``kernel``, ``model`` or ``shape``) and an ordered table of
named *components*: the metadef and LLVM versions, the target triple, the CPU features, the
codegen pipeline, the options, and the structure (a kernel's structural key, a graph's
content hash, concrete dims). The digest (xxh3-128 of the components as JSON) names the entry
on disk; the components are stored with it, so a miss can say which component differed from
the nearest entry (:func:`explain_difference`).

Example:
    >>> env = {"metadef": "0.1.0", "cpu_features": "+avx2,-avx512f"}
    >>> a = kernel_key("Relu(v0)->v1", env)
    >>> b = kernel_key("Relu(v0)->v1", {**env, "cpu_features": "+avx2,+avx512f"})
    >>> a.digest == b.digest
    False
    >>> explain_difference(b.as_dict(), a.as_dict())
    'cpu_features differ (+avx512f vs -avx512f)'
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import numpy as np
import xxhash

from metadef.codegen.host import toolchain
from metadef.core.errors import UnsupportedOpError
from metadef.ir import Graph, Value

LEVELS = ("model", "kernel", "shape")
"""The three levels of the cache: a whole compiled graph, one kernel, one shape variant."""


@dataclass(frozen=True)
class CacheKey:
    """One cache key: its level, its named components (in order) and their digest."""

    level: str
    components: tuple[tuple[str, str], ...]

    @property
    def digest(self) -> str:
        """xxh3-128 of the level and the components, as 32 hex digits (the entry's file name)."""
        text = json.dumps([self.level, list(self.components)], separators=(",", ":"))
        return xxhash.xxh3_128_hexdigest(text.encode())

    @property
    def short(self) -> str:
        """The first 10 digits of the digest, for log lines."""
        return self.digest[:10]

    def as_dict(self) -> dict[str, str]:
        return dict(self.components)


def _metadef_version() -> str:
    try:
        return version("metadef")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "unknown"


_ENVIRONMENT: dict[str, str] = {}


def environment() -> dict[str, str]:
    """The components common to every key: metadef, llvmlite and LLVM versions, triple, CPU
    features, the codegen pipeline and a digest of codegen's source (computed once per process).

    Example:
        >>> sorted(environment())
        ['codegen', 'cpu_features', 'llvm', 'llvmlite', 'metadef', 'pipeline', 'triple']
    """
    if not _ENVIRONMENT:
        _ENVIRONMENT.update({"metadef": _metadef_version(), **toolchain()})
    return dict(_ENVIRONMENT)


def _key(level: str, env: Mapping[str, str], **parts: str) -> CacheKey:
    return CacheKey(level, tuple(sorted({**env, **parts}.items())))


def kernel_key(structure: str, env: Mapping[str, str] | None = None) -> CacheKey:
    """The key of one kernel: codegen's structural key (ops, attributes, dtypes, symbolic
    shape form, compiled-in constants) plus the environment."""
    return _key("kernel", environment() if env is None else env,
                structure=xxhash.xxh3_128_hexdigest(structure.encode()))


def model_key(graph_hash: str, target: str, options: Mapping[str, Any],
              env: Mapping[str, str] | None = None, backend: str = "") -> CacheKey:
    """The key of a whole compiled graph for a target and options; ``backend``: a digest of
    the backend's source, whose plans a change there would make stale.

    Example:
        >>> k = model_key("g1", "x86", {"threads": 2}, {"metadef": "0.1.0"})
        >>> k.as_dict()["options"]
        '{"threads":2}'
    """
    opts = json.dumps({k: options[k] for k in sorted(options)}, separators=(",", ":"), default=str)
    code = {"backend": backend} if backend else {}
    return _key("model", environment() if env is None else env, graph=graph_hash, target=target, options=opts,
                **code)


def shape_key(kernel: CacheKey, dims: Mapping[str, int]) -> CacheKey:
    """The key of a kernel specialized for concrete dims (``{"batch": 1, "seq": 128}``).

    Example:
        >>> k = kernel_key("Relu", {"metadef": "0.1.0"})
        >>> shape_key(k, {"seq": 128}).as_dict()["dims"]
        'seq=128'
    """
    text = ",".join(f"{k}={int(v)}" for k, v in sorted(dims.items()))
    return CacheKey("shape", tuple(sorted({**kernel.as_dict(), "dims": text}.items())))


def explain_difference(wanted: Mapping[str, str], nearest: Mapping[str, str]) -> str:
    """Which components differ between a missed key and the nearest stored one, in words.

    Comma-separated lists (CPU features) show only the items that differ.

    Example:
        >>> explain_difference({"options": '{"threads":1}'}, {"options": '{"threads":2}'})
        'options differ ({"threads":1} vs {"threads":2})'
    """
    parts = []
    for name in sorted(set(wanted) | set(nearest)):
        a, b = wanted.get(name, "<none>"), nearest.get(name, "<none>")
        if a == b:
            continue
        if name == "cpu_features":
            sa, sb = set(a.split(",")), set(b.split(","))
            a, b = ",".join(sorted(sa - sb)), ",".join(sorted(sb - sa))
        if len(a) > 40 or len(b) > 40:
            a, b = a[:16] + "...", b[:16] + "..."
        parts.append(f"{name} {'differ' if name.endswith('s') else 'differs'} ({a} vs {b})")
    return "; ".join(parts) or "no component differs"


# ------------------------------------------------------------------------ graph content


_ARRAY_HASHES: dict[int, tuple[Any, str]] = {}
_ARRAY_LOCK = threading.Lock()


def array_hash(array: np.ndarray) -> str:
    """xxh3-128 of an array's dtype, shape and bytes (a string tensor's text); remembered per
    array object in this process (the same weights are hashed once, however often the graph is
    compiled).

    Example:
        >>> array_hash(np.zeros(3, np.float32)) == array_hash(np.zeros(3, np.float32))
        True
        >>> array_hash(np.array(["ab"], object)) == array_hash(np.array(["".join("ab")], object))
        True
    """
    got = _ARRAY_HASHES.get(id(array))
    if got is not None and got[0]() is array:
        return got[1]
    data = np.ascontiguousarray(array)
    h = xxhash.xxh3_128()
    h.update(f"{data.dtype.str}{data.shape}".encode())
    if data.dtype.hasobject:  # strings: their text (the bytes would be addresses)
        h.update(json.dumps(data.reshape(-1).tolist(), default=repr).encode())
    else:
        h.update(memoryview(data).cast("B") if data.size else b"")
    digest = h.hexdigest()
    key = id(array)
    try:
        ref = weakref.ref(array, lambda _r: _ARRAY_HASHES.pop(key, None))
    except TypeError:  # pragma: no cover - arrays always take weak references
        return digest
    with _ARRAY_LOCK:
        _ARRAY_HASHES[key] = (ref, digest)
    return digest


def _attr_text(value: Any) -> str:
    if isinstance(value, Graph):
        return "graph:" + graph_hash(value)
    if isinstance(value, np.ndarray):
        return "array:" + array_hash(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_attr_text(v) for v in value) + "]"
    return repr(value)


def _read_constants(graph: Graph) -> set[int]:
    """The ids of the constants some node reads at compile time (its meta-op's ``reads``),
    and of every scalar constant (a single-node kernel compiles scalars in: ``x ** 2``)."""
    read = {id(v) for v in graph.constants if v.const is not None and np.ndim(v.const) == 0}
    for n in graph.nodes:
        try:
            positions: Iterable[int] = n.metaop.reads
        except UnsupportedOpError:  # an op no one registered: every constant input counts
            positions = range(len(n.inputs))
        for i in positions:
            if i < len(n.inputs) and n.inputs[i] is not None and n.inputs[i].const is not None:
                read.add(id(n.inputs[i]))
    return read


def graph_hash(graph: Graph, weights: bool = True) -> str:
    """The content hash of a graph: its structure (ops, attributes, types, wiring, nested
    bodies) and the hash of every constant's bytes. Value and node names do not count.

    With ``weights=False`` the *weights* count by dtype and shape only: the constants of the
    top-level graph that no op reads at compile time (``reads``), which a backend passes to
    its kernels as run-time arguments. Constants an op reads (axes, shapes), scalars (a kernel
    compiles them in) and every constant of a nested body (a fused group's body is compiled
    whole) still count by value.
    A backend that compiles weights into its code must keep the default.

    Example:
        >>> import numpy as np
        >>> from metadef.ir import parse_graph
        >>> g = parse_graph("graph g(%x: f32[n]) -> (%y) { %y: f32[n] = Relu(%x) return %y }")
        >>> h = parse_graph("graph h(%a: f32[n]) -> (%b) { %b: f32[n] = Relu(%a) return %b }")
        >>> graph_hash(g) == graph_hash(h)
        True
    """
    ids: dict[int, int] = {}
    by_value = None if weights else _read_constants(graph)
    parts: list[str] = []

    def ref(v: Value | None) -> str:
        if v is None:
            return "_"
        got = ids.get(id(v))
        if got is None:
            got = ids[id(v)] = len(ids)
            if v.const is None:
                const = ""
            elif by_value is None or id(v) in by_value:
                const = "=" + array_hash(v.const)
            else:
                const = "=weight"
            parts.append(f"v{got}:{v.type}{const};")
        return f"v{got}"

    for v in [*graph.inputs, *graph.constants]:
        ref(v)
    parts.append("|")
    for n in graph.nodes:
        ins = ",".join([ref(v) for v in n.inputs])
        outs = ",".join([ref(v) for v in n.outputs])
        attrs = ",".join([f"{k}={_attr_text(a)}" for k, a in sorted(n.attrs.items())])
        meta = ",".join([f"{k}={v!r}" for k, v in sorted(n.meta.items()) if isinstance(v, (str, int, bool))])
        parts.append(f"{n.domain}::{n.op}({ins})->{outs}{{{attrs}}}[{meta}];")
    parts.append("->" + ",".join([ref(v) for v in graph.outputs]))
    return xxhash.xxh3_128_hexdigest("".join(parts).encode())


__all__ = ["LEVELS", "CacheKey", "array_hash", "environment", "explain_difference", "graph_hash",
           "kernel_key", "model_key", "shape_key"]
