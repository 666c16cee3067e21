"""``Session``: a compiled graph behind a checked, named interface.

``run`` checks every input (name, dtype, rank, each dim against the symbolic shape, symbols
agreeing across inputs, symbol constraints) before anything executes, so a wrong input gets a
clear error instead of a crash deep inside a kernel.

Example:
    >>> import numpy as np, metadef as md
    >>> from metadef.ir import parse_graph
    >>> g = parse_graph("graph g(%x: f32[n]) -> (%y) { %y: f32[n] = Relu(%x) return %y }")
    >>> sess = md.compile(g, target="reference")
    >>> sess.run({"x": np.array([-1.0, 2.0], np.float32)})["y"]
    array([0., 2.], dtype=float32)
    >>> [str(i) for i in sess.inputs]
    ['x: f32[n]']

A graph specialized on sequence or optional inputs (see :mod:`metadef.ir.structure`) takes a
list of arrays for a sequence input and ``None`` for an absent optional, and returns lists and
``None`` for such outputs; ``inputs`` and ``outputs`` list the flat tensors
(``seq.0``, ``seq.1``, ...), ``structure`` what the user sees.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

import numpy as np

from metadef.core.dtypes import DType, as_strings
from metadef.core.errors import BackendError, DTypeError, InputError
from metadef.core.run_profile import RunProfile
from metadef.ir import Graph
from metadef.ir.structure import IOStructure
from metadef.shape import Dim, ShapeEnv, bind_shape, format_shape


class Runnable(Protocol):
    """What a backend's compile returns (see ``backends.base.Executable``)."""

    def run(self, feeds: Mapping[str, np.ndarray], symbols: Mapping[str, int]) -> list[np.ndarray]:
        ...


@dataclass(frozen=True)
class IOSpec:
    """One input or output of a session: name, dtype and symbolic shape."""

    name: str
    dtype: DType
    shape: tuple[Dim, ...] | None

    def __str__(self) -> str:
        return f"{self.name}: {self.dtype.short}{format_shape(self.shape)}"


def _spec(v: Any) -> IOSpec:
    if v.type is None:
        raise InputError(f"value %{v.name} has no type: run shape inference before compiling")
    return IOSpec(v.name, v.type.dtype, v.type.shape)


CHECKED_SHAPES = 64
"""How many distinct input shapes a session remembers as checked (their symbols' values), so
a run with the same shapes skips the symbolic checks."""


class Session:
    """Runs a compiled graph: ``session.run({"name": array}) -> {"name": array}``."""

    def __init__(self, graph: Graph, executable: Runnable, target: str) -> None:
        self.graph = graph
        self.executable = executable
        self.target = target
        self.inputs: list[IOSpec] = [_spec(v) for v in graph.inputs]
        self.outputs: list[IOSpec] = [_spec(v) for v in graph.outputs]
        self._output_names = [spec.name for spec in self.outputs]
        self.env: ShapeEnv = graph.env
        self.structure: IOStructure | None = IOStructure.of(graph)
        """Which inputs and outputs are sequences or optionals (None: tensors only)."""
        self._checked: dict[tuple[tuple[tuple[int, ...], np.dtype], ...], Mapping[str, int]] = {}
        """The symbols' values (read-only) of input shapes and dtypes that passed the checks."""

    def _known(self, feeds: Mapping[str, Any]) -> tuple[Any, Mapping[str, int] | None]:
        """The feeds' key (see :meth:`_key`) and, where these exact shapes and dtypes passed
        the checks before, their symbols' values (else None)."""
        key = self._key(feeds)
        return key, (self._checked.get(key) if key is not None else None)

    def _check(self, feeds: Mapping[str, Any], known: tuple[Any, Mapping[str, int] | None] | None = None
               ) -> tuple[Mapping[str, np.ndarray], Mapping[str, int]]:
        key, symbols = known or self._known(feeds)
        if symbols is not None:  # these exact shapes and dtypes passed the checks before
            return feeds, symbols  # (feeds holds exactly the inputs: the key says so)
        arrays, checked = self._check_all(feeds)
        symbols = MappingProxyType(checked)
        if key is not None:
            if len(self._checked) >= CHECKED_SHAPES:
                self._checked.clear()
            self._checked[key] = symbols
        return arrays, symbols

    def _key(self, feeds: Mapping[str, Any]) -> tuple[tuple[tuple[int, ...], np.dtype], ...] | None:
        """The inputs' shapes and dtypes, when every feed is an array of this model's inputs
        (none of them strings: those are checked element by element on every run)."""
        names = self._plain_names
        if names is None or len(feeds) != len(names):
            return None
        key = []
        for name in names:
            arr = feeds.get(name)
            if type(arr) is not np.ndarray:
                return None
            key.append((arr.shape, arr.dtype))
        return tuple(key)

    @functools.cached_property
    def _plain_names(self) -> tuple[str, ...] | None:
        """The inputs' names, or None where one is a string input."""
        return None if any(spec.dtype.is_string for spec in self.inputs) else tuple(s.name for s in self.inputs)

    def _check_all(self, feeds: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, int]]:
        known = {s.name for s in self.inputs}
        unknown = [k for k in feeds if k not in known]
        if unknown:
            raise InputError(f"unknown input name(s) {unknown}; this model's inputs are: "
                             + ", ".join(str(s) for s in self.inputs))
        arrays: dict[str, np.ndarray] = {}
        symbols: dict[str, int] = {}
        for spec in self.inputs:
            if spec.name not in feeds:
                raise InputError(f"missing input {spec}; pass it in the feeds dict")
            arr = feeds[spec.name]
            if not isinstance(arr, np.ndarray):
                arr = np.array(arr, dtype=object) if spec.dtype.is_string else np.asarray(arr)
            if spec.dtype.is_string:
                if arr.dtype.kind not in "USO":
                    raise InputError(f"input {spec.name!r} has dtype {arr.dtype}, expected string"
                                     f"{format_shape(spec.shape)}: feed str (np.array([...], dtype=object), "
                                     "or a numpy string array)")
                arr = _strings(arr, spec)
            elif arr.dtype.kind in "USO":
                raise InputError(f"input {spec.name!r} has dtype {arr.dtype} (strings or Python objects), but it "
                                 f"is {spec.dtype.name}{format_shape(spec.shape)}: feed a numeric array "
                                 f"(np.asarray(x, np.{spec.dtype.numpy.name}))")
            if arr.dtype != spec.dtype.numpy:
                raise InputError(f"input {spec.name!r} has dtype {arr.dtype}, expected {spec.dtype.name} "
                                 f"(shape {format_shape(spec.shape)}); convert it with "
                                 f".astype(np.{spec.dtype.numpy.name})")
            if spec.shape is not None:
                why = bind_shape(spec.shape, arr.shape, symbols)
                if why is not None:
                    raise InputError(f"input {spec.name!r} has shape {list(arr.shape)}, expected "
                                     f"{format_shape(spec.shape)}: {why}")
            arrays[spec.name] = arr
        bad = self.env.check(symbols)
        if bad:
            raise InputError("input shapes break the model's constraints: " + "; ".join(bad))
        return arrays, symbols

    def run(self, feeds: Mapping[str, Any],
            outputs: Sequence[str] | Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Run on named inputs; returns every output (or the named ones) by name.

        ``outputs``: the names of the outputs to return, or a dict of caller buffers by output
        name (C-contiguous, of the output's dtype and shape for these inputs), which this run
        writes in place and returns with the other outputs. ``run`` may be called from several
        threads at once. A sequence input takes a list of arrays, an absent optional ``None``;
        such outputs come back as lists and ``None`` (caller buffers are named by the flat
        outputs then, ``seq.0``, ``seq.1``, ...).

        Example:
            >>> import numpy as np, metadef as md
            >>> from metadef.ir import parse_graph
            >>> g = parse_graph("graph g(%x: f32[n]) -> (%y) { %y: f32[n] = Neg(%x) return %y }")
            >>> sess = md.compile(g, target="x86")
            >>> buffer = np.empty(2, np.float32)
            >>> sess.run({"x": np.array([1, -2], np.float32)}, outputs={"y": buffer})["y"] is buffer
            True
            >>> buffer
            array([-1.,  2.], dtype=float32)
        """
        names = self._output_names
        known = None
        if self.structure is None:
            known = self._known(feeds)
            if known[1] is not None and outputs is None:  # the common case first: dispatch is latency
                return dict(zip(names, self.executable.run(feeds, known[1])))
        else:  # lists and None -> the flat tensors
            feeds = self.structure.flatten_feeds(feeds, [spec.name for spec in self.inputs])
        arrays, symbols = self._check(feeds, known)
        if outputs is None:
            return self._named(names, self.executable.run(arrays, symbols))
        if isinstance(outputs, Mapping):
            unknown = [o for o in outputs if o not in names]
            if unknown:
                raise InputError(f"outputs= names unknown output(s) {unknown}; outputs are " + ", ".join(names))
            buffers = [outputs.get(name) for name in names]
            if getattr(self.executable, "writes_outputs", False):
                results = self.executable.run(arrays, symbols, outputs=buffers)  # type: ignore[call-arg]
            else:
                results = [_fill(b, r, name) for b, r, name in
                           zip(buffers, self.executable.run(arrays, symbols), names)]
            return self._named(names, results)
        named = self._named(names, self.executable.run(arrays, symbols))
        missing = [o for o in outputs if o not in named]
        if missing:
            raise InputError(f"unknown output name(s) {missing}; outputs are " + ", ".join(named))
        return {o: named[o] for o in outputs}

    def profile(self, feeds: Mapping[str, Any], runs: int = 10, warmup: int = 2) -> RunProfile:
        """Where a run's time goes: the inputs checked as ``run`` checks them, then ``warmup``
        runs and ``runs`` timed runs, each node (for the x86 backend, each group of native
        calls run at once) timed on its own; the medians. ``print(profile)`` shows the slowest
        nodes and the time per op.

        Example:
            >>> import numpy as np, metadef as md
            >>> from metadef.ir import parse_graph
            >>> g = parse_graph("graph g(%x: f32[n]) -> (%y) { %y: f32[n] = Neg(%x) @neg return %y }")
            >>> p = md.compile(g, target="x86").profile({"x": np.ones(4, np.float32)}, runs=3)
            >>> [(r.node, r.op) for r in p.rows], p.runs, p.symbols
            ([('neg', 'Neg')], 3, {'n': 4})
        """
        profile = getattr(self.executable, "profile", None)
        if profile is None:
            raise BackendError(f"the {self.target} backend cannot profile a run (x86 and reference can)")
        if self.structure is not None:
            feeds = self.structure.flatten_feeds(feeds, [spec.name for spec in self.inputs])
        arrays, symbols = self._check(feeds)
        return profile(arrays, symbols, runs=runs, warmup=warmup)

    def _named(self, names: list[str], results: Sequence[Any]) -> dict[str, Any]:
        """The results by output name: user-level (lists, None) when the graph has a structure."""
        if self.structure is None:
            return dict(zip(names, results))
        return self.structure.unflatten(results)

    def __repr__(self) -> str:
        ins = ", ".join(str(s) for s in self.inputs)
        outs = ", ".join(str(s) for s in self.outputs)
        return f"Session[{self.target}]({ins}) -> ({outs})"


def _strings(arr: np.ndarray, spec: IOSpec) -> np.ndarray:
    """A string input as the object array of ``str`` the graph takes (numpy strings and bytes
    converted; an object array of ``str`` passes as is)."""
    if arr.dtype == object and all(type(s) is str for s in arr.reshape(-1).tolist()):
        return arr
    try:
        return as_strings(arr, f"input {spec.name!r}")
    except DTypeError as e:
        raise InputError(f"{e}; a string input takes str (or UTF-8 bytes)") from None


def _fill(buffer: np.ndarray | None, result: np.ndarray, name: str) -> np.ndarray:
    """``result`` copied into the caller's ``buffer`` (checked), or ``result`` itself."""
    if buffer is None:
        return result
    if not isinstance(buffer, np.ndarray) or buffer.shape != result.shape or buffer.dtype != result.dtype:
        got = f"{buffer.dtype}{list(buffer.shape)}" if isinstance(buffer, np.ndarray) else type(buffer).__name__
        raise InputError(f"the buffer for output {name!r} is {got}; this run makes {result.dtype}{list(result.shape)}")
    if not buffer.flags.writeable:
        raise InputError(f"the buffer for output {name!r} is read-only")
    np.copyto(buffer, result)
    return buffer


__all__ = ["IOSpec", "Runnable", "Session"]
