"""How an attention's forward took q, k and v from the projections before it.

Hugging Face's BLOOM and GPT-NeoX compute q, k and v in one dense layer whose output holds each
head's three in turn, (heads, 3, head); GPT-2, timm and most ports hold them as three blocks,
[q | k | v]. Falcon's fused layer shares each key-value head among a group of query heads and
holds each group's queries, key and value together, (groups, per group + 2, head); Llama and
Gemma share theirs from projections of their own, head h reading key-value head h // (heads /
groups) (``repeat_interleave``), where a port may read h % groups (``tile``). A port taking
them otherwise fails at the attention's output projection, with every module output before it
matched, and was told only that the forward computes otherwise.

Under a causal mask the first position attends to itself alone: its context is its own value,
and the output projection there is W·v₀ + b, each head's v₀ some columns of the output of a
projection before it at position 0. Each side's output there is matched against W·v₀ + b for
each way of taking v₀: from a fused projection as three blocks or group by group (head by head
without sharing), for each head count and, without sharing, each slot; from a projection of
the values alone, for each head count; shared either way. Rotary positions, which turn q and k
alone, leave this reading as it is.

Where the first position tells nothing (timm's ViT attends over every token; a scale or a
rotation leaves it as it is), the attention is computed again at a few positions, from a fused
output (as blocks, head by head, or group by group) or three projections, for each order of q,
k and v in it, each head count, keys and values of fewer heads shared either way, its scores
scaled by 1/√head, not at all, or by another constant ports take (SCORE_SCALES), with a causal
mask or none; each side's output there is matched
against each. That tells the split, the sharing, the head count and the scale (GPT-2 ported
without it). Where torch recorded a rotary table before the attention (a module returning cos
and sin of the positions, Hugging Face's ``rotary_emb``), q and k are turned by it as its
layout says; where MindSpore's output fits no way so, torch's own ways are tried again with q
and k turned each other way ``rotary.rotations`` knows (other pairs, dims or base, or none):
that tells the rotation too (a Llama port rotating GPT-J's neighbouring pairs). Where torch
recorded several tables (Gemma 3's global and local), each is tried; where it recorded none
and its output fits no way unturned, its forward is taken to compute its angles itself (Meta's
Llama, GPT-J), and the table a common rotary computes that its output fits is taken for its
own. q or k normed after its projection (Qwen3, Gemma 3, OLMo 2) is read from the norm.

Both sides recorded every tensor this needs (the projection's output matched; W and b are
torch's initial weights), and a few positions alone are read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from itertools import permutations, product
from typing import (Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple,
                    TypeVar, Union)

import numpy as np

from parity.compare import inputs, rotary
from parity.records import Comparison, Diagnosis, RecordInfo
from parity.rundir import RunReader, initial_weights
from parity.sketch import input_sketch

# W·v₀ + b, in float64 from float32 operands, against an output computed in float32: the
# widest gap was 2.3e-7 of the output's largest value (BLOOM's trial, width 48, both layers,
# both sides, 64th round), the wrong split's 2.1e-2 where its value happened to lie close. The
# attention computed again: each side's own way within 3.8e-7, the nearest other way 3.8e-3
# off (timm's ViT and GPT-2 trials, their first layer, both sides, 65th round); turned by a
# rotary table, its own way within 2.3e-7, the nearest other 6.1e-4 off, but for another base
# (Llama's, GPT-NeoX's and Falcon's trials, 16 tokens, 66th round: bases 500000 and 1000000 lie
# 5.4e-5 to 9.3e-5 apart, and the closer way is told).
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


def _spread(count: int, length: int) -> np.ndarray:
    """At most ``count`` indices below ``length``, evenly spread, the first and last among
    them."""
    return np.unique(np.linspace(0, length - 1, min(count, length)).round().astype(int))


def _heads_reading(starts: Sequence[int], head: int, heads: int, layout: str
                   ) -> List[ValueTaken]:
    """The ways ``heads`` query heads read values of ``head`` columns starting at ``starts``,
    one per key-value head: each sharing, where there are more query heads than values and
    more than one value."""
    groups = len(starts)
    return [ValueTaken(layout, sharing,
                       np.concatenate([np.arange(starts[read(h, heads, groups)],
                                                 starts[read(h, heads, groups)] + head)
                                       for h in range(heads)]), heads)
            for sharing, read in _sharings(heads, groups).items()]


def _sharings(heads: int, groups: int) -> Dict[str, Callable[[int, int, int], int]]:
    """Which key-value head query head h reads, each way ``heads`` query heads may read
    ``groups``: its own where as many, the one where one ("" either way), else each of
    SHARINGS."""
    if groups == heads:
        return {"": lambda h, heads, groups: h}
    return {"": lambda h, heads, groups: 0} if groups == 1 else SHARINGS


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


def _projections_before(t: RecordInfo, holder: str, torch_run: RunReader,
                        comparisons: Sequence[Comparison], anywhere: bool = False,
                        any_length: bool = False, in_heads: bool = False
                        ) -> List[RecordInfo]:
    """The matched module outputs before ``t`` of its leading shape (``any_length``: of its
    batch, each position of its own sequence: a cross-attention's keys) that ``holder``'s
    forward computes itself (``anywhere``: in a module of its, at any depth): the projections
    its values may come from, the latest first; (N, L, width) each, or of four axes too
    where ``in_heads`` (a norm over each head)."""
    inside = [c for c in comparisons if c.name.startswith(holder + ".")] if anywhere else \
        [c for c in comparisons if inputs.caller(c.name, torch_run) == holder]
    records = [torch_run.record(c.name, "forward") for c in inside
               if c.kind == "forward" and c.passed]
    leading = 1 if any_length else 2
    before = [r for r in records if r is not None and r.order < t.order and
              len(r.shape) in ((3, 4) if in_heads else (3,))
              and tuple(r.shape[:leading]) == tuple(t.shape[:leading])]
    return sorted(before, key=lambda r: -r.order)


def _normed(found: Sequence[RecordInfo], torch_run: RunReader) -> Dict[str, RecordInfo]:
    """For each of ``found`` (N, L, width) whose output a later one of ``found`` takes as its
    first input, as it is or in heads (N, heads, L, head), and keeps its size, that one, read
    as (N, L, …): a norm of q or k (Qwen3's ``q_norm`` over each head, (N, L, heads, head);
    Gemma 3's over the heads transposed; OLMo 2's over the width). Told by the sketch of the
    norm's input."""
    normed: Dict[str, RecordInfo] = {}
    for source in [r for r in found if len(r.shape) == 3]:
        n, length, width = source.shape
        value = None
        for later in found:                                 # the latest first
            if later.order <= source.order or later.shape[0] != n or \
                    int(np.prod(later.shape[1:])) != length * width:
                continue
            if value is None:
                value = torch_run.tensor(source)
            views = [(later, value)] if later.shape[1] == length else []
            if len(later.shape) == 4 and later.shape[2] == length:
                views.append((later.transposed((0, 2, 1, 3)), value.reshape(
                    n, length, later.shape[1], -1).transpose(0, 2, 1, 3)))
            read = next((read for read, viewed in views if inputs.same_values(
                later.attrs.get("input_sketch"), input_sketch(np.ascontiguousarray(viewed)))),
                None)
            if read is not None:
                normed[source.name] = read
                break
    return normed


# The output projection's columns a prediction is made and matched at, at most: evenly spread,
# they tell the ways apart as all would, and keep a wide layer's matrix products small.
OUTPUTS_MATCHED = 64


@dataclass(frozen=True, eq=False)
class OutputProjection:
    """An attention's output projection as torch's initial weights hold it, at the output
    columns ``outputs``: its weight in each orientation its shape allows, as (width, outputs)
    matrices (a dense layer's (out, width) transposed; GPT-2's Conv1D holds (width, out)), its
    bias (0 where it has none), and the width it returns (Gemma 2's and 3's 27B return more
    columns than their heads hold)."""
    matrices: List[np.ndarray]
    offset: Union[np.ndarray, float]
    width: int
    outputs: np.ndarray
    returned: int


def _output_projection(t: RecordInfo, m: RecordInfo, torch_run: RunReader
                       ) -> Optional[OutputProjection]:
    """``t``'s weights as an output projection over (N, L, width), where it holds a 2-D
    weight of its output's width: a dense layer, or a subclass of one recorded as a module of
    its own (Falcon's)."""
    weights = initial_weights(torch_run)
    if weights is None or len(t.shape) != 3 or tuple(t.shape) != tuple(m.shape):
        return None
    weight, bias = weights.get(f"{t.name}.weight"), weights.get(f"{t.name}.bias")
    width = t.shape[2]
    if weight is None or weight.ndim != 2 or width not in weight.shape:
        return None
    outputs = _spread(OUTPUTS_MATCHED, width)
    weight = weight.astype(np.float64)
    matrices = [w[:, outputs] for w, out in ((weight.T, weight.shape[0]), (weight, weight.shape[1]))
                if out == width]
    offset = 0.0 if bias is None else bias.astype(np.float64)[outputs]
    return OutputProjection(matrices, offset, matrices[0].shape[0], outputs, width)


def values_taken_otherwise(t: RecordInfo, m: RecordInfo, torch_run: RunReader,
                           ms_run: RunReader, comparisons: Sequence[Comparison]
                           ) -> Optional[Diagnosis]:
    """An output projection ``t`` whose input differs, a projection before it matched, each
    side's first position that of its own way of taking its values from that projection; None
    where either side's is none of them, or both take the same."""
    out = _output_projection(t, m, torch_run)
    if out is None:
        return None
    for projection in _projections_before(t, inputs.caller(t.name, torch_run), torch_run,
                                          comparisons):
        ways = ways_of_taking_values(out.width, projection.shape[2])
        if len({way.columns.tobytes() for way in ways}) < 2:
            continue
        first = torch_run.tensor(projection)[:, 0].astype(np.float64)
        predicted = [[first[:, way.columns] @ matrix + out.offset for way in ways]
                     for matrix in out.matrices]
        for outputs in predicted:
            pairs = [(a, b) for a in _fitting(ways, outputs, torch_run, t, [0], out.outputs)
                     for b in _fitting(ways, outputs, ms_run, m, [0], out.outputs)]
            if not pairs:
                continue
            if any(np.array_equal(a.columns, b.columns) for a, b in pairs):
                return None
            torch_way, ms_way = max(pairs, key=lambda pair: (pair[0].layout == pair[1].layout,
                                                             pair[0].heads == pair[1].heads))
            return _values_told(torch_way, ms_way, projection.name, t.name)
    return None


Way = TypeVar("Way")


def _fitting(ways: Sequence[Way], predicted: Sequence[np.ndarray], run: RunReader,
             record: RecordInfo, positions: Sequence[int], outputs: np.ndarray,
             samples: slice = slice(None)) -> List[Way]:
    """The ways whose predicted output at ``positions`` along axis 1 and columns ``outputs``
    (of ``samples``) is ``record``'s there, to SPLIT_FIT of its largest value, the closest
    first: at a few positions two rotary bases may both fit, the port's to float32 noise."""
    output = run.tensor(record)[samples][:, list(positions)][..., outputs].astype(np.float64)
    scale = max(float(np.max(np.abs(output))), np.finfo(np.float32).tiny)
    gaps = [np.max(np.abs(values.reshape(output.shape) - output)) for values in predicted]
    return [way for gap, _, way in sorted((gap, i, way) for i, (gap, way)
                                          in enumerate(zip(gaps, ways))
                                          if gap <= SPLIT_FIT * scale)]


def _values_told(torch_way: ValueTaken, ms_way: ValueTaken, projection: str,
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


# The positions along axis 1 an attention is computed again at: the first, the last, and as
# many more between them.
RECOMPUTED_POSITIONS = 4
# The most heads tried (Llama-3-405B has 128 query heads).
MOST_HEADS = 128
# How the scores q·kᵀ may be scaled, from (head, width, returned): by the attention's whole
# width, Whisper ported with the model's width where its heads' belongs; by 1/head, a BERT port
# dividing by d for √d; by the width the output projection returns over the heads, Gemma 2's
# and 3's 27B (query_pre_attn_scalar: 144 and 168, for heads of 128). A scale equal to one
# before it is not tried (the last where the output projection returns the attention's width).
SCORE_SCALES: Dict[str, Callable[[int, int, int], float]] = {
    "1/√head": lambda head, width, returned: head ** -0.5,
    "1": lambda head, width, returned: 1.0,
    "1/√(heads · head)": lambda head, width, returned: width ** -0.5,
    "1/head": lambda head, width, returned: 1.0 / head,
    "1/√(model width / heads)": lambda head, width, returned: (returned * head / width) ** -0.5,
}


BLOCKS, HEAD_BY_HEAD, OWN_PROJECTIONS = "blocks", "head by head", "own projections"


@dataclass(frozen=True)
class Attending:
    """One way of attending from the projections before an output projection: how q, k and v
    lie in them (``arrangement``: a fused output's three blocks, or its heads' three each, or
    three projections of their own), which slot or projection holds each (``order[slot]``:
    0, 1, 2 for q, k, v), in how many ``heads``, the scores' ``scale``, whether a causal
    mask hides later positions, how q and k are turned by position (``rotary``, in words;
    "" where torch recorded no rotary table), and which key-value head query head h reads
    (``sharing``; "" where each has its own)."""
    arrangement: str
    order: Tuple[int, ...]
    heads: int
    scale: str
    causal: bool
    rotary: str = ""
    sharing: str = ""

    def said(self, sources: Sequence[str], width: int) -> str:
        """How q, k and v are taken, in words, ``sources`` naming the projections."""
        head, roles = width // self.heads, ["qkv"[role] for role in self.order]
        shared = f", query head h reading key-value head {self.sharing}" if self.sharing else ""
        if self.arrangement == BLOCKS:
            return f"as three blocks [{' | '.join(roles)}], {self.heads} heads of {head}{shared}"
        if self.arrangement == HEAD_BY_HEAD:
            return f"head by head, ({self.heads}, 3, {head}), each head's {', '.join(roles)}"
        if self.arrangement != OWN_PROJECTIONS:
            return f"{self.arrangement}, each group's queries read as {roles[0]}, its key as " \
                f"{roles[1]}, its value as {roles[2]}, {self.heads} heads of {head}{shared}"
        taken = ", ".join(f"{'qkv'[role]} from {sources[self.order.index(role)]}"
                          for role in range(3))
        return f"{taken}, {self.heads} heads of {head}{shared}"


class Laid(NamedTuple):
    """How q, k and v lie in the projections' outputs (``arrangement``), in how many
    ``heads``, and how query heads share fewer key-value heads (``sharing``; "" where not)."""
    arrangement: str
    heads: int
    sharing: str = ""


def _heads_in_slots(sources: Sequence[np.ndarray], width: int
                    ) -> Iterator[Tuple[Laid, List[np.ndarray]]]:
    """For one sample's fused output (L, 3·width), or its three projections (L, width) each,
    each way of laying them out as three slots of heads: a fused output's three blocks, or its
    heads' three each, for each head count. Where the keys and values are of fewer heads (a
    fused output of fewer columns, or two projections narrower), each way of sharing them.
    Yields each way and each slot's (heads, L, head)."""
    length = sources[0].shape[0]
    for heads in [h for h in _divisors(width) if h <= MOST_HEADS]:
        head = width // heads
        if len(sources) == 3:
            yield from _projected_heads(sources, heads, head)
            continue
        if sources[0].shape[1] != 3 * width:
            yield from _fused_groups(sources[0], width, heads, head)
            continue
        blocks = sources[0].reshape(length, 3, heads, head)
        yield Laid(BLOCKS, heads), [np.ascontiguousarray(blocks[:, slot].transpose(1, 0, 2))
                                    for slot in range(3)]
        if heads > 1:
            by_head = sources[0].reshape(length, heads, 3, head)
            yield Laid(HEAD_BY_HEAD, heads), [
                np.ascontiguousarray(by_head[:, :, slot].transpose(1, 0, 2)) for slot in range(3)]


def _fused_groups(fused: np.ndarray, width: int, heads: int, head: int
                  ) -> Iterator[Tuple[Laid, List[np.ndarray]]]:
    """A fused output (L, width + 2·groups·head) as ``heads`` query heads sharing fewer
    key-value heads: as blocks [q | k | v] (Phi-3's, Falcon-7B's), or group by group, each
    group's queries, its key, its value (Falcon's new architecture), each way of sharing."""
    length = fused.shape[0]
    groups, rest = divmod(fused.shape[1] - width, 2 * head)
    if rest or not 0 < groups < heads or heads % groups:
        return
    per = heads // groups
    together = fused.reshape(length, groups, per + 2, head)
    layouts = {BLOCKS: [fused[:, :width], fused[:, width:width + groups * head],
                        fused[:, width + groups * head:]],
               f"group by group, ({groups}, {per} + 2, {head})": [
                   together[:, :, :per].reshape(length, width),
                   together[:, :, per].reshape(length, -1),
                   together[:, :, per + 1].reshape(length, -1)]}
    for arrangement, parts in layouts.items():
        for laid, slots in _projected_heads(parts, heads, head):
            yield laid._replace(arrangement=arrangement), slots


def _projected_heads(sources: Sequence[np.ndarray], heads: int, head: int
                     ) -> Iterator[Tuple[Laid, List[np.ndarray]]]:
    """Three projections' outputs as ``heads`` heads of ``head``: those of fewer columns as
    fewer key-value heads, read by query head h each way of sharing them."""
    if any(x.shape[1] % head for x in sources):
        return
    split = [np.ascontiguousarray(x.reshape(x.shape[0], -1, head).transpose(1, 0, 2))
             for x in sources]
    groups = min(x.shape[0] for x in split)
    if heads % groups:
        return
    for sharing, read in _sharings(heads, groups).items():
        index = [read(h, heads, groups) for h in range(heads)]
        yield Laid(OWN_PROJECTIONS, heads, sharing), [
            x if x.shape[0] == heads else x[index] for x in split]


def _attended(q: np.ndarray, k: np.ndarray, v: np.ndarray, positions: np.ndarray,
              scales: Sequence[str], returned: int) -> Dict[Tuple[str, bool], np.ndarray]:
    """The context at ``positions`` of an attention of q (heads, P, head) over k and v
    (heads, L, head), for each of ``scales`` of a value no earlier one has (``returned``: the
    width the output projection returns) and each mask: {(scale, causal): (P, width)}. The
    values are read once for all of them: at a wide layer's length, reading them is the
    cost."""
    scores = q @ k.transpose(0, 2, 1)
    later = np.arange(k.shape[1])[None, :] > positions[:, None]
    factors: Dict[str, float] = {}
    for name in scales:
        factor = SCORE_SCALES[name](q.shape[-1], q.shape[0] * q.shape[-1], returned)
        if not any(math.isclose(factor, earlier) for earlier in factors.values()):
            factors[name] = factor
    ways = [(name, causal) for name in factors for causal in (False, True)]
    weights = []
    for name, causal in ways:
        scaled = scores * factors[name]
        if causal:
            scaled = np.where(later, -np.inf, scaled)
        exp = np.exp(scaled - scaled.max(-1, keepdims=True))
        weights.append(exp / exp.sum(-1, keepdims=True))
    count = len(positions)
    context = np.concatenate(weights, axis=1) @ v
    return {way: context[:, i * count:(i + 1) * count].transpose(1, 0, 2).reshape(count, -1)
            for i, way in enumerate(ways)}


def _attention_sources(t: RecordInfo, width: int, holders: Sequence[str], torch_run: RunReader,
                       comparisons: Sequence[Comparison]) -> List[RecordInfo]:
    """What the attention before ``t`` reads q, k and v from: the fused projection of three
    times its ``width`` before it in the first of ``holders``' forward (or of fewer columns:
    keys and values of fewer heads, Falcon's and Phi-3's), or the three latest projections of
    its width and length before it in the first holder's, or anywhere in the next's (Hugging
    Face's BERT and ViT project q, k and v in a module beside the one holding their output
    projection), or the three latest there, one of its width and length, two alike of fewer
    columns (keys and values of fewer heads, Llama's) or of another length (a
    cross-attention's, over the encoder's output), in the order they ran. A projection whose
    output a norm takes (Qwen3's ``q_norm``) is read as that norm's output."""
    for holder, anywhere in [(holders[0], False)] + [(h, True) for h in holders[1:] if h]:
        found = _projections_before(t, holder, torch_run, comparisons, anywhere, True, True)
        normed = _normed(found, torch_run)
        fed = {r.name for r in normed.values()}
        picked = _projections_picked([r for r in found if len(r.shape) == 3 and r.name not in fed],
                                     t, width, anywhere)
        if picked:
            return [normed.get(r.name, r) for r in picked]
    return []


def _projections_picked(found: Sequence[RecordInfo], t: RecordInfo, width: int, anywhere: bool
                        ) -> List[RecordInfo]:
    """Of the projections ``found`` before ``t`` in a holder's forward (``anywhere``: in its
    modules), the latest first, those ``_attention_sources`` reads; none where none are so."""
    fused = [r for r in found if r.shape[1] == t.shape[1] and width < r.shape[2] <= 3 * width
             and (r.shape[2] - width) % 2 == 0]
    if fused and not anywhere:
        return fused[:1]
    queries = [r for r in found if tuple(r.shape[1:]) == (t.shape[1], width)]
    if len(queries) >= 3:
        return sorted(queries[:3], key=lambda r: r.order)
    latest = found[:3]
    keys = [tuple(r.shape[1:]) for r in latest if r not in queries[:1]]
    if queries and len(keys) == 2 and keys[0] == keys[1] != (t.shape[1], width) and \
            width % keys[0][1] == 0:
        return sorted(latest, key=lambda r: r.order)
    return []


def attention_computed_otherwise(t: RecordInfo, m: RecordInfo, torch_run: RunReader,
                                 ms_run: RunReader, comparisons: Sequence[Comparison]
                                 ) -> Optional[Diagnosis]:
    """An output projection ``t`` whose input differs, the projections its attention reads
    matched: see ``_computed_otherwise``."""
    out = _output_projection(t, m, torch_run)
    if out is None:
        return None
    holder = inputs.caller(t.name, torch_run)
    sources = _attention_sources(t, out.width, [holder, inputs.caller(holder, torch_run)],
                                 torch_run, comparisons)
    return _computed_otherwise(t, m, out, sources, True, torch_run, ms_run)


def context_computed_otherwise(t: RecordInfo, m: RecordInfo, torch_run: RunReader,
                               ms_run: RunReader, comparisons: Sequence[Comparison]
                               ) -> Optional[Diagnosis]:
    """A module returning its attention's context (N, L, width), computed from three
    projections of its own that matched (Hugging Face's ViTSelfAttention, BERT's): see
    ``_computed_otherwise``."""
    if len(t.shape) != 3 or tuple(t.shape) != tuple(m.shape):
        return None
    width = t.shape[2]
    outputs = _spread(OUTPUTS_MATCHED, width)
    returned = OutputProjection([np.eye(width)[:, outputs]], 0.0, width, outputs, width)
    sources = _attention_sources(t, width, [t.name], torch_run, comparisons)
    return _computed_otherwise(t, m, returned, sources, False, torch_run, ms_run)


def _computed_otherwise(t: RecordInfo, m: RecordInfo, out: OutputProjection,
                        sources: Sequence[RecordInfo], projected: bool, torch_run: RunReader,
                        ms_run: RunReader) -> Optional[Diagnosis]:
    """The attention computed again from ``sources`` at a few positions, each way, q and k
    turned by torch's rotary table where it recorded one (by each, the latest first, until
    torch's output fits a way), and ``out`` applied (``projected``: ``t``'s weights, else
    none: ``t`` returns the context), each side's output there matched against each. Where
    torch's fits none and it recorded no table, the table its forward computes itself is
    looked for. Where MindSpore's fits none, torch's ways are tried again with q and k turned
    each other way. Where torch's and MindSpore's differ in the scale alone, the head count
    alone, the turning alone, or how q, k and v are taken, that is the cause; None otherwise
    (a bias on the scores, another mask)."""
    if not sources:
        return None
    positions = _spread(RECOMPUTED_POSITIONS, t.shape[1])
    values = [torch_run.tensor(source)[0].reshape(source.shape[1], -1).astype(np.float64)
              for source in sources]
    lengths = [x.shape[0] for x in values] * (3 // len(values))     # each slot's
    tables = rotary.recorded_tables(t, torch_run) if len(set(lengths)) == 1 else []
    told = AttentionTold([source.name for source in sources], t.name, projected, out.width,
                         positions)
    orders = [order for order in ORDERS        # q of t's positions, k and v alike
              if lengths[order.index(0)] == t.shape[1]
              and lengths[order.index(1)] == lengths[order.index(2)]]

    def turned_by(table: Optional[rotary.Table]) -> Callable[[Laid, int], Turnings]:
        return lambda laid, head: [(rotary.turning(table, head), orders)]

    def fitting(ways: Sequence[Way], outputs: Sequence[np.ndarray], run: RunReader,
                record: RecordInfo) -> List[Way]:
        return _fitting(ways, outputs, run, record, positions, out.outputs, slice(0, 1))

    for table in tables or [None]:
        ways, predicted = _predicted(values, out, positions, turned_by(table))
        if any(fitting(ways, outputs, torch_run, t) for outputs in predicted):
            break
    else:       # torch's output fits no way turned by a table it recorded, or unturned
        computed = None if tables or len(set(lengths)) > 1 else _table_computed_in_forward(
            values, out, positions, orders, fitting, t, torch_run)
        if computed is None:
            return None
        table, base = computed
        told = replace(told, angles_found=" Torch's forward computes its rotary angles itself, "
                       f"no module recording them: its output fits those of base {base:.0f}.")
        ways, predicted = _predicted(values, out, positions, turned_by(table))
    for matrix, outputs in zip(out.matrices, predicted):
        torch_ways = fitting(ways, outputs, torch_run, t)
        ms_ways = fitting(ways, outputs, ms_run, m)
        if torch_ways and not ms_ways and table is not None:
            turned, [turned_outputs] = _predicted(values, replace(out, matrices=[matrix]),
                                                  positions, _turned_otherwise(torch_ways, table))
            ms_ways = fitting(turned, turned_outputs, ms_run, m)
        found = told.one_apart(torch_ways, ms_ways)
        if found is not None:
            return found
    return None


# How an attention computing its rotary angles itself commonly scales its scores.
COMPUTED_SCALE = "1/√head"


def _table_computed_in_forward(values: Sequence[np.ndarray], out: OutputProjection,
                               positions: np.ndarray, orders: Sequence[Tuple[int, ...]],
                               fitting: Callable[[Sequence, Sequence[np.ndarray], RunReader,
                                                  RecordInfo], List],
                               t: RecordInfo, torch_run: RunReader
                               ) -> Optional[Tuple[rotary.Table, float]]:
    """Where torch recorded no rotary table and its output fits no way unturned: the table
    its forward computes itself, as a common rotary would (each layout, part of a head in
    rotary.PARTS and base in rotary.BASES), the one torch's output fits closest, at the head
    count it fits by, and its base; None where it fits none (a bias on the scores, another
    mask). Torch's way is looked for as such a model's would be, q, k and v in the order
    projected, the scores scaled by COMPUTED_SCALE, key-value heads shared as repeat_kv shares
    them: every way for every table took 126 s at width 4096, keys and values of 1024
    columns, 2048 tokens; these 16 s."""
    length = values[0].shape[0]
    natural = [order for order in orders if order == (0, 1, 2)]
    tables: Dict[str, Tuple[str, int, float]] = {}      # each way said: its layout, part, base

    def turns(laid: Laid, head: int) -> Turnings:
        if laid.sharing not in ("", REPEATED):
            return []
        found = []
        for layout, part, base in product((rotary.HALVES, rotary.NEIGHBOURS), rotary.PARTS,
                                          rotary.BASES):
            if head % (2 * part) == 0:
                way = rotary.computed(length, head // part, base, layout, head)
                tables[way.said] = layout, part, base
                found.append((way, natural))
        return found

    ways, predicted = _predicted(values, out, positions, turns, (COMPUTED_SCALE,))
    fits = [fit for outputs in predicted for fit in fitting(ways, outputs, torch_run, t)]
    if not fits:
        return None
    layout, part, base = tables[fits[0].rotary]
    return rotary.computed_table(length, out.width // fits[0].heads // part, base, layout), base


ORDERS = tuple(permutations(range(3)))
# How q and k may be turned for one way of laying them out in heads, each way with the orders
# of q, k and v to try it in.
Turnings = List[Tuple[rotary.Rotary, Sequence[Tuple[int, ...]]]]


def _turned_otherwise(torch_ways: Sequence[Attending], table: rotary.Table
                      ) -> Callable[[Laid, int], Turnings]:
    """Torch's arrangements, head counts, sharings and orders of q, k and v alone, q and k
    turned each way other than torch's."""
    orders: Dict[Laid, List[Tuple[int, ...]]] = {}
    for way in torch_ways:
        taken = orders.setdefault(Laid(way.arrangement, way.heads, way.sharing), [])
        if way.order not in taken:
            taken.append(way.order)

    def turns(laid: Laid, head: int) -> Turnings:
        return [(other, orders[laid]) for other in rotary.rotations(table, head)] \
            if laid in orders else []
    return turns


def _predicted(values: Sequence[np.ndarray], out: OutputProjection, positions: np.ndarray,
               turnings: Callable[[Laid, int], Turnings],
               scales: Sequence[str] = tuple(SCORE_SCALES)
               ) -> Tuple[List[Attending], List[List[np.ndarray]]]:
    """Each way of attending over ``values`` (one sample's), q and k turned as ``turnings``
    (laid, head) says, its scores scaled each of ``scales``, computed again at ``positions``
    and projected by each of ``out``'s matrices: the ways, and for each matrix their
    outputs."""
    ways: List[Attending] = []
    predicted: List[List[np.ndarray]] = [[] for _ in out.matrices]
    for laid, slots in _heads_in_slots(values, out.width):
        for turning, orders in turnings(laid, out.width // laid.heads):
            keys: Dict[int, np.ndarray] = {}    # each slot read as k, turned once
            for order in orders:
                q, k, v = (slots[order.index(role)] for role in range(3))
                if order.index(1) not in keys:
                    keys[order.index(1)] = turning.turned(k)
                k = keys[order.index(1)]
                for (scale, causal), context in _attended(
                        turning.turned(q[:, positions], positions), k, v, positions,
                        scales, out.returned).items():
                    ways.append(Attending(laid.arrangement, order, laid.heads, scale, causal,
                                          turning.said, laid.sharing))
                    for outputs, matrix in zip(predicted, out.matrices):
                        outputs.append(context @ matrix + out.offset)
    return ways, predicted


@dataclass(frozen=True, eq=False)
class AttentionTold:
    """The diagnoses of an attention computed again from ``sources`` at ``positions``, its
    context of ``width`` returned by ``output``, or projected by it (``projected``)."""
    sources: Sequence[str]
    output: str
    projected: bool
    width: int
    positions: np.ndarray
    angles_found: str = ""      # how torch's rotary angles were found, where no module held them

    def _outputs(self) -> str:
        *rest, last = self.sources
        return f"{', '.join(rest)} and {last}'s outputs" if rest else f"{last}'s output"

    def _matched(self) -> str:
        differs = "input" if self.projected else "output"
        return f"{self._outputs()} matched, and {self.output}'s {differs} differs"

    def _how(self, way: Attending) -> str:
        mask = "with a causal mask" if way.causal else "with no mask"
        projected = f", projected by {self.output}" if self.projected else ""
        return f"Told from the attention computed again from {self._outputs()} at positions " \
            f"{', '.join(map(str, self.positions))}, {mask}: there each side's output is its " \
            f"own way's{projected}.{self.angles_found}"

    def one_apart(self, torch_ways: Sequence[Attending], ms_ways: Sequence[Attending]
                  ) -> Optional[Diagnosis]:
        """The cause where a way torch's output fits and one MindSpore's fits, under one mask,
        differ in one respect alone; None where one way fits both, or no two ways are so."""
        pairs = [(a, b) for a in torch_ways for b in ms_ways if a.causal == b.causal]
        if any(a == b for a, b in pairs):
            return None
        for differs, cause in ((("scale",), self.scaled), (("heads",), self.heads),
                               (("rotary",), self.rotated), (("sharing",), self.shared),
                               (("arrangement", "order"), self.split)):
            same = [(a, b) for a, b in pairs
                    if all(getattr(a, f.name) == getattr(b, f.name) for f in fields(Attending)
                           if f.name not in differs)]
            if same:
                return cause(*same[0])
        return None

    def _in_one_respect(self, cause: str, difference: str, torch_way: Attending, advice: str
                        ) -> Diagnosis:
        return Diagnosis(cause=cause,
                         detail=f"{self._matched()}: {difference} (q, k, v taken "
                                f"{torch_way.said(self.sources, self.width)}). "
                                f"{self._how(torch_way)} {advice}", confidence="certain")

    def scaled(self, torch_way: Attending, ms_way: Attending) -> Diagnosis:
        return self._in_one_respect(
            "attention scores scaled otherwise",
            f"torch scales q·kᵀ by {torch_way.scale}, MindSpore by {ms_way.scale}", torch_way,
            "Scale the scores as torch does.")

    def heads(self, torch_way: Attending, ms_way: Attending) -> Diagnosis:
        return self._in_one_respect(
            "attention head count differs",
            f"torch attends in {torch_way.heads} heads of {self.width // torch_way.heads}, "
            f"MindSpore in {ms_way.heads} of {self.width // ms_way.heads}", torch_way,
            "Build the port with torch's number of heads.")

    def rotated(self, torch_way: Attending, ms_way: Attending) -> Diagnosis:
        return self._in_one_respect(
            "rotary positions applied otherwise",
            f"torch {torch_way.rotary}; MindSpore {ms_way.rotary}", torch_way,
            "Rotate q and k as torch does.")

    def shared(self, torch_way: Attending, ms_way: Attending) -> Diagnosis:
        return self._in_one_respect(
            "key-value heads shared otherwise",
            f"torch's query head h reads key-value head {torch_way.sharing}; MindSpore's "
            f"{ms_way.sharing}", torch_way, "Share them as torch does.")

    def split(self, torch_way: Attending, ms_way: Attending) -> Diagnosis:
        if torch_way.arrangement == OWN_PROJECTIONS:
            return Diagnosis(cause="q, k, v read from other projections",
                             detail=f"{self._matched()}: torch takes "
                                    f"{torch_way.said(self.sources, self.width)}; MindSpore "
                                    f"{ms_way.said(self.sources, self.width)}. "
                                    f"{self._how(torch_way)}", confidence="certain")
        return Diagnosis(cause="fused projection split otherwise",
                         detail=f"{self._matched()}: torch splits the fused q, k, v "
                                f"{torch_way.said(self.sources, self.width)}; MindSpore "
                                f"{ms_way.said(self.sources, self.width)}. "
                                f"{self._how(torch_way)} Split it as torch does (timm's "
                                "attention reads [q | k | v] as blocks: reshape(n, l, 3, heads, "
                                "head)).", confidence="certain")
