"""Small ONNX test cases: one-node models, and running them on metadef and ONNX Runtime.

The op tests of every family build the same kind of model (one node, feeds as graph inputs,
constants as initializers) and compare the reference backend with ONNX Runtime; this module
is that one helper.

Example:
    >>> import numpy as np
    >>> m = one_node_model("Relu", {"x": np.array([-1.0, 2.0], np.float32)})
    >>> check_model(m, {"x": np.array([-1.0, 2.0], np.float32)})
    >>> infer_text("Relu", ["f32[batch,8]"])
    ['f32[batch,8]']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

import metadef as md
from metadef.ir import GraphBuilder
from metadef.ops import get_op, infer_types
from metadef.shape import ShapeEnv, parse_type
from metadef.testing.oracle import run_onnxruntime


def one_node_graph(op: str, types: Sequence[str | None], attrs: Mapping[str, Any] | None = None,
                   domain: str = "", consts: Mapping[int, np.ndarray] | None = None) -> md.Graph:
    """A metadef graph of one node (no ONNX involved); ``types`` like ``"f32[n,4]"`` (None: an
    omitted input), ``consts`` the inputs, by position, that are constants instead."""
    b = GraphBuilder("t")
    inputs = []
    for i, t in enumerate(types):
        if t is None:
            inputs.append(None)
        elif consts and i in consts:
            inputs.append(b.const(f"c{i}", consts[i]))
        else:
            inputs.append(b.input(f"x{i}", parse_type(t)))
    b.output(*b.node(op, inputs, dict(attrs or {}), domain=domain))
    return b.build()


def one_node_model(op: str, feeds: Mapping[str, np.ndarray], consts: Mapping[str, np.ndarray] | None = None,
                   inputs: Sequence[str] | None = None, n_out: int = 1, opset: int = 21, *,
                   output_prefix: str = "out", **attrs: Any) -> onnx.ModelProto:
    """A model of one node: ``feeds`` are graph inputs, ``consts`` initializers; the node reads
    ``inputs`` (default: the feeds, then the constants) and writes ``out0``, ``out1``, ..."""
    consts = dict(consts or {})
    outs = [f"{output_prefix}{i}" for i in range(n_out)]
    node = helper.make_node(op, list(inputs) if inputs is not None else [*feeds, *consts], outs, **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.asarray(a).dtype), np.shape(a))
         for n, a in feeds.items()],
        [helper.make_empty_tensor_value_info(o) for o in outs],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def run_metadef(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The model's outputs on metadef's reference backend, in output order."""
    got = md.compile(md.import_onnx(model), target="reference").run(feeds)
    return [np.asarray(got[o.name]) for o in model.graph.output]


def run_both(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The model's outputs on metadef's reference backend and on ONNX Runtime, in output order."""
    want = run_onnxruntime(model, feeds)
    return run_metadef(model, feeds), [np.asarray(want[o.name]) for o in model.graph.output]


def assert_same(got: Sequence[np.ndarray], want: Sequence[np.ndarray], rtol: float = 1e-5,
                atol: float = 1e-6) -> None:
    """Same number of outputs, and each with the same shape, dtype and values (within tolerance)."""
    assert len(got) == len(want), (len(got), len(want))
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        if g.dtype.kind in "fc":
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol)
        else:
            np.testing.assert_array_equal(g, w)


def check_model(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], rtol: float = 1e-5,
                atol: float = 1e-6) -> None:
    """metadef's reference backend agrees with ONNX Runtime on ``model``."""
    assert_same(*run_both(model, feeds), rtol=rtol, atol=atol)


def infer_text(op: str, types: Sequence[str | None], attrs: Mapping[str, Any] | None = None,
               values: Sequence[Any] | None = None, n_outputs: int | None = None,
               env: ShapeEnv | None = None, node: str = "/node") -> list[str]:
    """Output types of one op in text form (``["f32[batch,8]"]``) from input types in text form;
    ``values`` are constant inputs (lists become int64 arrays; object arrays of dims pass as is)."""
    ins = [None if t is None else parse_type(t) for t in types]
    vals = [None if v is None else v if isinstance(v, np.ndarray) and v.dtype == object
            else np.asarray(v) if isinstance(v, np.ndarray) else np.asarray(v, np.int64)
            for v in (values or [])]
    outs = infer_types(get_op(op), node, ins, dict(attrs or {}), vals, env, n_outputs)
    return [str(t) for t in outs]


__all__ = ["assert_same", "check_model", "infer_text", "one_node_graph", "one_node_model", "run_both", "run_metadef"]
