"""Per-layer precision from a YAML file, as users write it.

```yaml
default: fp16          # every weight not named below
conv1: fp32            # a node name: the node that reads the weight
"/layer4/*": int8      # or a glob over node names
dense_final: fp64      # keep this layer's weights exactly as they are
```

Values: ``fp64``, ``fp32``, ``fp16``, ``bf16``, ``int8``, ``int4`` (also ``float32``,
``float16``...). A weight's precision is the one of the first key (in file order) matching a
node that reads it, an exact name before any glob; otherwise ``default``; otherwise the
``quantize=`` of the save. A precision never raises a weight above its own dtype (``fp64``
on a float32 weight keeps float32: the graph's types say float32, and a wider copy would hold
nothing more). Only weights of contractions are affected (``metadef.format.quantize``).

Example:
    >>> plan = PrecisionPlan.from_yaml("default: fp16\\nconv1: fp32\\n'/fc*': int8")
    >>> plan.default, plan.for_names(["conv1"]), plan.for_names(["/fc2/Gemm"]), plan.for_names(["x"])
    ('fp16', 'fp32', 'int8', 'fp16')
    >>> PrecisionPlan.from_yaml("conv1: fp8")
    Traceback (most recent call last):
    ...
    metadef.format.precision.PrecisionError: precision file: key 'conv1' has value 'fp8'; \
choose one of fp64, fp32, fp16, bf16, int8, int4 (or float64, float32, float16, bfloat16)
"""

from __future__ import annotations

import difflib
import fnmatch
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from metadef.core.errors import FormatError
from metadef.format.quantize import Weight, normalize_precision
from metadef.ir.graph import Graph

_GLOB_CHARS = frozenset("*?[")


class PrecisionError(FormatError):
    """A precision file is malformed, names an unknown precision, or a key matches no node."""


def _read_yaml(source: str | os.PathLike[str] | Mapping[str, Any], what: str) -> tuple[Any, str]:
    """Parse a mapping, a YAML path or YAML text; returns (document, where it came from)."""
    if isinstance(source, Mapping):
        return dict(source), what
    text, where = str(source), what
    looks_like_path = isinstance(source, os.PathLike) or ("\n" not in text and (
        text.endswith((".yaml", ".yml")) or Path(text).is_file()))
    if looks_like_path:
        path = Path(source)  # type: ignore[arg-type]
        try:
            text, where = path.read_text(encoding="utf-8"), f"{what} {path}"
        except OSError as e:
            raise FormatError(f"cannot read {what} {path}: {e.strerror or e}") from None
    try:
        return yaml.safe_load(text), where
    except yaml.YAMLError as e:
        raise FormatError(f"{where} is not valid YAML: {e}") from None


@dataclass(frozen=True)
class PrecisionPlan:
    """A validated precision file: ``default`` and ``rules`` (node name or glob -> precision)."""

    default: str | None = None
    rules: dict[str, str] = field(default_factory=dict)
    source: str = "precision file"

    @classmethod
    def from_dict(cls, doc: Any, source: str = "precision file") -> PrecisionPlan:
        """Validate a ``{key: precision}`` mapping; errors name the bad key and value."""
        if doc is None:
            doc = {}
        if not isinstance(doc, Mapping):
            raise PrecisionError(f"{source} must be a mapping of node name (or glob) to precision, "
                                 f"e.g. 'default: fp16', not a {type(doc).__name__}")
        rules: dict[str, str] = {}
        default = None
        for key, value in doc.items():
            if not isinstance(key, str) or not key:
                raise PrecisionError(f"{source}: key {key!r} must be a node name or a glob (a string)")
            if not isinstance(value, str):
                raise PrecisionError(f"{source}: key {key!r} has value {value!r} ({type(value).__name__}); "
                                     "write one of fp64, fp32, fp16, bf16, int8, int4")
            try:
                precision = normalize_precision(value)
            except ValueError as e:
                raise PrecisionError(f"{source}: key {key!r} has value {value!r}; {str(e).split('; ', 1)[1]}") \
                    from None
            if key == "default":
                default = precision
            else:
                rules[key] = precision
        return cls(default, rules, source)

    @classmethod
    def from_yaml(cls, source: str | os.PathLike[str] | Mapping[str, Any]) -> PrecisionPlan:
        """Read a precision file (a path, YAML text, or an already parsed mapping)."""
        doc, where = _read_yaml(source, "precision file")
        return cls.from_dict(doc, where)

    def for_names(self, node_names: Iterable[str], default: str | None = None) -> str | None:
        """The precision for a weight read by ``node_names`` (exact names first, then globs)."""
        names = list(node_names)
        for key, precision in self.rules.items():
            if key in names:
                return precision
        for key, precision in self.rules.items():
            if _GLOB_CHARS & set(key) and any(fnmatch.fnmatchcase(n, key) for n in names):
                return precision
        return self.default if self.default is not None else default

    def precision_for(self, weight: Weight, default: str | None) -> str | None:
        """What ``encode_weights`` asks: the precision of one weight (None: leave it as it is)."""
        return self.for_names([n.name for n in weight.readers], default)

    def check_against(self, graph: Graph) -> None:
        """Refuse keys that match no node of ``graph`` (a typo would otherwise do nothing)."""
        names = [n.name for n in graph.nodes]
        for key in self.rules:
            if key in names or (_GLOB_CHARS & set(key) and any(fnmatch.fnmatchcase(n, key) for n in names)):
                continue
            near = difflib.get_close_matches(key, names, n=3)
            hint = f"; did you mean {', '.join(map(repr, near))}?" if near else \
                f"; node names look like {', '.join(map(repr, names[:3]))}"
            raise PrecisionError(f"{self.source}: key {key!r} matches no node of graph {graph.name}{hint}")


def load_precision(source: str | os.PathLike[str] | Mapping[str, Any] | PrecisionPlan | None,
                   graph: Graph | None = None) -> PrecisionPlan | None:
    """A PrecisionPlan from whatever the caller holds, checked against ``graph`` when given.

    Example:
        >>> load_precision({"default": "int4"}).default
        'int4'
    """
    if source is None:
        return None
    plan = source if isinstance(source, PrecisionPlan) else PrecisionPlan.from_yaml(source)
    if graph is not None:
        plan.check_against(graph)
    return plan


__all__ = ["PrecisionError", "PrecisionPlan", "load_precision"]
