"""Sketches of a module's inputs: a few numbers per call, taken by the captures' hooks
(capture/hooks.py) as each input enters, that let the diagnosis tell whether two inputs were
the same without storing them (compare/forward_cause.py, compare/functional.py, compare/inputs.py).

When a module's output is the first to diverge, the sketches tell whether its input already
differed (the code between modules: a parent's forward, attention's matmul and softmax), or
another input (an attention or padding mask), or the module itself.
"""

from __future__ import annotations

import zlib
from typing import Any, Dict, List, Optional

import numpy as np

SKETCH_PERIOD = 4096
# Six ±1 projections: with two, unrelated inputs (one conv's outputs under other weights) came
# within a tenth of the norm in the norm and both projections for 220 of 79,800 pairs
# (tests/test_compare_units.py), and a port's BatchNorm fed by a conv of its own, run unseen,
# had its input taken as torch's in 1 of 300 seeded draws of that conv's weights. The first two
# columns are those of the run directories made before the 61st round, which held two:
# sketches of different lengths are compared by the numbers they share (sketch_distance).
PROJECTIONS = 6
_SIGNS = np.hstack([
    np.random.default_rng(0).choice(np.array([-1, 1], np.float32), size=(SKETCH_PERIOD, 2)),
    np.random.default_rng(1).choice(np.array([-1, 1], np.float32),
                                    size=(SKETCH_PERIOD, PROJECTIONS - 2))])

# A float input at or below this is taken as masking out its position: additive masks write
# -inf (torch's TransformerEncoderLayer turns a boolean padding mask into one before its
# attention sees it), -1e9, or -10000 (BERT's).
MASKED_AT_OR_BELOW = -1e4
MAGNITUDE_BLOCK = 1 << 16


def input_sketch(array: Optional[np.ndarray]) -> Optional[List[float]]:
    """[‖x‖, Σ x·s₁, …, Σ x·s₆] of a float32 array (s: ±1 signs repeating every SKETCH_PERIOD
    elements): a difference between two inputs shows in the projections at about its RMS
    relative to ‖x‖, whatever its pattern."""
    if array is None or array.dtype != np.float32 or array.size == 0:
        return None
    flat = array.reshape(-1)
    whole = flat.size - flat.size % SKETCH_PERIOD
    projections = (flat[:whole].reshape(-1, SKETCH_PERIOD) @ _SIGNS).sum(axis=0, dtype=np.float64)
    projections += flat[whole:] @ _SIGNS[:flat.size - whole]
    return [float(np.sqrt(np.dot(flat, flat))), *(float(v) for v in projections)]


def sketch_distance(torch_sketch: Optional[List[float]],
                    ms_sketch: Optional[List[float]]) -> Optional[float]:
    """How far one input's sketch is from torch's, relative to the norm of torch's: 5e-7 for
    the same values rounded otherwise, 2.9 for them channels last (tests/tiny.py's
    torch_patchified). None when either is missing (an integer input) or torch's is all zeros.
    A sketch recorded with fewer projections (PROJECTIONS) is compared in those it holds."""
    if not torch_sketch or not ms_sketch or not torch_sketch[0]:
        return None
    return max(abs(x - y) for x, y in zip(torch_sketch, ms_sketch)) / torch_sketch[0]


def magnitude(array: np.ndarray) -> float:
    """Σ|x| of a float32 array, a block at a time (a block's copy, not the array's): with the
    sketch's norm, what no reordering of the values changes, while their projections change
    at once (parity/compare/reorder.py). Float32 sums, pairwise per block: 5e-9 of it off the
    float64 sum over 6.4 million normal values, 3.7 ms against 8.4 ms widened."""
    flat = array.reshape(-1)
    block = np.empty(min(flat.size, MAGNITUDE_BLOCK), np.float32)
    total = 0.0
    for start in range(0, flat.size, MAGNITUDE_BLOCK):
        values = flat[start:start + MAGNITUDE_BLOCK]
        total += float(np.abs(values, out=block[:values.size]).sum())
    return total


def integer_input_checksum(array: Optional[np.ndarray]) -> Optional[int]:
    """The CRC-32 of an integer array's values as int64 (token or position ids, int32 on one
    side and int64 on the other): an index input is the same only when it is equal, and its
    ids may all be 0 (a token type), which no relative distance measures."""
    if array is None or array.size == 0 or array.dtype.kind not in "iu":
        return None
    return zlib.crc32(np.ascontiguousarray(array, dtype=np.int64))


def other_input_sketch(array: Optional[np.ndarray]) -> Optional[Dict[str, Any]]:
    """The sketch of a module's second or later input (an attention or padding mask, a skip
    connection, a decoder's memory): its dtype and shape, the sketch of its values (those a float
    mask masks out, and any not finite, as 0), and, for a boolean or float input, that of the
    positions it masks out (True, or at or below MASKED_AT_OR_BELOW)."""
    if array is None or array.size == 0 or array.dtype.kind not in "biuf":
        return None
    masked: Optional[np.ndarray] = None
    if array.dtype == np.bool_:
        masked, values = array, array.astype(np.float32)
    else:
        values = array.astype(np.float32, copy=False)
        if array.dtype.kind == "f":
            masked = values <= MASKED_AT_OR_BELOW
            left_out = masked | ~np.isfinite(values)
            if left_out.any():        # -inf and -1e9 mask alike: the values' sketch skips both
                values = np.where(left_out, np.float32(0), values)
    return {"dtype": str(array.dtype), "shape": list(array.shape),
            "values": input_sketch(values),
            "masked": None if masked is None else _positions_sketch(masked)}


def _positions_sketch(masked: np.ndarray) -> List[float]:
    """[count, Σ m·s₁, …, Σ m·s₆] of a boolean array m: whole numbers, exact in float64 (the
    projections are sums of ±1, block by block in float32, each under SKETCH_PERIOD)."""
    count = int(np.count_nonzero(masked))
    if not count:
        return [0.0] * (1 + PROJECTIONS)
    return [float(count), *input_sketch(masked.astype(np.float32))[1:]]
