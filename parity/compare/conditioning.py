"""Where float32 itself is far from exact, so that two correct computations differ by more
than any fixed tolerance allows: measured by torch's float64 step, or suspected past a
BatchNorm that normalises few values per channel (batch × height × width)."""

from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np

from parity.records import Comparison, Diagnosis, RecordInfo
from parity.rundir import RunReader


# torch's own float32 error (relative RMS, from its float64 rerun) beyond which a record is
# ill-conditioned: about three digits left. Measured on the correct ResNet50 port: at batch 2,
# 32² (layer4 normalises 2 values per channel) it failed 2 of 3 seeds at records with 0.2 to
# 4 % float32 error; at batch 2, 64² the worst record of a run has 0.5 to 8 % (12 seeds, in
# layer4), at batch 2, 64² in ResNet18 0.004 to 0.6 % (6 seeds).
ILL_CONDITIONED = 1e-3
# BatchNorm over this few values per channel (batch × height × width) amplifies float32
# rounding: ResNet50's layer4 at batch 2, 32² normalises 2 (see ILL_CONDITIONED), and ResNet18
# at batch 2, 32² without the float64 reference fails at layer4.1.bn2 with max_rel 0.0185
# (`parity run --model resnet18 --image-size 32 --no-fp64-reference`), passing with it.
FEW_VALUES_PER_CHANNEL = 16


def ill_conditioned(first: Comparison, t: RecordInfo,
                    torch_run: RunReader) -> Optional[Diagnosis]:
    """A record where float32 itself is far from exact: measured by torch's float64 step, or,
    without it (--no-fp64-reference), suspected where BatchNorm normalises few values per
    channel before it."""
    where = few_values_per_channel(first, t, torch_run)
    if first.fp32_noise >= ILL_CONDITIONED:
        return Diagnosis(
            cause="float32 ill-conditioned here",
            detail=f"torch's own float32 {first.name} · {first.kind} is "
                   f"{100 * first.fp32_noise:.2g} % from its float64 result, MindSpore's "
                   f"differs from torch's by {100 * first.ms_error:.2g} %: two correct float32 "
                   f"computations can differ that much here.{where} A larger batch or image "
                   "checks this part of the network reliably.", confidence="likely")
    if math.isnan(first.fp32_noise) and where and \
            torch_run.manifest.get("fp64_reference") is False:
        return Diagnosis(
            cause="float32 may be ill-conditioned here (no float64 reference)",
            detail=f"{first.name} · {first.kind} differs by {first.max_rel:.2g} at most and "
                   f"every earlier record matched.{where} Past so few values two correct "
                   "float32 computations can differ by percents, which fixed tolerances cannot "
                   "tell from a bug: run again without --no-fp64-reference (torch's float64 step "
                   "measures its own float32 error there), or with a larger batch or image.",
            confidence="guess")
    return None


def few_values_per_channel(first: Comparison, t: Optional[RecordInfo],
                           torch_run: RunReader) -> str:
    """' bn normalises 2 values per channel (...).' for the training BatchNorm with the fewest
    before ``first`` (any, past the forward) if FEW_VALUES_PER_CHANNEL or fewer; else ''."""
    fewest = _fewest_values_per_channel(torch_run, t if first.kind == "forward" else None)
    if fewest is None or fewest[0] > FEW_VALUES_PER_CHANNEL:
        return ""
    return normalises(fewest[1], fewest[0])


def normalises(batch_norm: str, values: int) -> str:
    return f" {batch_norm} normalises {values} values per channel (batch × height × width)."


def _fewest_values_per_channel(torch_run: RunReader,
                               up_to: Optional[RecordInfo]) -> Optional[Tuple[int, str]]:
    """(values, name) of the training BatchNorm that normalises the fewest values per channel;
    only those that ran before ``up_to`` if given."""
    counts = [(values, r.name) for r in torch_run.records
              if (values := values_per_channel(r)) is not None
              and (up_to is None or r.order <= up_to.order)]
    return min(counts, default=None)


def values_per_channel(record: RecordInfo) -> Optional[int]:
    """How many values a training BatchNorm's forward record normalises per channel (batch ×
    height × width); None for any other record."""
    if record.kind == "forward" and record.op.startswith("batchnorm") and \
            len(record.shape) > 1 and record.attrs.get("training"):
        return int(np.prod(record.shape)) // record.shape[1]
    return None
