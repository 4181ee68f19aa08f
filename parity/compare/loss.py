"""The default loss (mean cross entropy, with torch's label smoothing) recomputed in float64 from
each side's own logits. When each side's loss is the cross entropy of its own logits, the loss
function is the same on both sides and the two losses differ only as their logits do: the logits
are judged at their own record, and the loss is allowed that difference (engine)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from parity.config import classes_last
from parity.records import RecordInfo
from parity.rundir import RunReader

# How close a loss must be to the cross entropy of its own side's logits, relative, to be that
# cross entropy: float32 rounding. ResNet18 at batch 2, 16²: torch's 4e-8 and MindSpore's
# 3.4e-7 from it, at a loss of 3.6.
OWN_CROSS_ENTROPY = 1e-5


@dataclass(frozen=True)
class LogitsGap:
    logits: str         # the torch name of the model's output record
    gap: float          # |CE(MindSpore's logits) - CE(torch's logits)|, in float64


def output_gradient(run: RunReader) -> Optional[RecordInfo]:
    """The gradient w.r.t. the model's output: the first module-output gradient of backward."""
    return next((r for r in run.records if r.kind == "grad" and r.attrs.get("activation")), None)


def cross_entropy(logits: np.ndarray, labels: np.ndarray, label_smoothing: float) -> float:
    """torch's mean cross entropy with label smoothing, in float64."""
    z = np.asarray(logits, np.float64)
    z = z - z.max(axis=1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    per_row = -(1 - label_smoothing) * log_p[np.arange(len(labels)), labels] \
        - label_smoothing * log_p.mean(axis=1)
    return float(per_row.mean())


def default_losses(torch_run: RunReader, ms_run: RunReader) -> bool:
    """Whether both sides trained on parity's default loss (no --torch-loss, --ms-loss)."""
    return torch_run.manifest.get("config", {}).get("torch_loss") is None and \
        ms_run.manifest.get("config", {}).get("ms_loss") is None


def loss_value(run: RunReader, record: RecordInfo) -> float:
    return float(np.asarray(run.tensor(record), np.float64).reshape(-1)[0])


def is_cross_entropy(loss: float, entropy: float) -> bool:
    """Whether a loss is this cross ``entropy``, to float32 rounding (OWN_CROSS_ENTROPY)."""
    return abs(loss - entropy) <= OWN_CROSS_ENTROPY * max(1.0, abs(entropy))


def losses_of_own_logits(torch_run: RunReader, ms_run: RunReader) -> Optional[LogitsGap]:
    """With parity's default losses on both sides and (N, K) logits (or N×L×K, classes last),
    each side's loss the cross entropy of its own logits: the gap between the two. None when
    either is not."""
    config = torch_run.manifest.get("config", {})
    if not default_losses(torch_run, ms_run):
        return None
    runs = (torch_run, ms_run)
    labels, outputs = torch_run.record("target", "input"), [output_gradient(r) for r in runs]
    if labels is None or None in outputs:
        return None
    logits = [run.record(grad.name, "forward") for run, grad in zip(runs, outputs)]
    losses = [run.record("loss", "loss") for run in runs]
    if None in logits or None in losses or logits[0].shape != logits[1].shape:
        return None
    shape, y = tuple(logits[0].shape), np.asarray(torch_run.tensor(labels)).astype(np.int64)
    if classes_last(shape, y.shape):        # a language model's N×L×V: one row per token
        shape = (math.prod(shape[:-1]), shape[-1])
    y = y.reshape(-1)
    if len(shape) != 2 or y.shape != (shape[0],) or y.min() < 0 or y.max() >= shape[1]:
        return None
    eps = float(config.get("label_smoothing", 0.0))
    own = []
    for run, logits_record, loss_record in zip(runs, logits, losses):
        own.append(cross_entropy(run.tensor(logits_record).reshape(shape), y, eps))
        if not is_cross_entropy(loss_value(run, loss_record), own[-1]):
            return None
    return LogitsGap(logits=logits[0].name, gap=abs(own[1] - own[0]))
