"""The structure of a graph's interface: which inputs and outputs are sequences or optionals.

metadef's IR holds tensors only. A model whose inputs or outputs are ONNX sequences or
optionals is *specialized* on their structure when it is imported (the way torch.compile
specializes on the length of a Python list and guards on it): a sequence of 3 tensors
becomes 3 tensor inputs ``seq.0``, ``seq.1``, ``seq.2``; an absent optional becomes no input
at all; a present one becomes what it holds. The graph keeps what the user sees as an
:class:`IOStructure` in ``graph.metadata["io_structure"]`` (plain JSON, so it survives
``save`` / ``load``), and the session maps a user's Python list / ``None`` to the flat tensors
(:meth:`IOStructure.flatten_feeds`) and the flat results back (:meth:`IOStructure.unflatten`).

A structure is one :data:`Spec` per user-level input and output: :class:`TensorSpec` (one
tensor), :class:`SequenceSpec` (its items' specs, in order) or :class:`OptionalSpec` (what it
holds, ``None`` when absent). A graph without sequences or optionals has no record.

Example:
    >>> import numpy as np
    >>> s = IOStructure(inputs=(("seq", SequenceSpec((TENSOR, TENSOR))), ("opt", OptionalSpec(None))),
    ...                 outputs=(("y", SequenceSpec((TENSOR,))),))
    >>> s.to_json()["inputs"]
    [['seq', {'sequence': ['tensor', 'tensor']}], ['opt', {'optional': None}]]
    >>> flat = s.flatten_feeds({"seq": [np.zeros(2), np.ones(3)], "opt": None}, ["seq.0", "seq.1"])
    >>> sorted(flat)
    ['seq.0', 'seq.1']
    >>> s.unflatten([np.ones(1)])
    {'y': [array([1.])]}
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from metadef.core.errors import GraphError, InputError, SpecializationError

STRUCTURE_KEY = "io_structure"
"""The ``graph.metadata`` key of a graph's :class:`IOStructure`."""


@dataclass(frozen=True)
class TensorSpec:
    """One tensor: one flat input or output.

    Example:
        >>> TENSOR.count, TENSOR.describe()
        (1, 'a tensor')
    """

    @property
    def count(self) -> int:
        return 1

    def describe(self) -> str:
        return "a tensor"


@dataclass(frozen=True)
class SequenceSpec:
    """A sequence of a fixed length: its items' specs, in order.

    Example:
        >>> SequenceSpec((TENSOR, TENSOR)).describe()
        'a sequence of 2 tensors'
    """

    items: tuple[Spec, ...]

    @property
    def count(self) -> int:
        return sum(s.count for s in self.items)

    def describe(self) -> str:
        if all(isinstance(s, TensorSpec) for s in self.items):
            return f"a sequence of {len(self.items)} tensor{'' if len(self.items) == 1 else 's'}"
        return f"a sequence of {len(self.items)} items ({', '.join(s.describe() for s in self.items)})"


@dataclass(frozen=True)
class OptionalSpec:
    """An optional: what it holds when present, ``None`` when absent.

    Example:
        >>> OptionalSpec(None).describe(), OptionalSpec(TENSOR).count
        ('an absent optional', 1)
    """

    value: Spec | None

    @property
    def count(self) -> int:
        return 0 if self.value is None else self.value.count

    def describe(self) -> str:
        return "an absent optional" if self.value is None else f"a present optional holding {self.value.describe()}"


Spec = TensorSpec | SequenceSpec | OptionalSpec
"""What one user-level input or output is."""

TENSOR = TensorSpec()


def spec_to_json(spec: Spec) -> Any:
    """A spec as plain JSON: ``"tensor"``, ``{"sequence": [...]}`` or ``{"optional": ... | None}``.

    Example:
        >>> spec_to_json(OptionalSpec(SequenceSpec((TENSOR,))))
        {'optional': {'sequence': ['tensor']}}
    """
    if isinstance(spec, SequenceSpec):
        return {"sequence": [spec_to_json(s) for s in spec.items]}
    if isinstance(spec, OptionalSpec):
        return {"optional": None if spec.value is None else spec_to_json(spec.value)}
    return "tensor"


def spec_from_json(data: Any) -> Spec:
    """The inverse of :func:`spec_to_json`; anything else raises GraphError.

    Example:
        >>> spec_from_json({"sequence": ["tensor"]})
        SequenceSpec(items=(TensorSpec(),))
    """
    if data == "tensor":
        return TENSOR
    if isinstance(data, dict) and len(data) == 1:
        if isinstance(data.get("sequence"), list):
            return SequenceSpec(tuple(spec_from_json(s) for s in data["sequence"]))
        if "optional" in data:
            return OptionalSpec(None if data["optional"] is None else spec_from_json(data["optional"]))
    raise GraphError(f"graph metadata {STRUCTURE_KEY!r} holds {str(data)[:80]!r}, which is not a spec "
                     "('tensor', {'sequence': [...]} or {'optional': ...})")


def spec_of(value: Any) -> Spec:
    """The structure of a Python value as a user passes it: a list or tuple is a sequence,
    ``None`` an absent optional, anything else a tensor.

    Example:
        >>> spec_of([np.zeros(2), np.zeros(3)]).describe(), spec_of(None).describe()
        ('a sequence of 2 tensors', 'an absent optional')
    """
    if value is None:
        return OptionalSpec(None)
    if isinstance(value, (list, tuple)):
        return SequenceSpec(tuple(spec_of(v) for v in value))
    return TENSOR


def _what(value: Any) -> str:
    """How a fed value reads in an error: ``a list of 2 values``, ``None``, ``an array``."""
    if value is None:
        return "None"
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)} value{'' if len(value) == 1 else 's'}"
    return f"{type(value).__name__}"


@dataclass(frozen=True)
class IOStructure:
    """Every user-level input and output of a graph, by name, with its :data:`Spec`, in order;
    the flat graph inputs (outputs) are the inputs' (outputs') tensors in that order."""

    inputs: tuple[tuple[str, Spec], ...]
    outputs: tuple[tuple[str, Spec], ...]
    values: tuple[tuple[str, Any], ...] = ()
    """Tensor inputs the graph was specialized on the value of (a split size, a position, a
    loop's trip count that decide a sequence's structure), with that value as nested lists:
    a run must feed exactly that value."""

    # --- the record in graph.metadata ------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The record as ``graph.metadata[STRUCTURE_KEY]`` holds it."""
        record = {"inputs": [[n, spec_to_json(s)] for n, s in self.inputs],
                  "outputs": [[n, spec_to_json(s)] for n, s in self.outputs]}
        if self.values:
            record["values"] = [[n, v] for n, v in self.values]
        return record

    @classmethod
    def from_json(cls, data: Any) -> IOStructure:
        """The inverse of :meth:`to_json`; a malformed record raises GraphError."""
        try:
            return cls(tuple((str(n), spec_from_json(s)) for n, s in data["inputs"]),
                       tuple((str(n), spec_from_json(s)) for n, s in data["outputs"]),
                       tuple((str(n), v) for n, v in data.get("values", ())))
        except (KeyError, TypeError, ValueError) as e:
            raise GraphError(f"graph metadata {STRUCTURE_KEY!r} is malformed: {type(e).__name__}: {e}") from None

    @classmethod
    def of(cls, graph: Any) -> IOStructure | None:
        """A graph's structure (None when it has no sequence or optional at its boundary),
        checked against its flat inputs and outputs.

        Example:
            >>> from metadef.ir import parse_graph
            >>> IOStructure.of(parse_graph("graph g(%x: f32[2]) -> (%y) { %y: f32[2] = Relu(%x) return %y }")) is None
            True
        """
        data = graph.metadata.get(STRUCTURE_KEY)
        if data is None:
            return None
        structure = cls.from_json(data)
        for kind, specs, flat in (("inputs", structure.inputs, graph.inputs),
                                  ("outputs", structure.outputs, graph.outputs)):
            count = sum(s.count for _, s in specs)
            if count != len(flat):
                raise GraphError(f"graph {graph.name}: its {STRUCTURE_KEY!r} record accounts for {count} "
                                 f"flat {kind}, but the graph has {len(flat)}: a pass added or removed "
                                 "an input or output without updating the record")
        return structure

    def describe(self, name: str) -> str:
        """``seq (a sequence of 3 tensors)`` for one user-level input."""
        spec = dict(self.inputs).get(name)
        return name if spec is None else f"{name} ({spec.describe()})"

    # --- user values <-> flat tensors ------------------------------------------------
    def accepts(self, feeds: Mapping[str, Any]) -> bool:
        """Whether ``feeds`` have the structure (and the specialized values) of this graph, so
        that :meth:`flatten_feeds` would not raise SpecializationError.

        Example:
            >>> s = IOStructure(inputs=(("seq", SequenceSpec((TENSOR,))),), outputs=())
            >>> s.accepts({"seq": [np.zeros(2)]}), s.accepts({"seq": []})
            (True, False)
        """
        try:
            self._check_values(feeds)
            for name, spec in self.inputs:
                if name in feeds:
                    _flatten(name, spec, feeds[name], [])
        except SpecializationError:
            return False
        except InputError:
            return True  # a mistake that no other specialization would fix either
        return True

    def _check_values(self, feeds: Mapping[str, Any]) -> None:
        for name, value in self.values:
            got = feeds.get(name)
            if got is None or isinstance(got, (list, tuple)):
                continue  # flatten_feeds says what is wrong
            if not np.array_equal(np.asarray(got), np.asarray(value)) or np.shape(got) != np.shape(value):
                raise SpecializationError(
                    f"input {name!r} decides the structure of a sequence or optional, so this graph was "
                    f"specialized on its value {value!r}; got {np.asarray(got).tolist()!r}. Import the model "
                    f"again with input_values={{{name!r}: ...}}, or compile it with metadef.compile_onnx, which "
                    "specializes on each value it is run with", inputs=(name,))

    def flatten_feeds(self, feeds: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
        """The flat feeds (by the graph's flat input ``names``) for a user's feeds: lists for
        sequence inputs, ``None`` for an absent optional. A missing or unknown name, or a value
        whose structure is not the one the graph was specialized for, raises InputError
        (SpecializationError for a length or presence that differs)."""
        known = [n for n, _ in self.inputs]
        unknown = [k for k in feeds if k not in known]
        if unknown:
            raise InputError(f"unknown input name(s) {unknown}; this model's inputs are: "
                             + ", ".join(self.describe(n) for n in known))
        self._check_values(feeds)
        flat: list[Any] = []
        for name, spec in self.inputs:
            if name not in feeds:
                if isinstance(spec, OptionalSpec) and spec.value is None:
                    continue  # an absent optional may be left out
                raise InputError(f"missing input {self.describe(name)}; pass it in the feeds dict")
            _flatten(name, spec, feeds[name], flat)
        if len(flat) != len(names):
            raise GraphError(f"the structure record gives {len(flat)} flat inputs for {len(names)} graph inputs")
        return dict(zip(names, flat))

    def unflatten(self, results: Sequence[Any]) -> dict[str, Any]:
        """The user-level outputs for the flat ``results`` (in the graph's output order):
        lists for sequences, ``None`` for an absent optional."""
        it = iter(results)
        return {name: _unflatten(spec, it) for name, spec in self.outputs}


def _flatten(where: str, spec: Spec, value: Any, out: list[Any]) -> None:
    if isinstance(spec, TensorSpec):
        if value is None or isinstance(value, (list, tuple)):
            use = "lists are for sequence inputs" if value is not None else "None is for an absent optional input"
            raise InputError(f"input {where!r} is a tensor; got {_what(value)} ({use}): pass a numpy array")
        out.append(value)
        return
    if isinstance(spec, OptionalSpec):
        if spec.value is None:
            if value is not None:
                raise SpecializationError(
                    f"input {where!r} is an optional that this graph was specialized as absent (it takes "
                    f"None); got {_what(value)}. Import the model again with optional_present="
                    f"{{{where.split('[')[0]!r}: True}}, or compile it with metadef.compile_onnx, which "
                    "specializes on each structure it is run with", inputs=(where.split("[")[0],))
            return
        if value is None:
            raise SpecializationError(
                f"input {where!r} is an optional that this graph was specialized as present ({spec.describe()}); "
                f"got None. Import the model again with optional_present={{{where.split('[')[0]!r}: False}}, "
                "or compile it with metadef.compile_onnx, which specializes on each structure it is run with",
                inputs=(where.split("[")[0],))
        _flatten(where, spec.value, value, out)
        return
    if not isinstance(value, (list, tuple)):
        raise InputError(f"input {where!r} is {spec.describe()}; got {_what(value)}: pass a list of arrays")
    if len(value) != len(spec.items):
        raise SpecializationError(
            f"input {where!r} was specialized at import as {spec.describe()}; got {_what(value)}. Import "
            f"the model again with sequence_lengths={{{where.split('[')[0]!r}: {len(value)}}}, or compile "
            "it with metadef.compile_onnx, which specializes on each length it is run with",
            inputs=(where.split("[")[0],))
    for i, (item, v) in enumerate(zip(spec.items, value)):
        _flatten(f"{where}[{i}]", item, v, out)


def _unflatten(spec: Spec, it: Iterator[Any]) -> Any:
    if isinstance(spec, TensorSpec):
        return next(it)
    if isinstance(spec, OptionalSpec):
        return None if spec.value is None else _unflatten(spec.value, it)
    return [_unflatten(s, it) for s in spec.items]


__all__ = ["STRUCTURE_KEY", "TENSOR", "IOStructure", "OptionalSpec", "SequenceSpec", "Spec", "TensorSpec",
           "spec_from_json", "spec_of", "spec_to_json"]
