"""Model pairs parity knows by name: a torchvision builder and its MindSpore port.

The two builders are returned as import paths ("module:function") rather than callables so that
each capture process imports only its own framework.
"""

from __future__ import annotations

from dataclasses import dataclass

RESNET_DEPTHS = (18, 34, 50, 101, 152)


@dataclass(frozen=True)
class ModelPair:
    name: str
    torch_factory: str
    mindspore_factory: str


PAIRS = {
    f"resnet{depth}": ModelPair(
        name=f"resnet{depth}",
        torch_factory=f"torchvision.models:resnet{depth}",
        mindspore_factory=f"models.resnet_mindspore:resnet{depth}",
    )
    for depth in RESNET_DEPTHS
}
PAIRS["mobilenet_v2"] = ModelPair(name="mobilenet_v2",
                                  torch_factory="torchvision.models:mobilenet_v2",
                                  mindspore_factory="models.mobilenet_mindspore:mobilenet_v2")


def is_builtin_factory(spec: str) -> bool:
    """Built-in builders take ``num_classes``; users' factories take no arguments."""
    return any(spec in (pair.torch_factory, pair.mindspore_factory) for pair in PAIRS.values())


def get_pair(name: str) -> ModelPair:
    """The built-in pair called ``name``; KeyError lists the known names."""
    try:
        return PAIRS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; built-in pairs: {', '.join(PAIRS)}") from None
