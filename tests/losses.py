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
