"""The x86 backend's contraction kernels: BLAS (numpy's OpenBLAS) with our own im2col.

Each builder takes a node's resolved attributes and returns a ``ContractionFn``: a function of
the node's input arrays that returns its (only) output, so a new batch size or sequence length
never needs anything rebuilt. The sizes are read from the arrays at run time.

- ``MatMul`` / batched MatMul: ``np.matmul`` (one ``sgemm`` per 2-D slice, OpenBLAS).
- ``Gemm``: ``np.matmul`` on (transposed) views, then ``alpha`` and ``beta * C`` in place.
- ``Conv`` (1-D/2-D/3-D; grouped, strided, dilated, padded): im2col through a strided view,
  then one batched ``sgemm`` over the groups; a 1x1 stride-1 unpadded conv skips im2col (a
  reshape). A depthwise conv (one input channel per group, no channel multiplier) runs as a
  generated kernel when the caller gives a compiler (``depthwise=``, see
  :func:`depthwise_node`): the input is zero-padded into a reused buffer, so the generated
  loop nest reads in bounds and vectorizes, 5-20x faster than numpy on MobileNetV2's shapes.
  Without one it is a batched matrix-vector product of its im2col, or, for large images, a
  loop over the kernel offsets on strided views (the loop wins above ~8k output pixels).
  The padded input is kept per thread and per kernel, and reused while its shape holds.
- ``Einsum``: ``np.einsum(optimize=True)``.
- ``Attention``: two batched ``sgemm`` around a softmax (a generated kernel when the caller
  gives one, else numpy).

``blas_info()`` says which BLAS numpy uses; ``set_blas_threads(n)`` sets its thread count
through OpenBLAS's own entry point (no threadpoolctl needed).

Example:
    >>> import numpy as np
    >>> conv = conv_kernel({"group": 1, "strides": [1], "pads": [1, 1], "dilations": [1]})
    >>> x = np.arange(4, dtype=np.float32).reshape(1, 1, 4)
    >>> conv([x, np.ones((1, 1, 3), np.float32), None])
    array([[[1., 3., 6., 5.]]], dtype=float32)
    >>> conv_variant({"group": 8}, (1, 8, 16, 16), (8, 1, 3, 3))
    'depthwise im2col + batched gemv'
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from metadef.core.dtypes import from_numpy
from metadef.core.errors import BackendError
from metadef.ir import Node, Value
from metadef.ops import REGISTRY, MetaOp, Role, Semantics, get_op
from metadef.ops.defs.nn_pool import window
from metadef.ops.numpy_eval.labelled import LOW_FLOATS
from metadef.shape import Dim, TensorType, sym

ContractionFn = Callable[[Sequence[np.ndarray | None]], np.ndarray]
SoftmaxFn = Callable[[np.ndarray, np.ndarray | None], np.ndarray]
"""``softmax(scores + mask)`` over the last axis (the mask may be None)."""
# compiles one node to a kernel ``kernel(inputs, outputs)``, or raises (codegen's compile_node)
NodeCompiler = Callable[[Node], Any]

DEPTHWISE_LOOP_PIXELS = 8192  # measured: above this many output pixels the offset loop wins


# ----------------------------------------------------------------------------------- BLAS


@dataclass(frozen=True)
class BlasInfo:
    """numpy's BLAS: its name and version (from ``np.show_config``) and the loaded library."""

    name: str
    version: str
    library: str | None  # the shared object's path, when it is loaded in this process


def blas_info() -> BlasInfo:
    """Which BLAS numpy's ``matmul`` calls.

    Example:
        >>> blas_info().name != ""
        True
    """
    config = np.show_config(mode="dicts") or {}
    blas = config.get("Build Dependencies", {}).get("blas", {})
    return BlasInfo(str(blas.get("name", "unknown")), str(blas.get("version", "unknown")),
                    _openblas_path())


def _openblas_path() -> str | None:
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower()}
    except OSError:
        return None
    numpy_libs = sorted(p for p in paths if "numpy" in p) or sorted(paths)
    return numpy_libs[0] if numpy_libs else None


def _openblas_call(suffix: str) -> Callable[..., int]:
    path = _openblas_path()
    if path is None:
        raise BackendError("numpy's BLAS is not a loaded OpenBLAS: its thread count cannot be set "
                           "here; set OPENBLAS_NUM_THREADS before starting Python instead")
    lib = ctypes.CDLL(path)
    for name in (f"scipy_openblas_{suffix}64_", f"scipy_openblas_{suffix}", f"openblas_{suffix}"):
        fn = getattr(lib, name, None)
        if fn is not None:
            return fn
    raise BackendError(f"{path} exports no openblas_{suffix}: set OPENBLAS_NUM_THREADS before "
                       "starting Python instead")


@functools.cache
def cblas_address(routine: str = "sgemm") -> int:
    """The address of numpy's ``cblas_<routine>`` (64-bit integers, as scipy-openblas64
    exports it), for generated code to call directly.

    Example:
        >>> cblas_address("sgemm") != 0
        True
    """
    path = _openblas_path()
    if path is None:
        raise BackendError(f"numpy's BLAS is not a loaded OpenBLAS: no cblas_{routine} to call")
    lib = ctypes.CDLL(path)
    for name in (f"scipy_cblas_{routine}64_", f"cblas_{routine}64_"):
        fn = getattr(lib, name, None)
        if fn is not None:
            return ctypes.cast(fn, ctypes.c_void_p).value or 0
    raise BackendError(f"{path} exports no 64-bit-integer cblas_{routine} (scipy_cblas_{routine}64_)")


def blas_threads() -> int:
    """The number of threads numpy's OpenBLAS uses now."""
    return int(_openblas_call("get_num_threads")())


def set_blas_threads(n: int) -> None:
    """Set numpy's OpenBLAS thread count (process-wide: every session shares it)."""
    if n < 1:
        raise BackendError(f"threads={n}: give a positive number of threads")
    _openblas_call("set_num_threads")(ctypes.c_int(n))


def widened(fn: ContractionFn) -> ContractionFn:
    """``fn`` run on float32 copies of its float16 / bfloat16 arguments, its result rounded
    back once: products and sums in float32, as the reference backend and ONNX Runtime take
    them (numpy's own float16 matmul and a per-tap loop round along the way).

    Example:
        >>> a = np.full((1, 4096), 0.1, np.float16)
        >>> float(widened(matmul_kernel({}))([a, np.ones((4096, 1), np.float16)])[0, 0])
        409.5
    """

    def run(args: Sequence[np.ndarray | None]) -> np.ndarray:
        low = next((a.dtype for a in args if a is not None and a.dtype in LOW_FLOATS), None)
        if low is None:
            return fn(args)
        wide = [a.astype(np.float32) if a is not None and a.dtype in LOW_FLOATS else a for a in args]
        return fn(wide).astype(low)

    return run


# ------------------------------------------------------------------------- MatMul, Gemm


def matmul_kernel(attrs: Mapping[str, Any]) -> ContractionFn:
    """``A @ B`` with numpy's promotion of 1-D operands and broadcast batch axes."""

    def run(args: Sequence[np.ndarray | None]) -> np.ndarray:
        return np.matmul(args[0], args[1])

    return run


def gemm_kernel(attrs: Mapping[str, Any]) -> ContractionFn:
    """``alpha * A' @ B' + beta * C`` (A', B' transposed views when asked)."""
    alpha, beta = float(attrs["alpha"]), float(attrs["beta"])
    trans_a, trans_b = bool(attrs["transA"]), bool(attrs["transB"])

    def run(args: Sequence[np.ndarray | None]) -> np.ndarray:
        a, b = args[0], args[1]
        out = np.matmul(a.T if trans_a else a, b.T if trans_b else b)
        if alpha != 1.0:
            out *= out.dtype.type(alpha)
        c = args[2] if len(args) > 2 else None
        if c is not None and beta != 0.0:
            out += c if beta == 1.0 else (c * c.dtype.type(beta))
        return out

    return run


def einsum_kernel(attrs: Mapping[str, Any]) -> ContractionFn:
    """``np.einsum`` with its contraction-order optimizer (BLAS for the pairwise products)."""
    equation = str(attrs["equation"]).replace(" ", "")

    def run(args: Sequence[np.ndarray | None]) -> np.ndarray:
        arrays = [a for a in args if a is not None]
        return np.asarray(np.einsum(equation, *arrays, optimize=True)).astype(arrays[0].dtype, copy=False)

    return run


# ------------------------------------------------------------------------------------ Conv


def conv_variant(attrs: Mapping[str, Any], x_shape: Sequence[int], w_shape: Sequence[int],
                 generated: bool = False) -> str:
    """Which conv kernel runs for these shapes (the choice recorded in the plan);
    ``generated``: a depthwise kernel could be compiled for them."""
    group = int(attrs.get("group") or 1)
    nd = len(x_shape) - 2
    if w_shape[1] == 1 and group > 1:
        if generated:
            return "depthwise: padded input + generated window-sum kernel"
        win = window(attrs, x_shape[2:], w_shape[2:])
        pixels = math.prod(_out_sizes(x_shape[2:], win))
        if pixels >= DEPTHWISE_LOOP_PIXELS:
            return "depthwise loop over kernel offsets"
        return "depthwise im2col + batched gemv"
    if _is_pointwise(attrs, w_shape[2:], nd):
        return "1x1 conv as one sgemm per group (no im2col)"
    return "im2col + one sgemm per group"


def _is_pointwise(attrs: Mapping[str, Any], kernel: Sequence[int], nd: int) -> bool:
    strides = attrs.get("strides") or [1] * nd
    pads = attrs.get("pads") or [0] * (2 * nd)
    auto_pad = attrs.get("auto_pad") or "NOTSET"
    return all(k == 1 for k in kernel) and all(s == 1 for s in strides) and \
        (auto_pad != "NOTSET" or all(p == 0 for p in pads))


def _out_sizes(spatial: Sequence[int], win: Any) -> list[int]:
    return [(h + b + e - d * (k - 1) - 1) // s + 1
            for h, k, s, d, b, e in zip(spatial, win.kernel, win.strides, win.dilations, win.begin, win.end)]


def _padded(x: np.ndarray, begin: Sequence[int], end: Sequence[int],
            scratch: threading.local | None = None) -> np.ndarray:
    """``x`` zero-padded; with ``scratch``, into this thread's buffer of the last call (its
    border is still zero: only the interior is written), so no allocation while shapes hold."""
    if not any(begin) and not any(end):
        return x
    if min(*begin, *end) < 0:
        raise BackendError(f"negative conv pads {list(begin)} / {list(end)} are not supported")
    shape = (*x.shape[:2], *(h + b + e for h, b, e in zip(x.shape[2:], begin, end)))
    out = getattr(scratch, "padded", None)
    if out is None or out.shape != shape or out.dtype != x.dtype:
        out = np.zeros(shape, x.dtype)
        if scratch is not None:
            scratch.padded = out
    out[(slice(None), slice(None), *(slice(b, b + h) for b, h in zip(begin, x.shape[2:])))] = x
    return out


def _windows(xp: np.ndarray, win: Any, out: Sequence[int]) -> np.ndarray:
    """A read-only view ``[N, C, *kernel, *out]`` of every window of the padded input."""
    sn, sc, *ss = xp.strides
    shape = (*xp.shape[:2], *win.kernel, *out)
    strides = (sn, sc, *(s * d for s, d in zip(ss, win.dilations)),
               *(s * st for s, st in zip(ss, win.strides)))
    return as_strided(xp, shape, strides, writeable=False)


def _conv_gemm(xp: np.ndarray, w: np.ndarray, group: int, win: Any, out: list[int]) -> np.ndarray:
    n, c = xp.shape[:2]
    k = w.shape[0]
    pixels = math.prod(out)
    depth = (c // group) * math.prod(win.kernel)
    if all(x == 1 for x in win.kernel) and all(s == 1 for s in win.strides):
        cols = np.ascontiguousarray(xp).reshape(n, group, depth, pixels)
    else:
        cols = _windows(xp, win, out).reshape(n, group, depth, pixels)  # the im2col copy
    y = np.empty((n, k, *out), xp.dtype)
    np.matmul(w.reshape(group, k // group, depth), cols, out=y.reshape(n, group, k // group, pixels))
    return y


def _conv_depthwise(xp: np.ndarray, w: np.ndarray, win: Any, out: list[int]) -> np.ndarray:
    n, c = xp.shape[:2]
    k = w.shape[0]
    if k != c:
        xp = np.repeat(xp, k // c, axis=1)  # a channel multiplier: output channel j reads j // m
    pixels = math.prod(out)
    taps = math.prod(win.kernel)
    if pixels < DEPTHWISE_LOOP_PIXELS:
        cols = _windows(xp, win, out).reshape(n, k, taps, pixels)
        y = np.matmul(w.reshape(k, 1, taps), cols)
        return y.reshape(n, k, *out)
    y = np.zeros((n, k, *out), xp.dtype)
    tmp = np.empty_like(y)
    per_channel = w.reshape(k, taps)
    for t, offset in enumerate(np.ndindex(*win.kernel)):
        view = xp[(slice(None), slice(None),
                   *(slice(r * d, r * d + s * (o - 1) + 1, s)
                     for r, d, s, o in zip(offset, win.dilations, win.strides, out)))]
        np.multiply(view, per_channel[:, t].reshape(k, *(1,) * len(out)), out=tmp)
        y += tmp
    return y


X86_DOMAIN = "ai.metadef.x86"


def _depthwise_semantics(attrs: Mapping[str, Any], shapes: Sequence[Sequence[Dim] | None],
                         ) -> tuple[str, dict[str, Any]]:
    """``Y[n, k, p..] = B[k] + sum[r..] X[n, k, p*S + r*D - B..] * W[k, 0, r..]``."""
    x, w = shapes[0], shapes[1]
    nd = len(x) - 2
    params = window(attrs, x[2:], w[2:]).params()
    ps, rs = (", ".join(f"{v}{i}" for i in range(nd)) for v in ("p", "r"))
    reads = ", ".join(f"p{i}*S{i} + r{i}*D{i} - B{i}" for i in range(nd))
    bias = "B[k] + " if len(shapes) > 2 and shapes[2] is not None else ""
    return f"Y[n, k, {ps}] = {bias}sum[{rs}] X[n, k, {reads}] * W[k, 0, {rs}]", params


def _declare_depthwise() -> MetaOp:
    """``ai.metadef.x86::DepthwiseConv``: Conv's interface and shape rule, a per-channel window
    sum as semantics, and the reduction role, so that codegen lowers it like a pooling op."""
    found = REGISTRY.get("DepthwiseConv", X86_DOMAIN)
    if found is not None:
        return found
    conv = get_op("Conv")
    op = dataclasses.replace(
        conv, name="DepthwiseConv", domain=X86_DOMAIN, semantics=Semantics(_depthwise_semantics),
        strategy=dataclasses.replace(conv.strategy, role=Role.REDUCTION),
        doc="x86 backend: a depthwise Conv (group = channels) as a generated window sum.")
    return REGISTRY.register(op)


DEPTHWISE_CONV = _declare_depthwise()


def depthwise_node(x_shape: Sequence[int], w_shape: Sequence[int], bias: bool, dtype: np.dtype,
                   win: Any) -> Node:
    """A ``DepthwiseConv`` node over an already padded input (pads 0, batch symbolic).

    Example:
        >>> from metadef.ops.defs.nn_pool import window
        >>> win = window({"strides": [2, 2]}, (9, 9), (3, 3))
        >>> node = depthwise_node((1, 8, 9, 9), (8, 1, 3, 3), True, np.dtype(np.float32), win)
        >>> str(node.outputs[0].type)
        'f32[n,8,4,4]'
    """
    t = from_numpy(dtype)
    spatial = _out_sizes(x_shape[2:], win)
    xv = Value("x", TensorType(t, (sym("n"), *x_shape[1:])))
    wv = Value("w", TensorType(t, tuple(w_shape)))
    inputs = (xv, wv, Value("b", TensorType(t, (w_shape[0],)))) if bias else (xv, wv)
    y = Value("y", TensorType(t, (sym("n"), w_shape[0], *spatial)))
    nd = len(spatial)
    attrs = {"group": int(w_shape[0]), "kernel_shape": list(w_shape[2:]), "strides": list(win.strides),
             "dilations": list(win.dilations), "pads": [0] * (2 * nd)}
    node = Node(DEPTHWISE_CONV.name, inputs, (y,), attrs, "/x86/depthwise", domain=X86_DOMAIN)
    y.producer = node
    return node


class _DepthwiseKernels:
    """Generated depthwise kernels, one per (padded input dims but the batch, weight shape,
    bias, dtype, strides, dilations); a refusal is kept too, so it is asked once."""

    def __init__(self, compile_fn: NodeCompiler) -> None:
        self._compile = compile_fn
        self._kernels: dict[tuple[Any, ...], Any] = {}
        self._lock = threading.Lock()
        self.refusals: list[str] = []

    def get(self, x_shape: Sequence[int], w_shape: Sequence[int], bias: bool, dtype: np.dtype,
            win: Any) -> Any:
        key = (tuple(x_shape[1:]), tuple(w_shape), bias, dtype.str, win.strides, win.dilations)
        if key not in self._kernels:
            with self._lock:
                if key not in self._kernels:
                    try:
                        self._kernels[key] = self._compile(depthwise_node(x_shape, w_shape, bias, dtype, win))
                    except Exception as e:  # any refusal: the numpy path runs
                        self.refusals.append(f"{type(e).__name__}: {e}")
                        self._kernels[key] = None
        return self._kernels[key]

    def run(self, xp: np.ndarray, w: np.ndarray, b: np.ndarray | None, win: Any,
            out: Sequence[int]) -> np.ndarray | None:
        kernel = self.get(xp.shape, w.shape, b is not None, xp.dtype, win)
        if kernel is None:
            return None
        y = np.empty((xp.shape[0], w.shape[0], *out), xp.dtype)
        args = [xp, w.astype(xp.dtype, copy=False)]
        if b is not None:
            args.append(b.astype(xp.dtype, copy=False))
        kernel(args, [y])
        return y


def conv_kernel(attrs: Mapping[str, Any], depthwise: NodeCompiler | None = None) -> ContractionFn:
    """ONNX Conv on NCHW-style arrays (any number of spatial axes), bias included.

    ``depthwise``: a node compiler (codegen's ``compile_node``) for depthwise convs; kernels
    are compiled once per channel count, padded spatial size and dtype (the batch stays a
    run-time argument) and kept; when it refuses, the numpy path runs.
    """
    group = int(attrs.get("group") or 1)
    scratch = threading.local()
    generated = _DepthwiseKernels(depthwise) if depthwise is not None else None

    def run(args: Sequence[np.ndarray | None]) -> np.ndarray:
        x, w = args[0], args[1]
        b = args[2] if len(args) > 2 else None
        kernel = tuple(attrs.get("kernel_shape") or w.shape[2:])
        if tuple(w.shape[2:]) != kernel:
            raise BackendError(f"Conv kernel_shape {list(kernel)} differs from W's {list(w.shape[2:])}")
        win = window(attrs, x.shape[2:], kernel)
        win = type(win)(kernel, win.strides, win.dilations, tuple(int(v) for v in win.begin),
                        tuple(int(v) for v in win.end))
        xp = _padded(x, win.begin, win.end, scratch)
        zero = type(win)(kernel, win.strides, win.dilations, (0,) * len(kernel), (0,) * len(kernel))
        out = _out_sizes(xp.shape[2:], zero)
        if w.shape[1] == 1 and group > 1:
            if generated is not None and w.shape[0] == x.shape[1]:
                y = generated.run(xp, w, b, zero, out)
                if y is not None:
                    return y
            y = _conv_depthwise(xp, w, zero, out)
        else:
            y = _conv_gemm(xp, w, group, zero, out)
        if b is not None:
            y += b.reshape(-1, *(1,) * len(out))
        return y

    run.depthwise_refusals = generated.refusals if generated is not None else []  # type: ignore[attr-defined]
    return run


# ------------------------------------------------------------------------------- Attention


def numpy_softmax(s: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """``softmax(s + mask)`` over the last axis, in place on ``s`` where the shapes allow."""
    if mask is not None:
        s = s + mask if np.broadcast_shapes(s.shape, mask.shape) != s.shape else np.add(s, mask, out=s)
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    return s


def attention_kernel(attrs: Mapping[str, Any], softmax: SoftmaxFn = numpy_softmax) -> ContractionFn:
    """``softmax(scale * Q Kᵀ + mask) V``: two batched sgemm and ``softmax(scores, mask)``
    in between (``layout="bshd"``: the heads swapped before the sequence and back after)."""
    scale, heads_after = float(attrs["scale"]), attrs.get("layout", "bhsd") == "bshd"

    def run(args: Sequence[np.ndarray | None]) -> np.ndarray:
        q, k, v = args[0], args[1], args[2]
        if heads_after:
            q, k, v = (np.swapaxes(t, -3, -2) for t in (q, k, v))
        mask = args[3] if len(args) > 3 else None
        s = np.matmul(q, np.swapaxes(k, -1, -2))
        s *= s.dtype.type(scale)
        y = np.matmul(softmax(s, mask), v)
        return np.ascontiguousarray(np.swapaxes(y, -3, -2)) if heads_after else y

    return run


__all__ = ["DEPTHWISE_CONV", "DEPTHWISE_LOOP_PIXELS", "X86_DOMAIN", "BlasInfo", "ContractionFn",
           "NodeCompiler", "SoftmaxFn", "attention_kernel", "blas_info", "blas_threads",
           "cblas_address", "conv_kernel",
           "conv_variant", "depthwise_node", "einsum_kernel", "gemm_kernel", "matmul_kernel",
           "numpy_softmax", "set_blas_threads", "widened"]
