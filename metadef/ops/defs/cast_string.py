"""Casting between string tensors and numbers, as ONNX Runtime does it (the C library's
conversions, in the "C" locale). ONNX's Cast text leaves most of this open ("plain
floating-point representation"; other text "is an undefined behavior").

Numbers to text (:func:`format_numbers`):

- a float of any width is read exactly (as float64) and printed as printf's ``%.8g``: eight
  significant digits, rounded half to even on the exact binary value, trailing zeros dropped,
  an exponent (``1e+20``, ``1e-07``) below 1e-4 or from 1e8 up; ``-0`` keeps its sign. NaN is
  ``"NaN"`` (whatever its sign), infinities ``"INF"`` and ``"-INF"``. Eight digits do not always
  name a float32 again (about 1.5% of float32 bit patterns read back as a neighbour, one unit
  in the last place away) and float64 loses everything past them: this is ONNX Runtime's text,
  not a round trip. float16 and bfloat16 do read back exactly.
- integers of any width in decimal; bool ``"1"`` or ``"0"``.

Text to floats (:func:`parse_floats`, C's ``strtod``): spaces (`` \\t\\n\\v\\f\\r``, ASCII
only) are skipped, then the longest prefix that is a number is read and the rest ignored
(``"3abc"`` is 3, ``"1,5"`` is 1, ``"1e"`` is 1). A number is ``[+-]`` then a decimal
(``12``, ``.5``, ``5.``, ``-2.5e-3``), a hexadecimal float (``0x1.8p1``), ``inf`` or
``infinity``, or ``nan`` (case-insensitive, ``nan(...)`` too), correctly rounded to float64.
Text with no such prefix (``""``, ``"abc"``, ``"."``, a non-ASCII digit) fails, and so does a
number float64 cannot hold: beyond its range (``"1e400"``) or below its normal range and not
exact (``"1e-310"``, ``"1e-400"``; ``"0x1p-1074"`` is exact and reads). A narrower target
(float16, bfloat16, float8, int4, ...) takes the float64 through float32, as ONNX Runtime does;
``cast_text`` in :mod:`metadef.ops.defs.elementwise` does that step.

Text to integers (:func:`parse_integers`, C++'s ``std::stoll``, or ``std::stoull`` for unsigned
targets and bool): spaces, ``[+-]``, then decimal digits, the rest ignored (``"3.9"`` is 3,
``"0x10"`` is 0). The number must fit int64 (uint64, negated modulo 2**64 after a ``-``, for
``stoull``), else the cast fails; it is then wrapped to the target's width (``"200"`` is -56 as
int8, ``"-1"`` is 255 as uint8), and bool is "not zero". Text with no digits fails.

A failure is a :class:`~metadef.core.errors.BackendError` naming the element, its text and
the rule; ONNX Runtime fails the same texts (its message says only ``stod``, ``stoll`` or
``stoull``).

Example:
    >>> format_numbers(np.array([0.1, 1e20, -0.0, np.nan, -np.inf], np.float32)).tolist()
    ['0.1', '1e+20', '-0', 'NaN', '-INF']
    >>> parse_floats(np.array([" 1e3", "-INF", "0x1p-2", "3abc"], dtype=object)).tolist()
    [1000.0, -inf, 0.25, 3.0]
    >>> parse_integers(np.array(["+5", "200", "-1", "3.9"], dtype=object), np.dtype(np.uint8)).tolist()
    [5, 200, 255, 3]
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction

import numpy as np

from metadef.core.dtypes import as_strings
from metadef.core.errors import BackendError

_SPACES = "[ \t\n\v\f\r]*"
_FLOAT = re.compile(
    _SPACES + r"(?P<sign>[+-]?)(?:(?P<inf>inf(?:inity)?)|(?P<nan>nan)"
    r"|0x(?P<hex>[0-9a-f]+\.?[0-9a-f]*|\.[0-9a-f]+)(?:p(?P<binexp>[+-]?[0-9]+))?"
    r"|(?P<dec>[0-9]+\.?[0-9]*|\.[0-9]+)(?:e(?P<exp>[+-]?[0-9]+))?)",
    re.ASCII | re.IGNORECASE)
_INTEGER = re.compile(_SPACES + r"(?P<sign>[+-]?)(?P<digits>[0-9]+)", re.ASCII)

_SMALLEST_NORMAL = float(np.finfo(np.float64).smallest_normal)
_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(2 ** 63), 2 ** 63 - 1, 2 ** 64 - 1
_FLOAT_RULE = "a float is [+-] then decimal digits, 0x-hex digits, inf or nan, as C's strtod reads"


class _Unreadable(ValueError):
    """One element's text is no number of the kind asked for (the message says why)."""


def format_numbers(x: np.ndarray) -> np.ndarray:
    """The string tensor ONNX Runtime's Cast makes of numbers or bools (see the module doc).

    Example:
        >>> format_numbers(np.array([[3.0, 1e-7], [12345.678, 1/3]])).tolist()
        [['3', '1e-07'], ['12345.678', '0.33333333']]
        >>> format_numbers(np.array([True, False])).tolist(), format_numbers(np.array([-7], np.int8)).tolist()
        (['1', '0'], ['-7'])
    """
    x = np.asarray(x)
    if x.dtype == np.bool_:
        items = ["1" if b else "0" for b in x.reshape(-1).tolist()]
    elif x.dtype.kind in "iu":
        items = [str(i) for i in x.reshape(-1).tolist()]
    elif _is_integer(x.dtype):  # int4, uint4, int2, uint2 (ml_dtypes)
        items = [str(i) for i in x.astype(np.int64).reshape(-1).tolist()]
    else:
        with np.errstate(invalid="ignore"):  # a signalling NaN is still NaN
            items = [_format_float(v) for v in x.astype(np.float64).reshape(-1).tolist()]
    out = np.empty(x.shape, dtype=object)
    out.reshape(-1)[:] = items
    return out


def _format_float(v: float) -> str:
    if v != v:
        return "NaN"
    if v in (float("inf"), float("-inf")):
        return "INF" if v > 0 else "-INF"
    return f"{v:.8g}"


def _is_integer(dt: np.dtype) -> bool:
    """Whether ``dt`` holds integers: numpy's, or ml_dtypes' narrow ones (int4, uint2, ...)."""
    return dt.kind in "iu" or dt.name.startswith(("int", "uint"))


def parse_floats(x: np.ndarray, target: str = "float64") -> np.ndarray:
    """Each element of the string tensor ``x`` read as C's ``strtod`` reads it, as float64
    (``target`` names the cast's target type in errors).

    Example:
        >>> parse_floats(np.array(["3.14", "+INF", "nan(1)", "1.e2", "0x10"], dtype=object)).tolist()
        [3.14, inf, nan, 100.0, 16.0]
        >>> parse_floats(np.array([["1"], ["1e400"]], dtype=object), "float32")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        metadef.core.errors.BackendError: Cast ... to float32: element [1, 0] ..., '1e400', is beyond float64's range
    """
    return _parse(x, _read_float, np.dtype(np.float64), target)


def parse_integers(x: np.ndarray, target: np.dtype) -> np.ndarray:
    """Each element of the string tensor ``x`` read as C++'s ``std::stoll`` reads it (``std::stoull``
    for unsigned ``target`` and bool), then wrapped to ``target``'s width (bool: not zero).

    Example:
        >>> parse_integers(np.array([" 7 ", "-129", "12abc"], dtype=object), np.dtype(np.int8)).tolist()
        [7, 127, 12]
        >>> parse_integers(np.array(["0", "-1", "2"], dtype=object), np.dtype(np.bool_)).tolist()
        [False, True, True]
    """
    target = np.dtype(target)
    if target.kind in "ub":
        wide = _parse(x, _read_unsigned, np.dtype(np.uint64), target.name)
    else:
        wide = _parse(x, _read_signed, np.dtype(np.int64), target.name)
    return wide != 0 if target == np.bool_ else wide.astype(target)  # a C cast: wraps to the width


def _parse(x: np.ndarray, read: Callable[[str], float | int], dtype: np.dtype, target: str) -> np.ndarray:
    """``read`` applied to each element of ``x``; the first unreadable one fails the cast."""
    texts = as_strings(x, "Cast's string input")
    flat = texts.reshape(-1).tolist()
    out = np.empty(len(flat), dtype)
    for i, text in enumerate(flat):
        try:
            out[i] = read(text)
        except _Unreadable as e:
            where = i if texts.ndim <= 1 else [int(k) for k in np.unravel_index(i, texts.shape)]
            raise BackendError(f"Cast from string to {target}: element {where} of the string tensor "
                               f"{list(texts.shape)}, {text[:80]!r}, {e}") from None
    return out.reshape(texts.shape)


def _read_float(text: str) -> float:
    m = _FLOAT.match(text)
    if m is None:
        raise _Unreadable(f"is not a number ({_FLOAT_RULE})")
    sign = -1.0 if m["sign"] == "-" else 1.0
    if m["inf"]:
        return sign * float("inf")
    if m["nan"]:
        return sign * float("nan")
    if m["hex"] is not None:
        value, exact = _hex_value(m["hex"], m["binexp"])
    else:
        value, exact = _decimal_value(m["dec"], m["exp"])
    if value == float("inf"):
        raise _Unreadable("is beyond float64's range")
    if not exact:  # strtod's ERANGE on underflow
        raise _Unreadable("is below float64's normal range and not exact in it (it underflows)")
    return sign * value


def _decimal_value(digits: str, exponent: str | None) -> tuple[float, bool]:
    """A decimal's float64 (correctly rounded), and False where that is below the normal range
    and not exact."""
    value = float(digits + ("e" + exponent if exponent else ""))  # huge exponents give inf or 0
    if value >= _SMALLEST_NORMAL:
        return value, True
    whole, _, fraction = digits.partition(".")
    return value, _exact(value, whole + fraction, _exponent(exponent) - len(fraction), 10)


def _hex_value(digits: str, exponent: str | None) -> tuple[float, bool]:
    """A hexadecimal float's float64 (rounded half to even), and False where that is below the
    normal range and not exact."""
    whole, _, fraction = digits.partition(".")
    mantissa = (whole + fraction).lstrip("0")
    power = _exponent(exponent) - 4 * len(fraction)  # the value is int(mantissa, 16) * 2**power
    top = power + 4 * len(mantissa)                  # and below 2**top, at least 2**(top - 4)
    if not mantissa or top < -1100:
        value = 0.0
    elif top - 4 >= 1024:
        return float("inf"), True
    else:
        try:
            value = float.fromhex(f"0x{mantissa}p{power}")
        except OverflowError:  # rounds up to 2**1024
            return float("inf"), True
    if value >= _SMALLEST_NORMAL:
        return value, True
    return value, _exact(value, mantissa, power, 16)


def _exact(value: float, mantissa: str, power: int, base: int) -> bool:
    """Whether ``int(mantissa, base) * base**power`` (``power`` in digits: a power of 2 for hex)
    is ``value``, a float64 below the normal range (zero included)."""
    mantissa = mantissa.lstrip("0")
    if not mantissa:
        return value == 0.0
    if value == 0.0:
        return False
    trimmed = mantissa.rstrip("0")
    power += (len(mantissa) - len(trimmed)) * (4 if base == 16 else 1)
    if len(trimmed) > 800:  # a float64 below 2**-1022 has at most 767 significant digits
        return False
    scale = Fraction(2) ** power if base == 16 else Fraction(10) ** power
    return Fraction(int(trimmed, base)) * scale == Fraction(value)


def _exponent(text: str | None) -> int:
    """An exponent's digits as an int (leading zeros do not count towards Python's limit on
    digits; past 4000 digits any exponent decides alone, so 10**4000 stands in)."""
    if not text:
        return 0
    sign, digits = (-1, text[1:]) if text[0] == "-" else (1, text.lstrip("+"))
    digits = digits.lstrip("0") or "0"
    return sign * (int(digits) if len(digits) <= 4000 else 10 ** 4000)


def _read_signed(text: str) -> int:
    value = _read_integer(text, "std::stoll")
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise _Unreadable("is beyond int64's range (std::stoll)")
    return value


def _read_unsigned(text: str) -> int:
    """``std::stoull``: a magnitude up to 2**64 - 1, negated modulo 2**64 after a ``-``."""
    value = _read_integer(text, "std::stoull")
    if abs(value) > _UINT64_MAX:
        raise _Unreadable("is beyond uint64's range (std::stoull)")
    return value % 2 ** 64


def _read_integer(text: str, reader: str) -> int:
    m = _INTEGER.match(text)
    if m is None:
        raise _Unreadable(f"is not an integer (one is [+-] then decimal digits, as {reader} reads)")
    digits = m["digits"].lstrip("0") or "0"
    magnitude = int(digits) if len(digits) <= 20 else 2 ** 70  # past 20 digits: beyond any range
    return -magnitude if m["sign"] == "-" else magnitude


__all__ = ["format_numbers", "parse_floats", "parse_integers"]
