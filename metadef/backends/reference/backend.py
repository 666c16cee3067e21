"""The reference backend: a numpy interpreter, the project's own oracle.

Each node runs from its meta-op's semantic expression (through the vectorized evaluator) or,
for opaque ops, from the op's explicit numpy reference. Nothing here knows an op by name.

Example:
    >>> import numpy as np
    >>> from metadef.ir import parse_graph
    >>> g = parse_graph("graph g(%x: f32[n]) -> (%y) { %y: f32[n] = Relu(%x) return %y }")
    >>> ReferenceBackend().compile(g).run({"x": np.array([-1.0, 2.0], np.float32)}, {"n": 2})
    [array([0., 2.], dtype=float32)]
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from metadef.backends.base import plan_frees
from metadef.core.dtypes import from_numpy
from metadef.core.errors import BackendError, MetadefError
from metadef.core.run_profile import RunProfile, measure, median_rows
from metadef.ir import Graph, Node, format_node
from metadef.ops import MetaOp, infer_types
from metadef.ops.interface import resolve_attrs
from metadef.ops.numpy_eval import run_node, tensor_names
from metadef.shape import TensorType, evaluate_shape


@dataclass
class _Step:
    node: Node
    op: MetaOp
    attrs: dict[str, Any]
    in_ids: list[int | None]
    out_ids: list[int]


class ReferenceExecutable:
    """A graph prepared for interpretation: values numbered, attributes resolved."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        ids: dict[int, int] = {}
        for v in graph.values():
            ids[id(v)] = len(ids)
        self.slots = len(ids)
        self.input_ids = [ids[id(v)] for v in graph.inputs]
        self.consts = [(ids[id(v)], v.const) for v in graph.constants]
        self.output_ids = [ids[id(v)] for v in graph.outputs]
        self.steps = []
        for n in graph.nodes:
            op = n.metaop
            attrs = resolve_attrs(op.name, f"(node {n.name})", op.attrs, n.attrs)
            self.steps.append(_Step(n, op, attrs, [None if v is None else ids[id(v)] for v in n.inputs],
                                    [ids[id(v)] for v in n.outputs]))
        self.frees = plan_frees(self.steps, set(self.output_ids) | {i for i, _ in self.consts})

    def _out_types(self, step: _Step, args: list[np.ndarray | None],
                   symbols: Mapping[str, int]) -> list[TensorType]:
        try:
            types = [o.type for o in step.node.outputs]
            if all(t is not None and t.shape is not None for t in types):
                return [t.with_shape(evaluate_shape(t.shape, symbols)) for t in types]
        except MetadefError:
            pass  # a size that depends on values: infer it from the concrete inputs below
        concrete = [None if a is None else TensorType(from_numpy(a.dtype), a.shape) for a in args]
        return infer_types(step.op, step.node.name, concrete, step.node.attrs, args,
                           n_outputs=len(step.node.outputs))

    def run(self, feeds: Mapping[str, np.ndarray], symbols: Mapping[str, int]) -> list[np.ndarray]:
        return self._run(feeds, symbols, None)

    def profile(self, feeds: Mapping[str, np.ndarray], symbols: Mapping[str, int], runs: int = 10,
                warmup: int = 2) -> RunProfile:
        """Each node's time, the median over ``runs`` runs after ``warmup``.

        Example:
            >>> from metadef.ir import parse_graph
            >>> g = parse_graph("graph g(%x: f32[n]) -> (%y) { %y: f32[n] = Relu(%x) @r return %y }")
            >>> p = ReferenceBackend().compile(g).profile({"x": np.ones(3, np.float32)}, {"n": 3}, runs=2)
            >>> [(r.node, r.op, r.what) for r in p.rows]
            [('r', 'Relu', 'numpy')]
        """
        def timed() -> list[float]:
            times: list[float] = []
            self._run(feeds, symbols, times)
            return times

        timings, wall = measure(lambda: self._run(feeds, symbols, None), timed, runs, warmup)
        units = [(step.node.name, step.node.qualop, "numpy", 0) for step in self.steps]
        return RunProfile(median_rows(timings, units), max(1, runs), "reference", dict(symbols), wall)

    def _run(self, feeds: Mapping[str, np.ndarray], symbols: Mapping[str, int],
             times: list[float] | None) -> list[np.ndarray]:
        slots: list[Any] = [None] * self.slots
        for v, i in zip(self.graph.inputs, self.input_ids):
            slots[i] = feeds[v.name]
        for i, data in self.consts:
            slots[i] = data
        for step, frees in zip(self.steps, self.frees):
            args = [None if i is None else slots[i] for i in step.in_ids]
            start = time.perf_counter() if times is not None else 0.0
            try:
                outs = run_node(step.op, step.attrs, args, self._out_types(step, args, symbols),
                                step.node.name)
            except MetadefError:
                raise
            except Exception as e:  # numpy's own errors: say which node
                raise BackendError(f"reference backend failed at node:\n  {format_node(step.node)}\n"
                                   f"  {type(e).__name__}: {e}") from e
            if times is not None:
                times.append(time.perf_counter() - start)
            for i, o in zip(step.out_ids, outs):
                slots[i] = o
            for i in frees:
                slots[i] = None
        return [slots[i] for i in self.output_ids]


class ReferenceBackend:
    """The numpy oracle as a backend (``metadef.compile(graph, target="reference")``)."""

    name = "reference"

    def compile(self, graph: Graph, **options: Any) -> ReferenceExecutable:
        if options:
            raise BackendError(f"the reference backend takes no options, got {sorted(options)}")
        return ReferenceExecutable(graph)


__all__ = ["ReferenceBackend", "ReferenceExecutable", "run_node", "tensor_names"]
