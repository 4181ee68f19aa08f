"""Why a module's output differs, every earlier output having matched: the first divergence
at a forward record (diagnosis.py dispatches the rest of the step).

Settings recorded at capture prove a cause ("certain", compare/settings.py); otherwise the
records around the divergence tell it ("likely"): modules one side runs and the other does not,
an input taken from another module, a mask applied otherwise, an input that already differs,
told by its sketch (compare/inputs.py). Failing those, the message says where to look.
"""

from __future__ import annotations

import math
from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence, Set, Tuple

import numpy as np

from parity.align import ACTIVATION_OPS, GENERIC_OP, cells_never_run, module_map_from_parameters
from parity.compare import (attention, conditioning, functional, inputs, kernels, reorder,
                            resize)
from parity.compare.dropping import DropMismatch
from parity.compare.settings import (counting_padding, settings_cause, softmax_axis,
                                     uncounted_padding)
from parity.compare.structure import declared_eps, op_family
from parity.errors import first_few
from parity.records import (CONTAINER_OPS, Comparison, Diagnosis, Part, RecordInfo, module_of,
                            split_part)
from parity.rundir import RunReader, initial_weights


# A module's input differing by this share of its output's relative error or more is taken
# as the cause: a ±1 projection shows a difference at about its RMS (an order below by chance
# with probability 8 % per projection, six are taken), float32 noise at ~1e-6 of the norm.
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
# A module returns the output of the last module it runs as is where the two differ by this
# share of its norm at most (the same tensor: 0).
AS_IS = 1e-6
# What a module adds to its last module's output, recovered as their difference, is a module's
# input where their sketches lie within this share of its norm: (x + y) - y is x but for the
# sum's float32 rounding, half an ulp of x + y per element (GPT-2's blocks: 1.3e-7 and 2.7e-7
# from their ln_2's input, the residual).
ADDED_INPUT = 1e-5
# An output that is the other side's scaled per channel, or an input scaled by a constant, to
# float32 rounding: within this share of its norm (a norm's output, x·rsqrt(mean(x²) + eps)·w,
# is rounded to ~1e-7 of it; the input sketches' sums to ~1e-6).
SCALED_FIT = 1e-5
# A module output's difference from torch's, minus the first sample's: 2.1e-6 and 5.0e-6 of
# its largest value where DINOv2's embeddings resize their position table otherwise (bilinear,
# MindSpore's bicubic; the image and class token added in float32), 0.14 where its classifier
# is given other tokens of each sample (64th round's trial).
SAME_FOR_EVERY_SAMPLE = 1e-3
# A norm's output rows, its weight and bias taken off, average to this share of their RMS at
# most where it subtracts their mean (float32 rounding: 1e-7), and more than UNCENTRED at the
# median where it does not (features of random sign: about 1/sqrt(width)).
CENTRED, UNCENTRED = 1e-4, 1e-2


def forward_cause(first: Comparison, t: RecordInfo, m: RecordInfo,
                  comparisons: Sequence[Comparison], torch_run: RunReader, ms_run: RunReader,
                  unmatched: Dict[str, Tuple[str, ...]], dropping: Optional[DropMismatch],
                  idle: Mapping[str, Sequence[str]]) -> Diagnosis:
    """The likely cause of a first divergence at a module output ``first`` (torch's record
    ``t``, MindSpore's ``m``), every earlier output having matched: what each side's
    settings prove, then what the records around it show (modules run on one side only, an
    input taken elsewhere, a mask), then where the computation between modules differs.
    ``idle``: each side's modules computing nothing left unpaired (engine.pair_records)."""
    key_bias = _key_bias_left(t, m, ms_run)
    if key_bias is not None:
        return key_bias
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
    torch_idle, ms_idle = (set(idle.get(side, ())) | _further_outputs(left, comparisons)
                           for side, left in (("torch", torch_left), ("mindspore", ms_left)))
    kept = _shape_kept(t, m)
    if tuple(t.shape) != tuple(m.shape) and kept is not None:
        (side, keeping), (other, returning) = kept
        before = _unmatched_just_before(t, torch_run, torch_left, torch_idle)
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
    gathered = _rows_gathered_otherwise(t, m, torch_run, ms_run)
    if gathered is not None and tuple(t.shape) != tuple(m.shape):
        return gathered
    if tuple(t.shape) != tuple(m.shape):
        return Diagnosis(cause=f"{m.op or 'module'} output shape differs",
                         detail=f"torch {t.name} returns {tuple(t.shape)}, MindSpore {m.name} "
                                f"{tuple(m.shape)}, while every earlier output matched: compare "
                                "their settings (stride, padding, kernel size, ceil_mode, output "
                                "size).", confidence="guess")
    missing = _unmatched_just_before(t, torch_run, torch_left, torch_idle)
    extra = _unmatched_just_before(m, ms_run, ms_left, ms_idle)
    if _softmax_torch_applies_too(extra, t, ms_run) or \
            _activations_torch_applies_too(extra, ms_run, ms_left):
        extra = []
    ms_modules = module_map_from_parameters(ms_run.manifest.get("param_map", {}))
    torch_modules = {theirs: ours for ours, theirs in ms_modules.items()}
    reordered = _reordered(("torch", t, missing, torch_run, torch_left, torch_modules),
                           ("MindSpore", m, extra, ms_run, ms_left, ms_modules))
    if reordered is not None:
        within = max(ADDED_INPUT, NOISE_MARGIN * _largest_error_before(first, comparisons))
        return _residual_before_moved(
            [(name, _counterpart(name, torch_modules)) for name in missing] +
            [(_counterpart(name, ms_modules), name) for name in extra],
            torch_run, ms_run, ms_modules, within) or reordered
    if gathered is not None:
        return gathered
    missing_inside = [n for n in unmatched.get("torch forward", ()) if n not in torch_idle
                      and n.startswith(module_of(first.name.partition("#")[0]) + ".")]
    a, b = torch_run.tensor(t), ms_run.tensor(m)
    if a.shape == b.shape and a.min() >= 0 and b.min() < 0:
        extra = f" torch calls {', '.join(missing_inside)} there; MindSpore does not." \
            if missing_inside else ""
        return Diagnosis(cause="missing activation",
                         detail=f"torch's {first.name} output is non-negative everywhere, "
                                f"MindSpore's has negative values: a ReLU is missing in "
                                f"{m.name}.{extra}", confidence="likely")
    if missing_inside:
        outermost = [n for n in missing_inside
                     if not any(n.startswith(other + ".") for other in missing_inside)]
        returned = _returned_inside(outermost, b, torch_run)
        if returned is not None:
            module = module_of(t.name.partition("#")[0])
            return Diagnosis(cause="computation after the module's last part missing",
                             detail=f"MindSpore's {module_of(m.name.partition('#')[0])} "
                                    f"returns what torch's {returned} does, while torch's "
                                    f"{module} computes more after it in its forward (a soft "
                                    "cap on the logits, a scale, an activation): the port, "
                                    f"computing {returned} in its construct, leaves that out.",
                             confidence="likely")
        idle = holding_but_never_run(outermost, ms_run)
        held = f" {never_ran(idle, ms_run)}." if idle else ""
        return Diagnosis(cause="operation missing in the port",
                         detail=f"torch runs {', '.join(outermost)} inside "
                                f"{module_of(t.name.partition('#')[0])}; MindSpore's "
                                f"{module_of(m.name.partition('#')[0])} runs no counterpart."
                                f"{held}", confidence="likely")
    ids = _other_ids(t, m, torch_run) or _other_rows_looked_up(t, m, torch_run, ms_run)
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
        activation = functional.activation_cause(t, m, torch_run, ms_run) or \
            functional.pooling_cause(t, m, torch_run, ms_run)
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
        scale = inputs.scale_of_input(t, m, SCALED_FIT)
        if scale is not None:
            return _scaled_on_one_side(scale, m, f"{where}{before}", torch_run)
        added = inputs.added_to_input(t, m, torch_run, ms_run, max(ADDED_INPUT, passed_on))
        if added is not None:
            return _added_on_one_side(added, t, m, inputs.forward_holding(t.name, torch_run))
        resized = resize.resize_cause(t, m, torch_run, ms_run, comparisons,
                                      f"{where}{before}".rstrip(","))
        if resized is not None:
            return resized
        fed_otherwise = _unpaired_fed_otherwise(t, torch_left, ms_left, torch_run, ms_run,
                                                comparisons) or \
            _other_part_taken(t, m, torch_run, ms_run, comparisons)
        if fed_otherwise is not None:
            return fed_otherwise
        skipped = _never_run_before(t, torch_left, torch_run, ms_run)
        if skipped:
            return Diagnosis(cause="operation missing in the port",
                             detail=f"{m.name}'s input already differs from torch's ({fed:.2g} "
                                    "of its norm) while every module output before it matched, "
                                    f"and torch runs {', '.join(skipped)} before it, whose "
                                    f"MindSpore cell{'s' if len(skipped) > 1 else ''} "
                                    f"{'hold' if len(skipped) > 1 else 'holds'} the weights but "
                                    f"never ran: the construct does not call "
                                    f"{'them' if len(skipped) > 1 else 'it'}. The modules "
                                    "between matched regardless (as a norm does right after "
                                    "the norm left out).", confidence="likely")
        taken = attention.values_taken_otherwise(t, m, torch_run, ms_run, comparisons) or \
            attention.attention_computed_otherwise(t, m, torch_run, ms_run, comparisons)
        if taken is not None:
            return taken
        beside = _rows_read_in_another_order(t, comparisons) + \
            _unpaired_of_other_shapes(t, torch_left, ms_left, torch_run, ms_run) + \
            _what_the_forward_reads(fed_from, torch_run, ms_run, comparisons)
        return Diagnosis(cause="computation between modules differs",
                         detail=f"{m.name}'s input already differs from torch's ({fed:.2g} of "
                                "its norm) while every module output before it matched: the "
                                "operations that feed it outside any module (matmul, softmax, "
                                "masking, scaling, reshapes, residual adds), in "
                                f"{where}{before} are the likely cause.{beside}",
                         confidence="likely")
    if first.ref_rms:
        given = inputs.other_input_cause(
            t, m, torch_run, ms_run, max(passed_on, INPUT_SHARE * first.rms / first.ref_rms))
        if given is not None:
            return given
    permuted, taken_off = reorder.permutation(a, b), ""
    for name, table in [] if permuted is not None else \
            inputs.tables(t, torch_run, own=True):
        permuted = reorder.permutation(a - table, b - table)
        if permuted is not None:        # ViT's class token put last, its positions then added
            taken_off = f", {name} taken off both,"
            break
    if permuted is not None:
        axis, order = permuted
        return Diagnosis(cause="output in another order",
                         detail=f"{m.name} returns torch's values in another order{taken_off} "
                                f"while its input matched: "
                                f"{reorder.describe(axis, a.ndim, order)}, inside {m.name}.",
                         confidence="likely")
    shifted = reorder.shift(a, b)
    if shifted is not None:
        axis, k = shifted
        return Diagnosis(cause="output shifted along an axis",
                         detail=f"{m.name}'s output at position i of axis {axis} is torch's at "
                                f"i {'+' if k > 0 else '-'} {abs(k)}, wherever both hold one, "
                                "while its input matched: it pads, shifts or crops by another "
                                "offset (an RWKV token shift taking the next token where torch's "
                                "takes the one before is 2 off; taking none, 1).",
                         confidence="likely")
    if reorder.shuffled(a, b):
        return Diagnosis(cause="output in another order",
                         detail=f"{m.name} returns torch's values in another order while its "
                                "input matched, and along no one axis: a reshape where torch "
                                "transposes first (ViT's patches, x.flatten(2).transpose(1, 2), "
                                "ported as x.reshape(n, -1, d)), or a transpose over other "
                                f"axes, inside {m.name}.", confidence="likely")
    if t.op != m.op:
        # a layer tied to another holds its weight under that one's name alone
        module = module_of(t.name.partition("#")[0])
        return _different_operation(t, m, t.op in ("dense", "embedding") or any(
            r.kind == "weight" and r.name.startswith(f"{module}.") for r in torch_run.records))
    if t.op == m.op == "tanh":
        found = kernels.tanh_cause(first.name, a, b)
        if found is not None:
            return found
    centred = _centred_on_one_side(t, m, torch_run, ms_run) or \
        _scaled_by_weight_plus_one(t, m, torch_run, ms_run)
    if centred is not None:
        return centred
    added = inputs.added_to_output(t, m, torch_run, ms_run, max(ADDED_INPUT, passed_on))
    if added is not None:
        return _added_on_one_side(added, t, m, f"MindSpore's {m.name}", output=True)
    after_last = attention.context_computed_otherwise(t, m, torch_run, ms_run, comparisons) or \
        _after_its_last_module(first, t, m, comparisons, torch_run, ms_run) or \
        resize.resized_in_its_forward(t, m, torch_run, ms_run, comparisons)
    if after_last is not None:
        return after_last
    if first.max_rel > 1e-2:
        inside = _inside_all_matched(first, t, comparisons, a, b)
        if inside is not None:
            return inside
        unchanged = _returned_as_given(t, m, torch_run, ms_run)
        if unchanged is not None:
            return unchanged
        size = "O(1) error" if first.max_rel > 0.1 else "error well above fp32 noise"
        others = [inputs.input_name(key) for key, _ in inputs.compared_inputs(t, m)]
        other_inputs = f" Its inputs matched torch's (the first, {', '.join(others)})." \
            if others else ""
        return Diagnosis(cause=f"{m.op or 'module'} computes something different",
                         detail=f"{size} at {first.name} while every earlier record matched: "
                                f"compare the construct of MindSpore {m.name} with torch's "
                                f"forward (padding, eps, an extra or missing op).{other_inputs}"
                                f"{_where_it_differs(a, b)}", confidence="guess")
    undeclared = _eps_one_side_declares(t, m)
    if undeclared is not None:
        return undeclared
    few = conditioning.few_values_per_channel(first, t, torch_run)
    return Diagnosis(cause="small numerical drift",
                     detail=f"{first.name} is slightly beyond tolerance (max_rel "
                            f"{first.max_rel:.2g}): precision settings (fp16/HF32), a different "
                            "reduction order, or a tolerance too tight for this depth."
                            + (f"{few} Past so few values float32 rounding varies more from one "
                               "computation to the next: a larger batch or image checks it "
                               "again." if few else ""),
                     confidence="guess")


class _OwnWeight(NamedTuple):
    weight: np.ndarray
    bias: Optional[np.ndarray]
    rows: Tuple[np.ndarray, np.ndarray]       # torch's output and MindSpore's, as rows


def _own_weight_and_rows(t: RecordInfo, m: RecordInfo, torch_run: RunReader,
                         ms_run: RunReader) -> Optional[_OwnWeight]:
    """A module's initial weight and bias, each of its output's last width (four or more),
    and the two outputs as rows of that width, in float64; None where it has no such weight."""
    weights = initial_weights(torch_run)
    if weights is None or tuple(t.shape) != tuple(m.shape) or not t.shape:
        return None
    width = t.shape[-1]
    weight, bias = weights.get(f"{t.name}.weight"), weights.get(f"{t.name}.bias")
    if weight is None or tuple(weight.shape) != (width,) or width < 4 or \
            (bias is not None and tuple(bias.shape) != (width,)):
        return None
    rows = tuple(run.tensor(record).reshape(-1, width).astype(np.float64)
                 for run, record in ((torch_run, t), (ms_run, m)))
    return _OwnWeight(weight.astype(np.float64),
                      None if bias is None else bias.astype(np.float64), rows)


def _centred_on_one_side(t: RecordInfo, m: RecordInfo, torch_run: RunReader,
                         ms_run: RunReader) -> Optional[Diagnosis]:
    """A norm of the user's own (on either side) whose rows, its weight and bias taken off,
    have a mean of zero on one side and not on the other: a LayerNorm for an RMS norm, or the
    reverse. Hugging Face's T5LayerNorm against a port's cell subtracting the mean was told
    "module computes something different" (a guess)."""
    own = _own_weight_and_rows(t, m, torch_run, ms_run) \
        if GENERIC_OP in (t.op, m.op) else None
    if own is None or not np.all(np.abs(own.weight) > 0):
        return None
    centring = []
    for rows in own.rows:
        rows = (rows - (0 if own.bias is None else own.bias)) / own.weight
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


def _scaled_by_weight_plus_one(t: RecordInfo, m: RecordInfo, torch_run: RunReader,
                               ms_run: RunReader) -> Optional[Diagnosis]:
    """A norm (or any module with a weight of its output's width and no bias) whose output is
    the other side's scaled by w / (1 + w) per channel: one side scales by 1 + weight, the
    other by the weight. Gemma's RMSNorm keeps its weight centred on zero (zeros at
    initialisation) and scales by 1 + weight; a port scaling by the weight was told "module
    computes something different" (a guess)."""
    own = _own_weight_and_rows(t, m, torch_run, ms_run)
    if own is None or own.bias is not None:
        return None
    w, (a, b) = own.weight, own.rows
    size = max(float(np.linalg.norm(a)), float(np.linalg.norm(b)))
    for torch_by, port_by, torch_scale, port_scale, ratio in (
            (1 + w, w, "1 + weight", "the weight", "w / (1 + w)"),
            (w, 1 + w, "the weight", "1 + weight", "(1 + w) / w")):
        kept = np.abs(torch_by) > 1e-3       # channels whose normalised values torch's shows
        if not kept.any() or not size:
            continue
        expected = a[:, kept] / torch_by[kept] * port_by[kept]
        if np.linalg.norm(expected - b[:, kept]) <= SCALED_FIT * size:
            return Diagnosis(cause="norm scales by its weight otherwise",
                             detail=f"torch's {t.name} scales its normalised input by "
                                    f"{torch_scale}, MindSpore's {m.name} by {port_scale}: its "
                                    f"output is torch's times {ratio} per channel (w its "
                                    "weight), to float32 rounding. Gemma's RMSNorm keeps its "
                                    "weight centred on zero and scales by 1 + weight; compute "
                                    "what torch's forward does.", confidence="likely")
    return None


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


def _added_on_one_side(added: inputs.Added, t: RecordInfo, m: RecordInfo, where: str,
                       output: bool = False) -> Diagnosis:
    """The diagnosis where one side's first input (``output``: its output) is the other's plus
    a tensor: a module's input or output (a residual connection), or a parameter (a position
    table)."""
    if added.side == "MindSpore":
        adding, other, doer, not_done = m, "torch", "the port", "torch does not"
    else:
        adding, other, doer, not_done = t, "MindSpore", "torch", "the port does not"
    given, other_tensor, place = ("returns", f"{other}'s output", "in its forward") \
        if output else ("is given", f"{other}'s input", f"before {adding.name}")
    cause, examples = ("parameter added on one side only",
                       "A position embedding left out, or added at another point") \
        if added.table else \
        ("residual added before the module on one side only",
         "A residual connection left out (a ResNet block's out + identity), or added at another "
         "point (GPT-NeoX's or Falcon's attention and MLP, added to the layer's input in "
         "parallel, ported one after the other)")
    return Diagnosis(cause=cause,
                     detail=f"{added.side}'s {adding.name} {given} {other_tensor} plus "
                            f"{added.what} (the two tensors' ±1 projections differ by that "
                            f"tensor's, to {added.apart:.1g} of their norm): {doer} adds it "
                            f"{place}, {not_done}. {examples}, in {where}.",
                     confidence="likely")


def _inside_all_matched(first: Comparison, t: RecordInfo, comparisons: Sequence[Comparison],
                        a: np.ndarray, b: np.ndarray) -> Optional[Diagnosis]:
    """A module whose output differs while its input and every output of the modules it runs
    matched (those holding torch's rows in another order compared on them): what its forward
    computes from them differs. Qwen2-MoE's layer ported without the sigmoid on its shared
    expert's gate, or with its top-k weights renormalised, was "module computes something
    different" (a guess). Where the difference is the same for every sample, and the module
    reads parameters of its own, those are named (DINOv2's embeddings resize their position
    table to the image in their forward)."""
    module = module_of(t.name.partition("#")[0])
    inside = [c for c in comparisons if c.kind == "forward" and c.order < first.order
              and c.name.startswith(module + ".")]
    if len(inside) < 2 or not all(c.passed for c in inside):
        return None
    rows = [c.name for c in inside if c.reason == reorder.ROWS_TAKEN]
    taken = f" ({len(rows)} of them compared on rows taken in another order: {first_few(rows)})" \
        if rows else ""
    reads = _own_parameters_read(module, comparisons, a, b)
    return Diagnosis(cause="computation between the module's parts differs",
                     detail=f"every output of the {len(inside)} modules {module} runs matched "
                            f"torch's{taken}, as did its input: what its forward computes from "
                            "them differs (how it weighs, gates, adds or puts them back: a "
                            "sigmoid on a gate, routing weights renormalised or not, a sum "
                            f"left out).{reads}", confidence="likely")


def _own_parameters_read(module: str, comparisons: Sequence[Comparison],
                         a: Optional[np.ndarray] = None, b: Optional[np.ndarray] = None) -> str:
    """A sentence naming ``module``'s own parameters, where it has any, which its forward reads:
    the likely cause where its output ``b`` differs from torch's ``a`` by one tensor for every
    sample (a table of its own resized or added otherwise)."""
    own = _own_parameters(module, comparisons)
    if not own:
        return ""
    if a is not None and b is not None and _same_for_every_sample(a, b):
        return (" Its output differs from torch's by the same tensor for every sample, and its "
                f"forward reads parameters of its own ({first_few(own)}): how it uses them (a "
                "table resized, added or concatenated otherwise) is the likely cause.")
    return f" {module}'s forward reads parameters of its own too ({first_few(own)})."


def _own_parameters(module: str, comparisons: Sequence[Comparison]) -> List[str]:
    """The parameters ``module`` holds itself, not through a module it holds."""
    return [c.name.rpartition(".")[2] for c in comparisons
            if c.kind == "weight" and c.name.rpartition(".")[0] == module]


def _same_for_every_sample(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether MindSpore's output differs from torch's by one tensor for every sample (of two
    or more), to SAME_FOR_EVERY_SAMPLE of its largest value: a difference no input makes."""
    if a.shape != b.shape or a.ndim < 2 or a.shape[0] < 2:
        return False
    difference = b.astype(np.float64) - a
    largest = float(np.max(np.abs(difference)))
    return largest > 0 and \
        float(np.max(np.abs(difference - difference[:1]))) <= SAME_FOR_EVERY_SAMPLE * largest


def _returned_as_given(t: RecordInfo, m: RecordInfo, torch_run: RunReader,
                       ms_run: RunReader) -> Optional[Diagnosis]:
    """A module one side of which returns its first input as it was given (its output's sketch
    the input's, to FED_BY of its norm) and the other does not: the construct or forward skips
    its computation (a flag read otherwise, a branch never taken). A DINOv2 port whose layer
    scales returned their input was "module computes something different" (a guess)."""
    sides = [inputs.feeds(t, t, torch_run), inputs.feeds(m, m, ms_run)]
    if sides[0] == sides[1]:
        return None
    skipping, computing = (("MindSpore", m, "construct"), ("torch", t, "forward")) if sides[1] \
        else (("torch", t, "forward"), ("MindSpore", m, "construct"))
    return Diagnosis(cause="module returns its input as given",
                     detail=f"{skipping[0]}'s {skipping[1].name} returns its input as it was "
                            f"given, while {computing[0]}'s {computing[1].name} computes from "
                            f"it, their inputs matching: the {skipping[2]} skips what the "
                            f"{computing[2]} does (a flag read otherwise, a branch never "
                            "taken, a scale or norm left out).", confidence="likely")


def _scaled_on_one_side(scale: float, m: RecordInfo, where: str,
                        torch_run: RunReader) -> Diagnosis:
    """MindSpore's module given torch's input times ``scale``: a constant one side applies in
    bfloat16, where torch holds one so (RecurrentGemma's √width), or any other."""
    rounded = inputs.bfloat16_constant(scale, torch_run)
    if rounded is not None:
        name, value, unrounded = rounded
        return Diagnosis(cause="input scaled on one side",
                         detail=f"MindSpore's {m.name} is given torch's input times {scale:.7g}, "
                                f"every module output before it matching: torch's {name} is a "
                                f"bfloat16 constant, {value:.7g}, the rounding of "
                                f"{unrounded:.7g}, which the port's scale in {where} is. Scale "
                                f"by {value:.7g} in the port (torch's rounding).",
                         confidence="likely")
    larger = max(abs(scale), 1 / abs(scale))
    root = round(larger ** 2)
    named = f" (√{root})" if root >= 2 and abs(larger ** 2 - root) <= 1e-4 * root else ""
    digits = ".4g" if abs(abs(scale) - 1) > 1e-3 else ".7g"     # 1.000107, not 1
    which = f"torch's is {1 / scale:{digits}}{named} times the port's" if abs(scale) < 1 else \
        f"the port's is {scale:{digits}}{named} times torch's"
    return Diagnosis(cause="input scaled on one side",
                     detail=f"MindSpore's {m.name} is given torch's input times {scale:{digits}}: "
                            f"{which}, every module "
                            "output before it matching. A constant scale one side applies and "
                            f"the other leaves out, or applies otherwise, in {where} is the "
                            "likely cause (Gemma multiplies its embeddings by √width; a residual "
                            "branch or an attention's scores may be scaled).",
                     confidence="likely")


def _rows_gathered_otherwise(t: RecordInfo, m: RecordInfo, torch_run: RunReader,
                             ms_run: RunReader) -> Optional[Diagnosis]:
    """An output holding some of torch's rows (each matching), or half of them or more among
    others, most not in place: the forward running its module routes rows to it otherwise.
    Compare reads rows taken in another order, or among more, in torch's order where a module
    enclosing them puts them back (engine), and some of torch's rows alone where that module
    matches. Mixtral's port routing each token to one expert, not two, was told "dense output
    shape differs" at its first expert's first layer (a guess)."""
    def rows(a_record: RecordInfo, b_record: RecordInfo) -> Optional[str]:
        if len(a_record.shape) < 2 or tuple(a_record.shape[1:]) != tuple(b_record.shape[1:]):
            return None
        n, k = a_record.shape[0], b_record.shape[0]
        if min(n, k) < 2:
            return None
        shared, in_place = reorder.rows_shared(torch_run.tensor(a_record),
                                               ms_run.tensor(b_record))
        if n == k and in_place >= shared / 2:
            return None     # rows in place: the others differ (a mask), none gathered
        if shared == min(n, k):
            return f"torch's {n} rows in another order" if n == k else \
                f"torch's {n} rows among {k}" if n < k else f"{k} of torch's {n} rows"
        return f"{shared} of torch's {n} rows among its {k}" \
            if shared >= max(2, min(n, k) / 2) else None

    held = rows(t, m)
    if held is None:
        return None
    outer = inputs.outermost(t, m, torch_run, ms_run, lambda a, b: rows(a, b) is not None)[0]
    where = inputs.forward_holding(outer.name, torch_run)
    return Diagnosis(cause="rows gathered otherwise",
                     detail=f"MindSpore's {m.name} holds {held}, each matching torch's: "
                            f"{where} gathers the rows it runs {outer.name} on otherwise, and "
                            "nothing enclosing it puts them back as torch's are (a "
                            "mixture-of-experts layer routing other tokens to an expert, or "
                            f"fewer). How {where} routes the rows is the likely cause.",
                     confidence="likely")


def _after_its_last_module(first: Comparison, t: RecordInfo, m: RecordInfo,
                           comparisons: Sequence[Comparison], torch_run: RunReader,
                           ms_run: RunReader) -> Optional[Diagnosis]:
    """A module whose output differs, its input and the output of the last module it runs
    matched: what its forward computes after that module differs. What each side adds to that
    output is named by the module taking it as input: a residual connection one side leaves
    out, or takes from another point. GPT-2's block ported without its MLP's residual was told
    "module computes something different" (a guess)."""
    lasts = _last_compared_inside(first, t, m, comparisons, torch_run, ms_run)
    if lasts is None:
        return None
    sides = [("torch", t, lasts[0], torch_run), ("MindSpore", m, lasts[1], ms_run)]
    outputs = [(run.tensor(record), run.tensor(last)) for _, record, last, run in sides]
    if any(output.shape != last.shape or output.shape != outputs[0][0].shape
           for output, last in outputs):
        return None     # another layout on one side (RecordInfo.axes), or a last part
    added = [np.subtract(output, last, dtype=np.float32) for output, last in outputs]
    shares = [float(np.linalg.norm(a)) / (float(np.linalg.norm(output)) or 1.0)
              for a, (output, _) in zip(added, outputs)]
    apart = float(np.linalg.norm(added[0] - added[1])) / (float(np.linalg.norm(outputs[0][0]))
                                                          or 1.0)
    if apart <= APART or any(AS_IS < share <= APART for share in shares):
        return None     # a drift, or a small term: not told apart from what differs in it
    takes = [inputs.taken_by(a, run, record, ADDED_INPUT) if share > APART else None
             for a, share, (_, record, _, run) in zip(added, shares, sides)]
    told = [f"{side}'s {record.name} {_what_it_does(record, last, a, share, taking, last_output)}"
            for (side, record, last, _), a, share, taking, (_, last_output)
            in zip(sides, added, shares, takes, outputs)]
    paired = {c.name: c.mindspore_name or c.name for c in comparisons if c.kind == "forward"}
    one_side = sum(share <= AS_IS for share in shares) == 1 and None not in \
        [taking for taking, share in zip(takes, shares) if share > APART]
    elsewhere = None not in takes and paired.get(takes[0].name) != takes[1].name
    cause = "residual connection on one side only" if one_side else \
        "residual taken from another point" if elsewhere else \
        "computation after the last module differs"
    reads = "" if one_side or elsewhere else _own_parameters_read(
        module_of(t.name.partition("#")[0]), comparisons, outputs[0][0], outputs[1][0])
    return Diagnosis(cause=cause,
                     detail=f"{'; '.join(told)}, their inputs and those outputs matching: "
                            f"what the forward computes after {lasts[1].name} differs (a "
                            f"residual add, a scale, an activation written as a function), in "
                            f"MindSpore's {m.name}.{reads}", confidence="likely")


def _what_it_does(record: RecordInfo, last: RecordInfo, added: np.ndarray, share: float,
                  taking: Optional[RecordInfo], last_output: np.ndarray) -> str:
    """What ``record``'s module does to ``last``'s output, ``added`` to it (``share`` of its
    norm; ``taking``: a module whose first input that is)."""
    if share <= AS_IS:
        return f"returns {last.name}'s output as is"
    scale = None if taking is not None else _scale_of(added, last_output)
    if scale is not None:
        return f"scales {last.name}'s output by {1 + scale:.4g}"
    what = "a tensor" if taking is None else \
        "its own input" if taking is record else f"{taking.name}'s input"
    return f"adds {what} to {last.name}'s output"


def _scale_of(added: np.ndarray, output: np.ndarray) -> Optional[float]:
    """k where ``added`` is k × ``output`` (to ADDED_INPUT of its norm), None otherwise."""
    a, o = (np.asarray(x, np.float64).ravel() for x in (added, output))
    square = float(np.dot(o, o))
    if not square:
        return None
    k = float(np.dot(a, o)) / square
    return k if np.linalg.norm(a - k * o) <= ADDED_INPUT * np.linalg.norm(a) else None


def _last_compared_inside(first: Comparison, t: RecordInfo, m: RecordInfo,
                          comparisons: Sequence[Comparison], torch_run: RunReader,
                          ms_run: RunReader) -> Optional[Tuple[RecordInfo, RecordInfo]]:
    """The records of the last module inside ``t``'s that ran and was compared before ``first``
    (and matched), torch's and MindSpore's, where MindSpore's is inside ``m``'s module. A module
    returning what a module inside it returns is compared as that one (engine)."""
    paired = {c.name: c.mindspore_name or c.name for c in comparisons
              if c.kind == "forward" and c.order < first.order}
    inside = module_of(t.name.partition("#")[0]) + "."
    t_last = max((r for r in torch_run.records if r.kind == "forward" and r.part is None
                  and r.order < t.order and r.name.startswith(inside) and r.name in paired),
                 key=lambda r: r.order, default=None)
    m_last = None if t_last is None else ms_run.record(paired[t_last.name], "forward")
    if m_last is None or not m_last.name.startswith(module_of(m.name.partition("#")[0]) + "."):
        return None
    return t_last, m_last


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


def _unmatched_just_before(m: RecordInfo, run: RunReader, unmatched: Set[str],
                           idle: Set[str] = frozenset()) -> List[str]:
    """The unmatched forward records of ``run`` that ran after its last matched one before
    ``m`` and changed its values: computation with no counterpart on the other side, between a
    match and a miss. An unmatched reshape or identity (same values) is not blamed, and the
    ``idle`` records, unpaired modules computing nothing, are no match: GPT-2's dropout of rate
    0 after its position embedding hid the embedding, left out of a port, which was told
    "computation between modules differs"."""
    extra: List[RecordInfo] = []
    matched = None
    for record in sorted((r for r in run.records if r.kind == "forward" and r.order < m.order
                          and r.name not in idle), key=lambda r: r.order, reverse=True):
        if record.name not in unmatched:
            matched = record
            break
        extra.insert(0, record)
    values = [run.tensor(r).reshape(-1) for r in extra]
    if matched is not None and extra:
        before = run.tensor(matched).reshape(-1)
        if all(np.array_equal(value, before) for value in values):
            return []
    # a container returning its last module's output (a dict, recorded) computes nothing more
    return [r.name for i, r in enumerate(extra) if i == 0 or r.op not in CONTAINER_OPS
            or not np.array_equal(values[i], values[i - 1])]


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
                       ms_run: RunReader, comparisons: Sequence[Comparison],
                       unpaired: bool = False) -> Optional[Diagnosis]:
    """A pair of the same operation whose first inputs are the outputs of two modules that are
    no pair (their sketches equal to 10⁻⁶): the port hands it another tensor. Whisper's decoder
    ported to attend over its own states where torch attends over the encoder's was told
    "dense output shape differs: compare their settings (stride, padding, ...)". Looked for
    only where the outputs' shapes or the inputs differ (``fed``, by more than APART of its
    norm), or for two modules of one name left ``unpaired``."""
    if t.op != m.op or (not unpaired and tuple(t.shape) == tuple(m.shape)
                        and (fed is None or fed <= APART)):
        return None
    sources = [inputs.fed_by(record, run) for record, run in ((t, torch_run), (m, ms_run))]
    if None in sources:
        return None
    torch_source, ms_source = sources
    paired = {c.mindspore_name: c.name for c in comparisons if c.kind == "forward"}
    counterpart = paired.get(ms_source.name)
    counterpart_record = None if counterpart is None else torch_run.record(counterpart, "forward")
    # torch's source unpaired: a module the port lacks (operation missing); the counterpart
    # feeding torch's too: the same tensor under another name (a container's, its last module's)
    if counterpart_record is None or torch_source.name not in paired.values() or \
            inputs.feeds(counterpart_record, t, torch_run):
        return None
    return Diagnosis(
        cause="input taken from another module",
        detail=f"torch's {t.name} is given the output of {torch_source.name} "
               f"{tuple(torch_source.shape)}, MindSpore's {m.name} that of {ms_source.name} "
               f"{tuple(ms_source.shape)} (paired with torch's {counterpart}), while every "
               "earlier output matched: the port hands it another tensor, in "
               f"{inputs.forward_holding(m.name, ms_run)} or before it.", confidence="likely")


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


def _rows_held(output: np.ndarray, table: np.ndarray, axis: int) -> Optional[np.ndarray]:
    """The index of the table row each vector of ``output`` along ``axis`` is (the first of
    equal rows), shaped as the output without that axis; None where one is no row of it."""
    rows = {row.tobytes(): index for index, row in reversed(list(enumerate(table)))}
    vectors = np.ascontiguousarray(np.moveaxis(output, axis, -1))
    found = []
    for vector in vectors.reshape(-1, table.shape[1]):
        index = rows.get(vector.tobytes())
        if index is None:
            return None
        found.append(index)
    return np.array(found).reshape(vectors.shape[:-1])


def _other_rows_looked_up(t: RecordInfo, m: RecordInfo, torch_run: RunReader,
                          ms_run: RunReader) -> Optional[Diagnosis]:
    """A pair whose outputs are other rows of a table the module holds itself (a 2-D parameter
    of its own, each output vector along an axis one of its rows), told by the rows each holds:
    the ids or index one side computes inside are not recorded. Hugging Face's OPT gives its
    position embedding the attention mask and computes the ids (offset by 2) inside its
    forward (a module of its own, an nn.Embedding subclass), and a port reading its table from
    row 0 was told "output shifted along an axis ... while its input matched"; BEiT's relative
    position bias gathers its table by an index it builds, and a port building it otherwise
    was "module computes something different" (a guess)."""
    weights = initial_weights(torch_run)
    if weights is None or tuple(t.shape) != tuple(m.shape) or not t.shape:
        return None
    module = module_of(t.name.partition("#")[0])
    for key in weights:
        if key.rpartition(".")[0] != module or weights[key].ndim != 2:
            continue
        table = np.asarray(weights[key], np.float32)
        for axis in [a for a in reversed(range(len(t.shape))) if t.shape[a] == table.shape[1]]:
            held = [_rows_held(run.tensor(record), table, axis)
                    for run, record in ((torch_run, t), (ms_run, m))]
            if held[0] is not None and held[1] is not None:
                return None if np.array_equal(held[0], held[1]) else \
                    _rows_read_otherwise(t, m, key, held[0], held[1])
    return None


def _rows_read_otherwise(t: RecordInfo, m: RecordInfo, table: str, torch_rows: np.ndarray,
                         ms_rows: np.ndarray) -> Diagnosis:
    """The rows of ``table`` each side's output holds, told apart: by an offset common to all,
    or where the first differs."""
    looked_up = "embedding" in (t.op, m.op)
    offset = ms_rows - torch_rows
    if np.all(offset == offset.flat[0]):
        how = (f"every {'id' if looked_up else 'index'} {abs(int(offset.flat[0]))} "
               f"{'higher' if offset.flat[0] > 0 else 'lower'} in the port (torch's rows "
               f"{torch_rows.min()} to {torch_rows.max()}, MindSpore's {ms_rows.min()} to "
               f"{ms_rows.max()})")
    else:
        at = tuple(int(i) for i in np.argwhere(offset != 0)[0])
        how = (f"at {np.count_nonzero(offset)} of {offset.size} positions, the first {at}: "
               f"torch's row {torch_rows[at]}, MindSpore's {ms_rows[at]}")
    return Diagnosis(cause="embedding ids differ" if looked_up else "table rows read otherwise",
                     detail=f"MindSpore's {m.name} reads other rows of {table} than torch's "
                            f"{t.name}, {how}; told from the rows each output holds (the "
                            f"{'ids' if looked_up else 'index'} a module computes inside, or is "
                            "given as no integers, are not recorded). "
                            + ("Ids computed with another offset (OPT's learned positions start "
                               "at row 2, RoBERTa's at padding_idx + 1) or in another order are "
                               "the likely cause." if looked_up else
                               "An index built otherwise (a relative-position index without "
                               "its shift to start from 0, or its rows not weighted apart from "
                               "its columns) is the likely cause."), confidence="certain")


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
    idle = holding_but_never_run(missing, ms_run)
    applied = None if idle else functional.applied_activation(ms_run, m)
    if applied not in (None, "nothing"):
        return Diagnosis(cause="activation between modules differs",
                         detail=f"{ran}; MindSpore has no cell for it and applies {applied} in "
                                f"its construct there (told from {m.name}'s input).",
                         confidence="likely")
    if idle:
        port = never_ran(idle, ms_run)
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
    operation in the port", torch's SiLU unnamed), or the same ones on other shapes (a table
    torch builds for half the features, the port for all: "different operation")."""
    torch_records = [torch_run.record(name, "forward") for name in missing]
    ms_records = [ms_run.record(name, "forward") for name in extra]
    if all(a.name == b.name and a.op == b.op and tuple(a.shape) != tuple(b.shape)
           for a, b in zip(torch_records, ms_records)):
        shapes = "; ".join(f"torch's {a.name} returns {tuple(a.shape)}, MindSpore's "
                           f"{tuple(b.shape)}" for a, b in zip(torch_records, ms_records))
        return Diagnosis(cause=f"{torch_records[0].op or 'module'} output shape differs",
                         detail=f"after the last output that matched and before {t.name}, "
                                f"both sides run {', '.join(missing)}, unpaired: {shapes}. The "
                                "port builds that output on another shape (a table over every "
                                "feature where torch's covers a part, another size), and what "
                                f"uses it differs at {t.name}.", confidence="likely")
    theirs = ", ".join(_described(record) for record in torch_records)
    ours = ", ".join(_described(record) for record in ms_records)
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


def _further_outputs(left: Set[str], comparisons: Sequence[Comparison]) -> Set[str]:
    """The unpaired outputs among ``left`` of modules another of whose outputs is compared:
    attention weights (``self_attn.out1``) torch's attention returns beside its output, where a
    port's returns the output alone, are no operation the port lacks. Whisper's decoder ported
    without its final norm was told "operation missing in the port" naming its attentions'
    weights (its record kept since a module's dict output is recorded)."""
    compared = {c.name for c in comparisons if c.kind == "forward"}
    return {name for name in left if name != module_of(name) and any(
        other.startswith(module_of(name) + ".out") for other in compared)}


def _returned_inside(modules: Sequence[str], b: np.ndarray,
                     torch_run: RunReader) -> Optional[str]:
    """The one of torch's ``modules`` (run inside the diverging module, unpaired) whose output
    is MindSpore's ``b``, to SAME_VALUES of its largest value. RecurrentGemma's causal LM caps
    its logits after its ``lm_head`` (tanh(x / 30)·30); a port leaving the cap out was told
    "operation missing in the port", naming the ``lm_head`` it computes in its construct."""
    for name in modules:
        record = torch_run.record(name, "forward")
        if record is None or tuple(record.shape) != b.shape:
            continue
        a = torch_run.tensor(record)
        scale = float(np.abs(a).max()) if a.size else 0.0
        if scale and np.isfinite(scale) and reorder.alike(a, b, scale):
            return name
    return None


def _unpaired_fed_otherwise(t: RecordInfo, torch_left: Set[str], ms_left: Set[str],
                            torch_run: RunReader, ms_run: RunReader,
                            comparisons: Sequence[Comparison]) -> Optional[Diagnosis]:
    """A module both sides run before ``t`` under one name and left unpaired, each given the
    output of another module of a pair (_fed_other_outputs): Mixtral's expert ported with
    ``act(w3(x)) * w1(x)`` for ``act(w1(x)) * w3(x)`` was told "computation between modules
    differs" at ``w2``, every module before it matching but the two ``act_fn``."""
    for name in sorted(torch_left & ms_left):
        a, b = torch_run.record(name, "forward"), ms_run.record(name, "forward")
        if a is not None and b is not None and a.order < t.order:
            found = _fed_other_outputs(a, b, None, torch_run, ms_run, comparisons, unpaired=True)
            if found is not None:
                return found
    return None


def _where_it_differs(a: np.ndarray, b: np.ndarray) -> str:
    """A sentence on where along an axis (past the batch axis, 4 positions or more) the
    difference lies, where it is not spread over the axis: at one position (half of its
    squared sum or more), or largest at the first and fading at each later one (a scan's first
    step: RecurrentGemma's RG-LRU ported without its reset at position 0 was "computes
    something different" with nothing more); else ""."""
    if a.shape != b.shape or a.ndim < 2:
        return ""
    squared = (a.astype(np.float64) - b) ** 2
    total = float(squared.sum())
    if not total or not np.isfinite(total):
        return ""
    for axis in range(1, a.ndim):
        length = a.shape[axis]
        if length < 4:
            continue
        share = squared.sum(axis=tuple(i for i in range(a.ndim) if i != axis)) / total
        top = int(share.argmax())
        if share[top] >= 0.5:
            return (f" {share[top]:.0%} of its difference lies at position {top} of axis "
                    f"{axis} (of {length}): what it does there alone (a border, a first or "
                    "last token) is the likely place.")
        if top == 0 and share[0] >= 2 / length and np.all(np.diff(share) <= 0):
            return (f" Its difference is largest at position 0 of axis {axis} ({share[0]:.0%} "
                    f"of it, against {1 / length:.0%} spread evenly) and fades at each later "
                    "one: the first step of a scan along that axis (its initial state, a "
                    "reset) is the likely place.")
    return ""


def _other_part_taken(t: RecordInfo, m: RecordInfo, torch_run: RunReader, ms_run: RunReader,
                      comparisons: Sequence[Comparison]) -> Optional[Diagnosis]:
    """Torch's module given one part of an earlier module's output (of equal parts along an
    axis), the port's another part of its counterpart's: the port splits that output in
    another order. Mamba's mixer splits its in-projection into the scan's input and the gate
    (``hidden, gate = projected.chunk(2, dim=1)``); a port taking them the other way round was
    told "computation between modules differs" at the conv."""
    taken = inputs.part_taken(t, torch_run)
    paired = {c.name: c.mindspore_name for c in comparisons if c.kind == "forward" and c.passed}
    counterpart = None if taken is None else ms_run.record(paired.get(taken.source, ""),
                                                           "forward")
    if counterpart is None or \
            tuple(counterpart.shape) != tuple(torch_run.record(taken.source, "forward").shape):
        return None
    value = ms_run.tensor(counterpart)
    for index in range(taken.count):
        other = taken._replace(index=index)
        if index != taken.index and inputs.is_part_input(value, other, m):
            how = ", its last two axes swapped" if taken.swapped else ""
            return Diagnosis(
                cause="input taken from another part",
                detail=f"torch's {t.name} is given part {taken.index + 1} of {taken.count} of "
                       f"{taken.source}'s output along axis {taken.axis}{how}, MindSpore's "
                       f"{m.name} part {index + 1} of its counterpart's: the port splits that "
                       "output in another order (a fused projection's chunks taken the other "
                       f"way round), in {inputs.forward_holding(t.name, torch_run)}.",
                confidence="likely")
    return None


def _never_run_before(t: RecordInfo, torch_left: Set[str], torch_run: RunReader,
                      ms_run: RunReader) -> List[str]:
    """torch's modules left unpaired that run before ``t`` and whose MindSpore cells, given
    their weights, never ran. RWKV's first block normalises its input in ``pre_ln`` before its
    ``ln1``: a port holding but never calling it matched at ``ln1`` (a LayerNorm of a
    LayerNorm's output, at its initial weights, is that output) and failed at ``ln2``, told
    "computation between modules differs"."""
    before = [r.name for r in torch_run.records if r.kind == "forward"
              and r.name in torch_left and r.order < t.order]
    return [name for name in before if holding_but_never_run([name], ms_run)]


def never_ran(cells: Sequence[str], ms_run: RunReader) -> str:
    """The port's ``cells``, given torch's weights, that never ran, in words."""
    them = "it" if len(cells) == 1 else "them"
    set_aside = set(ms_run.manifest.get("cells_not_run") or ()) & set(cells)
    why = " (a cell set on a SequentialCell with setattr stays out of the cells it runs)" \
        if set_aside else ""
    return f"MindSpore's {', '.join(cells)} {'holds' if len(cells) == 1 else 'hold'} its " \
        f"weights but never ran: the construct does not call {them}{why}"


def holding_but_never_run(torch_modules: Sequence[str], ms_run: RunReader) -> List[str]:
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
    paired, and "missing activation" was said). Modules both sides run just before it are in
    their place, unpaired for another reason (their shapes differ)."""
    for (side, record, names, _, _, modules), (other, _, other_names, other_run, other_left, _) \
            in (sides, sides[::-1]):
        counterparts = [_counterpart(name, modules) for name in names]
        there = _runs_after(counterparts, other_run, other_left)
        if names and there and not set(counterparts) & set(other_names):
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


def _residual_before_moved(moved: Sequence[Tuple[str, str]], torch_run: RunReader,
                           ms_run: RunReader, ms_modules: Mapping[str, str], within: float
                           ) -> Optional[Diagnosis]:
    """Of the modules one side runs at another point (torch's name, MindSpore's), the first
    that feeds a module of one name on both sides, and whose input on one side is the other's plus
    a tensor the forward holds there: the port moved it past a residual add. Falcon's layer
    normalises its input for the MLP before the attention runs, the MLP added in parallel; a
    port adding the attention's output first runs ``ln_mlp`` after it, on the sum, and was told
    only that the modules run in another order. A norm feeding the block on one side and
    normalising its sum on the other (norm_first set otherwise) stays told so."""
    for torch_name, ms_name in moved:
        t, m = torch_run.record(torch_name, "forward"), ms_run.record(ms_name, "forward")
        if t is None or m is None:
            continue
        fed_in_ms = {_counterpart(name, ms_modules) for name in inputs.fed_later(m, ms_run)}
        if not fed_in_ms.intersection(inputs.fed_later(t, torch_run)):
            continue
        added = inputs.added_to_input(t, m, torch_run, ms_run, within)
        if added is not None:
            return _added_on_one_side(added, t, m, inputs.forward_holding(t.name, torch_run))
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


def _unpaired_of_other_shapes(t: RecordInfo, torch_left: Set[str], ms_left: Set[str],
                              torch_run: RunReader, ms_run: RunReader) -> str:
    """A sentence naming the module outputs run before ``t`` that both sides name alike and
    left unpaired, their shapes differing, where there are any. A GPT-NeoX port rotating every
    dimension of each head built its rotary table (16, 16) where torch's is (1, 16, 4): the
    attention using it was told to differ in its forward, the tables named nowhere."""
    apart = []
    for name in sorted(torch_left & ms_left):
        a, b = torch_run.record(name, "forward"), ms_run.record(name, "forward")
        if a is not None and b is not None and a.order < t.order and \
                tuple(a.shape) != tuple(b.shape):
            apart.append(f"{name} (torch {tuple(a.shape)}, MindSpore {tuple(b.shape)})")
    if not apart:
        return ""
    return (f" Before it, {', '.join(apart[:4])}{' ...' if len(apart) > 4 else ''} "
            f"{'were' if len(apart) > 1 else 'was'} left unpaired, named alike on both sides "
            "and of other shapes: a table or a tensor the forward uses may be built otherwise.")


def _what_the_forward_reads(fed: RecordInfo, torch_run: RunReader, ms_run: RunReader,
                            comparisons: Sequence[Comparison]) -> str:
    """Sentences naming the float and boolean inputs torch's module is given whose forward
    feeds ``fed`` and its MindSpore pair is not, where there are any: the port builds them in
    its construct (Hugging Face's BLOOM hands each attention its ALiBi bias; ports with the
    slopes of another formula, or none, were told only that the attention's forward computes
    otherwise); and the parameters that module holds itself, which its forward reads (BEiT's
    layer scales, lambda_1 and lambda_2)."""
    holder = inputs.caller(fed.name, torch_run)
    ms_holder = next((c.mindspore_name for c in comparisons
                      if c.kind == "forward" and c.name == holder), None)
    a = torch_run.record(holder, "forward") if holder else None
    b = ms_run.record(ms_holder, "forward") if ms_holder else None
    alone = [] if a is None or b is None else inputs.given_torch_alone(a, b)
    reads = _own_parameters_read(holder, comparisons) if holder else ""
    if not alone:
        return reads
    return (f" Torch's {holder} is given {first_few(alone)}, which MindSpore's {ms_holder} is "
            f"not: the port builds {'them' if len(alone) > 1 else 'it'} itself (a position "
            f"bias such as ALiBi's, a mask); compare with torch's.{reads}")


def _different_operation(t: RecordInfo, m: RecordInfo, weighted: bool) -> Diagnosis:
    """Two modules of different op types whose output is the first to differ, torch's holding
    parameters or not (``weighted``). One of a class parity has no op type for ("module": the
    port's own dense cell, say) is most often that class computing otherwise from the same
    weights."""
    torch_side, ms_side = ("torch", t, "module", "forward"), ("MindSpore", m, "cell", "construct")
    unknown = [side for side in (torch_side, ms_side) if side[1].op in ("", "module")]
    if len(unknown) == 1:
        own, _, what, method = unknown[0]
        typed_side, typed = (torch_side if unknown[0] is ms_side else ms_side)[:2]
        how = " from the same weights (a weight used transposed, a bias left out, another " \
            "formula)" if weighted else " (another formula, padding or offset: it holds no weights)"
        return Diagnosis(cause=f"{typed.op} computes something different",
                         detail=f"{typed_side} {typed.name} is {typed.op}, {own} "
                                f"{unknown[0][1].name} a {what} of its own class, whose {method} "
                                f"computes otherwise{how}; everything before it matched.",
                         confidence="guess")
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
