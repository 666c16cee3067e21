"""``metadef bench``: runs on the MLP and reports every field (timings are not asserted)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from metadef.cli_bench import CpuSample, bench_command, foreign_cpu_s, run_bench, spread_list_options

FIELDS = {"model", "batch", "threads", "metadef_ms", "ort_ms", "ratio", "metadef_compile_s", "ort_session_s",
          "peak_rss_mb", "foreign_cpu_s", "foreign_cores", "attempts", "warnings"}


def test_bench_json_has_every_field_per_configuration() -> None:
    result = CliRunner().invoke(bench_command, ["mlp", "--vs", "onnxruntime", "--batch", "1", "2",
                                                "--threads", "1", "--runs", "3", "--warmup", "1", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [(r["batch"], r["threads"]) for r in rows] == [(1, 1), (2, 1)]
    for r in rows:
        assert set(r) == FIELDS
        assert r["metadef_ms"] > 0 and r["ort_ms"] > 0 and r["peak_rss_mb"] > 0
        assert 1 <= r["attempts"] <= 3
        assert abs(r["ratio"] - r["metadef_ms"] / r["ort_ms"]) < 1e-9


def test_bench_prints_a_table() -> None:
    result = CliRunner().invoke(bench_command, ["mlp", "--runs", "3", "--warmup", "0"])
    assert result.exit_code == 0, result.output
    assert "metadef ms" in result.stdout and "ORT ms" in result.stdout and "mlp" in result.stdout


def test_bench_rejects_unknown_models() -> None:
    result = CliRunner().invoke(bench_command, ["no-such-model", "--runs", "1"])
    assert result.exit_code != 0
    assert "neither a file nor a zoo model" in str(result.exception)


def test_bench_of_an_onnx_file_and_an_mdef_file(tmp_path) -> None:
    import metadef as md

    onnx_path = md.zoo.export("mlp", tmp_path / "mlp.onnx")
    mdef_path = md.save(md.import_onnx(str(onnx_path)), tmp_path / "mlp.mdef")
    for path in (onnx_path, mdef_path):
        rows = run_bench(str(path), runs=2, warmup=0)
        assert rows[0].model == "mlp" and rows[0].ratio > 0


def test_list_options_and_foreign_cpu() -> None:
    assert spread_list_options(["m", "--batch", "1", "8", "--threads", "2"], ["--batch", "--threads"]) == \
        ["m", "--batch", "1", "--batch", "8", "--threads", "2"]
    assert foreign_cpu_s(CpuSample(5.0, 1.0), CpuSample(5.5, 2.0)) == 0.0  # never negative
