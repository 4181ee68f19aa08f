"""The training-step configuration both capture processes run, and how it differs per side.

Defaults reproduce torch's semantics (SGD with momentum, weight decay on every parameter,
mean cross entropy; Adam and AdamW as torch.optim's). Each convention where MindSpore's
defaults differ is a field, so a user can reproduce their own MindSpore training set-up and
see its effect on the comparison.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import numpy as np

from parity.records import split_part

# MindSpore optimizers skip parameters named gamma/beta by default; torch decays everything.
WEIGHT_DECAY_SCOPES = ("all", "no-gamma-beta", "no-gamma-beta-bias")
# torch.optim's SGD, Adam (weight decay added to the gradient) and AdamW (decoupled), and the
# state each keeps per parameter, recorded as PARAM.STATE (its momentum buffer, its moments)
OPTIMIZER_STATE = {"sgd": ("momentum_buffer",), "adam": ("exp_avg", "exp_avg_sq"),
                   "adamw": ("exp_avg", "exp_avg_sq")}
OPTIMIZERS = tuple(OPTIMIZER_STATE)
STATE_SUFFIXES = tuple(sorted({f".{state}" for states in OPTIMIZER_STATE.values()
                               for state in states}))
# MindSpore's own Adams, which a training script may step with instead of the one parity
# steps to match torch's (experimental.optim.AdamW): --ms-adam reproduces them
MS_ADAMS = ("nn.Adam", "nn.AdamWeightDecay", "experimental.optim.Adam")
SGD_SETTINGS = ("momentum", "nesterov", "dampening")
ADAM_SETTINGS = ("beta1", "beta2", "eps")
SEEDS = range(2**32)     # what MindSpore's set_seed takes
# Settings of the step both captures run (the ms_* ones and the losses are one side's own). A
# MindSpore capture made from a torch one (--reference) takes them from it unless given.
SHARED_STEP_SETTINGS = ("optimizer", "lr", "momentum", "weight_decay", "nesterov", "dampening",
                        *ADAM_SETTINGS, "label_smoothing")
_COUNT = (lambda value: value >= 1, "a positive integer")
_FINITE_AT_LEAST_ZERO = (lambda value: 0 <= value < math.inf, "a finite number >= 0")
_FRACTION = (lambda value: 0 <= value <= 1, "between 0 and 1")
# Integer settings; the counts may be None (the model's own class count, the user's batch).
COUNTS = ("batch_size", "image_size", "num_classes")
INTEGER_SETTINGS = (*COUNTS, "seed")
SWITCHES = ("nesterov", "ms_scale_loss")     # true or false: "no" would read as true
# The values each numeric setting may take (NaN is in none): outside them one framework
# refuses it deep in a capture, or the step means nothing (an infinite weight decay).
NUMBER_RANGES: Dict[str, Tuple[Callable[[float], bool], str]] = {
    **{name: _COUNT for name in COUNTS},
    "seed": (lambda value: value in SEEDS, "an integer between 0 and 2**32 - 1"),
    "lr": _FINITE_AT_LEAST_ZERO,
    "momentum": _FINITE_AT_LEAST_ZERO,
    "weight_decay": _FINITE_AT_LEAST_ZERO,
    "dampening": _FRACTION,
    "beta1": (lambda value: 0 <= value < 1, "at least 0 and below 1"),
    "beta2": (lambda value: 0 <= value < 1, "at least 0 and below 1"),
    "eps": _FINITE_AT_LEAST_ZERO,
    "label_smoothing": _FRACTION,
    "ms_loss_scale": (lambda value: 0 < value < math.inf, "a finite number > 0"),
}


def split_state(name: str) -> Tuple[str, str]:
    """An optimizer state record's name as (its parameter, its suffix); any other name as
    (itself, ""). A part's parameter is that part of its parameter
    (``qkv.weight.momentum_buffer[0:32]``: ``qkv.weight[0:32]``)."""
    whole, part = split_part(name)
    for suffix in STATE_SUFFIXES:
        if whole.endswith(suffix):
            param = whole[: -len(suffix)]
            return (part.of(param) if part is not None else param), suffix
    return name, ""


def classes_last(logits_shape: Tuple[int, ...], labels_shape: Tuple[int, ...]) -> bool:
    """Whether the default cross entropy reads the class scores on the logits' last axis: a
    language model's or token tagger's N×L×V for labels N×L (torch's cross entropy reads them
    on axis 1, as a segmenter's N×C×H×W for labels N×H×W; a shape fitting both, L = V, is
    read as torch reads it)."""
    logits, labels = tuple(logits_shape), tuple(labels_shape)
    return len(logits) >= 3 and logits[:-1] == labels and logits[:1] + logits[2:] != labels


def other_optimizers_settings(optimizer: str, given: Mapping[str, str],
                              choose: str) -> Optional[str]:
    """What is wrong when ``given`` (setting: the name the user gave it by) holds settings
    of another optimizer than ``optimizer``, which would be ignored; ``choose`` is how the user
    names the optimizer ("--optimizer ")."""
    others = sorted({name for key, name in given.items()
                     if key in (ADAM_SETTINGS if optimizer == "sgd" else SGD_SETTINGS)})
    if not others:
        return None
    owner, wanted = ("SGD's", "sgd") if optimizer != "sgd" else ("Adam's and AdamW's",
                                                                 "adam or adamw")
    sets, them = ("sets", "it") if len(others) == 1 else ("set", "them")
    return (f"{', '.join(others)} {sets} {owner} step, and the optimizer is {optimizer}: pass "
            f"{choose}{wanted}, or leave {them} out")


def out_of_range(name: str, value: Any) -> Optional[str]:
    """What is wrong with ``value`` for the numeric setting ``name`` ("must be ..."), or None."""
    accepts, wanted = NUMBER_RANGES[name]
    kind = numbers.Integral if name in INTEGER_SETTINGS else numbers.Real
    is_number = isinstance(value, kind) and not isinstance(value, bool)
    return None if is_number and accepts(value) else f"must be {wanted}"


@dataclass(frozen=True)
class StepConfig:
    model: str = "resnet50"
    torch_factory: Optional[str] = None
    mindspore_factory: Optional[str] = None
    num_classes: Optional[int] = None      # None: the model's own (read from its output)
    batch_size: Optional[int] = 2          # of the synthetic batch; None: the batch is the user's
    image_size: Optional[int] = 64
    seed: int = 0
    optimizer: str = "sgd"
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 1e-4
    nesterov: bool = False
    dampening: float = 0.0
    beta1: float = 0.9                     # Adam's and AdamW's betas and eps
    beta2: float = 0.999
    eps: float = 1e-8
    label_smoothing: float = 0.0           # of the default losses (mean cross entropy)
    torch_loss: Optional[str] = None       # "package.module:factory" of your own loss
    ms_loss: Optional[str] = None
    ms_weight_decay_scope: str = "all"
    ms_loss_scale: float = 1.0
    ms_scale_loss: bool = True
    ms_adam: Optional[str] = None          # one of MS_ADAMS; None: torch's Adam or AdamW

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got "
                             f"{self.optimizer!r}")
        if self.ms_weight_decay_scope not in WEIGHT_DECAY_SCOPES:
            raise ValueError(f"ms_weight_decay_scope must be one of {WEIGHT_DECAY_SCOPES}")
        for name in NUMBER_RANGES:
            value = getattr(self, name)
            if value is None and name in COUNTS:
                continue
            problem = out_of_range(name, value)
            if problem:
                raise ValueError(f"{name} {problem}, got {value!r}")
            # numpy's numbers as Python's: the configuration is written as JSON
            object.__setattr__(self, name, (int if name in INTEGER_SETTINGS else float)(value))
        for name in SWITCHES:
            value = getattr(self, name)
            if not isinstance(value, (bool, np.bool_)):
                raise ValueError(f"{name} must be true or false, got {value!r}")
            object.__setattr__(self, name, bool(value))
        if self.ms_adam is not None and self.ms_adam not in MS_ADAMS:
            raise ValueError(f"ms_adam must be one of {', '.join(MS_ADAMS)}, got "
                             f"{self.ms_adam!r}")
        if self.ms_adam is not None and self.optimizer == "sgd":
            raise ValueError(f"{self.ms_adam} steps MindSpore's side of Adam or AdamW; the "
                             "optimizer is sgd: choose adam or adamw")
        if self.nesterov and self.optimizer != "sgd":
            raise ValueError(f"Nesterov momentum is SGD's; {self.optimizer} has none")
        if self.nesterov and not (self.momentum > 0 and self.dampening == 0):
            raise ValueError("Nesterov momentum needs momentum > 0 and dampening 0 (torch's SGD "
                             f"refuses anything else), got momentum {self.momentum:g}, "
                             f"dampening {self.dampening:g}")

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "StepConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
