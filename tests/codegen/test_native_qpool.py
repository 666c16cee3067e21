"""``md_qmaxpool`` (max pools over 8-bit planes) against the pool written out in numpy."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metadef.codegen.native import ENTRY, native_function
from metadef.codegen.native_qpool import MAX_VECTOR_KW, qmaxpool_dims

pytestmark = pytest.mark.jit


def maxpool(x: np.ndarray, kernel: tuple[int, int], strides: tuple[int, int], dilations: tuple[int, int],
            begin: tuple[int, int], out_hw: tuple[int, int]) -> np.ndarray:
    """The maximum over each window's taps inside the plane."""
    c, h, w = x.shape
    y = np.full((c, *out_hw), np.iinfo(x.dtype).min, x.dtype)
    for oy, ox, dy, dx in np.ndindex(*out_hw, *kernel):
        iy, ix = oy * strides[0] + dy * dilations[0] - begin[0], ox * strides[1] + dx * dilations[1] - begin[1]
        if 0 <= iy < h and 0 <= ix < w:
            y[:, oy, ox] = np.maximum(y[:, oy, ox], x[:, iy, ix])
    return y


def md_qmaxpool(x: np.ndarray, kernel: tuple[int, int], strides: tuple[int, int], dilations: tuple[int, int],
                begin: tuple[int, int], out_hw: tuple[int, int], tasks: int) -> np.ndarray:
    y = np.zeros((x.shape[0], *out_hw), x.dtype)
    for task in range(tasks):
        dims = qmaxpool_dims(x.shape[0], x.shape[1:], out_hw, kernel, strides, dilations, begin,  # type: ignore[arg-type]
                             flip=x.dtype == np.int8, task=task, tasks=tasks)
        ENTRY(native_function("md_qmaxpool"))((ctypes.c_void_p * 2)(x.ctypes.data, y.ctypes.data),
                                              (ctypes.c_int64 * len(dims))(*dims))
    return y


def _check(c: int, hw: tuple[int, int], kernel: tuple[int, int], strides: tuple[int, int],
           dilations: tuple[int, int], pads: tuple[int, int, int, int], dtype: type, tasks: int) -> None:
    info = np.iinfo(dtype)
    x = np.random.default_rng(c * hw[0] * hw[1]).integers(info.min, info.max + 1, (c, *hw)).astype(dtype)
    out_hw = tuple((size + pads[i] + pads[i + 2] - dilations[i] * (kernel[i] - 1) - 1) // strides[i] + 1
                   for i, size in enumerate(hw))
    args = (kernel, strides, dilations, pads[:2], out_hw)
    np.testing.assert_array_equal(md_qmaxpool(x, *args, tasks), maxpool(x, *args))  # type: ignore[arg-type]


@pytest.mark.parametrize("c,hw,kernel,strides,pads", [
    (6, (112, 112), (3, 3), (2, 2), (1, 1, 1, 1)),   # ResNet's stem pool: rows of two blocks
    (3, (13, 13), (5, 5), (1, 1), (2, 2, 2, 2)),     # YOLO's SPPF pool
    (2, (9, 200), (2, 2), (2, 2), (0, 0, 0, 0)),     # VGG's pools, a row of several blocks
    (3, (10, 10), (3, 3), (3, 3), (1, 1, 1, 1)),     # stride 3: pixel by pixel
    (2, (6, 40), (1, MAX_VECTOR_KW + 1), (1, 1), (0, 0, 0, 0)),  # a window too wide for the vectors
])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_md_qmaxpool_pools_like_common_models(c: int, hw: tuple[int, int], kernel: tuple[int, int],
                                             strides: tuple[int, int], pads: tuple[int, ...], dtype: type) -> None:
    _check(c, hw, kernel, strides, (1, 1), pads, dtype, tasks=2)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4), st.integers(1, 3), st.integers(1, 3),
       st.integers(1, 2), st.integers(1, 2), st.data())
def test_md_qmaxpool_is_the_maximum_for_any_window(c: int, kh: int, kw: int, sh: int, sw: int, dh: int, dw: int,
                                                   data: st.DataObject) -> None:
    h = data.draw(st.integers(dh * (kh - 1) + 1, 20), label="h")
    w = data.draw(st.integers(dw * (kw - 1) + 1, 150), label="w")
    pads = tuple(data.draw(st.integers(0, k - 1), label="pad") for k in (kh, kw, kh, kw))
    dtype = data.draw(st.sampled_from([np.uint8, np.int8]), label="dtype")
    _check(c, (h, w), (kh, kw), (sh, sw), (dh, dw), pads, dtype, data.draw(st.integers(1, 3), label="tasks"))  # type: ignore[arg-type]
