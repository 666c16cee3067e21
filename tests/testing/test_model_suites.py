"""The ONNX model suites shipped with onnx pass, except cases listed with a reason.

The simple and pytorch suites take about a second each on the reference backend; the light
suite (nine ImageNet CNNs with constant weights) about 25 s, so it is marked slow. The same
runs on x86 are one command each: ``metadef conformance --suite all --target x86``.
"""

from __future__ import annotations

import numpy as np
import pytest

from metadef.testing.conformance import format_report
from metadef.testing.known_failures import MODEL_KNOWN_FAILURES, MODEL_KNOWN_FAILURES_ON_TARGET
from metadef.testing.model_suites import SUITES, light_inputs, load_suite, run_suite


def _assert_all_pass(suite: str, target: str = "reference") -> None:
    report = run_suite(suite, target=target)
    bad = [r for r in report.results if r.status not in ("pass", "known")]
    assert not bad, format_report(report) + "\n" + "\n".join(f"{r.status} {r.name}: {r.detail}" for r in bad)


def test_each_suite_has_its_cases() -> None:
    counts = {suite: len(load_suite(suite)) for suite in SUITES}
    assert counts == {"simple": 23, "pytorch-converted": 82, "pytorch-operator": 35, "light": 9}
    with pytest.raises(ValueError, match="unknown model suite"):
        load_suite("real")


def test_light_cases_take_the_real_tolerances_and_onnx_runner_inputs() -> None:
    cases = {c.name: c for c in load_suite("light")}
    assert cases["test_densenet121"].rtol == 0.002 and cases["test_resnet50"].rtol == 0.001
    model, ((inputs, expected),) = cases["test_resnet50"].load()
    (x,) = inputs
    n = 3 * 224 * 224
    np.testing.assert_array_equal(x, (np.arange(n).reshape(1, 3, 224, 224) / n).astype(np.float32))
    np.testing.assert_array_equal(light_inputs(model)[0], x)
    assert expected[0].shape == (1, 1000) and expected[0].dtype == np.float32


def test_known_failures_are_cases_of_the_suites() -> None:
    names = {c.name for suite in SUITES for c in load_suite(suite)}
    listed = set(MODEL_KNOWN_FAILURES).union(*MODEL_KNOWN_FAILURES_ON_TARGET.values())
    assert listed <= names, listed - names


@pytest.mark.parametrize("suite", ["simple", "pytorch-converted", "pytorch-operator"])
def test_suite_passes_on_the_reference(suite: str) -> None:
    _assert_all_pass(suite)


@pytest.mark.slow
def test_light_suite_passes_on_the_reference() -> None:
    _assert_all_pass("light")


@pytest.mark.slow
@pytest.mark.jit
@pytest.mark.parametrize("suite", ["simple", "pytorch-operator"])
def test_suite_passes_on_x86(suite: str) -> None:
    _assert_all_pass(suite, target="x86")
