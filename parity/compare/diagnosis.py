"""Naming the likely cause of the first divergence.

Evidence first, numbers second: module settings recorded at capture (padding mode, eps, BN
momentum, training flag; compare/settings.py) prove a cause outright ("certain"); otherwise the
numerical signature of each classic ResNet migration bug (DESIGN.md) is matched ("likely");
failing both, the message says where to look ("guess").
"""

from __future__ import annotations

import math
from typing import Dict, List, Mapping, Optional, Sequence, Set, Tuple

import numpy as np

from parity.align import ACTIVATION_OPS, GENERIC_OP, cells_never_run, module_map_from_parameters
from parity.compare import functional, inputs, kernels, loss, optimizer, reorder, sums
from parity.compare.batches import batch_difference, further_input_difference
from parity.compare.dropping import DropMismatch
from parity.compare.settings import (counting_padding, settings_cause, softmax_axis,
                                     uncounted_padding)
from parity.compare.structure import (FROZEN_ON_ONE_SIDE, declared_eps, different_drop_rates,
                                      frozen_on_one_side, op_family)
from parity.config import SHARED_STEP_SETTINGS, split_state
from parity.errors import first_few
from parity.records import Comparison, Diagnosis, Part, RecordInfo, module_of, split_part
from parity.rundir import RunReader, initial_weights
from parity.sketch import input_sketch, sketch_distance


def _close(value: float, target: float, rel: float = 0.05) -> bool:
    return np.isfinite(value) and abs(value - target) <= rel * abs(target)


def _median_ratio(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    mask = np.abs(a) > 1e-3 * (np.abs(a).max() + 1e-30)
    return float(np.median(b[mask] / a[mask])) if mask.any() else float("nan")


# A module's input differing by this share of its output's relative error or more is taken
# as the cause: a ±1 projection shows a difference at about its RMS (an order below by chance
# with probability 8 % per projection, two are taken), float32 noise at ~1e-6 of the norm.
INPUT_SHARE = 0.1
# ... and well beyond the differences the earlier outputs pass on: within float32 noise they
# reach 2.7e-4 of their RMS (ResNet50 at batch 2, 64²: the forward ms_error of make run's JSON).
NOISE_MARGIN = 10

HALF_DTYPES = ("float16", "bfloat16")
# A relative RMS difference below which an output is the same computation done less precisely,
# not one missing an operation: float16 rounds to 4.9e-4 of a value at most (mindcv's HRNet
# casts an upsampled branch to float16 before adding it: 8.4e-5 at the sum, timm 1.0.31's at
# 64²); MindSpore's CPU tanh is off by 8.4e-5 where |x| > 2. An operation left out changes its
# output by far more, unless it is nearly the identity.
NEARLY_THE_SAME = 1e-3
# How far from its count of rows the Σ|x| of a softmax's output may be, relative: each row sums to
# one but for float32 rounding. Measured 8e-8 at most over the twelve attention softmaxes of
# timm's XCiT (2×4×48 rows of 48), their attn_drop's recorded input magnitude.
ROWS_SUMMING_TO_ONE = 1e-5
# Operations returning the shape they take (op_family's names): one whose output shape differs
# runs on another input, at another point of the computation (timm's PoolFormer normalises its
# pooled features, mindcv's the map it pools after).
SHAPE_KEEPING = ("batchnorm", "layernorm", "groupnorm", "instancenorm", "softmax", "logsoftmax",
                 "dropout", "droppath", "identity", *ACTIVATION_OPS)
# How far apart a module output's samples (or token positions) must lie to tell differing ones
# from matching ones: those differing by more than this share of the worst one's relative
# difference, the others by less than its square (float32 noise, 1e-7 to 1e-4 of a value; a
# left-out mask, 0.1-1: CLIP's text attention without its causal mask, 0.25 to 1.04 at its
# first 15 positions, 7e-7 at its last).
APART = 1e-2
# A norm's output rows, its weight and bias taken off, average to this share of their RMS at
# most where it subtracts their mean (float32 rounding: 1e-7), and more than UNCENTRED at the
# median where it does not (features of random sign: about 1/sqrt(width)).
CENTRED, UNCENTRED = 1e-4, 1e-2
# A module's first input is an earlier module's output where their sketches lie within this
# share of its norm (the same tensor: 0), looked for among this many records before it.
FED_BY, FED_BY_SEARCHED = 1e-6, 256
# The records the shared step settings reach.
AFTER_THE_FORWARD = ("loss", "grad", "update", "optimizer_state", "weight")


def _forward_cause(first: Comparison, t: RecordInfo, m: RecordInfo,
                   comparisons: Sequence[Comparison], torch_run: RunReader, ms_run: RunReader,
                   unmatched: Dict[str, Tuple[str, ...]],
                   dropping: Optional[DropMismatch]) -> Diagnosis:
    if m.dtype in HALF_DTYPES and t.dtype not in HALF_DTYPES:
        return Diagnosis(cause="MindSpore computes in half precision",
                         detail=f"MindSpore's {m.name} returns {m.dtype}, torch's {t.name} "
                                f"{t.dtype}: mixed precision (amp.auto_mixed_precision, to_float,"
                                f" a float16 cast) costs {first.max_rel:.2g} here, against "
                                "float32's ~1e-7. To check the port itself, run it in float32.",
                         confidence="certain")
    proven = settings_cause(t, m) or \
        (dropping.cause(t, m, torch_run.step_is_random) if dropping else None)
    if proven is not None:
        return proven
    torch_left, ms_left = (set(unmatched.get(f"{side} forward", ()))
                           for side in ("torch", "mindspore"))
    kept = _shape_kept(t, m)
    if tuple(t.shape) != tuple(m.shape) and kept is not None:
        (side, keeping), (other, returning) = kept
        before = _unmatched_just_before(t, torch_run, torch_left)
        runs = f" torch runs {', '.join(before)} just before it." if before else ""
        return Diagnosis(cause=f"{keeping.op} runs on another shape",
                         detail=f"{keeping.op} returns the shape it takes: {side}'s "
                                f"{keeping.name} takes {tuple(keeping.shape)}, {other}'s "
                                f"{returning.name} returns {tuple(returning.shape)}, while every "
                                "earlier output matched. The port runs it at another point: "
                                "before a pooling, reshape or slice torch runs first, or after "
                                f"one torch runs later.{runs}", confidence="likely")
    fed = inputs.first_input_difference(t, m)
    other_source = _fed_other_outputs(t, m, fed, torch_run, ms_run, comparisons)
    if other_source is not None:
        return other_source
    if tuple(t.shape) != tuple(m.shape):
        return Diagnosis(cause=f"{m.op or 'module'} output shape differs",
                         detail=f"torch {t.name} returns {tuple(t.shape)}, MindSpore {m.name} "
                                f"{tuple(m.shape)}, while every earlier output matched: compare "
                                "their settings (stride, padding, kernel size, ceil_mode, output "
                                "size).", confidence="guess")
    missing = _unmatched_just_before(t, torch_run, torch_left)
    extra = _unmatched_just_before(m, ms_run, ms_left)
    if _softmax_torch_applies_too(extra, t, ms_run) or \
            _activations_torch_applies_too(extra, ms_run, ms_left):
        extra = []
    ms_modules = module_map_from_parameters(ms_run.manifest.get("param_map", {}))
    torch_modules = {theirs: ours for ours, theirs in ms_modules.items()}
    reordered = _reordered(("torch", t, missing, torch_run, torch_left, torch_modules),
                           ("MindSpore", m, extra, ms_run, ms_left, ms_modules))
    if reordered is not None:
        return reordered
    missing_inside = [n for n in unmatched.get("torch forward", ())
                      if n.startswith(first.name + ".")]
    a, b = torch_run.tensor(t), ms_run.tensor(m)
    if a.shape == b.shape and a.min() >= 0 and b.min() < 0:
        extra = f" torch calls {', '.join(missing_inside)} there; MindSpore does not." \
            if missing_inside else ""
        return Diagnosis(cause="missing activation",
                         detail=f"torch's {first.name} output is non-negative everywhere, "
                                f"MindSpore's has negative values: a ReLU is missing in "
                                f"{m.name}.{extra}", confidence="likely")
    if missing_inside:
        return Diagnosis(cause="operation missing in the port",
                         detail=f"torch runs {', '.join(missing_inside)} inside {first.name}; "
                                "the MindSpore cell has no counterpart.", confidence="likely")
    ids = _other_ids(t, m, torch_run)
    if ids is not None:
        return ids
    masked = _padded_samples_alone(t, m, torch_run, ms_run) or \
        _causal_mask_otherwise(t, m, torch_run, ms_run)
    if masked is not None:
        return masked
    if not _inputs_matched(first, t, m, fed):
        silent = [name for name in extra
                  if _ran_recording_no_output(ms_modules.get(name, name), torch_run)]
        extra = [name for name in extra if name not in silent]
        if silent and not extra and not missing:
            return _computed_after_their_modules(silent, t, m, fed)
        if extra and missing and len(extra) == len(missing):
            return _replaced_cause(missing, extra, t, m, torch_run, ms_run)
        if extra:
            return _extra_cause(extra, t, m, comparisons, torch_run, ms_run)
        if missing:
            return _missing_cause(missing, first, t, m, torch_run, ms_run)
    passed_on = NOISE_MARGIN * _largest_error_before(first, comparisons)
    if fed is not None and first.ref_rms and fed >= INPUT_SHARE * first.rms / first.ref_rms \
            and fed >= passed_on:
        activation = functional.activation_cause(t, m, torch_run, ms_run)
        if activation is not None:
            return activation
        fed_from = inputs.outermost_fed(t, m, torch_run, ms_run, passed_on)
        where = inputs.forward_holding(fed_from.name, torch_run)
        before = "" if fed_from is t else \
            f" before it calls {fed_from.name}, whose input already differs,"
        sums = reorder.reordered_input(t, m, fed, passed_on)
        if sums is not None:
            return Diagnosis(cause="input in another order",
                             detail=f"{m.name}'s input holds torch's values in another order: "
                                    "its norm and its sum of magnitudes agree "
                                    f"{f'to {sums:.1g}' if sums else 'exactly'}, its values "
                                    f"differ by {fed:.2g} of its norm, while every "
                                    "module output before it matched. Parts concatenated in "
                                    "the other order (torch.cat([a, b]) ported as "
                                    "ops.cat((b, a))), a channel shuffle over another group "
                                    "count, or a reshape or transpose over other axes, in "
                                    f"{where}{before} are the likely cause.",
                             confidence="likely")
        drawing = _drawing_between_modules(t, m, torch_run, ms_run, f"{where}{before}".rstrip(","))
        if drawing is not None:
            return drawing
        return Diagnosis(cause="computation between modules differs",
                         detail=f"{m.name}'s input already differs from torch's ({fed:.2g} of "
                                "its norm) while every module output before it matched: the "
                                "operations that feed it outside any module (matmul, softmax, "
                                "masking, scaling, reshapes, residual adds), in "
                                f"{where}{before} are the likely cause."
                                f"{_rows_read_in_another_order(t, comparisons)}",
                         confidence="likely")
    if first.ref_rms:
        given = inputs.other_input_cause(
            t, m, torch_run, ms_run, max(passed_on, INPUT_SHARE * first.rms / first.ref_rms))
        if given is not None:
            return given
    permuted = reorder.permutation(a, b)
    if permuted is not None:
        axis, order = permuted
        return Diagnosis(cause="output in another order",
                         detail=f"{m.name} returns torch's values in another order while its "
                                f"input matched: {reorder.describe(axis, a.ndim, order)}, "
                                f"inside {m.name}.", confidence="likely")
    if t.op != m.op:
        return _different_operation(t, m)
    if t.op == m.op == "tanh":
        found = kernels.tanh_cause(first.name, a, b)
        if found is not None:
            return found
    centred = _centred_on_one_side(t, m, torch_run, ms_run)
    if centred is not None:
        return centred
    if first.max_rel > 1e-2:
        size = "O(1) error" if first.max_rel > 0.1 else "error well above fp32 noise"
        others = [inputs.input_name(key) for key, _ in inputs.compared_inputs(t, m)]
        other_inputs = f" Its inputs matched torch's (the first, {', '.join(others)})." \
            if others else ""
        return Diagnosis(cause=f"{m.op or 'module'} computes something different",
                         detail=f"{size} at {first.name} while every earlier record matched: "
                                f"compare the construct of MindSpore {m.name} with torch's "
                                f"forward (padding, eps, an extra or missing op).{other_inputs}",
                         confidence="guess")
    undeclared = _eps_one_side_declares(t, m)
    if undeclared is not None:
        return undeclared
    few = _few_values_per_channel(first, t, torch_run)
    return Diagnosis(cause="small numerical drift",
                     detail=f"{first.name} is slightly beyond tolerance (max_rel "
                            f"{first.max_rel:.2g}): precision settings (fp16/HF32), a different "
                            "reduction order, or a tolerance too tight for this depth."
                            + (f"{few} Past so few values float32 rounding varies more from one "
                               "computation to the next: a larger batch or image checks it "
                               "again." if few else ""),
                     confidence="guess")


def _centred_on_one_side(t: RecordInfo, m: RecordInfo, torch_run: RunReader,
                         ms_run: RunReader) -> Optional[Diagnosis]:
    """A norm of the user's own (on either side) whose rows, its weight and bias taken off,
    have a mean of zero on one side and not on the other: a LayerNorm for an RMS norm, or the
    reverse. Hugging Face's T5LayerNorm against a port's cell subtracting the mean was told
    "module computes something different" (a guess)."""
    weights = initial_weights(torch_run)
    if GENERIC_OP not in (t.op, m.op) or tuple(t.shape) != tuple(m.shape) or not t.shape or \
            weights is None:
        return None
    weight, bias = weights.get(f"{t.name}.weight"), weights.get(f"{t.name}.bias")
    width = t.shape[-1]
    if weight is None or tuple(weight.shape) != (width,) or width < 4 or \
            not np.all(np.abs(weight) > 0) or \
            (bias is not None and tuple(bias.shape) != (width,)):
        return None
    centring = []
    for run, record in ((torch_run, t), (ms_run, m)):
        rows = run.tensor(record).reshape(-1, width).astype(np.float64)
        rows = (rows - (0 if bias is None else bias)) / weight
        share = np.abs(rows.mean(axis=1)) / np.maximum(np.sqrt((rows * rows).mean(axis=1)),
                                                       np.finfo(np.float64).tiny)
        centring.append(True if share.max() < CENTRED else
                        False if np.median(share) > UNCENTRED else None)
    if None in centring or centring[0] == centring[1]:
        return None
    kinds = ("subtracts each row's mean (a LayerNorm)",
             "subtracts no mean (an RMS norm: x·rsqrt(mean(x²) + eps)·weight)")
    torch_does, ms_does = (kinds[0], kinds[1]) if centring[0] else (kinds[1], kinds[0])
    return Diagnosis(cause="norm centres otherwise",
                     detail=f"torch's {t.name} {torch_does}, MindSpore's {m.name} {ms_does}: "
                            "told from their outputs with the weight and bias taken off, whose "
                            f"rows average to zero on {'torch' if centring[0] else 'MindSpore'}'s "
                            "side alone. Compute the norm torch's forward does.",
                     confidence="likely")


def _inputs_matched(first: Comparison, t: RecordInfo, m: RecordInfo,
                    fed: Optional[float]) -> bool:
    """Whether every input of the first diverging module is known to have matched torch's (the
    first ``fed`` apart: inputs.first_input_difference): then no module one side runs just
    before it and the other lacks made the difference, which is the module's own (a Llama
    port's RMSNorm at another eps was told "operation missing in the port", naming the rotary
    embedding torch runs before it and feeds to attention)."""
    if not first.ref_rms:
        return False
    floor = INPUT_SHARE * first.rms / first.ref_rms
    others = [len(record.attrs.get("other_inputs") or {}) for record in (t, m)]
    return fed is not None and fed < floor and \
        others[0] == others[1] == len(inputs.compared_inputs(t, m)) and \
        not inputs.input_differences(t, m, floor)


def _shape_kept(t: RecordInfo, m: RecordInfo
                ) -> Optional[Tuple[Tuple[str, RecordInfo], Tuple[str, RecordInfo]]]:
    """((side, record) of the operation returning the shape it takes, (side, record) of its
    pair), where its pair is that operation too or a module of the user's own (timm's
    PoolFormer head normalises with its GroupNorm1, a GroupNorm subclass); None otherwise."""
    sides = (("MindSpore", m), ("torch", t))
    for (side, record), other in (sides, sides[::-1]):
        if op_family(record.op) in SHAPE_KEEPING and \
                other[1].op in (record.op, GENERIC_OP):
            return (side, record), other
    return None


def _eps_one_side_declares(t: RecordInfo, m: RecordInfo) -> Optional[Diagnosis]:
    """A module with an eps setting paired with one without, their inputs matching and their
    outputs drifting apart: the other side's eps is a constant in its code. timm's BiT
    standardises its convs' weights with eps=1e-8, mindcv's port with a 1e-10 written into its
    construct (6× torch's float32 error at the stem: "small numerical drift")."""
    torch_eps, ms_eps = declared_eps(t), declared_eps(m)
    if (torch_eps is None) == (ms_eps is None):
        return None
    if torch_eps is not None:
        return Diagnosis(cause="eps only torch's module declares",
                         detail=f"torch's {t.name} keeps eps={torch_eps:g}; MindSpore's "
                                f"{m.name} has no eps or epsilon setting, its input matched and "
                                "its output drifted: an eps written into its construct as a "
                                f"constant is the likely cause. Give it {torch_eps:g}.",
                         confidence="likely")
    return Diagnosis(cause="eps only the port's module declares",
                     detail=f"MindSpore's {m.name} keeps eps={ms_eps:g}; torch's {t.name} has "
                            "no eps setting, its input matched and its output drifted: the eps "
                            "torch's forward writes as a constant is the likely one to give "
                            f"{m.name}.", confidence="likely")


def _largest_error_before(first: Comparison, comparisons: Sequence[Comparison]) -> float:
    """The largest relative RMS difference of the forward records before ``first``: how far
    inputs may differ with every earlier output matching (float32 noise, grown with depth)."""
    return max((c.rms / c.ref_rms for c in comparisons if c.kind == "forward"
                and c.order < first.order and c.ref_rms), default=0.0)


def _unmatched_just_before(m: RecordInfo, run: RunReader, unmatched: Set[str]) -> List[str]:
    """The unmatched forward records of ``run`` that ran after its last matched one before
    ``m`` and changed its values: computation with no counterpart on the other side, between a
    match and a miss. An unmatched reshape or identity (same values) is not blamed."""
    extra: List[RecordInfo] = []
    matched = None
    for record in sorted((r for r in run.records if r.kind == "forward" and r.order < m.order),
                         key=lambda r: r.order, reverse=True):
        if record.name not in unmatched:
            matched = record
            break
        extra.insert(0, record)
    if matched is not None and extra:
        before = run.tensor(matched).reshape(-1)
        if all(np.array_equal(run.tensor(r).reshape(-1), before) for r in extra):
            return []
    return [r.name for r in extra]


def _softmax_torch_applies_too(extra: Sequence[str], t: RecordInfo, ms_run: RunReader) -> bool:
    """Whether the port's cells ``extra`` are softmaxes torch applies too, as a function in its
    forward (``attn.softmax(dim=-1)``: no module, no record), told from the input of torch's
    ``t``: rows of non-negative values summing to one each, so that its Σ|x| is its count of
    rows. mindcv's XCiT runs a Softmax cell where timm's calls the function, and a cause before
    the softmax (q and k not normalised) was blamed on it, "extra operation in the port"."""
    cells = [ms_run.record(name, "forward") for name in extra]
    if not cells or any(cell is None or cell.op != "softmax" for cell in cells):
        return False
    axis, total = softmax_axis(cells[-1]), t.attrs.get("input_magnitude")
    if axis is None or not isinstance(total, (int, float)) or not cells[-1].shape:
        return False
    rows = math.prod(cells[-1].shape) / cells[-1].shape[axis]
    return abs(total - rows) <= ROWS_SUMMING_TO_ONE * rows


def _activations_torch_applies_too(extra: Sequence[str], ms_run: RunReader,
                                   ms_left: Set[str]) -> bool:
    """Whether the port's cells ``extra`` are activations torch applies too, as functions in its
    forward: for each, the port ran an earlier cell of its op that torch has no counterpart for
    either, and a module output after that one matched torch's, so torch applies it there.
    Whisper's encoder applies F.gelu after each of its convs, where a port runs GELU cells: a
    cause after the second (the positions not added) was blamed on that cell, "extra
    operation"."""
    cells = [ms_run.record(name, "forward") for name in extra]
    if not cells or any(cell is None or cell.op not in ACTIVATION_OPS for cell in cells):
        return False
    forward = [r for r in ms_run.records if r.kind == "forward"]
    matched = [r.order for r in forward if r.name not in ms_left]

    def applied_before(cell: RecordInfo) -> bool:
        return any(any(earlier.order < order < cell.order for order in matched)
                   for earlier in forward if earlier.name in ms_left and earlier.op == cell.op
                   and earlier.order < cell.order)
    return all(applied_before(cell) for cell in cells)


def _fed_other_outputs(t: RecordInfo, m: RecordInfo, fed: Optional[float], torch_run: RunReader,
                       ms_run: RunReader, comparisons: Sequence[Comparison]
                       ) -> Optional[Diagnosis]:
    """A pair of the same operation whose first inputs are the outputs of two modules that are
    no pair (their sketches equal to 10⁻⁶): the port hands it another tensor. Whisper's decoder
    ported to attend over its own states where torch attends over the encoder's was told
    "dense output shape differs: compare their settings (stride, padding, ...)". Looked for
    only where the outputs' shapes or the inputs differ (``fed``, by more than APART of its
    norm)."""
    if t.op != m.op or (tuple(t.shape) == tuple(m.shape) and (fed is None or fed <= APART)):
        return None
    sources = [_fed_by(record, run) for record, run in ((t, torch_run), (m, ms_run))]
    if None in sources:
        return None
    torch_source, ms_source = sources
    paired = {c.mindspore_name: c.name for c in comparisons if c.kind == "forward"}
    counterpart = paired.get(ms_source.name)
    counterpart_record = None if counterpart is None else torch_run.record(counterpart, "forward")
    # torch's source unpaired: a module the port lacks (operation missing); the counterpart
    # feeding torch's too: the same tensor under another name (a container's, its last module's)
    if counterpart_record is None or torch_source.name not in paired.values() or \
            _feeds(counterpart_record, t, torch_run):
        return None
    return Diagnosis(
        cause="input taken from another module",
        detail=f"torch's {t.name} is given the output of {torch_source.name} "
               f"{tuple(torch_source.shape)}, MindSpore's {m.name} that of {ms_source.name} "
               f"{tuple(ms_source.shape)} (paired with torch's {counterpart}), while every "
               "earlier output matched: the port hands it another tensor, in "
               f"{inputs.forward_holding(m.name, ms_run)} or before it.", confidence="likely")


def _fed_by(record: RecordInfo, run: RunReader) -> Optional[RecordInfo]:
    """The latest forward record of ``run`` before ``record`` whose output is ``record``'s
    first input, told by the input's sketch (to 10⁻⁶ of its norm), among the FED_BY_SEARCHED
    before it; None if none is."""
    earlier = [r for r in run.records if r.kind == "forward" and r.order < record.order
               and r.part is None]
    return next((candidate for candidate in sorted(earlier, key=lambda r: -r.order)
                 [:FED_BY_SEARCHED] if _feeds(candidate, record, run)), None)


def _feeds(source: RecordInfo, record: RecordInfo, run: RunReader) -> bool:
    """Whether ``source``'s output is ``record``'s first input, by its sketch."""
    distance = sketch_distance(record.attrs.get("input_sketch"), input_sketch(run.tensor(source)))
    return distance is not None and distance <= FED_BY


def _other_ids(t: RecordInfo, m: RecordInfo, torch_run: RunReader) -> Optional[Diagnosis]:
    """An embedding pair looking up other ids (their CRC-32s differ), told where the ids are
    computed: Hugging Face's T5 computes its relative-position buckets in its attention's
    forward, and a port bucketing them one-sidedly was told "embedding computes something
    different" (a guess)."""
    ids = [record.attrs.get("integer_input_crc32") for record in (t, m)]
    if None in ids or ids[0] == ids[1]:
        return None
    where = inputs.forward_holding(t.name, torch_run)
    what = "embedding" if t.op == m.op == "embedding" else t.op or "module"
    return Diagnosis(cause=f"{what} ids differ",
                     detail=f"torch's {t.name} takes other integer ids than MindSpore's "
                            f"{m.name} (the CRC-32 of torch's is {ids[0]}, of MindSpore's "
                            f"{ids[1]}), while every output before it matched: the ids "
                            f"computed before it (in {where}, or handed to it from further "
                            "out: positions, relative-position buckets, token types, an offset "
                            "such as RoBERTa's padding_idx + 1) are the likely cause.",
                     confidence="certain")


def _padded_samples_alone(t: RecordInfo, m: RecordInfo, torch_run: RunReader,
                          ms_run: RunReader) -> Optional[Diagnosis]:
    """A module output differing only in the samples a mask input of the batch pads (a further
    input of zeros and ones, either marking padding: the samples holding both), the others
    matching: a padding mask the port leaves out or applies otherwise. Hugging Face's ALBERT
    against a port adding no mask to its attention scores was told only "computation between
    modules differs" (masking among other causes)."""
    a, b = torch_run.tensor(t), ms_run.tensor(m)
    if a.shape != b.shape or a.ndim < 2 or a.shape[0] < 2:
        return None
    samples = a.shape[0]
    off = _relative_differences(a, b, 0)
    differing = None if off is None else _told_apart(off)
    if differing is None:
        return None
    for mask in torch_run.records:
        if mask.kind != "input" or mask.name in ("input", "target") or \
                tuple(mask.shape[:1]) != (samples,):
            continue
        values = torch_run.tensor(mask).reshape(samples, -1)
        if not np.isin(values, (0, 1)).all():
            continue
        pads = (values == 0).any(axis=1) & (values == 1).any(axis=1)
        if np.array_equal(pads, differing):
            where = inputs.forward_holding(m.name, ms_run)
            which = ", ".join(str(i) for i in np.flatnonzero(differing))
            return Diagnosis(
                cause="padding mask applied otherwise",
                detail=f"{m.name} differs from torch's {t.name} only in samples {which} of "
                       f"{samples}, those the batch's {mask.name} (x"
                       f"{mask.name.removeprefix('input')} of an --input file) pads; the "
                       f"others match (to {off[~differing].max():.1g} of their size, against "
                       f"{off.max():.2g}). The port leaves that mask out, or applies it "
                       "otherwise (another fill value, another axis, kept and padded positions "
                       f"swapped), in {where} or before it.", confidence="likely")
    return None


def _causal_mask_otherwise(t: RecordInfo, m: RecordInfo, torch_run: RunReader,
                           ms_run: RunReader) -> Optional[Diagnosis]:
    """A module output of token vectors, (N, L, D) or (L, N, D), differing at every position
    but the last, which matches: the last token attends to every token with a causal mask or
    without one, so a causal mask one side applies and the other leaves out changes every
    position but that one. Hugging Face's CLIP text model against a port leaving its causal
    mask out was told only "computation between modules differs"."""
    a, b = torch_run.tensor(t), ms_run.tensor(m)
    batch = torch_run.record("input", "input")
    if a.shape != b.shape or a.ndim != 3 or batch is None:
        return None
    axis = 0 if a.shape[1] == batch.shape[0] != a.shape[0] else 1
    positions = a.shape[axis]
    off = None if positions < 3 else _relative_differences(a, b, axis)
    differing = None if off is None else _told_apart(off)
    if differing is None or differing[-1] or not differing[:-1].all():
        return None
    return Diagnosis(
        cause="causal mask applied otherwise",
        detail=f"{m.name} differs from torch's {t.name} at each of its {positions} "
               f"positions along axis {axis} but the last, which matches (to {off[-1]:.1g} of its "
               f"size, against {off.max():.2g}): the last token attends to every token with a "
               "causal mask or without one. The port leaves the causal mask out, or applies "
               f"one torch does not, in {inputs.forward_holding(m.name, ms_run)} or before it.",
        confidence="likely")


def _relative_differences(a: np.ndarray, b: np.ndarray, axis: int) -> Optional[np.ndarray]:
    """The RMS difference of each slice of ``a`` and ``b`` along ``axis``, relative to that
    slice's RMS in ``a``; None where a slice is all zeros or ``b`` is not finite."""
    a, b = (np.moveaxis(x, axis, 0).reshape(x.shape[axis], -1).astype(np.float64)
            for x in (a, b))
    size = np.sqrt(np.mean(a * a, axis=1))
    if not np.all(np.isfinite(b)) or not np.all(size > 0):
        return None
    return np.sqrt(np.mean((b - a) ** 2, axis=1)) / size


def _told_apart(off: np.ndarray) -> Optional[np.ndarray]:
    """Which of the slices whose relative differences are ``off`` differ, where some differ by
    more than APART of the worst and the others by less than its square; else None."""
    differing = off > APART * off.max()
    if not differing.any() or differing.all() or \
            off[~differing].max() > APART * APART * off.max():
        return None
    return differing


def _ran_recording_no_output(name: str, run: RunReader) -> bool:
    """Whether ``run``'s module ``name`` ran its modules (records under its name) and recorded
    no output of its own: it returns no single tensor (a dict, a Hugging Face model output).
    A port cell paired with it by name is then no operation torch lacks: Hugging Face's CLIP
    text model pools at each sequence's last token in its forward, and a port pooling
    elsewhere was told "extra operation in the port: MindSpore runs clip.text_model"."""
    return run.record(name, "forward") is None and \
        any(r.kind == "forward" and r.name.startswith(name + ".") for r in run.records)


def _computed_after_their_modules(cells: Sequence[str], t: RecordInfo, m: RecordInfo,
                                  fed: Optional[float]) -> Diagnosis:
    """Port cells whose torch modules of the same name record no output: what the port's
    forwards compute after their last modules is compared nowhere until ``m``'s input."""
    by = "" if fed is None else f" ({fed:.2g} of its norm)"
    return Diagnosis(cause="computation between modules differs",
                     detail=f"{m.name}'s input already differs from torch's{by} while every "
                            f"module output before it matched; torch's {', '.join(cells)} "
                            f"return{'s' if len(cells) == 1 else ''} no single tensor (a dict "
                            "or model output, as Hugging Face's models return), so MindSpore's "
                            "are compared with nothing: the operations after their last "
                            f"modules, in {cells[0]}'s forward first (pooling, indexing, "
                            "slicing, scaling), are the likely cause.",
                     confidence="likely")


def _extra_cause(extra: Sequence[str], t: RecordInfo, m: RecordInfo,
                 comparisons: Sequence[Comparison], torch_run: RunReader,
                 ms_run: RunReader) -> Diagnosis:
    """Cells the port runs after the last output that matched and before ``m``, which torch
    lacks. An average pool among them not counting its padding, where torch pools in its
    forward counting it (torchvision's Inception3: F.avg_pool2d(x, 3, stride=1, padding=1)), is
    proven so from the next module's input sketch; suspected where that cannot be done."""
    torch_names = {c.mindspore_name: c.name for c in comparisons if c.kind == "forward"}
    hints = []
    for name in extra:
        pool = ms_run.record(name, "forward")
        uncounted = uncounted_padding(pool)
        if uncounted is None:
            continue
        kernel, setting = uncounted
        source = functional.pooled_padding_counted(pool, kernel, t, ms_run, torch_run,
                                                   torch_names)
        if source is not None:
            return Diagnosis(cause="avgpool2d count_include_pad differs",
                             detail=f"between {source} and {t.name} torch averages over "
                                    f"{kernel}×{kernel} windows counting the padding (told from "
                                    f"{t.name}'s input: F.avg_pool2d(x, {kernel}, stride=1, "
                                    f"padding={kernel // 2}) in its forward), MindSpore "
                                    f"{pool.name} does not ({setting}): write "
                                    f"{counting_padding(kernel)}.", confidence="certain")
        hints.append(f" {pool.name} averages without counting its padding ({setting}); torch's "
                     "average pools count it by default, in a module or in a forward: to pool "
                     f"as they do, write {counting_padding(kernel)}.")
    return Diagnosis(cause="extra operation in the port",
                     detail=f"MindSpore runs {', '.join(extra)} after the last output that "
                            f"matched and before {m.name}, and torch has no counterpart: what "
                            f"that cell adds (a scale, an extra op) is the likely cause."
                            f"{''.join(hints)}", confidence="likely")


def _missing_cause(missing: Sequence[str], first: Comparison, t: RecordInfo, m: RecordInfo,
                   torch_run: RunReader, ms_run: RunReader) -> Diagnosis:
    """Modules torch runs after the last output that matched and before ``t``, which the port
    lacks: a cell given their weights that never ran, what the port applies there instead, or
    the same computed in its construct less precisely (its outputs nearly torch's)."""
    described = ", ".join(_described(torch_run.record(name, "forward")) for name in missing)
    ran = f"torch runs {described} after the last output that matched and before {t.name}"
    idle = _holding_but_never_run(missing, ms_run)
    applied = None if idle else functional.applied_activation(ms_run, m)
    if applied not in (None, "nothing"):
        return Diagnosis(cause="activation between modules differs",
                         detail=f"{ran}; MindSpore has no cell for it and applies {applied} in "
                                f"its construct there (told from {m.name}'s input).",
                         confidence="likely")
    if idle:
        them = "it" if len(idle) == 1 else "them"
        port = f"MindSpore's {', '.join(idle)} {'holds' if len(idle) == 1 else 'hold'} its " \
            f"weights but never ran: the construct does not call {them} (a cell set on a " \
            "SequentialCell with setattr stays out of the cells it runs)"
    else:
        port = "the port leaves it out, or computes it otherwise in its construct"
    nearly = first.rms / first.ref_rms if first.ref_rms else math.inf
    if not idle and nearly < NEARLY_THE_SAME:
        return Diagnosis(cause="computed otherwise in the port",
                         detail=f"{ran}, and MindSpore has no counterpart, yet {t.name} differs "
                                f"from torch's by {nearly:.2g} of its norm only: the port "
                                "computes it in its construct, at lower precision (a float16 "
                                "cast rounds to 4.9e-4 of a value) or with a less accurate "
                                "kernel there. A left-out operation would differ by far more.",
                         confidence="guess")
    return Diagnosis(cause="operation missing in the port",
                     detail=f"{ran}, and MindSpore has no counterpart: {port}.",
                     confidence="likely")


def _replaced_cause(missing: Sequence[str], extra: Sequence[str], t: RecordInfo,
                    m: RecordInfo, torch_run: RunReader, ms_run: RunReader) -> Diagnosis:
    """As many modules on each side, unpaired, after the last output that matched and before
    the first divergence: the port computes others in their place (mindcv's MixNet squeezes
    and excites through a ReLU where timm's does through the block's SiLU: it was told "extra
    operation in the port", torch's SiLU unnamed)."""
    theirs = ", ".join(_described(torch_run.record(name, "forward")) for name in missing)
    ours = ", ".join(_described(ms_run.record(name, "forward")) for name in extra)
    place = "its place" if len(extra) == 1 else "their place"
    return Diagnosis(cause="different operation",
                     detail=f"after the last output that matched and before {t.name}, torch "
                            f"runs {theirs}, MindSpore {ours} in {place}: the port computes "
                            "another operation there.", confidence="likely")


def _described(record: RecordInfo) -> str:
    """A module by its name, op and GELU form: 2 (gelu, approximate='none')."""
    form = f", approximate='{record.attrs['approximate']}'" if "approximate" in record.attrs \
        else ""
    return f"{record.name} ({record.op}{form})" if record.op else record.name


def _holding_but_never_run(torch_modules: Sequence[str], ms_run: RunReader) -> List[str]:
    """The MindSpore cells given the weights of ``torch_modules`` (record names) that never
    ran (align.cells_never_run)."""
    never_run = cells_never_run(module_map_from_parameters(ms_run.manifest.get("param_map", {})),
                                [r for r in ms_run.records if r.kind == "forward"])
    return list(dict.fromkeys(cell for name in torch_modules
                              for cell in never_run.get(module_of(name.partition("#")[0]), ())))


def _reordered(*sides: Tuple[str, RecordInfo, List[str], RunReader, Set[str], Dict[str, str]]
               ) -> Optional[Diagnosis]:
    """Modules one side runs just before the first divergence and the other side runs
    elsewhere: unmatched on both sides, since records pair in order (a MindSpore
    TransformerEncoderLayer(norm_first=True) for torch's post-norm one: its norm1 was called
    an extra operation with no torch counterpart). Each side: its name, its record of the
    first divergence, the unmatched modules it runs just before it, its run, all it left
    unmatched, and its modules' counterparts by their weights (a norm of another name:
    timm's PoolFormer pools, then normalises, mindcv's normalises, then pools; the pools
    paired, and "missing activation" was said)."""
    for (side, record, names, _, _, modules), (other, _, _, other_run, other_left, _) in \
            (sides, sides[::-1]):
        counterparts = [_counterpart(name, modules) for name in names]
        there = _runs_after(counterparts, other_run, other_left)
        if names and there:
            them, verb = ("it", "runs") if len(names) == 1 else ("them", "run")
            if counterparts != names:
                them = f"{', '.join(counterparts)}, holding the same weights,"
            return Diagnosis(cause="operations run in another order",
                             detail=f"{side} runs {', '.join(names)} just before {record.name}; "
                                    f"{other} {verb} {them} elsewhere, after {there}: the same "
                                    "modules in another order (a normalisation before its "
                                    "block on one side and after it on the other, as "
                                    "norm_first sets).", confidence="likely")
    return None


def _counterpart(name: str, modules: Mapping[str, str]) -> str:
    """The other side's module of a record's name (its call index kept), where their weights
    pair it with one; else the name itself."""
    base, hash_, call = name.partition("#")
    return modules.get(base, base) + hash_ + call


def _runs_after(names: Sequence[str], run: RunReader, unmatched: Set[str]) -> str:
    """Where ``run`` calls forward modules of these names that it left unmatched too: after
    its last matched forward record before the first of them ("" when it lacks one)."""
    records = [run.record(name, "forward") for name in names]
    if not records or any(r is None or r.name not in unmatched for r in records):
        return ""
    first = min(r.order for r in records)
    before = [r for r in run.records
              if r.kind == "forward" and r.order < first and r.name not in unmatched]
    return max(before, key=lambda r: r.order).name if before else "the model's input"


def _factor(ratio: float) -> str:
    return f"{ratio:.4g}×" if abs(ratio) >= 1 else f"1/{1 / ratio:.4g} of"


def _label_count(torch_run: RunReader) -> int:
    """How many labels a mean loss divides by: one per sample, or per pixel or token."""
    labels = torch_run.record("target", "input")
    return int(np.prod(labels.shape)) if labels is not None else 0


def _ratio_cause(ratio: float, config: Dict, what: str, labels: int) -> Optional[Diagnosis]:
    scale = float(config.get("ms_loss_scale", 1.0) or 1.0)
    if labels > 1 and _close(ratio, labels):
        return Diagnosis(cause="loss reduction sum vs mean",
                         detail=f"MindSpore {what} are {_factor(ratio)} torch's = the number of "
                                f"labels ({labels}): the loss is summed instead of averaged.",
                         confidence="likely")
    if scale != 1.0 and (_close(ratio, scale) or _close(ratio, 1.0 / scale)):
        return Diagnosis(cause="loss scale not undone",
                         detail=f"MindSpore {what} are {_factor(ratio)} torch's with loss_scale "
                                f"{scale:g}: the loss and the optimizer's loss_scale disagree.",
                         confidence="likely")
    return None


def _loss_targets(torch_run: RunReader, ms_run: RunReader) -> Optional[Diagnosis]:
    """The two losses aim at different targets: label smoothing differs.

    For a mean cross entropy over N rows the gradient w.r.t. the logits is (p − t)/N; with the
    forward matching, p is the same on both sides, so N·(g_torch − g_ms) is MindSpore's target
    minus torch's. Label smoothing changes it by one constant on the label and another, −1/(K−1)
    of it, on each other class (each target row sums to 1).
    """
    t_out, m_out = loss.output_gradient(torch_run), loss.output_gradient(ms_run)
    labels = torch_run.record("target", "input")
    if t_out is None or m_out is None or labels is None or len(t_out.shape) != 2 \
            or tuple(t_out.shape) != tuple(m_out.shape):
        return None
    rows, classes = t_out.shape
    y = np.asarray(torch_run.tensor(labels)).reshape(-1).astype(np.int64)
    if classes < 2 or y.shape != (rows,) or y.min() < 0 or y.max() >= classes:
        return None
    shift = rows * (torch_run.tensor(t_out).astype(np.float64) - ms_run.tensor(m_out))
    on_label = np.zeros(shift.shape, bool)
    on_label[np.arange(rows), y] = True
    on, off = float(shift[on_label].mean()), float(shift[~on_label].mean())
    structured = np.where(on_label, on, off)
    if not (abs(on) > 0 and _close(off, -on / (classes - 1), 0.05)
            and np.sqrt(np.mean((shift - structured) ** 2)) <= 0.05 * np.sqrt(np.mean(shift ** 2))):
        return None
    detail = (f"MindSpore's loss targets differ from torch's by {on:+.4g} on the label and "
              f"{off:+.4g} on each other class (from the gradient w.r.t. the {classes} outputs)")
    config = torch_run.manifest.get("config", {})
    if config.get("torch_loss") is None:
        eps = float(config.get("label_smoothing", 0.0))
        torch_off = eps / classes
        torch_on = 1 - eps + torch_off
        ms_on, ms_off = torch_on + on, torch_off + off
        detail += (f": MindSpore's are {ms_on:.6g} / {ms_off:.4g}, torch's {torch_on:.6g} / "
                   f"{torch_off:.4g} (1 − ε + ε/K and ε/K, ε = {eps:g})")
        if _close(ms_off * (classes - 1), 1 - ms_on, 1e-3):
            detail += (f"; MindSpore's are 1 − ε and ε/(K−1) with ε = {1 - ms_on:.4g}, the "
                       "model zoo's CrossEntropySmooth convention")
    return Diagnosis(cause="label smoothing differs", detail=detail + ".", confidence="likely")


# torch's own float32 error (relative RMS, from its float64 rerun) beyond which a record is
# ill-conditioned: about three digits left. Measured on the correct ResNet50 port: at batch 2,
# 32² (layer4 normalises 2 values per channel) it failed 2 of 3 seeds at records with 0.2 to
# 4 % float32 error; at batch 2, 64² the worst record of a run has 0.5 to 8 % (12 seeds, in
# layer4), at batch 2, 64² in ResNet18 0.004 to 0.6 % (6 seeds).
ILL_CONDITIONED = 1e-3
# BatchNorm over this few values per channel (batch × height × width) amplifies float32
# rounding: ResNet50's layer4 at batch 2, 32² normalises 2 (see ILL_CONDITIONED), and ResNet18
# at batch 2, 32² without the float64 reference fails at layer4.1.bn2 with max_rel 0.0185
# (`parity run --model resnet18 --image-size 32 --no-fp64-reference`), passing with it.
FEW_VALUES_PER_CHANNEL = 16
# Diagnoses that only say where to look: an ill-conditioned record explains the divergence
# better than they do.
FALLBACK_CAUSES = ("loss function differs", "running statistics update differs",
                   "computation between modules differs")


def diagnose(first: Comparison, t: RecordInfo, m: RecordInfo,
             comparisons: Sequence[Comparison], torch_run: RunReader, ms_run: RunReader,
             unmatched: Dict[str, Tuple[str, ...]],
             dropping: Optional[DropMismatch] = None) -> Diagnosis:
    """The likely cause of the first divergence ``first`` (its torch record ``t``, MindSpore's
    ``m``); ``dropping``: the point next to them each side drops at another rate, if any."""
    found = _diagnose(first, t, m, comparisons, torch_run, ms_run, unmatched, dropping)
    if found.confidence == "guess" or found.cause in FALLBACK_CAUSES:
        return _random_step(torch_run, ms_run, comparisons) or \
            _ill_conditioned(first, t, torch_run) or \
            _state_updated_in_the_forward(first, t, comparisons) or found
    return found


RUNNING_STATISTICS = (".running_mean", ".running_var")


def _rows_read_in_another_order(t: RecordInfo, comparisons: Sequence[Comparison]) -> str:
    """A sentence naming the outputs beside ``t`` that one side computes as parts of the
    other's layer, where there are any: they matched as mapped, but a port reading them in
    another order (its ``q`` where torch reads ``k``; the rows a suggested map gave in the port's
    declaration order, a guess) differs right after them. The DPN-like port of tests/tiny.py
    declaring its side conv first was told only where to look."""
    def parent(name: str) -> str:
        return split_part(name)[0].partition("#")[0].rpartition(".")[0]

    parts = [f"{c.name} ({c.mindspore_name})" for c in comparisons
             if c.kind == "forward" and c.passed and parent(c.name) == parent(t.name)
             and any(split_part(name)[1] is not None for name in (c.name, c.mindspore_name or ""))]
    if not parts:
        return ""
    return (f" Beside it, {', '.join(parts[:4])}{' ...' if len(parts) > 4 else ''} are parts "
            "of one output that one side computes apart, each matching as mapped: a port "
            "reading them in another order fails here (a suggested --map gives them in the "
            "port's declaration order, a guess: swap their rows if so).")


def _state_updated_in_the_forward(first: Comparison, t: RecordInfo,
                                  comparisons: Sequence[Comparison]) -> Optional[Diagnosis]:
    """A layer whose output is the first to differ, and whose own state (not a BatchNorm's
    running statistics, which its training output does not read) differs after the step by
    more than that output does: the state it updates in its forward and reads (a spectral
    norm's power iteration, a running average it normalises by) is updated otherwise. State
    computed from an output that differs differs less than it (a running average of it)."""
    if first.kind != "forward" or t.op.startswith("batchnorm") or not first.ms_error:
        return None
    base = first.name.split("#")[0]
    state = [c for c in comparisons if c.kind == "buffer" and not c.passed
             and not c.name.endswith(RUNNING_STATISTICS)
             and f"{c.name.rpartition('.')[0]}.".startswith(f"{base}.")]
    worst = max(state, key=lambda c: c.ms_error, default=None)
    if worst is None or not worst.ms_error > first.ms_error:
        return None
    return Diagnosis(cause="state updated in the forward differs",
                     detail=f"{base} updates {worst.name} in its training forward and reads it: "
                            f"after the step it is {worst.ms_error / first.ms_error:.3g} times as "
                            f"far from torch's as {base}'s output ({worst.ms_error:.2g} against "
                            f"{first.ms_error:.2g} of its norm). The update in the port's "
                            "construct (a power iteration's order, a running average's rate, "
                            "what is assigned when) is the likely cause.", confidence="likely")


def _different_operation(t: RecordInfo, m: RecordInfo) -> Diagnosis:
    """Two modules of different op types whose output is the first to differ. One of a class
    parity has no op type for ("module": the port's own dense cell, say) is most often that
    class computing otherwise from the same weights."""
    torch_side, ms_side = ("torch", t, "module", "forward"), ("MindSpore", m, "cell", "construct")
    unknown = [side for side in (torch_side, ms_side) if side[1].op in ("", "module")]
    if len(unknown) == 1:
        own, _, what, method = unknown[0]
        typed_side, typed = (torch_side if unknown[0] is ms_side else ms_side)[:2]
        return Diagnosis(cause=f"{typed.op} computes something different",
                         detail=f"{typed_side} {typed.name} is {typed.op}, {own} "
                                f"{unknown[0][1].name} a {what} of its own class, whose {method} "
                                "computes otherwise from the same weights (a weight used "
                                "transposed, a bias left out, another formula); everything "
                                "before it matched.", confidence="guess")
    return Diagnosis(cause="different operation",
                     detail=f"torch {t.name} is {t.op or '?'}, MindSpore {m.name} is "
                            f"{m.op or '?'}; everything before it matched.", confidence="guess")


def _key_bias_left(t: RecordInfo, m: RecordInfo, ms_run: RunReader) -> Optional[Diagnosis]:
    """The output of a port's key layer without bias, compared with its columns of torch's
    fused layer whose bias rows for it went to no parameter (weights._key_unbiased): torch adds
    that bias there, the port cannot."""
    module, part = split_part(t.name)
    if part is None:
        return None
    rows = Part(part.start, part.stop).of(f"{module}.bias")
    if rows not in (ms_run.manifest.get("torch_rows_left") or ()):
        return None
    return Diagnosis(cause="bias missing in the port's key layer",
                     detail=f"MindSpore's {m.name} has no bias, while torch's {module} adds "
                            f"{rows} to these columns: every token's output differs by it. A "
                            "bias on the keys shifts every logit of a row alike, which softmax "
                            "ignores, so what follows may match; build the port's layer with "
                            "has_bias=True to compare it with torch's.", confidence="likely")


def _drawing_between_modules(t: RecordInfo, m: RecordInfo, torch_run: RunReader,
                             ms_run: RunReader, where: str) -> Optional[Diagnosis]:
    """Where one side's step alone draws random numbers and the first output to differ takes
    an input that differs while every module output before it matched (and no dropping module
    stands there: compare/dropping.py tells those): that side likely drops between the modules.
    timm's classifier heads call ``F.dropout(x, p=self.drop_rate, training=self.training)``:
    its legacy SE-ResNeXt-26 against mindcv's, built without dropout, was told only "the step
    is not deterministic", nowhere named."""
    drawing = [run for run in (torch_run, ms_run) if run.step_is_random]
    if len(drawing) != 1:
        return None
    if drawing[0] is torch_run:
        return Diagnosis(
            cause="Dropout in torch's forward, not a module",
            detail=f"{t.name}'s input (MindSpore's {m.name}) already differs from the port's "
                   "while every module output before it matched, and two torch steps from the "
                   f"same state differ: torch likely draws random numbers just before {t.name}, "
                   f"in {where} (an F.dropout, as timm's classifier heads call with their "
                   "drop_rate), which parity cannot run as identity; the port runs no dropout "
                   "there. If torch trains with it, the port lacks it: add an nn.Dropout cell "
                   "of torch's rate there; for the check, build torch's with rate 0 (timm: "
                   "drop_rate=0).", confidence="likely")
    return Diagnosis(
        cause="Dropout in the port's construct, not a cell",
        detail=f"MindSpore's {m.name} (torch's {t.name}) takes an input that already differs "
               "from torch's while every module output before it matched, and two MindSpore "
               "steps from the same state differ: the port likely draws random numbers in its "
               f"construct just before {m.name} (ops.dropout), which parity cannot run as "
               "identity; torch runs no dropout there. Remove it, or hold it as an nn.Dropout "
               "cell (run as identity in the check).", confidence="likely")


def _random_step(torch_run: RunReader, ms_run: RunReader,
                 comparisons: Sequence[Comparison]) -> Optional[Diagnosis]:
    """A side whose two hook-free steps from the same state differ draws random numbers.

    Where a dropout module's rate differs too, that rate is the likely cause: a layer that
    also drops outside its dropout module (MultiheadAttention's attention weights, with the
    rate TransformerEncoderLayer hands both) draws on the side whose rate is not 0. The
    first output to differ is then that layer's, before its dropout module's (a MindSpore
    TransformerEncoderLayer(dropout=0.2) for torch's dropout=0.0 was told only "not
    deterministic", first at self_attn)."""
    random = [run.framework for run in (torch_run, ms_run) if run.step_is_random]
    if not random:
        return None
    rate = _differing_drop_rate(comparisons, torch_run, ms_run)
    if rate is not None:
        return Diagnosis(cause=rate.cause,
                         detail=f"{rate.detail} And two {' and '.join(random)} steps from the "
                                "same state differ: dropout outside the dropout modules (a "
                                "functional one, as in attention), which parity cannot run as "
                                "identity, is likely drawing at that rate.",
                         confidence="likely")
    return Diagnosis(cause="the step is not deterministic",
                     detail=f"two {' and '.join(random)} steps from the same state differ: a "
                            "random op outside dropout modules (functional dropout, stochastic "
                            "depth, noise) or a nondeterministic kernel. The frameworks cannot "
                            "draw the same random numbers: make the step deterministic for the "
                            "check (dropout modules already run as identity).",
                     confidence="likely")


def _differing_drop_rate(comparisons: Sequence[Comparison], torch_run: RunReader,
                         ms_run: RunReader) -> Optional[Diagnosis]:
    """The cause a dropout pair's recorded rates prove, for the first pair whose rates
    differ."""
    for comparison in comparisons:
        if comparison.kind != "forward":
            continue
        t = torch_run.record(comparison.name, "forward")
        m = ms_run.record(comparison.mindspore_name or comparison.name, "forward")
        if t is not None and m is not None and different_drop_rates(t, m) is not None:
            return settings_cause(t, m)
    return None


def _ill_conditioned(first: Comparison, t: RecordInfo,
                     torch_run: RunReader) -> Optional[Diagnosis]:
    """A record where float32 itself is far from exact: measured by torch's float64 step, or,
    without it (--no-fp64-reference), suspected where BatchNorm normalises few values per
    channel before it."""
    where = _few_values_per_channel(first, t, torch_run)
    if first.fp32_noise >= ILL_CONDITIONED:
        return Diagnosis(
            cause="float32 ill-conditioned here",
            detail=f"torch's own float32 {first.name} · {first.kind} is "
                   f"{100 * first.fp32_noise:.2g} % from its float64 result, MindSpore's "
                   f"differs from torch's by {100 * first.ms_error:.2g} %: two correct float32 "
                   f"computations can differ that much here.{where} A larger batch or image "
                   "checks this part of the network reliably.", confidence="likely")
    if math.isnan(first.fp32_noise) and where and \
            torch_run.manifest.get("fp64_reference") is False:
        return Diagnosis(
            cause="float32 may be ill-conditioned here (no float64 reference)",
            detail=f"{first.name} · {first.kind} differs by {first.max_rel:.2g} at most and "
                   f"every earlier record matched.{where} Past so few values two correct "
                   "float32 computations can differ by percents, which fixed tolerances cannot "
                   "tell from a bug: run again without --no-fp64-reference (torch's float64 step "
                   "measures its own float32 error there), or with a larger batch or image.",
            confidence="guess")
    return None


def _loss_follows_the_logits(comparisons: Sequence[Comparison], torch_run: RunReader,
                             ms_run: RunReader) -> Optional[Diagnosis]:
    """Each side's loss the cross entropy of its own logits (compare/loss.py), yet the loss
    failed: judged without the float64 reference, which the engine's allowance needs."""
    found = loss.losses_of_own_logits(torch_run, ms_run)
    if found is None:
        return None
    logits = next((c for c in comparisons if c.kind == "forward" and c.name == found.logits),
                  None)
    if logits is None:
        return None
    return Diagnosis(
        cause="the logits' difference moves the loss",
        detail=f"each side's loss is the cross entropy of its own logits ({found.logits}, "
               f"{logits.max_rel:.2g} apart at most,"
               " judged at their record): the loss function is the same, and the losses differ "
               "because the logits do. Without the float64 reference the loss is held to a fixed "
               "tolerance; with it, the loss is allowed the difference its logits make.",
        confidence="certain")


def _loss_from_unpaired(ratio: float, unmatched: Dict[str, Tuple[str, ...]],
                        torch_run: RunReader, ms_run: RunReader) -> Optional[Diagnosis]:
    """Modules left unpaired whose outputs reach the loss (their output gradients are recorded)
    and feed no later module: the model's output is computed from them in the forward, and
    compared nowhere. A head reading another input in the port, run at another place, stayed
    unpaired on both sides, and the failed loss was told "the logits match"."""
    reaching = [f"{side}'s {name}" for side, run in (("torch", torch_run), ("MindSpore", ms_run))
                for name in unmatched.get(f"{side.lower()} forward", ())
                if run.record(name, "grad") is not None and
                not _feeds_a_later_module(run.record(name, "forward"), run)]
    if not reaching:
        return None
    return Diagnosis(
        cause="the model's output is compared nowhere",
        detail=f"every module output compared matches, but the loss differs (MindSpore/torch = "
               f"{ratio:.6g}), and {first_few(reaching)}, which reach it, were compared nowhere: "
               "left unpaired (they read other inputs, or run at another place), their outputs "
               "feed no module, so the forward computes the model's output from them. What "
               "differs there is the likely cause; pair them by hand with --map FILE "
               "(\"mindspore.name\" = \"torch.name\") to compare them.", confidence="likely")


def _feeds_a_later_module(source: RecordInfo, run: RunReader) -> bool:
    """Whether a module run after ``source`` takes its output as its first input (by sketch)."""
    sketch = input_sketch(run.tensor(source))
    return any(distance is not None and distance <= FED_BY
               for r in run.records if r.kind == "forward" and r.order > source.order
               for distance in [sketch_distance(r.attrs.get("input_sketch"), sketch)])


def _few_values_per_channel(first: Comparison, t: Optional[RecordInfo],
                            torch_run: RunReader) -> str:
    """' bn normalises 2 values per channel (...).' for the training BatchNorm with the fewest
    before ``first`` (any, past the forward) if FEW_VALUES_PER_CHANNEL or fewer; else ''."""
    fewest = _fewest_values_per_channel(torch_run, t if first.kind == "forward" else None)
    if fewest is None or fewest[0] > FEW_VALUES_PER_CHANNEL:
        return ""
    return _normalises(fewest[1], fewest[0])


def _normalises(batch_norm: str, values: int) -> str:
    return f" {batch_norm} normalises {values} values per channel (batch × height × width)."


def _fewest_values_per_channel(torch_run: RunReader,
                               up_to: Optional[RecordInfo]) -> Optional[Tuple[int, str]]:
    """(values, name) of the training BatchNorm that normalises the fewest values per channel;
    only those that ran before ``up_to`` if given."""
    counts = [(values, r.name) for r in torch_run.records
              if (values := _values_per_channel(r)) is not None
              and (up_to is None or r.order <= up_to.order)]
    return min(counts, default=None)


def _values_per_channel(record: RecordInfo) -> Optional[int]:
    """How many values a training BatchNorm's forward record normalises per channel (batch ×
    height × width); None for any other record."""
    if record.kind == "forward" and record.op.startswith("batchnorm") and \
            len(record.shape) > 1 and record.attrs.get("training"):
        return int(np.prod(record.shape)) // record.shape[1]
    return None


def step_settings_differ(torch_run: RunReader, ms_run: RunReader) -> List[str]:
    """The step settings both captures use that differ between their manifests: two captures
    run apart (``parity capture`` on two machines) with different options."""
    torch_config, ms_config = (run.manifest.get("config", {}) for run in (torch_run, ms_run))
    return [f"{key} {torch_config[key]!r} in the torch capture, {ms_config[key]!r} in the "
            f"MindSpore one" for key in SHARED_STEP_SETTINGS
            if key in torch_config and key in ms_config and torch_config[key] != ms_config[key]]


def _diagnose(first: Comparison, t: RecordInfo, m: RecordInfo,
              comparisons: Sequence[Comparison], torch_run: RunReader,
              ms_run: RunReader, unmatched: Dict[str, Tuple[str, ...]],
              dropping: Optional[DropMismatch]) -> Diagnosis:
    ms_config = ms_run.manifest.get("config", {})
    if first.nan_torch + first.nan_mindspore + first.inf_torch + first.inf_mindspore:
        side = "both" if (first.nan_torch + first.inf_torch) and \
            (first.nan_mindspore + first.inf_mindspore) else \
            ("torch" if first.nan_torch + first.inf_torch else "MindSpore")
        return Diagnosis(cause="non-finite values",
                         detail=f"NaN/Inf first appear at {first.name} · {first.kind} on {side} "
                                f"(NaN torch {first.nan_torch} / MindSpore {first.nan_mindspore},"
                                f" Inf torch {first.inf_torch} / MindSpore {first.inf_mindspore})"
                                ": check the batch and the weights.", confidence="certain")
    differing = step_settings_differ(torch_run, ms_run)
    if differing and first.kind in AFTER_THE_FORWARD:
        return Diagnosis(cause="the captures ran different step settings",
                         detail=f"{'; '.join(differing)}: capture both sides with the same "
                                "options (parity run does).", confidence="certain")
    if first.kind == "input" and first.name == "target":
        return Diagnosis(cause="labels differ",
                         detail="the two sides trained on different labels: pass the same "
                                "--input file (or seed) to both captures.", confidence="certain")
    if first.kind == "input":
        how = batch_difference if first.name == "input" else further_input_difference
        return Diagnosis(cause="preprocessing differs",
                         detail=f"the model {first.name} differs before the first layer: "
                                f"{how(torch_run.tensor(t), ms_run.tensor(m))}",
                         confidence="certain")
    if first.kind == "forward":
        return _key_bias_left(t, m, ms_run) or _forward_cause(
            first, t, m, comparisons, torch_run, ms_run, unmatched, dropping)
    if first.kind == "loss":
        torch_loss, ms_loss = (float(np.asarray(run.tensor(r)).reshape(-1)[0])
                               for run, r in ((torch_run, t), (ms_run, m)))
        ratio = ms_loss / torch_loss if torch_loss else float("nan")
        found = _ratio_cause(ratio, ms_config, "loss values", _label_count(torch_run)) or \
            _loss_targets(torch_run, ms_run) or \
            _loss_follows_the_logits(comparisons, torch_run, ms_run) or \
            _loss_from_unpaired(ratio, unmatched, torch_run, ms_run)
        if found:
            return found
        last = loss.output_gradient(torch_run)
        after = f"{last.name}'s, the last before the loss, too" if last is not None else \
            "the last too"
        return Diagnosis(cause="loss function differs",
                         detail=f"every module output matches, {after}, but the loss differs "
                                f"(MindSpore/torch = {ratio:.6g}): the loss function (reduction,"
                                " label smoothing (ε/K vs ε/(K−1)), class weights or "
                                "ignore_index), or what the forward computes after its last "
                                "module.", confidence="likely")
    if first.kind == "grad" and sums.REASON in first.reason:
        module = first.name.rpartition(".")[0]
        terms = "its output gradient times x̂" if first.name.endswith("weight") else \
            "its output gradient"
        forward = torch_run.record(module, "forward")
        layer = "BatchNorm" if forward is not None and forward.op.startswith("batchnorm") \
            else "layer"
        return Diagnosis(cause=f"{layer} backward differs",
                         detail=f"MindSpore's {m.name} gradient is not the sum over batch and "
                                f"space of {terms}, while {module}'s forward and output "
                                "gradient match torch's: a custom bprop or a stop_gradient in "
                                f"that {layer}.", confidence="likely")
    if first.kind == "grad":
        found = _padding_row_cause(t, m, torch_run, ms_run)
        if found is None:
            ratio = _median_ratio(torch_run.tensor(t), ms_run.tensor(m))
            found = _ratio_cause(ratio, ms_config, "gradients", _label_count(torch_run)) or \
                _loss_targets(torch_run, ms_run) or _next_modules_backward(t, torch_run,
                                                                          comparisons)
        return found or Diagnosis(
            cause="backward differs while forward matches",
            detail=f"{first.name}'s gradient is the first (in backward order) to differ: a "
                   "custom bprop, a stop-gradient, or a non-differentiable op in the port.",
            confidence="guess")
    sides = frozen_on_one_side(t, m)
    if sides == ("MindSpore", "torch") and t.name in (torch_run.manifest.get("no_gradient")
                                                        or ()):
        return Diagnosis(cause="no gradient in torch's step",
                         detail=f"torch's step gave {t.name} no gradient and left it as it was; "
                                f"MindSpore's stepped {m.name}. A MindSpore capture made with "
                                "--reference TORCH_RUN leaves such parameters out of its step "
                                "too; this one was made without it.", confidence="certain")
    if sides is not None:
        names = {"torch": t.name, "MindSpore": m.name}
        trained, frozen = sides
        return Diagnosis(cause=FROZEN_ON_ONE_SIDE,
                         detail=f"{trained} trains {names[trained]} while {frozen}'s "
                                f"{names[frozen]} has requires_grad=False: freeze it on both "
                                "sides or on neither.", confidence="certain")
    if first.kind in ("update", "optimizer_state", "weight"):
        return _update_cause(first, t, m, torch_run, ms_run, ms_config)
    return _buffer_cause(first, t, m, torch_run, ms_run)


def _padding_row_cause(t: RecordInfo, m: RecordInfo, torch_run: RunReader,
                       ms_run: RunReader) -> Optional[Diagnosis]:
    """An embedding table's gradient that differs in its padding row only, where torch's is
    zero: torch's nn.Embedding(padding_idx=k) gives row k no gradient, MindSpore's gives it
    one, with padding_idx or without (nn.Embedding, 2.8.0, measured: the row summed the output
    gradients of the padding positions)."""
    embedding = torch_run.record(t.name.rpartition(".")[0], "forward")
    if t.attrs.get("activation") or not t.name.endswith(".weight") or embedding is None \
            or embedding.op != "embedding" or embedding.attrs.get("padding_idx") is None:
        return None
    row = int(embedding.attrs["padding_idx"])
    a, b = torch_run.tensor(t), ms_run.tensor(m)
    if a.shape != b.shape or a.ndim != 2 or not 0 <= row < a.shape[0] or np.any(a[row]):
        return None
    difference = np.abs(b.astype(np.float64) - a)
    in_row, elsewhere = difference[row].max(), np.delete(difference, row, axis=0).max(initial=0)
    if not in_row > 1e3 * elsewhere:
        return None
    return Diagnosis(cause="Embedding padding row gets a gradient",
                     detail=f"torch's {embedding.name} has padding_idx={row}, so its row {row} "
                            f"gets no gradient; MindSpore's {m.name} row {row} does (largest "
                            f"element {in_row:.3g}), and the rest of the table matches: "
                            "MindSpore's nn.Embedding passes the padding positions' gradient on, "
                            "padding_idx or not. In the port, look the ids up in the table times "
                            f"a mask that zeroes row {row} (ops.gather(table * keep, ids, 0)): "
                            "the row then gets no gradient, as in torch.",
                     confidence="certain")


def _next_modules_backward(t: RecordInfo, torch_run: RunReader,
                           comparisons: Sequence[Comparison]) -> Optional[Diagnosis]:
    """The gradient w.r.t. a module's output is the first to differ, while the gradient w.r.t.
    the output of the module run right after it matches: that module's backward (which turns
    one into the other in a sequential stretch) is where the port's backward differs."""
    if not t.attrs.get("activation"):
        return None
    forwards = [r for r in torch_run.records if r.kind == "forward"]
    index = next((i for i, r in enumerate(forwards) if r.name == t.name), None)
    if index is None or index + 1 == len(forwards):
        return None
    after = forwards[index + 1]
    if not any(c.kind == "grad" and c.name == after.name and c.passed for c in comparisons):
        return None
    if after.op == "selu":
        return Diagnosis(cause="MindSpore's SeLU gradient is wrong",
                         detail=f"the gradient w.r.t. {t.name}'s output differs while the one "
                                f"w.r.t. {after.name}'s (a SELU) matches: {kernels.SELU_GRADIENT}",
                         confidence="certain")
    if after.op == "mish":
        return Diagnosis(cause="MindSpore's CPU Mish gradient is inaccurate",
                         detail=f"the gradient w.r.t. {t.name}'s output differs while the one "
                                f"w.r.t. {after.name}'s (a Mish) matches: {kernels.MISH_GRADIENT}",
                         confidence="likely")
    few = _values_per_channel(after)
    cancels = few is not None and few <= FEW_VALUES_PER_CHANNEL
    return Diagnosis(cause=f"{after.name}'s backward differs",
                     detail=f"the gradient w.r.t. {t.name}'s output differs while the one "
                            f"w.r.t. {after.name}'s, the module run after it, matches: "
                            f"{after.name}'s backward (a custom bprop, a stop_gradient, an "
                            "operation whose gradient differs) turns one into the other, if it "
                            f"is what consumes {t.name}'s output."
                            + (f"{_normalises(after.name, few)} The terms of its backward "
                               "nearly cancel there (with 2 values, exactly but for eps), and "
                               "two correct float32 computations of what is left can be far "
                               "apart. A larger batch or image checks it again." if cancels
                               else ""),
                     confidence="guess" if cancels else "likely")


def _update_cause(first: Comparison, t: RecordInfo, m: RecordInfo, torch_run: RunReader,
                  ms_run: RunReader, config: Dict) -> Diagnosis:
    param, ms_param = split_state(first.name)[0], split_state(m.name)[0]
    t_update, m_update = torch_run.record(param, "update"), ms_run.record(ms_param, "update")
    t_weight, m_grad = torch_run.record(param, "weight"), ms_run.record(ms_param, "grad")
    lr, wd = float(config.get("lr", 0)), float(config.get("weight_decay", 0))
    if t_update is not None and m_update is not None and t_weight is not None:
        du, mu = torch_run.tensor(t_update), ms_run.tensor(m_update)
        w0 = torch_run.tensor(t_weight).astype(np.float64) - du
        step_config = {**config, "lr": lr, "weight_decay": wd}
        decay_step = -optimizer.torch_step(np.zeros_like(w0), w0, step_config)
        decay_term = f"lr·wd·w{'·(1 + momentum)' if config.get('nesterov') else ''}"
        # against torch's step of MindSpore's own gradient, a decay skipped shows exactly even
        # where the gradients differ (ReLU flips); torch's update is the fallback
        own_gradient = m_grad is not None and m_grad.shape == m_update.shape
        own = optimizer.torch_step(ms_run.tensor(m_grad), w0, step_config) if own_gradient \
            else du
        scale = float(config.get("ms_loss_scale", 1.0) or 1.0)
        # MindSpore's optimizers add wd·w to the gradient divided by loss_scale (float32, as
        # here): an unscaled loss's update is no fixed multiple of torch's
        if scale != 1.0 and own_gradient and optimizer.step_error(
                ms_run.tensor(m_grad) / np.float32(scale), w0, mu, step_config) <= 1:
            return Diagnosis(cause="loss scale not undone",
                             detail=f"MindSpore's update of {param} is torch's "
                                    f"{optimizer.name(config)} step of its "
                                    f"gradient divided by loss_scale {scale:g}, to float32 "
                                    "rounding: its optimizer unscales a loss that was never "
                                    "scaled (multiply the loss by loss_scale, or leave "
                                    "loss_scale at 1).", confidence="certain")
        if optimizer.is_adam(config) and own_gradient:
            # Adam's update of a gradient far above eps is -lr·sign(g + wd·w) whatever the
            # decay, and the step without it, to rounding, tells; before the conventions, one
            # of which (the decay coupled otherwise) can match it where wd·w is that small
            undecayed = {**step_config, "weight_decay": 0.0}
            if wd and optimizer.step_error(ms_run.tensor(m_grad), w0, mu, undecayed) <= 1:
                return Diagnosis(cause="weight decay skipped on the MindSpore side",
                                 detail=f"{param}'s update is torch's {optimizer.name(config)} "
                                        "step of MindSpore's own gradient without weight decay, "
                                        "to float32 rounding: MindSpore optimizers skip "
                                        "parameters named gamma/beta (and some set-ups bias) "
                                        "unless told otherwise; torch decays all.",
                                 confidence="likely")
            found = _adam_convention_cause(param, ms_run.tensor(m_grad), w0, mu, step_config)
            if found:
                return found
        if np.abs(decay_step).max() > 0 and _close(_median_ratio(decay_step, mu - own), 1.0, 0.1):
            return Diagnosis(cause="weight decay skipped on the MindSpore side",
                             detail=f"{param}'s update differs by exactly {decay_term}: MindSpore "
                                    "optimizers skip parameters named gamma/beta (and some set-"
                                    "ups bias) unless told otherwise; torch decays all.",
                             confidence="likely")
        if _close(_median_ratio(decay_step, own - mu), 1.0, 0.1):
            return Diagnosis(cause="weight decay applied only on the MindSpore side",
                             detail=f"{param}'s update differs by {decay_term}.",
                             confidence="likely")
        found = _ratio_cause(_median_ratio(own, mu), config, "updates",
                             _label_count(torch_run))
        if found:
            return found
    # the update failed the check against torch's step of MindSpore's own gradient
    own_step = optimizer.REASON in first.reason
    settings = "betas, eps, weight decay (Adam's added to the gradient, AdamW's decoupled)" \
        if optimizer.is_adam(config) else "momentum, nesterov, dampening, weight decay"
    return Diagnosis(cause="optimizer step differs",
                     detail=f"{'' if own_step else 'gradients match but '}{first.name} · "
                            f"{first.kind} differs: compare lr, {settings}, its scope and the "
                            "loss scale between the two optimizers.",
                     confidence="likely" if own_step else "guess")


def _adam_convention_cause(param: str, grad: np.ndarray, w0: np.ndarray, update: np.ndarray,
                           config: Dict) -> Optional[Diagnosis]:
    """MindSpore's update that is, to rounding, the step of another Adam than torch's."""
    found = optimizer.adam_convention(grad, w0, update, config)
    if found is None:
        return None
    convention, coupling = found
    beta1, beta2 = float(config["beta1"]), float(config["beta2"])
    what = []
    if convention == "eps before the bias correction":
        what.append(f"with eps added before the bias correction, as "
                    f"{optimizer.ADAM_CONVENTIONS[convention]} do (it acts as eps/√(1 − β2) = "
                    f"{float(config['eps']) / np.sqrt(1 - beta2):.2g} on the first step, so "
                    "gradients near it move less than in torch)")
    elif convention == "no bias correction":
        what.append(f"without bias correction, as {optimizer.ADAM_CONVENTIONS[convention]} "
                    f"does (its first update is (1 − β1)/√(1 − β2) = "
                    f"{(1 - beta1) / np.sqrt(1 - beta2):.3g} times torch's)")
    if coupling != config["optimizer"]:
        what.append("with weight decay added to the gradient (Adam's, nn.Adam's) where torch's "
                    "AdamW decouples it" if coupling == "adam" else
                    "with weight decay decoupled (AdamW's, nn.AdamWeightDecay's) where torch's "
                    "Adam adds it to the gradient")
    cause = f"MindSpore's Adam differs: {convention}" if convention else \
        "weight decay coupled otherwise"
    return Diagnosis(cause=cause,
                     detail=f"MindSpore's update of {param} is torch's {optimizer.name(config)} "
                            f"step of its gradient {' and '.join(what)}, to float32 rounding. "
                            "mindspore.experimental.optim.AdamW steps as torch's AdamW (for "
                            "torch's Adam: its weight_decay 0, wd·w added to the gradient).",
                     confidence="certain")


def _norm_class(op: str) -> str:
    """MindSpore's class for a BatchNorm op type: batchnorm3d -> BatchNorm3d."""
    return f"BatchNorm{op[-2:]}" if op[-2:] in ("1d", "2d", "3d") else "BatchNorm2d"


def _ms_norm_holding(buffer: str, ms_run: RunReader) -> Optional[RecordInfo]:
    """The forward record of the MindSpore BatchNorm holding ``buffer``: its cell's, or the
    nearest enclosing cell's (nn.BatchNorm3d holds its statistics in a BatchNorm2d it runs,
    which is not recorded)."""
    norms = {r.name.split("#")[0]: r for r in ms_run.records
             if r.kind == "forward" and r.op.startswith("batchnorm")}
    module = buffer.rpartition(".")[0]
    while module and module not in norms:
        module = module.rpartition(".")[0]
    return norms.get(module)


def _buffer_cause(first: Comparison, t: RecordInfo, m: RecordInfo, torch_run: RunReader,
                  ms_run: RunReader) -> Diagnosis:
    module = first.name.rpartition(".")[0]
    t_bn = torch_run.record(module, "forward")
    ms_bn = _ms_norm_holding(first.mindspore_name, ms_run)
    if t_bn is not None and ms_bn is not None:
        # MindSpore's BatchNorm2d(momentum=m) stores 1 - m: torch's convention, comparable as is
        t_m, m_stored = t_bn.attrs.get("momentum"), ms_bn.attrs.get("momentum")
        if isinstance(t_m, (int, float)) and isinstance(m_stored, (int, float)) \
                and not np.isclose(t_m, m_stored):
            return Diagnosis(cause="BatchNorm momentum convention",
                             detail=f"torch momentum={t_m:g} weights the new batch statistic; "
                                    f"MindSpore's momentum weights the old value, so {module} "
                                    f"needs {_norm_class(t_bn.op)}(momentum={1 - t_m:g}), not "
                                    f"momentum={1 - m_stored:g}.", confidence="certain")
    before = _before_the_step(first, t, m, t_bn, torch_run)
    if before is not None:
        found = _updated_twice(first, t, m, before, torch_run, ms_run)
        if found is None and first.name.endswith("running_var"):
            found = _biased_variance(first, t, m, t_bn, before, torch_run, ms_run)
        if found:
            return found
    return Diagnosis(cause="running statistics update differs",
                     detail=f"only {first.name} differs after the step: BN momentum "
                            "convention or running-statistics update.", confidence="likely")


def _before_the_step(first: Comparison, t: RecordInfo, m: RecordInfo,
                     t_bn: Optional[RecordInfo],
                     torch_run: RunReader) -> Optional[Tuple[float, np.ndarray]]:
    """Torch's BatchNorm momentum (its convention) and the running statistic's value before the
    step, from the torch capture's starting point; None where either is not known."""
    if t_bn is None:
        return None
    momentum, initial = t_bn.attrs.get("momentum"), initial_weights(torch_run)
    if not isinstance(momentum, (int, float)) or len(t_bn.shape) < 2 or initial is None:
        return None
    v0 = initial.get(first.name)
    if v0 is None or tuple(v0.shape) != tuple(t.shape) or tuple(m.shape) != tuple(t.shape):
        return None
    return float(momentum), np.asarray(v0, np.float64)


def _biased_variance(first: Comparison, t: RecordInfo, m: RecordInfo, t_bn: RecordInfo,
                     before: Tuple[float, np.ndarray], torch_run: RunReader,
                     ms_run: RunReader) -> Optional[Diagnosis]:
    """MindSpore's running_var moved towards the biased batch variance where torch uses the
    unbiased one: its step is (n−1)/n of torch's, n the values per channel.

    With momentum μ (torch's convention) and the value v0 before the step, each side's step is
    v1 − (1−μ)·v0 = μ·(batch variance); their median ratio is measured against (n−1)/n.
    """
    momentum, v0 = before
    n = int(np.prod(t_bn.shape)) // t_bn.shape[1]
    kept = (1 - momentum) * v0
    ratio = _median_ratio(torch_run.tensor(t) - kept, ms_run.tensor(m) - kept)
    if n < 2 or not abs(ratio - (n - 1) / n) <= 0.25 / n:
        return None
    return Diagnosis(cause="running variance estimator differs",
                     detail=f"MindSpore's {m.name} stepped ×{ratio:.6g} of torch's: the biased "
                            f"batch variance, (n−1)/n with n = {n} values per channel, where "
                            "torch's running update uses the unbiased one.",
                     confidence="likely")


# How far the ratio of the two sides' moves may lie from 2 − μ (or its inverse), relatively,
# for "updated twice": float32 rounding moved it by 4e-8 at the median, 2.7e-6 at the worst
# channel (a conv-BN-ReLU block under torch.utils.checkpoint against its port without
# recomputation, batch 2, 64², the 44th round).
TWICE_TOLERANCE = 1e-3


def _updated_twice(first: Comparison, t: RecordInfo, m: RecordInfo,
                   before: Tuple[float, np.ndarray], torch_run: RunReader,
                   ms_run: RunReader) -> Optional[Diagnosis]:
    """One side's BatchNorm took two momentum updates from the same batch statistic s, the
    other's one: once moves v0 by μ·(s − v0), twice by μ·(2−μ)·(s − v0), so the two sides'
    moves are 2 − μ apart. A block that runs again in the backward does it: activation
    checkpointing (torch.utils.checkpoint; MindSpore's Cell.recompute() too, measured on
    MindSpore 2.8.0 CPU) runs the BatchNorm's forward, with its update, a second time."""
    momentum, v0 = before
    twice = 2 - momentum
    ratio = _median_ratio(ms_run.tensor(m) - v0, torch_run.tensor(t) - v0)    # torch's / MS's
    module = first.name.rpartition(".")[0]
    if abs(ratio - twice) <= TWICE_TOLERANCE * twice:
        return Diagnosis(
            cause="running statistics updated twice in torch's step",
            detail=f"torch's {first.name} moved {ratio:.6g} times as far as MindSpore's "
                   f"from its value before the step (2 − momentum): two updates from one batch "
                   f"where the port's took one, as when {module} runs again in torch's "
                   "backward. Activation checkpointing (torch.utils.checkpoint) reruns the "
                   "block it wraps, BatchNorm updates and all, in training too. For the port to "
                   "train alike, recompute the same block in MindSpore (Cell.recompute() "
                   "updates twice as well), or check both with checkpointing off.",
            confidence="likely")
    if abs(ratio * twice - 1) <= TWICE_TOLERANCE:
        return Diagnosis(
            cause="running statistics updated twice in MindSpore's step",
            detail=f"MindSpore's {m.name} moved {1 / ratio:.6g} times as far as torch's "
                   f"from its value before the step (2 − momentum): two updates from one batch "
                   f"where torch's took one, as when its BatchNorm runs again in MindSpore's "
                   "backward. A recomputed cell (Cell.recompute()) reruns its construct, "
                   "BatchNorm updates and all, in training too. For torch to train alike, "
                   "checkpoint the same block (torch.utils.checkpoint updates twice as well), "
                   "or check both without recomputation.", confidence="likely")
    return None
