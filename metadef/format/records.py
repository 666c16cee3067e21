"""What the reader hands out about tensors: index records, verification reports, lazy constants.

Example:
    >>> report = VerifyReport(sections=2, tensors=3, bytes=2_000_000, seconds=0.001)
    >>> report.ok, round(report.gb_per_s, 1)
    (True, 2.0)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from metadef.ir.graph import Value
from metadef.shape import TensorType


class MappedValue(Value):
    """A constant Value whose array is mapped (and verified, on demand) the first time ``.const``
    is read; afterwards it behaves exactly like a plain Value."""

    def __init__(self, name: str, type: TensorType | None, loader: Any, file: Any = None) -> None:
        # Equivalent to Value.__init__(name, type, None) followed by setting the loader.
        self.name, self.type, self.producer = name, type, None
        self._const: np.ndarray | None = None
        self._loader = loader
        self.file = file
        """The open .mdef file the value is stored in (its stored form: ``metadef.export_onnx``)."""

    @property  # type: ignore[override]
    def const(self) -> np.ndarray | None:
        if self._loader is not None:
            self._const, self._loader = self._loader(), None
        return self._const

    @const.setter
    def const(self, value: np.ndarray | None) -> None:
        self._const, self._loader = value, None


@dataclass
class VerifyReport:
    """What :meth:`MdefFile.verify` checked: sections, tensors, bytes, time and every failure."""

    sections: int = 0
    tensors: int = 0
    bytes: int = 0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds else 0.0

    def __str__(self) -> str:
        head = (f"checked {self.sections} sections and {self.tensors} tensors, {self.bytes / 1e6:.1f} MB "
                f"in {self.seconds * 1e3:.1f} ms ({self.gb_per_s:.1f} GB/s): ")
        return head + ("all checksums match" if self.ok else "\n  ".join(["FAILED", *self.failures]))


@dataclass(frozen=True)
class TensorInfo:
    """One record of the tensor index, checked: name, dtype, shape, absolute offset, stored bytes,
    storage format (0 plain; see ``metadef.format.quantize``), index flags and quantization."""

    name: str
    dtype: Any
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    checksum: int
    format: int
    flags: int = 0
    quantization: dict[str, Any] | None = None


__all__ = ["MappedValue", "TensorInfo", "VerifyReport"]
