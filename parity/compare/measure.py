"""Measuring record pairs and optimizer steps, in this process and in a helper beside it.

Comparing is one core's arithmetic over tensors read from the page cache, and the captures
are over by then, so the other core is idle: a helper process (not a thread: two threads
measured slower than one, the GIL's hand-offs costing more than the second core gave) takes
jobs while this process does others. Both run the same code on the same bytes, so the
figures do not depend on who computed them. A job the helper could not do (it died, or the
job raised there) is done here again, where any error is raised as usual.

The two processes exchange pickles over pipes: parity's own objects between parity's own
processes, never a file a user gave.
"""

from __future__ import annotations

import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import (Any, BinaryIO, Callable, Deque, Dict, Hashable, Iterator, Mapping, Optional,
                    Tuple, Union)

import numpy as np

import parity
from parity import kinks
from parity.compare import optimizer
from parity.compare.metrics import Float64Noise, Tolerance, compare_tensors
from parity.records import RecordInfo, TensorStats, value_of
from parity.resources import peak_resident_mb
from parity.rundir import INITIAL_WEIGHTS, RunReader, SafetensorsFile, stored_bytes

# Below this many bytes stored in the two runs, the helper's start-up (0.2 s: numpy and
# parity's readers) costs more than it saves.
HELPER_MIN_BYTES = 256 * 2**20
# jobs sent ahead to the helper, so that it never waits for the next: 4 measured best of 2 to 6
IN_FLIGHT = 4
PEAK_RSS = "peak_rss_mb"      # the helper's last message: its peak resident memory
# The helper's program. Parity's folder is appended to its path: found there when the
# interpreter does not find parity itself, never ahead of the standard library (as a PYTHONPATH
# entry would be). A helper that finds another parity first does nothing: its figures could
# differ, and this process does the jobs it leaves.
SERVE = """
import os, sys
sys.path.append(sys.argv[1])
import parity
if os.path.dirname(os.path.dirname(os.path.realpath(parity.__file__))) == sys.argv[1]:
    from parity.compare.measure import serve
    serve()
"""


@dataclass(frozen=True)
class Job:
    """One pair to measure; ``kink_op`` names a ReLU-like op whose flipped units are wanted."""

    torch: RecordInfo
    mindspore: RecordInfo
    tolerance: Tolerance
    noise: Optional[Float64Noise]
    kink_op: str = ""


@dataclass(frozen=True)
class Measured:
    stats: TensorStats
    bytes_read: int
    flipped: Optional[np.ndarray]     # units active on one side only, of a ReLU that passed


@dataclass(frozen=True)
class StepCheck:
    """Is MindSpore's update (or Adam's exp_avg_sq) that of torch's step of MindSpore's own
    gradient (optimizer.py)?"""

    value: RecordInfo                 # MindSpore's records: its update or exp_avg_sq
    grad: RecordInfo
    weight: str                       # the parameter's key in torch's initial weights, or
                                      # a part of one (records.split_part)
    config: Mapping[str, Any]


@dataclass(frozen=True)
class StepError:
    error: float                      # in float32 roundings: above 1, not that step
    bytes_read: int


AnyJob = Union[Job, StepCheck]
Result = Union[Measured, StepError]


class Runs:
    """What a job reads: the two captures, and torch's initial weights once a job asks."""

    def __init__(self, torch_run: RunReader, ms_run: RunReader,
                 initial_weights: Optional[SafetensorsFile] = None) -> None:
        self.torch, self.mindspore = torch_run, ms_run
        self._initial = initial_weights

    @property
    def initial_weights(self) -> SafetensorsFile:
        if self._initial is None:
            self._initial = SafetensorsFile(self.torch.path / INITIAL_WEIGHTS)
        return self._initial


def _shape_mismatch(torch_shape: Tuple[int, ...], ms_shape: Tuple[int, ...]) -> TensorStats:
    nan = float("nan")
    return TensorStats(passed=False, max_abs=nan, max_rel=nan, mean_abs=nan, rms=nan,
                       ref_rms=nan, cosine=nan, frac_within=0.0, worst_index=(),
                       worst_torch=nan, worst_mindspore=nan, nan_torch=0, nan_mindspore=0,
                       inf_torch=0, inf_mindspore=0, needed_rtol=float("inf"),
                       fp32_noise=nan, ms_error=nan, noise_ratio=nan,
                       reason=f"shape differs: torch {torch_shape} vs MindSpore {ms_shape}")


def run_job(runs: Runs, job: AnyJob) -> Tuple[Result, Optional[Tuple[np.ndarray, np.ndarray]]]:
    """The job's result, and a failing pair's two tensors (for the details)."""
    if isinstance(job, StepCheck):
        return check_step(runs, job), None
    return measure(runs, job)


def check_step(runs: Runs, job: StepCheck) -> StepError:
    value, grad = runs.mindspore.tensor(job.value), runs.mindspore.tensor(job.grad)
    w0 = value_of(runs.initial_weights, job.weight)
    check = optimizer.step_error if job.value.kind == "update" else optimizer.state_error
    error = check(grad, w0, value, job.config) if grad.shape == w0.shape == value.shape else 0.0
    return StepError(error, grad.nbytes + w0.nbytes + value.nbytes)


def measure(runs: Runs, job: Job) -> Tuple[Measured, Optional[Tuple[np.ndarray, np.ndarray]]]:
    """The pair's statistics, and its two tensors when it failed (for the details)."""
    torch_value, ms_value = runs.torch.tensor(job.torch), runs.mindspore.tensor(job.mindspore)
    stats = compare_tensors(torch_value, ms_value, job.tolerance, job.noise) \
        if torch_value.shape == ms_value.shape else \
        _shape_mismatch(torch_value.shape, ms_value.shape)
    flipped = kinks.flipped_units(job.kink_op, torch_value, ms_value) \
        if job.kink_op and stats.passed else None
    return Measured(stats, torch_value.nbytes + ms_value.nbytes, flipped), \
        None if stats.passed else (torch_value, ms_value)


def worth_a_helper(stored_bytes: int) -> bool:
    """Do two runs storing this many bytes of tensors between them need a helper?"""
    return stored_bytes >= HELPER_MIN_BYTES


def start_helper() -> Optional["Helper"]:
    """A helper process, when this machine has a second core for it and an interpreter to
    start (None otherwise, or when no process can be started)."""
    # a frozen application's executable is the application, not an interpreter to run us
    if len(os.sched_getaffinity(0)) < 2 or not sys.executable or getattr(sys, "frozen", False):
        return None
    try:
        return Helper()
    except OSError:
        return None


@contextmanager
def helper_for(torch_run: RunReader, ms_run: RunReader,
               started: Optional["Helper"] = None) -> Iterator[Optional["Helper"]]:
    """A helper for these two runs when they hold enough bytes to be worth one (None
    otherwise), ended when the block is left: ``started``, a helper started earlier whose
    start-up is over by now, if it is still running, else a new one."""
    if not worth_a_helper(stored_bytes(torch_run.path) + stored_bytes(ms_run.path)):
        yield None
        return
    helper = started if started is not None and started.process.poll() is None \
        else start_helper()
    if helper is None:
        yield None
        return
    with helper:
        helper.open_runs(torch_run.path, ms_run.path)
        yield helper


def run_all(runs: Runs, jobs: Dict[Hashable, AnyJob], helper: Optional["Helper"],
            on_failure: Callable[[Hashable, np.ndarray, np.ndarray], None]
            ) -> Tuple[Dict[Hashable, Result], float]:
    """Every job done, by this process and the helper if there is one; ``on_failure(key,
    torch_value, ms_value)`` sees each failing pair measured here. Also returns the helper's
    peak resident memory in MB (0 without one)."""
    measured: Dict[Hashable, Result] = {}

    def here(key: Hashable) -> None:
        measured[key], values = run_job(runs, jobs[key])
        if values is not None:
            on_failure(key, *values)

    queue: Deque[Tuple[Hashable, AnyJob]] = deque(jobs.items())

    def until_empty() -> None:
        while True:
            try:
                key, _ = queue.popleft()    # atomic: the helper's feeder takes from it too
            except IndexError:
                return
            here(key)

    if helper is not None:
        helper.take_from(queue)
    until_empty()
    if helper is None:
        return measured, 0.0
    answers = helper.results()
    until_empty()       # a job the feeder put back (the helper had gone) once the queue was empty
    for key, answer in answers.items():
        if answer is None:
            here(key)
        else:
            measured[key] = answer
    return measured, helper.peak_rss_mb


def _send(stream: BinaryIO, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _receive(stream: BinaryIO) -> Any:
    """The next message, or None at the end of the stream."""
    head = stream.read(8)
    if len(head) < 8:
        return None
    data = stream.read(struct.unpack("<Q", head)[0])
    return pickle.loads(data)


class Helper:
    """The helper process; use as a context manager (leaving it ends the process, Ctrl-C
    included). Given a queue of jobs (``take_from``), it is kept ``IN_FLIGHT`` jobs ahead from
    its own thread, which sends the next job as each answer arrives: fed only between this
    process's own jobs, the helper waited a fifth of its time (0.16-0.20 s of 0.75 s at batch
    2, 64²) whenever this process was on a large one."""

    def __init__(self) -> None:
        # one BLAS thread each: this process keeps the other core
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVE, os.path.dirname(os.path.dirname(os.path.realpath(
                parity.__file__)))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        self._results: Dict[Hashable, Optional[Result]] = {}
        self._pending: set = set()
        self._lock = threading.Lock()
        self._sending = threading.Lock()     # one writer at a time, and none once input ends
        self._queue: Deque[Tuple[Hashable, AnyJob]] = deque()
        self._input_ended = False
        self._alive = True
        self.peak_rss_mb = 0.0
        self._reader = threading.Thread(target=self._read, name="parity-helper-reader",
                                        daemon=True)
        self._reader.start()

    def __enter__(self) -> "Helper":
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    def close(self) -> None:
        """End the process (again: harmless)."""
        self.process.kill()         # first: a send to a helper that reads nothing fails now
        self.process.wait()
        self._end_input()
        self._reader.join()
        try:
            self.process.stdout.close()
        except OSError:
            pass

    def open_runs(self, torch_path: Path, ms_path: Path) -> None:
        """Name the two run directories every job reads: the helper's first message."""
        with self._sending:
            try:
                _send(self.process.stdin, (str(torch_path), str(ms_path)))
            except OSError:             # a broken pipe: the helper has gone
                with self._lock:
                    self._alive = False

    def take_from(self, queue: Deque[Tuple[Hashable, AnyJob]]) -> None:
        """Take jobs from the front of ``queue``, which this process also takes from."""
        self._queue = queue
        self._feed()

    def offer(self, key: Hashable, job: AnyJob) -> bool:
        """Send the job when the helper has room for it; False when it is this process's."""
        with self._lock:
            if not self._alive or len(self._pending) >= IN_FLIGHT:
                return False
            self._pending.add(key)
        try:
            _send(self.process.stdin, (key, job))
        except OSError:             # a broken pipe: the helper has gone
            with self._lock:
                self._pending.discard(key)
                self._alive = False
            return False
        return True

    def results(self) -> Dict[Hashable, Optional[Result]]:
        """Every answer, once the helper has finished: None for a job it could not do (which
        includes any it was sent and never answered)."""
        self._end_input()
        self._reader.join()
        self.process.wait()
        with self._lock:
            return {**{key: None for key in self._pending}, **self._results}

    def _feed(self) -> None:
        """Jobs from the queue until the helper has ``IN_FLIGHT`` (one it refuses goes back)."""
        with self._sending:
            while not self._input_ended:
                try:
                    key, job = self._queue.popleft()
                except IndexError:
                    return
                if not self.offer(key, job):
                    self._queue.appendleft((key, job))
                    return

    def _end_input(self) -> None:
        with self._sending:
            self._input_ended = True
            try:
                self.process.stdin.close()
            except OSError:
                pass

    def _read(self) -> None:
        while True:
            try:
                message = _receive(self.process.stdout)
            except Exception:         # a broken stream: what was not answered is measured here
                message = None
            if message is None:
                break
            key, answer = message
            with self._lock:
                if key == PEAK_RSS:
                    self.peak_rss_mb = float(answer)
                    continue
                self._pending.discard(key)
                self._results[key] = answer
            self._feed()
        with self._lock:
            self._alive = False


def serve() -> None:
    """The helper's side: open the two runs named in the first message, then do each job
    sent until the input ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)    # Ctrl-C is the parent's to handle
    source, sink = sys.stdin.buffer, sys.stdout.buffer
    paths = _receive(source)
    if paths is None:
        return
    runs = Runs(*(RunReader.open(Path(path)) for path in paths))
    while (message := _receive(source)) is not None:
        key, job = message
        try:
            answer: Optional[Result] = run_job(runs, job)[0]
        except Exception:           # done again by the parent, which raises it properly
            answer = None
        _send(sink, (key, answer))
    _send(sink, (PEAK_RSS, peak_resident_mb()))
