"""Comparing one pair of tensors: a pure function returning every statistic and the verdict.

Differences are computed in float64. Two verdicts, by what the torch capture provides:

* **Noise-calibrated** (default: torch also ran the step in float64). Float32 error is not a
  constant: small-batch BatchNorm amplifies it, so at batch 2 torch's *own* float32 gradients
  differ from float64 by several times their RMS in layer4 (measured, README). MindSpore is
  judged against the same yardstick:

      noise_ratio = rms(ms - t64) / (rms(t32 - t64) + noise_floor * rms(t64) + atol)

  and the record passes when ``noise_ratio <= noise_factor``: MindSpore may be a few times
  further from the exact result than torch's float32 is, not more.

* **Fixed tolerance** (no float64 reference). An element is within tolerance when

      |ms - torch| <= atol + rtol * max(|torch|, rms(torch))

  and the record passes when every element is and the cosine is at least ``min_cosine``.

The ``rms(torch)`` guard makes relative error meaningful near zero: a float32 sum's rounding
error scales with the magnitude of what was summed, not with the (possibly cancelled) result.
``max_rel`` always uses the same guarded magnitude.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np

TINY = 1e-30


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
    min_cosine: float
    noise_factor: float = 4.0
    noise_floor: float = 1e-6
    allow_nan: bool = False


@dataclass(frozen=True)
class TensorStats:
    passed: bool
    max_abs: float
    max_rel: float
    mean_abs: float
    rms: float
    ref_rms: float
    cosine: float
    frac_within: float
    worst_index: Tuple[int, ...]
    worst_torch: float
    worst_mindspore: float
    nan_torch: int
    nan_mindspore: int
    inf_torch: int
    inf_mindspore: int
    needed_rtol: float
    fp32_noise: float          # rms(t32 - t64) / rms(t64): torch's own float32 error
    ms_error: float            # rms(ms - t64) / rms(t64)
    noise_ratio: float         # see module docstring; NaN without a float64 reference
    reason: str


def _count(values: np.ndarray) -> Tuple[int, int]:
    return int(np.isnan(values).sum()), int(np.isinf(values).sum())


def cosine_similarity(a: np.ndarray, b: np.ndarray) -> float:
    """1.0 when both are zero; 0.0 when exactly one is."""
    norm_a, norm_b = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if norm_a == 0.0 and norm_b == 0.0:
        return 1.0
    if norm_a == 0.0 or norm_b == 0.0:
        return 0.0
    return float(np.clip(np.dot(a, b) / (norm_a * norm_b), -1.0, 1.0))


def _rms(values: np.ndarray) -> float:
    return float(np.sqrt(np.mean(values * values))) if values.size else 0.0


def noise_statistics(a: np.ndarray, b: np.ndarray, exact: np.ndarray,
                     tolerance: Tolerance) -> Tuple[float, float, float]:
    """(fp32_noise, ms_error, noise_ratio) of finite float64 vectors torch, ms, torch-fp64."""
    scale = _rms(exact)
    own, theirs = _rms(a - exact), _rms(b - exact)
    ratio = theirs / (own + tolerance.noise_floor * scale + tolerance.atol + TINY)
    scale = max(scale, TINY)
    return own / scale, theirs / scale, ratio


def compare_tensors(torch_value: np.ndarray, ms_value: np.ndarray, tolerance: Tolerance,
                    torch_fp64: Optional[np.ndarray] = None) -> TensorStats:
    if torch_value.shape != ms_value.shape:
        raise ValueError(f"shape {torch_value.shape} vs {ms_value.shape}")
    a = np.asarray(torch_value, dtype=np.float64).ravel()
    b = np.asarray(ms_value, dtype=np.float64).ravel()
    nan_a, inf_a = _count(a)
    nan_b, inf_b = _count(b)
    finite = np.isfinite(a) & np.isfinite(b)
    same_nonfinite = (~finite) & ((a == b) | (np.isnan(a) & np.isnan(b)))
    a_f, b_f = np.where(finite, a, 0.0), np.where(finite, b, 0.0)
    diff = np.abs(a_f - b_f)
    ref_rms = _rms(a_f)
    magnitude = np.maximum(np.abs(a_f), max(ref_rms, TINY))
    allowed = tolerance.atol + tolerance.rtol * magnitude
    within = (diff <= allowed) & finite
    if tolerance.allow_nan:
        within |= same_nonfinite
    rel = diff / magnitude
    worst = int(np.argmax(np.where(finite, rel, np.inf))) if a.size else 0
    needed = np.where(finite, (diff - tolerance.atol) / magnitude, np.inf)
    cosine = cosine_similarity(a_f, b_f)
    frac = float(within.mean()) if a.size else 1.0
    reasons = []
    if nan_a + nan_b + inf_a + inf_b and not tolerance.allow_nan:
        reasons.append(f"non-finite values (NaN torch {nan_a} / MindSpore {nan_b}, "
                       f"Inf torch {inf_a} / MindSpore {inf_b})")
    nan = float("nan")
    fp32_noise = ms_error = noise_ratio = nan
    if torch_fp64 is not None:
        exact = np.asarray(torch_fp64, dtype=np.float64).ravel()
        exact = np.where(finite & np.isfinite(exact), exact, 0.0)
        fp32_noise, ms_error, noise_ratio = noise_statistics(a_f, b_f, exact, tolerance)
        if noise_ratio > tolerance.noise_factor:
            reasons.append(f"{noise_ratio:.3g}x further from float64 than torch's float32 "
                           f"(allowed {tolerance.noise_factor:g}x): relative error "
                           f"{ms_error:.2g} vs torch's own {fp32_noise:.2g}")
    else:
        if frac < 1.0:
            reasons.append(f"{int(a.size - within.sum())} / {a.size} elements "
                           f"({100 * (1 - frac):.3g}%) beyond tolerance")
        if cosine < tolerance.min_cosine:
            reasons.append(f"cosine {cosine:.6f} < {tolerance.min_cosine}")
    return TensorStats(
        passed=not reasons,
        max_abs=float(diff.max()) if a.size else 0.0,
        max_rel=float(rel.max()) if a.size else 0.0,
        mean_abs=float(diff.mean()) if a.size else 0.0,
        rms=float(np.sqrt(np.mean(diff * diff))) if a.size else 0.0,
        ref_rms=ref_rms,
        cosine=cosine,
        frac_within=frac,
        worst_index=tuple(int(i) for i in np.unravel_index(worst, torch_value.shape))
        if a.size else (),
        worst_torch=float(a[worst]) if a.size else 0.0,
        worst_mindspore=float(b[worst]) if a.size else 0.0,
        nan_torch=nan_a, nan_mindspore=nan_b, inf_torch=inf_a, inf_mindspore=inf_b,
        needed_rtol=float(max(needed.max(), 0.0)) if a.size else 0.0,
        fp32_noise=fp32_noise, ms_error=ms_error, noise_ratio=noise_ratio,
        reason="; ".join(reasons))


def error_histogram(torch_value: np.ndarray, ms_value: np.ndarray,
                    bins: int = 40) -> Tuple[np.ndarray, np.ndarray]:
    """Counts of log10 of the guarded relative error, for the report's per-record histogram."""
    a = np.asarray(torch_value, dtype=np.float64).ravel()
    b = np.asarray(ms_value, dtype=np.float64).ravel()
    finite = np.isfinite(a) & np.isfinite(b)
    a, b = a[finite], b[finite]
    scale = max(float(np.sqrt(np.mean(a * a))) if a.size else 0.0, TINY)
    rel = np.abs(a - b) / np.maximum(np.abs(a), scale)
    log_rel = np.log10(np.maximum(rel, 1e-12))
    return np.histogram(log_rel, bins=bins, range=(-12.0, 1.0))


def worst_elements(torch_value: np.ndarray, ms_value: np.ndarray, count: int = 10):
    """(index, torch value, MindSpore value, abs diff) of the largest absolute differences."""
    a = np.asarray(torch_value, dtype=np.float64).ravel()
    b = np.asarray(ms_value, dtype=np.float64).ravel()
    diff = np.abs(np.nan_to_num(a - b, nan=np.inf))
    count = min(count, diff.size)
    top = np.argpartition(-diff, count - 1)[:count] if count else np.array([], dtype=int)
    top = top[np.argsort(-diff[top])]
    return [(tuple(int(i) for i in np.unravel_index(k, np.shape(torch_value))), float(a[k]),
             float(b[k]), float(diff[k])) for k in top]
