"""Compare's helper process: the figures measuring alone gives, and nothing lost when it fails."""

from __future__ import annotations

import math
import shutil
import threading
import time
from pathlib import Path
from typing import List

import pandas as pd
import pytest

from parity.compare import measure
from parity.compare.engine import compare_runs
from parity.errors import ParityInputError


class _CountingHelper(measure.Helper):
    """The helper, counting the jobs it took."""

    taken: List = []

    def offer(self, key, job) -> bool:
        accepted = super().offer(key, job)
        if accepted:
            self.taken.append(key)
        return accepted


@pytest.fixture
def counting_helper(monkeypatch) -> List:
    taken: List = []
    monkeypatch.setattr(_CountingHelper, "taken", taken)
    monkeypatch.setattr(measure, "Helper", _CountingHelper)
    return taken


def _compare_alone(run: Path, monkeypatch):
    monkeypatch.setattr(measure, "HELPER_MIN_BYTES", math.inf)
    return compare_runs(run / "torch", run / "mindspore")


def _assert_same(result, alone) -> None:
    pd.testing.assert_frame_equal(result.records, alone.records, check_exact=True)
    # repr: the statistics of a pair whose shapes differ are NaN, equal to nothing
    assert repr((result.details, result.first_divergence, result.diagnosis)) == \
        repr((alone.details, alone.first_divergence, alone.diagnosis))
    assert result.extra["compare_bytes"] == alone.extra["compare_bytes"]


def test_a_large_run_is_shared_with_the_helper_and_gives_the_same_figures(
        resnet50_run, counting_helper, monkeypatch):
    """ResNet50 at batch 2, 64² (0.8 GB stored) is worth a helper: it takes a share of the
    pairs and of the optimizer-step checks, and every statistic is the one measured alone."""
    run = resnet50_run / "run"
    shared = compare_runs(run / "torch", run / "mindspore")
    # how many depends on how soon the helper starts: 495 of the 1,161 in one compare here
    assert any(isinstance(key, int) for key in counting_helper)
    assert any(isinstance(key, tuple) and key[0] == "step" for key in counting_helper)
    assert shared.extra["compare_peak_rss_mb"] > 0
    _assert_same(shared, _compare_alone(run, monkeypatch))


def test_the_helper_is_fed_while_this_process_is_on_a_job(tiny_run, counting_helper,
                                                          monkeypatch):
    """This process's first job waits until the helper has been sent more than ``IN_FLIGHT``
    jobs: it can only have been fed by its own answers, and the figures are still those of a
    compare alone."""
    monkeypatch.setattr(measure, "HELPER_MIN_BYTES", 0)
    monkeypatch.setattr(measure, "IN_FLIGHT", 2)
    run_job, sent_meanwhile = measure.run_job, []

    def first_waits(runs, job):
        if not sent_meanwhile:
            deadline = time.monotonic() + 60
            while len(counting_helper) <= measure.IN_FLIGHT and time.monotonic() < deadline:
                time.sleep(0.01)
            sent_meanwhile.append(len(counting_helper))
        return run_job(runs, job)

    monkeypatch.setattr(measure, "run_job", first_waits)
    shared = compare_runs(tiny_run / "torch", tiny_run / "mindspore")
    assert sent_meanwhile[0] > measure.IN_FLIGHT
    monkeypatch.setattr(measure, "run_job", run_job)
    _assert_same(shared, _compare_alone(tiny_run, monkeypatch))


@pytest.fixture(scope="module")
def failing_tiny_run(tmp_path_factory) -> Path:
    """A tiny port with MindSpore's default conv padding: it fails from its first conv on."""
    import parity
    from tests import tiny
    out = tmp_path_factory.mktemp("failing")
    result = parity.check(tiny.torch_defaults(), tiny.ms_defaults_conv_padding(), image_size=16,
                          out=out)
    assert not result.passed
    return out


def test_a_failing_run_gets_the_same_verdicts_details_and_diagnosis(
        failing_tiny_run, counting_helper, monkeypatch):
    monkeypatch.setattr(measure, "HELPER_MIN_BYTES", 0)
    shared = compare_runs(failing_tiny_run / "torch", failing_tiny_run / "mindspore")
    assert counting_helper
    assert shared.details
    _assert_same(shared, _compare_alone(failing_tiny_run, monkeypatch))


class _DyingHelper(measure.Helper):
    """A helper killed as soon as it has taken its first job."""

    def offer(self, key, job) -> bool:
        accepted = super().offer(key, job)
        self.process.kill()
        self.process.wait()
        return accepted


def test_jobs_a_dead_helper_leaves_are_done_here(failing_tiny_run, monkeypatch):
    monkeypatch.setattr(measure, "HELPER_MIN_BYTES", 0)
    monkeypatch.setattr(measure, "Helper", _DyingHelper)
    result = compare_runs(failing_tiny_run / "torch", failing_tiny_run / "mindspore")
    _assert_same(result, _compare_alone(failing_tiny_run, monkeypatch))


class _GoneWhenTheQueueEmptied(measure.Helper):
    """The helper's feeder takes a job, then finds the helper gone, but only after this process
    has found the queue empty and is waiting for the helper's answers."""

    put_back: List = []

    def offer(self, key, job) -> bool:
        if threading.current_thread() is threading.main_thread() or not self._alive:
            return super().offer(key, job)
        self.put_back.append(key)
        deadline = time.monotonic() + 60
        while self._queue and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.5)             # this process: done with its last job, waiting here
        self.process.kill()
        self.process.wait()
        self._alive = False
        return False


def test_a_job_put_back_after_the_queue_emptied_is_done_here(failing_tiny_run, monkeypatch):
    monkeypatch.setattr(measure, "HELPER_MIN_BYTES", 0)
    monkeypatch.setattr(measure, "Helper", _GoneWhenTheQueueEmptied)
    monkeypatch.setattr(_GoneWhenTheQueueEmptied, "put_back", [])
    run_job = measure.run_job

    def slowly(runs, job):          # so that the helper answers while jobs are left
        time.sleep(0.02)
        return run_job(runs, job)

    monkeypatch.setattr(measure, "run_job", slowly)
    result = compare_runs(failing_tiny_run / "torch", failing_tiny_run / "mindspore")
    assert len(_GoneWhenTheQueueEmptied.put_back) == 1
    monkeypatch.setattr(measure, "run_job", run_job)
    _assert_same(result, _compare_alone(failing_tiny_run, monkeypatch))


def test_a_corrupted_tensor_the_helper_meets_is_reported_as_alone(tiny_run, tmp_path,
                                                                   counting_helper, monkeypatch):
    """Every job goes to the helper; the corrupted one comes back undone and is read again
    here, where it raises the one-line error a compare alone raises."""
    ms_run = tmp_path / "mindspore"
    shutil.copytree(tiny_run / "mindspore", ms_run)
    shard = sorted(ms_run.glob("tensors-*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    monkeypatch.setattr(measure, "HELPER_MIN_BYTES", 0)
    monkeypatch.setattr(measure, "IN_FLIGHT", 10**9)
    with pytest.raises(ParityInputError, match=f"{shard.name} is corrupted: .* fails its checksum"):
        compare_runs(tiny_run / "torch", ms_run)
    assert counting_helper


def test_the_helper_ends_when_the_compare_is_interrupted(tiny_run, monkeypatch):
    started: List[measure.Helper] = []

    class Recorded(measure.Helper):
        def __init__(self, *args) -> None:
            super().__init__(*args)
            started.append(self)

    def interrupted(*_args):
        raise KeyboardInterrupt

    monkeypatch.setattr(measure, "HELPER_MIN_BYTES", 0)
    monkeypatch.setattr(measure, "Helper", Recorded)
    monkeypatch.setattr(measure, "run_job", interrupted)      # this process's share: Ctrl-C
    with pytest.raises(KeyboardInterrupt):
        compare_runs(tiny_run / "torch", tiny_run / "mindspore")
    assert started and started[0].process.poll() is not None


def test_a_frozen_application_starts_no_helper(tiny_run, counting_helper, monkeypatch):
    """Its sys.executable is the application itself: running it would start the application."""
    monkeypatch.setattr(measure, "HELPER_MIN_BYTES", 0)
    monkeypatch.setattr("sys.frozen", True, raising=False)
    result = compare_runs(tiny_run / "torch", tiny_run / "mindspore")
    assert result.passed and not counting_helper


class _AnswersKept(measure.Helper):
    answers: dict = {}

    def results(self):
        type(self).answers = super().results()
        return type(self).answers


def test_a_helper_that_finds_another_parity_does_nothing(tiny_run, monkeypatch):
    """This process's parity is elsewhere than the one the helper imports: the helper's figures
    could differ, so it answers nothing and every job is done here."""
    import parity
    alone = _compare_alone(tiny_run, monkeypatch)
    monkeypatch.setattr(measure, "HELPER_MIN_BYTES", 0)
    monkeypatch.setattr(measure, "Helper", _AnswersKept)
    monkeypatch.setattr(parity, "__file__", "/elsewhere/parity/__init__.py")
    result = compare_runs(tiny_run / "torch", tiny_run / "mindspore")
    assert _AnswersKept.answers and all(a is None for a in _AnswersKept.answers.values())
    _assert_same(result, alone)


def test_a_helper_started_early_is_the_one_used_and_ended(tiny_run, counting_helper,
                                                          monkeypatch):
    """``parity run`` starts the helper before the MindSpore capture: the compare uses that
    one (no other is started), ends it, and its figures are those of a compare alone."""
    monkeypatch.setattr(measure, "HELPER_MIN_BYTES", 0)
    early = measure.start_helper()
    assert early is not None
    monkeypatch.setattr(measure, "Helper", None)        # any other start would fail
    shared = compare_runs(tiny_run / "torch", tiny_run / "mindspore", helper=early)
    assert counting_helper and early.process.poll() is not None
    _assert_same(shared, _compare_alone(tiny_run, monkeypatch))


def test_a_helper_started_early_that_has_gone_is_replaced(tiny_run, counting_helper,
                                                          monkeypatch):
    monkeypatch.setattr(measure, "HELPER_MIN_BYTES", 0)
    early = measure.start_helper()
    early.close()
    shared = compare_runs(tiny_run / "torch", tiny_run / "mindspore", helper=early)
    assert counting_helper
    _assert_same(shared, _compare_alone(tiny_run, monkeypatch))


def _tiny_config():
    from parity import api
    from parity.config import StepConfig
    factories = {"torch_factory": "tests.tiny:torch_tiny",
                 "mindspore_factory": "tests.tiny:ms_tiny"}
    return StepConfig(image_size=16, **factories), api.CaptureOptions(**factories)


def test_parity_run_hands_its_helper_to_the_compare(tmp_path, monkeypatch):
    from parity import api
    from tests.conftest import REPO
    monkeypatch.chdir(REPO)                 # the capture processes import tests.tiny
    monkeypatch.setattr(measure, "HELPER_MIN_BYTES", 0)
    handed: List = []
    compare = api.compare_runs

    def recording(torch_dir, ms_dir, **options):
        handed.append(options["helper"])
        assert options["helper"].process.poll() is None
        return compare(torch_dir, ms_dir, **options)

    monkeypatch.setattr(api, "compare_runs", recording)
    config, options = _tiny_config()
    assert api.run(config, tmp_path / "run", options).passed
    assert isinstance(handed[0], measure.Helper) and handed[0].process.poll() is not None


def test_a_run_too_small_for_a_helper_starts_none(tmp_path, monkeypatch):
    from parity import api
    from tests.conftest import REPO
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(measure, "Helper", None)        # any start would fail
    config, options = _tiny_config()
    assert api.run(config, tmp_path / "run", options).passed


def test_parity_run_ends_its_helper_when_the_mindspore_capture_fails(tmp_path, monkeypatch):
    from parity import api
    monkeypatch.setattr(measure, "HELPER_MIN_BYTES", 0)
    started: List[measure.Helper] = []

    def start_helper():
        started.append(measure.start_helper())
        return started[-1]

    def capture(framework, config, out, *args, **kwargs):
        if framework == "mindspore":
            raise ParityInputError("MindSpore refused")
        out.mkdir()

    monkeypatch.setattr(api, "start_helper", start_helper)
    monkeypatch.setattr(api, "capture_in_subprocess", capture)
    config, options = _tiny_config()
    with pytest.raises(ParityInputError, match="MindSpore refused"):
        api.run(config, tmp_path / "run", options)
    assert started and started[0].process.poll() is not None


def test_records_the_allowances_pass_get_no_details(resnet50_run, monkeypatch):
    """The correct ResNet50 port at the default: records behind ReLU units MindSpore set
    otherwise fail before the allowance for them and pass after it. Their histograms and worst
    elements were computed anyway: 61 to 63 at the default, a quarter of the compare's time,
    and 70 at seed 3 with --nesterov, almost half."""
    from parity.compare import engine
    made: List = []
    detail = engine._detail
    monkeypatch.setattr(engine, "_detail", lambda t, m: made.append(1) or detail(t, m))
    result = _compare_alone(resnet50_run / "run", monkeypatch)
    assert result.passed and result.details == {}
    assert sum(c.flip_allowance > 0 for c in result.comparisons) > 100
    assert made == []
