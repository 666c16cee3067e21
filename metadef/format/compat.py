"""Format features and the version that introduced each: the check behind ``--compat-backward``.

Each :class:`Feature` has a name, the format version that first holds it, and a detector that
says whether a save uses it. Writing version X.Y fails, feature by feature and by name, when
a used feature is newer than X.Y.

Example:
    >>> from metadef.ir import parse_graph
    >>> g = parse_graph("graph g(%x: f32[b]) -> (%y) { %y: f32[b] = Relu(%x) return %y }")
    >>> [f.name for f in features_used(g, SaveOptions())][:2]
    ['core', 'symbolic_dims']
    >>> check_version(g, SaveOptions(), (1, 0))
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from metadef.format.errors import CompatError
from metadef.format.layout import FORMAT_VERSION
from metadef.ir.graph import Graph


@dataclass(frozen=True)
class SaveOptions:
    """What a save asks for beyond the graph (the detectors look at these too)."""

    alignment: int = 64
    metadata: dict[str, Any] = field(default_factory=dict)
    code: dict[str, bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class Feature:
    """One format feature: ``used(graph, options)`` says whether a save needs it."""

    name: str
    since: tuple[int, int]
    used: Callable[[Graph, SaveOptions], bool]
    doc: str = ""


def _symbolic(graph: Graph, _o: SaveOptions) -> bool:
    return any(v.type is not None and v.type.free_symbols for v in graph.values())


FEATURES: list[Feature] = [
    Feature("core", (1, 0), lambda g, o: True, "header, sections, graph, tensor index, data"),
    Feature("symbolic_dims", (1, 0), _symbolic, "dims such as batch or seq*2"),
    Feature("symbol_constraints", (1, 0), lambda g, o: bool(g.env.symbols), "ranges of symbols"),
    Feature("alignment_4096", (1, 0), lambda g, o: o.alignment > 64, "tensor alignment above 64 bytes"),
    Feature("custom_namespaces", (1, 0), lambda g, o: bool(o.metadata.get("namespaces")),
            "auxiliary custom metadata namespaces"),
    Feature("code_sections", (1, 0), lambda g, o: bool(o.code), "precompiled code per target"),
]


@contextmanager
def extra_feature(feature: Feature) -> Iterator[Feature]:
    """Register a feature for the duration of a ``with`` block (tests, plugins trying one out).

    Example:
        >>> with extra_feature(Feature("fake", (9, 0), lambda g, o: False)) as f:
        ...     f in FEATURES
        True
    """
    FEATURES.append(feature)
    try:
        yield feature
    finally:
        FEATURES.remove(feature)


def features_used(graph: Graph, options: SaveOptions) -> list[Feature]:
    """The features a save of ``graph`` with ``options`` needs, in registry order."""
    return [f for f in FEATURES if f.used(graph, options)]


def check_version(graph: Graph, options: SaveOptions, version: tuple[int, int]) -> None:
    """Refuse (CompatError) when ``version`` cannot hold the save, listing each feature by name."""
    version = (int(version[0]), int(version[1]))
    if version > FORMAT_VERSION or version < (1, 0):
        raise CompatError(f"cannot write format {version[0]}.{version[1]}: this writer writes "
                          f"1.0 to {FORMAT_VERSION[0]}.{FORMAT_VERSION[1]}")
    missing = [f for f in features_used(graph, options) if f.since > version]
    if missing:
        lines = "\n".join(f"  - {f.name} (needs {f.since[0]}.{f.since[1]}): {f.doc}" for f in missing)
        raise CompatError(f"graph {graph.name} cannot be written as format {version[0]}.{version[1]}; "
                          f"it uses {len(missing)} newer feature(s):\n{lines}\n"
                          "Write a newer version, or remove what these features need from the model.")


__all__ = ["FEATURES", "Feature", "SaveOptions", "check_version", "extra_feature", "features_used"]
