"""The command line a user meets first: help, option names, the console script."""

from __future__ import annotations

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
    """``--help`` explains each option (an option with no help shows only its name)."""
    from parity.cli import build_parser
    bare = [f"{sub.prog} {action.option_strings[-1]}" for sub in _subparsers(build_parser())
            for action in sub._actions
            if action.option_strings and not action.help]
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


def test_the_baseline_factor_help_states_the_default_check_uses():
    from parity.baseline import DEFAULT_FACTOR
    process = parity_cli("baseline", "check", "--help")
    assert f"(default {DEFAULT_FACTOR:g})" in " ".join(process.stdout.split())
