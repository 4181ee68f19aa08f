"""Is MindSpore's update torch's optimizer step of MindSpore's own gradient?

Comparing MindSpore's update with torch's tests the gradient and the optimizer together. Where
ReLU units flipped by float32 noise make the gradients differ legitimately (parity/kinks.py),
an optimizer bug of the same size hides in that allowance: weight decay skipped on gamma/beta
(an update error of lr·wd·w) went unseen at batch 2, 64², seed 2. This check needs no torch
gradient. From MindSpore's own gradient g and the initial weight w0, torch's first SGD step is

    d = g + wd·w0,    Δ = -lr·d·(1 + momentum if nesterov else 1)

(the momentum buffer starts as d; dampening acts from the second step on). MindSpore's Δ may
differ from it by float32 rounding only: g + wd·w0, lr·d, w0 - lr·d and w1 - w0 each round once.

Adam's and AdamW's first step, their bias corrections undoing (1 - β1) and (1 - β2), is

    d = g (+ wd·w0 for Adam),  v = (1 - β2)·d²,  Δ = -lr·d / (|d| + eps) (- lr·wd·w0 for AdamW)

about a dozen roundings, each relative to |w0|, |Δ| or d's terms; where |d| is near eps, an
error in d moves Δ by lr·eps/(|d| + eps)² times it. The same d's float32 noise is what makes
Adam's update differ from torch's where a gradient is near zero (up to ±lr): the update, the
updated weight and v are judged by this check, their gradient by its own comparison (engine).
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, NamedTuple, Optional, Tuple

import numpy as np

from parity.compare.metrics import CHUNK, Workspace

ULPS = 4                                   # the four roundings above, one ulp each
EPS32 = float(np.finfo(np.float32).eps)    # a unit in the last place, relative
TINY = 1e-30                               # the scale where w and the step are both zero
# Adam's roundings of Δ: m, d², (1 - β2)·d², √v, its bias correction, + eps, m / denominator,
# the step size (a unit each); of w: the decoupled decay's factor and product, w0 + Δ, w1 - w0
# (ULPS). Measured: torch's own float32 AdamW needs 1.1 units of |w| and fewer than 4 of |Δ|.
ADAM_ULPS = 8
SMALLEST32 = float(np.finfo(np.float32).smallest_subnormal)    # v's absolute rounding floor


def is_adam(config: Mapping[str, Any]) -> bool:
    return config.get("optimizer", "sgd") in ("adam", "adamw")


def name(config: Mapping[str, Any]) -> str:
    return {"adam": "Adam", "adamw": "AdamW"}.get(config.get("optimizer", "sgd"), "SGD")


REASON = "of MindSpore's own gradient"     # in every reason(): how a diagnosis tells it failed


def torch_step(grad: np.ndarray, w0: np.ndarray, config: Mapping[str, Any]) -> np.ndarray:
    """Torch's first step Δ from ``grad`` and ``w0``, in float64."""
    w = np.asarray(w0, np.float64)
    if is_adam(config):
        return _adam(grad, w, config).update
    return (grad + float(config["weight_decay"]) * w) * sgd_scale(config)


class _AdamStep(NamedTuple):
    """Adam's or AdamW's first step in float64, and the sizes its rounding is relative to."""

    update: np.ndarray          # Δ
    exp_avg_sq: np.ndarray      # v
    d: np.ndarray               # |d|
    terms: np.ndarray           # |g| (+ wd·|w0| for Adam)


def _adam(grad: np.ndarray, w: np.ndarray, config: Mapping[str, Any]) -> _AdamStep:
    lr, wd, eps = (float(config[key]) for key in ("lr", "weight_decay", "eps"))
    coupled = wd if config["optimizer"] == "adam" else 0.0
    d = np.asarray(grad, np.float64) + coupled * w
    size = np.abs(d)
    step = -lr * d / np.maximum(size + eps, TINY)
    if config["optimizer"] == "adamw":
        step -= lr * wd * w
    return _AdamStep(step, (1 - float(config["beta2"])) * d * d, size,
                     np.abs(grad) + coupled * np.abs(w))


def sgd_scale(config: Mapping[str, Any]) -> float:
    """Δ = scale · d on SGD's first step."""
    return -float(config.get("lr", 0.0)) * (1 + float(config.get("momentum", 0.0))
                                            if config.get("nesterov") else 1.0)


def step_error(grad: np.ndarray, w0: np.ndarray, update: np.ndarray,
               config: Mapping[str, Any]) -> float:
    """The largest |Δ - torch's step| over the float32 rounding allowed there: above 1, the
    update is not that step. Computed in float64, a block at a time, in compare's buffers
    reused from block to block and call to call (temporaries per block made it 2 to 3 times
    slower: 0.23-0.34 s against 0.10-0.13 s over ResNet50's 25.6 M parameters)."""
    grad, w0, update = (np.asarray(a).reshape(-1) for a in (grad, w0, update))
    if is_adam(config):
        return _adam_step_error(grad, w0, update, config)
    scale, decay = sgd_scale(config), float(config["weight_decay"])
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


def _adam_step_error(grad: np.ndarray, w0: np.ndarray, update: np.ndarray,
                     config: Mapping[str, Any]) -> float:
    """step_error of Adam's or AdamW's step: each Δ's error over the roundings allowed there,
    ULPS of |w0|, ADAM_ULPS of |Δ| and of d's terms carried through d's effect on Δ."""
    lr, eps = float(config["lr"]), float(config["eps"])
    worst = 0.0
    for start in range(0, update.size, CHUNK):
        block = slice(start, start + CHUNK)
        w = np.asarray(w0[block], np.float64)
        step = _adam(grad[block], w, config)
        through_d = lr * step.terms * eps / np.maximum((step.d + eps) ** 2, TINY)
        allowed = EPS32 * (ULPS * np.abs(w) + ADAM_ULPS * (np.abs(step.update) + through_d))
        off = np.abs(update[block] - step.update) / np.maximum(allowed, TINY)
        worst = max(worst, float(off.max(initial=0.0)))
    return worst


def state_error(grad: np.ndarray, w0: np.ndarray, exp_avg_sq: np.ndarray,
                config: Mapping[str, Any]) -> float:
    """As step_error, for Adam's exp_avg_sq v = (1 - β2)·d²: its error over ADAM_ULPS
    roundings of (1 - β2)·(d's terms)², and float32's smallest step where that underflows.
    1 - β2 may be taken from β2 in float32, as MindSpore's AdamW does (1 - 0.999 is then
    1.3e-5 off, relative; measured, MindSpore 2.8.0), which its bias correction, from the same
    β2, undoes in the update: the nearer of the two is the error."""
    grad, w0, value = (np.asarray(a).reshape(-1) for a in (grad, w0, exp_avg_sq))
    beta2 = float(config["beta2"])
    held = (1 - float(np.float32(beta2))) / max(1 - beta2, TINY)   # exact in float32
    worst = [0.0, 0.0]
    for start in range(0, value.size, CHUNK):
        block = slice(start, start + CHUNK)
        step = _adam(grad[block], np.asarray(w0[block], np.float64), config)
        allowed = ADAM_ULPS * (EPS32 * (1 - beta2) * step.terms ** 2 + SMALLEST32)
        for index, factor in enumerate((1.0, held)):
            off = np.abs(value[block] - factor * step.exp_avg_sq) / allowed
            worst[index] = max(worst[index], float(off.max(initial=0.0)))
    return min(worst)


# MindSpore's Adams that take another step than torch's: eps added before the bias correction
# acts as eps/√(1 - β2) on the first step; without bias correction the step is also
# (1 - β1)/√(1 - β2) times larger (README, Known limits)
ADAM_CONVENTIONS = {"eps before the bias correction": "nn.Adam and experimental.optim.Adam",
                    "no bias correction": "nn.AdamWeightDecay"}


def adam_convention(grad: np.ndarray, w0: np.ndarray, update: np.ndarray,
                    config: Mapping[str, Any]) -> Optional[Tuple[Optional[str], str]]:
    """The convention (None: torch's) and weight-decay coupling ("adam": added to the
    gradient, "adamw": decoupled) of the first step MindSpore's update is, to rounding, where it
    is not torch's; None when no such step is, or more than one (where wd·w or eps is below
    what this update can show, a weight decay skipped on the tiny pair matched two)."""
    ours = config["optimizer"]
    other = "adamw" if ours == "adam" else "adam"
    matching = [(convention, coupling) for convention in (None, *ADAM_CONVENTIONS)
                for coupling in (ours, other) if (convention, coupling) != (None, ours)
                and step_error(grad, w0, update,
                               _in_convention(config, convention, coupling)) <= 1]
    return matching[0] if len(matching) == 1 else None


def _in_convention(config: Mapping[str, Any], convention: Optional[str],
                   coupling: str) -> Dict[str, Any]:
    """Settings under which torch's first step is that of ``convention`` and ``coupling``; the
    betas in float32, as MindSpore holds them (without bias correction to undo it, 1 - β2
    from 0.999 in float32 moved nn.AdamWeightDecay's updates by 6.4e-6, 6 times the rounding
    allowed)."""
    lr, wd, eps = (float(config[key]) for key in ("lr", "weight_decay", "eps"))
    beta1, beta2 = (float(np.float32(config[key])) for key in ("beta1", "beta2"))
    root = np.sqrt(1 - beta2)
    settings = {**config, "optimizer": coupling}
    if convention is not None:
        settings["eps"] = eps / root
    if convention == "no bias correction":
        settings["lr"] = lr * (1 - beta1) / root
        if coupling == "adamw" and settings["lr"]:      # its decay stays lr·wd·w
            settings["weight_decay"] = wd * lr / settings["lr"]
    return settings


def reason(error: float, config: Mapping[str, Any], what: str = "update") -> str:
    settings = "betas, eps, weight decay (added to the gradient or decoupled)" \
        if is_adam(config) else "momentum, nesterov, weight decay"
    of = "" if what == "update" else "that of "
    return (f"MindSpore's {what} is not {of}torch's {name(config)} step {REASON} (off by "
            f"{error:.3g}x float32 rounding): lr, {settings} or its scope, or the loss scale "
            "differ")
