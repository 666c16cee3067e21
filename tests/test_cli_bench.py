"""``metadef bench``: runs on the MLP and reports every field (timings are not asserted)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

import metadef as md
from metadef.benchmark import Metrics
from metadef.cli_bench import (
    CpuSample,
    bench_command,
    foreign_cpu_s,
    metrics_table,
    run_bench,
    spread_list_options,
)

ROW_FIELDS = {"model", "batch", "threads", "dims", "latency", "ratio", "setup_s", "foreign_cpu_s", "foreign_cores",
              "attempts", "warnings", "runs_as"}
LATENCY_FIELDS = {"runs", "p50_ms", "p90_ms", "p99_ms", "mean_ms", "min_ms", "throughput"}
HAS_TORCH = importlib.util.find_spec("torch") is not None


def bench(*args: str) -> dict:
    result = CliRunner().invoke(bench_command, ["mlp", "--runs", "3", "--warmup", "1", "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_bench_json_holds_metadefs_own_figures_and_each_configuration() -> None:
    report = bench("--vs", "onnxruntime", "--batch", "1", "2", "--threads", "1")
    assert (report["model"], report["peers"]) == ("mlp", ["onnxruntime"])
    m = report["metadef"]  # from TestScenario, at the first batch and thread count
    assert (m["model"], m["batch"], m["threads"]) == ("mlp", 1, 1)
    for name in ("cold_load_ms", "warm_load_ms", "compile_ms_cold", "compile_ms_cached", "p50_ms", "throughput",
                 "mem_peak"):
        assert m[name] > 0, name
    assert m["p50_ms"] <= m["p90_ms"] <= m["p99_ms"]
    rows = report["configurations"]
    assert [(r["batch"], r["threads"]) for r in rows] == [(1, 1), (2, 1)]
    for r in rows:
        assert set(r) == ROW_FIELDS and r["dims"] == {"batch": r["batch"]} and r["runs_as"] == "whole"
        assert list(r["latency"]) == ["metadef", "onnxruntime"]
        for stats in r["latency"].values():
            assert set(stats) == LATENCY_FIELDS and stats["runs"] >= 3
            assert 0 < stats["min_ms"] <= stats["p50_ms"] <= stats["p90_ms"] <= stats["p99_ms"]
        assert r["ratio"]["onnxruntime"] == pytest.approx(r["latency"]["metadef"]["p50_ms"]
                                                          / r["latency"]["onnxruntime"]["p50_ms"])
        assert set(r["setup_s"]) == {"onnxruntime"} and 1 <= r["attempts"] <= 3
        assert (r["attempts"] > 1) == bool(r["warnings"])


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed (pip install torch==2.13.0)")
def test_bench_against_onnxruntime_and_torch_in_one_run() -> None:
    report = bench("--vs", "onnxruntime", "torch", "--latency-only")
    assert report["metadef"] is None and report["peers"] == ["onnxruntime", "torch"]
    (row,) = report["configurations"]
    assert list(row["latency"]) == ["metadef", "onnxruntime", "torch"]
    assert set(row["ratio"]) == set(row["setup_s"]) == {"onnxruntime", "torch"}


def test_bench_vs_torch_without_torch_says_what_to_install() -> None:
    code = ("import sys; sys.modules['torch'] = None\n"  # torch made unimportable, as where it is absent
            "from metadef.cli import main; main(['bench', 'mlp', '--vs', 'torch', '--runs', '1'])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "pip install torch==2.13.0" in done.stderr.replace("\n", "")


def test_bench_prints_its_tables() -> None:
    result = CliRunner().invoke(bench_command, ["mlp", "--runs", "3", "--warmup", "0", "--latency-only"])
    assert result.exit_code == 0, result.output
    for text in ("runtime", "metadef", "ORT", "ratio", "p90", "batch"):
        assert text in result.stdout
    m = Metrics(model="mlp", batch=1, threads=1, cold_load_ms=1.5, compile_ms_cold=300.0, p50_ms=0.1, mem_peak=2**27)
    table = metrics_table(m)
    assert [c.header for c in table.columns][:5] == ["cold load", "warm load", "optimize", "compile cold",
                                                     "compile cached"]
    assert "128" in next(iter(table.columns[-1].cells))  # MB


def test_json_output_has_no_progress_bar() -> None:
    result = CliRunner().invoke(bench_command, ["mlp", "--runs", "2", "--latency-only", "--json", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["configurations"]


def test_bench_rejects_unknown_models() -> None:
    result = CliRunner().invoke(bench_command, ["no-such-model", "--runs", "1"])
    assert result.exit_code != 0
    assert "neither a file nor a zoo model" in str(result.exception)


def test_bench_of_an_onnx_file_and_an_mdef_file(tmp_path) -> None:
    onnx_path = md.zoo.export("mlp", tmp_path / "mlp.onnx")
    mdef_path = md.save(md.import_onnx(str(onnx_path)), tmp_path / "mlp.mdef")
    for path in (onnx_path, mdef_path):
        rows = run_bench(str(path), runs=2, warmup=0)
        assert rows[0].model == "mlp" and rows[0].ratio["onnxruntime"] > 0


def test_list_options_and_foreign_cpu() -> None:
    assert spread_list_options(["m", "--batch", "1", "8", "--threads", "2"], ["--batch", "--threads"]) == \
        ["m", "--batch", "1", "--batch", "8", "--threads", "2"]
    assert foreign_cpu_s(CpuSample(5.0, 1.0), CpuSample(5.5, 2.0)) == 0.0  # never negative
    peers = {"--vs": lambda word: word in ("onnxruntime", "torch")}
    assert spread_list_options(["--vs", "onnxruntime", "torch", "mlp"], peers) == \
        ["--vs", "onnxruntime", "--vs", "torch", "mlp"]


def test_the_x86_compile_reports_each_node_to_its_progress_hook(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("METADEF_CACHE_DIR", str(tmp_path))  # an empty compile cache: every kernel is built
    graph = md.optimize(md.import_onnx(md.zoo.build("mlp")), level="aggressive")
    for cache in (False, True):
        seen: list[tuple[int, int, str]] = []
        md.compile(graph, target="x86", cache=cache, progress=lambda *call, seen=seen: seen.append(call))
        assert seen == [(i + 1, len(graph.nodes), n.name) for i, n in enumerate(graph.nodes)], cache
