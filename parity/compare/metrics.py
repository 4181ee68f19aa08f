"""Comparing one pair of tensors: a pure function returning every statistic and the verdict.

Two finite float32 tensors are compared in float32, 1.7x faster (3.5 vs 2.1 GB/s): on every
record of a ResNet50 run the statistics stay within 2e-6 relative of a float64 computation and
the cosine within 7e-10 (it is taken from |a - b|², not a·b, to stay accurate near 1); block
sums are accumulated in float64. Any other pair is compared in float64. Two verdicts, by what
the torch capture provides:

* **Noise-calibrated** (default: torch also ran the step in float64 and stored, per record,
  rms(t32 - t64) and rms(t64)). Float32 error is not a constant: small-batch BatchNorm
  amplifies it, so at batch 2 torch's *own* float32 gradients differ from float64 by several
  times their RMS in layer4 (measured, README). MindSpore is judged against that yardstick:

      noise_ratio = rms(ms - t32) / (rms(t32 - t64) + noise_floor * rms(t64) + atol)

  and the record passes when ``noise_ratio <= noise_factor``: MindSpore may differ from torch
  by a few times torch's own float32 error, not more. (Measured against the float64 result
  itself instead, the ratio moves by at most 1, by the triangle inequality; keeping only two
  numbers per record halves what the torch capture writes and the compare reads.) Behind ReLU
  units that changed sign within float32 noise, gradients may also differ by the gradient
  those units redirect: an allowance times rms(t64) joins the denominator there
  (parity/kinks.py).

* **Fixed tolerance** (no float64 reference). An element is within tolerance when

      |ms - torch| <= atol + rtol * max(|torch|, rms(torch))

  and the record passes when every element is and the cosine is at least ``min_cosine``.

The ``rms(torch)`` guard makes relative error meaningful near zero: a float32 sum's rounding
error scales with the magnitude of what was summed, not with the (possibly cancelled) result.
``max_rel`` always uses the same guarded magnitude.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from dataclasses import dataclass
from typing import Any, Optional, Tuple, TypeVar

import numpy as np

from parity.records import TensorStats

TINY = 1e-30
S = TypeVar("S", bound=TensorStats)


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
    min_cosine: float
    noise_factor: float = 4.0
    noise_floor: float = 1e-6
    allow_nan: bool = False


CHUNK = 1 << 16     # elements per block; measured fastest of 2^14 ... 2^18 (buffers stay in cache)


def cosine_similarity(a: np.ndarray, b: np.ndarray) -> float:
    """1.0 when both are zero; 0.0 when exactly one is."""
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    d = a - b
    return _cosine_from_difference(float(np.dot(d, d)), float(np.dot(a, a)), float(np.dot(b, b)))


def _cosine_from_difference(dd: float, aa: float, bb: float) -> float:
    """cos(a, b) from |a - b|², |a|², |b|²: 1 - cos = (|a-b|² - (|a| - |b|)²) / (2|a||b|).

    Accurate near 1 even when the three sums carry float32 rounding (relative 1e-6): the
    error lands on 1 - cos relatively, where a·b / (|a||b|) would lose it entirely.
    """
    if aa == 0.0 or bb == 0.0:
        return 1.0 if aa == bb else 0.0
    norm_a, norm_b = math.sqrt(aa), math.sqrt(bb)
    one_minus = (dd - (norm_a - norm_b) ** 2) / (2.0 * norm_a * norm_b)
    return min(max(1.0 - one_minus, -1.0), 1.0)


def _blocks(*arrays: np.ndarray, into: Optional[Tuple[np.ndarray, ...]] = None):
    """Aligned blocks of the flattened arrays: views, or copies into the buffers ``into``
    (reused from block to block) when their dtype differs."""
    flat = [np.asarray(x).reshape(-1) for x in arrays]
    size = flat[0].size
    for start in range(0, size, CHUNK):
        blocks = [x[start:start + CHUNK] for x in flat]
        if into is not None:
            blocks = [_as_dtype_of(buffer, block) for buffer, block in zip(into, blocks)]
        yield start, blocks


def _as_dtype_of(buffer: np.ndarray, block: np.ndarray) -> np.ndarray:
    if block.dtype == buffer.dtype:
        return block
    view = buffer[:block.size]
    np.copyto(view, block)
    return view


class Workspace:
    """Block buffers of one dtype, one set per thread, reused from block to block and from call
    to call (by compare_tensors, and by optimizer.step_error: never one inside the other).
    Fresh temporaries per block made the kernel 30 % slower (1.05 vs 1.5 GB/s on ResNet50's
    conv1 output at batch 8, 224²); fresh buffers per call cost 0.8 ms, which made a 32
    K-element tensor compare at 0.28 GB/s."""

    _per_thread = threading.local()

    def __init__(self, dtype: type) -> None:
        self.a, self.b, self.diff, self.magnitude, self.rel, self.needed = \
            (np.empty(CHUNK, dtype) for _ in range(6))
        self.ok = np.empty(CHUNK, dtype=bool)

    @classmethod
    def get(cls, dtype: type) -> "Workspace":
        sets = cls._per_thread.__dict__.setdefault("sets", {})
        if dtype not in sets:
            sets[dtype] = cls(dtype)
        return sets[dtype]


@dataclass
class _Sums:
    """Running sums over blocks; every statistic is finished from these."""

    aa: float = 0.0
    bb: float = 0.0
    diff: float = 0.0
    diff2: float = 0.0
    max_abs: float = 0.0
    max_rel: float = 0.0
    worst: int = 0
    worst_score: float = -1.0
    needed: float = 0.0
    within: int = 0


@dataclass(frozen=True)
class Float64Noise:
    """What torch's float64 rerun says about one record: rms(t32 - t64) and rms(t64)."""

    fp32_noise_rms: float
    exact_rms: float
    # measured over the whole tensor the compared one is a part of (a fused layer's rows or
    # channels, records.Part): judged scaled to the part (scaled_to)
    of_whole: bool = False

    def scaled_to(self, ref_rms: float) -> "Float64Noise":
        """This noise for a part of rms ``ref_rms`` (torch's float32 values, near enough its
        float64 ones) of the whole it was measured over: the whole's relative float32 error at
        the part's magnitude, rounding error scaling with the magnitude of what is summed, but
        never below the whole's absolute error. Measured on timm's DPN92 (gradients of
        blocks' fused conv outputs, whose last channels feed the dense path: README): those
        channels' rms 1.9-4.6x the rest's, their float32 error 1.9-4.3x, their relative error
        within 5 % of the whole's; judged by the whole's absolute error, mindcv's port failed
        19 of them at 8-16x. A part holding what cancels has no magnitude to scale by (timm's
        PiT: a key bias's gradient, zero but for rounding, 2.8e-10 of the qkv bias's 0.053):
        scaled down, mindcv's port failed its update at 9.2x."""
        if not self.of_whole or not self.exact_rms:
            return self
        scale = max(ref_rms / self.exact_rms, 1.0)
        return Float64Noise(self.fp32_noise_rms * scale, self.exact_rms * scale)


def compare_tensors(torch_value: np.ndarray, ms_value: np.ndarray, tolerance: Tolerance,
                    noise: Optional[Float64Noise] = None) -> TensorStats:
    """Two passes over cache-sized blocks: the tensor's scale, then everything else.

    With ``noise`` the verdict is noise-calibrated, and the per-element tolerance test
    (frac_within, needed_rtol) is skipped: it decides nothing there, and it is a third of the
    work. Those two fields are then NaN.
    """
    if torch_value.shape != ms_value.shape:
        raise ValueError(f"shape {torch_value.shape} vs {ms_value.shape}")
    calibrated = noise is not None
    size = torch_value.size
    # Pass 1, in the stored precision: the guard magnitude only needs a few digits, and a
    # non-finite sum of squares flags a block holding NaN or Inf.
    sum_aa, sum_bb, all_finite = 0.0, 0.0, True
    for _, (a, b) in _blocks(torch_value, ms_value):
        block_aa, block_bb = float(np.dot(a, a)), float(np.dot(b, b))
        if math.isfinite(block_aa) and math.isfinite(block_bb):
            sum_aa += block_aa
            sum_bb += block_bb
        else:
            all_finite = False
    # Two finite float32 tensors are compared in float32, anything else in float64.
    dtype = np.float32 if all_finite and torch_value.dtype == ms_value.dtype == np.float32 \
        else np.float64
    work = Workspace.get(dtype)
    counts = np.zeros(4, dtype=np.int64)          # NaN torch, NaN ms, Inf torch, Inf ms
    if not all_finite:
        sum_aa = 0.0
        for _, (a, b) in _blocks(torch_value, ms_value, into=(work.a, work.b)):
            counts += (np.isnan(a).sum(), np.isnan(b).sum(), np.isinf(a).sum(),
                       np.isinf(b).sum())
            a = np.where(np.isfinite(a) & np.isfinite(b), a, 0.0)
            sum_aa += float(np.dot(a, a))
    ref_rms = math.sqrt(sum_aa / size) if size else 0.0
    guard = max(ref_rms, TINY)

    # Finite tensors already in the compare's dtype are read in the blocks pass 1 read, so its
    # sums of squares are the cosine's, bit for bit (5-7 % faster than summing them again,
    # measured on 0.26 M to 3.2 M elements).
    reuse_squares = all_finite and torch_value.dtype == ms_value.dtype == dtype
    sums = _Sums(aa=sum_aa, bb=sum_bb) if reuse_squares else _Sums()
    for start, (a, b) in _blocks(torch_value, ms_value, into=(work.a, work.b)):
        n = a.size
        finite = None
        if not all_finite:
            finite = np.isfinite(a) & np.isfinite(b)
            same = (a == b) | (np.isnan(a) & np.isnan(b))
            a, b = np.where(finite, a, 0.0), np.where(finite, b, 0.0)
        diff = np.abs(np.subtract(a, b, out=work.diff[:n]), out=work.diff[:n])
        magnitude = np.maximum(np.abs(a, out=work.magnitude[:n]), guard,
                               out=work.magnitude[:n])
        rel = np.divide(diff, magnitude, out=work.rel[:n])
        # a non-finite element is the worst one; otherwise the largest relative error
        score = rel if finite is None else np.where(finite, rel, np.inf)
        k = int(score.argmax())
        if score[k] > sums.worst_score:
            sums.worst_score, sums.worst = float(score[k]), start + k
        sums.max_rel = max(sums.max_rel, float(rel.max()) if finite is not None
                           else float(rel[k]))
        sums.max_abs = max(sums.max_abs, float(diff.max()))
        if not calibrated:
            needed = np.divide(np.subtract(diff, tolerance.atol, out=work.needed[:n]),
                               magnitude, out=work.needed[:n])
            if finite is None and float(score[k]) <= tolerance.rtol:
                # each element's needed rtol is at most its relative error: all within
                sums.within += n
            else:
                ok = np.less_equal(needed, tolerance.rtol, out=work.ok[:n])
                if finite is not None:
                    ok &= finite
                    if tolerance.allow_nan:
                        ok |= ~finite & same
                    needed = np.where(finite, needed, np.inf)
                sums.within += int(np.count_nonzero(ok))
            sums.needed = max(sums.needed, float(needed.max()))
        sums.diff += float(diff.sum())
        sums.diff2 += float(np.dot(diff, diff))
        if not reuse_squares:
            sums.aa += float(np.dot(a, a))
            sums.bb += float(np.dot(b, b))
    return _finish(torch_value, ms_value, tolerance, noise, size, counts, ref_rms, sums)


def noise_statistics(rms_difference: float, noise: Float64Noise, tolerance: Tolerance,
                     allowance: float = 0.0) -> Tuple[float, float, float]:
    """(fp32_noise, ms_error, noise_ratio); see the module docstring. ``allowance`` is a
    relative error added to torch's own (ReLU units flipped by float32 noise: parity/kinks.py)."""
    ratio = rms_difference / (noise.fp32_noise_rms
                              + (tolerance.noise_floor + allowance) * noise.exact_rms
                              + tolerance.atol + TINY)
    scale = max(noise.exact_rms, TINY)
    return noise.fp32_noise_rms / scale, rms_difference / scale, float(ratio)


def _nonfinite_reason(nan_a: int, nan_b: int, inf_a: int, inf_b: int) -> str:
    return (f"non-finite values (NaN torch {nan_a} / MindSpore {nan_b}, "
            f"Inf torch {inf_a} / MindSpore {inf_b})")


def _noise_reason(noise_ratio: float, ms_error: float, fp32_noise: float,
                  tolerance: Tolerance) -> str:
    return (f"differs from torch by {noise_ratio:.3g}x torch's own float32 error "
            f"(allowed {tolerance.noise_factor:g}x): relative RMS difference "
            f"{ms_error:.2g} vs float32 error {fp32_noise:.2g}")


def with_allowance(stats: S, noise: Float64Noise, tolerance: Tolerance,
                   allowance: float, **fields: Any) -> S:
    """``stats`` judged again with ``allowance`` added to torch's relative float32 error, and
    ``fields`` set in the same copy."""
    _, ms_error, ratio = noise_statistics(stats.rms, noise.scaled_to(stats.ref_rms), tolerance,
                                          allowance)
    counts = (stats.nan_torch, stats.nan_mindspore, stats.inf_torch, stats.inf_mindspore)
    reasons = [_nonfinite_reason(*counts)] if any(counts) and not tolerance.allow_nan else []
    if ratio > tolerance.noise_factor:
        reasons.append(_noise_reason(ratio, ms_error, stats.fp32_noise, tolerance))
    return dataclasses.replace(stats, noise_ratio=ratio, passed=not reasons,
                               reason="; ".join(reasons), **fields)


def _finish(torch_value: np.ndarray, ms_value: np.ndarray, tolerance: Tolerance,
            noise: Optional[Float64Noise], size: int, counts: np.ndarray, ref_rms: float,
            sums: _Sums) -> TensorStats:
    calibrated = noise is not None
    nan_a, nan_b, inf_a, inf_b = (int(c) for c in counts)
    frac = float("nan") if calibrated else (sums.within / size if size else 1.0)
    cosine = _cosine_from_difference(sums.diff2, sums.aa, sums.bb)
    reasons = []
    if nan_a + nan_b + inf_a + inf_b and not tolerance.allow_nan:
        reasons.append(_nonfinite_reason(nan_a, nan_b, inf_a, inf_b))
    nan = float("nan")
    fp32_noise = ms_error = noise_ratio = nan
    rms = math.sqrt(sums.diff2 / size) if size else 0.0
    if noise is not None and size:
        fp32_noise, ms_error, noise_ratio = noise_statistics(rms, noise.scaled_to(ref_rms),
                                                             tolerance)
        if noise_ratio > tolerance.noise_factor:
            reasons.append(_noise_reason(noise_ratio, ms_error, fp32_noise, tolerance))
    else:
        if frac < 1.0:
            reasons.append(f"{size - sums.within} / {size} elements "
                           f"({100 * (1 - frac):.3g}%) beyond tolerance")
        if cosine < tolerance.min_cosine:
            reasons.append(f"cosine {cosine:.6f} < {tolerance.min_cosine}")
    worst = np.unravel_index(sums.worst, torch_value.shape) if size else ()
    return TensorStats(
        passed=not reasons, max_abs=sums.max_abs, max_rel=sums.max_rel,
        mean_abs=sums.diff / size if size else 0.0,
        rms=rms,
        ref_rms=ref_rms, cosine=cosine, frac_within=frac,
        worst_index=tuple(int(i) for i in worst),
        worst_torch=float(torch_value[worst]) if size else 0.0,
        worst_mindspore=float(ms_value[worst]) if size else 0.0,
        nan_torch=nan_a, nan_mindspore=nan_b, inf_torch=inf_a, inf_mindspore=inf_b,
        needed_rtol=float("nan") if calibrated else max(sums.needed, 0.0),
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
