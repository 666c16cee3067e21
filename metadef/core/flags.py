"""Typed environment flags, read when asked (so tests can set them with monkeypatch).

Example:
    >>> import os
    >>> os.environ["METADEF_DEBUG"] = "1"
    >>> DEBUG.get()
    True
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _parse_bool(name: str, text: str) -> bool:
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(f"environment flag {name}={text!r}: expected one of 1/0, true/false, yes/no, on/off")


@dataclass(frozen=True)
class Flag(Generic[T]):
    """One environment variable with its type, default and meaning."""

    name: str
    default: Callable[[], T]
    parse: Callable[[str, str], T]
    help: str

    def get(self) -> T:
        """The flag's current value: the environment's if set, else the default."""
        text = os.environ.get(self.name)
        return self.default() if text is None else self.parse(self.name, text)


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "metadef"


DEBUG: Flag[bool] = Flag("METADEF_DEBUG", lambda: False, _parse_bool,
                         "log every fusion and compile decision")
VERIFY: Flag[bool] = Flag("METADEF_VERIFY", lambda: False, _parse_bool,
                          "run the IR verifier after every pass")
STRICT_SHAPES: Flag[bool] = Flag("METADEF_STRICT_SHAPES", lambda: False, _parse_bool,
                                 "treat suspicious but valid shapes (a Slice end past its dim) as errors")
CACHE_DIR: Flag[Path] = Flag("METADEF_CACHE_DIR", _default_cache_dir, lambda _n, t: Path(t),
                             "where compiled code is cached on disk")

ISA_LEVELS = ("sse4.2", "avx", "avx2", "avx512")
"""The vector ISA levels ``METADEF_MAX_ISA`` may name, oldest first."""


def _parse_isa(name: str, text: str) -> str | None:
    level = text.strip().lower()
    if level in ISA_LEVELS:
        return level
    if level in ("", "all", "host"):
        return None
    raise ValueError(f"environment flag {name}={text!r}: expected one of {', '.join(ISA_LEVELS)} (or unset: all "
                     "the CPU has)")


MAX_ISA: Flag[str | None] = Flag("METADEF_MAX_ISA", lambda: None, _parse_isa,
                                 "the newest vector ISA generated code may use (sse4.2, avx, avx2, avx512; "
                                 "default: all the CPU has), read once a process")
ALL_FLAGS = (DEBUG, VERIFY, STRICT_SHAPES, CACHE_DIR, MAX_ISA)

__all__ = ["ALL_FLAGS", "CACHE_DIR", "DEBUG", "ISA_LEVELS", "MAX_ISA", "Flag", "STRICT_SHAPES", "VERIFY"]
