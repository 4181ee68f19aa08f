"""The command line a user meets first: help, option names, the console script."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, parity_cli

DESIGN_OPTIONS = ("--model", "--batch-size", "--image-size", "--seed", "--out", "--json",
                  "--csv", "--html", "--tolerance", "--torch-model", "--ms-model", "--map")


def test_help_lists_every_subcommand():
    process = parity_cli("--help")
    assert process.returncode == 0
    for command in ("run", "capture", "compare", "report", "convert-weights", "baseline"):
        assert command in process.stdout


def test_version_is_the_packages():
    import tomllib
    process = parity_cli("--version")
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert (process.returncode, process.stdout) == (0, f"parity {version}\n")


def test_run_help_has_the_documented_options():
    process = parity_cli("run", "--help")
    assert process.returncode == 0
    for option in DESIGN_OPTIONS:
        assert option in process.stdout, option


def _subparsers(parser):
    """Every (sub)command's parser under ``parser``, itself included."""
    import argparse
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield from _subparsers(child)


def test_every_option_says_what_it_does():
    """``--help`` explains each option and argument (one with no help shows only its name)."""
    from parity.cli import build_parser
    bare = [f"{sub.prog} {(action.option_strings or [action.metavar])[-1]}"
            for sub in _subparsers(build_parser()) for action in sub._actions
            if not action.help and not isinstance(action, argparse._SubParsersAction)]
    assert bare == []


def test_console_script_is_installed():
    script = Path(sys.executable).parent / "parity"
    process = subprocess.run([str(script), "--help"], capture_output=True, text=True, cwd=REPO)
    assert process.returncode == 0 and "compare" in process.stdout


def test_no_command_prints_help_and_exits_2():
    process = parity_cli()
    assert process.returncode == 2 and "run" in process.stdout


def test_console_summary_says_which_column_decides(tiny_run):
    """A passing run's gradients show max_rel of several: the summary says what decides."""
    from rich.console import Console

    from parity.compare.engine import compare_runs
    from parity.report.console import summary

    def printed(result) -> str:
        console = Console(record=True, width=120)
        console.print(summary(result))
        return console.export_text()

    calibrated = compare_runs(tiny_run / "torch", tiny_run / "mindspore")
    fixed = compare_runs(tiny_run / "torch", tiny_run / "mindspore", use_fp64_reference=False)
    assert "noise ratio:" in printed(calibrated)
    assert "noise ratio:" not in printed(fixed)
    # what the run can see, from the float64 reference alone
    assert "fails above" in printed(calibrated) and "fails above" not in printed(fixed)


def test_report_without_a_file_asked_for_prints_the_summary_alone(tiny_run, tmp_path):
    """It was refused ("say what to write"): seeing a run's verdict again took a file."""
    before = sorted((p, p.stat().st_mtime_ns) for p in tiny_run.rglob("*"))
    process = parity_cli("report", tiny_run, cwd=tmp_path)
    assert (process.returncode, process.stderr) == (0, ""), process.stderr
    assert "PARITY: all records within tolerance" in process.stdout
    assert "wrote" not in process.stdout
    assert list(tmp_path.iterdir()) == []
    assert sorted((p, p.stat().st_mtime_ns) for p in tiny_run.rglob("*")) == before


def test_the_baseline_factor_help_states_the_default_check_uses():
    from parity.baseline import DEFAULT_FACTOR
    process = parity_cli("baseline", "check", "--help")
    assert f"(default {DEFAULT_FACTOR:g})" in " ".join(process.stdout.split())


def test_debug_is_taken_after_the_command_too_and_keeps_the_exit_code(tmp_path):
    """Error lines say "rerun with --debug": put at the end, it was refused as an unrecognized
    argument (with a traceback about it), and --debug turned an input error's exit 2 into 1."""
    missing = tmp_path / "none"
    for argv in (("report", missing, "--debug"), ("--debug", "report", missing)):
        process = parity_cli(*argv)
        assert process.returncode == 2, process.stderr
        assert "Traceback (most recent call last)" in process.stderr
        assert process.stderr.splitlines()[-1].startswith("parity: error: ")
        assert "--debug" not in process.stderr.splitlines()[-1]


def test_a_run_with_debug_shows_its_captures_traceback(tmp_path):
    """parity run passes --debug on to its captures (which refused it at their command line's
    end) and shows their tracebacks, not only their last line."""
    process = parity_cli("run", "--torch-model", "tests.tiny:torch_tiny", "--ms-model",
                         "tests.ports:broken_factory", "--image-size", "16", "--out",
                         tmp_path / "run", "--debug")
    assert process.returncode == 2, process.stderr
    assert 'tests/ports.py", line' in process.stderr       # the factory's own frame
    assert process.stderr.splitlines()[-1].startswith(
        "parity: error: mindspore capture: tests.ports:broken_factory() failed building")
    assert "rerun with --debug" not in process.stderr.splitlines()[-1]


STAGE_LINE = re.compile(r"parity: (torch capture|mindspore capture|compare) "
                        r"(\.\.\.|done in \d+\.\d s)")


def test_plain_progress_writes_a_line_as_each_stage_starts_and_ends(tmp_path):
    """For a log or CI, where the spinner shows nothing: --progress plain. Without it a log's
    stderr stays empty on success."""
    tiny = ("run", "--torch-model", "tests.tiny:torch_tiny", "--ms-model", "tests.tiny:ms_tiny",
            "--image-size", "16", "--quiet")
    plain = parity_cli(*tiny, "--out", tmp_path / "a", "--json", tmp_path / "a.json",
                       "--progress", "plain")
    assert plain.returncode == 0, plain.stderr
    lines = plain.stderr.splitlines()
    assert all(STAGE_LINE.fullmatch(line) for line in lines), lines
    assert [line.split(" done in ")[0].removesuffix(" ...") for line in lines] == [
        f"parity: {stage}" for stage in ("torch capture", "torch capture", "mindspore capture",
                                         "mindspore capture", "compare", "compare")]
    assert [" done in " in line for line in lines] == [False, True] * 3
    silent = parity_cli(*tiny, "--out", tmp_path / "b", "--json", tmp_path / "b.json")
    assert silent.returncode == 0 and silent.stderr == "", silent.stderr


def test_plain_progress_keeps_the_error_line_last_and_alone(tmp_path):
    process = parity_cli("run", "--torch-model", "tests.tiny:torch_tiny", "--ms-model",
                         "tests.ports:broken_factory", "--image-size", "16", "--out",
                         tmp_path / "run", "--progress", "plain")
    assert process.returncode == 2, process.stderr
    *stages, last = process.stderr.splitlines()
    assert last.startswith("parity: error: mindspore capture: tests.ports:broken_factory()")
    assert stages == ["parity: torch capture ...", stages[1], "parity: mindspore capture ..."]
    assert STAGE_LINE.fullmatch(stages[1]) and "Traceback" not in process.stderr
