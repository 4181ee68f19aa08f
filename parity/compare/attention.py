"""How a causal attention's forward took its values, told from its first position.

Hugging Face's BLOOM and GPT-NeoX compute q, k and v in one dense layer whose output holds each
head's three in turn, (heads, 3, head); GPT-2, timm and most ports hold them as three blocks,
[q | k | v]. Falcon's fused layer shares each key-value head among a group of query heads and
holds each group's queries, key and value together, (groups, per group + 2, head); Llama and
Gemma share theirs from projections of their own, head h reading key-value head h // (heads /
groups) (``repeat_interleave``), where a port may read h % groups (``tile``). A port taking the
values otherwise fails at the attention's output projection, with every module output before it
matched, and was told only that the forward computes otherwise.

Under a causal mask the first position attends to itself alone: its context is its own value,
and the output projection there is W·v₀ + b, each head's v₀ some columns of the output of a
projection before it at position 0. Each side's output there is matched against W·v₀ + b for
each way of taking v₀: from a fused projection as three blocks or group by group (head by head
without sharing), for each head count and, without sharing, each slot; from a projection of
the values alone, for each head count; shared either way. Both sides recorded every tensor this
needs (the projection's output matched; W and b are torch's initial weights), and position 0
alone is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from parity.compare import inputs
from parity.records import Comparison, Diagnosis, RecordInfo
from parity.rundir import RunReader, initial_weights

# W·v₀ + b, in float64 from float32 operands, against an output computed in float32: the
# widest gap was 2.3e-7 of the output's largest value (BLOOM's trial, width 48, both layers,
# both sides, 64th round), the wrong split's 2.1e-2 where its value happened to lie close.
SPLIT_FIT = 1e-4
SLOTS = ("first", "second", "third")
REPEATED = "h // (heads / groups), as repeat_interleave (torch's repeat_kv, Falcon's broadcast)"
# Which key-value head of ``groups`` query head h of ``heads`` reads, each way.
SHARINGS: Dict[str, Callable[[int, int, int], int]] = {
    REPEATED: lambda h, heads, groups: h // (heads // groups),
    "h % groups, as tile": lambda h, heads, groups: h % groups,
}


@dataclass(frozen=True, eq=False)
class ValueTaken:
    """One way of taking each head's value from a projection's output: how its columns are laid
    out (``layout``), how query heads share them (``sharing``, "" where they do not), the
    columns, head after head, and how many heads read them (0: untold, three blocks)."""
    layout: str
    sharing: str
    columns: np.ndarray
    heads: int = 0


def _key_value_heads(groups: int) -> str:
    return f"{groups} key-value head{'s' if groups > 1 else ''}"


def _divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _heads_reading(starts: Sequence[int], head: int, heads: int, layout: str
                   ) -> List[ValueTaken]:
    """The ways ``heads`` query heads read values of ``head`` columns starting at ``starts``,
    one per key-value head: each sharing, where there are more query heads than values and
    more than one value."""
    groups = len(starts)
    shared = {"": lambda h, heads, groups: h} if groups == heads else \
        {"": lambda h, heads, groups: 0} if groups == 1 else SHARINGS
    return [ValueTaken(layout, sharing,
                       np.concatenate([np.arange(starts[read(h, heads, groups)],
                                                 starts[read(h, heads, groups)] + head)
                                       for h in range(heads)]), heads)
            for sharing, read in shared.items()]


def _three_equal(width: int) -> List[ValueTaken]:
    """The value's columns in a fused output of three times ``width``: each slot of three
    blocks, or of each head's three, for each head count."""
    found: List[ValueTaken] = []
    for slot, which in enumerate(SLOTS):
        found.append(ValueTaken(f"as three blocks [q | k | v], the value the {which}", "",
                                np.arange(slot * width, (slot + 1) * width)))
        for heads in _divisors(width)[1:]:
            head = width // heads
            found += _heads_reading([h * 3 * head + slot * head for h in range(heads)], head,
                                    heads, f"head by head, ({heads}, 3, {head}), the value the "
                                           f"{which} of each head's three")
    return found


def _grouped(width: int, source: int) -> List[ValueTaken]:
    """The value's columns in a fused output of ``source`` columns, query heads of ``width``
    in all sharing fewer key-value heads: as blocks [q | k | v], or group by group, each
    group's queries, key and value, for each head count."""
    found: List[ValueTaken] = []
    for heads in _divisors(width):
        head = width // heads
        groups, rest = divmod(source - width, 2 * head)
        if rest or not 0 < groups < heads or heads % groups:
            continue
        per = heads // groups
        shape = f"{heads} query heads and {_key_value_heads(groups)} of {head}"
        found += _heads_reading([width + (groups + g) * head for g in range(groups)], head,
                                heads, f"as blocks [q | k | v], {shape}")
        found += _heads_reading([g * (per + 2) * head + (per + 1) * head for g in range(groups)],
                                head, heads, f"group by group, ({groups}, {per} + 2, {head}): "
                                             "each group's queries, its key, its value")
    return found


def _values_alone(width: int, source: int) -> List[ValueTaken]:
    """The value's columns in a projection of the values alone, ``source`` columns of fewer
    key-value heads than query heads of ``width`` in all, for each head count."""
    found: List[ValueTaken] = []
    for heads in _divisors(width):
        head = width // heads
        groups, rest = divmod(source, head)
        if not rest and 1 < groups < heads and not heads % groups:
            found += _heads_reading([g * head for g in range(groups)], head, heads,
                                    f"from its own projection, {heads} query heads and "
                                    f"{_key_value_heads(groups)} of {head}")
    return found


def ways_of_taking_values(width: int, source: int) -> List[ValueTaken]:
    """Each way query heads of ``width`` columns in all may take their values from the output
    of a projection of ``source`` columns. Two ways may take the same columns: three heads
    reading one value, or six reading two in turn."""
    if source == 3 * width:
        return _three_equal(width)
    if source > width:
        return _grouped(width, source)
    return _values_alone(width, source)


def _projections_before(t: RecordInfo, torch_run: RunReader,
                        comparisons: Sequence[Comparison]) -> List[RecordInfo]:
    """The matched module outputs in the forward calling ``t``, before it, of ``t``'s leading
    shape: the projections its values may come from, the latest first."""
    holder = inputs.caller(t.name, torch_run)
    records = [torch_run.record(c.name, "forward") for c in comparisons
               if c.kind == "forward" and c.passed and inputs.caller(c.name, torch_run) == holder]
    before = [r for r in records if r is not None and r.order < t.order and
              len(r.shape) == 3 and tuple(r.shape[:2]) == tuple(t.shape[:2])]
    return sorted(before, key=lambda r: -r.order)


def values_taken_otherwise(t: RecordInfo, m: RecordInfo, torch_run: RunReader,
                           ms_run: RunReader, comparisons: Sequence[Comparison]
                           ) -> Optional[Diagnosis]:
    """An output projection (a module holding a weight (out, width) over (N, L, width): a dense
    layer, or Falcon's subclass of one, recorded as a module of its own) whose input differs, a
    projection before it matched, each side's first position that of its own way of taking
    its values from that projection; None where either side's is none of them, or both take
    the same."""
    weights = initial_weights(torch_run)
    if weights is None or len(t.shape) != 3 or tuple(t.shape) != tuple(m.shape):
        return None
    weight, bias = weights.get(f"{t.name}.weight"), weights.get(f"{t.name}.bias")
    if weight is None or weight.ndim != 2 or weight.shape[0] != t.shape[2]:
        return None
    weight = weight.astype(np.float64)
    offset = 0.0 if bias is None else bias.astype(np.float64)
    for projection in _projections_before(t, torch_run, comparisons):
        ways = ways_of_taking_values(weight.shape[1], projection.shape[2])
        if len({way.columns.tobytes() for way in ways}) < 2:
            continue
        first = torch_run.tensor(projection)[:, 0].astype(np.float64)
        predicted = [first[:, way.columns] @ weight.T + offset for way in ways]

        def fitting(run: RunReader, record: RecordInfo) -> List[ValueTaken]:
            output = run.tensor(record)[:, 0].astype(np.float64)
            scale = max(float(np.max(np.abs(output))), np.finfo(np.float32).tiny)
            return [way for way, values in zip(ways, predicted)
                    if np.max(np.abs(values - output)) <= SPLIT_FIT * scale]

        pairs = [(a, b) for a in fitting(torch_run, t) for b in fitting(ms_run, m)]
        if not pairs:
            continue
        if any(np.array_equal(a.columns, b.columns) for a, b in pairs):
            return None
        torch_way, ms_way = max(pairs, key=lambda pair: (pair[0].layout == pair[1].layout,
                                                         pair[0].heads == pair[1].heads))
        return _diagnosis(torch_way, ms_way, projection.name, t.name)
    return None


def _diagnosis(torch_way: ValueTaken, ms_way: ValueTaken, projection: str,
               output: str) -> Diagnosis:
    told = "Told at the first position, which a causal attention lets see only itself: there " \
        f"each side's output is its own value projected by {output}."
    if torch_way.layout == ms_way.layout:
        how = " (ops.repeat_interleave(kv, heads // groups, axis=1))" \
            if torch_way.sharing == REPEATED else ""
        return Diagnosis(cause="key-value heads shared otherwise",
                         detail=f"{projection}'s output matched, and {output}'s input differs: "
                                f"torch's query head h reads key-value head "
                                f"{torch_way.sharing}; MindSpore's {ms_way.sharing} (the values "
                                f"taken {torch_way.layout}). {told} Share them as torch does{how}.",
                         confidence="certain")
    same = torch_way.sharing == ms_way.sharing
    shared = f", query head h reading key-value head {torch_way.sharing} on both sides" \
        if same and torch_way.sharing else ""
    return Diagnosis(cause="fused projection split otherwise",
                     detail=f"{projection}'s output matched, and {output}'s input differs: "
                            f"torch splits the fused q, k, v {_described(torch_way, same)}; "
                            f"MindSpore {_described(ms_way, same)}{shared}. {told} Split it as "
                            "torch does (Hugging Face's BLOOM and GPT-NeoX hold each head's q, "
                            "k, v together: view(n, l, heads, 3, head); Falcon each group's "
                            "queries, key and value: view(n, l, groups, per group + 2, head)).",
                     confidence="certain")


def _described(way: ValueTaken, same_sharing: bool) -> str:
    return way.layout + (f", query head h reading key-value head {way.sharing}"
                         if way.sharing and not same_sharing else "")
