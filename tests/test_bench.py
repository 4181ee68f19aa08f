"""The benchmark's own workings: what it calls parity run's memory counts every process, and
an interrupted benchmark leaves neither its scratch directory nor its running command."""

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List

import pytest

from parity.bench import SCRATCH_PREFIX, TreeMemoryPeak, _sizes, scratch_directory
from tests.conftest import signals_at_their_defaults

# A parent holding 150 MB that starts a child holding 250 MB: both resident for a second.
HOLDERS = """
import subprocess, sys, numpy as np
held = np.ones(150 * 2**20 // 8)
child = "import time, numpy as np; held = np.ones(250 * 2**20 // 8); time.sleep(1)"
subprocess.run([sys.executable, "-c", child], check=True)
"""


def test_tree_memory_peak_counts_the_children_of_a_process():
    process = subprocess.Popen([sys.executable, "-c", HOLDERS])
    peak = TreeMemoryPeak(process, period=0.02)
    assert process.wait() == 0
    assert peak.mb() > 150 + 250          # either process alone holds less


# A process holding 300 MB that starts a short command again and again, as a capture runs
# ``uname -p`` (platform.platform) when it writes its manifest.
SPAWNER = """
import subprocess, numpy as np
held = np.ones(300 * 2**20 // 8)
for _ in range(300):
    subprocess.run(["true"])
"""


def test_tree_memory_peak_counts_a_process_starting_a_command_once():
    """subprocess's vfork child, until it calls exec, shares its parent's memory: the sampler
    read it as a second copy (2 GiB held read as 4,163 MB)."""
    process = subprocess.Popen([sys.executable, "-c", SPAWNER])
    peak = TreeMemoryPeak(process, period=0.001)
    assert process.wait() == 0
    assert 300 < peak.mb() < 1.5 * 300


def test_sizes_are_pairs_of_positive_integers():
    assert _sizes("2x64,8x224") == [(2, 64), (8, 224)]
    for bad in ("8x", "0x3", "2x64,", "2x64x3", "big"):
        with pytest.raises(argparse.ArgumentTypeError, match="BATCHxSIZE"):
            _sizes(bad)


@pytest.mark.parametrize("bare", [["tensorflow", "2", "64"], ["torch", "0", "64"],
                                  ["mindspore", "2", "6x4"]])
def test_a_bare_step_of_an_unknown_framework_or_size_is_refused(bare):
    process = subprocess.run([sys.executable, "-m", "parity.bench", "--bare", *bare],
                             capture_output=True, text=True, timeout=120)
    assert process.returncode == 2, process.stdout + process.stderr
    assert f"error: --bare {' '.join(bare)}: expected one of torch, mindspore, " \
           "mindspore-synchronous, then a batch and an image size" in process.stderr
    assert process.stdout == ""


def test_a_benchmark_removes_the_scratch_of_benchmarks_that_no_longer_run(
        tmp_path, monkeypatch, ended_pid, running_pid):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for pid in (ended_pid, running_pid):
        (tmp_path / f"{SCRATCH_PREFIX}{pid}").mkdir()
    scratch = scratch_directory()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"{SCRATCH_PREFIX}{running_pid}", scratch.name])


def _processes_with(marker: str) -> List[int]:
    """The processes whose environment holds ``marker``."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker.encode() in environ.read_bytes():
                found.append(int(environ.parent.name))
        except OSError:             # ended, or another user's
            pass
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc, PDEATHSIG")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL],
                         ids=["SIGTERM", "SIGHUP", "SIGKILL"])
def test_a_benchmark_ended_by_a_signal_ends_its_command(tmp_path, signum):
    """A cancelled CI job sends SIGTERM, a terminal closing SIGHUP: by default each left the
    scratch directory (gigabytes, once a run is in it) and the running command behind. SIGKILL
    leaves the benchmark no time to stop its command, which ends with it all the same (its
    scratch is the next benchmark's to remove); so does a command started while a signal
    came, before Popen returned."""
    marker = f"PARITY_BENCH_TEST={tmp_path}"          # tmp_path: this test, this session
    env = {**os.environ, "TMPDIR": str(tmp_path), "PARITY_BENCH_TEST": str(tmp_path)}

    def scratch() -> List[Path]:        # torch keeps its own cache there too
        return list(tmp_path.glob(f"{SCRATCH_PREFIX}*"))

    # the first command, a bare torch step at batch 8, 224², runs for seconds after start-up
    bench = subprocess.Popen([sys.executable, "-m", "parity.bench", "--sizes", "8x224"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True,
                             preexec_fn=signals_at_their_defaults)
    try:
        deadline = time.monotonic() + 60
        while len(_processes_with(marker)) < 2 or not scratch():
            assert bench.poll() is None and time.monotonic() < deadline, bench.stderr.read()
            time.sleep(0.05)
        bench.send_signal(signum)
        assert bench.wait(timeout=60) == (-signum if signum == signal.SIGKILL else 128 + signum)
        ended = time.monotonic()
        while _processes_with(marker) and time.monotonic() < ended + 3:
            time.sleep(0.05)
        assert _processes_with(marker) == []        # its step alone outlasts those 3 s
        if signum != signal.SIGKILL:
            assert scratch() == []
    finally:
        bench.kill()
        bench.wait()
        for pid in _processes_with(marker):
            os.kill(pid, signal.SIGKILL)
