"""Records that cross module lines: what a capture stored, and what a comparison concluded.

Every record is named by the PyTorch module/parameter path (``layer1.0.conv2``,
``layer1.0.bn1.weight``) once aligned, so users read one vocabulary.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

# The order in which a divergence is looked for: where a bug is, not where it shows.
KINDS: Tuple[str, ...] = ("input", "forward", "loss", "grad", "update", "optimizer_state",
                          "weight", "buffer")
KIND_RANK = {kind: rank for rank, kind in enumerate(KINDS)}
# The kinds of a parameter's records (a gradient, also w.r.t. a module's output), named by it.
PARAM_KINDS = ("grad", "update", "optimizer_state", "weight", "buffer")
# The op types of modules that drop at random in training: dropout, and stochastic depth
# (torchvision's StochasticDepth, timm's and mindcv's DropPath), which drops a sample's branch.
DROPPING_OPS = ("dropout", "droppath")
# The op types of modules holding others (a user's own module, Sequential, ModuleList, and
# MindSpore's cells of those names).
CONTAINER_OPS = ("module", "sequential", "list")
# Recurrent layers, which drop between their stacked layers at their ``dropout`` rate.
RECURRENT_OPS = ("lstm", "gru", "rnn")


# How a record is read where one side computes an output once for the batch (shape (1, ...)) and
# the other for each of N samples (N, ...): the one copy broadcast to N, or the gradients of the
# N copies summed into the one's.
BROADCAST, SUMMED = "broadcast", "summed"


# A part of a torch tensor, named as torch indexes it: a fused layer's rows (``qkv.weight[0:32]``,
# its gradient, update and optimizer state alike) or its output's slice along the axis its
# channels lie on (``qkv[..., 0:32]``, the last; a conv's ``c1x1[:, 0:256]``), compared with the
# layer a port splits it into (its ``q``).
_PART = re.compile(r"(?P<whole>.+)\[(?P<last>\.\.\., )?(?P<leading>(?::, )*)"
                   r"(?P<start>\d+):(?P<stop>\d+)\]")
LAST_AXIS = -1


@dataclass(frozen=True)
class Part:
    """Rows ``start:stop`` of a tensor's axis ``axis`` (LAST_AXIS: its last)."""
    start: int
    stop: int
    axis: int = 0

    def of(self, whole: str) -> str:
        """The part's name: ``whole`` indexed as torch would index it."""
        leading = "..., " if self.axis == LAST_AXIS else ":, " * self.axis
        return f"{whole}[{leading}{self.start}:{self.stop}]"

    def axis_of(self, ndim: int) -> int:
        return ndim - 1 if self.axis == LAST_AXIS else self.axis

    def index(self, ndim: int) -> Tuple[slice, ...]:
        return (slice(None),) * self.axis_of(ndim) + (slice(self.start, self.stop),)


def split_part(name: str) -> Tuple[str, Optional[Part]]:
    """A part's name as (the whole tensor's, the part); any other name as (itself, None)."""
    found = _PART.fullmatch(name)
    if found is None:
        return name, None
    axis = LAST_AXIS if found["last"] else found["leading"].count(":")
    return found["whole"], Part(int(found["start"]), int(found["stop"]), axis)


def value_of(tensors: Mapping[str, Any], name: str) -> Any:
    """The tensor ``name`` stands for among ``tensors``: its own, or a part of its whole's."""
    whole, part = split_part(name)
    value = tensors[whole]
    return value[part.index(value.ndim)] if part is not None else value


def module_of(record_name: str) -> str:
    """The module whose output a forward record is: an LSTM's first output is the record
    rnn.out0."""
    return re.sub(r"\.out\d+$", "", record_name)


def dropping_for_identity(op: str, other: str) -> Optional[str]:
    """The dropping op of two op types where one is an Identity: a rate of 0 as timm and mindcv
    write it (``DropPath(p) if p > 0 else Identity()``); else None."""
    ops = {op, other}
    return (ops - {"identity"}).pop() if "identity" in ops and len(ops) == 2 and \
        ops - {"identity"} <= set(DROPPING_OPS) else None


def drops_between_layers(op: str, attrs: Mapping[str, Any]) -> bool:
    """Whether a module is a recurrent layer dropping at random between its stacked layers."""
    rate = attrs.get("dropout")
    return op in RECURRENT_OPS and isinstance(rate, (int, float)) and rate > 0


@dataclass(frozen=True)
class RecordInfo:
    """One captured tensor, as listed in a run directory's manifest."""

    name: str                 # the capturing framework's own path (+ "#k" for the k-th call)
    kind: str
    shape: Tuple[int, ...]
    dtype: str
    order: int                # capture order within the run
    shard: str                # safetensors file holding the tensor
    key: str                  # key of the tensor inside the shard
    op: str = ""              # normalised operation type of a forward record ("conv2d", ...)
    attrs: Dict[str, Any] = field(default_factory=dict)  # module settings (stride, eps, ...)
    crc32: int = 0            # of the tensor's bytes: a corrupted shard names the record
    # torch only, from the float64 rerun of the step: rms(t32 - t64) and rms(t64)
    fp32_noise_rms: Optional[float] = None
    exact_rms: Optional[float] = None
    # torch only, from the float32 step rerun from trainable weights one rounding off (the
    # farther of two such steps): rms(t32' - t32), a second draw of torch's float32 error
    fp32_spread_rms: Optional[float] = None
    # torch only, a ReLU's forward record: the units (flat indices) active in float32 but not
    # in float64 or back (parity/kinks.py); none at an nn.ReLU, whose float32 units the
    # float64 rerun replays (capture/masks.py)
    fp32_flipped: Optional[Tuple[int, ...]] = None
    # compare's, never stored: the shape the capture stored the tensor in, where ``shape`` is
    # the other side's that compare reads it in (viewed_as)
    stored_shape: Optional[Tuple[int, ...]] = None
    # compare's, never stored: the part of the stored tensor this record is (part_named)
    part: Optional[Part] = None
    # compare's, never stored: how the stored copies along the first axis are read, where the
    # other side computes the output once for the batch (BROADCAST, SUMMED)
    batch_read: str = ""
    # compare's, never stored: (axis, index), the one position along an axis this record is
    # read at, where the other side computes the output for that position alone (at_position)
    position: Optional[Tuple[int, int]] = None
    # compare's, never stored: the order its axes are read in (np.transpose), where the other
    # side holds the output with its channels at the other end (transposed)
    axes: Optional[Tuple[int, ...]] = None
    # compare's, never stored: the order its rows (first axis) are read in, where this side
    # holds the other's rows in another order (rows_taken)
    rows: Optional[Tuple[int, ...]] = None

    def part_named(self, name: str) -> "RecordInfo":
        """The part of this record that ``name`` (split_part) names, read from its tensor. The
        float64 rerun's noise is measured over the whole tensor: a part's is taken to be that
        of the layer it is a part of (q, k and v rows of one fused matmul of one input)."""
        whole, part = split_part(name)
        if whole != self.name or part is None or self.part is not None or \
                self.stored_shape is not None:
            raise ValueError(f"{name} is no part of {self.name}")
        shape = list(self.shape)
        axis = part.axis_of(len(shape))
        if not 0 <= axis < len(shape) or part.stop > shape[axis] or part.start >= part.stop:
            raise ValueError(f"{name} lies outside {self.name}'s shape {self.shape}")
        shape[axis] = part.stop - part.start
        return replace(self, name=name, shape=tuple(shape), stored_shape=self.shape, part=part,
                       fp32_flipped=None)

    def positions_kept(self, axis: int, start: int, stop: int) -> "RecordInfo":
        """This record read at positions ``start:stop`` of ``axis`` alone, under its own name:
        an output this side computes at more positions than it keeps, which the other side
        computes alone (compare/window.py)."""
        shape = list(self.shape)
        shape[axis] = stop - start
        return replace(self, shape=tuple(shape), stored_shape=self.shape,
                       part=Part(start, stop, axis), fp32_flipped=None)

    def viewed_as(self, shape: Tuple[int, ...]) -> "RecordInfo":
        """This record read in another shape of as many values in the same order (its size-1
        dimensions elsewhere): mindcv's GlobalAvgPooling output (N, C) as torch's
        AdaptiveAvgPool2d's (N, C, 1, 1)."""
        return replace(self, shape=tuple(shape), stored_shape=self.stored_shape or self.shape)

    def broadcast_to(self, copies: int) -> "RecordInfo":
        """This record of one copy along its first axis read as ``copies`` copies: an output
        this side computes once for the batch and broadcasts, the other side for each sample
        (timm's XCiT position encoding; mindcv's expands its grid to the batch first)."""
        return replace(self, shape=(copies, *self.shape[1:]), stored_shape=self.shape,
                       batch_read=BROADCAST, fp32_flipped=None)

    def at_position(self, axis: int, index: int) -> "RecordInfo":
        """This record read at one ``index`` of its ``axis``: an output this side computes for
        every token and the other side for one (timm's class attention computes ``q`` of the
        first token, ``self.q(x[:, 0])``; mindcv's XCiT of every token, taking the first
        after). Its float32 error is measured over every position, as a part's."""
        return replace(self, shape=self.shape[:axis] + self.shape[axis + 1:],
                       stored_shape=self.stored_shape or self.shape, position=(axis, index),
                       fp32_flipped=None)

    def transposed(self, axes: Tuple[int, ...]) -> "RecordInfo":
        """This record read with its axes in the order ``axes``: an output this side holds
        channels last (N×H×W×C) and the other channels first (N×C×H×W), or the reverse (timm's
        ConvNeXtV2 computes its MLP with 1×1 convs over N×C×H×W, mindcv's with dense layers
        over N×H×W×C)."""
        return replace(self, shape=tuple(self.shape[axis] for axis in axes),
                       stored_shape=self.stored_shape or self.shape, axes=tuple(axes),
                       fp32_flipped=None)

    def rows_taken(self, order: Sequence[int]) -> "RecordInfo":
        """This record's rows ``order`` (of its first axis), read in that order: the tokens a
        mixture-of-experts layer gathers for an expert, which a port may take in another order
        than torch's, or all of them (its expert run on every token), and put back."""
        return replace(self, shape=(len(order), *self.shape[1:]),
                       stored_shape=self.stored_shape or self.shape,
                       rows=tuple(int(i) for i in order), fp32_flipped=None)

    def summed_over_batch(self) -> "RecordInfo":
        """This record's copies along its first axis summed into one: the gradient of an
        output the other side computes once and broadcasts is the sum of its copies'. torch's
        float64 rerun measured each copy's float32 error, not the sum's: a sum is judged by the
        tolerance, not by that noise."""
        return replace(self, shape=(1, *self.shape[1:]), stored_shape=self.shape,
                       batch_read=SUMMED, fp32_noise_rms=None, exact_rms=None,
                       fp32_spread_rms=None, fp32_flipped=None)

    def to_dict(self) -> Dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "shape": list(self.shape),
                "dtype": self.dtype, "order": self.order, "shard": self.shard, "key": self.key,
                "op": self.op, "attrs": self.attrs, "crc32": self.crc32,
                "fp32_noise_rms": self.fp32_noise_rms, "exact_rms": self.exact_rms,
                "fp32_spread_rms": self.fp32_spread_rms,
                "fp32_flipped": None if self.fp32_flipped is None else list(self.fp32_flipped)}

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "RecordInfo":
        """TypeError or ValueError on a field of the wrong type: a damaged manifest is refused,
        not read as a record named "5"."""
        kind = _text(data, "kind")
        if kind not in KIND_RANK:
            raise ValueError(f"kind {kind!r} is none of {', '.join(KINDS)}")
        return cls(name=_text(data, "name"), kind=kind,
                   shape=tuple(_count(s) for s in data["shape"]), dtype=_text(data, "dtype"),
                   order=int(data["order"]), shard=_text(data, "shard"), key=_text(data, "key"),
                   op=str(data.get("op", "")), attrs=dict(data.get("attrs", {})),
                   crc32=int(data["crc32"]),
                   fp32_noise_rms=_optional_float(data.get("fp32_noise_rms")),
                   exact_rms=_optional_float(data.get("exact_rms")),
                   fp32_spread_rms=_optional_float(data.get("fp32_spread_rms")),
                   fp32_flipped=None if data.get("fp32_flipped") is None else
                   tuple(int(i) for i in data["fp32_flipped"]))


def _text(data: Dict[str, Any], key: str) -> str:
    value = data[key]
    if not isinstance(value, str) or not value:
        raise TypeError(f"{key} {value!r} is not a name")
    return value


def _count(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"shape has {value!r}, not a size")
    return value


def _optional_float(value: Any) -> Optional[float]:
    return None if value is None else float(value)


@dataclass(frozen=True)
class TensorStats:
    """Every statistic of one tensor pair (torch first, MindSpore second) and the verdict.

    Relative figures use the guarded magnitude max(|torch|, rms(torch)); see
    parity/compare/metrics.py for the two verdict rules.
    """

    passed: bool
    max_abs: float
    max_rel: float
    mean_abs: float
    rms: float
    ref_rms: float
    cosine: float
    frac_within: float
    worst_index: Tuple[int, ...]
    worst_torch: float
    worst_mindspore: float
    nan_torch: int
    nan_mindspore: int
    inf_torch: int
    inf_mindspore: int
    needed_rtol: float         # the smallest rtol that would have passed (atol fixed)
    fp32_noise: float          # rms(t32 - t64) / rms(t64): torch's own float32 error
    ms_error: float            # rms(ms - t32) / rms(t64): MindSpore's distance from torch
    noise_ratio: float         # ms_error over torch's own (guarded); NaN without float64
    reason: str


@dataclass(frozen=True)
class Comparison(TensorStats):
    """One torch-vs-MindSpore record pair: its statistics, tolerance and verdict."""

    name: str
    kind: str
    shape: Tuple[int, ...]
    rtol: float
    atol: float
    min_cosine: float
    noise_factor: float
    order: int                # position in divergence order
    mindspore_name: str = ""
    # relative error allowed for ReLU units flipped by float32 noise before it (parity/kinks.py)
    flip_allowance: float = 0.0
    # relative error allowed for a gradient that is a sum over batch and space (a norm layer's
    # weight or bias, a conv's or dense layer's bias) and for what the step makes of it (engine)
    sum_allowance: float = 0.0
    # relative error allowed for a loss that is the cross entropy of each side's own logits: the
    # two logits' losses apart (compare/loss.py)
    logits_allowance: float = 0.0

    @property
    def allowance(self) -> float:
        """All that is added to torch's relative float32 error before the noise factor."""
        return self.flip_allowance + self.sum_allowance + self.logits_allowance

    @property
    def fails_above(self) -> float:
        """The smallest error this run can see here: the ``ms_error`` (MindSpore's relative
        RMS difference from torch) above which the record fails, noise_factor × torch's own
        float32 error and allowances. Where those are large (BatchNorm over few values per
        channel; gradients behind ReLU units the frameworks set differently) a bug smaller than
        this passes. NaN without the float64 reference, whose fixed tolerances judge element
        by element, and where torch's value is all zeros (no error is relative to it)."""
        if not self.ref_rms > 0:
            return float("nan")
        if self.ms_error > 0 and self.noise_ratio > 0:     # the verdict's own denominator
            return self.noise_factor * self.ms_error / self.noise_ratio
        # MindSpore equal to torch: that denominator, but for its floor and atol terms
        return self.noise_factor * (self.fp32_noise + self.allowance)

    @property
    def let_through_by_floor(self) -> bool:
        """Passed though MindSpore is off by more than the noise factor allows: the tolerance's
        floors alone let it through, its atol where the values are small against it (its
        relative noise_floor, 1e-6, where their rms exceeds atol / noise_floor). False without
        the float64 reference (NaN compares false)."""
        return self.passed and self.ms_error > self.noise_factor * (self.fp32_noise
                                                                    + self.allowance)


@dataclass(frozen=True)
class Divergence:
    name: str
    kind: str
    mindspore_name: str
    max_abs: float
    max_rel: float
    cosine: float
    reason: str


@dataclass(frozen=True)
class Diagnosis:
    cause: str                # short name of the likely cause
    detail: str               # what the evidence is, and what to check
    confidence: str = "likely"   # "certain" when module settings prove it, else "likely"/"guess"


@dataclass(frozen=True)
class Alignment:
    """MindSpore record name -> PyTorch record name, plus what could not be matched."""

    mindspore_to_torch: Dict[str, str]
    unmatched_torch: Tuple[str, ...] = ()
    unmatched_mindspore: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Meta:
    versions: Dict[str, Dict[str, str]]
    seed: int
    config: Dict[str, Any]
    tolerance: Dict[str, Any]
    command: str = ""
    notes: Tuple[str, ...] = ()
    run_dirs: Dict[str, str] = field(default_factory=dict)
    fingerprint: str = ""       # of the initial weights and batch (torch capture); "" if unknown
    batch: str = ""             # its arrays: "input 2×3×64×64 float32 · target 2 int64"
