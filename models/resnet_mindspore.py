"""MindSpore port of torchvision's ResNet family (v1.5: the stride sits on the 3x3 conv).

Cell and parameter names follow torchvision's module paths (``layer1.0.conv2``,
``layer1.0.downsample.0``) so the built-in pair maps by name; only BatchNorm's parameters carry
MindSpore's own names (gamma, beta, moving_mean, moving_variance).

Each place where a naive port would drift from torchvision is written out explicitly:

* every conv pads symmetrically (``pad_mode='pad'``); ``pad_mode='same'`` pads bottom/right only
  on stride-2 layers and shifts the window by a pixel;
* max pooling pads by 1 on each side like ``nn.MaxPool2d(3, 2, padding=1)``;
* BatchNorm eps is 1e-5, and the momentum is converted: MindSpore's ``momentum`` weights the
  *old* running value, torch's weights the *new* one (torch 0.1 == MindSpore 0.9);
* the classifier has a bias; global pooling is a mean over H and W.
"""

from __future__ import annotations

from typing import Optional, Sequence, Type, Union

import mindspore.nn as nn
import mindspore.ops as ops

TORCH_BN_MOMENTUM = 0.1
BN_EPS = 1e-5


def torch_to_mindspore_bn_momentum(torch_momentum: float) -> float:
    """torch: new = (1-m)*old + m*batch; MindSpore: new = m*old + (1-m)*batch."""
    return 1.0 - torch_momentum


def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, 3, stride=stride, pad_mode="pad", padding=1,
                     has_bias=False)


def conv1x1(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, 1, stride=stride, pad_mode="valid", has_bias=False)


def batch_norm(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, eps=BN_EPS,
                          momentum=torch_to_mindspore_bn_momentum(TORCH_BN_MOMENTUM))


class GlobalAvgPool(nn.Cell):
    """torch's AdaptiveAvgPool2d((1, 1)) as a mean over H and W."""

    def construct(self, x):
        return ops.mean(x, (2, 3), keep_dims=True)


class BasicBlock(nn.Cell):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1,
                 downsample: Optional[nn.Cell] = None) -> None:
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = batch_norm(planes)
        self.relu = nn.ReLU()
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = batch_norm(planes)
        self.downsample = downsample

    def residual_sum(self, x):
        """The block's output before its final ReLU."""
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return out + identity

    def construct(self, x):
        return self.relu(self.residual_sum(x))


class Bottleneck(nn.Cell):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1,
                 downsample: Optional[nn.Cell] = None) -> None:
        super().__init__()
        self.conv1 = conv1x1(inplanes, planes)
        self.bn1 = batch_norm(planes)
        self.conv2 = conv3x3(planes, planes, stride)
        self.bn2 = batch_norm(planes)
        self.conv3 = conv1x1(planes, planes * self.expansion)
        self.bn3 = batch_norm(planes * self.expansion)
        self.relu = nn.ReLU()
        self.downsample = downsample

    def residual_sum(self, x):
        """The block's output before its final ReLU."""
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return out + identity

    def construct(self, x):
        return self.relu(self.residual_sum(x))


Block = Union[Type[BasicBlock], Type[Bottleneck]]


class ResNet(nn.Cell):
    def __init__(self, block: Block, layers: Sequence[int], num_classes: int = 1000) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, pad_mode="pad", padding=3, has_bias=False)
        self.bn1 = batch_norm(64)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, pad_mode="pad", padding=1)
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], stride=2)
        self.layer3 = self._make_layer(block, 256, layers[2], stride=2)
        self.layer4 = self._make_layer(block, 512, layers[3], stride=2)
        self.avgpool = GlobalAvgPool()
        self.fc = nn.Dense(512 * block.expansion, num_classes, has_bias=True)

    def _make_layer(self, block: Block, planes: int, blocks: int,
                    stride: int = 1) -> nn.SequentialCell:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.SequentialCell(conv1x1(self.inplanes, planes * block.expansion, stride),
                                           batch_norm(planes * block.expansion))
        cells = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        cells += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.SequentialCell(cells)

    def construct(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = self.avgpool(x)
        return self.fc(x.reshape(x.shape[0], -1))


def _resnet(block: Block, layers: Sequence[int], num_classes: int) -> ResNet:
    return ResNet(block, layers, num_classes=num_classes)


def resnet18(num_classes: int = 1000) -> ResNet:
    return _resnet(BasicBlock, [2, 2, 2, 2], num_classes)


def resnet34(num_classes: int = 1000) -> ResNet:
    return _resnet(BasicBlock, [3, 4, 6, 3], num_classes)


def resnet50(num_classes: int = 1000) -> ResNet:
    return _resnet(Bottleneck, [3, 4, 6, 3], num_classes)


def resnet101(num_classes: int = 1000) -> ResNet:
    return _resnet(Bottleneck, [3, 4, 23, 3], num_classes)


def resnet152(num_classes: int = 1000) -> ResNet:
    return _resnet(Bottleneck, [3, 8, 36, 3], num_classes)
