"""Fused groups (zoo and random chains), dynamic sizes without recompiling, and bad inputs."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import metadef as md
from metadef.codegen import CodegenUnsupported, compile_count, compile_group, compile_node
from metadef.core.errors import BackendError
from metadef.ir import Graph, GraphBuilder
from metadef.ops.strategy import Role
from metadef.shape import evaluate_shape, free_symbols, parse_type
from tests.codegen.support import check_group, check_node, one_node, random

pytestmark = pytest.mark.jit

SIZES = {"batch": 2, "seq": 7}


@functools.cache
def optimized(name: str) -> Graph:
    return md.optimize(md.import_onnx(md.zoo.build(name, seed=0)), level="aggressive")


def _feeds(body: Graph) -> list[np.ndarray]:
    arrays = []
    for v in body.inputs:
        env = {s: SIZES.get(s, 3) for d in v.type.shape if not isinstance(d, int) for s in free_symbols(d)}
        shape = tuple(evaluate_shape(v.type.shape, env))
        arrays.append(random(shape, v.type.dtype.numpy, 0, 1) if v.type.dtype.numpy.kind in "iub"
                      else random(shape, v.type.dtype.numpy))
    return arrays


def _has_contraction(body: Graph) -> bool:
    return any(n.metaop.role is Role.CONTRACTION for n in body.nodes)


@pytest.mark.parametrize("name", ["mlp", "mobilenetv2", pytest.param("resnet50", marks=pytest.mark.slow),
                                  pytest.param("bert", marks=pytest.mark.slow)])
def test_zoo_groups(name: str) -> None:
    """Every fused group without a contraction compiles and matches the body's reference."""
    for node in optimized(name).nodes:
        if node.op != "Fused":
            continue
        body = node.attrs["body"]
        if _has_contraction(body):
            with pytest.raises(CodegenUnsupported, match="contraction"):
                compile_group(body, node.name)
            continue
        check_group(body, _feeds(body))


@pytest.mark.slow
def test_zoo_single_nodes() -> None:
    """The unfused nodes of BERT that have an index expression compile and match too."""
    seen = set()
    for node in optimized("bert").nodes:
        if node.op == "Fused" or node.op in seen or node.metaop.role is Role.CONTRACTION:
            continue
        seen.add(node.op)
        try:
            kernel = compile_node(node)
        except CodegenUnsupported as e:
            assert str(e).startswith(node.op), e
            continue
        assert kernel.name.startswith(node.op)


def test_bert_style_layer_norm_group() -> None:
    b = GraphBuilder("ln")
    x = b.input("x", parse_type("f32[batch,seq,16]"))
    pos = b.input("pos", parse_type("f32[seq,16]"))
    bias = b.input("bias", parse_type("f32[16]"))
    scale, shift = b.const("scale", random((16,))), b.const("shift", random((16,)))
    s1, = b.node("Add", [x, pos])
    s2, = b.node("Add", [s1, bias])
    y, = b.node("LayerNormalization", [s2, scale, shift], {"axis": 2, "epsilon": 1e-12})
    b.output(y)
    body = b.build()
    check_group(body, [random((2, 5, 16)), random((5, 16)), random((16,))])


def test_group_with_two_outputs_and_reused_intermediate() -> None:
    b = GraphBuilder("two")
    x = b.input("x", parse_type("f32[n,8]"))
    e, = b.node("Exp", [x])
    s, = b.node("Softmax", [e], {"axis": -1})
    r, = b.node("Relu", [x])
    b.output(s, e, r)
    check_group(b.build(), [random((3, 8))])


def test_reduce_then_broadcast_back() -> None:
    b = GraphBuilder("center")
    x = b.input("x", parse_type("f32[n,c,4]"))
    axes = b.const("axes", np.array([1], np.int64))
    m, = b.node("ReduceMean", [x, axes], {"keepdims": 1})
    d, = b.node("Sub", [x, m])
    b.output(d)
    check_group(b.build(), [random((2, 5, 4))])


def test_one_kernel_for_every_batch_size() -> None:
    graph = one_node("Gelu", ["f32[batch,seq,24]"])
    kernel = compile_node(graph.nodes[0])
    before = compile_count()
    for batch in (1, 3, 17):
        check_node(graph, [random((batch, 5, 24))])
    assert compile_node(graph.nodes[0]) is kernel
    assert compile_count() == before


def test_same_structure_is_cached() -> None:
    a = one_node("Softmax", ["f32[b,s,12]"], {"axis": -1})
    b = one_node("Softmax", ["f32[x,y,12]"], {"axis": -1})
    assert compile_node(a.nodes[0]) is compile_node(b.nodes[0])
    c = one_node("Softmax", ["f32[b,s,13]"], {"axis": -1})
    assert compile_node(c.nodes[0]) is not compile_node(a.nodes[0])


def test_elementwise_groups_of_one_shape_are_one_flat_kernel() -> None:
    """An elementwise group whose values all have one shape is compiled flat: one kernel for
    every such shape (ResNet's Relu epilogues over 64 channels of 56 x 56 or 512 of 7 x 7), a
    loop over all the elements; its operands must still share one shape."""
    def add_relu(shape: str) -> Graph:
        b = GraphBuilder("g")
        t = parse_type(f"f32[{shape}]")
        y, = b.node("Add", [b.input("x", t), b.input("r", t)])
        z, = b.node("Relu", [y])
        b.output(z)
        return b.build()

    first = compile_group(add_relu("n,64,7,7"), "add_relu")
    assert first.flat
    before = compile_count()
    for shape in ("n,128,7,7", "n,64,14,14", "2,3,5"):
        assert compile_group(add_relu(shape), "add_relu") is first
    assert compile_count() == before
    for shape in ((2, 64, 7, 7), (1, 3, 5), (4, 9)):
        x, r = random(shape), random(shape)
        out = np.empty(shape, np.float32)
        first([x, r], [out])
        np.testing.assert_array_equal(out, np.maximum(x + r, 0))
        assert first.dims_for([shape, shape], [shape])[-1] == math.prod(shape)
    x = random((2, 6, 5))
    out = np.empty((2, 5, 6), np.float32)
    first([x.transpose(0, 2, 1), x.transpose(0, 2, 1)], [out])  # (an input not contiguous: copied)
    np.testing.assert_array_equal(out, np.maximum(2 * x.transpose(0, 2, 1), 0))
    # (the value names are those of the first body compiled to this code: another test's, maybe)
    with pytest.raises(BackendError, match=r"input 1 \(%.*\) has shape \(2, 32, 7, 7\), but input 0 .* share one"):
        first([random((2, 64, 7, 7)), random((2, 32, 7, 7))], [np.empty((2, 64, 7, 7), np.float32)])
    with pytest.raises(BackendError, match=r"output 0 has shape \(64, 2\), but input 0"):
        first.dims_for([(2, 64), (2, 64)], [(64, 2)])
    with pytest.raises(BackendError, match="writeable C-contiguous"):
        first([random((4, 2))] * 2, [np.empty((2, 4), np.float32).T])
    with pytest.raises(BackendError, match="not a numpy array"):
        first([[1.0], random((1,))], [np.empty(1, np.float32)])


def test_bad_inputs_raise_backend_error() -> None:
    kernel = compile_node(one_node("Add", ["f32[n,4]", "f32[4]"]).nodes[0])
    out = np.empty((2, 4), np.float32)
    good = [random((2, 4)), random((4,))]
    with pytest.raises(BackendError, match=r"kernel Add.*input 1 \(%x1\) has dtype float64"):
        kernel([good[0], good[1].astype(np.float64)], [out])
    with pytest.raises(BackendError, match=r"input 0 \(%x0\) has rank 3"):
        kernel([random((2, 4, 1)), good[1]], [out])
    with pytest.raises(BackendError, match=r"input 1 \(%x1\) has shape \(5,\) but dim 0 must be 4"):
        kernel([good[0], random((5,))], [out])
    with pytest.raises(BackendError, match=r"output 0 .* is 3 but must be n = 2"):
        kernel(good, [np.empty((3, 4), np.float32)])
    with pytest.raises(BackendError, match="takes 2 inputs"):
        kernel(good[:1], [out])
    with pytest.raises(BackendError, match="writeable C-contiguous"):
        kernel(good, [np.empty((4, 2), np.float32).T])
    kernel([np.asfortranarray(good[0]), good[1]], [out])  # any layout in, made contiguous
    np.testing.assert_allclose(out, good[0] + good[1])


def test_runtime_broadcast_is_checked() -> None:
    graph = one_node("Add", ["f32[a,4]", "f32[b,4]"])
    kernel = compile_node(graph.nodes[0])
    out = np.empty((3, 4), np.float32)
    check_node(graph, [random((3, 4)), random((1, 4))])
    check_node(graph, [random((1, 4)), random((3, 4))])
    with pytest.raises(BackendError, match="does not broadcast"):
        kernel([random((3, 4)), random((2, 4))], [out])


def test_unsupported_says_why() -> None:
    with pytest.raises(CodegenUnsupported, match=r"^MatMul at .*contraction"):
        compile_node(one_node("MatMul", ["f32[n,4]", "f32[4,3]"]).nodes[0])
    with pytest.raises(CodegenUnsupported, match=r"^TopK at .*opaque"):
        compile_node(one_node("TopK", ["f32[n,4]", "i64[1]"], consts={1: np.array([2])}).nodes[0])


# ------------------------------------------------------------------------ random chains

_UNARY = ["Relu", "Sigmoid", "Tanh", "Exp", "Neg", "Abs", "Softsign", "Gelu", "HardSwish"]
_BINARY = ["Add", "Sub", "Mul", "Max", "Min"]


@st.composite
def _chains(draw: st.DrawFn) -> tuple[list[tuple], int]:
    steps = draw(st.lists(st.tuples(st.sampled_from(_UNARY + _BINARY), st.integers(0, 10),
                                     st.booleans()), min_size=1, max_size=6))
    return steps, draw(st.integers(1, 9))


@settings(max_examples=25, deadline=None)
@given(_chains())
def test_random_elementwise_chains(chain: tuple[list[tuple], int]) -> None:
    steps, batch = chain
    b = GraphBuilder("chain")
    values = [b.input("x", parse_type("f32[n,6]")), b.input("y", parse_type("f32[6]"))]
    for op, pick, scale in steps:
        if op in _BINARY:
            other = values[pick % len(values)]
            out, = b.node(op, [values[-1], other] if scale else [other, values[-1]])
        else:
            out, = b.node(op, [values[-1]])
        values.append(out)
    b.output(values[-1])
    check_group(b.build(), [random((batch, 6), low=-2, high=2), random((6,), low=-2, high=2)],
                rtol=1e-4, atol=1e-5)
