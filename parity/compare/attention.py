"""How a causal attention's forward split its fused projection, told from its first position.

Hugging Face's BLOOM and GPT-NeoX compute q, k and v in one dense layer whose output holds each
head's three in turn, (heads, 3, head); GPT-2, timm and most ports hold them as three blocks,
[q | k | v]. A port splitting it the other way fails at the attention's output projection, with
every module output before it matched, and was told only that the forward computes otherwise.

Under a causal mask the first position attends to itself alone: its context is its own value,
and the output projection there is W·v₀ + b, v₀ some columns of the fused output at position
0. Each side's output there is matched against W·v₀ + b for each way of taking v₀: three
blocks, or head by head for each head count, the value first, second or third. Both sides
recorded every tensor this needs (the fused output matched; W and b are torch's initial
weights), and position 0 alone is read.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

from parity.compare import inputs
from parity.records import Comparison, Diagnosis, RecordInfo
from parity.rundir import RunReader, initial_weights

# W·v₀ + b, in float64 from float32 operands, against an output computed in float32: the
# widest gap was 2.3e-7 of the output's largest value (BLOOM's trial, width 48, both layers,
# both sides, 64th round), the wrong split's 2.1e-2 where its value happened to lie close.
SPLIT_FIT = 1e-4
SLOTS = ("first", "second", "third")


def _value_columns(width: int) -> List[Tuple[str, np.ndarray]]:
    """Each way of taking the value's ``width`` columns from a fused output of three times that:
    (how, columns), the value in each slot of three blocks, or of each head's three."""
    found: List[Tuple[str, np.ndarray]] = []
    for slot, which in enumerate(SLOTS):
        found.append((f"as three blocks [q | k | v], the value the {which}",
                      np.arange(slot * width, (slot + 1) * width)))
        for heads in range(2, width + 1):
            if width % heads:
                continue
            head = width // heads
            columns = np.concatenate([np.arange(h * 3 * head + slot * head,
                                                h * 3 * head + (slot + 1) * head)
                                      for h in range(heads)])
            found.append((f"head by head, ({heads}, 3, {head}), the value the {which} of "
                          "each head's three", columns))
    return found


def _fused_before(t: RecordInfo, width: int, torch_run: RunReader,
                  comparisons: Sequence[Comparison]) -> Optional[RecordInfo]:
    """The last matched module output in the forward calling ``t``, before it, of ``t``'s
    leading shape and three times its input ``width``: the fused projection it reads."""
    holder = inputs.caller(t.name, torch_run)
    records = [torch_run.record(c.name, "forward") for c in comparisons
               if c.kind == "forward" and c.passed and inputs.caller(c.name, torch_run) == holder]
    fused = [r for r in records if r is not None and r.order < t.order and
             tuple(r.shape) == (*t.shape[:2], 3 * width)]
    return max(fused, key=lambda r: r.order) if fused else None


def fused_split_otherwise(t: RecordInfo, m: RecordInfo, torch_run: RunReader,
                          ms_run: RunReader, comparisons: Sequence[Comparison]
                          ) -> Optional[Diagnosis]:
    """An output projection (a dense layer over (N, L, width)) whose input differs, the fused
    projection before it matched, each side's first position that of its own split of the
    fused output; None where either side's is none of them, or both take the same."""
    weights = initial_weights(torch_run)
    if weights is None or t.op != "dense" or len(t.shape) != 3 or \
            tuple(t.shape) != tuple(m.shape):
        return None
    weight, bias = weights.get(f"{t.name}.weight"), weights.get(f"{t.name}.bias")
    if weight is None or weight.ndim != 2 or weight.shape[0] != t.shape[2]:
        return None
    width = weight.shape[1]
    fused = _fused_before(t, width, torch_run, comparisons)
    if fused is None:
        return None
    first = torch_run.tensor(fused)[:, 0].astype(np.float64)
    weight = weight.astype(np.float64)
    offset = 0.0 if bias is None else bias.astype(np.float64)
    candidates = [(how, first[:, columns] @ weight.T + offset)
                  for how, columns in _value_columns(width)]

    def split_of(run: RunReader, record: RecordInfo) -> Optional[str]:
        output = run.tensor(record)[:, 0].astype(np.float64)
        scale = max(float(np.max(np.abs(output))), np.finfo(np.float32).tiny)
        return next((how for how, predicted in candidates
                     if np.max(np.abs(predicted - output)) <= SPLIT_FIT * scale), None)

    torch_split, ms_split = split_of(torch_run, t), split_of(ms_run, m)
    if torch_split is None or ms_split is None or torch_split == ms_split:
        return None
    return Diagnosis(cause="fused projection split otherwise",
                     detail=f"{fused.name}'s output matched, and {t.name}'s input differs: "
                            f"torch splits the fused q, k, v {torch_split}; MindSpore "
                            f"{ms_split}. Told at the first position, which a causal attention "
                            "lets see only itself: there each side's output is its own value "
                            f"projected by {t.name}. Split it as torch does (Hugging Face's "
                            "BLOOM and GPT-NeoX hold each head's q, k, v together: "
                            "view(n, l, heads, 3, head)).",
                     confidence="certain")
