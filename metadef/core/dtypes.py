"""Element types: every ONNX tensor type numpy can hold, plus custom dtypes registered by name.

A :class:`DType` is an interned value: ``dtype("float32") is FLOAT32``. Base types are
checked strictly (no silent widening); custom dtypes register at run time and are then
resolved by name like any other.

``STRING`` (ONNX ``TensorProto.STRING``, kind ``"string"``) is held as numpy object arrays of
Python ``str`` (:func:`as_strings` makes one from bytes or fixed-width numpy strings). Only
ops that declare it take it: it belongs to no numeric type group, so a numeric op fed a string
fails its dtype check.

Example:
    >>> dtype("f32").name, dtype("float32").short, from_onnx(1).name
    ('float32', 'f32', 'float32')
    >>> from_numpy(np.dtype("int64")) is INT64
    True
    >>> from_onnx(8) is STRING, STRING.numpy
    (True, dtype('O'))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from metadef.core.errors import DTypeError


@dataclass(frozen=True, eq=False)
class DType:
    """One element type: its names, the numpy dtype that holds it and its ONNX code.

    ``onnx`` is the TensorProto.DataType number (0 for custom types); ``kind`` is one of
    ``"float"``, ``"int"``, ``"uint"``, ``"bool"``, ``"string"``; ``bits`` is the width of
    one element (0 for strings, which have none).
    """

    name: str
    short: str
    numpy: np.dtype
    onnx: int
    kind: str
    bits: int
    custom: bool = False

    @property
    def itemsize(self) -> int:
        """Bytes one element takes in a numpy array (int4 is stored one per byte)."""
        return self.numpy.itemsize

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_integer(self) -> bool:
        return self.kind in ("int", "uint")

    @property
    def is_string(self) -> bool:
        """Whether elements are text (numpy object arrays of ``str``), not numbers.

        Example:
            >>> STRING.is_string, FLOAT32.is_string
            (True, False)
        """
        return self.kind == "string"

    def __repr__(self) -> str:
        return f"DType({self.name})"

    def __str__(self) -> str:
        return self.short

    def __reduce__(self) -> tuple[Any, ...]:
        return (dtype, (self.name,))


_by_name: dict[str, DType] = {}
_by_onnx: dict[int, DType] = {}
_by_numpy: dict[np.dtype, DType] = {}


def _add(d: DType) -> DType:
    for key in (d.name, d.short):
        if key in _by_name and _by_name[key] is not d:
            raise DTypeError(f"dtype name {key!r} is already registered as {_by_name[key].name}")
    _by_name[d.name] = d
    _by_name[d.short] = d
    if d.onnx:
        _by_onnx[d.onnx] = d
    _by_numpy.setdefault(np.dtype(d.numpy), d)
    return d


def _base(name: str, short: str, np_dtype: Any, onnx: int, kind: str, bits: int) -> DType:
    return _add(DType(name, short, np.dtype(np_dtype), onnx, kind, bits))


FLOAT32 = _base("float32", "f32", np.float32, 1, "float", 32)
UINT8 = _base("uint8", "u8", np.uint8, 2, "uint", 8)
INT8 = _base("int8", "i8", np.int8, 3, "int", 8)
UINT16 = _base("uint16", "u16", np.uint16, 4, "uint", 16)
INT16 = _base("int16", "i16", np.int16, 5, "int", 16)
INT32 = _base("int32", "i32", np.int32, 6, "int", 32)
INT64 = _base("int64", "i64", np.int64, 7, "int", 64)
BOOL = _base("bool", "b8", np.bool_, 9, "bool", 8)
FLOAT16 = _base("float16", "f16", np.float16, 10, "float", 16)
FLOAT64 = _base("float64", "f64", np.float64, 11, "float", 64)
UINT32 = _base("uint32", "u32", np.uint32, 12, "uint", 32)
UINT64 = _base("uint64", "u64", np.uint64, 13, "uint", 64)
BFLOAT16 = _base("bfloat16", "bf16", ml_dtypes.bfloat16, 16, "float", 16)
FLOAT8E4M3FN = _base("float8e4m3fn", "f8e4m3fn", ml_dtypes.float8_e4m3fn, 17, "float", 8)
FLOAT8E4M3FNUZ = _base("float8e4m3fnuz", "f8e4m3fnuz", ml_dtypes.float8_e4m3fnuz, 18, "float", 8)
FLOAT8E5M2 = _base("float8e5m2", "f8e5m2", ml_dtypes.float8_e5m2, 19, "float", 8)
FLOAT8E5M2FNUZ = _base("float8e5m2fnuz", "f8e5m2fnuz", ml_dtypes.float8_e5m2fnuz, 20, "float", 8)
UINT4 = _base("uint4", "u4", ml_dtypes.uint4, 21, "uint", 4)
INT4 = _base("int4", "i4", ml_dtypes.int4, 22, "int", 4)
FLOAT4E2M1 = _base("float4e2m1", "f4e2m1", ml_dtypes.float4_e2m1fn, 23, "float", 4)
FLOAT8E8M0 = _base("float8e8m0", "f8e8m0", ml_dtypes.float8_e8m0fnu, 24, "float", 8)
UINT2 = _base("uint2", "u2", ml_dtypes.uint2, 25, "uint", 2)
INT2 = _base("int2", "i2", ml_dtypes.int2, 26, "int", 2)
FLOAT6E2M3 = _base("float6e2m3", "f6e2m3", ml_dtypes.float6_e2m3fn, 27, "float", 6)
FLOAT6E3M2 = _base("float6e3m2", "f6e3m2", ml_dtypes.float6_e3m2fn, 28, "float", 6)
STRING = _base("string", "str", np.object_, 8, "string", 0)

# ONNX codes that name types metadef cannot hold.
_UNSUPPORTED_ONNX = {
    0: "UNDEFINED",
    14: "complex64",
    15: "complex128",
}

# numpy spells some names differently from ONNX; accept both.
_ALIASES = {
    "float": "float32",
    "double": "float64",
    "half": "float16",
    "float8_e4m3fn": "float8e4m3fn",
    "float8_e4m3fnuz": "float8e4m3fnuz",
    "float8_e5m2": "float8e5m2",
    "float8_e5m2fnuz": "float8e5m2fnuz",
    "float4_e2m1fn": "float4e2m1",
    "float8_e8m0fnu": "float8e8m0",
    "float6_e2m3fn": "float6e2m3",
    "float6_e3m2fn": "float6e3m2",
}

FLOAT_TYPES = frozenset({FLOAT16, BFLOAT16, FLOAT32, FLOAT64})
INT_TYPES = frozenset({INT8, INT16, INT32, INT64, UINT8, UINT16, UINT32, UINT64})


def dtype(name: str | DType) -> DType:
    """Resolve a dtype by name (``"float32"``, ``"f32"``, a registered custom name).

    Example:
        >>> dtype("bf16") is BFLOAT16
        True
    """
    if isinstance(name, DType):
        return name
    key = _ALIASES.get(name, name)
    if key in _by_name:
        return _by_name[key]
    known = ", ".join(sorted({d.name for d in _by_name.values()}))
    raise DTypeError(f"unknown dtype {name!r}; known dtypes: {known}; "
                     "register a custom one with metadef.core.dtypes.register_dtype")


def from_onnx(code: int) -> DType:
    """The dtype of an ONNX ``TensorProto.DataType`` code.

    Example:
        >>> from_onnx(7).name
        'int64'
    """
    if code in _by_onnx:
        return _by_onnx[code]
    what = _UNSUPPORTED_ONNX.get(code, f"code {code}")
    raise DTypeError(f"ONNX element type {what} is not supported by metadef")


def from_numpy(np_dtype: Any) -> DType:
    """The dtype of a numpy dtype (or anything ``np.dtype`` accepts); object arrays and
    fixed-width numpy strings (``<U5``, ``|S5``) are :data:`STRING`.

    Example:
        >>> from_numpy(np.float16).short, from_numpy(np.dtype("<U5")).name
        ('f16', 'string')
    """
    nd = np.dtype(np_dtype)
    if nd in _by_numpy:
        return _by_numpy[nd]
    if nd.kind in ("U", "S"):
        return STRING
    raise DTypeError(f"numpy dtype {nd} has no metadef dtype")


def as_strings(data: Any, what: str = "the tensor") -> np.ndarray:
    """``data`` as a string tensor: a numpy object array of Python ``str`` of the same shape
    (bytes are decoded as UTF-8, numpy strings become ``str``); DTypeError names ``what``
    when an element is not text.

    Example:
        >>> as_strings(np.array(["café".encode(), "x"], dtype=object)).tolist()
        ['café', 'x']
        >>> as_strings(np.array(["a", "bc"])).dtype
        dtype('O')
    """
    array = data if isinstance(data, np.ndarray) else np.array(data, dtype=object)  # no '<U': it drops trailing NULs
    out = np.empty(array.shape, dtype=object)
    flat = out.reshape(-1)
    for i, item in enumerate(array.reshape(-1).tolist()):
        if isinstance(item, bytes):
            try:
                item = item.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DTypeError(f"{what}: element {i} is not valid UTF-8 ({e})") from None
        elif not isinstance(item, str):
            raise DTypeError(f"{what} must hold strings, but element {i} is "
                             f"{type(item).__name__} {item!r}")
        flat[i] = str(item)
    return out


def register_dtype(name: str, np_dtype: Any, *, short: str | None = None,
                   kind: str | None = None) -> DType:
    """Register a custom dtype at run time; afterwards ``dtype(name)`` resolves it.

    Re-registering the same name with the same numpy dtype returns the existing entry.

    Example:
        >>> q = register_dtype("myq8", np.int8, short="q8")
        >>> dtype("q8") is q
        True
    """
    nd = np.dtype(np_dtype)
    existing = _by_name.get(name)
    if existing is not None:
        if existing.custom and existing.numpy == nd:
            return existing
        raise DTypeError(f"dtype {name!r} is already registered ({existing.name}, {existing.numpy})")
    k = kind or {"f": "float", "i": "int", "u": "uint", "b": "bool"}.get(nd.kind, "float")
    return _add(DType(name, short or name, nd, 0, k, nd.itemsize * 8, custom=True))


def all_dtypes() -> list[DType]:
    """Every registered dtype, base types first."""
    seen: dict[str, DType] = {}
    for d in _by_name.values():
        seen.setdefault(d.name, d)
    return list(seen.values())


__all__ = [
    "BFLOAT16", "BOOL", "DType", "FLOAT16", "FLOAT32", "FLOAT4E2M1", "FLOAT64", "FLOAT6E2M3",
    "FLOAT6E3M2", "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "FLOAT8E8M0",
    "FLOAT_TYPES", "INT16", "INT2", "INT32", "INT4", "INT64", "INT8", "INT_TYPES", "STRING", "UINT16",
    "UINT2", "UINT32", "UINT4", "UINT64", "UINT8", "all_dtypes", "as_strings", "dtype", "from_numpy",
    "from_onnx", "register_dtype",
]
