"""What a backend is: a plugin that turns a Graph into something that runs.

Backends are found by name: the built-in ones, then the Python entry-point group
``metadef.backends`` (a third-party package declares
``[project.entry-points."metadef.backends"] mychip = "mypkg:MyChipBackend"``).

Example:
    >>> get_backend("reference").name
    'reference'
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any, Protocol

import numpy as np

from metadef.core.errors import BackendError
from metadef.ir import Graph

ENTRY_POINT_GROUP = "metadef.backends"


class Executable(Protocol):
    """A compiled graph: ``run`` takes inputs by name and the values of the graph's symbols."""

    def run(self, feeds: Mapping[str, np.ndarray], symbols: Mapping[str, int]) -> list[np.ndarray]:
        """The graph outputs, in order."""
        ...


class Backend(Protocol):
    """A backend: a name and a ``compile`` that returns an Executable."""

    name: str

    def compile(self, graph: Graph, **options: Any) -> Executable:
        ...


_BUILTIN = {
    "reference": "metadef.backends.reference:ReferenceBackend",
    "x86": "metadef.backends.x86:X86Backend",
}


def plan_frees(steps: Sequence[Any], keep: set[int]) -> list[list[int]]:
    """For an executable's steps (each with ``in_ids`` and ``out_ids``, value slots in run
    order), the slots each step is the last reader of: free them right after it runs.
    ``keep``: slots that live to the end (graph outputs, constants).

    Example:
        >>> from types import SimpleNamespace as S
        >>> plan_frees([S(in_ids=[0], out_ids=[1]), S(in_ids=[1], out_ids=[2])], keep={0, 2})
        [[], [1]]
    """
    last: dict[int, int] = {}
    for k, step in enumerate(steps):
        for i in step.in_ids:
            if i is not None:
                last[i] = k
        for i in step.out_ids:
            last.setdefault(i, k)
    frees: list[list[int]] = [[] for _ in steps]
    for slot, k in last.items():
        if slot not in keep:
            frees[k].append(slot)
    return frees


def _load(spec: str) -> Any:
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


def available_backends() -> list[str]:
    """Names of every backend that can be asked for."""
    names = set(_BUILTIN)
    names |= {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return sorted(names)


def get_backend(name: str) -> Backend:
    """A backend instance by name; BackendError lists the known names when there is none."""
    if name in _BUILTIN:
        return _load(_BUILTIN[name])()
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return ep.load()()
    raise BackendError(f"unknown target {name!r}; available targets: {', '.join(available_backends())}")


__all__ = ["Backend", "ENTRY_POINT_GROUP", "Executable", "available_backends", "get_backend", "plan_frees"]
