"""The Foundation's op list passes the ONNX node tests, except cases listed with a reason."""

import pytest

from metadef.ops import get_op
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
    for name in KNOWN_FAILURES:
        assert name in by_name, f"{name} is not a node test case of this onnx release"
        assert case_op(by_name[name]) in FOUNDATION_OPS
