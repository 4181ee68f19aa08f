"""A loss that is, on each side, the cross entropy of that side's own logits: the two differ as
their logits do, which their own record judges. Built by hand, as tests/test_sums.py does: a
correct port's loss fails this way only by chance (ResNet18 at batch 2, 16², torchvision's
initial weights drawn with seed 14 and rounded to float16, on this machine)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from parity.compare.engine import compare_runs
from parity.compare.loss import cross_entropy
from parity.rundir import RunWriter

LABELS = np.array([3, 7])
# torch's own float32 error of the logits, relative (that run's: 10 %), and of the loss, by
# chance far smaller than the logits' difference moves it (that run's: 0.07 % against 0.8 %)
LOGITS_NOISE, LOSS_NOISE = 0.10, 1e-5


def _rms(value: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(value, dtype=np.float64))))


def _capture(path, framework, logits, loss, config, noises=None):
    with RunWriter(path, framework) as writer:
        records = [writer.add("fc", "forward", logits, op="dense"),
                   writer.add("loss", "loss", np.float32([loss])),
                   writer.add("fc", "grad", np.zeros_like(logits), attrs={"activation": True})]
        writer.add("target", "input", LABELS)
        for record, noise in zip(records, noises or ()):
            writer.annotate(record, fp32_noise_rms=noise * _rms(writer.array(record)),
                            exact_rms=_rms(writer.array(record)))
        writer.finish({"config": config})


def _loss(tmp_path, ms_loss_off=1.0, config=None):
    """Logits 8 % apart (within 4 times torch's 10 %), each side's loss the cross entropy of its
    own, MindSpore's times ``ms_loss_off``."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((2, 10)).astype(np.float32)
    ms_logits = (logits * (1 + 0.08 * rng.standard_normal(logits.shape))).astype(np.float32)
    _capture(tmp_path / "torch", "torch", logits, cross_entropy(logits, LABELS, 0.0),
             config or {}, (LOGITS_NOISE, LOSS_NOISE, 0.0))
    _capture(tmp_path / "mindspore", "mindspore", ms_logits,
             cross_entropy(ms_logits, LABELS, 0.0) * ms_loss_off, config or {})
    result = compare_runs(tmp_path / "torch", tmp_path / "mindspore")
    records = {(c.kind, c.name): c for c in result.comparisons}
    assert records[("forward", "fc")].passed
    return records[("loss", "loss")]


def test_a_loss_that_differs_only_as_the_logits_do_passes(tmp_path):
    loss = _loss(tmp_path)
    assert loss.ms_error > 8 * loss.fp32_noise        # alone, its own float32 error fails it
    assert loss.logits_allowance == pytest.approx(loss.ms_error, rel=1e-4)
    assert loss.passed, loss.reason


@pytest.mark.parametrize("ms_loss_off, config", [
    (1.002, {}),                                       # not the cross entropy of its logits
    (1.0, {"ms_loss": "pkg.losses:mine"}),             # not parity's: not judged so
])
def test_a_loss_that_is_not_the_cross_entropy_of_its_own_logits_still_fails(
        tmp_path, ms_loss_off, config):
    loss = _loss(tmp_path, ms_loss_off, config)
    assert not loss.passed and loss.logits_allowance == 0


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_cross_entropy_is_torchs(label_smoothing):
    logits = np.random.default_rng(1).standard_normal((4, 5))
    labels = np.array([0, 4, 2, 2])
    expected = torch.nn.functional.cross_entropy(torch.from_numpy(logits),
                                                 torch.from_numpy(labels),
                                                 label_smoothing=label_smoothing).item()
    assert cross_entropy(logits, labels, label_smoothing) == pytest.approx(expected, rel=1e-12)
