"""Comparing two run directories: align, compare every pair, find the first divergence.

Divergence order is where a bug *is*, not where it shows: the input, then forward records in
execution order, the loss, gradients in backward order (last layer first), then per parameter
the update Δw, optimizer state, weight, and finally buffers (BatchNorm running statistics).
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import (Any, Dict, Hashable, Iterable, List, Mapping, NamedTuple, Optional,
                    Sequence, Set, Tuple)

import numpy as np

from parity import kinks
from parity.align import align_forward, channels_to_torch_layout, once_for_the_batch, same_order
from parity.compare import loss, optimizer, reorder, structure, sums, window
from parity.compare.diagnosis import diagnose, step_settings_differ
from parity.compare.dropping import DropMismatch, drop_mismatches
from parity.compare.measure import (AnyJob, Helper, Job, Runs, StepCheck, helper_for,
                                    measure, run_all)
from parity.compare.metrics import (Float64Noise, Tolerance, error_histogram,
                                    with_allowance, worst_elements)
from parity.compare.tolerance import TolerancePolicy
from parity.config import split_state
from parity.errors import ParityInputError, first_few
from parity.records import (CONTAINER_OPS, DROPPING_OPS, KIND_RANK, PARAM_KINDS, Comparison,
                            Divergence, Meta, RecordInfo, TensorStats, drops_between_layers,
                            Part, module_of, split_part)
from parity.resources import peak_resident_mb
from parity.result import CheckResult, RecordDetail
from parity.rundir import RunReader, SafetensorsFile, initial_weights

MAX_DETAILED = 40          # failing records that get a histogram and worst elements
# If fewer than this share of torch parameters are found in the MindSpore capture, the two
# runs are of different models, and a comparison would be meaningless.
MIN_SHARED_PARAMS = 0.5
# A record whose torch float32 error (against float64) is at least this share of its own size
# is mostly rounding: its verdict cannot tell a bug from noise, and the run says so. Measured:
# ResNet50 at the default batch 2, 64² peaks at 6.4 % (layer1.2.bn2.bias); ResNet18 at batch 2,
# 8² (BatchNorm over 2 values in layer4) has 295 records past it, the worst at 1177 %, some with
# a cosine of -1 against MindSpore, and passes.
MOSTLY_NOISE = 0.5
# A record that passed off by more than this share of its rms, and by more than noise_factor ×
# torch's own float32 error, passed by its tolerance's absolute floor (atol) alone, its values
# small against it: a bug may hide there. Correct ports stay far below: ResNet50 at the default
# has none past torch's error, the 67th round's five trial ports only their loss, 4.6e-7; OLMo 2
# at width 32, its attention's output of rms 1.3e-4, let a rotary base bug through at 2.3e-2.
FLOOR_HIDES = 1e-3
# The position read of an output one side computes for every token and the other for one: the
# class token, first (timm's class attention ``self.q(x[:, 0])``). Which one the other side
# takes is not recorded; one taking another shows in the outputs after it.
FIRST_POSITION = 0


@dataclass(frozen=True)
class Pair:
    torch: RecordInfo
    mindspore: RecordInfo
    rank: Tuple[int, float]
    # the point next to this pair each side drops at another rate (compare/dropping.py)
    dropping: Optional[DropMismatch] = None


def open_pair(run_a: Path, run_b: Path) -> Tuple[RunReader, RunReader]:
    """The two captures in (torch, mindspore) order, whichever order they were given in."""
    readers = {}
    for path in (run_a, run_b):
        reader = RunReader.open(path)
        if reader.framework in readers:
            raise ParityInputError(f"both {run_a} and {run_b} are {reader.framework} captures; "
                                   "compare one torch capture with one mindspore capture")
        readers[reader.framework] = reader
    if set(readers) != {"torch", "mindspore"}:
        raise ParityInputError(f"expected one torch and one mindspore capture, got "
                               f"{', '.join(readers)}")
    return readers["torch"], readers["mindspore"]


def _refuse_other_starting_point(torch_run: RunReader, ms_run: RunReader) -> None:
    """A MindSpore capture made from another torch capture (its --reference) than the one it
    is compared with started from other weights or another batch: every record would differ."""
    torch_start, ms_start = (run.manifest.get("fingerprint") for run in (torch_run, ms_run))
    if torch_start and ms_start and torch_start != ms_start:
        raise ParityInputError(
            f"{ms_run.path} was captured from another torch capture than {torch_run.path} (its "
            f"starting point, weights and batch, has fingerprint {ms_start}, this one's "
            f"{torch_start}); compare it with the torch capture its --reference named, or "
            f"capture MindSpore again with --reference {torch_run.path}")


def _torch_param_name(ms_name: str, param_map: Mapping[str, str]) -> Optional[str]:
    """The torch name of a MindSpore parameter's record, or of a part of one (a layer torch
    holds apart that the port fuses: ``qkv.weight.momentum_buffer[0:32]``)."""
    if ms_name in param_map:
        return param_map[ms_name]
    ms_whole, ms_part = split_part(ms_name)
    param, state = split_state(ms_whole)
    key = ms_part.of(param) if ms_part else param
    if state and key in param_map:
        whole, part = split_part(param_map[key])
        return part.of(whole + state) if part else whole + state
    return None


def _port_parts(ms_by_kind: Dict[str, List[RecordInfo]], param_map: Mapping[str, str],
                forward: Mapping[str, str]) -> Dict[str, List[RecordInfo]]:
    """The MindSpore records, each of a parameter the port fuses from torch's layers held
    apart (param_map names its parts: ``qkv.weight[0:32]``) as those parts, and each output of
    such a layer as the parts the forward alignment paired (``qkv[..., 0:32]``)."""
    parts: Dict[str, List[Part]] = {}
    for name in [*param_map, *forward]:
        whole, part = split_part(name)
        if part is not None:
            parts.setdefault(whole, []).append(part)
    if not parts:
        return ms_by_kind

    def names(record: RecordInfo) -> List[str]:
        if record.kind == "forward" or record.attrs.get("activation"):
            return [part.of(record.name) for part in parts.get(record.name, ())]
        param, state = split_state(record.name)
        return [part.of(param + state) for part in parts.get(param, ())]
    return {kind: _in_parts(records, [n for r in records for n in names(r)])
            for kind, records in ms_by_kind.items()}


def _in_parts(records: List[RecordInfo], names: Iterable[str]) -> List[RecordInfo]:
    """``records``, each whole one that ``names`` name parts of (``qkv.weight[0:32]``: a
    fused layer the port splits) as those parts, in order; a name lying outside its whole's
    shape is left out (its MindSpore record stays unmatched)."""
    parts: Dict[str, List[str]] = {}
    for name in names:
        whole, part = split_part(name)
        if part is not None:
            parts.setdefault(whole, []).append(name)
    pieces = []
    for record in records:
        for name in sorted(parts.get(record.name, ()), key=lambda n: split_part(n)[1].start):
            try:
                pieces.append(record.part_named(name))
            except ValueError:
                continue
        if record.name not in parts:
            pieces.append(record)
    return pieces


def pair_records(torch_run: RunReader, ms_run: RunReader,
                 forward_overrides: Optional[Mapping[str, str]] = None
                 ) -> Tuple[List[Pair], Dict[str, Tuple[str, ...]], Dict[str, List[str]]]:
    """All (torch, mindspore) record pairs in divergence order, what stayed unmatched, and the
    modules computing nothing left unpaired, not listed with it (per side: "torch", "mindspore")."""
    param_map = dict(ms_run.manifest.get("param_map", {}))
    torch_by_kind: Dict[str, List[RecordInfo]] = {}
    ms_by_kind: Dict[str, List[RecordInfo]] = {}
    for record in torch_run.records:
        torch_by_kind.setdefault(record.kind, []).append(record)
    for record in ms_run.records:
        ms_by_kind.setdefault(record.kind, []).append(record)

    torch_params = {r.name for r in torch_by_kind.get("weight", [])}
    ms_params = {r.name for r in ms_by_kind.get("weight", [])}
    shared = torch_params & {t for ms, t in param_map.items() if split_part(ms)[0] in ms_params}
    if torch_params and len(shared) < MIN_SHARED_PARAMS * len(torch_params):
        raise ParityInputError(
            f"{ms_run.path} was captured from a different model than {torch_run.path} "
            f"({len(shared)} of {len(torch_params)} parameters in common); capture both "
            "halves from the same model pair")

    mapping: Dict[str, Dict[str, str]] = {}
    forward = align_forward(torch_by_kind.get("forward", []), ms_by_kind.get("forward", []),
                            param_map, forward_overrides)
    mapping["forward"] = dict(forward.mindspore_to_torch)
    ms_by_kind = _port_parts(ms_by_kind, param_map, mapping["forward"])
    for kind in ("input", "loss"):
        mapping[kind] = {r.name: r.name for r in ms_by_kind.get(kind, [])}
    for kind in PARAM_KINDS:
        mapping[kind] = {}
        for record in ms_by_kind.get(kind, []):
            if record.attrs.get("activation"):      # gradient w.r.t. a module's output
                torch_name = mapping["forward"].get(record.name)
            else:
                torch_name = _torch_param_name(record.name, param_map)
            if torch_name is not None:
                mapping[kind][record.name] = torch_name

    pairs: List[Pair] = []
    unmatched: Dict[str, Tuple[str, ...]] = {}
    containers = {side: {r.name for r in by_kind.get("forward", []) if r.op in CONTAINER_OPS}
                  for side, by_kind in (("torch", torch_by_kind), ("mindspore", ms_by_kind))}
    computing_leaves = _computing_a_leaf(ms_by_kind.get("forward", []), mapping["forward"],
                                         torch_by_kind.get("forward", []))
    # modules computing nothing (an Identity, a dropout of rate 0): named in a note, not listed
    idle = {side: {r.name for r in by_kind.get("forward", []) if structure.computes_nothing(r)}
            for side, by_kind in (("torch", torch_by_kind), ("mindspore", ms_by_kind))}
    idle_left: Dict[str, List[str]] = {"torch": [], "mindspore": []}   # left unpaired
    for kind, whole_records in torch_by_kind.items():
        by_torch_name = {t: m for m, t in mapping.get(kind, {}).items()}
        ms_records = {r.name: r for r in ms_by_kind.get(kind, [])}
        at = _backward_positions(whole_records) if kind == "grad" else \
            {r.name: float(i) for i, r in enumerate(whole_records)}
        torch_records = _in_parts(whole_records, by_torch_name)
        positions = {r.name: at[split_part(r.name)[0]] for r in torch_records}
        kind_pairs = [Pair(*_read_alike(record, ms_records[by_torch_name[record.name]]),
                           (KIND_RANK[kind], positions[record.name]))
                      for record in torch_records
                      if by_torch_name.get(record.name) in ms_records]
        pairs.extend(kind_pairs)
        matched_torch = set(by_torch_name) & {r.name for r in torch_records}
        compared = {side: {(getattr(p, side).shard, getattr(p, side).key) for p in kind_pairs}
                    for side in ("torch", "mindspore")}
        left = {"torch": [r for r in torch_records if r.name not in matched_torch
                          and not _compared_container(r, containers["torch"], compared["torch"])],
                # no torch name, or a torch name torch recorded nothing under
                "mindspore": [r for r in ms_by_kind.get(kind, [])
                              if mapping.get(kind, {}).get(r.name) not in matched_torch
                              and not _compared_container(r, containers["mindspore"],
                                                          compared["mindspore"])
                              and not _of_modules(r, computing_leaves)]}
        for side, records in left.items():
            missing = tuple(r.name for r in records if not _of_modules(r, idle[side]))
            if missing:
                unmatched[f"{side} {kind}"] = missing
            if kind == "forward":
                idle_left[side].extend(r.name for r in records if r.name in idle[side])
    for kind in set(ms_by_kind) - set(torch_by_kind):
        unmatched[f"mindspore {kind}"] = tuple(r.name for r in ms_by_kind[kind])
    # a part is not its whole's tensor: the points of dropping are joined by stored tensor
    mismatches = drop_mismatches([(p.torch, p.mindspore) for p in pairs
                                  if p.torch.kind == "forward" and p.torch.part is None
                                  and p.mindspore.part is None],
                                 torch_by_kind.get("forward", []), ms_by_kind.get("forward", []))
    pairs = [dataclasses.replace(p, dropping=mismatches[p.torch.name])
             if p.torch.kind == "forward" and p.torch.name in mismatches else p for p in pairs]
    for pair in _trained_on_one_side(torch_by_kind, ms_by_kind, mapping):
        pairs.append(pair)
        for side, record in (("torch", pair.torch), ("mindspore", pair.mindspore)):
            key = f"{side} {record.kind}"
            unmatched[key] = tuple(n for n in unmatched.get(key, ()) if n != record.name)
            if not unmatched[key]:
                del unmatched[key]
    pairs.sort(key=lambda p: p.rank)
    return pairs, unmatched, idle_left


def _of_modules(record: RecordInfo, modules: Set[str]) -> bool:
    """Whether ``record`` is the output of one of ``modules``, or that output's gradient."""
    return record.name in modules and (record.kind == "forward" or
                                       bool(record.attrs.get("activation")))


def _compared_container(record: RecordInfo, containers: Set[str],
                        compared: Set[Tuple[str, str]]) -> bool:
    """Whether ``record`` is a container's output (or gradient) stored as a compared record's
    tensor. A capture stores a tensor once for all its names, and a container's output is its
    last module's (torchvision's Conv2dNormActivation's is its ReLU6's): a container the other
    side has no counterpart for is compared all the same, under that module's name."""
    return record.name in containers and (record.shard, record.key) in compared


def _computing_a_leaf(ms_forward: Sequence[RecordInfo], forward: Mapping[str, str],
                     torch_forward: Sequence[RecordInfo]) -> Set[str]:
    """The MindSpore cells recorded inside a cell paired with a torch module that records
    nothing inside it, before that cell's output: the port's way of computing that one module
    (mindcv's Swish, a cell multiplying by the output of a Sigmoid cell it holds, for torch's
    SiLU), compared as that cell's output. Listed, those Sigmoids were 49 unmatched records of
    EfficientNet-B0. A cell recorded after it (nn.Dense's activation, recorded apart from the
    layer's output before it) is an operation of its own. A cell holding paired cells is no
    such way, though paired with a leaf: T5's port, its wrapper paired with the dropout
    torch's ends at (torch's wrapper returning a model output), hid every cell inside it that
    torch has no counterpart for."""
    holding = {".".join(parts[:end]) for parts in (r.name.split("#")[0].split(".")
                                                   for r in torch_forward)
               for end in range(1, len(parts))}          # torch modules recording inside
    orders = {r.name: r.order for r in ms_forward}
    inner: Dict[str, List[str]] = {}
    for record in ms_forward:
        parts = record.name.split("#")[0].split(".")
        cell = next((".".join(parts[:end]) for end in range(len(parts) - 1, 0, -1)
                     if ".".join(parts[:end]) in forward), None)
        if cell is not None and record.order < orders.get(cell, -1) and \
                forward[cell].split("#")[0] not in holding:
            inner.setdefault(cell, []).append(record.name)
    return {name for names in inner.values() if not any(n in forward for n in names)
            for name in names}


def _read_alike(torch_record: RecordInfo, ms_record: RecordInfo
                ) -> Tuple[RecordInfo, RecordInfo]:
    """The two records of a pair, read alike: MindSpore's in torch's shape where the two hold
    as many values in the same order (align.py pairs such outputs; a pair of one name, its
    first dimension merged on one side too: Hugging Face's OPT runs each decoder layer's
    final_layer_norm, fc1 and fc2 on its tokens flattened, (N·L, D), and its correct port
    failed them, "shape differs"); a module output one side
    computes once for the batch, (1, ...), and the other for each of N samples, (N, ...),
    with its one copy broadcast to N, and the gradient of the N copies summed into one (timm's
    XCiT computes its position encoding once, mindcv's for each sample; timm's ConViT
    expands its relative positions to the batch, mindcv's broadcasts: they failed, "shape
    differs"); an output one side computes for every token and the other for one, at the
    first token (at_position). As they are otherwise."""
    t_shape, m_shape = torch_record.shape, ms_record.shape
    if t_shape == m_shape:
        return torch_record, ms_record
    if same_order(m_shape, t_shape, first_merged=torch_record.name == ms_record.name):
        return torch_record, ms_record.viewed_as(t_shape)
    output = torch_record.kind == "forward" or bool(torch_record.attrs.get("activation"))
    every_in_the_port = _axis_left_out(t_shape, m_shape) if output else None
    if every_in_the_port is not None:
        return torch_record, ms_record.at_position(every_in_the_port, FIRST_POSITION)
    every_in_torch = _axis_left_out(m_shape, t_shape) if output else None
    if every_in_torch is not None:
        return torch_record.at_position(every_in_torch, FIRST_POSITION), ms_record
    in_torch_layout = channels_to_torch_layout(t_shape, m_shape) if output else None
    if in_torch_layout is not None:
        return torch_record, ms_record.transposed(in_torch_layout)
    if not output or not once_for_the_batch(t_shape, m_shape):
        return torch_record, ms_record
    torch_once = t_shape[0] == 1
    if torch_record.kind == "forward":
        return (torch_record.broadcast_to(m_shape[0]), ms_record) if torch_once else \
            (torch_record, ms_record.broadcast_to(t_shape[0]))
    return (torch_record, ms_record.summed_over_batch()) if torch_once else \
        (torch_record.summed_over_batch(), ms_record)


def _axis_left_out(shape: Sequence[int], larger: Sequence[int]) -> Optional[int]:
    """The one axis past the batch's without which ``larger`` is ``shape`` (none where two are,
    as (2, 8) of (2, 8, 8))."""
    if len(larger) != len(shape) + 1:
        return None
    axes = [axis for axis in range(1, len(larger))
            if tuple(larger[:axis]) + tuple(larger[axis + 1:]) == tuple(shape)]
    return axes[0] if len(axes) == 1 else None


def _trained_on_one_side(torch_by_kind: Dict[str, List[RecordInfo]],
                         ms_by_kind: Dict[str, List[RecordInfo]],
                         mapping: Dict[str, Dict[str, str]]) -> List[Pair]:
    """A parameter trained on one side (a ``weight`` record) and frozen on the other (a
    ``buffer``: requires_grad False): the values after the step are paired, and the pair fails
    whatever they say (compare/structure.py). Left unpaired, both would only be listed as
    unmatched, and the run would pass."""
    pairs = []
    for torch_kind, ms_kind in (("weight", "buffer"), ("buffer", "weight")):
        same_kind = set(mapping.get(torch_kind, {}).values())
        ms_records = {r.name: r for r in ms_by_kind.get(ms_kind, [])}
        by_torch_name = {t: ms_records[m] for m, t in mapping.get(ms_kind, {}).items()
                         if m in ms_records}
        for index, record in enumerate(torch_by_kind.get(torch_kind, [])):
            if record.name not in same_kind and record.name in by_torch_name:
                pairs.append(Pair(record, by_torch_name[record.name],
                                  (KIND_RANK[torch_kind], float(index))))
    return pairs


def _backward_positions(grads: List[RecordInfo]) -> Dict[str, float]:
    """Where each gradient appears in the backward pass, so the first divergent one is the
    one nearest its cause.

    Output gradients are captured in backward order; a parameter's gradient comes right after
    its module's output gradient. Without output gradients, parameters count backwards.
    """
    positions = {r.name: float(i) for i, r in enumerate(grads) if r.attrs.get("activation")}
    params = [r for r in grads if not r.attrs.get("activation")]
    for index, record in enumerate(params):
        module = record.name.rpartition(".")[0]
        calls = [positions[n] for n in (module, f"{module}#0") if n in positions]
        positions[record.name] = (max(calls) + 0.5) if calls else \
            float(len(grads) + len(params) - index)
    return positions


class _Planned(NamedTuple):
    """A pair to compare; ``first`` when no earlier pair has the same bytes, noise, tolerance."""

    pair: Pair
    tolerance: Tolerance
    noise: Optional[Float64Noise]
    identity: Tuple
    first: bool


def _float64_noise(record: RecordInfo) -> Optional[Float64Noise]:
    """Torch's float32 error: the larger of its two draws, its distance from the float64
    rerun and from the rerounded reruns (a run captured before those has the first)."""
    if record.fp32_noise_rms is None or record.exact_rms is None:
        return None
    return Float64Noise(max(record.fp32_noise_rms, record.fp32_spread_rms or 0.0),
                        record.exact_rms,
                        of_whole=record.part is not None or record.position is not None
                        or record.rows is not None)


def _comparison(pair: Pair, order: int, stats: TensorStats,
                tolerance: Tolerance) -> Comparison:
    return Comparison(**stats.__dict__, name=pair.torch.name, kind=pair.torch.kind,
                      shape=tuple(pair.torch.shape), rtol=tolerance.rtol, atol=tolerance.atol,
                      min_cosine=tolerance.min_cosine, noise_factor=tolerance.noise_factor,
                      order=order, mindspore_name=pair.mindspore.name)


def _failed(comparison: Comparison, reason: str) -> Comparison:
    """``comparison`` failing, ``reason`` added to whatever it already gave."""
    return dataclasses.replace(comparison, passed=False, reason="; ".join(
        r for r in (comparison.reason, reason) if r))


def _structure_checked(pair: Pair, comparison: Comparison) -> Comparison:
    """A pair that fails whatever its numbers (compare/structure.py)."""
    reason = structure.violation(pair.torch, pair.mindspore) or \
        (pair.dropping.reason() if pair.dropping else "")
    return _failed(comparison, reason) if reason else comparison


def _detail(torch_value: np.ndarray, ms_value: np.ndarray) -> RecordDetail:
    counts, edges = error_histogram(torch_value, ms_value)
    return RecordDetail(histogram_counts=tuple(int(c) for c in counts),
                        histogram_edges=tuple(float(e) for e in edges),
                        worst=tuple(worst_elements(torch_value, ms_value)))


def _observer_note(check: Dict[str, Any], framework: str) -> str:
    if not check:
        return f"{framework}: observer-effect check not run"
    unsteady = check.get("unsteady") or {"count": 0}
    apart = "" if not unsteady["count"] else \
        (f"; {unsteady['count']} others differ, e.g. {', '.join(unsteady['differing'][:3])}: "
         f"{unsteady['cause']}")
    if not check["differing_count"]:
        return (f"{framework}: hooks change nothing — loss, gradients and updated weights are "
                f"bit-identical to a hook-free step "
                f"({check['checked'] - unsteady['count']} tensors{apart})")
    what = "the step is not deterministic (two hook-free steps differ)" \
        if not check["deterministic"] else "the hooks changed the numbers"
    return (f"{framework}: {what}: {check['differing_count']} of {check['checked']} tensors "
            f"differ from a hook-free step, e.g. {', '.join(check['differing'][:3])}{apart}")


def _grad_positions(plan: List[_Planned]) -> Dict[str, float]:
    return {p.pair.torch.name: p.pair.rank[1] for p in plan if p.pair.torch.kind == "grad"}


def _flip_sites(plan: List[_Planned], kink_ops: Dict[Tuple, str],
                flipped: Dict[Tuple, np.ndarray], torch_run: RunReader
                ) -> Tuple[List[kinks.FlipSite], int]:
    """The ReLU records with units flipped by float32 noise whose output gradient torch
    recorded (without it the redirected gradient cannot be measured, and nothing is allowed).
    Units torch's own float32 step flipped too (at a kink its float64 rerun did not replay:
    capture/masks.py) are in its float32 error: they count for nothing. Also returns the bytes
    read."""
    grads = {p.pair.torch.name: p.pair.torch for p in plan if p.pair.torch.kind == "grad"}
    positions = _grad_positions(plan)
    sites, read = [], 0
    for planned in plan:
        record = planned.pair.torch
        units = flipped.get(planned.identity)
        if units is None or record.kind != "forward" or record.op not in kinks.ACTIVE \
                or record.name not in grads:
            continue
        beyond = np.setdiff1d(units, np.asarray(record.fp32_flipped or (), dtype=np.int64))
        share = 0.0
        if beyond.size:
            output, grad = torch_run.tensor(record), torch_run.tensor(grads[record.name])
            share = kinks.redirected_share(kink_ops[planned.identity], output, grad, beyond)
            read += output.nbytes + grad.nbytes
        sites.append(kinks.FlipSite(record.name, int(units.size), share,
                                    positions[record.name]))
    return sites, read


GRADIENT_SIDE = ("grad", "update", "optimizer_state", "weight")
# What an allowance may pass once it failed: the gradient side (flipped units, cancelling sums)
# and the loss (its logits)
EXCUSABLE = (*GRADIENT_SIDE, "loss")


def _allow_for_flips(plan: List[_Planned], comparisons: List[Comparison],
                     sites: List[kinks.FlipSite]) -> List[Comparison]:
    """Gradient-side records behind flipped ReLU units judged again with their allowance."""
    positions = _grad_positions(plan)
    # a container's output gradient is its last child's (a Bottleneck's is its last ReLU's):
    # one tensor, so it sits where that child's does, after the flips behind the ReLU, not
    # before them
    earliest: Dict[Tuple, float] = {}
    for planned in plan:
        if planned.pair.torch.kind == "grad":
            earliest[planned.identity] = min(earliest.get(planned.identity, np.inf),
                                             planned.pair.rank[1])
    judged = []
    for planned, comparison in zip(plan, comparisons):
        name = split_state(comparison.name)[0]
        position = earliest[planned.identity] if comparison.kind == "grad" else \
            positions.get(name, -1.0)
        allowance = kinks.allowance(sites, position) \
            if comparison.kind in GRADIENT_SIDE and planned.noise is not None else 0.0
        if allowance:
            comparison = with_allowance(comparison, planned.noise, planned.tolerance, allowance,
                                        flip_allowance=allowance)
        judged.append(comparison)
    return judged


def _rows_in_another_order(plan: List[_Planned], comparisons: List[Comparison], runs: Runs
                           ) -> Tuple[List[Comparison], Dict[str, str], int]:
    """Failing outputs (and their gradients) holding torch's rows in another order, or among
    more rows than torch's, judged again on the rows both hold, in torch's order, where a module
    enclosing them puts them back (the nearest whose output is compared as it stands); those
    holding some of torch's rows alone, only where that module matches torch's (the port
    routing otherwise computes fewer). Mixtral's experts take their tokens in the order
    ``torch.where`` lists them, (slot, token); a port listing them by (token, slot), or running
    each expert on every token, failed each expert's every record, its layer's output matching.
    Also returns the forward records so judged, each with the module putting its rows back,
    and the bytes read."""
    judged, orders, read = list(comparisons), {}, 0
    for kind in ("forward", "grad"):
        for index, (planned, comparison) in enumerate(zip(plan, comparisons)):
            t, m = planned.pair.torch, planned.pair.mindspore
            if comparison.passed or comparison.kind != kind or \
                    any((t.stored_shape, m.stored_shape, t.batch_read, m.batch_read)):
                continue
            if kind == "forward" and _rows_may_differ(t, m):
                a, b = runs.torch.tensor(t), runs.mindspore.tensor(m)
                read += a.nbytes + b.nbytes
                orders[t.name] = (None, reorder.rows_taken(a, b)) if len(a) <= len(b) else \
                    (reorder.rows_taken(b, a), None)
            torch_rows, ms_rows = orders.get(t.name, (None, None))
            if torch_rows is not None:
                t = t.rows_taken(torch_rows)
            elif ms_rows is not None:
                m = m.rows_taken(ms_rows)
            if t.shape != m.shape:
                continue        # as it was, or a gradient of another shape
            again, bytes_read = _judged_again(planned, comparison, t, m, runs,
                                              reorder.ROWS_TAKEN)
            read += bytes_read
            if again.passed:
                judged[index] = again
    reordered = {new.name for new, old in zip(judged, comparisons)
                 if new.kind == "forward" and new.passed and not old.passed}
    enclosing = {name: _enclosing(name, reordered, judged) for name in reordered}
    put_back = {name: module_of(outputs[0].name.partition("#")[0])
                for name, outputs in enclosing.items() if outputs and (
        all(c.passed for c in outputs) or orders[name][0] is None)}
    judged = [new if new.name in put_back else old for new, old in zip(judged, comparisons)]
    return judged, {c.name: put_back[c.name] for c in judged
                    if c.kind == "forward" and c.name in put_back}, read


def _judged_again(planned: _Planned, comparison: Comparison, t: RecordInfo, m: RecordInfo,
                  runs: Runs, reason: str) -> Tuple[Comparison, int]:
    """``planned``'s pair compared again as ``t`` and ``m`` read it, giving ``reason``; and the
    bytes read."""
    noise = _float64_noise(t) if planned.noise is not None else None
    measured, _ = measure(runs, Job(t, m, planned.tolerance, noise))
    return _structure_checked(planned.pair, dataclasses.replace(
        _comparison(planned.pair, comparison.order, measured.stats, planned.tolerance),
        reason=reason)), measured.bytes_read


def _positions_kept(plan: List[_Planned], comparisons: List[Comparison], runs: Runs
                    ) -> Tuple[List[Comparison], List[str], int]:
    """Failing outputs one side computes at more positions along an axis than the other, the
    other's a window of them, judged again with their gradients on that window, where the
    longer side's gradient is zero outside it: nothing after the module reads the rest (Hugging
    Face's Mamba cuts its causal conv's output to its first L positions, a port pads its input
    on the left alone; compare/window.py). Also returns the outputs so judged and the bytes
    read."""
    judged, kept, read = list(comparisons), [], 0
    grads = {c.name: index for index, c in enumerate(comparisons) if c.kind == "grad"}
    for index, (planned, comparison) in enumerate(zip(plan, comparisons)):
        t, m = planned.pair.torch, planned.pair.mindspore
        grad = grads.get(comparison.name)
        if comparison.passed or comparison.kind != "forward" or grad is None or \
                any((t.stored_shape, m.stored_shape, t.batch_read, m.batch_read)):
            continue
        torch_longer = window.differing_axis(t.shape, m.shape) is not None
        if not torch_longer and window.differing_axis(m.shape, t.shape) is None:
            continue
        a, b = runs.torch.tensor(t), runs.mindspore.tensor(m)
        read += a.nbytes + b.nbytes
        found = window.window(a, b) if torch_longer else window.window(b, a)
        grad_pair = plan[grad].pair
        longer_grad = grad_pair.torch if torch_longer else grad_pair.mindspore
        if found is None or tuple(longer_grad.shape) != tuple((t if torch_longer else m).shape):
            continue
        axis, start = found
        stop = start + min(a.shape[axis], b.shape[axis])
        gradient = (runs.torch if torch_longer else runs.mindspore).tensor(longer_grad)
        read += gradient.nbytes
        if not window.thrown_away(gradient, axis, start, stop - start):
            continue
        for at in (index, grad):
            pair = plan[at].pair
            t, m = pair.torch, pair.mindspore
            if torch_longer:
                t = t.positions_kept(axis, start, stop)
            else:
                m = m.positions_kept(axis, start, stop)
            again, bytes_read = _judged_again(plan[at], comparisons[at], t, m, runs,
                                              window.WINDOW_KEPT)
            read += bytes_read
            if again.passed:
                judged[at] = again
        if judged[index].passed:
            kept.append(comparison.name)
    return judged, kept, read


def _rows_may_differ(t: RecordInfo, m: RecordInfo) -> bool:
    """Whether the two outputs may hold the same rows in another order, or one's among more:
    of one shape, their module's first input holding the same values in some order (its norm
    and sum of magnitudes agreeing), or of shapes differing in their first axis alone."""
    if tuple(t.shape) == tuple(m.shape):
        sums = reorder.sums_difference(t, m)
        return sums is not None and sums <= reorder.SAME_SUMS
    return len(t.shape) == len(m.shape) >= 2 and tuple(t.shape[1:]) == tuple(m.shape[1:])


def _enclosing(name: str, reordered: Set[str], comparisons: Sequence[Comparison]
               ) -> List[Comparison]:
    """The outputs of the nearest module enclosing ``name``'s whose output is compared and not
    read in another order (where its rows are put back); none at the top level."""
    parts = module_of(name.partition("#")[0]).split(".")
    for end in range(len(parts) - 1, 0, -1):
        outputs = [c for c in comparisons if c.kind == "forward"
                   and module_of(c.name.partition("#")[0]) == ".".join(parts[:end])]
        if outputs and not any(c.name in reordered for c in outputs):
            return outputs
    return []


def _judge_cancelling_sums(plan: List[_Planned], comparisons: List[Comparison],
                           torch_run: RunReader, ms_run: RunReader,
                           initial: Optional[SafetensorsFile]
                           ) -> Tuple[List[Comparison], int]:
    """Failing gradients that are sums over batch and space (a BatchNorm's, GroupNorm's or
    LayerNorm's weight and bias, a conv's or dense layer's bias; their updates, momentum
    buffers and updated values) judged again with their output gradient's float32 error (plus
    its ReLU-flip allowance) carried through the sum they are; the gradient must then be the sum
    of MindSpore's own terms (compare/sums.py). Also returns the bytes read."""
    config = torch_run.manifest.get("config", {})
    pairs = {(p.pair.torch.kind, p.pair.torch.name, bool(p.pair.torch.attrs.get("activation"))):
             p.pair for p in plan}
    ops = {p.pair.torch.name: p.pair.torch.op for p in plan if p.pair.torch.kind == "forward"}

    flips = {c.name: c.flip_allowance for c in comparisons if c.kind == "grad"}
    if initial is None:
        return comparisons, 0
    read = 0

    def terms(run: RunReader, module: str, role: str, axis: int, side: str) -> np.ndarray:
        nonlocal read
        output_grad = run.tensor(getattr(pairs[("grad", module, True)], side))
        output = run.tensor(getattr(pairs[("forward", module, False)], side)) \
            if role == "weight" else None
        read += output_grad.nbytes + (output.nbytes if output is not None else 0)
        return sums.terms(output_grad, output, initial[f"{module}.weight"],
                          initial[f"{module}.bias"], role, axis)

    allowed: Dict[str, float] = {}          # per parameter: the error allowed in its gradient
    judged = []
    for planned, comparison in zip(plan, comparisons):
        param, state = split_state(comparison.name)
        module, _, role = param.rpartition(".")
        # a gradient error δ is δ in SGD's momentum buffer and lr·δ in its update and updated
        # weight (its first step is linear in the gradient); (1 - β1)·δ in Adam's exp_avg. What
        # else Adam makes of the gradient is judged by its step (_judge_steps).
        scale = _linear_in_gradient(comparison.kind, state, config)
        output = pairs.get(("grad", module, True))
        axis = sums.summed_axis(ops.get(module, ""), role)
        # one number per index of that axis, summed over a batch at least (a LayerNorm over
        # several trailing axes keeps more than one axis: not judged as a sum)
        if comparison.passed or planned.noise is None or not planned.noise.exact_rms \
                or comparison.kind not in GRADIENT_SIDE or scale is None \
                or axis is None or output is None \
                or not output.torch.fp32_noise_rms or not output.torch.exact_rms \
                or not {f"{module}.weight", f"{module}.bias"} <= set(initial) \
                or len(output.torch.shape) < 2 \
                or initial[param].size != output.torch.shape[axis]:
            judged.append(comparison)
            continue
        if param not in allowed:
            error = output.torch.fp32_noise_rms / output.torch.exact_rms + flips.get(module, 0.0)
            allowed[param] = sums.allowed_error(terms(torch_run, module, role, axis, "torch"),
                                                error, axis)
        allowance = scale * allowed[param] / (
            planned.noise.exact_rms * np.sqrt(np.prod(comparison.shape)))
        comparison = with_allowance(comparison, planned.noise, planned.tolerance,
                                    comparison.flip_allowance + allowance,
                                    sum_allowance=allowance)
        # the port's sum is read along torch's axis: in another layout (an output of another
        # shape), not at all (it stopped the compare, "operands could not be broadcast")
        if comparison.kind == "grad" and output.mindspore.shape == output.torch.shape:
            off = sums.off_own_sum(ms_run.tensor(planned.pair.mindspore),
                                   terms(ms_run, module, role, axis, "mindspore"), axis)
            if off > 1:
                comparison = _failed(comparison, sums.reason(off))
        judged.append(comparison)
    return judged, read


def _linear_in_gradient(kind: str, state: str, config: Mapping[str, Any]) -> Optional[float]:
    """What a gradient-side record of ``kind`` (optimizer ``state``) is the gradient times,
    or None where the step makes more of it."""
    if kind == "grad":
        return 1.0
    if optimizer.is_adam(config):
        return 1 - float(config.get("beta1", 0.0)) if state == ".exp_avg" else None
    return -optimizer.sgd_scale(config) if kind in ("update", "weight") else 1.0


def _allow_for_the_logits(plan: List[_Planned], comparisons: List[Comparison],
                          torch_run: RunReader, ms_run: RunReader) -> List[Comparison]:
    """A failing loss that is, on each side, the cross entropy of that side's own logits judged
    again with the two logits' losses apart allowed (compare/loss.py): the logits are judged at
    their own record. ResNet18 at batch 2, 16² failed the correct port at its loss alone: its
    logits 13 % apart, within torch's own float32 error of 10 %, its loss 0.8 % apart, against
    torch's float32 error there of 0.07 %, by chance that small."""
    index = next((i for i, c in enumerate(comparisons) if c.kind == "loss"), None)
    if index is None or comparisons[index].passed or plan[index].noise is None \
            or not plan[index].noise.exact_rms:
        return comparisons
    found = loss.losses_of_own_logits(torch_run, ms_run)
    if found is None:
        return comparisons
    planned, comparison = plan[index], comparisons[index]
    allowance = found.gap / planned.noise.exact_rms
    judged = list(comparisons)
    judged[index] = with_allowance(comparison, planned.noise, planned.tolerance,
                                   comparison.allowance + allowance, logits_allowance=allowance)
    return judged


def _step_checks(plan: List[_Planned], config: Mapping[str, Any],
                 weights: Optional[SafetensorsFile]) -> Dict[int, StepCheck]:
    """Per update record (by plan index), and Adam's exp_avg_sq, the check of MindSpore's
    against torch's step of MindSpore's own gradient (compare/optimizer.py), where the initial
    weights, the step settings and that gradient are at hand."""
    settings = ("eps", "beta2") if optimizer.is_adam(config) else ("momentum",)
    if not {"lr", "weight_decay", *settings} <= set(config) or weights is None:
        return {}
    grads = {p.pair.torch.name: p.pair.mindspore for p in plan
             if p.pair.torch.kind == "grad" and not p.pair.torch.attrs.get("activation")}
    checks = {}
    for index, p in enumerate(plan):
        checked = _checked_step(p.pair.torch.name, p.pair.torch.kind)
        if checked and p.pair.torch.kind != "weight" and checked[0] in grads \
                and split_part(checked[0])[0] in weights:
            checks[index] = StepCheck(p.pair.mindspore, grads[checked[0]], checked[0],
                                      dict(config))
    return checks


def _checked_step(name: str, kind: str) -> Optional[Tuple[str, str]]:
    """The parameter and the step check ("update" or "exp_avg_sq") a record's verdict follows:
    an update's and updated weight's the update's, Adam's exp_avg_sq its own; None for others.
    A part's (``qkv.weight.exp_avg_sq[0:32]``) is that part of its parameter's."""
    param, state = split_state(name)
    if state == ".exp_avg_sq":
        return param, "exp_avg_sq"
    return (param, "update") if kind in ("update", "weight") else None


def _judge_steps(plan: List[_Planned], comparisons: List[Comparison],
                 errors: Mapping[int, float], config: Mapping[str, Any]
                 ) -> Tuple[List[Comparison], List[str]]:
    """An update (or Adam's exp_avg_sq) that is not torch's step of MindSpore's own gradient
    fails. Adam's update, updated weight and exp_avg_sq that differ from torch's more than
    float32 noise allows pass where that step holds and the parameter's gradient passed: Adam
    turns a gradient's float32 noise near zero into as much as ±lr (compare/optimizer.py).
    Also returns the names of the records so passed."""
    judged = list(comparisons)
    by_step = {}
    for index, error in errors.items():
        checked = _checked_step(plan[index].pair.torch.name, plan[index].pair.torch.kind)
        by_step[checked] = error
        if error > 1:
            judged[index] = _failed(judged[index], optimizer.reason(error, config, checked[1]))
    if not optimizer.is_adam(config):
        return judged, []
    grad_passed = {c.name for p, c in zip(plan, comparisons) if c.kind == "grad" and c.passed
                   and not p.pair.torch.attrs.get("activation")}
    stepped = []
    for index, comparison in enumerate(judged):
        checked = _checked_step(comparison.name, comparison.kind)
        error = by_step.get(checked)
        if comparison.passed or error is None or error > 1 or checked[0] not in grad_passed \
                or comparison.nan_torch + comparison.nan_mindspore + comparison.inf_torch \
                + comparison.inf_mindspore or structure.violation(
                    plan[index].pair.torch, plan[index].pair.mindspore):
            continue
        judged[index] = dataclasses.replace(comparison, passed=True, reason="")
        stepped.append(f"{comparison.name} · {comparison.kind}")
    return judged, stepped


def _floor_note(floored: List[Comparison]) -> str:
    """Records let through by their tolerance's absolute floor alone, the earliest named."""
    earliest = min(floored, key=lambda c: c.order)
    share = _share(earliest.ms_error) if earliest.ms_error >= 0.1 else \
        f"{100 * earliest.ms_error:.2g} % of"
    many = f"{len(floored)} records passed" if len(floored) > 1 else "1 record passed"
    return (f"{many} by their tolerance's absolute floor alone (atol), MindSpore off by more "
            f"than {FLOOR_HIDES:g} of their rms and more than their noise factor times torch's "
            f"own float32 error, their values small against atol: the earliest, "
            f"{earliest.name} · {earliest.kind}, by {share} its rms of "
            f"{earliest.ref_rms:.2g} (atol {earliest.atol:g}). A bug may hide there, shown only "
            "where a norm scales it up; a lower atol (--tolerance FILE.toml) judges them")


def _noise_note(noisy: List[Comparison]) -> str:
    """Records torch itself computes mostly as rounding: checked, but blind to bugs that size."""
    worst = max(noisy, key=lambda c: c.fp32_noise)
    cause = ("BatchNorm over few values (a small batch or image) does this; a larger "
             "--batch-size or --image-size checks")
    # a value that is zero but for rounding (the gradient of a bias a BatchNorm cancels) is
    # its own error many times over: 68619174133 % was written
    zero = " A value many times smaller than its own error is zero but for rounding (the " \
        "gradient of a bias just before a BatchNorm, which cancels it)." \
        if worst.fp32_noise >= 10 else ""
    if len(noisy) == 1:
        return (f"{worst.name} · {worst.kind} is mostly float32 rounding in torch itself: its "
                f"own float32 error is {_share(worst.fp32_noise)} its size (from "
                f"{100 * MOSTLY_NOISE:.0f} % on, a record is told so), so its verdict cannot tell "
                f"a bug from noise.{zero} {cause} it")
    counts = Counter(c.kind for c in noisy)
    kinds = ", ".join(f"{counts[kind]} {kind}" for kind in KIND_RANK if counts[kind])
    return (f"{len(noisy)} records ({kinds}) are mostly float32 rounding in torch itself: its "
            f"own float32 error is {100 * MOSTLY_NOISE:.0f} % of their size or more (worst "
            f"{worst.name} · {worst.kind}, {_share(worst.fp32_noise)} its size), so their "
            f"verdicts cannot tell a bug from noise.{zero} {cause} them")


def _share(ratio: float) -> str:
    return f"{100 * ratio:.0f} % of" if ratio < 10 else f"{ratio:.2g} times"


def _flip_note(sites: List[kinks.FlipSite], comparisons: List[Comparison]) -> str:
    units = sum(s.units for s in sites)
    where = first_few([f"{s.name} ({s.units})" for s in sites])
    widest = max(c.flip_allowance for c in comparisons)
    what = (f"The gradient passed on one side and blocked on the other is allowed for in the "
            f"gradients before them (up to {100 * widest:.2g} % relative error): a bug in the "
            "backward pass smaller than that is not seen in this run (the optimizer step is "
            "checked apart); another --seed checks it again") \
        if widest else ("torch's own float32 step flipped the same units against float64: "
                        "their effect is in its float32 error, nothing more is allowed")
    return (f"{units} ReLU unit{'s' if units > 1 else ''} changed sign within float32 noise: "
            f"{where}. {what}")


def _adam_note(stepped: List[str], config: Mapping[str, Any]) -> str:
    return (f"{len(stepped)} record{'s' if len(stepped) > 1 else ''} of {optimizer.name(config)}'s "
            f"step ({first_few(stepped)}) differ from torch's by more than float32 noise allows "
            f"and pass: each is torch's {optimizer.name(config)} step of MindSpore's own gradient "
            "to float32 rounding, and that gradient passed. Adam's first update is nearly "
            "-lr·sign(gradient): a gradient within float32 noise of zero moves it by up to lr")


def _checked_in_passing_pairs(unmatched: Dict[str, Tuple[str, ...]], plan: List[_Planned],
                              comparisons: List[Comparison], runs: Tuple[RunReader, RunReader]
                              ) -> Tuple[Dict[str, Tuple[str, ...]], List[str]]:
    """``unmatched`` without the module outputs (and their gradients) stored as the tensor of a
    pair that passed, and those records' names (side first): a module one side runs in a
    module's forward, the other as a module of its own, is checked in that pair. torchvision's
    Inception3 applies ReLU in BasicConv2d's forward, mindcv's holds a ReLU cell in each: 94
    were listed. Dropping modules are not: compare/dropping.py judges them. The diagnosis of a
    pair that fails still reads them all (an extra ReLU inside a container)."""
    passed = {(side, getattr(p.pair, side).shard, getattr(p.pair, side).key)
              for p, c in zip(plan, comparisons) if c.passed for side in ("torch", "mindspore")}
    kept: Dict[str, Tuple[str, ...]] = {}
    checked: List[str] = []
    for run in runs:
        records = {(r.kind, r.name): r for r in run.records}
        for kind in ("forward", "grad"):
            key = f"{run.framework} {kind}"
            for name in unmatched.get(key, ()):
                record = records[(kind, name)]
                forward = records.get(("forward", name))
                if (run.framework, record.shard, record.key) in passed and \
                        (kind == "forward" or record.attrs.get("activation")) and \
                        forward is not None and forward.op not in DROPPING_OPS:
                    if kind == "forward":
                        checked.append(f"{run.framework} {name}")
                else:
                    kept[key] = kept.get(key, ()) + (name,)
    kept.update({k: v for k, v in unmatched.items() if k.split()[1] not in ("forward", "grad")})
    return kept, checked


def _map_entries_naming_no_record(overrides: Mapping[str, str], torch_run: RunReader,
                                  ms_run: RunReader) -> List[str]:
    """Entries of a --map whose MindSpore name is no record or parameter of the MindSpore run,
    or whose PyTorch name is none of the torch run's."""
    def names(run: RunReader) -> set:
        return {name for record in run.records if record.kind in ("forward", "weight", "buffer")
                for name in (record.name, record.name.partition("#")[0])}
    param_map = ms_run.manifest.get("param_map", {})
    ms_names, torch_names = names(ms_run) | set(param_map), names(torch_run)
    return [f"{ms_name} = {torch_name}" for ms_name, torch_name in overrides.items()
            if ms_name not in ms_names or torch_name not in torch_names]


def compare_runs(run_a: Path, run_b: Path, *, policy: Optional[TolerancePolicy] = None,
                 forward_overrides: Optional[Mapping[str, str]] = None,
                 command: str = "", use_fp64_reference: bool = True,
                 helper: Optional[Helper] = None) -> CheckResult:
    """Compare a torch capture with a MindSpore capture (given in either order).

    ``helper``: compare's helper process (``measure.start_helper()``) started earlier, while
    the captures ran, so that its start-up is over; it is used, and ended, when the runs are
    worth one. Without it one is started here when they are."""
    started = time.perf_counter()
    torch_run, ms_run = open_pair(Path(run_a), Path(run_b))
    # started before the pairing, which its start-up overlaps
    with helper_for(torch_run, ms_run, helper) as helper:
        return _compare(torch_run, ms_run, helper, started, policy or TolerancePolicy(),
                        forward_overrides, command, use_fp64_reference)


def _compare(torch_run: RunReader, ms_run: RunReader, helper: Optional[Helper], started: float,
             policy: TolerancePolicy, forward_overrides: Optional[Mapping[str, str]],
             command: str, use_fp64_reference: bool) -> CheckResult:
    pairs, unmatched, idle = pair_records(torch_run, ms_run, forward_overrides)
    _refuse_other_starting_point(torch_run, ms_run)
    self_checks = {run.framework: run.observer_effect for run in (torch_run, ms_run)}
    # A torch step that draws random numbers (dropout in a forward, stochastic depth) drew
    # others in its float64 rerun: that difference is no measure of float32 noise.
    use_fp64_reference = use_fp64_reference and not torch_run.step_is_random
    # A record stored once for several names (a container's output is its last child's) is
    # compared once: same bytes on both sides, same noise and tolerance, same statistics.
    plan: List[_Planned] = []
    planned = set()
    for pair in pairs:
        tolerance = policy.resolve(pair.torch.name, pair.torch.kind)
        noise = _float64_noise(pair.torch) if use_fp64_reference else None
        identity = tuple((r.shard, r.key, r.part, r.batch_read, r.position, r.axes)
                         for r in (pair.torch, pair.mindspore)) + (noise, tolerance)
        plan.append(_Planned(pair, tolerance, noise, identity, identity not in planned))
        planned.add(identity)

    def read(pair: Pair) -> Tuple[np.ndarray, np.ndarray]:
        return torch_run.tensor(pair.torch), ms_run.tensor(pair.mindspore)

    # ReLU outputs are checked for units active on one side only (parity/kinks.py)
    kink_ops = {p.identity: p.pair.torch.op for p in plan
                if p.pair.torch.kind == "forward" and p.pair.torch.op in kinks.ACTIVE}
    initial = initial_weights(torch_run)
    # keyed by plan index: a pair by its own, an update's step check by ("step", its index)
    jobs: Dict[Hashable, AnyJob] = {
        index: Job(p.pair.torch, p.pair.mindspore, p.tolerance, p.noise,
                   kink_ops.get(p.identity, "")) for index, p in enumerate(plan) if p.first}
    config = torch_run.manifest.get("config", {})
    steps = _step_checks(plan, config, initial)
    jobs.update({("step", index): check for index, check in steps.items()})
    # the details of the first failing pairs measured here, while their tensors are at hand;
    # not of one an allowance below may pass (a correct ResNet50 run at the default made 61 to
    # 63 such details: its compare took 0.93-1.02 s with them, 0.72-0.73 s without)
    early_details: Dict[Tuple, RecordDetail] = {}

    def keep_detail(index: Hashable, torch_value: np.ndarray, ms_value: np.ndarray) -> None:
        if len(early_details) < MAX_DETAILED and torch_value.shape == ms_value.shape \
                and plan[index].pair.torch.kind not in EXCUSABLE:
            early_details[plan[index].identity] = _detail(torch_value, ms_value)

    results, helper_rss = run_all(Runs(torch_run, ms_run, initial), jobs, helper, keep_detail)
    compared_bytes = sum(r.bytes_read for r in results.values())
    measured = {plan[index].identity: result for index, result in results.items()
                if isinstance(index, int)}
    flipped = {identity: m.flipped for identity, m in measured.items()
               if m.flipped is not None and m.flipped.size}
    already = {identity: m.stats for identity, m in measured.items()}

    comparisons = [_structure_checked(p.pair, _comparison(p.pair, order, already[p.identity],
                                                          p.tolerance))
                   for order, p in enumerate(plan)]
    comparisons, reordered, read_for_rows = _rows_in_another_order(
        plan, comparisons, Runs(torch_run, ms_run, initial))
    comparisons, windowed, read_for_windows = _positions_kept(
        plan, comparisons, Runs(torch_run, ms_run, initial))
    sites, read_at_sites = _flip_sites(plan, kink_ops, flipped, torch_run)
    if sites:
        comparisons = _allow_for_flips(plan, comparisons, sites)
    comparisons, read_for_sums = _judge_cancelling_sums(plan, comparisons, torch_run, ms_run,
                                                        initial)
    comparisons = _allow_for_the_logits(plan, comparisons, torch_run, ms_run)
    comparisons, stepped = _judge_steps(
        plan, comparisons, {index: results[("step", index)].error for index in steps}, config)
    compared_bytes += read_at_sites + read_for_sums + read_for_rows + read_for_windows
    failing = [(p, c) for p, c in zip(plan, comparisons)
               if not c.passed and p.pair.torch.shape == p.pair.mindspore.shape]
    details = {f"{c.kind}:{c.name}": early_details.get(p.identity) or _detail(*read(p.pair))
               for p, c in failing[:MAX_DETAILED]}
    first = next((c for c in comparisons if not c.passed), None)
    divergence = diagnosis = None
    if first is not None:
        divergence = Divergence(name=first.name, kind=first.kind,
                                mindspore_name=first.mindspore_name, max_abs=first.max_abs,
                                max_rel=first.max_rel, cosine=first.cosine, reason=first.reason)
        pair = next(p for p in pairs if p.torch.name == first.name
                    and p.torch.kind == first.kind)
        diagnosis = diagnose(first, pair.torch, pair.mindspore, comparisons, torch_run, ms_run,
                             unmatched, pair.dropping, idle)
    notes = _notes(torch_run, ms_run, self_checks, sites, comparisons, policy,
                   forward_overrides or {}, idle)
    if stepped:
        notes.append(_adam_note(stepped, config))
    if reordered:
        enclosing = sorted(set(reordered.values()))
        notes.append(f"{len(reordered)} outputs inside {first_few(enclosing)} "
                     f"({first_few(list(reordered))}): MindSpore holds torch's rows in another "
                     "order, or among more rows (a mixture-of-experts layer gathering each "
                     "expert's tokens otherwise, or running it on every token); compared on the "
                     f"rows both hold, gradients too, where {first_few(enclosing)} "
                     f"put{'s' if len(enclosing) == 1 else ''} them back")
    if windowed:
        notes.append(f"{first_few(windowed)}: one side computes more positions along an axis "
                     "than it keeps (a causal convolution padded on both sides and cut to its "
                     "first L outputs, as Hugging Face's Mamba writes it, against one padded on "
                     "the left alone); compared, gradients too, on the positions both keep, "
                     "nothing after the module reading the others (their gradient is zero)")
    read_at_one = [p.torch.name for p in pairs if p.torch.kind == "forward"
                   and (p.torch.position or p.mindspore.position)]
    if read_at_one:
        notes.append(f"{first_few(read_at_one)}: one side computes "
                     f"{'it' if len(read_at_one) == 1 else 'each'} at every position of an axis, "
                     "the other at one; compared at the first (the class token, as timm's class "
                     "attention's self.q(x[:, 0])), the other positions not at all. A port taking "
                     "another position fails at the module after")
    unmatched, checked = _checked_in_passing_pairs(unmatched, plan, comparisons,
                                                   (torch_run, ms_run))
    if checked:
        notes.append(f"{len(checked)} module{'s' if len(checked) > 1 else ''} with no "
                     f"counterpart on the other side {'hold' if len(checked) > 1 else 'holds'} "
                     "the output of a pair that passed, "
                     "their computation checked in it (one side computes it in a module's "
                     f"forward), not listed as unmatched: {first_few(checked)}")
    unmatched, constants = _constants_set_aside(unmatched, torch_run)
    if constants:
        notes.append(f"torch's non-persistent buffer{'s' if len(constants) > 1 else ''} "
                     f"{first_few(constants)} (constants its modules build, outside the state "
                     "dict and any checkpoint: a causal mask, position ids) went to no tensor "
                     "of the port, which builds its own or computes them: compared through the "
                     "outputs they shape, not listed as unmatched")
    return CheckResult(comparisons=tuple(comparisons), first_divergence=divergence,
                       diagnosis=diagnosis, unmatched=unmatched, details=details,
                       meta=_meta(torch_run, ms_run, policy, command, notes),
                       extra={"observer_effect": self_checks,
                              "compare_seconds": time.perf_counter() - started,
                              # in `parity run` this process is the compare's alone (the
                              # captures ran in their own)
                              "compare_peak_rss_mb": peak_resident_mb() + helper_rss,
                              "compare_bytes": compared_bytes})


def _constants_set_aside(unmatched: Dict[str, Tuple[str, ...]], torch_run: RunReader
                         ) -> Tuple[Dict[str, Tuple[str, ...]], List[str]]:
    """``unmatched`` without torch's non-persistent buffers, and those buffers: GPT-2's
    attention builds its causal mask as one, a port as a plain tensor (listed as unmatched,
    they showed on every run of GPT-2's correct port)."""
    left = unmatched.get("torch buffer", ())
    constants = [name for name in left
                 if torch_run.record(name, "buffer").attrs.get("persistent") is False]
    if not constants:
        return unmatched, []
    kept = {key: names for key, names in unmatched.items() if key != "torch buffer"}
    rest = tuple(name for name in left if name not in constants)
    if rest:
        kept["torch buffer"] = rest
    return kept, constants


def _notes(torch_run: RunReader, ms_run: RunReader, self_checks: Mapping[str, Any],
           sites: List[kinks.FlipSite], comparisons: List[Comparison],
           policy: TolerancePolicy, forward_overrides: Mapping[str, str],
           idle: Mapping[str, Sequence[str]]) -> List[str]:
    """What the reader should know beside the verdicts: the self-checks, settings the captures
    ran apart, allowances made, modules left out of the unmatched lists (``idle``: computing
    nothing), and options that matched nothing."""
    notes = [_observer_note(check, framework) for framework, check in self_checks.items()]
    differing = step_settings_differ(torch_run, ms_run)
    if differing:
        notes.append(f"the captures ran different step settings: {'; '.join(differing)}")
    if torch_run.step_is_random:
        notes.append("torch's step is not deterministic, so its float64 rerun cannot measure "
                     "float32 noise: verdicts use the fixed tolerances")
    if sites:
        notes.append(_flip_note(sites, comparisons))
    noisy = [c for c in comparisons if c.fp32_noise >= MOSTLY_NOISE]     # NaN: no float64
    if noisy:
        notes.append(_noise_note(noisy))
    floored = [c for c in comparisons if c.let_through_by_floor and c.ms_error > FLOOR_HIDES]
    if floored:
        notes.append(_floor_note(floored))
    paired = {c.name for c in comparisons if c.kind == "forward"}
    dropping = [r for r in torch_run.records if r.kind == "forward" and r.op in DROPPING_OPS
                and r.name in paired]
    dropouts = [r.name for r in dropping]
    if dropouts:
        kind = "dropout" if all(r.op == "dropout" for r in dropping) else \
            "dropout or stochastic-depth"
        notes.append(f"{len(dropouts)} {kind} module{'s' if len(dropouts) > 1 else ''} "
                     f"({first_few(dropouts)}) ran as identity on both sides: the frameworks "
                     "draw different random masks, so their rates are compared instead")
    idle = [f"{side} {name}" for side, names in idle.items() for name in names]
    if idle:
        notes.append(f"{len(idle)} module{'s' if len(idle) > 1 else ''} computing nothing (an "
                     "Identity, or a dropout of rate 0) with no counterpart on the other side, "
                     f"not listed as unmatched: {first_few(idle)}")
    constants = list(ms_run.manifest.get("port_constants") or ())
    if constants:
        notes.append(f"the port's frozen parameter{'s' if len(constants) > 1 else ''} "
                     f"{first_few(constants)} took no torch tensor, torch holding none left "
                     "over: kept at the port's own values, as constants it computes itself "
                     "(torch computes them in its forward or holds them as integer tensors); "
                     "a wrong one shows in the outputs after it")
    rows_left = list(ms_run.manifest.get("torch_rows_left") or ())
    if rows_left:
        notes.append(f"torch's {first_few(rows_left)} went to no parameter of the port: its k "
                     "layer holds no bias where torch's fused layer holds one (a bias on the "
                     "keys shifts every logit of a row alike, which softmax ignores); those "
                     "rows are compared nowhere")
    transposed = list(ms_run.manifest.get("transposed") or ())
    if transposed:
        notes.append(f"the port's {first_few(transposed)} took torch's weight transposed: one "
                     "side's layer holds it as (in, out) for x @ W (Hugging Face's Conv1D), the "
                     "other as (out, in), as torch's Linear and MindSpore's Dense do; its "
                     "gradient, update and state are compared in torch's layout")
    not_run = list(ms_run.manifest.get("cells_not_run") or ())
    if not_run:
        notes.append(f"the port's cell{'s' if len(not_run) > 1 else ''} {first_few(not_run)} "
                     f"never ran: a SequentialCell runs the cells it was built with, and a cell "
                     "assigned to its attribute after replaces the one parity hooks, not the "
                     "one it runs (unseen, so unmatched); assign by index (seq[i] = cell) to "
                     "replace both")
    stacked = list(dict.fromkeys(module_of(r.name) for r in torch_run.records
                                 if r.kind == "forward" and drops_between_layers(r.op, r.attrs)))
    if stacked:
        notes.append(f"{first_few(stacked)} ran in eval mode on both sides, "
                     f"{'its' if len(stacked) == 1 else 'their'} dropout between stacked layers "
                     "as identity: the frameworks draw different random masks, so the rates are "
                     "compared instead")
    # those the MindSpore capture left out too (one made without the torch capture steps them)
    left_out = set(ms_run.manifest.get("no_gradient") or ())
    no_gradient = [name for name in torch_run.manifest.get("no_gradient") or ()
                   if name in left_out]
    if no_gradient:
        notes.append(f"no gradient reached {first_few(no_gradient)} in torch's step, which "
                     "left them as they were: they were not stepped on either side and are "
                     "compared as state (MindSpore's optimizers step them, weight decay and "
                     "all, unless your training script leaves them out)")
    unused = policy.unused_overrides()
    if unused:
        notes.append(f"tolerance overrides that matched no record: {', '.join(unused)}")
    unused = _map_entries_naming_no_record(forward_overrides, torch_run, ms_run)
    if unused:
        notes.append(f"--map entries naming a record neither run has (\"mindspore.name\" "
                     f"= \"torch.name\"): {first_few(unused)}")
    return notes


def _meta(torch_run: RunReader, ms_run: RunReader, policy: TolerancePolicy, command: str,
          notes: Sequence[str]) -> Meta:
    """Where the result came from: versions, seed, step settings, batch, run directories."""
    return Meta(
        versions={"torch": torch_run.manifest.get("versions", {}),
                  "mindspore": ms_run.manifest.get("versions", {})},
        seed=int(torch_run.manifest.get("seed", 0)),
        config={"torch": torch_run.manifest.get("config", {}),
                "mindspore": ms_run.manifest.get("config", {}),
                "torch_factory": torch_run.manifest.get("factory", ""),
                "mindspore_factory": ms_run.manifest.get("factory", "")},
        tolerance=policy.to_dict(), command=command, notes=tuple(notes),
        run_dirs={"torch": str(torch_run.path), "mindspore": str(ms_run.path)},
        fingerprint=str(torch_run.manifest.get("fingerprint", "")),
        batch=" · ".join(f"{r.name} {'×'.join(map(str, r.shape))} {r.dtype}"
                         for r in torch_run.records if r.kind == "input"))
