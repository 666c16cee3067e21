"""Casting to ``float8e8m0`` (the power-of-two scales of the MX formats) with ``round_mode``.

An e8m0 value is a bare exponent: the byte ``e`` means ``2 ** (e - 127)`` (``e`` from 0 to 254,
so from ``2**-127`` to ``2**127``) and 255 is NaN; there is no zero, no sign and no infinity.
A cast picks a power of two for each element, on the element's exact value (an input in any
float type is exact in float64; integers are read bit by bit, so int64 and uint64 are exact too):

- ``round_mode="up"``: the smallest power of two ``>= x``; ``"down"``: the largest ``<= x``;
  ``"nearest"``: the nearer of the two, ties (``1.5 * 2**k``) going up. These are ONNX's
  "away from zero", "towards zero" and "nearest, ties up" for the positive values the type
  holds.
- NaN gives NaN. A value above ``2**127`` (``+inf`` included) gives ``2**127`` with
  ``saturate=1``, NaN with ``saturate=0``; a value below ``2**-127`` (zero, a negative value,
  ``-inf``) gives ``2**-127`` with ``saturate=1``, NaN with ``saturate=0``. This is the table
  in the ONNX Cast spec (opset 24), and ONNX Runtime's choice where the spec leaves it open
  (negative values, ``-0``, the other rounding modes); onnx's own reference keeps the
  exponent of a negative value and turns ``+inf`` into NaN instead.

Example:
    >>> x = np.array([0.0, 0.124, 1.5, 3.0, 2.0 ** 200], np.float64)
    >>> to_float8e8m0(x, "up", saturate=True).astype(np.float32).tolist()
    [5.877471754111438e-39, 0.125, 2.0, 4.0, 1.7014118346046923e+38]
    >>> to_float8e8m0(x, "down", saturate=False).view(np.uint8).tolist()
    [255, 123, 127, 128, 255]
"""

from __future__ import annotations

import numpy as np

from metadef.core.dtypes import FLOAT8E8M0
from metadef.core.errors import AttributeError_

ROUND_MODES = ("up", "down", "nearest")
"""The values ``round_mode`` may take."""

_BIAS = 127
_NAN = 255
_MAX = 254  # 2**127
_MIN = 0    # 2**-127


def _float_exponents(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For positive finite ``x``: ``floor(log2 x)``, whether x is above that power of two and
    whether it is at least 1.5 times it (float64 holds every float input exactly)."""
    mantissa, exponent = np.frexp(x)  # x = mantissa * 2**exponent, mantissa in [0.5, 1)
    fraction = 2 * mantissa - 1      # x = (1 + fraction) * 2**(exponent - 1)
    return exponent.astype(np.int64) - 1, fraction > 0, fraction >= 0.5


def _integer_exponents(u: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The same for positive integers (``u`` as uint64), exactly, from the bits."""
    floor = np.zeros(u.shape, np.int64)
    rest = u.copy()
    for step in (32, 16, 8, 4, 2, 1):  # binary search for the leading one
        big = rest >> np.uint64(step) > 0
        floor += big * step
        rest = np.where(big, rest >> np.uint64(step), rest)
    below = u & ((np.uint64(1) << floor.astype(np.uint64)) - np.uint64(1))  # bits under the leading one
    half = np.uint64(1) << np.maximum(floor - 1, 0).astype(np.uint64)
    return floor, below > 0, (floor > 0) & (below >= half)


def to_float8e8m0(x: np.ndarray, round_mode: str = "up", saturate: bool = True) -> np.ndarray:
    """``x`` cast to float8e8m0 as the module doc says (a numpy array of
    ``ml_dtypes.float8_e8m0fnu``, the shape of ``x``).

    Example:
        >>> to_float8e8m0(np.array([1.4, 1.5, 1.6]), "nearest").astype(np.float32).tolist()
        [1.0, 2.0, 2.0]
    """
    if round_mode not in ROUND_MODES:
        raise AttributeError_(f"Cast: round_mode={round_mode!r} must be one of {', '.join(ROUND_MODES)}")
    x = np.asarray(x)
    low, high = (_MIN, _MAX) if saturate else (_NAN, _NAN)
    if x.dtype.kind in "iub":
        wide = x.astype(np.int64) if x.dtype.kind != "u" else x.astype(np.uint64)
        positive = wide > 0
        floor, above, past_half = _integer_exponents(np.where(positive, wide, 1).astype(np.uint64))
        nan = np.zeros(x.shape, bool)
        too_big = np.zeros(x.shape, bool)  # every integer is below 2**127
    else:
        wide = x.astype(np.float64)
        nan = np.isnan(wide)
        positive = wide >= 2.0 ** -_BIAS
        too_big = wide > 2.0 ** _BIAS
        inside = positive & ~too_big
        floor, above, past_half = _float_exponents(np.where(inside, wide, 1.0))
    exponent = floor + {"up": above, "down": False, "nearest": past_half}[round_mode]
    bits = np.where(positive, exponent + _BIAS, low)
    bits = np.where(too_big, high, bits)
    bits = np.where(nan, _NAN, bits)
    return bits.astype(np.uint8).view(FLOAT8E8M0.numpy)


__all__ = ["ROUND_MODES", "to_float8e8m0"]
