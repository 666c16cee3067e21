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
