"""Outputs one side computes at more positions than it keeps. Hugging Face's Mamba writes its
causal convolution as ``conv1d(x)[..., :L]``, the conv padded k − 1 on both sides (L + k − 1
outputs, the last k − 1 thrown away); a port padding the input on the left alone, ``conv1d(
ops.pad(x, (k − 1, 0)))`` with no padding of its own, computes those L outputs and no others.
Every value after the conv agrees; its output and gradient differ in shape.

The positions one side throws away are known from its gradient: nothing after the module reads
them, so their gradient is zero, exactly. A port whose conv pads 'same', where torch's output
keeps its first L, holds torch's positions 2 to L + 1 (k = 4): a window too, but torch's loss
reads its positions 0 and 1, and the port fails as it should.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from parity.compare.reorder import alike

# The reason a pair compared on the positions both sides keep gives (compare/engine.py)
WINDOW_KEPT = "one side computes more positions than it keeps: compared on the positions " \
    "both keep"


def differing_axis(longer: Tuple[int, ...], shorter: Tuple[int, ...]) -> Optional[int]:
    """The one axis, past the batch axis, along which ``longer`` is longer than ``shorter``,
    their other dimensions equal; None where there is no such axis."""
    if len(longer) != len(shorter) or len(longer) < 2 or longer[0] != shorter[0]:
        return None
    apart = [axis for axis in range(1, len(longer)) if longer[axis] != shorter[axis]]
    return apart[0] if len(apart) == 1 and longer[apart[0]] > shorter[apart[0]] else None


def window(longer: np.ndarray, shorter: np.ndarray) -> Optional[Tuple[int, int]]:
    """(axis, start) where ``shorter`` is ``longer``'s positions ``start:start + n`` along
    ``axis``, alike to ``longer``'s largest value (reorder.alike; the first such start); else
    None."""
    axis = differing_axis(longer.shape, shorter.shape)
    if axis is None or longer.dtype.kind != "f" or shorter.dtype.kind != "f" or \
            not shorter.size or not np.isfinite(longer).all() or not np.isfinite(shorter).all():
        return None
    scale = float(np.abs(longer).max())
    if scale == 0:
        return None
    kept = shorter.shape[axis]
    for start in range(longer.shape[axis] - kept + 1):
        if alike(np.take(longer, range(start, start + kept), axis=axis), shorter, scale):
            return axis, start
    return None


def thrown_away(gradient: np.ndarray, axis: int, start: int, kept: int) -> bool:
    """Whether every position of ``gradient`` along ``axis`` outside ``start:start + kept`` is
    exactly zero: nothing after the module reads those outputs."""
    outside = [i for i in range(gradient.shape[axis]) if not start <= i < start + kept]
    return not np.take(gradient, outside, axis=axis).any()
