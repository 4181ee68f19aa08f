"""What a sequential float32 sum rounds: MindSpore's CPU kernels sum more nearly one value after
another than torch's do (capture/sequential_sums.py measures its BatchNorm, LayerNorm, GroupNorm
and PReLU backwards, compare/sums.py its GroupNorm's bias gradient), so both torch's rerounded
steps and the sums' own-rounding check allow for a kernel that adds up so."""

from __future__ import annotations

import numpy as np


def sequential_sum_error(rows: np.ndarray) -> np.ndarray:
    """Per column of ``rows`` (one row per term), a float32 sum taken one row after another
    less the float64 sum of the rows as given. numpy adds the rows of a sum along axis 0 one
    after another (pairwise only along a row): the same bits as np.add.accumulate's last, in
    60 % of its time; only if the rows lie one after another in memory, so they are made to.
    A single column is one run of memory that numpy would sum pairwise: it is accumulated."""
    float32_rows = np.ascontiguousarray(rows, np.float32)
    if float32_rows.ndim == 2 and float32_rows.shape[1] == 1:
        sequential = np.add.accumulate(float32_rows, axis=0, dtype=np.float32)[-1]
    else:
        sequential = float32_rows.sum(axis=0, dtype=np.float32)
    return sequential.astype(np.float64) - rows.sum(axis=0, dtype=np.float64)
