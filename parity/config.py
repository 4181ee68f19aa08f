"""The training-step configuration both capture processes run, and how it differs per side.

Defaults reproduce torch's semantics (SGD with momentum, weight decay on every parameter,
mean cross entropy). Each convention where MindSpore's defaults differ is a field, so a user can
reproduce their own MindSpore training set-up and see its effect on the comparison.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, Optional

# MindSpore optimizers skip parameters named gamma/beta by default; torch decays everything.
WEIGHT_DECAY_SCOPES = ("all", "no-gamma-beta", "no-gamma-beta-bias")
SEEDS = range(2**32)     # what MindSpore's set_seed takes
# Settings of the step both captures run (the ms_* ones and the losses are one side's own). A
# MindSpore capture made from a torch one (--reference) takes them from it unless given.
SHARED_STEP_SETTINGS = ("lr", "momentum", "weight_decay", "nesterov", "dampening",
                        "label_smoothing")


@dataclass(frozen=True)
class StepConfig:
    model: str = "resnet50"
    torch_factory: Optional[str] = None
    mindspore_factory: Optional[str] = None
    num_classes: Optional[int] = None      # None: the model's own (read from its output)
    batch_size: int = 2
    image_size: int = 64
    seed: int = 0
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 1e-4
    nesterov: bool = False
    dampening: float = 0.0
    label_smoothing: float = 0.0           # of the default losses (mean cross entropy)
    torch_loss: Optional[str] = None       # "package.module:factory" of your own loss
    ms_loss: Optional[str] = None
    ms_weight_decay_scope: str = "all"
    ms_loss_scale: float = 1.0
    ms_scale_loss: bool = True

    def __post_init__(self) -> None:
        if self.ms_weight_decay_scope not in WEIGHT_DECAY_SCOPES:
            raise ValueError(f"ms_weight_decay_scope must be one of {WEIGHT_DECAY_SCOPES}")
        for name in ("batch_size", "image_size", "num_classes"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.seed not in SEEDS:
            raise ValueError(f"seed must be between 0 and 2**32 - 1, got {self.seed}")

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "StepConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
