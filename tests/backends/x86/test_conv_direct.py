"""Convs read in place (``md_conv_direct``): the kernel on random shapes against float64, reading
nothing past its padded input's slack and writing nothing past its output (guard pages), and
graphs whose convs take it (forced) against the reference backend, fused epilogues included,
on one and two threads."""

from __future__ import annotations

import ctypes
import math
import re

import numpy as np
import pytest

import metadef as md
from metadef.backends.reference import ReferenceBackend
from metadef.backends.x86 import conv_direct
from metadef.codegen.native import ENTRY, native_function
from metadef.codegen.native_direct import direct_dims, direct_slack
from metadef.codegen.native_gemm import gemm_panel, pack_rows
from metadef.ir import parse_graph
from metadef.runtime.session import Session
from tests.backends.x86.test_x86_own_kernels import _guarded

pytestmark = pytest.mark.jit


def _expected(x: np.ndarray, w: np.ndarray, bias: np.ndarray, stride: int, out_hw: tuple[int, int]) -> np.ndarray:
    """The conv of a padded ``x [n, c, hp, wp]`` in float64 (no padding added)."""
    cout, _, kh, kw = w.shape
    oh, ow = out_hw
    taps = np.stack([x[:, :, ky:ky + stride * oh:stride, kx:kx + stride * ow:stride]
                     for ky in range(kh) for kx in range(kw)], axis=2)  # n, c, taps, oh, ow
    got = np.einsum("nctij,oct->noij", taps.astype(np.float64), w.reshape(cout, -1, kh * kw).astype(np.float64))
    return got + bias.reshape(1, -1, 1, 1)


@pytest.mark.parametrize("seed", range(10))
def test_the_kernel_matches_float64_and_stays_in_its_buffers(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, c, cout = int(rng.integers(1, 3)), int(rng.integers(1, 20)), int(rng.integers(1, 70))
    kh, kw, stride = int(rng.integers(1, 8)), int(rng.integers(1, 8)), int(rng.integers(1, 4))
    hp, wp = kh + int(rng.integers(0, 20)), kw + int(rng.integers(0, 30))
    oh, ow = (hp - kh) // stride + 1, (wp - kw) // stride + 1
    w = rng.standard_normal((cout, c, kh, kw)).astype(np.float32)
    bias = rng.standard_normal(cout).astype(np.float32)
    residual = bool(seed % 2)
    lo, hi = (0.0, 6.0) if seed % 3 == 0 else (-math.inf, math.inf)
    packed = pack_rows(w.reshape(cout, -1), gemm_panel())
    padded_bias = np.zeros(packed.shape[0] * gemm_panel(), np.float32)
    padded_bias[:cout] = bias
    floats = n * c * hp * wp
    buf, release_x = _guarded((floats + direct_slack(stride),), at_end=True)
    buf[:floats] = rng.standard_normal(floats).astype(np.float32)
    x = buf[:floats].reshape(n, c, hp, wp)
    y, release_y = _guarded((n, cout, oh, ow), at_end=True)
    res = rng.standard_normal((n, cout, oh, ow)).astype(np.float32)
    try:
        args = (ctypes.c_void_p * 5)(buf.ctypes.data, packed.ctypes.data, padded_bias.ctypes.data,
                                     res.ctypes.data if residual else None, y.ctypes.data)
        for tasks in (1, 3):
            y[...] = np.nan
            for task in range(tasks):
                dims = direct_dims(n, c, cout, (hp, wp), (oh, ow), (kh, kw), stride, residual=residual, lo=lo,
                                   hi=hi, task=task, tasks=tasks)
                ENTRY(native_function("md_conv_direct"))(args, (ctypes.c_int64 * len(dims))(*dims))
            want = np.clip(_expected(x, w, bias, stride, (oh, ow)) + (res if residual else 0), lo, hi)
            np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))
    finally:
        release_x()
        release_y()


def _graph(text: str, rng: np.random.Generator) -> md.Graph:
    consts = {name: rng.standard_normal([int(d) for d in dims.split(",")], dtype=np.float32)
              for name, dims in re.findall(r"%(\w+): f32\[([\d,]+)\] = const", text)}
    return parse_graph(text, constants=consts)


@pytest.mark.parametrize(("kernel", "stride", "pads", "size"), [
    (3, 2, (1, 1, 1, 1), 28), (7, 2, (3, 3, 3, 3), 30), (1, 2, (0, 0, 0, 0), 14), (5, 1, (2, 1, 0, 2), 13),
    (3, 3, (0, 1, 1, 0), 17)])
def test_graphs_whose_convs_run_direct_match_the_reference(monkeypatch: pytest.MonkeyPatch, kernel: int,
                                                            stride: int, pads: tuple[int, ...], size: int) -> None:
    """A conv with bias, ReLU and a residual add (one fused group) and a plain conv, each
    forced onto the direct kernel, at two batch sizes and one and two threads."""
    monkeypatch.setattr(conv_direct, "PREFER", conv_direct.DIRECT)
    rng = np.random.default_rng(kernel * 100 + stride)
    out = (size + pads[0] + pads[2] - kernel) // stride + 1
    wide = (size + pads[1] + pads[3] - kernel) // stride + 1
    g = _graph(f"""graph g(%x: f32[n,5,{size},{size}], %r: f32[n,40,{out},{wide}]) -> (%y, %z) {{
      %w: f32[40,5,{kernel},{kernel}] = const
      %b: f32[40] = const
      %v: f32[64,5,{kernel},{kernel}] = const
      %c: f32[n,40,{out},{wide}] = Conv(%x, %w, %b) {{pads=[{pads[0]},{pads[1]},{pads[2]},{pads[3]}],
        strides=[{stride},{stride}]}} @conv
      %s: f32[n,40,{out},{wide}] = Add(%c, %r) @add
      %y: f32[n,40,{out},{wide}] = Relu(%s) @relu
      %z: f32[n,64,{out},{wide}] = Conv(%x, %v) {{pads=[{pads[0]},{pads[1]},{pads[2]},{pads[3]}],
        strides=[{stride},{stride}]}} @plain
      return %y, %z }}""", rng)
    g = md.optimize(g, level="aggressive")
    for threads in (1, 2):
        sess = md.compile(g, target="x86", cache=False, threads=threads)
        for n in (1, 3):
            feeds = {"x": rng.standard_normal((n, 5, size, size), dtype=np.float32),
                     "r": rng.standard_normal((n, 40, out, wide), dtype=np.float32)}
            want = Session(g, ReferenceBackend().compile(g), "reference").run(feeds)
            got = sess.run(feeds)
            for name in ("y", "z"):
                np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4)
            program = sess.executable.programs.bound({"n": n})
            sess.executable.programs.give_back(program)
            direct = [kind for kind in program.call_kinds if kind.startswith("conv2d direct")]
            assert len(direct) == 2 and "conv2d direct own kernel + epilogue" in direct, program.call_kinds
