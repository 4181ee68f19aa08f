"""Losses as training scripts write them, for ``--ms-loss`` / ``--torch-loss tests.losses:F``."""

from __future__ import annotations

import mindspore as ms
import mindspore.nn as nn
import mindspore.ops as ops


class CrossEntropySmooth(nn.Cell):
    """Label smoothing as MindSpore's model-zoo ResNet trains: 1 − ε on the label, ε/(K−1) on
    every other class (torch: 1 − ε + ε/K and ε/K)."""

    def __init__(self, smooth_factor: float = 0.1, num_classes: int = 1000):
        super().__init__()
        self.on_value = ms.Tensor(1.0 - smooth_factor, ms.float32)
        self.off_value = ms.Tensor(smooth_factor / (num_classes - 1), ms.float32)
        self.num_classes = num_classes
        self.cross_entropy = nn.SoftmaxCrossEntropyWithLogits(reduction="mean")

    def construct(self, logits, labels):
        target = ops.one_hot(labels, self.num_classes, self.on_value, self.off_value)
        return self.cross_entropy(logits, target)


def model_zoo_label_smoothing():
    return CrossEntropySmooth()


def summed_cross_entropy():
    return nn.CrossEntropyLoss(reduction="sum")


def unreduced_cross_entropy():
    return nn.CrossEntropyLoss(reduction="none")


def label_smoothing():
    return nn.CrossEntropyLoss(label_smoothing=0.1)


def torch_label_smoothing():
    import torch
    return torch.nn.CrossEntropyLoss(label_smoothing=0.1)


def torch_unreduced_cross_entropy():
    import torch
    return torch.nn.CrossEntropyLoss(reduction="none")


AUX_WEIGHT = 0.4      # the auxiliary head's share of the loss, as GoogLeNet trains


def _with_aux(cross_entropy, aux_weight: float = AUX_WEIGHT):
    return lambda outputs, labels: cross_entropy(outputs[0], labels) + \
        aux_weight * cross_entropy(outputs[1], labels)


def two_heads():
    return _with_aux(nn.CrossEntropyLoss())


def two_heads_aux_weight_mistyped():
    """The training script's auxiliary weight transcribed as 0.3."""
    return _with_aux(nn.CrossEntropyLoss(), 0.3)


def torch_two_heads():
    import torch
    return _with_aux(torch.nn.CrossEntropyLoss())
