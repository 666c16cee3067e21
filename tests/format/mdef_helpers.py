"""Helpers shared by the .mdef tests: rewrite a file's version, add sections while writing."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from metadef.format import layout


def set_version(path: Path, major: int, minor: int) -> None:
    """Rewrite the version in header and trailer, with valid checksums (a file 'from the future')."""
    data = bytearray(path.read_bytes())
    header = layout.Header.unpack(data[:layout.HEADER_SIZE])
    data[:layout.HEADER_SIZE] = dataclasses.replace(header, major=major, minor=minor).pack()
    at = len(data) - layout.TRAILER_SIZE
    trailer = layout.Trailer.unpack(data[at:])
    data[at:] = dataclasses.replace(trailer, major=major, minor=minor).pack()
    path.write_bytes(bytes(data))
