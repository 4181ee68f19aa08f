"""ReLU units flipped by float32 noise: found, measured, allowed for — and no more than that."""

from __future__ import annotations

import math

import numpy as np
import pytest

from parity import kinks
from parity.compare.engine import compare_runs
from parity.compare.metrics import Float64Noise, compare_tensors, with_allowance
from parity.compare.tolerance import DEFAULTS
from parity.rundir import RunWriter

SIZE = 10_000


def test_flipped_units_are_those_active_on_one_side_only():
    torch_out = np.array([0.0, 2e-7, 1.0, 0.0, 6.0, 5.9], np.float32)
    ms_out = np.array([3e-7, 0.0, 1.0, 0.0, 5.9, 6.0], np.float32)
    assert kinks.flipped_units("relu", torch_out, ms_out).tolist() == [0, 1]
    assert kinks.flipped_units("relu6", torch_out, ms_out).tolist() == [0, 1, 4, 5]


def test_redirected_share_is_the_flipped_gradient_over_the_kept_one():
    torch_out = np.array([1.0, 0.0, 2.0, 1e-7], np.float32)
    grad = np.array([3.0, 5.0, 4.0, 1.0], np.float32)
    # unit 3 flipped: it carries 1 of the |(3, 4, 1)| gradient torch passes on
    share = kinks.redirected_share("relu", torch_out, grad, np.array([3]))
    assert share == pytest.approx(1 / math.sqrt(26))


def test_allowance_adds_the_sites_behind_a_record_in_quadrature():
    sites = [kinks.FlipSite("late", 1, 0.03, position=2.0),
             kinks.FlipSite("early", 2, 0.04, position=10.0)]
    assert kinks.allowance(sites, 1.0) == 0.0             # before both in backward order
    assert kinks.allowance(sites, 5.0) == pytest.approx(kinks.FLIP_GAIN * 0.03)
    assert kinks.allowance(sites, 11.0) == pytest.approx(kinks.FLIP_GAIN * 0.05)


def test_an_allowance_clears_the_noise_reason_but_not_a_nan():
    torch_value = np.linspace(1, 2, 100, dtype=np.float32)
    noise = Float64Noise(fp32_noise_rms=1e-7, exact_rms=1.5)
    shifted = torch_value * np.float32(1.01)             # 1 % off: far beyond float32 noise
    stats = compare_tensors(torch_value, shifted, DEFAULTS["grad"], noise)
    assert not stats.passed and "torch's own float32 error" in stats.reason
    allowed = with_allowance(stats, noise, DEFAULTS["grad"], allowance=0.01)
    assert allowed.passed and allowed.reason == "" and allowed.noise_ratio < 8
    shifted[0] = np.nan
    with_nan = compare_tensors(torch_value, shifted, DEFAULTS["grad"], noise)
    still = with_allowance(with_nan, noise, DEFAULTS["grad"], allowance=0.01)
    assert not still.passed and still.reason.startswith("non-finite values")


def _capture(path, framework, pre, act, grad_act, grad_pre, own_flipped=()):
    """A two-module run: ``pre`` (a conv) feeding ``act`` (a ReLU), forward and output
    gradients; torch's carries a float32 noise of 1e-7 relative on every record, and
    ``own_flipped`` as the ReLU units its own float32 step flipped against float64."""
    with RunWriter(path, framework) as writer:
        writer.add("input", "input", np.ones(4, np.float32))
        records = [writer.add("pre", "forward", pre, op="conv2d"),
                   writer.add("act", "forward", act, op="relu"),
                   writer.add("act", "grad", grad_act, attrs={"activation": True}),
                   writer.add("pre", "grad", grad_pre, attrs={"activation": True})]
        if framework == "torch":
            for record, value in zip(records, (pre, act, grad_act, grad_pre)):
                rms = float(np.sqrt(np.mean(np.square(value, dtype=np.float64))))
                writer.annotate(record, fp32_noise_rms=1e-7 * rms, exact_rms=rms)
            writer.annotate(writer.records[records[1].order], fp32_flipped=own_flipped)
        writer.finish({})


def _pair(tmp_path, *, forward_flip: bool, backward_flip: bool, backward_bug: float = 0.0,
          own_flipped=()):
    """Unit 0's pre-activation is within float32 noise of zero. MindSpore's forward rounds it
    below zero (``forward_flip``) and/or its backward blocks its gradient (``backward_flip``);
    ``backward_bug`` scales MindSpore's gradient before the ReLU."""
    rng = np.random.default_rng(0)
    pre = rng.standard_normal(SIZE).astype(np.float32)
    pre[0] = 1e-7
    grad_act = rng.standard_normal(SIZE).astype(np.float32)
    ms_pre = pre.copy()
    if forward_flip:
        ms_pre[0] = -1e-7
    torch_act, ms_act = np.maximum(pre, 0), np.maximum(ms_pre, 0)
    torch_grad_pre = grad_act * (torch_act > 0)
    ms_grad_pre = torch_grad_pre * np.float32(1 + backward_bug)
    if backward_flip:
        ms_grad_pre[0] = 0
    _capture(tmp_path / "torch", "torch", pre, torch_act, grad_act, torch_grad_pre, own_flipped)
    _capture(tmp_path / "mindspore", "mindspore", ms_pre, ms_act, grad_act, ms_grad_pre)
    share = abs(grad_act[0]) / np.linalg.norm(torch_grad_pre.astype(np.float64))
    return compare_runs(tmp_path / "torch", tmp_path / "mindspore"), share


def test_a_relu_flipped_by_noise_does_not_fail_the_gradients_before_it(tmp_path):
    result, share = _pair(tmp_path, forward_flip=True, backward_flip=True)
    assert result.passed, result.failure_message()
    by_key = {(c.kind, c.name): c for c in result.comparisons}
    assert by_key[("grad", "pre")].flip_allowance == pytest.approx(kinks.FLIP_GAIN * share)
    assert by_key[("grad", "act")].flip_allowance == 0.0     # after the ReLU: untouched
    assert any(note.startswith("1 ReLU unit changed sign") and "act (1)" in note
               for note in result.meta.notes)


def test_the_same_gradient_difference_without_a_flip_fails(tmp_path):
    result, _ = _pair(tmp_path, forward_flip=False, backward_flip=True)
    assert not result.passed
    assert (result.first_divergence.kind, result.first_divergence.name) == ("grad", "pre")
    assert not any("ReLU" in note for note in result.meta.notes)


def test_a_backward_bug_beyond_the_allowance_still_fails(tmp_path):
    result, share = _pair(tmp_path, forward_flip=True, backward_flip=True, backward_bug=0.05)
    assert 0.05 > 8 * kinks.FLIP_GAIN * share            # the bug is larger than allowed
    assert not result.passed
    assert (result.first_divergence.kind, result.first_divergence.name) == ("grad", "pre")


def test_units_torch_s_own_float32_step_also_flipped_are_not_allowed_twice(tmp_path):
    # torch's float64 rerun found its float32 step flipping unit 0 too: its float32 error
    # (the yardstick) already holds that, so nothing more is allowed
    result, _ = _pair(tmp_path, forward_flip=True, backward_flip=True, own_flipped=(0,))
    by_key = {(c.kind, c.name): c for c in result.comparisons}
    assert by_key[("grad", "pre")].flip_allowance == 0.0
    assert any("torch's own float32 step flipped the same units" in note
               for note in result.meta.notes)
