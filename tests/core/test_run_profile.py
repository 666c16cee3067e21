"""RunProfile: rows summed by node and by op, the table, plain data."""

from __future__ import annotations

import json

import pytest

from metadef.core.run_profile import ProfileRow, RunProfile, median_rows

ROWS = [ProfileRow("conv", "Conv", "winograd input", 1, 0.002),
        ProfileRow("conv", "Conv", "winograd product", 36, 0.005),
        ProfileRow("relu", "Relu", "generated", 1, 0.001), ProfileRow("fc", "Gemm", "sgemm", 1, 0.004)]


def test_by_node_sums_a_nodes_units_and_names_its_slowest() -> None:
    p = RunProfile(ROWS, runs=3, target="x86", symbols={"n": 2}, wall=0.0125)
    merged = p.by_node()
    assert [(r.node, r.calls) for r in merged] == [("conv", 37), ("fc", 1), ("relu", 1)]
    assert merged[0].seconds == pytest.approx(0.007)
    assert merged[0].what == "winograd product (2 units)"
    assert p.total == pytest.approx(0.012)
    assert p.by_op() == [("Conv", pytest.approx(0.007), 1), ("Gemm", 0.004, 1), ("Relu", 0.001, 1)]
    assert [r.what for r in p.top(2)] == ["winograd product", "sgemm"]


def test_table_and_plain_data() -> None:
    p = RunProfile(ROWS, runs=3, target="x86", symbols={"n": 2}, wall=0.0125, note="2 threads")
    text = p.table(2)
    assert "n=2; medians of 3 runs" in text and "a whole run 12.500 ms" in text and "(2 threads)" in text
    lines = text.splitlines()
    assert "conv" in lines[3] and "58.3" in lines[3] and "fc" in lines[4] and "relu" not in "".join(lines[3:5])
    assert "by op:" in text and str(p) == p.table()
    data = json.loads(json.dumps(p.to_dict()))
    assert data["runs"] == 3 and len(data["rows"]) == 4 and data["total"] == pytest.approx(0.012)


def test_median_rows_take_each_units_median_over_runs() -> None:
    rows = median_rows([[3.0, 1.0], [1.0, 5.0], [2.0, 4.0], [9.0, 2.0]], [("a", "A", "x", 1), ("b", "B", "y", 2)])
    assert [(r.node, r.seconds) for r in rows] == [("a", 2.5), ("b", 3.0)]
