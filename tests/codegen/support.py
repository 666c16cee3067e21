"""Helpers for the codegen tests: build one-node graphs, run kernels and the numpy oracle."""

from __future__ import annotations

from typing import Any

import numpy as np

from metadef.codegen import compile_group, compile_node
from metadef.ir import Graph
from metadef.ops import get_op
from metadef.ops.defs.fused import run_body
from metadef.ops.interface import resolve_attrs
from metadef.ops.numpy_eval import run_node
from metadef.shape import TensorType, bind_shape, evaluate_shape
from metadef.testing.onnx_cases import one_node_graph

RNG = np.random.default_rng(0)


def random(shape: tuple[int, ...], dtype: Any = np.float32, low: float = -3, high: float = 3) -> np.ndarray:
    if np.dtype(dtype).kind == "b":
        return RNG.random(shape) < 0.5
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(int(low), int(high) + 1, shape).astype(dtype)
    return RNG.uniform(low, high, shape).astype(dtype)


one_node = one_node_graph


def concrete_types(graph: Graph, arrays: list[np.ndarray]) -> list[TensorType]:
    env: dict[str, int] = {}
    for v, a in zip(graph.inputs, arrays):
        bind_shape(v.type.shape, a.shape, env)
    return [v.type.with_shape(evaluate_shape(v.type.shape, env)) for v in graph.outputs]


def check_node(graph: Graph, arrays: list[np.ndarray], rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """The node's compiled kernel agrees with ``run_node`` on ``arrays`` (graph inputs)."""
    node = graph.nodes[0]
    kernel = compile_node(node)
    feeds = dict(zip((v.name for v in graph.inputs), arrays))
    args = [None if v is None else feeds.get(v.name, v.const) for v in node.inputs]
    op = get_op(node.op, node.domain)
    attrs = resolve_attrs(op.name, "(test)", op.attrs, node.attrs)
    types = concrete_types(graph, arrays)
    want = run_node(op, attrs, args, types, node.name)
    got = [np.empty(t.shape, t.dtype.numpy) for t in types]
    kernel([a for a in args if a is not None], got)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol)


def check_group(body: Graph, arrays: list[np.ndarray], rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """A group body's compiled kernel agrees with the reference interpretation of the body."""
    kernel = compile_group(body, body.name)
    want = run_body(body, arrays)
    got = [np.empty(w.shape, w.dtype) for w in want]
    kernel(arrays, got)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol)
