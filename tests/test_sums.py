"""A normalisation's weight gradient whose sum cancels: judged by what float32 can say, and no
more.

Which float32 kernels a CPU runs decides whether a real model shows this (MobileNetV2's
features.2.conv.0.1 did on one machine, not on another), so these runs are built by hand: the
sum is the same on every CPU.
"""

from __future__ import annotations

from typing import Tuple

import numpy as np
import pytest

from parity.compare.engine import compare_runs
from parity.rundir import INITIAL_WEIGHTS, RunWriter
from parity.weights import save_state_dict_bytes

# op: (output shape, the axis its weight and bias lie along)
NORMS = {"batchnorm2d": ((8, 4, 8, 8), 1), "groupnorm": ((8, 4, 8, 8), 1),
         "layernorm": ((8, 16, 6), -1)}          # batch, tokens, features
# the output gradient's float32 error relative to its size, accumulated over the layers after
# the normalisation: torch's own, and MindSpore's distance from torch's (MobileNetV2's was 0.6
# and 0.9 %)
G_ERROR = 1e-3


def _rms(value: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(value, dtype=np.float64))))


def _capture(path, framework, op, output, g, weight_grad, annotate=None, initial=None):
    with RunWriter(path, framework) as writer:
        if initial is not None:
            writer.write_file(INITIAL_WEIGHTS, save_state_dict_bytes(initial))
        records = [writer.add("norm", "forward", output, op=op),
                   writer.add("norm", "grad", g, attrs={"activation": True}),
                   writer.add("norm.weight", "grad", weight_grad)]
        for record, (noise, exact) in zip(records, annotate or ()):
            writer.annotate(record, fp32_noise_rms=noise, exact_rms=exact)
        writer.finish({} if framework == "torch" else
                      {"param_map": {"norm.weight": "norm.weight", "norm.bias": "norm.bias"}})


def _runs(tmp_path, op: str, ms_weight_grad_scale: float = 1.0):
    """A normalisation whose output gradient is orthogonal to x̂ along every index of its
    weight's axis: its weight gradient Σ g·x̂ is zero but for rounding. MindSpore's g is torch's
    with a G_ERROR relative error per element; its weight gradient is the float32 sum of its own
    terms, times ``ms_weight_grad_scale``."""
    shape, axis = NORMS[op]
    summed: Tuple[int, ...] = tuple(a for a in range(len(shape)) if a != axis % len(shape))
    along = [1] * len(shape)
    along[axis] = -1
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape)
    over = (len(shape) - 1,) if op == "layernorm" else summed     # what the op normalises over
    normalised = ((x - x.mean(axis=over, keepdims=True))
                  / x.std(axis=over, keepdims=True)).astype(np.float32)
    gamma = rng.uniform(0.5, 2.0, shape[axis]).astype(np.float32)
    beta = rng.uniform(-1.0, 1.0, shape[axis]).astype(np.float32)
    output = normalised * gamma.reshape(along) + beta.reshape(along)
    g = rng.standard_normal(shape)
    n64 = normalised.astype(np.float64)
    g -= n64 * (np.sum(g * n64, axis=summed, keepdims=True)
                / np.sum(n64 * n64, axis=summed, keepdims=True))
    g = g.astype(np.float32)
    ms_g = (g * (1 + G_ERROR * rng.standard_normal(shape))).astype(np.float32)

    # x̂ as the compare recovers it from the output and the initial γ, β: the terms it sums
    recovered = (output.astype(np.float64) - beta.reshape(along)) / gamma.reshape(along)
    exact = np.sum(g * recovered, axis=summed)
    torch_grad = np.sum(g * normalised, axis=summed, dtype=np.float32)
    ms_grad = np.sum(ms_g * recovered.astype(np.float32), axis=summed, dtype=np.float32) * \
        np.float32(ms_weight_grad_scale)
    noises = [(0.0, _rms(output)), (G_ERROR * _rms(g), _rms(g)),
              (_rms(torch_grad - exact), _rms(exact))]
    _capture(tmp_path / "torch", "torch", op, output, g, torch_grad, noises,
             {"norm.weight": gamma, "norm.bias": beta})
    _capture(tmp_path / "mindspore", "mindspore", op, output, ms_g, ms_grad)
    result = compare_runs(tmp_path / "torch", tmp_path / "mindspore")
    return {(c.kind, c.name): c for c in result.comparisons}


@pytest.mark.parametrize("op", NORMS)
def test_a_cancelling_weight_gradient_passes_within_its_terms_float32_error(tmp_path, op):
    records = _runs(tmp_path, op)
    assert records[("grad", "norm")].passed              # g is within its float32 error
    weight = records[("grad", "norm.weight")]
    # torch's own sum rounds to ~1e-6; g's 0.1 % error moves MindSpore's by ~1e-2
    assert weight.ms_error > 100 * weight.fp32_noise
    assert weight.sum_allowance > 0 and weight.passed, weight.reason
    assert weight.noise_ratio <= weight.noise_factor


@pytest.mark.parametrize("op", NORMS)
def test_a_weight_gradient_that_is_not_the_sum_of_its_terms_still_fails(tmp_path, op):
    """Half the sum of its own terms: within the allowance torch's terms give (the error it
    allows is as large as the gradient), but not MindSpore's own sum."""
    weight = _runs(tmp_path, op, ms_weight_grad_scale=0.5)[("grad", "norm.weight")]
    assert weight.sum_allowance > 0 and weight.noise_ratio <= weight.noise_factor
    assert not weight.passed
    assert "MindSpore's gradient is not the sum of its own terms" in weight.reason


def test_a_layernorm_over_several_axes_is_judged_without_the_allowance(tmp_path):
    """LayerNorm((16, 6)): its weight keeps two axes, so its gradient is no sum along one."""
    rng = np.random.default_rng(0)
    output, g = (rng.standard_normal((8, 16, 6)).astype(np.float32) for _ in range(2))
    gamma, beta = np.ones((16, 6), np.float32), np.zeros((16, 6), np.float32)
    torch_grad = np.sum(g * output, axis=0, dtype=np.float32)
    noises = [(0.0, _rms(output)), (G_ERROR * _rms(g), _rms(g)),
              (1e-7 * _rms(torch_grad), _rms(torch_grad))]
    _capture(tmp_path / "torch", "torch", "layernorm", output, g, torch_grad, noises,
             {"norm.weight": gamma, "norm.bias": beta})
    _capture(tmp_path / "mindspore", "mindspore", "layernorm", output, g, torch_grad * 0.5)
    result = compare_runs(tmp_path / "torch", tmp_path / "mindspore")
    weight = next(c for c in result.comparisons if (c.kind, c.name) == ("grad", "norm.weight"))
    assert not weight.passed and weight.sum_allowance == 0


@pytest.mark.parametrize("signs", ["one", "mixed"])
def test_a_sum_taken_one_term_after_another_is_its_terms_sum_and_a_wrong_one_is_not(signs):
    """MindSpore's CPU kernels sum more nearly one value after another than pairwise: its
    GroupNorm's beta gradient, 8,192 terms of one sign a channel, was 21.8 times a pairwise
    sum's worst rounding off its own terms, and the correct port failed as "not the sum of its
    own terms". A sequential float32 sum of the same terms passes now; one off by ten times
    a pairwise sum's rounding still fails where the terms' signs are mixed, since a sequential
    sum then rounds about as a pairwise one does."""
    from parity.compare.optimizer import EPS32
    from parity.compare.sums import off_own_sum
    rng = np.random.default_rng(0)
    # one value per sample and channel where a ReLU passed it, as a mean over space hands back
    terms = rng.uniform(0.5, 2, (2, 4, 1, 1)) / 4096 * (rng.random((2, 4, 64, 64)) < 0.6)
    if signs == "mixed":
        terms *= rng.choice([-1.0, 1.0], terms.shape)
    rows = np.moveaxis(terms, 1, -1).reshape(-1, 4).astype(np.float32)
    sequential = np.add.accumulate(rows, axis=0, dtype=np.float32)[-1]
    exact = terms.sum(axis=(0, 2, 3))
    pairwise = np.log2(rows.shape[0]) * EPS32 * np.abs(terms).sum(axis=(0, 2, 3))
    assert off_own_sum(sequential, terms) <= 1
    if signs == "one":
        assert np.max(np.abs(sequential - exact) / pairwise) > 2      # past the pairwise bound
        assert off_own_sum(0.5 * exact, terms) > 1
    else:
        assert off_own_sum(exact + 10 * pairwise * np.sign(exact), terms) > 1


@pytest.mark.parametrize("columns", [1, 3])
def test_a_sequential_sum_is_taken_one_term_after_another_in_each_column(columns):
    """numpy sums a single column pairwise (it is one run of memory); a sequential float32 sum
    of 2,000,000 terms of one sign is another sum: MindSpore's PReLU takes its one weight's
    gradient so (capture/sequential_sums.py)."""
    from parity.rounding import sequential_sum_error
    rows = np.random.default_rng(0).uniform(0, 2e-3, (2_000_000, columns)).astype(np.float32)
    sequential = np.add.accumulate(rows, axis=0, dtype=np.float32)[-1].astype(np.float64)
    off = sequential_sum_error(rows)
    np.testing.assert_array_equal(off, sequential - rows.sum(axis=0, dtype=np.float64))
    assert np.all(np.abs(off) > 1e-6 * rows.sum(axis=0, dtype=np.float64))   # not pairwise's
