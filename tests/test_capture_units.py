"""Pure pieces of the captures. No framework needed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from parity.capture.common import weight_update
from parity.capture.torch_capture import float64_noise


def test_float64_noise_skips_non_finite_elements():
    t64 = np.array([1.0, 2.0, np.inf, 4.0])
    t32 = np.array([1.5, 2.0, 3.0, np.nan], np.float32)
    noise_rms, exact_rms = float64_noise(t32, t64)
    assert noise_rms == pytest.approx(math.sqrt(0.25 / 4))
    assert exact_rms == pytest.approx(math.sqrt(5 / 4))


def test_weight_update_is_exact_and_float32_when_it_can_be():
    before = np.array([1.0, 1e-3, -2.0], np.float32)
    after = np.array([1.1, -1e-3, -2.5], np.float32)
    update = weight_update(after, before)
    assert update.dtype == np.float32
    np.testing.assert_array_equal(update.astype(np.float64),
                                  after.astype(np.float64) - before.astype(np.float64))


def test_weight_update_falls_back_to_float64_when_float32_would_round():
    before, after = np.array([1e-8], np.float32), np.array([1.0], np.float32)
    update = weight_update(after, before)
    assert update.dtype == np.float64
    assert update[0] == np.float64(after[0]) - np.float64(before[0])
