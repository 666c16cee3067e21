"""The metadef command line: zoo, inspect, run, errors without tracebacks."""

import json

import numpy as np
from click.testing import CliRunner

from metadef.cli import main


def test_zoo_list_and_export(tmp_path):
    r = CliRunner().invoke(main, ["zoo", "list", "--json"])
    assert r.exit_code == 0, r.output
    assert [m["name"] for m in json.loads(r.output)] == ["mlp", "resnet50", "mobilenetv2", "bert"]
    out = tmp_path / "mlp.onnx"
    r = CliRunner().invoke(main, ["zoo", "export", "mlp", "-o", str(out)])
    assert r.exit_code == 0 and out.exists()
    r = CliRunner().invoke(main, ["zoo", "export", "alexnet", "-o", str(out)])
    assert r.exit_code != 0 and "choose from mlp" in r.output


def test_inspect_and_run(tmp_path):
    model = tmp_path / "mlp.onnx"
    CliRunner().invoke(main, ["zoo", "export", "mlp", "-o", str(model)])
    r = CliRunner().invoke(main, ["inspect", str(model), "--json"])
    assert r.exit_code == 0, r.output
    info = json.loads(r.output)
    assert info["inputs"] == [{"name": "x", "type": "f32[batch,784]"}]
    assert info["parameters"] > 500_000
    x = tmp_path / "x.npy"
    np.save(x, np.ones((2, 784), np.float32))
    r = CliRunner().invoke(main, ["run", str(model), "--input", f"x={x}", "-o", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert np.load(tmp_path / "out" / "probs.npy").shape == (2, 10)


def test_bad_input_is_one_clear_line(tmp_path):
    model = tmp_path / "mlp.onnx"
    CliRunner().invoke(main, ["zoo", "export", "mlp", "-o", str(model)])
    x = tmp_path / "x.npy"
    np.save(x, np.ones((2, 783), np.float32))
    r = CliRunner().invoke(main, ["run", str(model), "--input", f"x={x}"])
    assert r.exit_code == 2
    assert "InputError" in r.output and "expected [batch,784]" in r.output
    assert "Traceback" not in r.output


def test_inspect_optimize_reports_groups_repeats_memory_and_decisions(tmp_path, monkeypatch):
    log_file = tmp_path / "decisions.jsonl"
    r = CliRunner().invoke(main, ["inspect", "mlp", "--optimize", "aggressive", "--json",
                                  "--debug-log", str(log_file)])
    assert r.exit_code == 0, r.output
    info = json.loads(r.output)
    assert info["ops_before"]["Relu"] == 2 and "Relu" not in info["ops"]
    assert [g["kind"] for g in info["fused_groups"]] == ["contraction+epilogue"] * 2
    assert info["live_memory_lower_bound"]["bytes"] > 0
    assert log_file.read_text().count("\n") == info["decisions"]["taken"] + info["decisions"]["refused"]
    r = CliRunner().invoke(main, ["inspect", "mlp", "--optimize", "aggressive", "--no-fuse", "/fc1/*"])
    assert r.exit_code == 0, r.output
    assert "is marked no_fuse" in r.output
    r = CliRunner().invoke(main, ["inspect", "mlp", "--optimize", "aggressive",
                                  "--disable-rule", "contraction_epilogue"])
    assert "rule contraction_epilogue is disabled" in r.output
    r = CliRunner().invoke(main, ["inspect", "mlp", "--no-fuse", "x"])
    assert r.exit_code != 0 and "need --optimize" in r.output


def test_run_with_optimize(tmp_path):
    r = CliRunner().invoke(main, ["run", "mlp", "--optimize", "aggressive", "--batch", "2"])
    assert r.exit_code == 0, r.output
    assert "probs" in r.output and "[2, 10]" in r.output


def test_run_profile_prints_the_slowest_nodes_and_gives_them_as_json():
    r = CliRunner().invoke(main, ["run", "mlp", "--target", "x86", "--optimize", "aggressive", "--profile", "3"])
    assert r.exit_code == 0, r.output
    assert "medians of 3 runs" in r.output and "by op:" in r.output and "/fc1/Gemm" in r.output
    r = CliRunner().invoke(main, ["run", "mlp", "--target", "x86", "--profile", "2", "--json"])
    assert r.exit_code == 0, r.output
    profile = json.loads(r.output)["profile"]
    assert profile["runs"] == 2 and {row["node"] for row in profile["rows"]} >= {"/fc1/Gemm", "/fc3/Gemm"}


def test_run_json_on_x86_matches_the_reference():
    outs = {}
    for target in ("reference", "x86"):
        r = CliRunner().invoke(main, ["run", "mlp", "--target", target, "--batch", "3", "--json"])
        assert r.exit_code == 0, r.output
        doc = json.loads(r.output)
        assert doc["target"] == target and doc["compile_ms"] >= 0 and doc["run_ms"] > 0
        outs[target] = doc["outputs"][0]
    assert outs["x86"]["shape"] == [3, 10] and outs["x86"]["dtype"] == "float32"
    for stat in ("min", "max"):  # the same example inputs in both runs
        assert abs(outs["x86"][stat] - outs["reference"][stat]) < 1e-5
