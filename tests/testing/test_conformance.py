"""The Foundation's op list passes the ONNX node tests, except cases listed with a reason."""

import pytest

from metadef.ops import REGISTRY, get_op
from metadef.testing.conformance import FOUNDATION_OPS, case_op, format_report, run_cases
from metadef.testing.known_failures import KNOWN_FAILURES


def test_every_foundation_op_is_registered():
    for name in FOUNDATION_OPS:
        assert get_op(name).name == name


@pytest.mark.slow
def test_foundation_ops_pass_or_are_listed_with_a_reason():
    report = run_cases(FOUNDATION_OPS)
    bad = [r for r in report.results if r.status not in ("pass", "known")]
    assert not bad, format_report(report) + "\n" + "\n".join(f"{r.status} {r.name}: {r.detail}" for r in bad)
    assert report.totals()["pass"] >= 790


@pytest.mark.slow
def test_known_failures_are_real_cases_of_listed_ops():
    from metadef.testing.conformance import all_cases

    by_name = {c.name: c for c in all_cases()}
    registered = {op.name for op in REGISTRY}  # a known failure is a case of an op metadef declares
    for name in KNOWN_FAILURES:
        assert name in by_name, f"{name} is not a node test case of this onnx release"
        assert case_op(by_name[name]) in registered, f"{name}: its op {case_op(by_name[name])} is not a meta-op"


# ops whose cases exercise every kind of x86 kernel: BLAS contractions (and their epilogues),
# generated elementwise/reduction kernels, casts, views, function bodies (expanded cases with
# constants that differ only in value), reference fallbacks, and outputs whose dims depend on
# values (fresh symbols, which the compile's type check must accept: NonZero, Unique, STFT)
X86_SAMPLE = ("Conv", "Gemm", "MatMul", "MaxPool", "AveragePool", "Cast", "LeakyRelu", "HannWindow",
              "Einsum", "Softmax", "Reshape", "LayerNormalization", "Gelu", "Where", "NonZero", "Unique", "STFT")


@pytest.mark.slow
@pytest.mark.jit
def test_x86_passes_what_the_reference_passes_or_falls_back_with_a_reason() -> None:
    reference = {r.name: r for r in run_cases(X86_SAMPLE).results}
    compiled = run_cases(X86_SAMPLE, target="x86")
    for r in compiled.results:
        if reference[r.name].status == "pass":
            assert r.status == "pass", (r.name, r.detail)
        assert all(reason.strip() for reason in r.fallbacks)
    assert sum(r.status == "pass" for r in compiled.results) >= 200
