"""Gradients that are sums over batch and space, and may cancel: a normalisation's weight and
bias gradients (BatchNorm, GroupNorm, LayerNorm), and the bias gradient of a conv or dense layer.

A normalisation's weight and bias gradients are sums over batch and space (over batch and
positions for a LayerNorm) of g·x̂ and of g, g its output gradient; a conv's or dense layer's
bias gradient is the sum of g. A bias feeding a BatchNorm is removed by it with the batch
mean, so its gradient is zero but for rounding: the correct port of a tiny pair with a biased
conv before a BatchNorm (tests/tiny.py) failed there in 4 of 12 initialisations (noise ratio
8.2 to 11.5; torch's own float32 error 2.5e8 to 1.2e9 % of the exact value) before conv biases
were judged as sums, with the sums' own rounding.

Where such a sum cancels, an error in g far below g's own noise tolerance moves
the sum by a lot. Measured: MobileNetV2 at batch 8, 224², a BatchNorm feeding a depthwise conv
and then another BatchNorm (which undoes the scaling of a channel up to its eps, so the weight
gradient is 1/140000 of its terms): MindSpore's and torch's g 0.9 % apart (torch's own float32
error 0.6 %) gave weight gradients 7.4 % apart, 9.3× torch's own float32 error there, while each
side's gradient was its own sum to 4e-4.

So a failing one is judged again with the error that g's relative error r makes in sums of
independent terms, r·‖terms‖ (``allowed_error``): large only where the sum cancels. So that a
wrong sum cannot hide there, MindSpore's gradient must equal the sum of its own terms within
what two correct float32 sums may be apart by (``sum_rounding``, ``off_own_sum``).
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from parity.compare.optimizer import EPS32
from parity.compare.structure import op_family
from parity.rounding import sequential_sum_error

REASON = "MindSpore's gradient is not the sum of its own terms"


def summed_axis(op: str, role: str) -> Optional[int]:
    """The axis a ``role`` ("weight" or "bias") gradient of an ``op`` module keeps when that
    gradient is a sum over the other axes of its output's (None when it is no such sum):
    features last for a LayerNorm and a dense layer, channels second otherwise."""
    family = op_family(op)
    if family in ("batchnorm", "groupnorm", "layernorm") and role in ("weight", "bias"):
        return -1 if family == "layernorm" else 1
    if family in ("conv", "convtranspose", "dense") and role == "bias":
        return -1 if family == "dense" else 1
    return None


def terms(output_grad: np.ndarray, output: Optional[np.ndarray], gamma: np.ndarray,
          beta: np.ndarray, role: str, channels: int = 1) -> np.ndarray:
    """The terms of a ``role`` ("weight" or "bias") gradient, float64: g for a bias, g·x̂ for a
    normalisation's weight, x̂ recovered from the output and the weight and bias before the step
    (0 where γ = 0), γ and β along the ``channels`` axis; the output, gamma and beta are needed
    for a weight only."""
    g = np.asarray(output_grad, np.float64)
    if role == "weight":
        shape = [1] * g.ndim
        shape[channels] = -1
        gamma, beta = (np.asarray(v, np.float64).reshape(shape) for v in (gamma, beta))
        g = g * np.divide(np.asarray(output, np.float64) - beta, gamma, out=np.zeros(g.shape),
                          where=gamma != 0)
    return g


def _reduced_axes(array: np.ndarray, channels: int) -> Tuple[int, ...]:
    return tuple(axis for axis in range(array.ndim) if axis != channels % array.ndim)


def sum_rounding(terms: np.ndarray, channels: int = 1) -> np.ndarray:
    """Per channel, what two correct float32 sums of ``terms`` may be apart by: a pairwise
    sum's worst rounding, log2(n) roundings of Σ|terms|, plus the most a sequential float32
    sum of the same terms is off in any channel.

    MindSpore 2.8.0's CPU kernels sum more nearly one value after another: its GroupNorm's
    beta gradient (a conv-GroupNorm-ReLU pair, a mean over space after it, batch 2, 64²:
    8,192 terms of one sign a channel) was off the sum of its own terms by 21.8 times the
    pairwise bound, while a sequential float32 sum of them was off by up to 42.5 times it;
    against both together 0.60. Where the terms' signs are mixed a sequential sum rounds about
    as a pairwise one does (0.9 times the bound in that pair's first GroupNorm), and a wrong
    sum stays as plain as before."""
    count = terms.size / terms.shape[channels]
    pairwise = np.log2(max(count, 2)) * EPS32 * np.sum(np.abs(terms),
                                                       axis=_reduced_axes(terms, channels))
    off = sequential_sum_error(np.moveaxis(terms, channels, -1).reshape(-1, terms.shape[channels]))
    return pairwise + float(np.max(np.abs(off), initial=0.0))


def allowed_error(torch_terms: np.ndarray, relative_error: float, channels: int = 1) -> float:
    """The error (2-norm over channels) that ``relative_error`` in each independent term makes
    in the per-channel sums, plus the sums' own rounding: two correct float32 sums of the same
    terms differ by that much (a conv bias before a BatchNorm, whose exact gradient is zero:
    MindSpore's 8 to 11× torch's float32 error in 4 of 12 initialisations, within this)."""
    per_channel = np.sqrt(np.sum(torch_terms * torch_terms,
                                 axis=_reduced_axes(torch_terms, channels)))
    return relative_error * float(np.linalg.norm(per_channel)) + \
        float(np.linalg.norm(sum_rounding(torch_terms, channels)))


def off_own_sum(gradient: np.ndarray, ms_terms: np.ndarray, channels: int = 1) -> float:
    """The largest |gradient − Σ terms| per channel over a float32 sum's rounding
    (``sum_rounding``): above 1, the gradient is not that sum."""
    exact = np.sum(ms_terms, axis=_reduced_axes(ms_terms, channels))
    return float(np.max(np.abs(np.asarray(gradient, np.float64).reshape(-1) - exact)
                        / (sum_rounding(ms_terms, channels) + 1e-30)))


def reason(off: float) -> str:
    return f"{REASON} (off by {off:.3g}x a float32 sum's rounding)"
