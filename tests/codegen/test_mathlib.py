"""The inline float32 math functions of generated kernels, against float64 references over
dense ranges (the Erf kernel is ``md_erff``: two fitted polynomials, no division)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from metadef.codegen.kernel import compile_node
from tests.codegen.support import one_node


def _run(op: str, x: np.ndarray) -> np.ndarray:
    kernel = compile_node(one_node(op, ["f32[n]"]).nodes[0])
    out = np.empty_like(x)
    kernel([x], [out])
    return out


def test_erf_is_within_1_4e_7_absolute_and_2e_7_relative_near_zero() -> None:
    x = np.linspace(-6.0, 6.0, 1_200_001, dtype=np.float32)
    x = np.concatenate([x, np.geomspace(1e-30, 1e-3, 2_000, dtype=np.float32), np.float32([0.921875, 4.0, 3.99])])
    got = _run("Erf", x).astype(np.float64)
    want = np.frompyfunc(math.erf, 1, 1)(x.astype(np.float64)).astype(np.float64)
    assert np.abs(got - want).max() < 1.4e-7
    tiny = (np.abs(x) < 0.1) & (x != 0)
    assert (np.abs(got - want)[tiny] / np.abs(want[tiny])).max() < 2e-7
    assert np.all(np.abs(got) <= 1.0)


@pytest.mark.parametrize(("value", "want"), [(np.inf, 1.0), (-np.inf, -1.0), (0.0, 0.0), (-0.0, -0.0), (40.0, 1.0)])
def test_erf_at_the_edges(value: float, want: float) -> None:
    got = _run("Erf", np.array([value], np.float32))[0]
    assert got == want and np.signbit(got) == np.signbit(want)
    assert np.isnan(_run("Erf", np.array([np.nan], np.float32))[0])


def _ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in units of the float32 spacing at ``want`` (a float64 reference; at least
    the smallest subnormal's), 0 where both are the same infinity or both NaN."""
    with np.errstate(over="ignore", invalid="ignore"):
        rounded = want.astype(np.float32)
        same = (got == rounded) | (np.isnan(got) & np.isnan(want))
        spacing = np.maximum(np.spacing(np.abs(rounded)).astype(np.float64), 2.0 ** -149)
        error = np.abs(got.astype(np.float64) - want) / np.where(np.isfinite(spacing), spacing, 1.0)
    return np.where(same, 0.0, np.where(np.isinf(rounded), np.inf, error))


def _samples(low: float, high: float) -> np.ndarray:
    """Dense samples of ``[low, high]`` and float32 bit patterns spread over the whole range."""
    every = np.arange(0, 2 ** 32, 4099, dtype=np.uint64).astype(np.uint32).view(np.float32)
    dense = np.linspace(low, high, 1_000_001, dtype=np.float32)
    return np.concatenate([dense, every[np.isfinite(every)]])


def test_exp_is_within_0_9_ulp_including_subnormal_results() -> None:
    """``md_expf`` (measured 0.88 ulp) against float64 exp, overflow to inf and subnormal
    results included (each rounded once)."""
    x = np.concatenate([_samples(-110.0, 95.0), np.linspace(-104.0, -87.0, 200_001, dtype=np.float32)])
    with np.errstate(over="ignore"):
        want = np.exp(x.astype(np.float64))
    assert _ulps(_run("Exp", x), want).max() < 0.9


@pytest.mark.parametrize(("value", "want"), [
    (0.0, 1.0), (-0.0, 1.0), (np.inf, np.inf), (-np.inf, 0.0), (1e30, np.inf), (-1e30, 0.0),
    (88.72283, 3.4027985e38), (88.72284, np.inf), (-87.5, 9.982351e-39), (-100.0, 3.7835059e-44),
    (-103.9, 1.4012985e-45), (-104.5, 0.0), (1e-30, 1.0)])
def test_exp_at_the_edges(value: float, want: float) -> None:
    assert _run("Exp", np.array([value], np.float32))[0] == np.float32(want)
    assert np.isnan(_run("Exp", np.array([np.nan], np.float32))[0])


def test_tanh_is_within_2_6_ulp_and_at_most_1() -> None:
    """``md_tanhf`` (measured 2.5 ulp: one expm1-based formula) against float64 tanh, relative
    near 0, around the old split at 0.625 and where the result rounds to 1."""
    x = np.concatenate([_samples(-12.0, 12.0), np.linspace(0.6, 0.65, 100_001, dtype=np.float32),
                        np.geomspace(1e-38, 1e-2, 100_000, dtype=np.float32)])
    got = _run("Tanh", x)
    assert _ulps(got, np.tanh(x.astype(np.float64))).max() < 2.6
    assert np.all(np.abs(got) <= 1.0)


@pytest.mark.parametrize(("value", "want"), [
    (0.0, 0.0), (-0.0, -0.0), (np.inf, 1.0), (-np.inf, -1.0), (20.0, 1.0), (-9.5, -1.0),
    (1e-30, 1e-30), (-1e-30, -1e-30), (1e-45, 1e-45), (1e30, 1.0)])
def test_tanh_at_the_edges(value: float, want: float) -> None:
    got = _run("Tanh", np.array([value], np.float32))[0]
    assert got == np.float32(want) and np.signbit(got) == np.signbit(want)
    assert np.isnan(_run("Tanh", np.array([np.nan], np.float32))[0])


def test_sigmoid_is_within_2_5_ulp_and_underflows_only_with_float32_exp() -> None:
    """``md_sigmoidf`` against float64 ``1 / (1 + exp(-x))`` within 2.5 ulp (measured 2.47)
    where float32's ``exp(-x)`` is finite; below -88.72 it overflows and the result is 0, as
    numpy's float32 ``1 / (1 + exp(-x))`` (subnormal results just above, rounded by the
    division)."""
    x = np.concatenate([_samples(-100.0, 100.0), np.linspace(-88.8, -87.0, 100_001, dtype=np.float32)])
    got = _run("Sigmoid", x)
    with np.errstate(over="ignore"):
        want = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
        single = np.float32(1.0) / (np.float32(1.0) + np.exp(-x))
        finite = np.isfinite(np.exp(-x.astype(np.float64)).astype(np.float32))
    assert _ulps(got[finite], want[finite]).max() < 2.5
    assert np.all(got[~finite] == 0.0) and np.all(single[~finite] == 0.0)
    assert np.all((got >= 0.0) & (got <= 1.0))


@pytest.mark.parametrize(("value", "want"), [
    (0.0, 0.5), (-0.0, 0.5), (np.inf, 1.0), (-np.inf, 0.0), (90.0, 1.0), (-90.0, 0.0),
    (-88.5, 3.6723016e-39), (-87.0, 1.6458115e-38), (1e-30, 0.5)])
def test_sigmoid_at_the_edges(value: float, want: float) -> None:
    assert _run("Sigmoid", np.array([value], np.float32))[0] == np.float32(want)
    assert np.isnan(_run("Sigmoid", np.array([np.nan], np.float32))[0])


@pytest.mark.parametrize("scalef", [False, True])
def test_both_forms_of_exp_agree_within_0_9_ulp(scalef: bool) -> None:
    """``md_expf``'s portable form and its AVX-512 form (``llvm.ldexp``: one ``vscalefps`` a
    vector there, a libm call elsewhere, correct on any host) in a loop of their own, the same
    bound and edges as the kernels' (which take the host's form)."""
    import ctypes

    from metadef.codegen.jit import compile_ir
    from metadef.codegen.mathlib import MATH_DECLARATIONS, definitions_for

    loop = """define void @exp_loop(ptr %x, ptr %y, i64 %n) {
entry:
  br label %head
head:
  %i = phi i64 [0, %entry], [%next, %body]
  %go = icmp slt i64 %i, %n
  br i1 %go, label %body, label %done
body:
  %p = getelementptr inbounds float, ptr %x, i64 %i
  %v = load float, ptr %p
  %e = call float @md_expf(float %v)
  %q = getelementptr inbounds float, ptr %y, i64 %i
  store float %e, ptr %q
  %next = add i64 %i, 1
  br label %head
done:
  ret void
}
"""
    definitions = definitions_for(loop, scalef)
    assert ("@llvm.ldexp" in definitions) == scalef
    module = "\n".join([loop, definitions, MATH_DECLARATIONS])
    address = compile_ir(module, ["exp_loop"], f"exp_loop_{scalef}")["exp_loop"]
    run = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(address)
    x = np.concatenate([_samples(-110.0, 95.0), np.float32([0.0, -0.0, np.inf, -np.inf, 88.72284, -103.9])])
    y = np.empty_like(x)
    run(x.ctypes.data, y.ctypes.data, x.size)
    with np.errstate(over="ignore"):
        assert _ulps(y, np.exp(x.astype(np.float64))).max() < 0.9
    nan = np.float32([np.nan])
    run(nan.ctypes.data, nan.ctypes.data, 1)
    assert np.isnan(nan[0])


def test_expm1_is_within_3_ulp_and_keeps_its_sign_near_zero() -> None:
    """``md_expm1f`` (Elu, Selu, Celu) against float64 expm1: the polynomial near 0 (relative,
    no cancellation), ``exp(x) - 1`` beyond, and the edges."""
    x = np.concatenate([_samples(-110.0, 95.0), np.geomspace(1e-38, 0.4, 100_000, dtype=np.float32)])
    x = np.concatenate([x, -x[-100_000:]])
    got = _run("Elu", x)  # (alpha 1: expm1 below 0, x itself above)
    with np.errstate(over="ignore"):
        want = np.where(x < 0, np.expm1(x.astype(np.float64)), x.astype(np.float64))
    assert _ulps(got, want).max() < 3.0
    edges = np.float32([-0.0, -1e-30, -np.inf, -200.0, np.nan])
    got = _run("Elu", edges)
    assert np.signbit(got[0]) and got[1] == np.float32(-1e-30) and got[2] == -1.0 and got[3] == -1.0
    assert np.isnan(got[4])
