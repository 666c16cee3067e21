"""Control flow around sequences and optionals, resolved at import time.

metadef's ``If`` and ``Loop`` carry tensors only. Where a sequence or an optional flows
through them, the importer resolves the structure while importing, with the rules of
:data:`structured_rules` (by op name; a rule returns None when the node needs none of this and
imports as usual):

- ``Identity`` of a sequence or optional is that sequence or optional;
- ``Loop`` whose loop-carried values include a sequence is unrolled: its body is imported once
  per iteration (the trip count and the condition must be known at import, or depend on graph
  inputs, which are then specialized on their value); scan outputs are stacked;
- ``If`` whose condition is known at import and whose branches give (or read) sequences or
  optionals is replaced by the chosen branch. With a condition known only at run time, both
  branches must give the same structure (the same lengths, the same optionals present): the
  ``If`` then carries their tensors (:func:`branch_structure`).

Example:
    >>> import numpy as np, onnx, metadef as md
    >>> from onnx import helper, TensorProto as T
    >>> body = helper.make_graph(
    ...     [helper.make_node("Identity", ["c"], ["c_out"]),
    ...      helper.make_node("Cast", ["i"], ["f"], to=T.FLOAT),
    ...      helper.make_node("SequenceInsert", ["s", "f"], ["s_out"])], "body",
    ...     [helper.make_tensor_value_info("i", T.INT64, []), helper.make_tensor_value_info("c", T.BOOL, []),
    ...      helper.make_tensor_sequence_value_info("s", T.FLOAT, None)],
    ...     [helper.make_tensor_value_info("c_out", T.BOOL, []),
    ...      helper.make_tensor_sequence_value_info("s_out", T.FLOAT, None)])
    >>> g = helper.make_graph(
    ...     [helper.make_node("SequenceEmpty", [], ["empty"], dtype=T.FLOAT),
    ...      helper.make_node("Loop", ["n", "", "empty"], ["seq"], body=body),
    ...      helper.make_node("ConcatFromSequence", ["seq"], ["y"], axis=0, new_axis=1)], "g", [],
    ...     [helper.make_tensor_value_info("y", T.FLOAT, None)],
    ...     [helper.make_tensor("n", T.INT64, [], [3])])
    >>> graph = md.import_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))
    >>> md.compile(graph).run({})["y"]
    array([0., 1., 2.], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx

from metadef.core.errors import UnsupportedOpError
from metadef.frontends.onnx.sequences import (
    Imported,
    SequenceNode,
    SequenceValue,
    import_time_value,
    inputs_behind,
    needs_value,
)
from metadef.ir import GraphBuilder, Value
from metadef.ir.structure import Spec, TensorSpec

MAX_UNROLLED = 10_000
"""The most iterations of a Loop over sequences the importer unrolls."""

StructuredRule = Callable[[SequenceNode], "list[Imported] | None"]


def _identity(n: SequenceNode) -> list[Imported] | None:
    x = n.inputs[0] if n.inputs else None
    return [x] if isinstance(x, SequenceValue) else None


def _stack(n: SequenceNode, items: list[Imported], k: int) -> Value:
    """Scan output ``k``: the iterations' values stacked along a new first axis."""
    if not items:
        raise UnsupportedOpError(f"{n.where}: the loop runs zero times, so its scan output {k} has no "
                                 "item to take a type from")
    if any(isinstance(x, SequenceValue) for x in items):
        raise UnsupportedOpError(f"{n.where}: scan output {k} is a sequence; a scan output stacks tensors")
    axes = n.int64s(f"scan{k}_axes", [0])
    return n.node("Concat", [n.node("Unsqueeze", [x, axes])[0] for x in items], {"axis": 0})[0]


def _loop(n: SequenceNode) -> list[Imported] | None:
    carried = list(n.inputs[2:])
    if not any(isinstance(x, SequenceValue) for x in carried):
        return None  # a Loop over tensors: a Loop node
    trip = n.tensor(0) if n.inputs else None
    cond = n.tensor(1) if len(n.inputs) > 1 else None
    if trip is None and cond is None:
        raise UnsupportedOpError(f"{n.where}: a Loop with neither a trip count nor a condition never ends")
    limit = None if trip is None else int(n.constant(0).reshape(-1)[0])
    going = True if cond is None else bool(n.constant(1).reshape(-1)[0])
    cond_in: Value = cond if cond is not None else n.builder.const(f"{n.name}_true", np.array(True))
    scans: list[list[Imported]] = []
    i = 0
    while going and (limit is None or i < limit):
        if i >= MAX_UNROLLED:
            raise UnsupportedOpError(f"{n.where}: a Loop over sequences runs more than {MAX_UNROLLED} "
                                     "iterations; metadef unrolls such loops at import time")
        count = n.builder.const(f"{n.name}_iteration{i}", np.array(i, np.int64))
        got = n.body("body", [count, cond_in, *carried], f"iteration{i}")
        cond_out, carried, scan = got[0], got[1:1 + len(carried)], got[1 + len(carried):]
        if cond is not None:
            value = import_time_value(n.builder, cond_out) if isinstance(cond_out, Value) else None
            if value is None:
                raise needs_value(n.builder, cond_out, f"{n.where}: the loop condition after iteration {i}") \
                    if isinstance(cond_out, Value) else UnsupportedOpError(f"{n.where}: the condition is not a tensor")
            going, cond_in = bool(value.reshape(-1)[0]), cond_out
        scans.append(scan)
        i += 1
    n_scans = len(n.graphs["body"].output) - 1 - len(carried)
    return [*carried, *(_stack(n, [s[k] for s in scans], k) for k in range(n_scans))]


def _reads(graph: onnx.GraphProto) -> set[str]:
    """Every name a graph's nodes read (nested subgraphs included): a superset of what it
    reads from enclosing scopes."""
    names = {vi.name for vi in graph.output}
    for node in graph.node:
        names.update(node.input)
        for a in node.attribute:
            for sub in [a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs:
                names |= _reads(sub)
    return names


def _structured_type(t: onnx.TypeProto) -> bool:
    return t.WhichOneof("value") in ("sequence_type", "optional_type")


def _if(n: SequenceNode) -> list[Imported] | None:
    branches = [n.graphs[k] for k in ("then_branch", "else_branch") if k in n.graphs]
    captures = any(isinstance(n.scope.get(name), SequenceValue) for b in branches for name in _reads(b))
    structured = captures or any(_structured_type(vi.type) for b in branches for vi in b.output)
    if not structured:
        return None
    cond = n.value(0)
    if cond is None:
        if captures:  # a branch reads a sequence: it is inlined, so the condition must be known
            raise needs_value(n.builder, n.tensor(0), f"{n.where}: the condition of an If whose branches read "
                                                      "a sequence or an optional")
        return None  # both branches must give the same structure: see branch_structure
    chosen = "then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"
    return n.body(chosen, [], chosen)


structured_rules: dict[str, StructuredRule] = {
    "Identity": _identity,
    "Loop": _loop,
    "If": _if,
}
"""Ops of the default domain that take or give sequences and optionals in some cases, by op
name: each rule returns the node's outputs, or None to import the node as usual."""


def branch_structure(b: GraphBuilder, cond: Value | None, specs: Mapping[str, Sequence[Spec]],
                     where: str) -> list[Spec] | None:
    """The structure of an If's outputs from its branches' (``specs`` by branch name): None
    when every output is a tensor, the shared structure when both agree; otherwise the
    condition must be known at import (a SpecializationError when it depends on graph inputs).

    Example:
        >>> from metadef.ir.structure import TENSOR, OptionalSpec
        >>> branch_structure(GraphBuilder("g"), None, {"then_branch": [TENSOR], "else_branch": [TENSOR]}, "If")
        >>> branch_structure(GraphBuilder("g"), None, {"then_branch": [OptionalSpec(None)],
        ...                                            "else_branch": [OptionalSpec(None)]}, "If")
        [OptionalSpec(value=None)]
    """
    lists = [list(s) for s in specs.values()]
    if all(isinstance(s, TensorSpec) for specs_ in lists for s in specs_):
        return None
    if all(s == lists[0] for s in lists):
        return lists[0]
    told = "; ".join(f"{k} gives ({', '.join(s.describe() for s in v)})" for k, v in specs.items())
    if cond is not None and inputs_behind(b, cond):
        raise needs_value(b, cond, f"{where}: the condition, which picks between branches of different "
                                   f"structures ({told}),")
    raise UnsupportedOpError(f"{where}: the branches give values of different structures ({told}) and the "
                             "condition is known only at run time; metadef resolves sequences and optionals "
                             "at import time")


__all__ = ["MAX_UNROLLED", "branch_structure", "structured_rules"]
