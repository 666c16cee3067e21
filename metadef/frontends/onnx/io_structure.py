"""Sequence and optional values at the ONNX graph's boundary, specialized at import.

metadef's IR holds tensors only, so a model whose graph inputs are sequences or optionals is
specialized on their structure when it is imported (see :mod:`metadef.ir.structure`):

- a sequence input ``seq`` of length n (``import_onnx(..., sequence_lengths={"seq": n})``)
  becomes n tensor inputs ``seq.0`` ... ``seq.{n-1}``, typed by the sequence's element type;
  each item gets its own symbols (``seq_0_N`` for a ``dim_param`` ``N``), since the items of a
  sequence may differ in size;
- an optional input (``optional_present={"opt": True}``) becomes what it holds (a tensor input
  ``opt``, or the items of a sequence), an absent one (``False``) no input at all;
- a sequence graph output becomes its items (outputs ``out.0``, ``out.1``, ...), an empty
  optional output no output.

The record of what the user sees is written to ``graph.metadata["io_structure"]``; the session
maps lists and ``None`` to the flat tensors and back. A sequence or optional input whose
structure was not given fails with :class:`~metadef.core.errors.SpecializationError` naming
the input and the keyword (or use ``metadef.compile_onnx``, which specializes on each
structure it is run with).

Example:
    >>> import numpy as np, metadef as md
    >>> from onnx import helper, TensorProto as T
    >>> g = helper.make_graph(
    ...     [helper.make_node("ConcatFromSequence", ["seq"], ["y"], axis=0)], "g",
    ...     [helper.make_tensor_sequence_value_info("seq", T.FLOAT, ["n"])],
    ...     [helper.make_tensor_value_info("y", T.FLOAT, None)])
    >>> m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 12)])
    >>> graph = md.import_onnx(m, sequence_lengths={"seq": 2})
    >>> [str(v.type) for v in graph.inputs]
    ['f32[seq_0_n]', 'f32[seq_1_n]']
    >>> md.compile(graph).run({"seq": [np.ones(2, np.float32), np.zeros(1, np.float32)]})["y"]
    array([1., 1., 0.], dtype=float32)
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from metadef.core.errors import SpecializationError, UnsupportedOpError
from metadef.frontends.onnx.sequences import Imported, NoneValue, SequenceValue
from metadef.ir import Value
from metadef.ir.structure import TENSOR, IOStructure, OptionalSpec, SequenceSpec, Spec, TensorSpec


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name).strip("_") or "seq"


def _item(name: str, elem: onnx.TypeProto, index: int, where: str) -> onnx.ValueInfoProto:
    """Item ``index`` of sequence input ``name`` as a tensor ValueInfo, with symbols of its own."""
    if elem.WhichOneof("value") != "tensor_type":
        raise UnsupportedOpError(f"{where} {name!r} is a sequence of {elem.WhichOneof('value') or 'untyped'} "
                                 "values; metadef specializes sequences of tensors only")
    item = onnx.ValueInfoProto(name=f"{name}.{index}")
    item.type.CopyFrom(elem)
    prefix = f"{_safe(name)}_{index}"
    for axis, d in enumerate(item.type.tensor_type.shape.dim):
        if d.HasField("dim_param"):
            d.dim_param = f"{prefix}_{d.dim_param}"
        elif not d.HasField("dim_value"):
            d.dim_param = f"{prefix}_d{axis}"
    return item


def _length(name: str, lengths: Mapping[str, int], where: str) -> int:
    if name not in lengths:
        raise SpecializationError(
            f"{where} {name!r} is a sequence; metadef specializes a graph on the length of each sequence "
            f"input: import it with sequence_lengths={{{name!r}: N}} (then run it with lists of N arrays), "
            "or compile the model with metadef.compile_onnx, which specializes on each length it is run with")
    n = lengths[name]
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise SpecializationError(f"sequence_lengths[{name!r}] is {n!r}; a length is an int >= 0")
    return n


def specialize_input(vi: onnx.ValueInfoProto, lengths: Mapping[str, int], present: Mapping[str, bool],
                     where: str = "graph input") -> tuple[Spec, list[onnx.ValueInfoProto]]:
    """A graph input's spec and the flat tensor inputs it becomes (a tensor input: itself).

    Example:
        >>> from onnx import helper, TensorProto as T
        >>> vi = helper.make_tensor_sequence_value_info("s", T.FLOAT, [3])
        >>> spec, flat = specialize_input(vi, {"s": 2}, {})
        >>> spec.describe(), [f.name for f in flat]
        ('a sequence of 2 tensors', ['s.0', 's.1'])
    """
    kind = vi.type.WhichOneof("value")
    if kind == "sequence_type":
        n = _length(vi.name, lengths, where)
        return SequenceSpec((TENSOR,) * n), [_item(vi.name, vi.type.sequence_type.elem_type, i, where)
                                             for i in range(n)]
    if kind != "optional_type":
        return TENSOR, [vi]  # a tensor (or a kind the importer refuses with its own message)
    if vi.name not in present:
        raise SpecializationError(
            f"{where} {vi.name!r} is an optional; metadef specializes a graph on whether each optional input "
            f"is present: import it with optional_present={{{vi.name!r}: True}} (or False, then run it with "
            "None), or compile the model with metadef.compile_onnx, which specializes on each run's structure")
    if not present[vi.name]:
        return OptionalSpec(None), []
    elem = vi.type.optional_type.elem_type
    held = onnx.ValueInfoProto(name=vi.name)
    held.type.CopyFrom(elem)
    spec, flat = specialize_input(held, lengths, present, where)
    return OptionalSpec(spec), flat


def check_hints(inputs: Sequence[onnx.ValueInfoProto], lengths: Mapping[str, int],
                present: Mapping[str, bool], values: Mapping[str, Any] = {}) -> None:
    """``sequence_lengths`` names sequence inputs (or optional ones holding a sequence),
    ``optional_present`` optional inputs and ``input_values`` tensor inputs only; anything else
    is a mistake worth saying.

    Example:
        >>> from onnx import helper, TensorProto as T
        >>> try:
        ...     check_hints([helper.make_tensor_value_info("x", T.FLOAT, [2])], {"x": 2}, {})
        ... except SpecializationError as e:
        ...     print(str(e)[:40])
        sequence_lengths names ['x'], which is n
    """
    kinds = {vi.name: vi.type.WhichOneof("value") for vi in inputs}
    holds = {vi.name: vi.type.optional_type.elem_type.WhichOneof("value") for vi in inputs}
    sequences = [n for n in kinds if kinds[n] == "sequence_type" or holds[n] == "sequence_type"]
    optionals = [n for n in kinds if kinds[n] == "optional_type"]
    tensors = [n for n in kinds if kinds[n] == "tensor_type"]
    for keyword, given, allowed, what in (("sequence_lengths", lengths, sequences, "sequence"),
                                          ("optional_present", present, optionals, "optional"),
                                          ("input_values", values, tensors, "tensor")):
        wrong = [n for n in given if n not in allowed]
        if wrong:
            raise SpecializationError(f"{keyword} names {wrong}, which {'is' if len(wrong) == 1 else 'are'} not "
                                      f"{what} input(s) of this graph; its {what} inputs are {allowed or 'none'}")


def structure_hints(inputs: Sequence[onnx.ValueInfoProto],
                    feeds: Mapping[str, Any]) -> tuple[dict[str, int], dict[str, bool]]:
    """The ``sequence_lengths`` and ``optional_present`` that specialize a graph for ``feeds``
    (a list for a sequence input, None for an absent optional), read against the inputs'
    declared types.

    Example:
        >>> from onnx import helper, TensorProto as T
        >>> ins = [helper.make_tensor_sequence_value_info("s", T.FLOAT, None),
        ...        helper.make_value_info("o", helper.make_optional_type_proto(
        ...            helper.make_tensor_type_proto(T.FLOAT, None)))]
        >>> structure_hints(ins, {"s": [1, 2, 3], "o": None})
        ({'s': 3}, {'o': False})
    """
    lengths: dict[str, int] = {}
    present: dict[str, bool] = {}
    for vi in inputs:
        kind = vi.type.WhichOneof("value")
        if vi.name not in feeds or kind not in ("sequence_type", "optional_type"):
            continue
        value = feeds[vi.name]
        if kind == "optional_type":
            present[vi.name] = value is not None
        if isinstance(value, (list, tuple)):
            lengths[vi.name] = len(value)
    return lengths, present


def assemble(spec: Spec, flat: Iterator[Value]) -> Imported | None:
    """The importer's value for a spec whose tensors are ``flat`` (in order): a Value, a
    :class:`SequenceValue`, a :class:`NoneValue` (an absent optional).

    Example:
        >>> assemble(OptionalSpec(None), iter([]))
        NoneValue(items=())
    """
    if isinstance(spec, TensorSpec):
        return next(flat)
    if isinstance(spec, OptionalSpec):
        return NoneValue(()) if spec.value is None else assemble(spec.value, flat)
    return SequenceValue(tuple(assemble(s, flat) for s in spec.items))


def flatten(value: Imported) -> tuple[Spec, list[Value]]:
    """The spec of an importer's value and its tensors, in order (the inverse of :func:`assemble`).

    Example:
        >>> flatten(NoneValue(()))
        (OptionalSpec(value=None), [])
    """
    if isinstance(value, NoneValue):
        return OptionalSpec(None), []
    if isinstance(value, SequenceValue):
        specs, items = [], []
        for item in value.items:
            spec, flat = flatten(item)
            specs.append(spec)
            items += flat
        return SequenceSpec(tuple(specs)), items
    return TENSOR, [value]


def output_spec(vi: onnx.ValueInfoProto, value: Imported) -> tuple[Spec, list[Value]]:
    """A graph output's spec (a present optional output says so) and its tensors.

    Example:
        >>> from onnx import helper, TensorProto as T
        >>> held = helper.make_tensor_type_proto(T.FLOAT, None)
        >>> vi = helper.make_value_info("o", helper.make_optional_type_proto(held))
        >>> output_spec(vi, SequenceValue(()))[0].describe()
        'a present optional holding a sequence of 0 tensors'
    """
    spec, flat = flatten(value)
    if vi.type.WhichOneof("value") == "optional_type" and not isinstance(spec, OptionalSpec):
        spec = OptionalSpec(spec)
    return spec, flat


def structure_record(inputs: Iterable[tuple[str, Spec]], outputs: Iterable[tuple[str, Spec]],
                     values: Mapping[str, np.ndarray] = {}) -> IOStructure | None:
    """The graph's :class:`IOStructure` (with the ``values`` its tensor inputs were
    specialized on), or None when every input and output is a tensor and none was.

    Example:
        >>> structure_record([("x", TENSOR)], [("y", TENSOR)]) is None
        True
        >>> structure_record([("x", TENSOR)], [("y", TENSOR)], {"x": np.array(3)}).values
        (('x', 3),)
    """
    structure = IOStructure(tuple(inputs), tuple(outputs), tuple((n, v.tolist()) for n, v in values.items()))
    if not values and all(isinstance(s, TensorSpec) for _, s in (*structure.inputs, *structure.outputs)):
        return None
    return structure


def specialized_value(vi: onnx.ValueInfoProto, value: Any, dtype: np.dtype) -> np.ndarray:
    """``input_values[vi.name]`` as an array of the input's dtype, checked against its
    declared shape (a SpecializationError names what differs).

    Example:
        >>> from onnx import helper, TensorProto as T
        >>> specialized_value(helper.make_tensor_value_info("k", T.INT64, [1]), [2], np.dtype(np.int64))
        array([2])
    """
    arr = np.asarray(value)
    if arr.dtype != dtype and not np.can_cast(arr, dtype, casting="same_kind"):
        raise SpecializationError(f"input_values[{vi.name!r}] has dtype {arr.dtype}; the input is {dtype}")
    arr = arr.astype(dtype)
    dims = vi.type.tensor_type.shape.dim if vi.type.tensor_type.HasField("shape") else None
    if dims is not None and (len(dims) != arr.ndim or any(
            d.HasField("dim_value") and d.dim_value != n for d, n in zip(dims, arr.shape))):
        declared = [d.dim_value if d.HasField("dim_value") else d.dim_param or "?" for d in dims]
        raise SpecializationError(f"input_values[{vi.name!r}] has shape {list(arr.shape)}; the input is "
                                  f"declared {declared}")
    return arr


__all__ = ["assemble", "check_hints", "flatten", "output_spec", "specialize_input", "specialized_value",
           "structure_hints", "structure_record"]
