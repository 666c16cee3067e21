"""The benchmark API (metadef.benchmark, and the top-level metadef_benchmark module).

Timing is never asserted: the machines are shared. The tests check structure and sanity.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import metadef as md
import metadef.benchmark as mb
from metadef.ir import parse_graph
from metadef.testing.timing import LatencySample, LatencyStats, guarded, time_interleaved

SNIPPET = """\
import metadef_benchmark as mb
scenario = mb.TestScenario(model='resnet50.mdef', device='cpu', warmup=100, iterations=500)
metrics = scenario.run(mem_profile=True, trace_level=2)
print(f"冷加载耗时: {metrics.cold_load_ms:.1f}ms")
print(f"热加载耗时: {metrics.warm_load_ms:.1f}ms")
print(f"内存峰值: {metrics.mem_peak/1024**2:.1f}MB")
"""


PHASES: list[tuple[int, int, str]] = []  # what the scenario's progress callback was told


@pytest.fixture(scope="module")
def mlp_metrics() -> mb.Metrics:
    return mb.TestScenario("mlp", device="cpu", warmup=2, iterations=5).run(
        mem_profile=True, trace_level=2, progress=lambda done, total, what: PHASES.append((done, total, what)))


def test_metrics_of_a_zoo_model(mlp_metrics: mb.Metrics) -> None:
    m = mlp_metrics
    assert (m.model, m.device, m.target, m.batch, m.dims) == ("mlp", "cpu", "x86", 1, {"batch": 1})
    assert m.runs >= 5 and m.attempts in (1, 2, 3)
    for name in ("cold_load_ms", "warm_load_ms", "optimize_ms", "compile_ms_cold", "compile_ms_cached"):
        assert getattr(m, name) > 0, name
    assert 0 < m.min_ms <= m.p50_ms <= m.p90_ms <= m.p99_ms
    assert m.min_ms <= m.mean_ms
    assert m.throughput == pytest.approx(1e3 * m.batch / m.mean_ms)
    assert m.mem_peak is not None and m.mem_rss is not None
    assert list(m.mem_rss) == ["imports", "load", "compile", "runs"]
    assert m.mem_peak >= max(m.mem_rss.values()) > 2**20
    assert m.foreign_load >= 0 and isinstance(m.warnings, list)
    assert (m.attempts > 1) == bool(m.warnings)


def test_progress_is_told_after_each_measuring_process(mlp_metrics: mb.Metrics) -> None:
    assert [(done, total) for done, total, _ in PHASES] == [(1, 2), (2, 2)]
    assert "cached" in PHASES[1][2]


def test_trace_level_2_times_each_step(mlp_metrics: mb.Metrics) -> None:
    m = mlp_metrics
    assert m.group_ms and m.op_ms
    assert all(v >= 0 for v in m.group_ms.values())
    assert any("fused" in name.lower() for name in m.group_ms)  # fused groups, formed at compile time
    assert sum(m.op_ms.values()) == pytest.approx(sum(m.group_ms.values()))


def test_metrics_print_and_round_trip_json(mlp_metrics: mb.Metrics) -> None:
    text = str(mlp_metrics)
    for label in ("cold load", "warm load", "compile, cold", "compile, cached", "latency p99", "peak memory",
                  "time per step"):
        assert label in text
    data = json.loads(mlp_metrics.to_json())
    assert data["mem_peak"] == mlp_metrics.mem_peak
    assert mb.Metrics.from_json(mlp_metrics.to_json()) == mlp_metrics


def test_an_mdef_file_without_memory_profile_or_trace(tmp_path: Path) -> None:
    g = parse_graph("graph g(%x: f32[n,seq]) -> (%y) { %y: f32[n,seq] = Relu(%x) @relu return %y }")
    path = md.save(g, tmp_path / "g.mdef")
    m = mb.TestScenario(path, warmup=0, iterations=3, batch=4, dims={"seq": 3}).run()
    assert m.mem_peak is None and m.mem_rss is None and m.group_ms is None and m.op_ms is None
    assert (m.batch, m.dims) == (4, {"n": 4, "seq": 3})
    assert m.p50_ms <= m.p90_ms <= m.p99_ms


def test_an_onnx_file_is_converted_first(tmp_path: Path) -> None:
    onnx_path = md.zoo.export("mlp", tmp_path / "mlp.onnx")
    converted = mb.TestScenario(onnx_path)._model_file(tmp_path)
    assert converted.suffix == ".mdef" and md.load(converted).graph.name == "mlp"


def test_bad_scenarios_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(md.InputError, match="device 'tpu'"):
        mb.TestScenario("mlp", device="tpu")
    with pytest.raises(md.InputError, match="iterations"):
        mb.TestScenario("mlp", iterations=0)
    with pytest.raises(md.InputError, match="trace_level"):
        mb.TestScenario("mlp").run(trace_level=3)
    with pytest.raises(md.InputError, match="neither a file nor a zoo model"):
        mb.TestScenario(tmp_path / "missing.mdef").run()


# ------------------------------------------------------------------------- the pieces


def test_example_inputs_of_zoo_models_and_of_any_graph() -> None:
    bert = parse_graph("graph bert(%input_ids: i64[batch,seq], %attention_mask: i64[batch,seq]) -> (%y) { "
                       "%y: i64[batch,seq] = Add(%input_ids, %attention_mask) return %y }")
    feeds, symbols = mb.example_inputs(md.compile(bert).inputs, batch=2, zoo_name="bert")
    assert feeds["input_ids"].shape == (2, 128) and feeds["input_ids"].dtype == np.int64
    assert symbols == {"batch": 2, "seq": 128}
    feeds, symbols = mb.example_inputs(md.compile(bert).inputs, batch=1, dims={"seq": 16}, zoo_name="bert")
    assert symbols == {"batch": 1, "seq": 16}
    g = parse_graph("graph g(%x: f32[b,len]) -> (%y) { %y: f32[b,len] = Relu(%x) return %y }")
    g.env.constrain("len", multiple_of=5, hi=200)
    feeds, symbols = mb.example_inputs(md.compile(g).inputs, batch=3, env=g.env)
    assert symbols == {"b": 3, "len": 130} and feeds["x"].shape == (3, 130)


def test_step_times_leave_the_executable_as_it_was() -> None:
    g = parse_graph("graph g(%x: f32[n]) -> (%y) { %t: f32[n] = Neg(%x) @neg %y: f32[n] = Relu(%t) @relu "
                    "return %y }")
    sess = md.compile(g, target="x86")
    kernels = [s.kernel for s in sess.executable.steps]
    times = mb.step_times(sess, {"x": np.ones(8, np.float32)}, {"n": 8}, runs=3)
    assert list(times) == ["neg", "relu"] and all(t >= 0 for t in times.values())
    assert [s.kernel for s in sess.executable.steps] == kernels
    assert mb.step_times(md.compile(g, target="reference"), {"x": np.ones(8, np.float32)}, {"n": 8}) is None


def test_step_times_come_from_the_native_program_where_there_is_one() -> None:
    # a view (Flatten) costs the native program nothing; its kernel on the step-by-step path would
    g = parse_graph("graph g(%x: f32[n,4,4]) -> (%y) { %t: f32[n,16] = Flatten(%x) @flat "
                    "%y: f32[n,16] = Relu(%t) @relu return %y }")
    times = mb.step_times(md.compile(g, target="x86"), {"x": np.ones((8, 4, 4), np.float32)}, {"n": 8}, runs=3)
    assert list(times) == ["flat", "relu"] and times["flat"] == 0.0 and times["relu"] > 0.0


def test_foreign_load_measures_again_and_keeps_the_least_loaded() -> None:
    loads = iter([1.5, 0.5, 0.9])
    sample, warnings, attempts = guarded(lambda: LatencySample([0.001] * 5, 1.0, next(loads)), "the runs")
    assert attempts == 3 and sample.foreign_cores == 0.5  # at most MAX_REPEATS (2) more attempts
    assert len(warnings) == 3 and "1.50 cores" in warnings[0] and "measuring again" in warnings[0]
    assert "least loaded attempt (0.50 cores)" in warnings[2]
    loads = iter([1.5, 0.1])
    sample, warnings, attempts = guarded(lambda: LatencySample([0.001], 1.0, next(loads)))
    assert (attempts, sample.foreign_s, len(warnings)) == (2, 0.1, 1)
    quiet = LatencySample([0.001] * 5, 1.0, 0.0)
    assert guarded(lambda: quiet) == (quiet, [], 1)


def test_interleaved_runs_take_turns() -> None:
    order: list[str] = []
    sample = time_interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, warmup=1,
                              iterations=3, min_window_s=0.0)
    assert order == ["a", "b"] * 4  # one warmup round, then three timed rounds, turn by turn
    assert [len(t) for t in sample.times.values()] == [3, 3]


def test_latency_stats_of_known_times() -> None:
    stats = LatencyStats.of([0.001, 0.002, 0.003, 0.004], batch=8)
    assert (stats.runs, stats.p50_ms, stats.min_ms, stats.mean_ms) == (4, 2.5, 1.0, 2.5)
    assert stats.throughput == pytest.approx(8 / 0.0025)


def test_time_runs_runs_long_enough_for_the_load_figure() -> None:
    sample = mb.time_runs(lambda: None, warmup=0, iterations=3, min_window_s=0.05)
    assert len(sample.times) >= 3 and sample.wall_s >= 0.05


# ------------------------------------------------------------------ the users' snippet


def test_the_snippet_as_written_imports_and_builds_its_scenario(tmp_path: Path) -> None:
    head = SNIPPET.split("metrics =")[0]  # unchanged: the import and the constructor
    check = head + "print(type(scenario).__module__, scenario.model, scenario.warmup, scenario.iterations)\n"
    done = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["metadef.benchmark", "resnet50.mdef", "100", "500"]


@pytest.mark.slow
def test_the_snippet_runs_on_a_converted_resnet50(tmp_path: Path) -> None:
    metadef_cli = Path(sys.executable).with_name("metadef")
    subprocess.run([str(metadef_cli), "convert", "resnet50", "-o", "resnet50.mdef"], cwd=tmp_path,
                   capture_output=True, check=True)
    quick = SNIPPET.replace("warmup=100, iterations=500", "warmup=2, iterations=5")
    assert quick != SNIPPET
    done = subprocess.run([sys.executable, "-c", quick], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert re.fullmatch(r"冷加载耗时: \d+\.\dms", lines[0]), lines
    assert re.fullmatch(r"热加载耗时: \d+\.\dms", lines[1]), lines
    peak = re.fullmatch(r"内存峰值: (\d+\.\d)MB", lines[2])
    assert peak and float(peak.group(1)) > 100, lines  # the weights alone are ~100 MB
