"""``md_qpack`` (a quantized conv's taps packed for ``md_qconv``) against the layout written
out in numpy: every window, stride, dilation and padding, 8-bit activations of both signs."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metadef.codegen.native import ENTRY, native_function
from metadef.codegen.native_qconv import qpack_dims
from metadef.codegen.native_qgemm import QGEMM_PANEL

pytestmark = pytest.mark.jit

GUARD = 0xAB


def packed_taps(x: np.ndarray, kernel: tuple[int, int], strides: tuple[int, int], dilations: tuple[int, int],
                begin: tuple[int, int], out_hw: tuple[int, int], fill: int) -> np.ndarray:
    """``[ceil(q/4), p32, 4]``: tap row ``r = (c, dy, dx)`` at byte ``r % 4`` of group ``r // 4``,
    the fill outside the image, zeros past the taps and pixels; int8 with its sign bit flipped."""
    c, h, w = x.shape
    (kh, kw), (oh, ow) = kernel, out_hw
    q, p = c * kh * kw, oh * ow
    flip = 0x80 if x.dtype == np.int8 else 0
    xb, fb = x.view(np.uint8) ^ flip, (fill & 0xFF) ^ flip
    out = np.zeros((-(-q // 4) * 4, -(-p // QGEMM_PANEL) * QGEMM_PANEL), np.uint8)
    oy, ox = np.meshgrid(np.arange(oh), np.arange(ow), indexing="ij")
    for r, (ci, dy, dx) in enumerate(np.ndindex(c, kh, kw)):
        iy, ix = oy * strides[0] + dy * dilations[0] - begin[0], ox * strides[1] + dx * dilations[1] - begin[1]
        inside = (iy >= 0) & (iy < h) & (ix >= 0) & (ix < w)
        out[r, :p] = np.where(inside, xb[ci, iy.clip(0, h - 1), ix.clip(0, w - 1)], fb).reshape(-1)
    return out.reshape(-1, 4, out.shape[1]).transpose(0, 2, 1)


def md_qpack(x: np.ndarray, kernel: tuple[int, int], strides: tuple[int, int], dilations: tuple[int, int],
             begin: tuple[int, int], out_hw: tuple[int, int], fill: int, tasks: int) -> np.ndarray:
    c, h, w = x.shape
    groups, p32 = -(-c * kernel[0] * kernel[1] // 4), -(-out_hw[0] * out_hw[1] // QGEMM_PANEL) * QGEMM_PANEL
    size = groups * p32 * 4
    raw = np.full(size + 64 + 256, GUARD, np.uint8)
    xp = raw[-raw.ctypes.data % 64:][:size + 256]
    for task in range(tasks):
        dims = qpack_dims(c, h, w, kernel, strides, dilations, begin, out_hw, fill=fill, flip=x.dtype == np.int8,
                          task=task, tasks=tasks)
        ENTRY(native_function("md_qpack"))((ctypes.c_void_p * 2)(x.ctypes.data, xp.ctypes.data),
                                           (ctypes.c_int64 * len(dims))(*dims))
    assert (xp[size:] == GUARD).all(), "md_qpack wrote past its output"
    return xp[:size].reshape(groups, p32, 4)


def _check(c: int, hw: tuple[int, int], kernel: tuple[int, int], strides: tuple[int, int],
           dilations: tuple[int, int], pads: tuple[int, int, int, int], dtype: type, tasks: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max + 1, (c, *hw)).astype(dtype)
    fill = int(rng.integers(info.min, info.max + 1))
    out_hw = tuple((size + pads[i] + pads[i + 2] - dilations[i] * (kernel[i] - 1) - 1) // strides[i] + 1
                   for i, size in enumerate(hw))
    args = (kernel, strides, dilations, pads[:2], out_hw, fill)
    np.testing.assert_array_equal(md_qpack(x, *args, tasks), packed_taps(x, *args))  # type: ignore[arg-type]


@pytest.mark.parametrize("c,hw,kernel,strides,pads", [
    (64, (56, 56), (3, 3), (1, 1), (1, 1, 1, 1)),    # ResNet's 3x3 layers: one block a row
    (3, (33, 230), (7, 7), (2, 2), (3, 3, 3, 3)),    # a stem over rows of several blocks, stride 2
    (9, (8, 65), (3, 3), (2, 2), (1, 1, 1, 1)),      # a row's last block of one pixel
    (5, (1, 300), (1, 1), (1, 1), (0, 0, 0, 0)),     # a 1x1 conv's plane as one row
    (7, (15, 15), (1, 1), (2, 2), (0, 0, 0, 0)),     # a strided 1x1 (the downsampling layers)
    (4, (12, 12), (3, 3), (3, 3), (0, 0, 0, 0)),     # stride 3: pixel by pixel
    (2, (5, 200), (3, 5), (1, 2), (0, 4, 0, 4)),     # one stride per axis, pads wider than the window's half
    (1, (3, 3), (5, 5), (1, 1), (2, 2, 2, 2)),       # a window larger than the image
])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_md_qpack_packs_the_taps_of_common_convs(c: int, hw: tuple[int, int], kernel: tuple[int, int],
                                                 strides: tuple[int, int], pads: tuple[int, ...], dtype: type) -> None:
    _check(c, hw, kernel, strides, (1, 1), pads, dtype, tasks=2, seed=c)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 7), st.integers(1, 5), st.integers(1, 5), st.integers(1, 3), st.integers(1, 3),
       st.integers(1, 2), st.integers(1, 2), st.data())
def test_md_qpack_is_the_layout_for_any_window(c: int, kh: int, kw: int, sh: int, sw: int, dh: int, dw: int,
                                               data: st.DataObject) -> None:
    h = data.draw(st.integers(dh * (kh - 1) + 1, 30), label="h")
    w = data.draw(st.integers(dw * (kw - 1) + 1, 140), label="w")
    pads = tuple(data.draw(st.integers(0, k - 1), label="pad") for k in (kh, kw, kh, kw))
    dtype = data.draw(st.sampled_from([np.uint8, np.int8]), label="dtype")
    _check(c, (h, w), (kh, kw), (sh, sw), (dh, dw), pads, dtype, data.draw(st.integers(1, 3), label="tasks"),  # type: ignore[arg-type]
           seed=h * w)
