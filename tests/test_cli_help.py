"""Every command and group of the CLI has ``--help`` with an example; the commands scripts
read have ``--json``; the long ones have ``--progress``, whose bars go to stderr only."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import metadef as md
from metadef.cli import main
from metadef.cli_convert import convert_main, verify_command
from metadef.convert import convert

JSON_COMMANDS = {"metadef zoo list", "metadef inspect", "metadef verify", "metadef conformance", "metadef bench",
                 "metadef convert", "metadef cache info", "metadef-convert"}
PROGRESS_COMMANDS = {"metadef conformance", "metadef bench", "metadef convert", "metadef-convert"}


def walk(command: click.Command, path: list[str]) -> Iterator[tuple[list[str], click.Command]]:
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from walk(sub, [*path, name])


COMMANDS = [*walk(main, ["metadef"]), (["metadef-convert"], convert_main)]


@pytest.mark.parametrize("path", [" ".join(p) for p, _ in COMMANDS])
def test_help_has_an_example(path: str) -> None:
    root, *args = path.split()
    result = CliRunner().invoke(convert_main if root == "metadef-convert" else main, [*args, "--help"])
    assert result.exit_code == 0, result.output
    assert "Example" in result.output, f"`{path} --help` shows no example"
    if path in JSON_COMMANDS:
        assert "--json" in result.output
    if path in PROGRESS_COMMANDS:
        assert "--progress" in result.output


def test_the_walk_finds_every_command() -> None:
    paths = {" ".join(p) for p, _ in COMMANDS}
    assert paths >= JSON_COMMANDS | PROGRESS_COMMANDS
    assert {"metadef", "metadef zoo", "metadef docs", "metadef cache", "metadef run"} <= paths


# ------------------------------------------------------------- --json and --progress at work


def test_verify_json_reports_ok_and_each_failure(tmp_path: Path) -> None:
    path = convert("mlp", tmp_path / "v.mdef").output
    r = CliRunner().invoke(verify_command, [str(path), "--json"])
    report = json.loads(r.stdout)
    assert r.exit_code == 0 and report["ok"] is True and report["tensors"] > 0 and report["failures"] == []
    offset = md.load(path).file.tensor_info("fc2.weight").offset + 7
    data = bytearray(path.read_bytes())
    data[offset] ^= 1
    path.write_bytes(bytes(data))
    r = CliRunner().invoke(verify_command, [str(path), "--json"])
    report = json.loads(r.stdout)
    assert r.exit_code == 1 and report["ok"] is False and "fc2.weight" in " ".join(report["failures"])


def test_progress_bars_go_to_stderr_only_when_asked(tmp_path: Path) -> None:
    quiet = CliRunner().invoke(convert_main, ["-i", "mlp", "-o", str(tmp_path / "a.mdef"), "--json"])
    assert quiet.exit_code == 0 and "write" not in quiet.stderr
    shown = CliRunner().invoke(convert_main, ["-i", "mlp", "-o", str(tmp_path / "b.mdef"), "--json", "--progress"])
    assert shown.exit_code == 0 and "write" in shown.stderr and "━" in shown.stderr
    assert json.loads(shown.stdout)["output"].endswith("b.mdef")  # the bars never reach stdout
    cases = CliRunner().invoke(main, ["conformance", "--suite", "simple", "-k", "single_relu", "--json",
                                      "--progress"])
    assert cases.exit_code == 0 and "cases" in cases.stderr
    assert json.loads(cases.stdout)["totals"]["pass"] == 1
    bench = CliRunner().invoke(main, ["bench", "mlp", "--runs", "2", "--latency-only", "--json", "--progress"])
    assert bench.exit_code == 0 and "compile" in bench.stderr and "measure" in bench.stderr
    assert json.loads(bench.stdout)["configurations"]
