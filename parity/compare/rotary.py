"""The ways an attention may turn q and k by position, from the rotary table torch recorded.

Hugging Face's Llama, GPT-NeoX and Falcon build cos and sin of each position's angles in a
module of their own (``rotary_emb``) and turn each head's first dims by them, pairing dim i
with dim i + dims/2 (``rotate_half``), the table's angles laid out as cat(freqs, freqs); GPT-J
pairs neighbours, 2i with 2i + 1, its angles repeated in pairs. A port computing its table in
its construct may pair the other way, turn another number of dims, take another base, or
not turn at all. Torch's own way is its table, paired as its layout says; the others are
built from the angles it holds (the base they imply: θ₁ = base^(−2/dims)).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np

from parity.records import RecordInfo
from parity.rundir import RunReader

# How a rotary pairs the dims it turns: dim j with dim partner[j], that one taking sign[j].
HALVES, NEIGHBOURS = "as two halves", "in neighbouring pairs"
# How its table lays the angles of those pairs out along its last axis.
ANGLES = {HALVES: "laid out as cat(freqs, freqs)",
          NEIGHBOURS: "laid out as pairs, repeat_interleave(freqs, 2)"}
# The bases a rotary's frequencies base^(-2i / dims) commonly take: most models', Llama 3's,
# Qwen2's.
BASES = (10000.0, 500000.0, 1000000.0)

# The parts of each head a rotary commonly turns: all of it (Llama, Meta's and Hugging Face's),
# half (ChatGLM), a quarter (GPT-J, GPT-NeoX).
PARTS = (1, 2, 4)
# Torch's angles are scaled (Llama 3.1's rope_scaling divides its long wavelengths' by 8) where
# one at its first SCALED_READ positions lies this far, in radians, from the plain angle of the
# base they imply: torch's float32 angles lie within 1.4e-4 of them there (5.6e-4 at 4096
# positions; dims 8, 64, 128, bases 10000, 500000, 1000000), Llama 3.1's off by 7/8 of the
# angle at its longest wavelengths.
SCALED_ANGLES, SCALED_READ = 1e-3, 1024

Table = Tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True, eq=False)
class Rotary:
    """One way of turning q or k (heads, L, head) by position: its first ``cos.shape[1]``
    dims, dim j by the angle of column j of ``cos`` and ``sin`` (L, dims), with dim
    ``partner[j]``, whose sign ``sin`` carries; none where ``cos`` is None. ``said`` in
    words."""
    said: str
    cos: Optional[np.ndarray] = None
    sin: Optional[np.ndarray] = None
    partner: Optional[np.ndarray] = None

    def turned(self, x: np.ndarray, positions: Optional[np.ndarray] = None) -> np.ndarray:
        """``x`` turned, its axis 1 the table's ``positions`` (all of them where None)."""
        if self.cos is None:
            return x
        cos, sin = (self.cos, self.sin) if positions is None else \
            (self.cos[positions], self.sin[positions])
        dims = cos.shape[1]
        part = x[..., :dims]
        turned = part * cos
        turned += part[..., self.partner] * sin
        return turned if dims == x.shape[-1] else np.concatenate([turned, x[..., dims:]], -1)


UNNAMED = Rotary("")
UNTURNED = Rotary("turns no dims of q and k (no rotary positions)")


def recorded_tables(t: RecordInfo, torch_run: RunReader) -> List[Table]:
    """The rotary tables torch recorded before ``t``, the latest first: each a module output of
    one row per position along ``t``'s axis 1 (L, dims), cos of the angles (all ones at
    position 0), and the sin it returned next (all zeros there, not everywhere); in float64.
    Gemma 3's model computes two, its global layers' and its local ones'."""
    length = t.shape[1] if len(t.shape) > 1 else 0
    shaped = sorted((r for r in torch_run.records
                     if r.kind == "forward" and r.order < t.order and len(r.shape) >= 2
                     and r.shape[-2] == length and r.shape[-1] % 2 == 0
                     and int(np.prod(r.shape[:-2])) == 1), key=lambda r: -r.order)
    tables: List[Table] = []
    for sin_record, cos_record in zip(shaped, shaped[1:]):
        if cos_record.shape != sin_record.shape or sin_record.order != cos_record.order + 1:
            continue
        cos, sin = (torch_run.tensor(r).reshape(length, -1).astype(np.float64)
                    for r in (cos_record, sin_record))
        if np.all(cos[0] == 1) and np.all(sin[0] == 0) and np.any(sin != 0) and \
                np.allclose(cos ** 2 + sin ** 2, 1, atol=1e-5) and not any(
                    np.array_equal(cos, other) for other, _ in tables):
            tables.append((cos, sin))
    return tables


def computed_table(length: int, dims: int, base: float, layout: str) -> Table:
    """The rotary table of ``dims`` a forward computing its own angles holds at ``length``
    positions, laid out as ``layout``."""
    laid = _computed_angles(length, dims, base)[:, _layout_columns(dims, layout)]
    return np.cos(laid), np.sin(laid)


def computed(length: int, dims: int, base: float, layout: str, head: int) -> Rotary:
    """The way a forward computing its own angles over ``dims`` of each head's ``head`` at
    ``base`` turns q and k, paired as ``layout`` lays them out (``turning`` of its
    ``computed_table``, its base said)."""
    return _turning(_computed_angles(length, dims, base), dims, head, layout, layout,
                    f" of base {base:.0f}")


def _computed_angles(length: int, dims: int, base: float) -> np.ndarray:
    """position × base^(−2i / dims) at ``length`` positions, (length, dims / 2), in float32 as
    torch computes them (inverse frequencies, then their products), returned in float64. The
    powers rounded from float64 match torch's float32 ones but for 1.2% (numpy's float32
    power: 18%, dims 2 to 256 at the three bases), an ulp apart."""
    exponents = np.arange(0, dims, 2, dtype=np.float32) / np.float32(dims)
    frequencies = np.float32(1) / (np.float64(base) ** exponents.astype(np.float64)
                                   ).astype(np.float32)
    return np.outer(np.arange(length, dtype=np.float32), frequencies).astype(np.float64)


def turning(table: Optional[Table], head: int) -> Rotary:
    """Torch's way of turning q and k of ``head`` dims a head by its rotary ``table`` (cos,
    sin), (L, dims): paired as its layout says. None (UNNAMED) where it recorded no table;
    UNTURNED where its table does not fit a head."""
    if table is None:
        return UNNAMED
    dims, layout = table[0].shape[1], _layout(table)
    if dims > head or layout is None:
        return UNTURNED
    return _turning(_angles(table, layout), dims, head, layout, layout)


def rotations(table: Optional[Table], head: int) -> List[Rotary]:
    """The ways other than torch's of turning q and k of ``head`` dims a head, from its rotary
    ``table``: its dims paired the other way, or its angles laid out the other way; as its
    layout pairs them, each whole head, twice or half its dims at the base its angles imply,
    its dims at that base unscaled where torch's are scaled (SCALED_ANGLES), or at another
    common base; not at all. None where ``turning`` turns none."""
    if table is None:
        return []
    dims, layout = table[0].shape[1], _layout(table)
    if dims > head or layout is None:
        return []
    angles = _angles(table, layout)
    others = [UNTURNED] + [_turning(angles, dims, head, pairs, laid_out)
                           for pairs in (HALVES, NEIGHBOURS) for laid_out in (HALVES, NEIGHBOURS)
                           if (pairs, laid_out) != (layout, layout)]
    if dims >= 4 and angles.shape[0] > 1 and 0 < angles[1, 1] < 1:
        base = float(angles[1, 1] ** (-dims / 2))
        shown = next((f"{common:.0f}" for common in BASES if abs(common - base) <= 1e-4 * common),
                     f"{base:.0f}")     # read from float32 angles: 500001 for 500000
        position = np.arange(angles.shape[0])[:, None]
        elsewhere = [(other, base, f" of torch's base, {shown},")
                     for other in (head, 2 * dims, dims // 2)
                     if other != dims and other <= head and other % 2 == 0]
        plain = (position * base ** (-np.arange(dims // 2) / (dims // 2)))[:SCALED_READ]
        if np.abs(np.angle(np.exp(1j * (plain - angles[:SCALED_READ])))).max() > SCALED_ANGLES:
            elsewhere.append((dims, base, f" of torch's base, {shown}, unscaled (torch's "
                                          "scaled, as Llama 3.1's rope_scaling scales long "
                                          "wavelengths),"))
        elsewhere += [(dims, other, f" of base {other:.0f} (torch's {shown})")
                      for other in BASES if abs(other - base) > 1e-3 * base]
        for other, at, said in elsewhere:
            others.append(_turning(position * at ** (-np.arange(other // 2) / (other // 2)),
                                   other, head, layout, layout, said))
    return others


def _layout(table: Table) -> Optional[str]:
    """How ``table`` lays its angles out (the first of HALVES and NEIGHBOURS its columns
    repeat as, both where it holds one angle); None where neither."""
    both, dims = np.stack(table), table[0].shape[1]
    return next((layout for layout in (HALVES, NEIGHBOURS) if np.array_equal(
        both, both[..., _angle_columns(dims, layout)][..., _layout_columns(dims, layout)])),
        None)


def _angles(table: Table, layout: str) -> np.ndarray:
    """Each angle of ``table``, laid out as ``layout``, once: (L, dims / 2)."""
    cos, sin = table
    return np.arctan2(sin, cos)[:, _angle_columns(cos.shape[1], layout)]


def _angle_columns(dims: int, layout: str) -> np.ndarray:
    """The columns of a table of ``dims`` laid out so that hold each angle once."""
    return np.arange(dims // 2) if layout == HALVES else np.arange(0, dims, 2)


def _layout_columns(dims: int, layout: str) -> np.ndarray:
    """Which angle each column of a table of ``dims`` laid out so holds."""
    return np.r_[:dims // 2, :dims // 2] if layout == HALVES else np.repeat(np.arange(dims // 2), 2)


def _pairing(dims: int, pairs: str) -> Tuple[np.ndarray, np.ndarray]:
    """Each dim's partner and the sign its value takes (rotate_half, rotate_every_two)."""
    j = np.arange(dims)
    if pairs == HALVES:
        return (j + dims // 2) % dims, np.where(j < dims // 2, -1.0, 1.0)
    return j ^ 1, np.where(j % 2 == 0, -1.0, 1.0)


def _turning(angles: np.ndarray, dims: int, head: int, pairs: str, layout: str, base: str = ""
             ) -> Rotary:
    """The first ``dims`` of each head turned, paired ``pairs``, by ``angles`` (L, dims / 2)
    laid out as ``layout``."""
    partner, sign = _pairing(dims, pairs)
    laid = angles[:, _layout_columns(dims, layout)]
    turned = f"each head's {head} dims" if dims == head else \
        f"the first {dims} of each head's {head} dims"
    return Rotary(f"turns {turned} of q and k {pairs}, by angles{base} {ANGLES[layout]}",
                  np.cos(laid), sign * np.sin(laid), partner)
