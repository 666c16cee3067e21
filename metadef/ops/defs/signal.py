"""Signal processing ops: DFT, STFT, the window functions and MelWeightMatrix.

Complex tensors are real tensors with a last dim of 2 (real, imaginary); a real signal has a
last dim of 1. DFT and STFT are opaque (their references call ``np.fft``); the windows are
index expressions over the sample index ``n``, instantiated with ``N1`` from the size's value
(the numpy reference runs where no value is at hand). Sizes that come from input *values*
(window length, DFT length, mel bins) are read when constant and fresh symbols otherwise.

Example:
    >>> import numpy as np
    >>> from metadef.testing.onnx_cases import infer_text
    >>> infer_text("DFT", ["f32[batch,16,1]", None, "i64[]"], {"onesided": 1}, [None, None, 1])
    ['f32[batch,9,2]']
    >>> infer_text("HannWindow", ["i64[]"], {}, [np.array(8)])
    ['f32[8]']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from metadef.core.dtypes import from_onnx
from metadef.ops.defs.shape_values import Shapes, axis_of
from metadef.ops.infer import InferContext
from metadef.ops.interface import int_
from metadef.ops.metaop import metaop
from metadef.ops.strategy import Role
from metadef.shape import Dim, TensorType, add, floordiv, mul, sub

FLOAT_TYPES = "T1 in {float}; T2 in {int32, int64}"
FLOAT32 = 1  # the ONNX code of float32: the windows' default output_datatype


def _scalar(ctx: InferContext, i: int, what: str) -> int | None:
    """The constant value of a one-element integer input ``i``, or None when not constant."""
    v = ctx.value(i) if ctx.has(i) else None
    if v is None or v.dtype == object:
        return None
    v = np.asarray(v).reshape(-1)
    if v.size != 1:
        ctx.fail(f"{what} must hold one value, got {v.size}")
    return int(v[0])


def _complex(x: np.ndarray) -> np.ndarray:
    """The complex signal of a real tensor whose last dim is 1 (real) or 2 (real, imag)."""
    return x[..., 0] if x.shape[-1] == 1 else x[..., 0] + 1j * x[..., 1]


def _pairs(z: np.ndarray, dtype: Any) -> np.ndarray:
    """A complex array as a real one with a trailing (real, imag) dim of 2."""
    return np.stack([z.real, z.imag], axis=-1).astype(dtype)


# --- DFT --------------------------------------------------------------------------------


def _dft_rule(ctx: InferContext) -> list[Any]:
    s = ctx.shape(0)
    if s is None:
        return [None]
    if len(s) < 2:
        ctx.fail(f"the input must have rank >= 2 (signal dims, then 1 or 2), got rank {len(s)}")
    if isinstance(s[-1], int) and s[-1] not in (1, 2):
        ctx.fail(f"the last dim must be 1 (real) or 2 (complex), got {s[-1]}")
    inverse, onesided = ctx.attrs["inverse"], ctx.attrs["onesided"]
    axis = _scalar(ctx, 2, "axis") if ctx.has(2) else -2
    if axis is None:  # the transformed axis is known only at run time
        return [tuple(ctx.fresh("dft") for _ in s[:-1]) + ((1 if inverse and onesided else 2),)]
    if not (-len(s) <= axis <= -2 or 0 <= axis <= len(s) - 2):
        ctx.fail(f"axis {axis} must name a signal dim, in [{-len(s)}, -2] or [0, {len(s) - 2}]")
    a = axis_of(ctx, axis, len(s))
    length: Dim | None = _scalar(ctx, 1, "dft_length") if ctx.has(1) else None
    if ctx.has(1) and length is None:
        length = ctx.fresh("dft_length")
    if length is None:
        length = mul(2, sub(s[a], 1)) if inverse and onesided else s[a]
    out = list(s)
    if inverse and onesided:
        out[a], out[-1] = length, 1
    else:
        out[a], out[-1] = (add(floordiv(length, 2), 1) if onesided else length), 2
    return [tuple(out)]


def _dft_reference(inputs: list, attrs: Mapping[str, Any]) -> np.ndarray:
    x = inputs[0]
    axis = int(np.asarray(inputs[2]).reshape(-1)[0]) if len(inputs) > 2 and inputs[2] is not None else -2
    axis %= x.ndim
    inverse, onesided = attrs["inverse"], attrs["onesided"]
    n = None
    if len(inputs) > 1 and inputs[1] is not None:
        n = int(np.asarray(inputs[1]).reshape(-1)[0])
    z = _complex(x)
    if inverse and onesided:
        n = 2 * (x.shape[axis] - 1) if n is None else n
        return np.fft.irfft(z, n=n, axis=axis)[..., None].astype(x.dtype)
    y = (np.fft.ifft if inverse else np.fft.fft)(z, n=n, axis=axis)
    if onesided:
        y = np.take(y, np.arange(y.shape[axis] // 2 + 1), axis=axis)
    return _pairs(y, x.dtype)


def _dft_adapt(opset: int, attrs: dict, n_inputs: int) -> tuple[dict, dict]:
    """Before 20, axis is an attribute (default 1); from 20 it is input 2 (default -2)."""
    if opset >= 20:
        return attrs, {}
    attrs = dict(attrs)
    return attrs, {2: np.array(attrs.pop("axis", 1), np.int64)}


DFT = metaop(
    "DFT", inputs=("input: T1", "dft_length?: T2", "axis?: int64"), outputs=("output: T1",),
    types=FLOAT_TYPES, attrs={"inverse": int_(0), "onesided": int_(0)}, rule=_dft_rule,
    reference=_dft_reference, role=Role.OPAQUE, reads=(1, 2), since=(17, 20), adapt=_dft_adapt,
    doc="The discrete Fourier transform (or its inverse) along one signal axis; onesided "
        "keeps the non-negative frequencies of a real signal (inverse: rebuilds a real one).",
)


# --- STFT -------------------------------------------------------------------------------


def _stft_rule(ctx: InferContext) -> list[Any]:
    s = ctx.shape(0)
    if s is None:
        return [None]
    if len(s) != 3:
        ctx.fail(f"signal must have rank 3 ([batch, length, 1 or 2]), got rank {len(s)}")
    w = ctx.shape(2) if ctx.has(2) else None
    if w is not None and len(w) != 1:
        ctx.fail(f"window must be 1-D, got rank {len(w)}")
    step = _scalar(ctx, 1, "frame_step")
    length: Dim | None = _scalar(ctx, 3, "frame_length") if ctx.has(3) else None
    if length is None:
        length = w[0] if w is not None and not ctx.has(3) else ctx.fresh("frame_length")
    if isinstance(step, int) and step < 1:
        ctx.fail(f"frame_step is {step}; it must be at least 1")
    frames = ctx.fresh("frames") if step is None else add(floordiv(sub(s[1], length), step), 1)
    bins = add(floordiv(length, 2), 1) if ctx.attrs["onesided"] else length
    return [(s[0], frames, bins, 2)]


def _stft_reference(inputs: list, attrs: Mapping[str, Any]) -> np.ndarray:
    x, step = inputs[0], int(np.asarray(inputs[1]).reshape(-1)[0])
    window = inputs[2] if len(inputs) > 2 else None
    if len(inputs) > 3 and inputs[3] is not None:
        length = int(np.asarray(inputs[3]).reshape(-1)[0])
    else:
        length = window.shape[0] if window is not None else x.shape[1]
    frames = 1 + (x.shape[1] - length) // step
    where = step * np.arange(frames)[:, None] + np.arange(length)  # [frames, length]
    z = _complex(x)[:, where]
    if window is not None:
        z = z * window
    y = np.fft.fft(z, axis=-1)
    if attrs["onesided"]:
        y = y[..., :length // 2 + 1]
    return _pairs(y, x.dtype)


STFT = metaop(
    "STFT", inputs=("signal: T1", "frame_step: T2", "window?: T1", "frame_length?: T2"),
    outputs=("output: T1",), types=FLOAT_TYPES, attrs={"onesided": int_(1)}, rule=_stft_rule,
    reference=_stft_reference, role=Role.OPAQUE, reads=(1, 3), since=(17,),
    doc="The DFT of each (windowed) frame of frame_length samples, frame_step apart: "
        "[batch, frames, bins, 2].",
)


# --- window functions -------------------------------------------------------------------

WINDOWS: dict[str, tuple[str, Any]] = {
    # name: (output[n] as an index expression over N1 = size (periodic) or size - 1, numpy);
    # Hamming: alpha = 25/46 written out, since int / int in an expression divides as integers
    "HannWindow": ("sin(n * 3.141592653589793 / N1) ** 2",
                   lambda n, n1: np.sin(np.pi * n / n1) ** 2),
    "HammingWindow": ("0.5434782608695652 - 0.45652173913043476"
                      " * cos(2 * 3.141592653589793 * n / N1)",
                      lambda n, n1: 25 / 46 - 21 / 46 * np.cos(2 * np.pi * n / n1)),
    "BlackmanWindow": ("0.42 - 0.5 * cos(2 * 3.141592653589793 * n / N1)"
                       " + 0.08 * cos(4 * 3.141592653589793 * n / N1)",
                       lambda n, n1: 0.42 - 0.5 * np.cos(2 * np.pi * n / n1)
                       + 0.08 * np.cos(4 * np.pi * n / n1)),
}


def _window_rule(ctx: InferContext) -> list[Any]:
    if ctx.rank(0) not in (None, 0, 1) or (ctx.rank(0) == 1 and ctx.shape(0) != (1,)):
        ctx.fail(f"size must be a scalar, got shape {list(ctx.shape(0) or ())}")
    size = _scalar(ctx, 0, "size")
    if size is not None and size < 0:
        ctx.fail(f"size is {size}; it must not be negative")
    return [TensorType(from_onnx(ctx.attrs["output_datatype"]),
                       (ctx.fresh("window") if size is None else size,))]


def _window_semantics(text: str) -> Any:
    def semantics(attrs: Mapping[str, Any], shapes: Shapes, values: list) -> Any:
        size = values[0] if values else None
        if size is None or np.asarray(size).dtype == object:
            return None  # no value of size: the reference runs
        n1 = int(np.asarray(size).reshape(-1)[0]) - (0 if attrs["periodic"] else 1)
        return f"output[n] = {text}", {"N1": float(n1)}
    return semantics


def _window_reference(formula: Any) -> Any:
    def reference(inputs: list, attrs: Mapping[str, Any]) -> np.ndarray:
        size = int(np.asarray(inputs[0]).reshape(-1)[0])
        n1 = size if attrs["periodic"] else size - 1
        return formula(np.arange(size, dtype=np.float64), n1).astype(
            from_onnx(attrs["output_datatype"]).numpy)
    return reference


def _window(name: str) -> Any:
    text, formula = WINDOWS[name]
    return metaop(
        name, inputs=("size: T1",), outputs=("output: T2",),
        types="T1 in {int32, int64}; T2 in {numeric}",
        attrs={"output_datatype": int_(FLOAT32), "periodic": int_(1)}, rule=_window_rule,
        semantics=_window_semantics(text), reference=_window_reference(formula),
        role=Role.INJECTIVE, reads=(0,), since=(17,),
        doc=f"A {name[:-6]} window of size samples: output[n] = {text}, N1 = size when "
            "periodic, else size - 1.",
    )


HannWindow = _window("HannWindow")
HammingWindow = _window("HammingWindow")
BlackmanWindow = _window("BlackmanWindow")


# --- MelWeightMatrix --------------------------------------------------------------------


def _mel_rule(ctx: InferContext) -> list[Any]:
    for i, what in enumerate(("num_mel_bins", "dft_length", "sample_rate")):
        if ctx.rank(i) not in (None, 0):
            ctx.fail(f"{what} must be a scalar, got rank {ctx.rank(i)}")
    bins, length = _scalar(ctx, 0, "num_mel_bins"), _scalar(ctx, 1, "dft_length")
    rows = ctx.fresh("spectrogram_bins") if length is None else length // 2 + 1
    cols = ctx.fresh("mel_bins") if bins is None else bins
    return [TensorType(from_onnx(ctx.attrs["output_datatype"]), (rows, cols))]


def _mel_reference(inputs: list, attrs: Mapping[str, Any]) -> np.ndarray:
    bins, length, rate = (int(np.asarray(v).reshape(-1)[0]) for v in inputs[:3])
    low, high = (float(np.asarray(v).reshape(-1)[0]) for v in inputs[3:5])

    def mel(hz: float) -> float:
        return 2595 * np.log1p(hz / 700) / np.log(10)

    step = (mel(high) - mel(low)) / (bins + 2)
    hz = 700 * np.expm1((np.arange(bins + 2) * step + mel(low)) / 2595 * np.log(10))
    edges = (((length + 1) * hz) // rate).astype(np.int64)
    left, center, right = edges[:-2], edges[1:-1], edges[2:]  # one triangle per mel bin
    j = np.arange(length // 2 + 1)[:, None]
    rise = np.where(center > left, (j - left) / np.maximum(center - left, 1), j == center)
    fall = (right - j) / np.maximum(right - center, 1)
    out = np.where((j >= left) & (j <= center), rise, 0.0)
    out = np.where((j >= center) & (j < right) & (right > center), fall, out)
    return out.astype(from_onnx(attrs["output_datatype"]).numpy)


MelWeightMatrix = metaop(
    "MelWeightMatrix",
    inputs=("num_mel_bins: T1", "dft_length: T1", "sample_rate: T1", "lower_edge_hertz: T2",
            "upper_edge_hertz: T2"),
    outputs=("output: T3",), types="T1 in {int32, int64}; T2 in {float}; T3 in {numeric}",
    attrs={"output_datatype": int_(FLOAT32)}, rule=_mel_rule, reference=_mel_reference,
    role=Role.OPAQUE, reads=(0, 1), since=(17,),
    doc="Weights [dft_length // 2 + 1, num_mel_bins] that map a spectrogram's bins to "
        "triangular mel-scale bins between the two edge frequencies.",
)

__all__ = ["BlackmanWindow", "DFT", "HammingWindow", "HannWindow", "MelWeightMatrix", "STFT",
           "WINDOWS"]
