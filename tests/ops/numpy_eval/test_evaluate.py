"""The vectorized numpy evaluator of semantic programs, checked against numpy and loops."""

from __future__ import annotations

import itertools
import math
import time

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metadef.core.errors import SemanticsError
from metadef.ops.numpy_eval.evaluate import evaluate, functions
from metadef.ops.numpy_eval.functions import erf
from metadef.ops.semantics import ACCESS_FUNCTIONS, FUNCTION_ARITIES

CONV = "Y[n,k,p,q] = B[k] + sum[c,r,s] X[n,c,p*sh+r*dh-pt,q*sw+s*dw-pl] * W[k,c,r,s]"
GROUPED = ("Y[n, g*KG+kk, p, q] = sum[c,r,s] X[n, g*CG+c, p*sh+r*dh-pt, q*sw+s*dw-pl]"
           " * W[g*KG+kk, c, r, s]")
MAXPOOL = "Y[n,c,p,q] = max[r:KH, s:KW] fill(X[n,c,p*sh+r*dh-pt, q*sw+s*dw-pl], -inf)"
WINDOW = "X[n,c,p*sh+r*dh-pt, q*sw+s*dw-pl]"
AVGPOOL_EXCLUDE = f"Y[n,c,p,q] = sum[r:KH, s:KW] {WINDOW} / sum[r:KH, s:KW] inbounds({WINDOW})"
AVGPOOL_INCLUDE = f"Y[n,c,p,q] = sum[r:KH, s:KW] {WINDOW} / (KH * KW)"
SOFTMAX = ("t_max[...] = max[a] X[...,a]\n"
           "t_e[...,a] = exp(X[...,a] - t_max[...])\n"
           "Y[...,a] = t_e[...,a] / sum[b] t_e[...,b]")

rng = np.random.default_rng(0)


def randn(*shape: int, dtype: type = np.float64) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


def run(text: str, out_shape: tuple[int, ...] | None = None, params: dict | None = None,
        **tensors: np.ndarray) -> np.ndarray:
    return evaluate(text, tensors, params or {}, None if out_shape is None else {"Y": out_shape})["Y"]


# ------------------------------------------------------------------------- loop references


def conv_loops(x: np.ndarray, w: np.ndarray, out_hw: tuple[int, int], stride: tuple[int, int],
               dilation: tuple[int, int], pad: tuple[int, int], group: int = 1) -> np.ndarray:
    """A naive grouped 2-D convolution: zero padding on top/left (pad), whatever fits below."""
    n_, _, h_, w_ = x.shape
    k_, cg, r_, s_ = w.shape
    kg = k_ // group
    out = np.zeros((n_, k_, *out_hw))
    for n, k, p, q in itertools.product(range(n_), range(k_), range(out_hw[0]), range(out_hw[1])):
        g = k // kg
        for c, r, s in itertools.product(range(cg), range(r_), range(s_)):
            i = p * stride[0] + r * dilation[0] - pad[0]
            j = q * stride[1] + s * dilation[1] - pad[1]
            if 0 <= i < h_ and 0 <= j < w_:
                out[n, k, p, q] += x[n, g * cg + c, i, j] * w[k, c, r, s]
    return out


def pool_loops(x: np.ndarray, out_hw: tuple[int, int], kernel: tuple[int, int],
               stride: tuple[int, int], dilation: tuple[int, int], pad: tuple[int, int],
               kind: str) -> np.ndarray:
    n_, c_, h_, w_ = x.shape
    out = np.zeros((n_, c_, *out_hw))
    for n, c, p, q in itertools.product(range(n_), range(c_), range(out_hw[0]), range(out_hw[1])):
        window = []
        for r, s in itertools.product(range(kernel[0]), range(kernel[1])):
            i = p * stride[0] + r * dilation[0] - pad[0]
            j = q * stride[1] + s * dilation[1] - pad[1]
            if 0 <= i < h_ and 0 <= j < w_:
                window.append(x[n, c, i, j])
        if kind == "max":
            out[n, c, p, q] = max(window, default=-np.inf)
        elif kind == "avg_exclude":
            out[n, c, p, q] = sum(window) / len(window)
        else:
            out[n, c, p, q] = sum(window) / (kernel[0] * kernel[1])
    return out


def window_params(stride: tuple[int, int], dilation: tuple[int, int],
                  pad: tuple[int, int]) -> dict[str, int]:
    return {"sh": stride[0], "sw": stride[1], "dh": dilation[0], "dw": dilation[1],
            "pt": pad[0], "pl": pad[1]}


def out_size(size: int, kernel: int, stride: int, dilation: int, before: int, after: int) -> int:
    return (size + before + after - dilation * (kernel - 1) - 1) // stride + 1


# --------------------------------------------------------------------------- elementwise


def test_broadcasting_add_follows_numpy() -> None:
    a, b = randn(2, 1, 4), randn(3, 1)
    np.testing.assert_array_equal(run("Y[...] = A[...] + B[...]", A=a, B=b), a + b)


def test_where_with_tensor_condition_and_param_slope() -> None:
    c, a, b = rng.random((3, 4)) > 0.5, randn(3, 4), randn(4)
    np.testing.assert_array_equal(run("Y[...] = where(C[...], A[...], B[...])", A=a, B=b, C=c),
                                  np.where(c, a, b))
    x = randn(5, 6, dtype=np.float32)
    y = run("Y[...] = where(X[...] < 0, alpha * X[...], X[...])", params={"alpha": 0.1}, X=x)
    assert y.dtype == np.float32  # the Python-float param does not upcast
    np.testing.assert_allclose(y, np.where(x < 0, np.float32(0.1) * x, x))


def test_gelu_matches_float64_reference() -> None:
    x = np.linspace(-6, 6, 1001)
    y = run("Y[...] = X[...] * 0.5 * (1 + erf(X[...] / 1.4142135623730951))", X=x)
    ref = np.array([v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x])
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-300)


def test_erf_is_accurate_and_keeps_float_dtypes() -> None:
    x = np.concatenate([np.linspace(-7, 7, 20001), [0.0, 1e-200, 2.5, np.inf, -np.inf]])
    ref = np.array([math.erf(v) for v in x])
    np.testing.assert_allclose(erf(x), ref, rtol=1e-13, atol=0)
    assert erf(np.ones(3, np.float32)).dtype == np.float32
    assert erf(np.ones(3, ml_dtypes.bfloat16)).dtype == ml_dtypes.bfloat16
    assert np.isnan(erf(np.array([np.nan])))[0]


def test_every_language_function_has_an_implementation_with_its_arity() -> None:
    for name, arity in FUNCTION_ARITIES.items():
        if name not in ACCESS_FUNCTIONS:
            assert functions[name][0] == arity, name


@pytest.mark.parametrize(("func", "ref"), [
    ("sigmoid", lambda x: 1 / (1 + np.exp(-x))), ("softplus", lambda x: np.log1p(np.exp(x))),
    ("relu", lambda x: np.maximum(x, 0)), ("rsqrt", lambda x: 1 / np.sqrt(np.abs(x) + 1)),
    ("round", np.round), ("tanh", np.tanh), ("reciprocal", lambda x: 1 / x),
])
def test_unary_functions(func: str, ref) -> None:
    x = np.array([-2.5, -0.5, 0.5, 1.5, 2.5, 3.0], np.float32)
    arg = "abs(X[...]) + 1" if func == "rsqrt" else "X[...]"
    y = run(f"Y[...] = {func}({arg})", X=x)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, ref(x), rtol=1e-6)


def test_integer_division_truncates_and_mod_follows_numpy() -> None:
    a = np.array([7, -7, 7, -7], np.int32)
    b = np.array([2, 2, -2, -2], np.int32)
    y = run("Y[...] = A[...] / B[...]", A=a, B=b)
    assert y.dtype == np.int32 and y.tolist() == [3, -3, -3, 3]
    assert run("Y[...] = A[...] % B[...]", A=a, B=b).tolist() == np.mod(a, b).tolist()
    assert run("Y[...] = A[...] / 2.0", A=a).tolist() == [3.5, -3.5, 3.5, -3.5]


def test_dtypes_comparisons_casts_and_out_dtypes() -> None:
    x = np.arange(4, dtype=np.int8)
    assert run("Y[...] = X[...] + 1", X=x).dtype == np.int8
    assert run("Y[...] = X[...] < 2", X=x).dtype == np.bool_
    assert run("Y[...] = cast_bfloat16(X[...]) * 0.5", X=x).dtype == ml_dtypes.bfloat16
    y = evaluate("Y[i] = X[i] * 2", {"X": x}, {}, None, {"Y": np.dtype(np.float16)})["Y"]
    assert y.dtype == np.float16 and y.tolist() == [0, 2, 4, 6]


def test_index_variables_read_as_values() -> None:
    eye = run("Y[i, j] = where(i == j, 1.0, 0.0)", (3, 4))
    np.testing.assert_array_equal(eye, np.eye(3, 4))
    x = randn(4, 4)
    np.testing.assert_array_equal(
        run("Y[i, j] = where(j >= i + K, X[i, j], 0)", params={"K": 1}, X=x), np.triu(x, 1))


def test_scalar_broadcast_to_out_shape() -> None:
    y = run("Y[...] = 1.0", (2, 3))
    assert y.shape == (2, 3) and (y == 1).all()


# ---------------------------------------------------------------------------- contractions


def test_matmul_with_batch_broadcasting_uses_einsum(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    einsum = np.einsum

    def spy(*args, **kwargs):
        calls.append(args[0])
        return einsum(*args, **kwargs)

    monkeypatch.setattr(np, "einsum", spy)
    a, b = randn(2, 1, 3, 4), randn(5, 4, 6)
    y = run("Y[...,m,n] = sum[k] A[...,m,k] * B[...,k,n]", A=a, B=b)
    assert y.shape == (2, 5, 3, 6) and len(calls) == 1
    np.testing.assert_allclose(y, a @ b)


def test_gemm_with_transposed_b() -> None:
    a, b, c = randn(3, 4), randn(5, 4), randn(3, 5)
    y = run("Y[m,n] = alpha * sum[k] A[m,k] * B[n,k] + beta * C[m,n]",
            params={"alpha": 0.5, "beta": 2.0}, A=a, B=b, C=c)
    np.testing.assert_allclose(y, 0.5 * a @ b.T + 2.0 * c)


def test_conv_with_strides_dilations_and_asymmetric_padding() -> None:
    x, w, b = randn(2, 3, 9, 8), randn(4, 3, 3, 2), randn(4)
    stride, dilation, pad, pad_end = (2, 1), (2, 3), (1, 2), (0, 1)
    hw = (out_size(9, 3, 2, 2, 1, 0), out_size(8, 2, 1, 3, 2, 1))
    y = evaluate(CONV, {"X": x, "W": w, "B": b}, window_params(stride, dilation, pad),
                 {"Y": (2, 4, *hw)})["Y"]
    assert pad_end == (0, 1)  # the far side's padding is implied by the out_shape
    ref = conv_loops(x, w, hw, stride, dilation, pad) + b[None, :, None, None]
    np.testing.assert_allclose(y, ref, atol=1e-12)


@pytest.mark.parametrize(("group", "cg", "kg"), [(2, 3, 2), (4, 1, 1), (3, 1, 2)])
def test_grouped_and_depthwise_conv(group: int, cg: int, kg: int) -> None:
    x, w = randn(2, group * cg, 6, 7), randn(group * kg, cg, 3, 3)
    params = {**window_params((1, 2), (1, 1), (1, 1)), "KG": kg, "CG": cg}
    hw = (out_size(6, 3, 1, 1, 1, 1), out_size(7, 3, 2, 1, 1, 1))
    y = evaluate(GROUPED, {"X": x, "W": w}, params, {"Y": (2, group * kg, *hw)})["Y"]
    ref = conv_loops(x, w, hw, (1, 2), (1, 1), (1, 1), group)
    np.testing.assert_allclose(y, ref, atol=1e-12)


def test_resnet_sized_conv_is_fast() -> None:
    x, w = randn(1, 64, 56, 56, dtype=np.float32), randn(64, 64, 3, 3, dtype=np.float32)
    params = window_params((1, 1), (1, 1), (1, 1))
    text = "Y[n,k,p,q] = sum[c,r,s] X[n,c,p*sh+r*dh-pt,q*sw+s*dw-pl] * W[k,c,r,s]"
    evaluate(text, {"X": x[:, :, :8, :8], "W": w}, params, {"Y": (1, 64, 8, 8)})  # warm up
    start = time.perf_counter()
    y = evaluate(text, {"X": x, "W": w}, params, {"Y": (1, 64, 56, 56)})["Y"]
    assert time.perf_counter() - start < 0.5
    assert y.dtype == np.float32
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    np.testing.assert_allclose(y[0, :, 10, 20],
                               np.einsum("crs,kcrs->k", xp[0, :, 10:13, 20:23], w), rtol=1e-4, atol=1e-4)


def test_float32_contractions_sum_in_float64_and_round_once() -> None:
    # OpenBLAS's sgemm rounds a row by its place in a micro-kernel tile (for identical weight
    # rows, rows 6-11 of W @ X differ from rows 0-5): the reference must not, or identical
    # output channels come out different (the light SqueezeNet's expected output needs them equal)
    rng = np.random.default_rng(0)
    x = (rng.random((512, 169)) * 1e8).astype(np.float32)
    w = np.full((1000, 512), 0.02, np.float32)
    y = run("Y[m,n] = sum[k] W[m,k] * X[k,n]", W=w, X=x)
    assert y.dtype == np.float32
    assert (y == y[:1]).all()
    np.testing.assert_array_equal(y, (w.astype(np.float64) @ x.astype(np.float64)).astype(np.float32))
    conv = run("Y[k,p] = sum[c] W[k,c] * X[c,p]", W=w[:48, :512], X=x)
    assert (conv == conv[:1]).all()


# ------------------------------------------------------------------------------- pooling


@pytest.mark.parametrize(("text", "kind"), [
    (MAXPOOL, "max"), (AVGPOOL_EXCLUDE, "avg_exclude"), (AVGPOOL_INCLUDE, "avg_include")])
def test_pooling_with_padding(text: str, kind: str) -> None:
    x = randn(2, 3, 7, 6)
    kernel, stride, dilation, pad = (3, 2), (2, 2), (1, 2), (1, 1)
    hw = (out_size(7, 3, 2, 1, 1, 1), out_size(6, 2, 2, 2, 1, 1))
    params = {**window_params(stride, dilation, pad), "KH": kernel[0], "KW": kernel[1]}
    y = evaluate(text, {"X": x}, params, {"Y": (2, 3, *hw)})["Y"]
    np.testing.assert_allclose(y, pool_loops(x, hw, kernel, stride, dilation, pad, kind))


def test_max_pool_on_integers_pads_with_the_dtype_minimum() -> None:
    x = -np.arange(16, dtype=np.int32).reshape(1, 1, 4, 4)
    params = {**window_params((2, 2), (1, 1), (1, 1)), "KH": 2, "KW": 2}
    y = evaluate(MAXPOOL, {"X": x}, params, {"Y": (1, 1, 3, 3)})["Y"]
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, pool_loops(x, (3, 3), (2, 2), (2, 2), (1, 1), (1, 1), "max"))


# ------------------------------------------------------------------ reductions and layout


def test_keepdims_reduction_takes_the_size_one_axis_from_out_shapes() -> None:
    x = randn(3, 4, 5)
    y = run("Y[a,z,c] = sum[b] X[a,b,c]", (3, 1, 5), X=x)
    np.testing.assert_allclose(y, x.sum(1, keepdims=True))


@pytest.mark.parametrize(("op", "ref"), [
    ("max", np.max), ("min", np.min), ("prod", np.prod), ("mean", np.mean), ("sum", np.sum)])
def test_reductions(op: str, ref) -> None:
    x = randn(3, 4, 5)
    np.testing.assert_allclose(run(f"Y[a, c] = {op}[b] X[a, b, c]", X=x), ref(x, axis=1))


def test_low_precision_sums_accumulate_in_float32() -> None:
    x = np.full(4096, 0.1, np.float16)
    y = run("Y[] = sum[i] X[i]", X=x)
    assert y.dtype == np.float16 and abs(float(y) - 409.6) < 0.5


def test_softmax_with_temporaries() -> None:
    x = randn(2, 3, 5, dtype=np.float32)
    out = evaluate(SOFTMAX, {"X": x}, {})
    assert list(out) == ["Y"] and out["Y"].dtype == np.float32
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(out["Y"], e / e.sum(-1, keepdims=True), rtol=1e-6)


def test_transpose_diagonal_and_scalar() -> None:
    x = randn(3, 4)
    y = run("Y[j,i] = X[i,j]", X=x)
    np.testing.assert_array_equal(y, x.T)
    assert y.flags.c_contiguous and y.flags.writeable
    sq = randn(4, 4)
    np.testing.assert_array_equal(run("Y[i] = X[i,i]", X=sq), np.diag(sq))
    total = run("Y[] = sum[i,j] X[i,j]", X=x)
    assert total.shape == () and np.isclose(total, x.sum())


def test_strided_and_constant_indices_read_zero_outside() -> None:
    x = np.arange(1.0, 6.0)
    assert run("Y[i] = X[2*i + 1]", X=x).tolist() == [2.0, 4.0]
    assert run("Y[i] = X[i] + X[K]", (5,), {"K": 7}, X=x).tolist() == x.tolist()
    assert run("Y[i] = fill(X[i - 1], 9)", (5,), X=x).tolist() == [9, 1, 2, 3, 4]
    assert run("Y[i] = X[4 - i]", X=x).tolist() == x[::-1].tolist()
    assert run("Y[i] = fill(X[i + 100], -1)", (2,), X=x).tolist() == [-1, -1]


def test_non_contiguous_inputs_are_read_through_their_strides() -> None:
    base = randn(6, 8)
    x = base.T[::-2]  # shape (4, 6), negative and transposed strides
    np.testing.assert_array_equal(run("Y[j, i] = X[i, j]", X=x), x.T)
    expected = [x[0, 1], x[1, 3], x[2, 5], 0.0]  # column 7 is outside: it reads 0
    np.testing.assert_array_equal(run("Y[i] = X[i, 2*i + 1]", X=x), expected)


# -------------------------------------------------------------------------------- errors


def test_conflicting_extents_name_variable_tensors_and_sizes() -> None:
    with pytest.raises(SemanticsError, match=r"index variable k .*A\.shape\[1\] is 4 but B\.shape\[0\] is 5"):
        run("Y[m,n] = sum[k] A[m,k] * B[k,n]", A=randn(3, 4), B=randn(5, 6))


@pytest.mark.parametrize(("text", "tensors", "params", "message"), [
    ("Y[i] = X[i] * alpha", {"X": np.ones(3)}, {}, "param alpha has no value"),
    ("Y[i] = X[i]", {}, {}, "no tensor named X"),
    ("Y[i] = X[i, i]", {"X": np.ones(3)}, {}, "rank 2"),
    ("Y[i] = X[i + K]", {"X": np.ones(3)}, {"K": 0.5}, "must be an integer"),
    ("Y[i] = 1.0", {}, {}, "cannot tell the range of index variable i"),
    ("Y[g*2 + kk] = X[g, kk]", {"X": np.ones((2, 3))}, {}, "not a row-major merge"),
    ("Y[...] = A[...] + B[...]", {"A": np.ones(3), "B": np.ones(4)}, {}, "do not broadcast"),
    ("Y[] = max[i:N] X[i]", {"X": np.ones(0)}, {"N": 0}, "empty range"),
    ("Y[i] = X[i] ** -1", {"X": np.arange(3)}, {}, "numpy failed"),
])
def test_evaluation_errors_are_typed(text: str, tensors: dict, params: dict, message: str) -> None:
    with pytest.raises(SemanticsError, match=message):
        evaluate(text, tensors, params)


def test_out_shape_mismatch_is_reported() -> None:
    with pytest.raises(SemanticsError, match="out_shapes"):
        evaluate("Y[i] = X[i]", {"X": np.ones(3)}, {}, {"Y": (4,)})


# ------------------------------------------------------------------- property-based checks


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_conv_matches_loops(data: st.DataObject) -> None:
    draw = data.draw
    r, s = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    pad = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    pad_end = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    h = draw(st.integers(max(1, dilation[0] * (r - 1) + 1 - pad[0] - pad_end[0]), 7))
    w = draw(st.integers(max(1, dilation[1] * (s - 1) + 1 - pad[1] - pad_end[1]), 7))
    group, cg, kg = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
    x, wt = randn(draw(st.integers(1, 2)), group * cg, h, w), randn(group * kg, cg, r, s)
    hw = (out_size(h, r, stride[0], dilation[0], pad[0], pad_end[0]),
          out_size(w, s, stride[1], dilation[1], pad[1], pad_end[1]))
    params = {**window_params(stride, dilation, pad), "KG": kg, "CG": cg}
    y = evaluate(GROUPED, {"X": x, "W": wt}, params, {"Y": (x.shape[0], group * kg, *hw)})["Y"]
    np.testing.assert_allclose(y, conv_loops(x, wt, hw, stride, dilation, pad, group), atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_max_pool_matches_loops(data: st.DataObject) -> None:
    draw = data.draw
    kernel = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    pad = (draw(st.integers(0, kernel[0] - 1)), draw(st.integers(0, kernel[1] - 1)))
    h = draw(st.integers(dilation[0] * (kernel[0] - 1) + 1, 7))
    w = draw(st.integers(dilation[1] * (kernel[1] - 1) + 1, 7))
    x = randn(1, 2, h, w)
    hw = (out_size(h, kernel[0], stride[0], dilation[0], pad[0], pad[0]),
          out_size(w, kernel[1], stride[1], dilation[1], pad[1], pad[1]))
    params = {**window_params(stride, dilation, pad), "KH": kernel[0], "KW": kernel[1]}
    for text, kind in ((MAXPOOL, "max"), (AVGPOOL_EXCLUDE, "avg_exclude")):
        y = evaluate(text, {"X": x}, params, {"Y": (1, 2, *hw)})["Y"]
        np.testing.assert_allclose(y, pool_loops(x, hw, kernel, stride, dilation, pad, kind))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from((1, 2, 3)), max_size=3), st.lists(st.sampled_from((1, 2, 3)),
       max_size=3), st.integers(1, 4), st.integers(1, 4), st.integers(1, 4))
def test_batched_matmul_matches_numpy(batch_a: list, batch_b: list, m: int, k: int,
                                      n: int) -> None:
    try:
        np.broadcast_shapes(tuple(batch_a), tuple(batch_b))
    except ValueError:
        return
    a, b = randn(*batch_a, m, k), randn(*batch_b, k, n)
    y = run("Y[...,m,n] = sum[k] A[...,m,k] * B[...,k,n]", A=a, B=b)
    np.testing.assert_allclose(y, a @ b, atol=1e-12)
