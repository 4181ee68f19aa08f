"""Is MindSpore's update torch's SGD step of MindSpore's own gradient?

Comparing MindSpore's update with torch's tests the gradient and the optimizer together. Where
ReLU units flipped by float32 noise make the gradients differ legitimately (parity/kinks.py),
an optimizer bug of the same size hides in that allowance: weight decay skipped on gamma/beta
(an update error of lr·wd·w) went unseen at batch 2, 64², seed 2. This check needs no torch
gradient. From MindSpore's own gradient g and the initial weight w0, torch's first SGD step is

    d = g + wd·w0,    Δ = -lr·d·(1 + momentum if nesterov else 1)

(the momentum buffer starts as d; dampening acts from the second step on). MindSpore's Δ may
differ from it by float32 rounding only: g + wd·w0, lr·d, w0 - lr·d and w1 - w0 each round once.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from parity.compare.metrics import CHUNK, Workspace

ULPS = 4                                   # the four roundings above, one ulp each
EPS32 = float(np.finfo(np.float32).eps)    # a unit in the last place, relative
TINY = 1e-30                               # the scale where w and the step are both zero


REASON = "MindSpore's update is not torch's SGD step of MindSpore's own gradient"


def torch_step(grad: np.ndarray, w0: np.ndarray, config: Mapping[str, Any]) -> np.ndarray:
    """Torch's first SGD step Δ from ``grad`` and ``w0``, in float64."""
    w = np.asarray(w0, np.float64)
    return (grad + float(config["weight_decay"]) * w) * _scale(config)


def _scale(config: Mapping[str, Any]) -> float:
    """Δ = scale · d on the first step."""
    return -float(config["lr"]) * (1 + float(config["momentum"]) if config.get("nesterov")
                                   else 1.0)


def step_error(grad: np.ndarray, w0: np.ndarray, update: np.ndarray,
               config: Mapping[str, Any]) -> float:
    """The largest |Δ - torch's step| over the float32 rounding allowed there: above 1, the
    update is not that step. Computed in float64, a block at a time, in compare's buffers
    reused from block to block and call to call (temporaries per block made it 2 to 3 times
    slower: 0.23-0.34 s against 0.10-0.13 s over ResNet50's 25.6 M parameters)."""
    grad, w0, update = (np.asarray(a).reshape(-1) for a in (grad, w0, update))
    scale, decay = _scale(config), float(config["weight_decay"])
    work = Workspace.get(np.float64)
    w_all, step_all, off_all = work.a, work.b, work.diff
    worst = 0.0
    for start in range(0, update.size, CHUNK):
        stop = min(start + CHUNK, update.size)
        w, step, off = w_all[:stop - start], step_all[:stop - start], off_all[:stop - start]
        np.copyto(w, w0[start:stop])
        np.multiply(w, decay, out=step)                   # the step as torch_step computes it
        np.add(step, grad[start:stop], out=step)
        np.multiply(step, scale, out=step)
        np.abs(np.subtract(update[start:stop], step, out=off), out=off)
        np.add(np.abs(w, out=w), np.abs(step, out=step), out=w)     # |w| + |Δ|, the scale
        np.divide(off, np.maximum(w, TINY, out=w), out=off)
        worst = max(worst, float(off.max()))
    return worst / (ULPS * EPS32)


def reason(error: float) -> str:
    return (f"{REASON} (off by {error:.3g}x float32 rounding): lr, momentum, nesterov, weight "
            "decay or its scope, or the loss scale differ")
