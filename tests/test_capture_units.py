"""Pure pieces of the captures. No framework needed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from parity.bench import rerun_seconds
from parity.capture.common import PhaseClock, weight_update
from parity.capture.torch_capture import float64_noise


def test_float64_noise_skips_non_finite_elements():
    t64 = np.array([1.0, 2.0, np.inf, 4.0])
    t32 = np.array([1.5, 2.0, 3.0, np.nan], np.float32)
    noise_rms, exact_rms = float64_noise(t32, t64)
    assert noise_rms == pytest.approx(math.sqrt(0.25 / 4))
    assert exact_rms == pytest.approx(math.sqrt(5 / 4))


def test_weight_update_is_exact_in_float32_when_w_changes_by_less_than_2x():
    before = np.array([1.0, 1e-3, -2.0], np.float32)
    after = np.array([1.1, 0.9e-3, -2.5], np.float32)
    update = weight_update(after, before)
    assert update.dtype == np.float32
    np.testing.assert_array_equal(update.astype(np.float64),
                                  after.astype(np.float64) - before.astype(np.float64))


def test_weight_update_rounds_once_where_float32_cannot_hold_the_difference():
    before, after = np.array([1e-8, 2.0], np.float32), np.array([1.0, 2.5], np.float32)
    update = weight_update(after, before)
    exact = after.astype(np.float64) - before.astype(np.float64)
    assert update.dtype == np.float32
    assert update[0] != exact[0]                       # 1 - 1e-8 is not a float32 number
    assert update[0] == np.float32(exact[0])           # ... and is rounded to nearest, once
    assert update[1] == exact[1]


def test_phase_clock_adds_up_a_phase_entered_twice_with_the_peak_at_its_last_end(monkeypatch):
    now = iter([0.0, 1.0, 3.0, 6.0])
    peak_mb = iter([100.0, 500.0, 600.0, 600.0])
    monkeypatch.setattr("parity.capture.common.time.perf_counter", lambda: next(now))
    monkeypatch.setattr("parity.capture.common.peak_resident_mb", lambda: next(peak_mb))
    clock = PhaseClock("step")          # t=0
    clock.next("rerun")                 # t=1
    clock.next("step")                  # t=3
    usage = clock.usage()               # t=6 ends the running phase
    assert usage["phases"] == {"step": 4.0, "rerun": 2.0} and usage["seconds"] == 6.0
    # a phase entered twice: the peak as it ended last
    assert usage["peak_rss_mb_after"] == {"step": 600.0, "rerun": 500.0}
    assert usage["peak_rss_mb"] == 600.0
    assert rerun_seconds({"torch": {"observer rerun": 2.0, "hooked step": 4.0},
                          "mindspore": {"observer rerun": 1.0, "float64 step": 0.5}}) == 3.5
