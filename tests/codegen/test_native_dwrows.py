"""``md_depthwise_rows`` (a depthwise conv on pixel-major values) against the conv written out in numpy."""

from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metadef.codegen.native import ENTRY, native_function
from metadef.codegen.native_dwrows import (
    depthwise_rows_dims,
    dwrows_routine,
    pack_depthwise_rows,
    padded_channels,
    pixels_per_block,
)

pytestmark = pytest.mark.jit


def depthwise(x: np.ndarray, w: np.ndarray, bias: np.ndarray, strides: tuple[int, int], begin: tuple[int, int],
              out_hw: tuple[int, int], bounds: tuple[float, float]) -> np.ndarray:
    """``x [n, c, h, w]``, ``w [c, 1, k, k]``: the sum over each window's taps inside the plane,
    in float64, NCHW."""
    n, c, h, wd = x.shape
    k = w.shape[-1]
    y = np.broadcast_to(bias.astype(np.float64)[None, :, None, None], (n, c, *out_hw)).copy()
    for oy, ox, r, s in np.ndindex(*out_hw, k, k):
        iy, ix = oy * strides[0] + r - begin[0], ox * strides[1] + s - begin[1]
        if 0 <= iy < h and 0 <= ix < wd:
            y[:, :, oy, ox] += x[:, :, iy, ix].astype(np.float64) * w[:, 0, r, s]
    return np.clip(y, *bounds)


def md_depthwise_rows(x: np.ndarray, w: np.ndarray, bias: np.ndarray, strides: tuple[int, int],
                      begin: tuple[int, int], out_hw: tuple[int, int], bounds: tuple[float, float],
                      ldx: int, ldy: int, tasks: int, routine: str) -> np.ndarray:
    """The routine on ``x`` stored pixel-major at row stride ``ldx`` (the rest of each row NaN:
    never read), its output at ``ldy`` (the rest of each row checked untouched), back as NCHW."""
    n, c, h, wd = x.shape
    rows = np.full((n, h * wd, ldx), np.nan, np.float32)
    rows[:, :, :c] = x.reshape(n, c, h * wd).transpose(0, 2, 1)
    packed = pack_depthwise_rows(w)
    b = np.zeros(padded_channels(c), np.float32)
    b[:c] = bias
    out = np.full((n, out_hw[0] * out_hw[1], ldy), -7.0, np.float32)
    for task in range(tasks):
        dims = depthwise_rows_dims(n, c, (h, wd), out_hw, w.shape[-1], strides, begin, lo=bounds[0], hi=bounds[1],
                                   ldx=ldx, ldy=ldy, task=task, tasks=tasks)
        ENTRY(native_function(routine))(
            (ctypes.c_void_p * 4)(rows.ctypes.data, packed.ctypes.data, b.ctypes.data, out.ctypes.data),
            (ctypes.c_int64 * len(dims))(*dims))
    assert (out[:, :, c:] == -7.0).all(), "a row was written past its channels"
    return out[:, :, :c].transpose(0, 2, 1).reshape(n, c, *out_hw)


def _check(n: int, c: int, hw: tuple[int, int], k: int, strides: tuple[int, int], begin: tuple[int, int],
           end: tuple[int, int], bounds: tuple[float, float], extra: tuple[int, int], tasks: int, seed: int,
           generic: bool = False) -> None:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, *hw), dtype=np.float32)
    w = rng.standard_normal((c, 1, k, k), dtype=np.float32)
    bias = rng.standard_normal(c, dtype=np.float32)
    out_hw = tuple((size + b + e - k) // s + 1 for size, b, e, s in zip(hw, begin, end, strides))
    assert min(out_hw) > 0
    routine = "md_depthwise_rows" if generic else dwrows_routine(k)
    got = md_depthwise_rows(x, w, bias, strides, begin, out_hw, bounds, c + extra[0], c + extra[1], tasks, routine)
    want = depthwise(x, w, bias, strides, begin, out_hw, bounds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * k * k)


@pytest.mark.parametrize(("c", "hw", "k", "strides", "begin", "end"), [
    (96, (14, 14), 3, (1, 1), (1, 1), (1, 1)),     # MobileNetV2's 14x14 block
    (576, (14, 14), 3, (2, 2), (1, 1), (1, 1)),    # its stride-2 block to 7x7
    (960, (7, 7), 3, (1, 1), (1, 1), (1, 1)),
    (40, (9, 11), 5, (1, 1), (2, 2), (2, 2)),      # a 5x5 window (EfficientNet)
    (24, (12, 10), 7, (2, 2), (3, 3), (3, 3)),     # a 7x7 window, stride 2
    (13, (6, 20), 3, (1, 2), (0, 1), (2, 0)),      # a channel tail, unequal strides and padding
    (3, (1, 1), 3, (1, 1), (1, 1), (1, 1)),        # one pixel, fewer channels than a vector
    (33, (3, 17), 3, (1, 1), (0, 0), (0, 0)),      # no padding, a run of outputs past a block
])
@pytest.mark.parametrize("generic", [False, True], ids=["own routine", "any window"])
def test_md_depthwise_rows_matches_the_conv(c: int, hw: tuple[int, int], k: int, strides: tuple[int, int],
                                            begin: tuple[int, int], end: tuple[int, int], generic: bool) -> None:
    _check(2, c, hw, k, strides, begin, end, (-math.inf, math.inf), (0, 0), 1, c, generic)


def test_md_depthwise_rows_reads_and_writes_rows_at_their_stride_with_its_bounds_on_any_tasks() -> None:
    for generic in (False, True):
        _check(3, 40, (7, 9), 3, (1, 1), (1, 1), (1, 1), (0.0, 6.0), (8, 24), 5, 0, generic)
        _check(1, 16, (5, 2 * pixels_per_block() + 3), 3, (2, 2), (1, 1), (1, 1), (-0.5, math.inf), (16, 0), 3, 1,
               generic)


@settings(max_examples=25, deadline=None)
@given(c=st.integers(1, 40), h=st.integers(1, 12), w=st.integers(1, 19), k=st.sampled_from([1, 3, 5]),
       stride=st.integers(1, 3), pads=st.tuples(*[st.integers(0, 2)] * 4), extra=st.integers(0, 9),
       tasks=st.integers(1, 4), generic=st.booleans())
def test_md_depthwise_rows_on_random_shapes(c: int, h: int, w: int, k: int, stride: int,
                                            pads: tuple[int, int, int, int], extra: int, tasks: int,
                                            generic: bool) -> None:
    begin, end = (min(pads[0], k - 1), min(pads[1], k - 1)), (min(pads[2], k - 1), min(pads[3], k - 1))
    if h + begin[0] + end[0] < k or w + begin[1] + end[1] < k:
        return
    _check(1, c, (h, w), k, (stride, stride), begin, end, (-math.inf, math.inf), (extra, extra), tasks, c * h, generic)
