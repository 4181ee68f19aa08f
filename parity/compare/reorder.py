"""Values that are torch's in another order: two parts concatenated the other way round
(``torch.cat([a, b])`` ported as ``ops.cat((b, a))``), a channel shuffle over another group
count, a reshape or transpose over other axes. Every value is right and the next weights meet
the wrong ones: an O(1) error that says nothing of its cause until the order is seen.

A module's input is known only by its sketch (parity/sketch.py): no reordering changes its
norm or its sum of magnitudes, while its ±1 projections change by about its norm. Its output
is stored whole: its slices along an axis can be matched one to one, and its rows among more
rows (a mixture-of-experts layer running an expert on every token where torch runs it on the
tokens routed to it).
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
# The reason a pair compared on the rows both sides hold gives (compare/engine.py)
ROWS_TAKEN = "rows in another order than torch's, or among more rows: compared on the rows " \
    "both hold"


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
    for axis in range(1, a.ndim):
        taken = rows_taken(np.moveaxis(a, axis, 0), np.moveaxis(b, axis, 0))
        if taken is not None:
            return axis, np.argsort(taken)
    return None


def rows_taken(a: np.ndarray, b: np.ndarray) -> Optional[np.ndarray]:
    """The rows of ``b`` (along its first axis) that hold ``a``'s, in ``a``'s order: ``b[taken]``
    is ``a`` to SAME_VALUES of its largest value, each row of ``b`` taken once; None where there
    are none such, or where ``b`` is ``a`` as it stands. The tokens a mixture-of-experts layer
    gathers for one expert: torch's ``torch.where`` lists them by (slot, token), a port may
    list them by (token, slot), or run the expert on every token (static shapes)."""
    taken = _rows_matched(a, b) if len(a) <= len(b) else None
    if taken is None or (taken < 0).any() or np.array_equal(taken, np.arange(len(b))):
        return None
    return taken


def rows_shared(a: np.ndarray, b: np.ndarray) -> Tuple[int, int]:
    """How many of ``a``'s rows ``b`` holds, each matched to one of its own (as rows_taken),
    and how many of those at the same index."""
    taken = _rows_matched(a, b)
    if taken is None:
        return 0, 0
    return int((taken >= 0).sum()), int((taken == np.arange(len(a))).sum())


def _rows_matched(a: np.ndarray, b: np.ndarray) -> Optional[np.ndarray]:
    """For each row of ``a``, the row of ``b`` holding it (to SAME_VALUES of ``a``'s largest
    value), each taken once, or -1; None where the two have no rows to match."""
    if a.ndim < 2 or a.shape[1:] != b.shape[1:] or min(len(a), len(b)) < 2 or \
            a.dtype.kind != "f" or b.dtype.kind != "f" or not a.size:
        return None
    scale = float(np.abs(a).max())
    if not np.isfinite(scale) or scale == 0 or not np.isfinite(b).all():
        return None
    rows = [x.reshape(len(x), -1) for x in (a, b)]
    # a row's key: equal rows share it
    projection = np.random.default_rng(0).standard_normal(rows[0].shape[1])
    keys = [r @ projection for r in rows]
    # rows SAME_VALUES · scale apart in each value are at most this far apart in their keys
    near = SAME_VALUES * scale * float(np.abs(projection).sum())
    by_key = np.argsort(keys[1], kind="stable")
    sorted_keys = keys[1][by_key]
    taken, used = np.full(len(a), -1, np.int64), np.zeros(len(b), bool)
    for i, key in enumerate(keys[0]):
        low = np.searchsorted(sorted_keys, key - near, side="left")
        high = np.searchsorted(sorted_keys, key + near, side="right")
        candidates = [j for j in by_key[low:high] if not used[j]]
        if not candidates:
            continue
        apart = np.abs(rows[1][candidates] - rows[0][i]).max(axis=1)
        best = int(np.argmin(apart))
        if apart[best] <= SAME_VALUES * scale:
            taken[i] = candidates[best]
            used[taken[i]] = True
    return taken


def shuffled(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``b`` holds ``a``'s values in another order though along no one axis (a reshape
    where the other side transposes: ViT's patches ``flatten(2).transpose(1, 2)`` ported as
    ``reshape(n, -1, d)``): the same sorted values, to SAME_VALUES of the largest, and not in
    place. Sorted only where the sums of magnitudes agree."""
    scale = _scale_of_the_same_values(a, b) if a.size >= 2 else None
    if scale is None:
        return False
    return alike(np.sort(a, axis=None), np.sort(b, axis=None), scale) and \
        not alike(np.asarray(a), np.asarray(b), scale)


def shift(a: np.ndarray, b: np.ndarray, most: int = 3) -> Optional[Tuple[int, int]]:
    """(axis, k), k ≠ 0, where ``b``'s position i along ``axis`` is ``a``'s i + k wherever
    both hold one (to SAME_VALUES of ``a``'s largest value), at most ``most`` positions off,
    the positions both hold at least half of the axis; None where there is none. The batch
    axis is left out. RWKV's token shift pads one position before the tokens and drops the
    last (torch's ``ZeroPad2d((0, 0, 1, -1))``); a port taking the token after each, or none,
    holds torch's positions 2 or 1 further on."""
    if a.shape != b.shape or a.ndim < 2 or a.dtype.kind != "f" or b.dtype.kind != "f" or \
            not np.isfinite(a).all() or not np.isfinite(b).all():
        return None
    scale = float(np.abs(a).max()) if a.size else 0.0
    if scale == 0 or alike(a, b, scale):
        return None
    for axis in range(1, a.ndim):
        length = a.shape[axis]
        for k in sorted(range(-most, most + 1), key=abs):
            if k == 0 or 2 * (length - abs(k)) < length:
                continue
            held = np.take(a, range(max(k, 0), length + min(k, 0)), axis=axis)
            moved = np.take(b, range(max(-k, 0), length + min(-k, 0)), axis=axis)
            if alike(held, moved, scale):
                return axis, k
    return None


def alike(a: np.ndarray, b: np.ndarray, scale: float) -> bool:
    """Whether ``a`` and ``b`` are the same values, to SAME_VALUES of ``scale`` (the largest
    value): one computation's float32 rounding against another's."""
    return float(np.abs(a - b).max()) <= SAME_VALUES * scale


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
