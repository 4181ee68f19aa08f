"""Naming the likely cause of the first divergence.

Evidence first, numbers second: module settings recorded at capture (padding mode, eps, BN
momentum, training flag; compare/settings.py) prove a cause outright ("certain"); otherwise the
numerical signature of each classic ResNet migration bug (DESIGN.md) is matched ("likely");
failing both, the message says where to look ("guess").

A divergence at a module output is told in compare/forward_cause.py; this module dispatches,
and tells those of the batch, the loss and the step after the forward (gradients, updates,
optimizer state, buffers).
"""

from __future__ import annotations

from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from parity.compare import conditioning, inputs, kernels, loss, optimizer, resize, sums
from parity.compare.batches import batch_difference, further_input_difference
from parity.compare.conditioning import FEW_VALUES_PER_CHANNEL
from parity.compare.dropping import DropMismatch
from parity.compare.forward_cause import (INPUT_SHARE, forward_cause, holding_but_never_run,
                                          never_ran)
from parity.compare.settings import settings_cause
from parity.compare.structure import FROZEN_ON_ONE_SIDE, different_drop_rates, frozen_on_one_side
from parity.config import SHARED_STEP_SETTINGS, split_state
from parity.errors import first_few
from parity.records import Comparison, Diagnosis, RecordInfo, module_of
from parity.rundir import RunReader, initial_weights


def _close(value: float, target: float, rel: float = 0.05) -> bool:
    return np.isfinite(value) and abs(value - target) <= rel * abs(target)


def _median_ratio(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    mask = np.abs(a) > 1e-3 * (np.abs(a).max() + 1e-30)
    return float(np.median(b[mask] / a[mask])) if mask.any() else float("nan")


# The records the shared step settings reach.
AFTER_THE_FORWARD = ("loss", "grad", "update", "optimizer_state", "weight")


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


# Diagnoses that only say where to look: an ill-conditioned record explains the divergence
# better than they do.
FALLBACK_CAUSES = ("loss function differs", "running statistics update differs",
                   "computation between modules differs")


def diagnose(first: Comparison, t: RecordInfo, m: RecordInfo,
             comparisons: Sequence[Comparison], torch_run: RunReader, ms_run: RunReader,
             unmatched: Dict[str, Tuple[str, ...]],
             dropping: Optional[DropMismatch] = None,
             idle: Optional[Mapping[str, Sequence[str]]] = None) -> Diagnosis:
    """The likely cause of the first divergence ``first`` (its torch record ``t``, MindSpore's
    ``m``); ``dropping``: the point next to them each side drops at another rate, if any;
    ``idle``: each side's modules computing nothing left unpaired, listed in ``unmatched``
    neither."""
    found = _diagnose(first, t, m, comparisons, torch_run, ms_run, unmatched, dropping,
                      idle or {})
    upstream = _fed_by_one_let_through(first, t, comparisons, torch_run, ms_run)
    if upstream is not None:
        return upstream.diagnosed(comparisons, torch_run, ms_run, unmatched, idle,
                                  besides=found if found.confidence == "certain" else None)
    if found.confidence != "guess" and found.cause not in FALLBACK_CAUSES:
        return found
    better = _random_step(torch_run, ms_run, comparisons) or \
        conditioning.ill_conditioned(first, t, torch_run) or \
        _state_updated_in_the_forward(first, t, comparisons)
    if better is not None:
        return better
    before = _let_through_before(first, t, comparisons, torch_run, ms_run)
    return found if before is None else before.diagnosed(comparisons, torch_run, ms_run,
                                                         unmatched, idle)


class LetThrough(NamedTuple):
    """A module output the tolerance's absolute floor alone let through, ``origin`` (its torch
    and MindSpore records ``t`` and ``m``), taken for where the first divergence starts;
    ``said``: why, in words."""
    origin: Comparison
    t: RecordInfo
    m: RecordInfo
    said: str

    def diagnosed(self, comparisons: Sequence[Comparison], torch_run: RunReader,
                  ms_run: RunReader, unmatched: Dict[str, Tuple[str, ...]],
                  idle: Optional[Mapping[str, Sequence[str]]],
                  besides: Optional[Diagnosis] = None) -> Diagnosis:
        """The origin's diagnosis, said to be where the divergence starts; or, ``besides`` the
        first divergence's own cause, proven by its settings, the origin's told after it."""
        found = diagnose(self.origin, self.t, self.m, comparisons, torch_run, ms_run,
                         unmatched, idle=idle)
        floor = (f"{self.said}, let through by the tolerance's absolute floor alone (atol "
                 f"{self.origin.atol:g})")
        if besides is not None:
            return Diagnosis(cause=besides.cause,
                             detail=f"{besides.detail} Besides, {floor}: an earlier divergence "
                                    f"starts there, {found.cause} ({found.confidence}): "
                                    f"{found.detail}",
                             confidence=besides.confidence)
        return Diagnosis(cause=found.cause,
                         detail=f"{floor}: the divergence starts at {self.origin.name}. "
                                f"There: {found.detail}",
                         confidence=found.confidence)


def _off(comparison: Comparison) -> str:
    return f"{100 * comparison.ms_error:.2g} % of its rms ({comparison.ref_rms:.2g}) off"


def _let_through(first: Comparison, comparisons: Sequence[Comparison]) -> List[Comparison]:
    """The module outputs before ``first`` that passed by their tolerance's absolute floor
    alone, the earliest first."""
    return sorted((c for c in comparisons if c.kind == "forward" and c.order < first.order
                   and c.let_through_by_floor), key=lambda c: c.order)


def _explaining(c: Comparison, output: Comparison) -> bool:
    """Whether ``c`` is off by enough to make ``output`` as far off: INPUT_SHARE of it."""
    return c.ms_error >= INPUT_SHARE * output.ms_error


def _with_records(origin: Comparison, said: str, torch_run: RunReader, ms_run: RunReader
                  ) -> Optional[LetThrough]:
    t, m = torch_run.record(origin.name, "forward"), ms_run.record(origin.mindspore_name,
                                                                   "forward")
    return None if t is None or m is None else LetThrough(origin, t, m, said)


def _fed_by_one_let_through(first: Comparison, t: RecordInfo,
                            comparisons: Sequence[Comparison], torch_run: RunReader,
                            ms_run: RunReader) -> Optional[LetThrough]:
    """Where the first divergence's input is a module's output let through by its tolerance's
    absolute floor and explaining it: the earliest output so let through within that module
    explaining it in turn, or that one. OLMo 2 norms its attention's output, of rms 1.3e-4 at
    width 32: a port's rotary base passed there 2.3 % off, and its norm, scaling the difference
    up, was told "computes something different". GPT-J's next layer norms the sum of its
    attention's and MLP's outputs and its input: a port's rotary base passed in it, and in its
    attention's output first (8.4e-5 off at rms 0.021 over 16 tokens), and the norm was "small
    numerical drift"."""
    if first.kind != "forward":
        return None
    let_through = _let_through(first, comparisons)
    for feeding in let_through:
        source = torch_run.record(feeding.name, "forward")
        if source is None or not _explaining(feeding, first) or \
                not inputs.feeds(source, t, torch_run):
            continue
        module = module_of(feeding.name.partition("#")[0])
        origin = next((c for c in let_through if c.order < feeding.order
                       and c.name.startswith(f"{module}.") and _explaining(c, feeding)), feeding)
        within = "" if origin is feeding else f", as did {origin.name}'s within it, {_off(origin)}"
        return _with_records(origin, f"{first.name}'s input is {feeding.name}'s output, which "
                             f"passed {_off(feeding)}{within}", torch_run, ms_run)
    return None


def _let_through_before(first: Comparison, t: RecordInfo, comparisons: Sequence[Comparison],
                        torch_run: RunReader, ms_run: RunReader) -> Optional[LetThrough]:
    """Where the first divergence is told only where to look: the earliest module output let
    through by its tolerance's absolute floor and explaining it, in the module enclosing a
    forward one (anywhere for a top-level module), or the output of the module holding a
    gradient's parameter (``t``; not a module output's gradient), or of one in it. Llama's
    second norm takes its attention's output added to the layer's input: a port leaving out
    Llama 3.1's rope_scaling passed at the attention's output (2.4e-4 off at rms 0.0044 over
    16 tokens), and the norm was "small numerical drift"; where the norm passed too, o_proj's
    weight's gradient, computed from the attention's context, was "backward differs while
    forward matches"."""
    if first.kind == "forward":
        block = first.name.partition("#")[0].rpartition(".")[0]
        where = f"earlier in {block}" if block else "earlier"

        def inside(c: Comparison) -> bool:
            return c.name.startswith(f"{block}.") or not block
    elif first.kind == "grad" and not t.attrs.get("activation"):
        block = first.name.rpartition(".")[0]
        where = f"in the module holding {first.name}"

        def inside(c: Comparison) -> bool:
            return module_of(c.name.partition("#")[0]) == block or \
                c.name.startswith(f"{block}.")
    else:
        return None
    origin = next((c for c in _let_through(first, comparisons)
                   if inside(c) and _explaining(c, first)), None)
    return None if origin is None else _with_records(
        origin, f"{origin.name}'s output, {where}, passed {_off(origin)}", torch_run, ms_run)


RUNNING_STATISTICS = (".running_mean", ".running_var")


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
                not inputs.feeds_a_later_module(run.record(name, "forward"), run)]
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


def _called_in_its_place(t: RecordInfo, m: RecordInfo, torch_run: RunReader,
                         ms_run: RunReader, unmatched: Dict[str, Tuple[str, ...]]
                         ) -> Optional[Diagnosis]:
    """A gradient MindSpore's is zero where torch's is not, of a cell holding torch's weights
    that never ran, while MindSpore calls a module beside it more often than torch: the port
    calls that one in its place, both computing the same at the initial weights. Falcon's layer
    normalises its input twice, for the attention (``ln_attn``) and the MLP (``ln_mlp``): a port
    calling ``ln_attn`` for both matched every forward output, and its first differing gradient
    was told "a custom bprop, a stop-gradient, or a non-differentiable op"."""
    module = t.name.rpartition(".")[0]
    cells = holding_but_never_run([module], ms_run)
    if not cells or np.any(ms_run.tensor(m)) or not np.any(torch_run.tensor(t)):
        return None
    instead = [name for name in _called_more_often(unmatched, torch_run, ms_run)
               if name.rpartition(".")[0] == module.rpartition(".")[0]]
    if not instead:
        return None
    return Diagnosis(cause="module called in another's place",
                     detail=f"{never_ran(cells, ms_run)}, so its gradient is zero where torch's "
                            f"{module}'s is not, and MindSpore calls {first_few(instead)} more "
                            "often than torch does: the port reads "
                            f"{'its' if len(instead) == 1 else 'their'} output in {module}'s "
                            "place. Both compute the same at the initial weights, so every "
                            "forward output matched; the gradients tell them apart, and after "
                            f"one step the forward would too. Call {module} where torch does.",
                     confidence="likely")


def _called_more_often(unmatched: Dict[str, Tuple[str, ...]], torch_run: RunReader,
                       ms_run: RunReader) -> List[str]:
    """The modules left unpaired that MindSpore calls more often than torch (their calls are
    numbered name#0, name#1, …): the same module called where torch calls another."""
    def calls(run: RunReader, name: str) -> int:
        return sum(1 for r in run.records if r.kind == "forward" and
                   r.name.partition("#")[0] == name)

    left = dict.fromkeys(name.partition("#")[0] for name in unmatched.get("mindspore forward", ()))
    return [name for name in left if calls(ms_run, name) > calls(torch_run, name)]


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
              dropping: Optional[DropMismatch], idle: Mapping[str, Sequence[str]]) -> Diagnosis:
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
        return forward_cause(
            first, t, m, comparisons, torch_run, ms_run, unmatched, dropping, idle)
    if first.kind == "loss":
        torch_loss, ms_loss = (float(np.asarray(run.tensor(r)).reshape(-1)[0])
                               for run, r in ((torch_run, t), (ms_run, m)))
        ratio = ms_loss / torch_loss if torch_loss else float("nan")
        found = _ratio_cause(ratio, ms_config, "loss values", _label_count(torch_run)) or \
            _loss_targets(torch_run, ms_run) or \
            _loss_follows_the_logits(comparisons, torch_run, ms_run) or \
            _loss_from_unpaired(ratio, unmatched, torch_run, ms_run) or \
            resize.resized_before_the_loss(torch_run, ms_run)
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
        return found or _called_in_its_place(t, m, torch_run, ms_run, unmatched) or Diagnosis(
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
    """An embedding table's gradient that differs in its padding row only: torch's
    nn.Embedding(padding_idx=k) gives row k no gradient from the lookup, MindSpore's gives it
    one, with padding_idx or without (nn.Embedding, 2.8.0, measured: the row summed the output
    gradients of the padding positions). Torch's row is zero but where the table is used again
    (Gemma's output layer tied to it: its correct port was told "backward differs while
    forward matches"). Any module holding a padding_idx is taken for an embedding: Gemma 3's
    scales its nn.Embedding's output (Gemma3TextScaledWordEmbedding), a module of no known op."""
    embedding = torch_run.record(t.name.rpartition(".")[0], "forward")
    if t.attrs.get("activation") or not t.name.endswith(".weight") or embedding is None \
            or embedding.attrs.get("padding_idx") is None:
        return None
    row = int(embedding.attrs["padding_idx"])
    a, b = torch_run.tensor(t), ms_run.tensor(m)
    if a.shape != b.shape or a.ndim != 2 or not 0 <= row < a.shape[0]:
        return None
    difference = np.abs(b.astype(np.float64) - a)
    in_row, elsewhere = difference[row].max(), np.delete(difference, row, axis=0).max(initial=0)
    if not in_row > 1e3 * elsewhere:
        return None
    tied = ", only where the table is used again (a tied output layer)" if np.any(a[row]) \
        else ""
    return Diagnosis(cause="Embedding padding row gets a gradient",
                     detail=f"torch's {embedding.name} has padding_idx={row}, so its row {row} "
                            f"gets no gradient from the lookup{tied}; MindSpore's {m.name} row "
                            f"{row} differs by up to {in_row:.3g}, and the rest of the table "
                            "matches: "
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
    few = conditioning.values_per_channel(after)
    cancels = few is not None and few <= FEW_VALUES_PER_CHANNEL
    return Diagnosis(cause=f"{after.name}'s backward differs",
                     detail=f"the gradient w.r.t. {t.name}'s output differs while the one "
                            f"w.r.t. {after.name}'s, the module run after it, matches: "
                            f"{after.name}'s backward (a custom bprop, a stop_gradient, an "
                            "operation whose gradient differs) turns one into the other, if it "
                            f"is what consumes {t.name}'s output."
                            + (f"{conditioning.normalises(after.name, few)} The terms of its "
                               "backward nearly cancel there (with 2 values, exactly but for "
                               "eps), and two correct float32 computations of what is left can "
                               "be far apart. A larger batch or image checks it again." if cancels
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
