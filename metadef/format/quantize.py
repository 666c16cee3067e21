"""Weight storage formats of .mdef files: float16, bfloat16, int8, int4 and pruned (sparse) weights.

Only weights are quantized; activations stay float. A tensor is stored in one *format* (the
index's ``format`` byte) with its parameters in the parameter-data layer, and the reader
dequantizes it to its original dtype on first use, so every backend runs it unchanged.

- ``int8``: symmetric, one float32 scale per output channel: ``w ~ q * scale[c]``,
  ``q in [-127, 127]``, ``scale[c] = max|w[c]| / 127``.
- ``int4``: symmetric, blockwise along the reduction axis: the output axis is moved to the
  front and the rest flattened (``[out, red]``); each run of ``block`` (32) weights of a row
  has one scale (float16, or float32 when a scale does not fit float16), ``q in [-7, 7]``,
  two values a byte, low nibble first.
- ``float16`` / ``bfloat16`` / ``float32`` (float64 weights): a cast.
- pruning (``prune=T``) zeroes ``|w| < T`` first; the element array is then stored as a
  bitmap of its nonzero codes plus the nonzeros when that is smaller (index flag SPARSE).

Which axis is the output channel comes from how the graph uses the weight (``weight_rules``,
keyed by op): Conv ``W[K,C,R,S]`` axis 0; ConvTranspose ``W[C,K,R,S]`` axis 1; Gemm ``B``
axis 0 with ``transB=1`` (``[N,K]``) else 1 (``[K,N]``); MatMul ``B[..., K, N]`` the last
axis (per column N); Gather's table ``[V, D]`` axis 0 (one scale per embedding row). Only
float tensors of rank >= 2 with >= 1024 elements whose every reader has a rule (agreeing on
the axis) are quantized; biases, norms and small tensors stay as they are.

Example:
    >>> w = np.linspace(-1, 1, 64 * 32, dtype=np.float32).reshape(64, 32)
    >>> enc = encode_tensor(w, "int8", out_axis=0)
    >>> enc.format == INT8, len(enc.blob) == 64 * 4 + 64 * 32
    (True, True)
    >>> back = decode_tensor(enc.blob, w.shape, w.dtype, enc.format, enc.flags, enc.params)
    >>> back.dtype, bool(np.abs(back - w).max() <= 1 / 254 + 1e-7)
    (dtype('float32'), True)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import ml_dtypes
import numpy as np

from metadef.core.errors import FormatError
from metadef.ir.graph import Graph, Node, Value

# Index format codes (docs/format.md, "Weight formats") and the index flag bit.
PLAIN, FLOAT16, BFLOAT16, INT8, INT4, FLOAT32 = range(6)
SPARSE = 1 << 0
SCHEMES = {"float16": FLOAT16, "bfloat16": BFLOAT16, "int8": INT8, "int4": INT4, "float32": FLOAT32,
           "plain": PLAIN}
_CAST_DTYPES = {FLOAT16: np.dtype("<f2"), BFLOAT16: np.dtype(ml_dtypes.bfloat16), FLOAT32: np.dtype("<f4")}
_SCALE_DTYPES = {"float16": np.dtype("<f2"), "float32": np.dtype("<f4")}
PRECISIONS = ("fp64", "fp32", "fp16", "bf16", "int8", "int4")
"""What a user may ask for one weight (``quantize=`` and the precision file)."""
PRECISION_ALIASES = {"float64": "fp64", "float32": "fp32", "float16": "fp16", "bfloat16": "bf16",
                     "double": "fp64", "float": "fp32", "half": "fp16"}
MIN_ELEMENTS = 1024
INT4_BLOCK = 32
_BITS = {"fp64": 64, "fp32": 32, "fp16": 16, "bf16": 16}


def normalize_precision(name: str) -> str:
    """``"float16"`` -> ``"fp16"``; ValueError naming the choices for anything unknown.

    Example:
        >>> normalize_precision("float16"), normalize_precision("INT4")
        ('fp16', 'int4')
    """
    key = str(name).strip().lower()
    key = PRECISION_ALIASES.get(key, key)
    if key not in PRECISIONS:
        raise ValueError(f"unknown precision {name!r}; choose one of {', '.join(PRECISIONS)} "
                         "(or float64, float32, float16, bfloat16)")
    return key


# --- which tensors are weights, and their output axis ------------------------------------------
def _gemm_b(node: Node, index: int, rank: int) -> int | None:
    return (0 if node.attrs.get("transB", 0) else 1) if index == 1 else None


weight_rules: dict[str, Callable[[Node, int, int], int | None]] = {
    "Conv": lambda node, index, rank: 0 if index == 1 else None,
    "ConvTranspose": lambda node, index, rank: 1 if index == 1 else None,
    "Gemm": _gemm_b,
    "MatMul": lambda node, index, rank: rank - 1 if index == 1 else None,
    "Gather": lambda node, index, rank: 0 if index == 0 and node.attrs.get("axis", 0) == 0 else None,
}
"""op -> (node, input index, rank) -> the weight's output-channel axis, or None: not a weight."""


@dataclass(frozen=True)
class Weight:
    """A constant that may be quantized: its value, the nodes that read it, its output axis."""

    value: Value
    readers: tuple[Node, ...]
    out_axis: int


def find_weights(graph: Graph) -> list[Weight]:
    """The constants that are weights of contractions (or embedding tables), in node order.

    Example:
        >>> from metadef.ir import parse_graph
        >>> g = parse_graph('''graph g(%x: f32[n,64]) -> (%y) {
        ...   %w: f32[64,32] = const
        ...   %b: f32[32] = const
        ...   %m: f32[n,32] = MatMul(%x, %w) @fc
        ...   %y: f32[n,32] = Add(%m, %b) @bias
        ...   return %y
        ... }''', {"w": np.ones((64, 32), np.float32), "b": np.ones(32, np.float32)})
        >>> [(w.value.name, w.out_axis, [n.name for n in w.readers]) for w in find_weights(g)]
        [('w', 1, ['fc'])]
    """
    consts = {id(v): v for v in graph.constants}
    axes: dict[int, set[int | None]] = {}
    readers: dict[int, list[Node]] = {}
    for node in graph.nodes:
        for i, v in enumerate(node.inputs):
            if v is None or id(v) not in consts:
                continue
            rule = weight_rules.get(node.op) if node.domain in ("", "ai.onnx") else None
            arr = v.const
            axes.setdefault(id(v), set()).add(rule(node, i, arr.ndim) if rule and arr is not None else None)
            readers.setdefault(id(v), []).append(node)
    out = []
    for key, found in axes.items():
        v = consts[key]
        arr = np.asarray(v.const)
        is_float = arr.dtype.kind == "f" or arr.dtype == ml_dtypes.bfloat16
        if len(found) == 1 and None not in found and is_float and arr.ndim >= 2 and arr.size >= MIN_ELEMENTS:
            out.append(Weight(v, tuple(readers[key]), int(next(iter(found)))))
    return out


# --- encoding one tensor ------------------------------------------------------------------------
@dataclass
class EncodedTensor:
    """A weight in its stored form: format code, index flags, the bytes, and the parameters
    that go to the parameter-data layer (``{"quantization": {...}}``)."""

    format: int
    flags: int
    blob: bytes
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def quantization(self) -> dict[str, Any]:
        return self.params["quantization"]


def _parts(shape: tuple[int, ...], dtype: np.dtype, fmt: int, flags: int,
           q: Mapping[str, Any]) -> list[tuple[str, np.dtype, int]]:
    """The stored parts (name, dtype, count), in order; each part starts 8-aligned in the blob."""
    size = math.prod(shape)
    parts: list[tuple[str, np.dtype, int]] = []
    if fmt == INT8:
        parts.append(("scales", _SCALE_DTYPES[q["scale_dtype"]], shape[q["axis"]]))
    elif fmt == INT4:
        red = size // shape[q["axis"]] if size else 0
        parts.append(("scales", _SCALE_DTYPES[q["scale_dtype"]], shape[q["axis"]] * -(-red // q["block"])))
    count = size
    if flags & SPARSE:
        parts.append(("bitmap", np.dtype("u1"), -(-size // 8)))
        count = q["sparse"]["nnz"]
    if fmt == INT4:
        parts.append(("values", np.dtype("u1"), -(-count // 2)))
    else:
        plain = dtype.newbyteorder("<")
        parts.append(("values", np.dtype("i1") if fmt == INT8 else _CAST_DTYPES.get(fmt, plain), count))
    return parts


def _offsets(parts: list[tuple[str, np.dtype, int]]) -> tuple[list[int], int]:
    offsets, pos = [], 0
    for _name, dt, count in parts:
        pos = -(-pos // 8) * 8
        offsets.append(pos)
        pos += dt.itemsize * count
    return offsets, pos


def stored_nbytes(shape: tuple[int, ...], dtype: np.dtype, fmt: int, flags: int, params: Any) -> int:
    """Bytes a tensor takes in ``fmt``; FormatError when the parameters make no sense.

    The reader calls this before it trusts a record: every field is type- and range-checked.
    """
    q = params.get("quantization") if isinstance(params, Mapping) else None
    if fmt == PLAIN and not flags:
        return math.prod(shape) * dtype.itemsize
    try:
        _check_params(shape, dtype, fmt, flags, q)
        return _offsets(_parts(shape, dtype, fmt, flags, q))[1]
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise FormatError(f"format {fmt}, flags {flags}, quantization {q!r}: {e}") from None


def _is_int(x: Any) -> bool:
    return type(x) is int


def _check_params(shape: tuple[int, ...], dtype: np.dtype, fmt: int, flags: int, q: Any) -> None:
    if fmt not in SCHEMES.values() or flags & ~SPARSE:
        raise ValueError("unknown storage format or flag")
    if not isinstance(q, Mapping) or SCHEMES.get(q.get("scheme")) != fmt:
        raise ValueError("the parameter layer's quantization scheme does not match the format")
    if dtype.kind != "f" and dtype != ml_dtypes.bfloat16:
        raise ValueError(f"only float tensors are stored quantized, not {dtype}")
    if fmt in (INT8, INT4):
        if not (_is_int(q.get("axis")) and 0 <= q["axis"] < len(shape)) or q.get("scale_dtype") not in _SCALE_DTYPES:
            raise ValueError("axis or scale_dtype out of range")
        if fmt == INT4 and not (_is_int(q.get("block")) and 1 <= q["block"] <= 1 << 16):
            raise ValueError("block out of range")
    if flags & SPARSE:
        nnz = q.get("sparse", {}).get("nnz") if isinstance(q.get("sparse"), Mapping) else None
        if not (_is_int(nnz) and 0 <= nnz <= math.prod(shape)):
            raise ValueError("sparse.nnz out of range")


def _split(q: np.ndarray, prune: bool, bits: int) -> tuple[int, list[np.ndarray], dict[str, Any]]:
    """Dense codes, or bitmap + nonzero codes when pruning and that is smaller."""
    flat = q.reshape(-1)
    mask = flat != 0
    nnz = int(mask.sum())
    if prune and -(-flat.size // 8) + -(-nnz * bits // 8) < -(-flat.size * bits // 8):
        return SPARSE, [np.packbits(mask, bitorder="little"), flat[mask]], {"sparse": {"nnz": nnz}}
    return 0, [flat], {}


def _pack_nibbles(codes: np.ndarray) -> np.ndarray:
    c = (codes.astype(np.int16) & 0xF).astype(np.uint8)
    if c.size % 2:
        c = np.append(c, np.uint8(0))
    return c[0::2] | (c[1::2] << 4)


def _unpack_nibbles(packed: np.ndarray, count: int) -> np.ndarray:
    out = np.empty(packed.size * 2, np.int8)
    out[0::2], out[1::2] = packed & 0xF, packed >> 4
    return np.where(out > 7, out - 16, out).astype(np.int8)[:count]


def _int4_blocks(w: np.ndarray, axis: int, block: int) -> tuple[np.ndarray, int]:
    rows = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1).astype(np.float32)
    red = rows.shape[1]
    nblk = -(-red // block)
    padded = np.zeros((rows.shape[0], nblk * block), np.float32)
    padded[:, :red] = rows
    return padded.reshape(rows.shape[0], nblk, block), red


def _scale_dtype(scales: np.ndarray) -> str:
    nz = scales[scales > 0]
    fits = not nz.size or (nz.max() < 60000 and nz.min() > 2.0 ** -14)
    return "float16" if fits else "float32"


def _int8_codes(w: np.ndarray, axis: int, block: int) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    other = tuple(a for a in range(w.ndim) if a != axis)
    scales = (np.abs(w.astype(np.float32)).max(axis=other) / 127).astype(np.float32)
    view = [1] * w.ndim
    view[axis] = -1
    codes = np.rint(w / np.where(scales > 0, scales, 1).reshape(view)).clip(-127, 127).astype(np.int8)
    return codes, scales, {"scheme": "int8", "axis": axis, "scale_dtype": "float32"}


def _int4_codes(w: np.ndarray, axis: int, block: int) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    blocks, red = _int4_blocks(w, axis, block)
    sdt = _scale_dtype(np.abs(blocks).max(axis=2) / 7)
    scales = (np.abs(blocks).max(axis=2) / 7).astype(_SCALE_DTYPES[sdt])
    stored = scales.astype(np.float32)
    codes = np.rint(blocks / np.where(stored > 0, stored, 1)[:, :, None]).clip(-7, 7).astype(np.int8)
    q = {"scheme": "int4", "axis": axis, "block": block, "scale_dtype": sdt}
    return codes.reshape(blocks.shape[0], -1)[:, :red], scales, q


# precision -> (format, bits per code, (weight, axis, block) -> (codes, scales, parameters))
quantizers = {"int8": (INT8, 8, _int8_codes), "int4": (INT4, 4, _int4_codes)}
_FLOAT_TARGETS = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def encode_tensor(w: np.ndarray, precision: str, *, out_axis: int, prune: float | None = None,
                  block: int = INT4_BLOCK) -> EncodedTensor:
    """Store ``w`` at ``precision`` (fp64/fp32/fp16/bf16/int8/int4); see the module docstring."""
    precision = normalize_precision(precision)
    w = np.asarray(w)
    work = np.where(np.abs(w) < prune, 0, w).astype(w.dtype) if prune else w
    if precision in quantizers:
        if not np.isfinite(work).all():
            raise FormatError(f"cannot store a weight holding inf or NaN as {precision}")
        fmt, bits, quantize = quantizers[precision]
        codes, scales, q = quantize(work.astype(np.float32), out_axis, block)
        flags, elements, extra = _split(codes, bool(prune), bits)
        if fmt == INT4:
            elements[-1] = _pack_nibbles(elements[-1])
        arrays = [scales.reshape(-1), *elements]
    else:
        target = None if _BITS[precision] >= w.dtype.itemsize * 8 else _FLOAT_TARGETS[precision]
        if target == "float16" and np.abs(work[np.isfinite(work)]).max(initial=0) > 65504:
            raise FormatError("a weight exceeds float16's range (65504); use bf16 or fp32 for it")
        fmt = SCHEMES[target or "plain"]
        stored = work.astype(_CAST_DTYPES[fmt]) if fmt != PLAIN else np.ascontiguousarray(work)
        flags, arrays, extra = _split(stored, bool(prune), stored.dtype.itemsize * 8)
        q = {"scheme": target or "plain"}
    q.update(extra, **({"pruned_below": float(prune)} if prune else {}))
    blob = bytearray()
    for arr in arrays:
        blob += bytes(-len(blob) % 8) + np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<")).tobytes()
    enc = EncodedTensor(fmt, flags, bytes(blob), {"quantization": q})
    if fmt != PLAIN or flags:
        q.update(error_stats(w, decode_tensor(enc.blob, w.shape, w.dtype, fmt, flags, enc.params)))
    return enc


def error_stats(original: np.ndarray, restored: np.ndarray) -> dict[str, float]:
    """``max_abs_error`` and ``rel_l2_error`` (||restored - original|| / ||original||).

    Example:
        >>> error_stats(np.array([1.0, 2.0]), np.array([1.0, 2.5]))["max_abs_error"]
        0.5
    """
    a, b = np.asarray(original, np.float64), np.asarray(restored, np.float64)
    diff = b - a
    norm = float(np.linalg.norm(a))
    return {"max_abs_error": float(np.abs(diff).max(initial=0.0)),
            "rel_l2_error": float(np.linalg.norm(diff) / norm) if norm else 0.0}


def decode_tensor(blob: bytes | memoryview | np.ndarray, shape: tuple[int, ...], dtype: Any, fmt: int, flags: int,
                  params: Any) -> np.ndarray:
    """The tensor in its original ``dtype`` and ``shape`` (a new read-only array).

    ``blob`` must be exactly :func:`stored_nbytes` long (the reader checks that first).
    """
    dtype = np.dtype(dtype)
    if stored_nbytes(shape, dtype, fmt, flags, params) != len(memoryview(blob).cast("B")):
        raise FormatError(f"stored tensor is {len(memoryview(blob).cast('B'))} bytes, not what its format says")
    q = params.get("quantization") or {}
    parts = _parts(shape, dtype, fmt, flags, q)
    offsets, _ = _offsets(parts)
    raw = {name: np.frombuffer(blob, dt, count, off) for (name, dt, count), off in zip(parts, offsets)}
    size = math.prod(shape)
    codes = raw["values"]
    if fmt == INT4:
        codes = _unpack_nibbles(codes, q["sparse"]["nnz"] if flags & SPARSE else size)
    if flags & SPARSE:
        mask = np.unpackbits(raw["bitmap"], count=size, bitorder="little").astype(bool)
        if int(mask.sum()) != codes.size:
            raise FormatError(f"the bitmap marks {int(mask.sum())} nonzeros but {codes.size} are stored")
        dense = np.zeros(size, codes.dtype)
        dense[mask] = codes
        codes = dense
    # (scales as stored: a file read without its checksums may hold any bits, infinities included)
    if fmt == INT8:
        view = [1] * len(shape)
        view[q["axis"]] = -1
        with np.errstate(over="ignore", invalid="ignore"):
            out = codes.reshape(shape).astype(np.float32) * raw["scales"].astype(np.float32).reshape(view)
    elif fmt == INT4:
        axis, block = q["axis"], q["block"]
        n_out = shape[axis]
        red = size // n_out if n_out else 0
        scales = raw["scales"].astype(np.float32).reshape(n_out, -1)
        with np.errstate(over="ignore", invalid="ignore"):
            rows = codes.reshape(n_out, red).astype(np.float32) * np.repeat(scales, block, axis=1)[:, :red]
        moved = (n_out, *(d for a, d in enumerate(shape) if a != axis))
        out = np.moveaxis(rows.reshape(moved), 0, axis)
    else:
        out = codes.reshape(shape)
    out = np.ascontiguousarray(out, dtype=dtype)
    out.flags.writeable = False
    return out


# --- a whole graph ------------------------------------------------------------------------------
class PrecisionChooser(Protocol):
    """What ``encode_weights`` asks of a precision plan (``metadef.format.precision``)."""

    def precision_for(self, weight: Weight, default: str | None) -> str | None: ...


def encode_weights(graph: Graph, *, quantize: str | None = None, prune: float | None = None,
                   plan: PrecisionChooser | None = None,
                   on_tensor: Callable[[Weight, EncodedTensor | None], None] | None = None,
                   ) -> dict[str, EncodedTensor]:
    """Encode each weight of ``graph`` (see ``find_weights``) as asked; returns name -> stored form.

    ``quantize`` is the default precision, ``plan`` overrides it per node, ``prune`` zeroes
    ``|w| < prune``. Weights left at their own dtype and not pruned are not in the result.
    """
    default = normalize_precision(quantize) if quantize else None
    if prune is not None and not (isinstance(prune, int | float) and prune >= 0 and math.isfinite(prune)):
        raise FormatError(f"prune={prune!r}: the threshold must be a finite number >= 0")
    out: dict[str, EncodedTensor] = {}
    for weight in find_weights(graph):
        precision = plan.precision_for(weight, default) if plan is not None else default
        enc = None
        if precision is not None or prune:
            try:
                enc = encode_tensor(weight.value.const, precision or "fp64", out_axis=weight.out_axis, prune=prune)
            except FormatError as e:
                raise FormatError(f"weight {weight.value.name!r} (read by {weight.readers[0].name}): {e}") from None
            if enc.format == PLAIN and not enc.flags:
                enc = None
            else:
                enc.quantization["node"] = weight.readers[0].name
                out[weight.value.name] = enc
        if on_tensor is not None:
            on_tensor(weight, enc)
    return out


__all__ = [
    "BFLOAT16", "FLOAT16", "FLOAT32", "INT4", "INT8", "PLAIN", "PRECISIONS", "SCHEMES", "SPARSE",
    "EncodedTensor", "Weight", "decode_tensor", "encode_tensor", "encode_weights", "error_stats",
    "find_weights", "normalize_precision", "quantizers", "stored_nbytes", "weight_rules",
]
