"""ONNX export of weights stored quantized in an .mdef file: the stored integers (or halves)
as the initializer, and a standard node that restores the float weight.

- ``int8`` (per output channel): int8 codes + float32 scales ``[C]`` -> ``DequantizeLinear``
  with ``axis``.
- ``int4`` (blockwise along the reduction axis): int4 codes + scales -> opset-21
  ``DequantizeLinear`` with ``axis`` and ``block_size``. A 2-D weight keeps its own layout
  (its blocks run along its reduction axis); a weight of higher rank (Conv ``[K,C,R,S]``) is
  dequantized as metadef stores it, ``[K, C*R*S]``, then reshaped (and transposed back when
  the output axis is not the first).
- ``float16`` / ``bfloat16`` / ``float32`` (of float64): the stored tensor -> ``Cast``.

Scales go out as float32 even when the file holds them as float16 (lossless): ONNX Runtime
then computes ``code * scale`` in float32, exactly as metadef's reader does, so both run on
bit-identical weights. Pruned (SPARSE) weights, and constants that no longer hold what the
file stored (a pass changed them), go out as plain floats.

The stored bytes are read from the file (``MdefFile.path`` at ``tensor_info(name).offset``)
and checked against the record's checksum.

Example:
    >>> import metadef as md, tempfile, pathlib
    >>> p = md.save(md.import_onnx(md.zoo.build("mlp")), pathlib.Path(tempfile.mkdtemp()) / "q.mdef",
    ...             quantize="int8")
    >>> m = md.load(p)
    >>> w = m.graph.value("fc1.weight")
    >>> inits, nodes = stored_weight(m.file, w, "fc1.weight", lambda s: s)
    >>> [n.op_type for n in nodes], inits[0].data_type == onnx.TensorProto.INT8
    (['DequantizeLinear'], True)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import onnx
from onnx import helper, numpy_helper

from metadef.format import layout
from metadef.format.quantize import BFLOAT16, FLOAT16, FLOAT32, INT4, INT8, SPARSE
from metadef.format.records import TensorInfo
from metadef.ir import Value

Exported = tuple[list[onnx.TensorProto], list[onnx.NodeProto]]
"""A weight as initializers plus the nodes that compute the graph's value from them."""
Namer = Callable[[str], str]
"""Gives a unique exported name for a wanted one."""

_SCALE_DTYPES = {"float16": np.dtype("<f2"), "float32": np.dtype("<f4")}
_CAST_DTYPES = {FLOAT16: np.dtype("<f2"), BFLOAT16: np.dtype(ml_dtypes.bfloat16), FLOAT32: np.dtype("<f4")}


def _aligned(n: int) -> int:
    return -(-n // 8) * 8


def _stored_bytes(file: Any, info: TensorInfo) -> bytes:
    with open(file.path, "rb") as f:
        f.seek(info.offset)
        raw = f.read(info.nbytes)
    if len(raw) != info.nbytes or layout.checksum(raw) != info.checksum:
        raise OSError(f"{file.path}: tensor {info.name!r} changed on disk since it was opened")
    return raw


def _to_float(x: str, out: str, dtype: np.dtype, nodes: list[onnx.NodeProto], namer: Namer) -> str:
    """Name of a value ``x`` (float32) cast to ``dtype`` when that differs; ``out`` is the last name."""
    if dtype == np.float32:
        return x
    nodes.append(helper.make_node("Cast", [x], [out], to=helper.np_dtype_to_tensor_dtype(dtype), name=out))
    return out


def _int8(raw: bytes, info: TensorInfo, q: dict[str, Any], name: str, namer: Namer) -> Exported:
    axis, shape = q["axis"], info.shape
    sdt = _SCALE_DTYPES[q["scale_dtype"]]
    scales = np.frombuffer(raw, sdt, shape[axis], 0).astype(np.float32)
    codes = np.frombuffer(raw, np.int8, math.prod(shape), _aligned(shape[axis] * sdt.itemsize)).reshape(shape)
    qn, sn = namer(f"{name}_quantized"), namer(f"{name}_scale")
    deq = name if info.dtype.numpy == np.float32 else namer(f"{name}_float32")
    nodes = [helper.make_node("DequantizeLinear", [qn, sn], [deq], axis=axis, name=namer(f"{name}_dequantize"))]
    _to_float(deq, name, info.dtype.numpy, nodes, namer)
    return [numpy_helper.from_array(codes, qn), numpy_helper.from_array(scales, sn)], nodes


def _unpack_nibbles(packed: np.ndarray, count: int) -> np.ndarray:
    out = np.empty(packed.size * 2, np.int8)
    out[0::2], out[1::2] = packed & 0xF, packed >> 4
    return np.where(out > 7, out - 16, out).astype(np.int8)[:count]


def _int4(raw: bytes, info: TensorInfo, q: dict[str, Any], name: str, namer: Namer) -> Exported:
    axis, block, shape = q["axis"], q["block"], info.shape
    n_out = shape[axis]
    red = math.prod(shape) // n_out if n_out else 0
    nblk = -(-red // block)
    sdt = _SCALE_DTYPES[q["scale_dtype"]]
    scales = np.frombuffer(raw, sdt, n_out * nblk, 0).astype(np.float32).reshape(n_out, nblk)
    packed = np.frombuffer(raw, np.uint8, -(-(n_out * red) // 2), _aligned(n_out * nblk * sdt.itemsize))
    codes = _unpack_nibbles(packed, n_out * red).reshape(n_out, red)
    qn, sn = namer(f"{name}_quantized"), namer(f"{name}_scale")
    f32 = info.dtype.numpy == np.float32
    nodes: list[onnx.NodeProto] = []
    if len(shape) == 2 and axis == 1:  # [red, out]: blocks run down axis 0, in the weight's own layout
        codes, scales, dq_axis, last = codes.T, scales.T, 0, True
    else:
        dq_axis, last = 1, len(shape) == 2
    deq = name if last and f32 else namer(f"{name}_dequantized")
    nodes.append(helper.make_node("DequantizeLinear", [qn, sn], [deq], axis=dq_axis, block_size=block,
                                  name=namer(f"{name}_dequantize")))
    inits = [numpy_helper.from_array(np.ascontiguousarray(codes).astype(ml_dtypes.int4), qn),
             numpy_helper.from_array(np.ascontiguousarray(scales), sn)]
    if not last:  # [out, red] -> [out, *others] -> the weight's own axis order
        moved = [n_out, *(d for a, d in enumerate(shape) if a != axis)]
        shape_name = namer(f"{name}_shape")
        inits.append(numpy_helper.from_array(np.array(moved, np.int64), shape_name))
        perm = list(range(1, axis + 1)) + [0] + list(range(axis + 1, len(shape)))
        final = name if f32 else namer(f"{name}_float32")
        reshaped = final if axis == 0 else namer(f"{name}_moved")
        nodes.append(helper.make_node("Reshape", [deq, shape_name], [reshaped], name=namer(f"{name}_reshape")))
        if axis != 0:
            nodes.append(helper.make_node("Transpose", [reshaped], [final], perm=perm, name=namer(f"{name}_transpose")))
        deq = final
    _to_float(deq, name, info.dtype.numpy, nodes, namer)
    return inits, nodes


def _cast(raw: bytes, info: TensorInfo, q: dict[str, Any], name: str, namer: Namer) -> Exported:
    dt = _CAST_DTYPES[info.format]
    stored = np.frombuffer(raw, dt, math.prod(info.shape), 0).reshape(info.shape)
    sn = namer(f"{name}_{q['scheme']}")
    node = helper.make_node("Cast", [sn], [name], to=helper.np_dtype_to_tensor_dtype(info.dtype.numpy),
                            name=namer(f"{name}_cast"))
    return [numpy_helper.from_array(np.ascontiguousarray(stored), sn)], [node]


dequantize_rules: dict[int, Callable[[bytes, TensorInfo, dict[str, Any], str, Namer], Exported]] = {
    INT8: _int8, INT4: _int4, FLOAT16: _cast, BFLOAT16: _cast, FLOAT32: _cast,
}
"""How each stored weight format exports, keyed by the index's format code."""


def stored_weight(file: Any, value: Value, name: str, namer: Namer) -> Exported | None:
    """Constant ``value`` (exported as ``name``) in the stored form it has in ``file`` (an
    ``MdefFile``), or None when it is stored plain, pruned, absent, or no longer what the file
    holds. See the module doc for an example."""
    try:
        info = file.tensor_info(value.name)
    except KeyError:
        return None
    rule = dequantize_rules.get(info.format)
    if rule is None or info.flags & SPARSE or info.quantization is None:
        return None
    stored = file.tensor(value.name)
    const = value.const
    if const is not stored and (const is None or const.shape != stored.shape or not np.array_equal(const, stored)):
        return None
    return rule(_stored_bytes(file, info), info, dict(info.quantization), name, namer)


__all__ = ["Exported", "dequantize_rules", "stored_weight"]
