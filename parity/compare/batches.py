"""What maps torch's input batch onto MindSpore's: the preprocessing a port got wrong.

An image batch is tried against the classic differences (a crop offset, reversed channels, a
per-channel affine map); token ids are compared id by id. Used by the diagnosis when the first
divergence is the input itself.
"""

from __future__ import annotations

import numpy as np

# How close (relative to the batch's RMS) a transformed torch batch must come to MindSpore's to
# name the transformation: a float32 rounding of each value or two.
SAME_BATCH = 1e-6


def batch_difference(a: np.ndarray, b: np.ndarray) -> str:
    """Which classic preprocessing difference turns torch's batch ``a`` (N×C×H×W) into
    MindSpore's ``b``: a crop offset, reversed channels, or a per-channel affine map (mean/std
    normalisation, a 0–255 range); for token ids, where and how they differ. Otherwise the
    remaining suspects are named."""
    suspects = "resize rounding, crop offset, antialias or normalisation."
    if np.issubdtype(a.dtype, np.integer) and np.issubdtype(b.dtype, np.integer):
        return _token_ids(a, b)
    if a.shape != b.shape or a.ndim != 4:
        return suspects
    a, b = a.astype(np.float64), b.astype(np.float64)
    scale = max(float(np.sqrt(np.mean(a * a))), float(np.sqrt(np.mean(b * b)))) or 1.0

    def same(x: np.ndarray, y: np.ndarray) -> bool:
        return x.size > 0 and float(np.sqrt(np.mean((x - y) ** 2))) <= SAME_BATCH * scale

    def window(shift: int, size: int) -> slice:
        return slice(max(shift, 0), size + min(shift, 0))

    def index(name: str, shift: int) -> str:
        return f"{name}{shift:+d}" if shift else name

    height, width = a.shape[2:]
    for dy in range(-2, 3):
        for dx in range(-2, 3):
            if (dy or dx) and same(a[:, :, window(dy, height), window(dx, width)],
                                   b[:, :, window(-dy, height), window(-dx, width)]):
                return (f"MindSpore's pixel (i, j) is torch's ({index('i', dy)}, "
                        f"{index('j', dx)}): a crop offset (centre-crop rounding).")
    if a.shape[1] > 1 and same(a[:, ::-1], b):
        return "MindSpore's channels are torch's in reverse order (RGB vs BGR)."
    fits = []
    for channel in range(a.shape[1]):
        x, y = a[:, channel].ravel(), b[:, channel].ravel()
        design = np.stack([x, np.ones_like(x)], axis=1)
        (gain, offset), *_ = np.linalg.lstsq(design, y, rcond=None)
        if not same(gain * x + offset, y):
            return suspects
        fits.append((gain, offset))
    gains = ", ".join(f"{g:.4g}" for g, _ in fits)
    offsets = ", ".join(f"{o if abs(o) > SAME_BATCH * scale else 0:.4g}" for _, o in fits)
    return (f"MindSpore's batch is torch's times ({gains}) plus ({offsets}) per channel: "
            "normalisation (mean/std, or the 0–255 vs 0–1 range) differs.")


def _token_ids(a: np.ndarray, b: np.ndarray) -> str:
    """How torch's token ids ``a`` and MindSpore's ``b`` differ: where first, and whether by
    one offset (claimed only when several distinct ids moved by it)."""
    if a.shape != b.shape:
        return (f"torch's token ids are {a.shape}, MindSpore's {b.shape}: padding or "
                "truncation differs.")
    differ = a != b
    offsets = np.unique(b[differ].astype(np.int64) - a[differ])
    found = _first_differences(a, b, "token ids")
    if offsets.size == 1 and np.unique(a[differ]).size > 1:
        return (f"{found}, each by {int(offsets[0]):+d}: the vocabularies are offset (special "
                "tokens, 0- or 1-based ids).")
    return f"{found}: the tokenizer or its vocabulary differs."


def further_input_difference(a: np.ndarray, b: np.ndarray) -> str:
    """How a further model input (x1, x2...: an attention mask, say) differs: no image or
    token signature applies, so where."""
    if a.shape != b.shape:
        return f"torch's is {a.shape}, MindSpore's {b.shape}."
    return f"{_first_differences(a, b, 'values')}: each side prepared it differently."


def _first_differences(a: np.ndarray, b: np.ndarray, what: str) -> str:
    """How many elements of two arrays of one shape differ, and the first of them."""
    differ = a != b
    first = tuple(int(i) for i in np.argwhere(differ)[0])
    return (f"{int(differ.sum())} of {a.size} {what} differ, the first at {first} (torch "
            f"{a[first]}, MindSpore {b[first]})")
