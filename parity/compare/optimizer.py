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

ULPS = 4                                   # the four roundings above, one ulp each
EPS32 = float(np.finfo(np.float32).eps)    # a unit in the last place, relative
BLOCK = 1 << 16                            # elements at a time: temporaries stay in cache


REASON = "MindSpore's update is not torch's SGD step of MindSpore's own gradient"


def torch_step(grad: np.ndarray, w0: np.ndarray, config: Mapping[str, Any]) -> np.ndarray:
    """Torch's first SGD step Δ from ``grad`` and ``w0``, in float64."""
    w = np.asarray(w0, np.float64)
    scale = -float(config["lr"]) * (1 + float(config["momentum"]) if config.get("nesterov")
                                    else 1.0)
    return (grad + float(config["weight_decay"]) * w) * scale


def step_error(grad: np.ndarray, w0: np.ndarray, update: np.ndarray,
               config: Mapping[str, Any]) -> float:
    """The largest |Δ - torch's step| over the float32 rounding allowed there: above 1, the
    update is not that step. Computed in float64, a block at a time."""
    grad, w0, update = (np.asarray(a).reshape(-1) for a in (grad, w0, update))
    worst = 0.0
    for start in range(0, update.size, BLOCK):
        w = w0[start:start + BLOCK].astype(np.float64)
        expected = torch_step(grad[start:start + BLOCK], w, config)
        rounding = ULPS * EPS32 * (np.abs(w) + np.abs(expected)) + 1e-30
        off = np.abs(update[start:start + BLOCK] - expected) / rounding
        worst = max(worst, float(off.max()))
    return worst


def reason(error: float) -> str:
    return (f"{REASON} (off by {error:.3g}x float32 rounding): lr, momentum, nesterov, weight "
            "decay or its scope, or the loss scale differ")
