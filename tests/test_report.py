"""``metadef report``: a self-contained HTML page with four PNG figures, written atomically,
that a real browser (headless Chromium) renders with every figure loaded."""

from __future__ import annotations

import base64
import io
import json
import random
import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from matplotlib.image import imread

import metadef as md
from metadef.cli import main
from metadef.core.errors import InputError
from metadef.ir import parse_graph
from metadef.report import FIGURES, ReportResult, write_report
from metadef.report.collect import memory_timeline
from metadef.report.layout import BOX_HEIGHT, BOX_WIDTH, layout_dag

CHROMIUM = Path("/usr/bin/chromium")
needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="headless Chromium is missing (/usr/bin/chromium): `apt-get install chromium` (.ci/run does)")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# -------------------------------------------------------------------------------- helpers


def embedded_pngs(page: str) -> list[bytes]:
    """The PNGs the page's figures hold inline, decoded."""
    return [base64.b64decode(data) for data in re.findall(r'<img[^>]*src="data:image/png;base64,([^"]+)"', page)]


def decoded(png: bytes) -> np.ndarray:
    """A PNG decoded to pixels (fails on anything that is not a valid PNG)."""
    assert png.startswith(PNG_SIGNATURE)
    return imread(io.BytesIO(png), format="png")


def assert_self_contained(page: str) -> None:
    """Nothing the page would fetch: every src is a data: URI, no href, no url(), no import."""
    sources = re.findall(r'\bsrc\s*=\s*["\']?([^"\'\s>]+)', page)
    assert sources and all(s.startswith("data:") for s in sources), [s[:40] for s in sources]
    assert not re.search(r"\bhref\s*=", page)
    assert "url(" not in page and "@import" not in page and "<link" not in page


def chromium(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Headless Chromium with a new profile, no network chatter, no sandbox (tests run as root)."""
    profile = tempfile.mkdtemp(dir=workdir, prefix="chromium-profile-")
    command = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               f"--user-data-dir={profile}", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)


def figures_loaded(page: Path, workdir: Path) -> int:
    """How many figures the page's own script counted as decoded on the window's load event."""
    done = chromium(workdir, "--virtual-time-budget=15000", "--dump-dom", page.resolve().as_uri())
    found = re.search(r'<body[^>]*data-figures-loaded="(\d+)"', done.stdout)
    assert found, f"no data-figures-loaded mark on <body> (exit {done.returncode}): {done.stderr[-800:]}"
    return int(found.group(1))


def screenshot(page: Path, out: Path, size: str = "1400,3200") -> np.ndarray:
    """A screenshot of the page, checked to be a PNG that is not blank; its pixels."""
    done = chromium(out.parent, "--hide-scrollbars", "--virtual-time-budget=15000", f"--screenshot={out}",
                    f"--window-size={size}", page.resolve().as_uri())
    assert out.exists(), f"no screenshot (exit {done.returncode}): {done.stderr[-800:]}"
    pixels = decoded(out.read_bytes())
    not_white = (pixels[..., :3] < 0.9).any(axis=-1).mean()
    assert pixels.shape[0] > 100 and not_white > 0.02 and pixels[..., :3].std() > 0.05, (pixels.shape, not_white)
    return pixels


# ------------------------------------------------------------------------------ fast tests


@pytest.fixture(scope="module")
def mlp_report(tmp_path_factory: pytest.TempPathFactory) -> ReportResult:
    out = tmp_path_factory.mktemp("report") / "mlp.html"
    return write_report("mlp", out, runs=3, threads=(1,))


def test_the_page_is_self_contained_with_four_png_figures(mlp_report: ReportResult) -> None:
    page = mlp_report.html.read_text(encoding="utf-8")
    assert_self_contained(page)
    pngs = embedded_pngs(page)
    assert len(pngs) == len(FIGURES) == 4
    for png in pngs:
        assert min(decoded(png).shape[:2]) > 100
    assert sorted(mlp_report.figures) == sorted(FIGURES)
    assert [p.read_bytes() for p in mlp_report.figures.values()] == pngs  # the same PNGs beside the page
    assert {p.parent for p in mlp_report.figures.values()} == {mlp_report.html.with_name("mlp_files")}
    leftovers = [p.name for p in mlp_report.html.parent.rglob("*.tmp")]
    assert leftovers == []  # written to temporary names, then renamed
    for title in ("fused groups colored", "tensor lifetimes", "Time per fused group", "ONNX Runtime"):
        assert title in page
    assert "data-figures-loaded" in page and "machine: cpu" in page and "metadef</th><td>0.1.0" in page


def test_the_numbers_behind_the_figures(mlp_report: ReportResult) -> None:
    r = mlp_report
    assert (r.model, r.bindings) == ("mlp", {"batch": 1})
    assert r.nodes_before > r.nodes_after == 4 and r.fused_groups == 2
    assert 0 < r.arena_lower_bound <= r.arena_peak and r.steps_ms > 0
    assert [(row.batch, row.threads) for row in r.bench] == [(1, 1)] and r.bench[0].ratio["onnxruntime"] > 0
    page = r.html.read_text(encoding="utf-8")
    assert "/fc1/Gemm/fused" in page and "Gemm + Relu" in page  # the fused groups table
    assert json.loads(json.dumps(r.to_dict()))["figures"]["graph"].endswith("graph.png")


def test_the_command_writes_a_report_on_an_onnx_file_without_the_benchmark(tmp_path: Path) -> None:
    model = md.zoo.export("mlp", tmp_path / "model.onnx")
    out = tmp_path / "sub" / "r.html"
    r = CliRunner().invoke(main, ["report", str(model), "-o", str(out), "--no-bench", "--runs", "2", "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["html"] == str(out) and sorted(summary["figures"]) == ["graph", "memory", "steps"]
    assert summary["model"] == "model" and summary["bench"] == [] and summary["nodes_after"] == 4
    assert all(Path(p).exists() for p in summary["figures"].values())
    page = out.read_text(encoding="utf-8")
    assert len(embedded_pngs(page)) == 3 and "comparison with ONNX Runtime was skipped (--no-bench)" in page
    assert_self_contained(page)


def test_a_bad_model_name_is_one_clear_error(tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    r = CliRunner().invoke(main, ["report", "alexnet", "-o", str(out)])
    assert r.exit_code == 2, r.output
    assert "InputError" in r.output and "'alexnet' is neither a file nor a zoo model" in r.output
    assert "mlp, resnet50" in r.output and "Traceback" not in r.output
    assert not out.exists() and not (tmp_path / "r_files").exists()
    with pytest.raises(InputError, match=r"runs \(0\)"):
        write_report("mlp", out, runs=0)
    with pytest.raises(InputError, match="each thread count"):
        write_report("mlp", out, threads=())


def test_the_arena_never_overlaps_tensors_alive_together() -> None:
    g = parse_graph("""graph g(%x: f32[n,64]) -> (%y) {
      %a: f32[n,64] = Relu(%x) @a
      %b: f32[n,64] = Exp(%a) @b
      %c: f32[n,64] = Neg(%a) @c
      %d: f32[n,64] = Add(%b, %c) @d
      %e: f32[n,64] = Sigmoid(%d) @e
      %y: f32[n,64] = Mul(%e, %a) @y
      return %y
    }""")
    mem = memory_timeline(g, {"n": 3})
    assert len(mem.buffers) == 5  # every node output but the graph's
    assert [(b.start, b.end) for b in mem.buffers] == [(0, 5), (1, 3), (2, 3), (3, 4), (4, 5)]
    assert max(mem.live) == mem.lower_bound <= mem.peak
    for i, p in enumerate(mem.buffers):
        for q in mem.buffers[i + 1:]:
            if p.start <= q.end and q.start <= p.end:  # alive at the same step: disjoint bytes
                assert p.offset + p.size <= q.offset or q.offset + q.size <= p.offset, (p, q)


def test_the_layout_never_overlaps_boxes() -> None:
    rng = random.Random(7)
    parents: list[list[int]] = []
    for i in range(160):  # a long, mostly chained DAG with skips and fan-out, like BERT
        ps = [i - 1] if i else []
        if i > 3 and rng.random() < 0.3:
            ps.append(rng.randrange(max(0, i - 12), i - 1))
        parents.append(ps)
    lay = layout_dag(parents)
    assert lay.columns > 1 and lay.width <= 30.0
    assert {link.route for link in lay.links} == {"line", "arc", "stub"}
    for i, a in enumerate(lay.places):
        assert BOX_WIDTH / 2 <= a.x <= lay.width - BOX_WIDTH / 2 and BOX_HEIGHT / 2 <= a.y <= lay.height
        for b in lay.places[i + 1:]:
            assert abs(a.x - b.x) >= BOX_WIDTH or abs(a.y - b.y) >= BOX_HEIGHT, (a, b)


# --------------------------------------------------------------------------- the browser


@needs_chromium
def test_chromium_renders_the_page_with_every_figure_loaded(mlp_report: ReportResult, tmp_path: Path) -> None:
    assert figures_loaded(mlp_report.html, tmp_path) == 4
    screenshot(mlp_report.html, tmp_path / "mlp.png", size="1280,2400")


# ------------------------------------------------------------------------------ slow tests


@pytest.mark.slow
@pytest.mark.parametrize("model", ["resnet50", "bert"])
def test_reports_on_the_big_zoo_models(model: str, tmp_path: Path) -> None:
    result = write_report(model, tmp_path / f"{model}.html", runs=3, threads=(1,))
    page = result.html.read_text(encoding="utf-8")
    assert_self_contained(page)
    assert len(embedded_pngs(page)) == 4 and sorted(result.figures) == sorted(FIGURES)
    graph_png = decoded(result.figures["graph"].read_bytes())
    assert graph_png.shape[1] < 30 * 150 + 1 and graph_png.shape[0] < 25 * 150  # sized from the nodes, bounded
    assert result.fused_groups > 10 and result.arena_lower_bound <= result.arena_peak
    if not CHROMIUM.exists():
        pytest.skip("headless Chromium is missing (/usr/bin/chromium): the page was checked, not rendered")
    assert figures_loaded(result.html, tmp_path) == 4
    screenshot(result.html, tmp_path / f"{model}.png")
