"""What a sequential float32 sum rounds: MindSpore's CPU kernels sum more nearly one value after
another than torch's do (capture/sequential_sums.py measures its BatchNorm, LayerNorm and
GroupNorm backwards, compare/sums.py its GroupNorm's bias gradient), so both torch's rerounded
steps and the sums' own-rounding check allow for a kernel that adds up so."""

from __future__ import annotations

import numpy as np


def sequential_sum_error(rows: np.ndarray) -> np.ndarray:
    """Per column of ``rows`` (one row per term), a float32 sum taken one row after another
    less the float64 sum of the rows as given. numpy adds the rows of a sum along axis 0 one
    after another (pairwise only along a row): the same bits as np.add.accumulate's last, in
    60 % of its time; only if the rows lie one after another in memory, so they are made to."""
    sequential = np.ascontiguousarray(rows, np.float32).sum(axis=0, dtype=np.float32)
    return sequential.astype(np.float64) - rows.sum(axis=0, dtype=np.float64)
