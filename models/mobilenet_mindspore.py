"""MindSpore port of torchvision's MobileNetV2: the second built-in family.

Its parts differ from ResNet's where a checker can stumble: ReLU6 (two kinks, at 0 and at 6),
depthwise convolutions (``group`` = channels), residual additions without a ReLU after them,
global pooling written as a function (no module, so no record on the torch side) and a
classifier with Dropout, which parity runs as identity on both sides.

Cell and parameter names follow torchvision's module paths (``features.1.conv.0.0``,
``classifier.1``); BatchNorm momentum and eps are converted as in ``resnet_mindspore``.
"""

from __future__ import annotations

from typing import List

import mindspore.nn as nn
import mindspore.ops as ops

from models.resnet_mindspore import batch_norm

# (expansion t, output channels c, blocks n, first stride s), torchvision's width 1.0
INVERTED_RESIDUAL_SETTING = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                             (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


class ConvBNReLU6(nn.SequentialCell):
    """torchvision's Conv2dNormActivation: conv (symmetric padding), BatchNorm, ReLU6."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3,
                 stride: int = 1, groups: int = 1) -> None:
        super().__init__([
            nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, pad_mode="pad",
                      padding=(kernel_size - 1) // 2, group=groups, has_bias=False),
            batch_norm(out_channels), nn.ReLU6()])


class InvertedResidual(nn.Cell):
    def __init__(self, in_channels: int, out_channels: int, stride: int,
                 expansion: int) -> None:
        super().__init__()
        hidden = in_channels * expansion
        self.use_residual = stride == 1 and in_channels == out_channels
        layers: List[nn.Cell] = []
        if expansion != 1:
            layers.append(ConvBNReLU6(in_channels, hidden, kernel_size=1))
        layers += [ConvBNReLU6(hidden, hidden, stride=stride, groups=hidden),
                   nn.Conv2d(hidden, out_channels, 1, pad_mode="valid", has_bias=False),
                   batch_norm(out_channels)]
        self.conv = nn.SequentialCell(layers)

    def construct(self, x):
        if self.use_residual:
            return x + self.conv(x)
        return self.conv(x)


class MobileNetV2(nn.Cell):
    def __init__(self, num_classes: int = 1000, dropout: float = 0.2) -> None:
        super().__init__()
        in_channels, last_channels = 32, 1280
        features: List[nn.Cell] = [ConvBNReLU6(3, in_channels, stride=2)]
        for expansion, channels, blocks, stride in INVERTED_RESIDUAL_SETTING:
            for index in range(blocks):
                features.append(InvertedResidual(in_channels, channels,
                                                 stride if index == 0 else 1, expansion))
                in_channels = channels
        features.append(ConvBNReLU6(in_channels, last_channels, kernel_size=1))
        self.features = nn.SequentialCell(features)
        self.classifier = nn.SequentialCell([nn.Dropout(p=dropout),
                                             nn.Dense(last_channels, num_classes)])

    def construct(self, x):
        x = ops.mean(self.features(x), (2, 3))      # torch: adaptive_avg_pool2d, flatten
        return self.classifier(x)


def mobilenet_v2(num_classes: int = 1000) -> MobileNetV2:
    return MobileNetV2(num_classes=num_classes)
