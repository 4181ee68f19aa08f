"""What MindSpore's own CPU kernels compute differently from torch's, measured on MindSpore
2.8.0 against float64: differences a correct port cannot avoid except by writing the operation
from others, so the diagnosis names the kernel instead of the port."""

from __future__ import annotations

from typing import Optional

import numpy as np

from parity.records import Diagnosis

# MindSpore 2.8.0's CPU tanh (nn.Tanh and ops.tanh), against float64 on 240,001 points in
# [-12, 12]: within 3 ulps where |x| < 2, up to 1.0e-4 (1,688 ulps) near |x| = 5, 2.3e-7
# beyond 8; torch's is within 0.51 ulp everywhere
TANH_SATURATING = float(np.tanh(2.0))     # |tanh(x)| above this: |x| > 2
TANH_WORST = 2e-4                          # the most that kernel is off (with some margin)
TANH_CONCENTRATION = 10                    # outside |x| < 2 the difference is this much larger


def tanh_cause(name: str, torch_out: np.ndarray, ms_out: np.ndarray) -> Optional[Diagnosis]:
    """A tanh whose outputs differ where |x| > 2 far more than elsewhere, and by no more than
    MindSpore's CPU kernel is off: that kernel's error, not the port's."""
    off = np.abs(np.asarray(torch_out, np.float64) - ms_out)
    saturating = np.abs(torch_out) > TANH_SATURATING
    if not saturating.any():
        return None
    outer = float(off[saturating].max())
    inner = float(off[~saturating].max()) if (~saturating).any() else 0.0
    if outer > TANH_WORST or outer < TANH_CONCENTRATION * inner:
        return None
    return Diagnosis(cause="MindSpore's CPU tanh is inaccurate",
                     detail=f"{name} differs by up to {outer:.2g} where |x| > 2 and {inner:.2g} "
                            "elsewhere: MindSpore 2.8.0's CPU tanh is off by up to 1.0e-4 for "
                            "2 < |x| < 8 (1,688 ulps near |x| = 5, measured; torch's within "
                            "0.51 ulp). Not the port's error: check again on the device you "
                            "train on, or write tanh as e / (e + 2), e = "
                            "ops.expm1(2 * ops.clamp(x, -9, 9)) (within 2.5 ulps for |x| ≥ 1).",
                     confidence="likely")


# Measured on MindSpore 2.8.0 (CPU), 240,001 points in [-12, 12] against float64: nn.Mish's
# forward is within 1e-6, its gradient off by up to 9.0e-4 near x = 5 (3.4e-6 outside 2 < x < 8;
# torch's float32 gradient within 9.7e-7); the form below within 3.1e-6 everywhere
MISH_GRADIENT = ("MindSpore's CPU Mish passes back a gradient off by up to 9.0e-4 for "
                 "2 < x < 8 (MindSpore 2.8.0, measured; its forward is within 1e-6). Not the "
                 "port's error: check again on the device you train on, or write Mish as x * e / "
                 "(e + 2), e = ops.expm1(2 * ops.clamp(sp, -9, 9)), sp = ops.log1p(ops.exp(x)) "
                 "(x above 20 taken as is), whose gradient is within 3.1e-6.")

# Measured on MindSpore 2.8.0 (CPU): nn.SeLU's and ops.selu's forward equal torch's, their
# gradient below zero is scale·(y + 1) where the derivative is y + scale·alpha
SELU_GRADIENT = ("MindSpore's SeLU passes back scale·(y + 1) below zero where the derivative "
                 "is y + scale·alpha (MindSpore 2.8.0, measured; its forward is right). Write "
                 "SELU as scale * (ops.relu(x) + alpha * ops.expm1(ops.minimum(x, 0))), whose "
                 "gradient is right (nn.ELU takes only alpha=1 on CPU).")
