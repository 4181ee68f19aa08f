"""Values that are torch's in another order: two parts concatenated the other way round
(``torch.cat([a, b])`` ported as ``ops.cat((b, a))``), a channel shuffle over another group
count, a reshape or transpose over other axes. Every value is right and the next weights meet
the wrong ones: an O(1) error that says nothing of its cause until the order is seen.

A module's input is known only by its sketch (parity/sketch.py): no reordering changes its
norm or its sum of magnitudes, while its ±1 projections change by about its norm. Its output
is stored whole: its slices along an axis can be matched one to one.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from parity.records import RecordInfo
from parity.sketch import magnitude

# The norm and the sum of magnitudes of the same values agree this closely on the two sides:
# the norm's float32 sum depends on the order (3.6e-5 of it over 6.4 million values, see
# compare/functional.py), the magnitude's to 5e-9 (parity/sketch.py). Values normalised over
# other axes keep their norm and not their magnitude: standard normal maps of (8, 256, 56, 56)
# normalised over the channels against over each map, 1.9e-7 and 9.4e-4 apart; of (2, 10, 16,
# 16), 2.2e-6 and 2.9e-2 (numpy, seed 0). Rolled along the channels: 0 and 2.4e-9.
SAME_SUMS = 1e-4
# Values this far apart (relative to the largest) are the same values: float32 rounding of
# one computation against another, not an O(1) error.
SAME_VALUES = 1e-4


def sums_difference(t: RecordInfo, m: RecordInfo) -> Optional[float]:
    """How far apart the norms and the sums of magnitudes of the module's first input are on
    the two sides, relative to torch's; None without both (a capture from before the sums)."""
    sketches = t.attrs.get("input_sketch"), m.attrs.get("input_sketch")
    sums = t.attrs.get("input_magnitude"), m.attrs.get("input_magnitude")
    if not all(sketches) or None in sums or not sketches[0][0] or not sums[0]:
        return None
    return max(abs(sketches[0][0] - sketches[1][0]) / sketches[0][0],
               abs(sums[0] - sums[1]) / sums[0])


def reordered_input(t: RecordInfo, m: RecordInfo, differs_by: float,
                    passed_on: float) -> Optional[float]:
    """How far apart the sums of the module's first input are when it holds torch's values in
    another order: they agree to rounding, or to the difference ``passed_on`` from earlier
    records, while its values differ (``differs_by`` of its norm) a hundred times more; else
    None.

    A difference δ spread over the values, not a reordering, moves the sum of magnitudes by
    Σ sign(x)·δ, about ‖δ‖ = differs_by·‖x‖ times a standard normal draw: on a few values
    that is small. GPT-NeoX's rotary ported onto every dimension of a head, not its first
    quarter, changed the attention's output by 0.012 of its norm and its sum of magnitudes by
    4.9e-5 (1,024 values; a tenth of what δ moves it by on average), and was told "input in
    another order". A reordering must keep that sum a hundred times closer than δ moves it."""
    same = max(SAME_SUMS, passed_on)
    sums = sums_difference(t, m)
    if sums is None or sums > same or differs_by < 100 * same:
        return None
    norm, total = t.attrs["input_sketch"][0], t.attrs["input_magnitude"]
    moved = abs(m.attrs["input_magnitude"] - total) / total
    return sums if moved <= differs_by * norm / total / 100 else None


def permutation(a: np.ndarray, b: np.ndarray) -> Optional[Tuple[int, np.ndarray]]:
    """The axis along which ``b``'s slices are ``a``'s in another order, with the order:
    ``b``'s slice j is ``a``'s ``order[j]``; None when there is none. The batch axis is left
    out (the inputs it came from matched)."""
    scale = _scale_of_the_same_values(a, b) if a.ndim >= 2 else None
    if scale is None:
        return None
    random_weights = np.random.default_rng(0).standard_normal
    for axis in range(1, a.ndim):
        count = a.shape[axis]
        if count < 2:
            continue
        rows = [np.moveaxis(x, axis, 0).reshape(count, -1) for x in (a, b)]
        projection = random_weights(rows[0].shape[1])   # a slice's key: equal slices share it
        orders = [np.argsort(r @ projection, kind="stable") for r in rows]
        if not np.abs(rows[0][orders[0]] - rows[1][orders[1]]).max() <= SAME_VALUES * scale:
            continue
        order = np.empty(count, np.int64)
        order[orders[1]] = orders[0]
        if not np.array_equal(order, np.arange(count)):
            return axis, order
    return None


def shuffled(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``b`` holds ``a``'s values in another order though along no one axis (a reshape
    where the other side transposes: ViT's patches ``flatten(2).transpose(1, 2)`` ported as
    ``reshape(n, -1, d)``): the same sorted values, to SAME_VALUES of the largest, and not in
    place. Sorted only where the sums of magnitudes agree."""
    scale = _scale_of_the_same_values(a, b) if a.size >= 2 else None
    if scale is None:
        return False
    apart = float(np.abs(np.sort(a, axis=None) - np.sort(b, axis=None)).max())
    return apart <= SAME_VALUES * scale and \
        float(np.abs(np.asarray(a) - np.asarray(b)).max()) > SAME_VALUES * scale


def _scale_of_the_same_values(a: np.ndarray, b: np.ndarray) -> Optional[float]:
    """The largest magnitude of ``a`` where ``b`` may hold its values in another order (the
    same shape, float, finite, their sums of magnitudes agreeing); None where it cannot (and no
    NaN to miss)."""
    if a.shape != b.shape or a.dtype.kind != "f":
        return None
    scale, magnitudes = float(np.abs(a).max()), (magnitude(a), magnitude(b))
    if not np.isfinite(scale) or scale == 0 or \
            not abs(magnitudes[0] - magnitudes[1]) <= SAME_SUMS * magnitudes[0]:
        return None
    return scale


def describe(axis: int, ndim: int, order: np.ndarray) -> str:
    """The reordering in words: a rotation is two parts concatenated in the other order."""
    count = len(order)
    what, whats = ("channel", "channels") if (axis, ndim) == (1, 4) else \
        ("index", f"indices along axis {axis}")
    shift = int(order[0])
    if np.array_equal(order, (np.arange(count) + shift) % count):
        return (f"MindSpore's {whats} start at torch's {what} {shift} of {count}: two parts "
                f"concatenated in the other order (torch's first {shift} come last), as "
                "torch.cat([a, b]) ported as ops.cat((b, a)) makes")
    pairs = ", ".join(f"{j}→{int(i)}" for j, i in list(enumerate(order))[:6])
    more = ", …" if count > 6 else ""
    return (f"MindSpore's {whats} hold torch's in another order (MindSpore's→torch's: "
            f"{pairs}{more}): a shuffle, reshape or transpose over another grouping")
