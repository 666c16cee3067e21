"""Loader configuration: how ``metadef.load`` opens a .mdef file, from YAML, validated.

```yaml
execution:
  parallel_parse: true      # verify checksums and read ahead on max_threads threads (false: one)
  max_threads: 4            # or "auto" (the CPU count)
memory:
  mmap_enabled: true        # map the file (false: read it into private memory, range by range)
  prefetch_buffer: 256MB    # bytes read ahead of use: 0 (off), 64KiB, 256MB, 1GiB ... (MB = 10^6, MiB = 2^20)
safety:
  checksum_verify: on_demand  # always | on_demand | never
  version_strict: true      # refuse a file newer than this reader (false: read it and warn)
  trusted_code_hashes: []   # "blake2b-256:<hex>" of code sections built elsewhere to run
```

What each key does in ``metadef.load``: ``max_threads`` threads (one unless
``parallel_parse``) check every tensor's checksum at open under ``always``, and run the
:class:`~metadef.format.loader.DynamicLoader` that reads tensors ahead of their first use
(checking them under ``on_demand``) within ``prefetch_buffer`` bytes; ``trusted_code_hashes``
lists the precompiled code sections (``metadef.save(precompile=...)``) to use although they
were built on another machine (``MdefFile.code_hash`` prints the hash). JSON and graph
decoding hold Python's GIL, so they run on the caller's thread whatever the settings.

Every key is optional; an unknown or ill-typed key is an error that names it and what it
allows.

Example:
    >>> cfg = LoaderConfig.from_yaml("memory:\\n  prefetch_buffer: 256MB\\nsafety:\\n  checksum_verify: always")
    >>> cfg.prefetch_buffer, cfg.checksum_verify, cfg.mmap_enabled
    (256000000, 'always', True)
    >>> LoaderConfig.from_dict({"memory": {"mmap_enable": True}})
    Traceback (most recent call last):
    ...
    metadef.runtime.loader_config.LoaderConfigError: loader config: unknown key 'memory.mmap_enable' \
(did you mean 'memory.mmap_enabled'?); the keys of 'memory' are mmap_enabled, prefetch_buffer
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from metadef.core.errors import MetadefError

CHECKSUM_MODES = ("always", "on_demand", "never")
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "k": 10**3, "m": 10**6, "g": 10**9}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


class LoaderConfigError(MetadefError, ValueError):
    """A loader configuration key is unknown, or its value has the wrong type or range."""


def parse_size(value: Any, key: str = "size") -> int:
    """Bytes from ``256MB``, ``64KiB``, ``1.5GB`` or an integer.

    Example:
        >>> parse_size("256MB"), parse_size("64KiB"), parse_size(0)
        (256000000, 65536, 0)
    """
    if isinstance(value, bool):
        raise LoaderConfigError(f"loader config: {key} must be a size such as 256MB or 64KiB, got {value!r}")
    if isinstance(value, int) and value >= 0:
        return value
    m = _SIZE.match(value) if isinstance(value, str) else None
    if m is None or m.group(2).lower() not in _UNITS:
        raise LoaderConfigError(f"loader config: {key} must be a size such as 256MB, 64KiB or a byte count "
                                f"(units B, KB, MB, GB, KiB, MiB, GiB), got {value!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _bool(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise LoaderConfigError(f"loader config: {key} must be true or false, got {value!r} "
                                f"({type(value).__name__})")
    return value


def _threads(value: Any, key: str) -> int | None:
    if value == "auto" or value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1024:
        raise LoaderConfigError(f"loader config: {key} must be an integer from 1 to 1024 or \"auto\", "
                                f"got {value!r}")
    return value


_HASH = re.compile(r"^blake2b-256:[0-9a-f]{64}$")


def _hashes(value: Any, key: str) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(h, str) and _HASH.match(h) for h in items):
        raise LoaderConfigError(f"loader config: {key} must be a list of \"blake2b-256:<64 hex digits>\" "
                                f"(as MdefFile.code_hash gives them), got {value!r}")
    return tuple(items)


def _choice(value: Any, key: str) -> str:
    if value not in CHECKSUM_MODES:
        raise LoaderConfigError(f"loader config: {key} must be one of {', '.join(CHECKSUM_MODES)}, got {value!r}")
    return str(value)


# (section, key) -> (field name, validator)
_SCHEMA: dict[str, dict[str, tuple[str, Callable[[Any, str], Any]]]] = {
    "execution": {"parallel_parse": ("parallel_parse", _bool), "max_threads": ("max_threads", _threads)},
    "memory": {"mmap_enabled": ("mmap_enabled", _bool), "prefetch_buffer": ("prefetch_buffer", parse_size)},
    "safety": {"checksum_verify": ("checksum_verify", _choice), "version_strict": ("version_strict", _bool),
               "trusted_code_hashes": ("trusted_code_hashes", _hashes)},
}


def _unknown(key: str, choices: list[str], where: str) -> LoaderConfigError:
    near = difflib.get_close_matches(key, choices, n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    return LoaderConfigError(f"loader config: unknown key {key!r}{hint}; {where}")


@dataclass(frozen=True)
class LoaderConfig:
    """What ``metadef.load`` does; each field is one YAML key (see the module docstring)."""

    parallel_parse: bool = True
    max_threads: int | None = None
    mmap_enabled: bool = True
    prefetch_buffer: int = 0
    """Off by default: measured here, reading ahead never beat first-use reads of the mapped file
    (page cache warm or cold: 0-30 % slower to touch every weight); set it for slow storage."""
    checksum_verify: str = "on_demand"
    version_strict: bool = True
    trusted_code_hashes: tuple[str, ...] = ()

    @property
    def threads(self) -> int:
        """``max_threads``, with ``auto`` resolved to the CPU count."""
        return self.max_threads or os.cpu_count() or 1

    @property
    def loader_threads(self) -> int:
        """The threads that verify and read ahead: ``threads`` with ``parallel_parse``, else 1."""
        return self.threads if self.parallel_parse else 1

    @classmethod
    def from_dict(cls, doc: Any) -> LoaderConfig:
        """Validate a nested mapping ``{"execution": {...}, "memory": {...}, "safety": {...}}``."""
        if doc is None:
            return cls()
        if not isinstance(doc, Mapping):
            raise LoaderConfigError(f"loader config must be a mapping with sections {', '.join(_SCHEMA)}, "
                                    f"got {type(doc).__name__}")
        values: dict[str, Any] = {}
        for section, body in doc.items():
            if section not in _SCHEMA:
                raise _unknown(str(section), list(_SCHEMA), f"the sections are {', '.join(_SCHEMA)}")
            if body is None:
                continue
            if not isinstance(body, Mapping):
                raise LoaderConfigError(f"loader config: {section} must be a mapping of "
                                        f"{', '.join(_SCHEMA[section])}, got {body!r}")
            for key, value in body.items():
                if key not in _SCHEMA[section]:
                    choices = [f"{section}.{k}" for k in _SCHEMA[section]]
                    raise _unknown(f"{section}.{key}", choices,
                                   f"the keys of {section!r} are {', '.join(_SCHEMA[section])}")
                name, check = _SCHEMA[section][key]
                values[name] = check(value, f"{section}.{key}")
        return cls(**values)

    @classmethod
    def from_yaml(cls, source: str | os.PathLike[str]) -> LoaderConfig:
        """A config from a YAML file's path or from YAML text."""
        text, where = str(source), "loader config"
        one_line = text.strip() and "\n" not in text and ":" not in text
        if isinstance(source, os.PathLike) or one_line or Path(text).is_file():
            try:
                text = Path(source).read_text(encoding="utf-8")
            except OSError as e:
                raise LoaderConfigError(f"cannot read loader config {source}: {e.strerror or e}") from None
            where = f"loader config {source}"
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise LoaderConfigError(f"{where} is not valid YAML: {e}") from None
        return cls.from_dict(doc)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """The nested form, as YAML would hold it (``from_dict(to_dict())`` gives it back)."""
        own = dataclasses.asdict(self)
        out: dict[str, dict[str, Any]] = {}
        for section, keys in _SCHEMA.items():
            out[section] = {key: own[name] for key, (name, _check) in keys.items()}
        out["execution"]["max_threads"] = self.max_threads or "auto"
        out["safety"]["trusted_code_hashes"] = list(self.trusted_code_hashes)
        return out

    def open_options(self) -> dict[str, Any]:
        """The keyword arguments of ``metadef.format.open_mdef`` this config sets."""
        return {"checksum_verify": self.checksum_verify, "version_strict": self.version_strict,
                "mmap_enabled": self.mmap_enabled, "threads": self.loader_threads}

    def loader_options(self) -> dict[str, Any]:
        """The keyword arguments of ``metadef.format.loader.DynamicLoader`` this config sets."""
        return {"budget": self.prefetch_buffer, "threads": self.loader_threads}


def as_loader_config(config: LoaderConfig | Mapping[str, Any] | str | os.PathLike[str] | None) -> LoaderConfig:
    """Whatever ``load(config=...)`` was given (a LoaderConfig, a dict, a YAML path or text).

    Example:
        >>> as_loader_config({"safety": {"version_strict": False}}).version_strict
        False
    """
    if config is None:
        return LoaderConfig()
    if isinstance(config, LoaderConfig):
        return config
    if isinstance(config, Mapping):
        return LoaderConfig.from_dict(config)
    if isinstance(config, str | os.PathLike):
        return LoaderConfig.from_yaml(config)
    raise LoaderConfigError(f"config must be a LoaderConfig, a dict or a YAML path, not {type(config).__name__}")


__all__ = ["CHECKSUM_MODES", "LoaderConfig", "LoaderConfigError", "as_loader_config", "parse_size"]
