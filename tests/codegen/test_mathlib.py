"""The inline float32 math functions of generated kernels, against float64 references over
dense ranges (the Erf kernel is ``md_erff``: two fitted polynomials, no division; GELU's normal
CDF is ``md_ndtrf``: one polynomial and one exp)."""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable

import numpy as np
import pytest

import metadef as md
from metadef.codegen.emit import emit_module
from metadef.codegen.jit import compile_ir
from metadef.codegen.kernel import compile_node
from metadef.codegen.lower import compose
from metadef.codegen.mathlib import MATH_DECLARATIONS, TRIG_BOUND, definitions_for
from metadef.ir import GraphBuilder
from metadef.shape import parse_type
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


def _gelu64(x: np.ndarray) -> np.ndarray:
    xd = x.astype(np.float64)
    return xd * np.frompyfunc(lambda v: 0.5 * math.erfc(-v / math.sqrt(2.0)), 1, 1)(xd).astype(np.float64)


def test_gelu_by_the_normal_cdf_is_within_4_ulp_near_zero_and_relative_in_the_lower_tail() -> None:
    """GELU is ``x * ndtr(x)`` (``md_ndtrf``: one fitted polynomial and one exp): within 4 ulp
    on [-1, 12], 12 ulp on [-3, -1], and relative 4e-6 down to -5.6, where the former
    ``0.5 * x * (1 + erf(x / sqrt 2))`` lost everything to ``1 + erf``'s cancellation; past
    -5.66 (``Phi < 8e-9``) the result is 0."""
    x = np.linspace(-8.0, 12.0, 2_000_001, dtype=np.float32)
    got, want = _run("Gelu", x), _gelu64(x)
    ulps = _ulps(got, want)
    assert ulps[x >= -1].max() <= 4 and ulps[(x >= -3) & (x < -1)].max() <= 12
    tail = (x < -3) & (x > -5.6)
    assert (np.abs(got - want)[tail] / np.abs(want[tail])).max() < 4e-6
    assert np.all(got[x < -5.66] == 0) and np.abs(got - want).max() < 4e-7


def test_gelu_at_the_edges() -> None:
    x = np.float32([0.0, -0.0, np.inf, 40.0, -40.0, 1e30, np.nan, -np.inf])
    got = _run("Gelu", x)
    assert np.array_equal(got[:6], x[[0, 1, 2, 3, 0, 5]]) and np.signbit(got[1]) and np.signbit(got[4])
    assert np.isnan(got[6]) and np.isnan(got[7])  # -inf * Phi(-inf) = -inf * 0, as the reference


def test_gelu_in_float64_takes_libm_erfc_and_matches_the_reference() -> None:
    x = np.linspace(-30.0, 30.0, 20_001)
    kernel = compile_node(one_node("Gelu", ["f64[n]"]).nodes[0])
    got = np.empty_like(x)
    kernel([x], [got])
    want = _gelu64(x)
    assert np.allclose(got, want, rtol=1e-12, atol=0)


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


_LOOP = """define void @{function}_loop(ptr %x, ptr %y, i64 %n) {{
entry:
  br label %head
head:
  %i = phi i64 [0, %entry], [%next, %body]
  %go = icmp slt i64 %i, %n
  br i1 %go, label %body, label %done
body:
  %p = getelementptr inbounds float, ptr %x, i64 %i
  %v = load float, ptr %p
  %e = call float @{function}(float %v)
  %q = getelementptr inbounds float, ptr %y, i64 %i
  store float %e, ptr %q
  %next = add i64 %i, 1
  br label %head
done:
  ret void
}}
"""


def _loop(function: str, definitions: str, name: str) -> Callable[[np.ndarray], np.ndarray]:
    """A vectorized loop applying the inline ``function`` (from ``definitions``) to an array."""
    module = "\n".join([_LOOP.format(function=function), definitions, MATH_DECLARATIONS])
    address = compile_ir(module, [f"{function}_loop"], name)[f"{function}_loop"]
    run = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(address)

    def apply(x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, np.float32)
        y = np.empty_like(x)
        run(x.ctypes.data, y.ctypes.data, x.size)
        return y
    return apply


@pytest.mark.parametrize("scalef", [False, True])
def test_both_forms_of_exp_agree_within_0_9_ulp(scalef: bool) -> None:
    """``md_expf``'s portable form and its AVX-512 form (``llvm.ldexp``: one ``vscalefps`` a
    vector there, a libm call elsewhere, correct on any host) in a loop of their own, the same
    bound and edges as the kernels' (which take the host's form)."""
    definitions = definitions_for(_LOOP.format(function="md_expf"), scalef)
    assert ("@llvm.ldexp" in definitions) == scalef
    exp = _loop("md_expf", definitions, f"exp_loop_{scalef}")
    x = np.concatenate([_samples(-110.0, 95.0), np.float32([0.0, -0.0, np.inf, -np.inf, 88.72284, -103.9])])
    with np.errstate(over="ignore"):
        assert _ulps(exp(x), np.exp(x.astype(np.float64))).max() < 0.9
    assert np.isnan(exp(np.float32([np.nan]))[0])


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


TRIG = {"Sin": np.sin, "Cos": np.cos}


def _trig_samples() -> np.ndarray:
    """Both signs of: :func:`_samples` on [-10, 10]; tiny values; a geometric sweep to
    :data:`TRIG_BOUND` and past it; and the 4,001 floats around ``k pi/2`` (where sin or cos is
    0 and the reduction cancels most) for k up to the bound and for the float32 nearest a
    multiple of pi/2 below it (252.898, 2**-27.8 away; then 505.797 and 4.28e7)."""
    k = np.concatenate([np.arange(1, 65), np.geomspace(65, 2.0 ** 34, 200).round()])
    nearest = np.float32([16573937 * 2.0 ** -16, 16573937 * 2.0 ** -15, 10695401 * 2.0 ** 2])
    centers = np.concatenate([(k * (np.pi / 2)).astype(np.float32), nearest])
    steps = np.arange(-2000, 2001)
    around = (centers.view(np.int32)[:, None] + steps).ravel().view(np.float32)
    x = np.concatenate([around, np.geomspace(1e-45, 1e-3, 20_000, dtype=np.float32),
                        np.geomspace(10.0, 3.4e38, 200_000, dtype=np.float32)])
    return np.concatenate([_samples(-10.0, 10.0), x, -x])


def _check_trig(got: np.ndarray, x: np.ndarray, reference: Callable) -> None:
    """Within 1.6 ulp (relative, also near the zeros) and 1e-7 absolute below the bound; in
    [-1, 1] for every finite ``x``."""
    want = reference(x.astype(np.float64))
    within = np.abs(x) <= TRIG_BOUND
    assert _ulps(got[within], want[within]).max() < 1.6
    assert np.abs(got[within] - want[within]).max() < 1e-7
    assert np.all(np.abs(got) <= 1.0)


@pytest.mark.parametrize("op", ["Sin", "Cos"])
def test_sin_and_cos_are_within_1_6_ulp_below_their_bound(op: str) -> None:
    """``md_sinf`` and ``md_cosf`` (measured over every float32 below 2**34 pi/2: 1.58 ulp)
    against float64 numpy; beyond the bound, results are finite and in [-1, 1]."""
    x = _trig_samples()
    _check_trig(_run(op, x), x, TRIG[op])


_UNFUSED = """define internal double @unfused(double %a, double %b, double %c) alwaysinline nounwind {
  %p = fmul double %a, %b
  %s = fadd double %p, %c
  ret double %s
}
"""


@pytest.mark.parametrize("function", ["md_sinf", "md_cosf"])
def test_sin_and_cos_keep_their_bound_where_multiply_add_is_not_fused(function: str) -> None:
    """The reduction's products are exact below the bound, so the bound holds where
    ``llvm.fmuladd.f64`` is a multiplication and an addition (x86 without FMA), not one
    rounding: the definitions with each replaced by those two."""
    definitions = definitions_for(_LOOP.format(function=function)).replace("@llvm.fmuladd.f64(", "@unfused(")
    assert "@unfused(" in definitions
    apply = _loop(function, definitions + _UNFUSED, f"{function}_unfused_loop")
    x = _trig_samples()
    _check_trig(apply(x), x, np.sin if function == "md_sinf" else np.cos)


@pytest.mark.parametrize(("value", "sin", "cos"), [
    (0.0, 0.0, 1.0), (-0.0, -0.0, 1.0), (1e-30, 1e-30, 1.0), (-1e-30, -1e-30, 1.0), (1e-45, 1e-45, 1.0),
    (-1e-40, -1e-40, 1.0), (np.inf, np.nan, np.nan), (-np.inf, np.nan, np.nan), (np.nan, np.nan, np.nan)])
def test_sin_and_cos_at_the_edges(value: float, sin: float, cos: float) -> None:
    """Tiny and subnormal ``x``: ``sin x = x`` (its sign too), ``cos x = 1``; inf and NaN: NaN."""
    for op, want in (("Sin", sin), ("Cos", cos)):
        got = _run(op, np.array([value], np.float32))[0]
        if np.isnan(want):
            assert np.isnan(got)
        else:
            assert got == np.float32(want) and np.signbit(got) == np.signbit(want)


@pytest.mark.parametrize("op", ["Sin", "Cos"])
def test_sin_and_cos_kernels_call_the_inline_functions_not_libm(op: str) -> None:
    """A libm ``sinf`` call an element would keep the loop scalar (3x ONNX Runtime's time)."""
    ir = emit_module(compose(one_node(op, ["f32[n]"])), "trig").ir
    assert f"@md_{op.lower()}f(" in ir and f"@{op.lower()}f(" not in ir


def test_sin_and_cos_in_a_graph_match_the_reference_backend() -> None:
    """Sin, Cos and ``sin**2 + cos**2`` of one input, compiled for x86 (one fused kernel
    calling ``md_sinf`` and ``md_cosf``) and by the numpy reference backend (float32 libm)."""
    b = GraphBuilder("trig")
    x = b.input("x", parse_type("f32[n,384]"))
    s, = b.node("Sin", [x])
    c, = b.node("Cos", [x])
    ss, = b.node("Mul", [s, s])
    cc, = b.node("Mul", [c, c])
    one, = b.node("Add", [ss, cc])
    for v in (s, c, one):
        b.output(v)
    graph = b.build()
    rng = np.random.default_rng(0)
    feeds = {"x": np.concatenate([rng.standard_normal((6, 384)) * 4, rng.uniform(-1e5, 1e5, (2, 384)),
                                  rng.uniform(-1e9, 1e9, (1, 384))]).astype(np.float32)}
    got = md.compile(graph, target="x86").run(feeds)
    want = md.compile(graph, target="reference").run(feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=3e-7)
