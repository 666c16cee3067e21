"""Contractions (MatMul, Gemm, Einsum): shape inference, errors, numerics against ORT."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import metadef as md
from metadef.core.errors import ShapeError
from metadef.ops import get_op, infer_types
from metadef.ops.defs.linalg import einsum_semantics, gemm_semantics, matmul_semantics
from metadef.shape import parse_type
from metadef.testing.onnx_cases import check_model, one_node_model

OPS = ["MatMul", "Gemm", "Einsum"]
_ONNX_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
               np.dtype(np.int32): TensorProto.INT32, np.dtype(np.int64): TensorProto.INT64}


def infer(op: str, types: list[str | None], attrs: dict | None = None) -> list[str]:
    ins = [None if t is None else parse_type(t) for t in types]
    return [str(t) for t in infer_types(get_op(op), "/lin/node", ins, attrs or {})]


def check_against_ort(op: str, feeds: dict[str, np.ndarray], rtol: float = 1e-5,
                      opset: int = 21, **attrs) -> None:
    check_model(one_node_model(op, feeds, opset=opset, **attrs), feeds, rtol=rtol, atol=1e-6)


def rand(*shape: int, dtype: type = np.float32, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + len(shape)).standard_normal(shape).astype(dtype)


# ----------------------------------------------------------------------- shape inference


def test_matmul_shapes_are_symbolic_and_promote_1d_operands() -> None:
    assert infer("MatMul", ["f32[batch,seq,768]", "f32[768,3072]"]) == ["f32[batch,seq,3072]"]
    assert infer("MatMul", ["f32[k]", "f32[b,k,n]"]) == ["f32[b,n]"]
    assert infer("MatMul", ["f32[b,m,k]", "f32[k]"]) == ["f32[b,m]"]
    assert infer("MatMul", ["f32[k]", "f32[k]"]) == ["f32[]"]
    assert infer("MatMul", ["f32[3,1,m,k]", "f32[2,k,n]"]) == ["f32[3,2,m,n]"]


def test_matmul_error_names_node_and_constraint() -> None:
    with pytest.raises(ShapeError, match=r"/lin/node.*expects K to agree: got 768 .* and 512"):
        infer("MatMul", ["f32[b,128,768]", "f32[512,64]"])
    with pytest.raises(ShapeError, match="rank >= 1"):
        infer("MatMul", ["f32[]", "f32[3]"])


def test_matmul_semantics_by_rank() -> None:
    assert matmul_semantics({}, [(2, 3), (3,)]) == "Y[..., m] = sum[k] A[..., m, k] * B[k]"
    assert matmul_semantics({}, [(3,), (3,)]) == "Y[] = sum[k] A[k] * B[k]"


def test_gemm_shapes_transposes_and_bias_check() -> None:
    attrs = {"transA": 1, "transB": 1}
    assert infer("Gemm", ["f32[k,batch]", "f32[n,k]", "f32[n]"], attrs) == ["f32[batch,n]"]
    with pytest.raises(ShapeError, match=r"/lin/node.*expects K to agree: got 4 \(A\) and 5"):
        infer("Gemm", ["f32[3,4]", "f32[5,6]"])
    with pytest.raises(ShapeError, match=r"C \[7\] must broadcast to \[M, N\] = \[3,6\]"):
        infer("Gemm", ["f32[3,4]", "f32[4,6]", "f32[7]"])


def test_gemm_semantics_drops_unit_factors() -> None:
    attrs = {"alpha": 1.0, "beta": 0.5, "transA": 1, "transB": 0}
    assert gemm_semantics(attrs, [(4, 3), (4, 5), (5,)]) == \
        "Y[m, n] = sum[k] A[k, m] * B[k, n] + beta * C[n]"


def test_einsum_shapes_with_ellipsis_and_implicit_output() -> None:
    assert infer("Einsum", ["f32[b,2,3]", "f32[3,4]"], {"equation": "...ij,jk->...ik"}) == \
        ["f32[b,2,4]"]
    assert infer("Einsum", ["f32[5,4]", "f32[4,3]"], {"equation": "ij,jk"}) == ["f32[5,3]"]
    assert infer("Einsum", ["f32[b,5,5]"], {"equation": "...ii->...i"}) == ["f32[b,5]"]
    with pytest.raises(ShapeError, match="expects j to agree: got 3 and 4"):
        infer("Einsum", ["f32[2,3]", "f32[4,5]"], {"equation": "ij,jk->ik"})
    with pytest.raises(ShapeError, match="2 operands but the node has 1 inputs"):
        infer("Einsum", ["f32[2,3]"], {"equation": "ij,jk->ik"})


def test_einsum_semantics_names_ellipsis_axes() -> None:
    text = einsum_semantics({"equation": "...ij->j"}, [(2, 3, 4, 5)])
    assert text == "Output[vj] = sum[e0, e1, vi] Inputs_0[e0, e1, vi, vj]"


# ----------------------------------------------------------------------- numerics vs ORT


@pytest.mark.parametrize("a,b", [((4,), (2, 4, 3)), ((2, 3, 4), (4,)), ((4,), (4,)),
                                 ((3, 1, 2, 4), (5, 4, 2))])
def test_matmul_matches_ort(a: tuple, b: tuple) -> None:
    check_against_ort("MatMul", {"a": rand(*a), "b": rand(*b, seed=1)})


def test_matmul_int64_matches_ort() -> None:
    rng = np.random.default_rng(3)
    check_against_ort("MatMul", {"a": rng.integers(-9, 9, (2, 3, 4)),
                                 "b": rng.integers(-9, 9, (4, 5))})


@pytest.mark.parametrize("c", [None, (), (1,), (5,), (3, 1), (3, 5)])
def test_gemm_matches_ort(c: tuple | None) -> None:
    feeds = {"a": rand(4, 3), "b": rand(5, 4, seed=1)}
    if c is not None:
        feeds["c"] = rand(*c, seed=2)
    check_against_ort("Gemm", feeds, alpha=0.5, beta=2.0, transA=1, transB=1)


@pytest.mark.parametrize("equation,shapes", [
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (1, 5, 4, 2)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
    ("ii", [(4, 4)]),
    ("ij,ij,ij->i", [(3, 4), (3, 4), (3, 4)]),
    ("...ij->...j", [(2, 3, 4, 5)]),
    ("Ab,bC->AC", [(3, 4), (4, 2)]),
])
def test_einsum_matches_ort(equation: str, shapes: list[tuple]) -> None:
    feeds = {f"x{i}": rand(*s, dtype=np.float64, seed=i) for i, s in enumerate(shapes)}
    check_against_ort("Einsum", feeds, equation=equation)


def test_einsum_reduces_ellipsis_axes_like_numpy() -> None:
    # ORT and numpy refuse to reduce ellipsis axes; ONNX allows it (a plain sum is the oracle).
    x = rand(2, 3, 4, 5, dtype=np.float64)
    node = helper.make_node("Einsum", ["x"], ["y"], equation="...ij->j")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.DOUBLE,
                                                                          x.shape)],
                              [helper.make_empty_tensor_value_info("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    got = md.compile(md.import_onnx(model), target="reference").run({"x": x})["y"]
    np.testing.assert_allclose(got, x.sum(axis=(0, 1, 2)))


@pytest.mark.slow
def test_conformance_linalg() -> None:
    from metadef.testing.conformance import format_report, run_cases

    report = run_cases(op=OPS)
    assert not report.failures(), format_report(report)
