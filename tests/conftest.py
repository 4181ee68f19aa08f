"""Shared fixtures: the parity CLI as a user runs it, and captures reused across tests.

mindspore is imported before torch in this process (DESIGN.md: the libgomp static-TLS failure
seen elsewhere is avoided by that order).
"""

from __future__ import annotations

import mindspore  # noqa: F401  (first, before anything imports torch)

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, Tuple

import pytest

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[1]
TINY_PAIR = ["--torch-model", "tests.tiny:torch_tiny", "--ms-model", "tests.tiny:ms_tiny"]
TINY = [*TINY_PAIR, "--image-size", "16"]


def signals_at_their_defaults() -> None:
    """In a child (``preexec_fn``): the signals parity handles as a terminal leaves them. A suite
    started in the background (``nohup make test &``) inherits SIGINT and SIGHUP ignored, and
    Python keeps them ignored."""
    for number in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(number, signal.SIG_DFL)


@pytest.fixture(autouse=True)
def _seeded_torch() -> None:
    """The tiny models draw their initial weights from torch's global generator: seeded before
    each test, a test's numbers do not depend on which tests ran before it in this process."""
    import torch
    torch.manual_seed(0)


@pytest.fixture
def ended_pid() -> int:
    """The id of a process that has ended (what a killed capture or benchmark leaves)."""
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True).stdout)


@pytest.fixture
def running_pid() -> Iterator[int]:
    """The id of a process that runs while the test does."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield process.pid
    process.kill()
    process.wait()


def parity_cli(*args: str, cwd: Path = REPO, timeout: int = 900) -> subprocess.CompletedProcess:
    """``python -m parity ARGS`` in a fresh process, as a user would run it."""
    env = {**os.environ, "GLOG_v": "3", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "parity", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(process: subprocess.CompletedProcess, *needles: str) -> None:
    """Exit 2, one 'parity: error:' line naming the problem, no traceback, nothing else on
    stderr (a blank line was printed before it where stderr is no terminal)."""
    assert process.returncode == 2, (process.returncode, process.stdout, process.stderr)
    lines = process.stderr.splitlines()
    assert len(lines) == 1, process.stderr
    assert lines[0].startswith("parity: error: "), lines[0]
    assert "Traceback" not in process.stderr + process.stdout
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def skip_without_o_direct(folder: Path) -> None:
    """Skip a test that needs O_DIRECT where ``folder``'s file system refuses it."""
    from parity.direct_io import DirectFile, refused
    try:
        DirectFile(folder / ".o_direct_probe", os.O_WRONLY | os.O_CREAT).close()
    except OSError as error:
        if not refused(error):
            raise
        pytest.skip(f"O_DIRECT is refused in {folder} ({error})")
    finally:
        (folder / ".o_direct_probe").unlink(missing_ok=True)


def read_json(path: Path) -> Dict:
    return json.loads(Path(path).read_text())


def rewrite_json(path: Path, change) -> Path:
    """A JSON file parity wrote (a manifest, a report) rewritten with ``change`` applied to it."""
    data = read_json(path)
    change(data)
    path.write_text(json.dumps(data))
    return path


@pytest.fixture(scope="session")
def resnet50_run(tmp_path_factory) -> Path:
    """`parity run` of the built-in ResNet50 pair at batch 2, 64² (the default size)."""
    root = tmp_path_factory.mktemp("resnet50")
    process = parity_cli("run", "--out", root / "run", "--json", root / "report.json",
                         "--csv", root / "records.csv", "--html", root / "report.html")
    assert process.returncode == 0, process.stdout + process.stderr
    return root


@pytest.fixture(scope="session")
def compare_mindspore(resnet50_run, tmp_path_factory):
    """``compare(*ARGS)``: a MindSpore capture with ARGS against the shared torch capture, then
    ``parity compare``; returns the compare process and the folder holding its report.json and
    report.html. Cached per argument list.

    The capture (~0.4 GB) is deleted once compared: the suite's disk use stays at one ResNet50
    run plus one capture, where keeping them all once filled a CI machine's disk.
    """
    cache: Dict[tuple, Tuple[subprocess.CompletedProcess, Path]] = {}

    def compare(*args: str) -> Tuple[subprocess.CompletedProcess, Path]:
        if args not in cache:
            out = tmp_path_factory.mktemp("ms")
            capture = out / "mindspore"
            try:
                process = parity_cli("capture", "--framework", "mindspore", "--reference",
                                     resnet50_run / "run" / "torch", "--out", capture, *args)
                assert process.returncode == 0, process.stdout + process.stderr
                cache[args] = (parity_cli("compare", resnet50_run / "run" / "torch", capture,
                                          "--json", out / "report.json",
                                          "--html", out / "report.html", "--quiet"), out)
            finally:
                shutil.rmtree(capture, ignore_errors=True)
        return cache[args]

    return compare


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """A run of the tiny pair: small run directories to damage in hostile-input tests."""
    root = tmp_path_factory.mktemp("tiny")
    process = parity_cli("run", *TINY, "--out", root / "run", "--json", root / "report.json")
    assert process.returncode == 0, process.stdout + process.stderr
    return root / "run"
