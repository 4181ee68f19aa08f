"""MindSpore ports with one classic migration bug each, and a port with its own names.

Each factory is zero-argument, as ``--ms-model pkg.mod:factory`` expects.
"""

from __future__ import annotations

import os
import signal

import mindspore as ms
import mindspore.nn as nn
import mindspore.ops as ops

from models import resnet_mindspore as port


def _resnet50():
    return port.resnet50()


def bn_eps_bug():
    """layer2.0.bn2 with eps 1e-3 instead of torch's 1e-5."""
    net = _resnet50()
    net.layer2[0].bn2 = nn.BatchNorm2d(128, eps=1e-3, momentum=0.9)
    return net


def same_padding_bug():
    """layer2.0.conv2 (3×3, stride 2) with pad_mode='same': pads bottom/right only."""
    net = _resnet50()
    net.layer2[0].conv2 = nn.Conv2d(128, 128, 3, stride=2, pad_mode="same", has_bias=False)
    return net


class _NoFinalReLU(port.Bottleneck):
    def construct(self, x):
        return self.residual_sum(x)


def missing_relu_bug():
    """layer3.1 forgets the ReLU after the residual addition."""
    net = _resnet50()
    net.layer3[1] = _NoFinalReLU(1024, 256)
    return net


def bn_momentum_bug():
    """layer1.0.bn1 given torch's momentum value (0.1) unconverted."""
    net = _resnet50()
    net.layer1[0].bn1 = nn.BatchNorm2d(64, eps=1e-5, momentum=0.1)
    return net


def maxpool_same_padding_bug():
    """The stem's max pooling with pad_mode='same' instead of padding=1."""
    net = _resnet50()
    net.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, pad_mode="same")
    return net


def running_statistics_bug():
    """layer1.0.bn1 told to normalise with its running statistics even in training."""
    net = _resnet50()
    net.layer1[0].bn1 = nn.BatchNorm2d(64, eps=1e-5, momentum=0.9, use_batch_statistics=False)
    return net


class HandWrittenBatchNorm(nn.Cell):
    """BatchNorm as a port might write it by hand, with MindSpore's parameter names, and one of
    two bugs: its running variance moves towards the *biased* batch variance, or (a bug of the
    backward only) the weight's gradient is ``gamma_gradient`` times the true one."""

    def __init__(self, channels: int, biased: bool = True, gamma_gradient: float = 1.0):
        super().__init__()
        self.gamma = ms.Parameter(ops.ones(channels, ms.float32), name="gamma")
        self.beta = ms.Parameter(ops.zeros(channels, ms.float32), name="beta")
        self.moving_mean = ms.Parameter(ops.zeros(channels, ms.float32), name="moving_mean",
                                        requires_grad=False)
        self.moving_variance = ms.Parameter(ops.ones(channels, ms.float32),
                                            name="moving_variance", requires_grad=False)
        self.eps, self.momentum = 1e-5, 0.9
        self.biased, self.gamma_gradient = biased, gamma_gradient

    def construct(self, x):
        mean = x.mean(axis=(0, 2, 3), keep_dims=True)
        variance = ((x - mean) ** 2).mean(axis=(0, 2, 3), keep_dims=True)
        count = x.shape[0] * x.shape[2] * x.shape[3]
        running_variance = variance if self.biased else variance * count / (count - 1)
        for buffer, batch_value in ((self.moving_mean, mean),
                                    (self.moving_variance, running_variance)):
            ops.assign(buffer, self.momentum * buffer
                       + (1 - self.momentum) * ops.stop_gradient(batch_value.reshape(-1)))
        # the same value as gamma; its gradient scaled by gamma_gradient
        gamma = self.gamma * self.gamma_gradient \
            + ops.stop_gradient(self.gamma) * (1 - self.gamma_gradient)
        scale = gamma.reshape(1, -1, 1, 1) / ops.sqrt(variance + self.eps)
        return (x - mean) * scale + self.beta.reshape(1, -1, 1, 1)


def biased_running_variance_bug():
    """layer1.0.bn1 hand-written, updating running_var with the biased batch variance."""
    net = _resnet50()
    net.layer1[0].bn1 = HandWrittenBatchNorm(64)
    return net


def half_gamma_gradient_bug():
    """MobileNetV2 whose features.2.conv.0.1 BatchNorm (before a depthwise conv and the next
    BatchNorm: its weight gradient nearly cancels) passes back half its weight's gradient."""
    from models.mobilenet_mindspore import mobilenet_v2
    net = mobilenet_v2()
    net.features[2].conv[0][1] = HandWrittenBatchNorm(96, biased=False, gamma_gradient=0.5)
    return net


def relu_for_relu6_bug():
    """MobileNetV2 whose stem activation is ReLU, not ReLU6: on a random-init batch no value
    reaches 6, so only the operation type shows it."""
    from models.mobilenet_mindspore import mobilenet_v2
    net = mobilenet_v2()
    net.features[0][2] = nn.ReLU()
    return net


class RenamedBottleneck(nn.Cell):
    """Bottleneck with MindSpore-style names: down_sample, act, norm*."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1, down_sample=None):
        super().__init__()
        self.conv_a = port.conv1x1(inplanes, planes)
        self.norm_a = port.batch_norm(planes)
        self.conv_b = port.conv3x3(planes, planes, stride)
        self.norm_b = port.batch_norm(planes)
        self.conv_c = port.conv1x1(planes, planes * 4)
        self.norm_c = port.batch_norm(planes * 4)
        self.act = nn.ReLU()
        self.down_sample = down_sample

    def construct(self, x):
        identity = x
        out = self.act(self.norm_a(self.conv_a(x)))
        out = self.act(self.norm_b(self.conv_b(out)))
        out = self.norm_c(self.conv_c(out))
        if self.down_sample is not None:
            identity = self.down_sample(x)
        return self.act(out + identity)


class RenamedResNet50(nn.Cell):
    """ResNet50 whose cell names differ from torchvision's everywhere they can."""

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        self.stem_conv = nn.Conv2d(3, 64, 7, stride=2, pad_mode="pad", padding=3, has_bias=False)
        self.stem_bn = port.batch_norm(64)
        self.stem_act = nn.ReLU()
        self.max_pool = nn.MaxPool2d(kernel_size=3, stride=2, pad_mode="pad", padding=1)
        inplanes, stages = 64, []
        for planes, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            down = nn.SequentialCell(port.conv1x1(inplanes, planes * 4, stride),
                                     port.batch_norm(planes * 4))
            cells = [RenamedBottleneck(inplanes, planes, stride, down)]
            inplanes = planes * 4
            cells += [RenamedBottleneck(inplanes, planes) for _ in range(1, blocks)]
            stages.append(nn.SequentialCell(cells))
        self.stages = nn.CellList(stages)
        self.pool = port.GlobalAvgPool()
        self.classifier = nn.Dense(2048, num_classes)

    def construct(self, x):
        x = self.max_pool(self.stem_act(self.stem_bn(self.stem_conv(x))))
        for stage in self.stages:
            x = stage(x)
        x = self.pool(x)
        return self.classifier(x.reshape(x.shape[0], -1))


def renamed_resnet50():
    return RenamedResNet50()


def killed_factory():
    """A user factory whose process the kernel kills (as its out-of-memory killer would)."""
    os.kill(os.getpid(), signal.SIGKILL)


def broken_factory():
    """A user factory whose model code fails."""
    raise TypeError("MyNet.__init__() missing 1 required positional argument: 'depth'")
