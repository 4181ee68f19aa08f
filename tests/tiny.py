"""Tiny pairs in both frameworks, fast enough for the plugin, API and end-to-end tests: a conv
net (and its ported variants), one with layers whose MindSpore defaults differ, token-id
classifiers (one with an attention mask, one with tied weights), a segmenter, a small U-Net, a
U-Net-like classifier and a GroupNorm net that average over space right after their last norm,
small MLPs, a net with an auxiliary head, a Transformer encoder layer, a net running a block
again in its backward (activation checkpointing), weight- and spectral-normalised conv nets, a
3-D conv net over video clips, a conv standardising its weight, ports MindSpore has no CPU
kernels for (mindspore.mint.nn's, InstanceNorm2d), a mixture-of-experts layer, and nets a user
might hand over as they are: built in float64, torch.compile'd, held as ``self.module``."""

from __future__ import annotations

import math
import os
import signal
import time
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Optional, Tuple

import mindspore  # noqa: F401  (before torch)
import mindspore.nn as msnn
import mindspore.ops as ops
import numpy as np
import torch
import torch.nn as tnn

from models.resnet_mindspore import GlobalAvgPool


def _torch_tiny(*head: tnn.Module) -> tnn.Module:
    return tnn.Sequential(tnn.Conv2d(3, 8, 3, padding=1, bias=False), tnn.BatchNorm2d(8),
                          tnn.ReLU(), tnn.Conv2d(8, 8, 3, stride=2, padding=1, bias=False),
                          tnn.BatchNorm2d(8), tnn.ReLU(), tnn.AdaptiveAvgPool2d(1),
                          tnn.Flatten(), *head, tnn.Linear(8, 10))


def torch_tiny() -> tnn.Module:
    return _torch_tiny()


def torch_tiny_grouped_stem() -> tnn.Module:
    """Its first conv, BatchNorm and ReLU in a Sequential of their own, as torchvision's
    Conv2dNormActivation holds them (ms_tiny, flat, is its port)."""
    net = _torch_tiny()
    return tnn.Sequential(tnn.Sequential(*net[:3]), *net[3:])


def torch_tiny_frozen() -> tnn.Module:
    """Every parameter frozen: nothing for a training step to train."""
    return _torch_tiny().requires_grad_(False)


def torch_tiny_float64() -> tnn.Module:
    """Built in float64 (model.double()) for a float32 port."""
    return _torch_tiny().double()


def torch_tiny_compiled() -> tnn.Module:
    """torch.compile'd (it compiles at the first call, not here)."""
    import torch
    return torch.compile(_torch_tiny())


def torch_tiny_dropout() -> tnn.Module:
    """Dropout (p = 0.2) before the classifier."""
    return _torch_tiny(tnn.Dropout(0.2))


class _FunctionalDropout(tnn.Module):
    """Dropout written into a forward: no dropout module for parity to run as identity."""

    def forward(self, x):
        return tnn.functional.dropout(x, 0.2, self.training)


def torch_tiny_functional_dropout() -> tnn.Module:
    return _torch_tiny(_FunctionalDropout())


class _DroppingInItsHead(tnn.Module):
    """Dropout before the classifier written into the forward, no module of its own, as timm's
    classifier heads do (``F.dropout(x, p=self.drop_rate, training=self.training)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.features, self.fc = _torch_tiny()[:-1], tnn.Linear(8, 10)

    def forward(self, x):
        return self.fc(tnn.functional.dropout(self.features(x), 0.2, self.training))


def torch_tiny_dropping_in_its_head() -> tnn.Module:
    return _DroppingInItsHead()


class _MsDroppingInItsConstruct(msnn.Cell):
    """Dropout before the classifier written into the construct (``ops.dropout``), no cell."""

    def __init__(self) -> None:
        super().__init__()
        self.features, self.fc = msnn.SequentialCell(list(_ms_tiny())[:-1]), msnn.Dense(8, 10)

    def construct(self, x):
        return self.fc(ops.dropout(self.features(x), p=0.2, training=self.training))


def ms_tiny_dropping_in_its_construct() -> msnn.Cell:
    return _MsDroppingInItsConstruct()


class _WaitsInTraining(tnn.Module):
    """The tiny net, but its training forward writes its process id into the file named by
    $PARITY_TEST_FORWARD_MARKER, then sleeps: a capture caught mid-step, for Ctrl-C tests.
    ``slow_to_stop``: interrupted, it goes on for a second more, as a long kernel does (Python
    raises KeyboardInterrupt only once the kernel returns), then writes "interrupted" there."""

    def __init__(self, slow_to_stop: bool = False) -> None:
        super().__init__()
        self.net = torch_tiny()
        self.slow_to_stop = slow_to_stop

    def forward(self, x):
        if self.training:
            Path(os.environ["PARITY_TEST_FORWARD_MARKER"]).write_text(str(os.getpid()))
            try:
                time.sleep(300)
            except KeyboardInterrupt:
                if self.slow_to_stop:
                    time.sleep(1)
                    Path(os.environ["PARITY_TEST_FORWARD_MARKER"]).write_text("interrupted")
                raise
        return self.net(x)


def torch_waits_in_training() -> tnn.Module:
    return _WaitsInTraining()


def torch_waits_in_training_slow_to_stop() -> tnn.Module:
    return _WaitsInTraining(slow_to_stop=True)


class _KilledInTraining(tnn.Module):
    """The tiny net, but its training forward kills its own process (SIGKILL), as the kernel's
    out-of-memory killer does mid-step."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch_tiny()

    def forward(self, x):
        if self.training:
            os.kill(os.getpid(), signal.SIGKILL)
        return self.net(x)


def torch_killed_in_training() -> tnn.Module:
    return _KilledInTraining()


def _ms_tiny(final_relu: bool = True, pad_mode: str = "pad", head=(), pool=None) -> msnn.Cell:
    padding = 1 if pad_mode == "pad" else 0
    return msnn.SequentialCell([
        msnn.Conv2d(3, 8, 3, pad_mode="pad", padding=1), msnn.BatchNorm2d(8, momentum=0.9),
        msnn.ReLU(), msnn.Conv2d(8, 8, 3, stride=2, pad_mode=pad_mode, padding=padding),
        msnn.BatchNorm2d(8, momentum=0.9), msnn.ReLU() if final_relu else msnn.Identity(),
        *(pool or [GlobalAvgPool(), msnn.Flatten()]), *head, msnn.Dense(8, 10)])


def ms_tiny_dropout() -> msnn.Cell:
    return _ms_tiny(head=[msnn.Dropout(p=0.2)])


def ms_tiny_dropout_keep_prob() -> msnn.Cell:
    """torch's Dropout(0.2) ported as nn.Dropout(0.2): MindSpore reads it as keep_prob."""
    return _ms_tiny(head=[msnn.Dropout(0.2)])


def ms_tiny() -> msnn.Cell:
    return _ms_tiny()


def ms_tiny_identity() -> msnn.Cell:
    """An Identity before the classifier torch has nothing for, as timm and mindcv build a
    head norm or a dropout of rate 0."""
    return _ms_tiny(head=[msnn.Identity()])


class _MsWaitsInTraining(msnn.SequentialCell):
    """The tiny net, but its training construct writes its process id into the file named by
    $PARITY_TEST_MS_FORWARD_MARKER, then sleeps: a MindSpore capture caught mid-step."""

    def construct(self, x):
        if self.training:
            Path(os.environ["PARITY_TEST_MS_FORWARD_MARKER"]).write_text(str(os.getpid()))
            time.sleep(300)
        return super().construct(x)


def ms_waits_in_training() -> msnn.Cell:
    return _MsWaitsInTraining(list(_ms_tiny().cells()))


class _ChannelsLast(msnn.Cell):
    """The tiny port written for channels-last images: it transposes the N×C×H×W batch parity
    feeds both models, and its first conv fails."""

    def __init__(self) -> None:
        super().__init__()
        self.net = ms_tiny()

    def construct(self, x):
        return self.net(x.transpose(0, 3, 1, 2))


def ms_tiny_channels_last() -> msnn.Cell:
    return _ChannelsLast()


def torch_instance_normed() -> tnn.Module:
    return tnn.Sequential(tnn.Conv2d(3, 8, 3, padding=1), tnn.InstanceNorm2d(8, affine=True),
                          tnn.ReLU(), tnn.AdaptiveAvgPool2d(1), tnn.Flatten(), tnn.Linear(8, 10))


def ms_instance_normed() -> msnn.Cell:
    """nn.InstanceNorm2d has no CPU kernel (MindSpore 2.8.0)."""
    return msnn.SequentialCell([
        msnn.Conv2d(3, 8, 3, pad_mode="pad", padding=1, has_bias=True), msnn.InstanceNorm2d(8),
        msnn.ReLU(), GlobalAvgPool(), msnn.Flatten(), msnn.Dense(8, 10)])


def ms_tiny_mint() -> msnn.Cell:
    """Written with mindspore.mint.nn, torch's API in MindSpore: its Conv2d and BatchNorm2d
    have no CPU kernel (MindSpore 2.8.0)."""
    import mindspore.mint.nn as mint_nn
    return msnn.SequentialCell([
        mint_nn.Conv2d(3, 8, 3, padding=1, bias=False), mint_nn.BatchNorm2d(8), msnn.ReLU(),
        mint_nn.Conv2d(8, 8, 3, stride=2, padding=1, bias=False), mint_nn.BatchNorm2d(8),
        msnn.ReLU(), GlobalAvgPool(), msnn.Flatten(), msnn.Dense(8, 10)])


def ms_tiny_mixed_precision_o1() -> msnn.Cell:
    """Rewritten by amp.auto_mixed_precision at level O1: no forward hook fires in it."""
    from mindspore import amp
    return amp.auto_mixed_precision(ms_tiny(), "O1")


def ms_tiny_mixed_precision_o2() -> msnn.Cell:
    """Cast to float16 by amp.auto_mixed_precision at level O2 (BatchNorm kept float32)."""
    from mindspore import amp
    return amp.auto_mixed_precision(ms_tiny(), "O2")


class _Compiled(msnn.Cell):
    """The tiny port with its construct compiled by @jit: its cells run inside the graph."""

    def __init__(self) -> None:
        super().__init__()
        self.net = ms_tiny()

    @mindspore.jit
    def construct(self, x):
        return self.net(x)


def ms_tiny_compiled() -> msnn.Cell:
    return _Compiled()


def frozen_stem(model):
    """``model`` with its first conv frozen (requires_grad False), as when fine-tuning."""
    stem = model[0]
    for param in stem.parameters() if isinstance(stem, tnn.Module) else stem.get_parameters():
        param.requires_grad = False
    return model


def ms_tiny_same_padding() -> msnn.Cell:
    """The stride-2 conv (cell "3") with pad_mode='same'."""
    return _ms_tiny(pad_mode="same")


class GlobalAvgPooling(msnn.Cell):
    """A mean over space returning (N, C), as mindcv's GlobalAvgPooling does where torch's
    AdaptiveAvgPool2d(1) returns (N, C, 1, 1): the port needs no Flatten after it. ``axes``
    (1, 2) means over a channels-last map's height and width, which this one is not."""

    def __init__(self, axes: Tuple[int, int] = (2, 3)) -> None:
        super().__init__()
        self.axes = axes

    def construct(self, x):
        return ops.mean(x, self.axes, keep_dims=False)


def ms_tiny_pooled_flat() -> msnn.Cell:
    return _ms_tiny(pool=[GlobalAvgPooling()])


def ms_tiny_pooled_over_channels() -> msnn.Cell:
    """Its mean taken over axes (1, 2), as over a channels-last (N, H, W, C) map: at 16² the
    stride-2 conv leaves 8 channels over 8 × 8, so the output keeps its shape."""
    return _ms_tiny(pool=[GlobalAvgPooling((1, 2))])


# A conv net whose layers' MindSpore defaults differ from torch's: nn.Conv2d (pad_mode 'same',
# no bias), nn.LeakyReLU (alpha 0.2), nn.AvgPool2d (stride 1). The port gives each explicitly;
# each variant leaves one to its default.
def torch_defaults() -> tnn.Module:
    return tnn.Sequential(tnn.Conv2d(3, 8, 3), tnn.BatchNorm2d(8), tnn.LeakyReLU(),
                          tnn.AvgPool2d(2), tnn.AdaptiveAvgPool2d(1), tnn.Flatten(),
                          tnn.Linear(8, 10))


def _ms_defaults(conv: Optional[msnn.Cell] = None, activation: Optional[msnn.Cell] = None,
                 pool: Optional[msnn.Cell] = None, dense: Optional[msnn.Cell] = None
                 ) -> msnn.Cell:
    return msnn.SequentialCell([
        conv or msnn.Conv2d(3, 8, 3, pad_mode="valid", has_bias=True),
        msnn.BatchNorm2d(8, momentum=0.9), activation or msnn.LeakyReLU(0.01),
        pool or msnn.AvgPool2d(2, 2), GlobalAvgPool(), msnn.Flatten(), dense or msnn.Dense(8, 10)])


def ms_defaults() -> msnn.Cell:
    return _ms_defaults()


def ms_defaults_conv_padding() -> msnn.Cell:
    return _ms_defaults(conv=msnn.Conv2d(3, 8, 3, has_bias=True))


def ms_defaults_conv_bias() -> msnn.Cell:
    return _ms_defaults(conv=msnn.Conv2d(3, 8, 3, pad_mode="valid"))


def ms_defaults_leaky_relu() -> msnn.Cell:
    return _ms_defaults(activation=msnn.LeakyReLU())


def ms_defaults_avg_pool() -> msnn.Cell:
    return _ms_defaults(pool=msnn.AvgPool2d(2))


# Parameters MindSpore names or holds otherwise: a LayerScale's gamma (ConvNeXt, CaiT) named
# so on both sides, nn.PReLU's weight (MindSpore: w), BatchNorm(affine=False), for which
# MindSpore keeps a frozen gamma of ones and beta of zeros and torch no weight or bias, and
# torch's BatchNorm(track_running_stats=False), for which MindSpore's (use_batch_statistics=True)
# keeps frozen running statistics.
class _TorchLayerScale(tnn.Module):
    def __init__(self) -> None:
        import torch
        super().__init__()
        self.conv = tnn.Conv2d(3, 8, 3, padding=1)
        self.norm = tnn.BatchNorm2d(8, affine=False)
        self.act = tnn.PReLU(8)
        self.gamma = tnn.Parameter(torch.full((8, 1, 1), 0.5))
        self.norm2 = tnn.BatchNorm2d(8, track_running_stats=False)
        self.head = tnn.Linear(8, 5)

    def forward(self, x):
        y = self.conv(x)
        return self.head(self.norm2(y + self.gamma * self.act(self.norm(y))).mean(dim=(2, 3)))


class _MsLayerScale(msnn.Cell):
    def __init__(self, batch_statistics: Optional[bool] = True) -> None:
        super().__init__()
        self.conv = msnn.Conv2d(3, 8, 3, pad_mode="pad", padding=1, has_bias=True)
        self.norm = msnn.BatchNorm2d(8, affine=False, momentum=0.9)
        self.act = msnn.PReLU(8)
        self.gamma = mindspore.Parameter(mindspore.Tensor(np.full((8, 1, 1), 0.5, np.float32)))
        self.norm2 = msnn.BatchNorm2d(8, momentum=0.9, use_batch_statistics=batch_statistics)
        self.head = msnn.Dense(8, 5)

    def construct(self, x):
        y = self.conv(x)
        return self.head(self.norm2(y + self.gamma * self.act(self.norm(y))).mean(axis=(2, 3)))


def torch_layer_scale() -> tnn.Module:
    return _TorchLayerScale()


def ms_layer_scale() -> msnn.Cell:
    return _MsLayerScale()


def ms_layer_scale_eval_statistics() -> msnn.Cell:
    """norm2 left at use_batch_statistics=None: in eval mode it normalises with its running
    statistics, torch's (track_running_stats=False) with the batch's."""
    return _MsLayerScale(batch_statistics=None)


# A conv net whose settings MindSpore spells alike but keeps, for pools and nn.Softmax, inside
# the primitive its cell calls: GroupNorm's num_groups, a softmax over the channels, a pool
# with ceil_mode and one not counting its padding; and a ChannelShuffle's groups. Each variant
# leaves one to MindSpore's default (or another value); the weights have the same shapes
# either way.
def torch_grouped_pools() -> tnn.Module:
    return tnn.Sequential(tnn.Conv2d(3, 8, 3, padding=1), tnn.GroupNorm(4, 8), tnn.Softmax(dim=1),
                          tnn.MaxPool2d(3, 2, ceil_mode=True),
                          tnn.AvgPool2d(3, 1, padding=1, count_include_pad=False),
                          tnn.ChannelShuffle(2), tnn.Conv2d(8, 8, 1),
                          tnn.AdaptiveAvgPool2d(1), tnn.Flatten(), tnn.Linear(8, 10))


def _ms_grouped_pools(norm: Optional[msnn.Cell] = None, softmax: Optional[msnn.Cell] = None,
                      max_pool: Optional[msnn.Cell] = None,
                      avg_pool: Optional[msnn.Cell] = None,
                      shuffle: Optional[msnn.Cell] = None) -> msnn.Cell:
    return msnn.SequentialCell([
        msnn.Conv2d(3, 8, 3, pad_mode="pad", padding=1, has_bias=True),
        norm or msnn.GroupNorm(4, 8), softmax or msnn.Softmax(axis=1),
        max_pool or msnn.MaxPool2d(3, 2, pad_mode="pad", ceil_mode=True),
        avg_pool or msnn.AvgPool2d(3, 1, pad_mode="pad", padding=1, count_include_pad=False),
        shuffle or msnn.ChannelShuffle(2), msnn.Conv2d(8, 8, 1, has_bias=True),
        GlobalAvgPool(), msnn.Flatten(), msnn.Dense(8, 10)])


def ms_grouped_pools() -> msnn.Cell:
    return _ms_grouped_pools()


def ms_grouped_pools_two_groups() -> msnn.Cell:
    return _ms_grouped_pools(norm=msnn.GroupNorm(2, 8))


def ms_grouped_pools_shuffled_in_four() -> msnn.Cell:
    return _ms_grouped_pools(shuffle=msnn.ChannelShuffle(4))


def ms_grouped_pools_last_axis_softmax() -> msnn.Cell:
    return _ms_grouped_pools(softmax=msnn.Softmax())


def ms_grouped_pools_floor() -> msnn.Cell:
    return _ms_grouped_pools(max_pool=msnn.MaxPool2d(3, 2))


def ms_grouped_pools_max_pool_stride_left_out() -> msnn.Cell:
    """nn.MaxPool2d's stride left out: MindSpore's defaults to 1, torch's to the kernel size."""
    return _ms_grouped_pools(max_pool=msnn.MaxPool2d(3, pad_mode="pad", ceil_mode=True))


def ms_grouped_pools_padding_counted() -> msnn.Cell:
    return _ms_grouped_pools(avg_pool=msnn.AvgPool2d(3, 1, pad_mode="pad", padding=1))


# A conv net padding its maps with reflected, replicated and constant values by pad modules,
# and its ports: correct (MindSpore's pad cells take torch's widths), replicating for
# reflecting, padding with 0 for 0.5, or given the widths top and bottom first.
def torch_padded() -> tnn.Module:
    return tnn.Sequential(tnn.Conv2d(3, 8, 3, padding=1), tnn.ReflectionPad2d((1, 2, 0, 1)),
                          tnn.Conv2d(8, 8, 3), tnn.ReplicationPad2d(1),
                          tnn.ConstantPad2d(1, 0.5), tnn.AdaptiveAvgPool2d(1), tnn.Flatten(),
                          tnn.Linear(8, 10))


def _ms_padded(reflect: Optional[msnn.Cell] = None,
               constant: Optional[msnn.Cell] = None) -> msnn.Cell:
    return msnn.SequentialCell([
        msnn.Conv2d(3, 8, 3, pad_mode="pad", padding=1, has_bias=True),
        reflect or msnn.ReflectionPad2d((1, 2, 0, 1)),
        msnn.Conv2d(8, 8, 3, pad_mode="valid", has_bias=True), msnn.ReplicationPad2d(1),
        constant or msnn.ConstantPad2d(1, 0.5), GlobalAvgPool(), msnn.Flatten(),
        msnn.Dense(8, 10)])


def ms_padded() -> msnn.Cell:
    return _ms_padded()


def ms_padded_replicating() -> msnn.Cell:
    return _ms_padded(reflect=msnn.ReplicationPad2d((1, 2, 0, 1)))


def ms_padded_with_zeros() -> msnn.Cell:
    return _ms_padded(constant=msnn.ZeroPad2d(1))


def ms_padded_top_first() -> msnn.Cell:
    return _ms_padded(reflect=msnn.ReflectionPad2d((0, 1, 1, 2)))


# A 3-D conv net over volumes (N×C×D×H×W), and its ports: correct, the strided conv left at
# pad_mode='same', the max pool's stride left to MindSpore's default 1, the BatchNorm3d's
# momentum written as torch's.
def torch_volume() -> tnn.Module:
    return tnn.Sequential(tnn.Conv3d(2, 4, 3, padding=1), tnn.BatchNorm3d(4), tnn.ReLU(),
                          tnn.MaxPool3d(2), tnn.Conv3d(4, 4, 3, stride=2, padding=1),
                          tnn.AdaptiveAvgPool3d(1), tnn.Flatten(), tnn.Linear(4, 5))


def _ms_volume(pool: Optional[msnn.Cell] = None, conv: Optional[msnn.Cell] = None,
               momentum: float = 0.9) -> msnn.Cell:
    return msnn.SequentialCell([
        msnn.Conv3d(2, 4, 3, pad_mode="pad", padding=1, has_bias=True),
        msnn.BatchNorm3d(4, momentum=momentum), msnn.ReLU(), pool or msnn.MaxPool3d(2, 2),
        conv or msnn.Conv3d(4, 4, 3, stride=2, pad_mode="pad", padding=1, has_bias=True),
        msnn.AdaptiveAvgPool3d(1), msnn.Flatten(), msnn.Dense(4, 5)])


def ms_volume() -> msnn.Cell:
    return _ms_volume()


def ms_volume_same_padded() -> msnn.Cell:
    return _ms_volume(conv=msnn.Conv3d(4, 4, 3, stride=2, has_bias=True))


def ms_volume_pool_stride_left_out() -> msnn.Cell:
    return _ms_volume(pool=msnn.MaxPool3d(2))


def ms_volume_momentum_unconverted() -> msnn.Cell:
    return _ms_volume(momentum=0.1)


# A conv net normalising each sample's whole feature map (LayerNorm over (C, H, W)), and its
# port; one variant leaves begin_norm_axis at -1, normalising each row of the map alone.
def torch_map_normed() -> tnn.Module:
    return tnn.Sequential(tnn.Conv2d(3, 8, 3, padding=1), tnn.LayerNorm([8, 16, 16]),
                          tnn.AdaptiveAvgPool2d(1), tnn.Flatten(), tnn.Linear(8, 10))


def _ms_map_normed(begin_norm_axis: int) -> msnn.Cell:
    return msnn.SequentialCell([
        msnn.Conv2d(3, 8, 3, pad_mode="pad", padding=1, has_bias=True),
        msnn.LayerNorm((8, 16, 16), begin_norm_axis=begin_norm_axis, begin_params_axis=1,
                       epsilon=1e-5),
        GlobalAvgPool(), msnn.Flatten(), msnn.Dense(8, 10)])


def ms_map_normed() -> msnn.Cell:
    return _ms_map_normed(begin_norm_axis=1)


def ms_map_normed_last_axis() -> msnn.Cell:
    return _ms_map_normed(begin_norm_axis=-1)


# A conv net whose dense layer takes the feature map flattened, and its port; one variant
# flattens it channels-last (N, H, W, C), as code written for NHWC images does. At 16² the map
# is 4×4: torch's variant computing that layer as a conv over the whole map (timm's VGG head)
# holds the dense layer's weight unflattened, (10, 4, 4, 4) for (10, 64).
class _TorchFlattened(tnn.Module):
    def __init__(self, conv_head: bool = False) -> None:
        super().__init__()
        self.conv = tnn.Conv2d(3, 4, 3, stride=4, padding=1)
        self.fc = tnn.Conv2d(4, 10, 4) if conv_head else tnn.Linear(4 * 4 * 4, 10)
        self.conv_head = conv_head

    def forward(self, x):
        y = self.conv(x)
        return self.fc(y).flatten(1) if self.conv_head else self.fc(y.flatten(1))


class _MsFlattened(msnn.Cell):
    def __init__(self, channels_last: bool) -> None:
        super().__init__()
        self.conv = msnn.Conv2d(3, 4, 3, stride=4, pad_mode="pad", padding=1, has_bias=True)
        self.fc = msnn.Dense(4 * 4 * 4, 10)
        self.channels_last = channels_last

    def construct(self, x):
        y = self.conv(x)
        if self.channels_last:
            y = y.transpose(0, 2, 3, 1)
        return self.fc(y.reshape(y.shape[0], -1))


# A conv net with a SiLU, and its port computing it as mindcv's Swish does: a cell multiplying
# by the output of a Sigmoid cell it holds. One variant's Swish takes sigmoid(2x).
def torch_silu() -> tnn.Module:
    return tnn.Sequential(tnn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False),
                          tnn.BatchNorm2d(8), tnn.SiLU(), tnn.AdaptiveAvgPool2d(1),
                          tnn.Flatten(), tnn.Linear(8, 10))


class Swish(msnn.Cell):
    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.sigmoid = msnn.Sigmoid()
        self.scale = scale

    def construct(self, x):
        return x * self.sigmoid(self.scale * x)


def _ms_silu(swish: msnn.Cell) -> msnn.Cell:
    return msnn.SequentialCell([msnn.Conv2d(3, 8, 3, stride=2, pad_mode="pad", padding=1),
                                msnn.BatchNorm2d(8, momentum=0.9), swish, GlobalAvgPool(),
                                msnn.Flatten(), msnn.Dense(8, 10)])


def ms_silu_as_swish() -> msnn.Cell:
    return _ms_silu(Swish())


def ms_silu_as_swish_of_2x() -> msnn.Cell:
    return _ms_silu(Swish(2.0))


# A conv net whose ``features`` end at a BatchNorm, its ReLU applied in the forward after them,
# as torchvision's DenseNet does; its port holds the ReLU as the last cell of its features, as
# mindcv's DenseNet does. One variant's last cell is a LeakyReLU.
class _TorchReluAfterFeatures(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = tnn.Sequential(tnn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False),
                                       tnn.BatchNorm2d(8))
        self.fc = tnn.Linear(8, 10)

    def forward(self, x):
        return self.fc(tnn.functional.relu(self.features(x)).mean((2, 3)))


class _MsReluInFeatures(msnn.Cell):
    def __init__(self, activation: msnn.Cell) -> None:
        super().__init__()
        self.features = msnn.SequentialCell([
            msnn.Conv2d(3, 8, 3, stride=2, pad_mode="pad", padding=1),
            msnn.BatchNorm2d(8, momentum=0.9), activation])
        self.fc = msnn.Dense(8, 10)

    def construct(self, x):
        return self.fc(self.features(x).mean((2, 3)))


def torch_relu_after_features() -> tnn.Module:
    return _TorchReluAfterFeatures()


def ms_relu_in_features() -> msnn.Cell:
    return _MsReluInFeatures(msnn.ReLU())


def ms_leaky_relu_in_features() -> msnn.Cell:
    return _MsReluInFeatures(msnn.LeakyReLU(0.2))


def torch_flattened() -> tnn.Module:
    return _TorchFlattened()


def torch_flattened_by_a_conv() -> tnn.Module:
    return _TorchFlattened(conv_head=True)


def ms_flattened() -> msnn.Cell:
    return _MsFlattened(channels_last=False)


def ms_flattened_channels_last() -> msnn.Cell:
    return _MsFlattened(channels_last=True)


# A conv net concatenating two branches for its next conv, in its own forward or in a module's,
# and its ports; one variant concatenates them the other way round.
class _TorchBranches(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.left = tnn.Conv2d(8, 4, 3, padding=1)
        self.right = tnn.Conv2d(8, 6, 1)

    def forward(self, x):
        return torch.cat([self.left(x), self.right(x)], 1)


class _TorchConcatenated(tnn.Module):
    def __init__(self, in_a_module: bool) -> None:
        super().__init__()
        self.stem = tnn.Conv2d(3, 8, 3, padding=1)
        self.branches = _TorchBranches() if in_a_module else tnn.ModuleDict(
            {"left": tnn.Conv2d(8, 4, 3, padding=1), "right": tnn.Conv2d(8, 6, 1)})
        self.fuse = tnn.Conv2d(10, 8, 3, stride=2, padding=1)
        self.fc = tnn.Linear(8, 10)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        y = self.branches(x) if isinstance(self.branches, _TorchBranches) else \
            torch.cat([self.branches["left"](x), self.branches["right"](x)], 1)
        return self.fc(torch.relu(self.fuse(y)).mean((2, 3)))


class _MsBranches(msnn.Cell):
    def __init__(self, swapped: bool) -> None:
        super().__init__()
        self.left = msnn.Conv2d(8, 4, 3, pad_mode="pad", padding=1, has_bias=True)
        self.right = msnn.Conv2d(8, 6, 1, has_bias=True)
        self.swapped = swapped

    def construct(self, x):
        a, b = self.left(x), self.right(x)
        return ops.cat((b, a) if self.swapped else (a, b), 1)


class _MsConcatenated(msnn.Cell):
    def __init__(self, in_a_module: bool, swapped: bool = False) -> None:
        super().__init__()
        self.stem = msnn.Conv2d(3, 8, 3, pad_mode="pad", padding=1, has_bias=True)
        self.branches = _MsBranches(swapped and in_a_module)
        self.fuse = msnn.Conv2d(10, 8, 3, stride=2, pad_mode="pad", padding=1, has_bias=True)
        self.fc = msnn.Dense(8, 10)
        self.swapped_here = swapped and not in_a_module
        self.in_a_module = in_a_module

    def construct(self, x):
        x = ops.relu(self.stem(x))
        if self.in_a_module:
            y = self.branches(x)
        else:
            a, b = self.branches.left(x), self.branches.right(x)
            y = ops.cat((b, a) if self.swapped_here else (a, b), 1)
        return self.fc(ops.relu(self.fuse(y)).mean((2, 3)))


def torch_concatenated() -> tnn.Module:
    return _TorchConcatenated(in_a_module=False)


def torch_branched() -> tnn.Module:
    return _TorchConcatenated(in_a_module=True)


def ms_concatenated() -> msnn.Cell:
    return _MsConcatenated(in_a_module=False)


def ms_concatenated_swapped() -> msnn.Cell:
    return _MsConcatenated(in_a_module=False, swapped=True)


def ms_branched() -> msnn.Cell:
    return _MsConcatenated(in_a_module=True)


def ms_branched_swapped() -> msnn.Cell:
    return _MsConcatenated(in_a_module=True, swapped=True)


# A residual block with stochastic depth on its branch (torchvision's StochasticDepth; the port
# with a DropPath written as mindcv's), and a net whose port scales by the output of a cell that
# builds it from constants (no gradient flows to it).
class SegformerDropPath(tnn.Module):
    """Hugging Face's copy of timm's DropPath under a model's name (SegFormer's, BEiT's)."""

    def __init__(self, drop_prob: float) -> None:
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x):
        if self.drop_prob == 0.0 or not self.training:
            return x
        keep = 1 - self.drop_prob
        kept = torch.floor(keep + torch.rand((x.shape[0],) + (1,) * (x.ndim - 1), dtype=x.dtype))
        return x / keep * kept


class _TorchDropPath(tnn.Module):
    def __init__(self, hugging_face: bool = False) -> None:
        from torchvision.ops import StochasticDepth
        super().__init__()
        self.stem = tnn.Conv2d(3, 8, 3, padding=1)
        self.conv = tnn.Conv2d(8, 8, 3, padding=1)
        self.drop_path = SegformerDropPath(0.2) if hugging_face else StochasticDepth(0.2, "row")
        self.fc = tnn.Linear(8, 10)

    def forward(self, x):
        y = self.stem(x)
        return self.fc((y + self.drop_path(self.conv(y))).mean((2, 3)) * 2.0)


class DropPath(msnn.Cell):
    """Drops a sample's whole branch in training, as mindcv's DropPath."""

    def __init__(self, drop_prob: float) -> None:
        super().__init__()
        self.keep_prob = 1.0 - drop_prob
        self.dropout = msnn.Dropout(p=drop_prob)

    def construct(self, x):
        if self.keep_prob == 1.0 or not self.training:
            return x
        return x * self.dropout(ops.ones((x.shape[0],) + (1,) * (x.ndim - 1), x.dtype))


class _Twos(msnn.Cell):
    def construct(self, x):
        return ops.ones((x.shape[0], 8), x.dtype) * 2.0


class _MsDropPath(msnn.Cell):
    def __init__(self, drop_prob: float) -> None:
        super().__init__()
        self.stem = msnn.Conv2d(3, 8, 3, pad_mode="pad", padding=1, has_bias=True)
        self.conv = msnn.Conv2d(8, 8, 3, pad_mode="pad", padding=1, has_bias=True)
        # as mindcv and timm write it
        self.drop_path = DropPath(drop_prob) if drop_prob > 0 else msnn.Identity()
        self.scale = _Twos()
        self.fc = msnn.Dense(8, 10)

    def construct(self, x):
        y = self.stem(x)
        return self.fc((y + self.drop_path(self.conv(y))).mean((2, 3)) * self.scale(x))


def torch_drop_path(hugging_face: bool = False) -> tnn.Module:
    return _TorchDropPath(hugging_face)


def ms_drop_path() -> msnn.Cell:
    return _MsDropPath(0.2)


def ms_drop_path_other_rate() -> msnn.Cell:
    return _MsDropPath(0.1)


def ms_drop_path_identity() -> msnn.Cell:
    """A rate of 0: an Identity cell."""
    return _MsDropPath(0.0)


# An MLP of Hugging Face's Conv1D layers (GPT-2's): each holds its weight as (in, out) and
# computes x @ W + b; ported with nn.Dense, which holds (out, in), or with a cell as torch's.
class Conv1D(tnn.Module):
    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.nf = nf
        self.weight = tnn.Parameter(torch.randn(nx, nf) * 0.3)
        self.bias = tnn.Parameter(torch.randn(nf) * 0.1)

    def forward(self, x):
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)


class _MsConv1D(msnn.Cell):
    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.weight = mindspore.Parameter(mindspore.Tensor(np.zeros((nx, nf), np.float32)))
        self.bias = mindspore.Parameter(mindspore.Tensor(np.zeros(nf, np.float32)))

    def construct(self, x):
        return ops.matmul(x, self.weight) + self.bias


def torch_conv1d_mlp() -> tnn.Module:
    return tnn.Sequential(Conv1D(FEATURES, FEATURES), tnn.ReLU(), Conv1D(5, FEATURES))


def ms_dense_for_conv1d_mlp() -> msnn.Cell:
    return _ms_mlp(msnn.ReLU())


def ms_conv1d_mlp() -> msnn.Cell:
    return msnn.SequentialCell([_MsConv1D(FEATURES, FEATURES), msnn.ReLU(),
                                _MsConv1D(5, FEATURES)])


# An RMS norm of the user's own, its eps written into its forward, after a tanh torch runs
# as a module just before it (feeding only the sum after it: a Llama's rotary embedding); the
# port computes the tanh in its construct, and its norm's eps differs.
class _TorchRmsNorm(tnn.Module):
    """Hugging Face's LlamaRMSNorm keeps its eps as ``variance_epsilon`` (``kept``)."""

    def __init__(self, kept: bool) -> None:
        super().__init__()
        self.weight = tnn.Parameter(torch.ones(FEATURES))
        if kept:
            self.variance_epsilon = 1e-6

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class _TorchSideBeforeNorm(tnn.Module):
    def __init__(self, eps_kept: bool = False) -> None:
        super().__init__()
        self.fc1, self.side = tnn.Linear(FEATURES, FEATURES), tnn.Tanh()
        self.norm, self.fc2 = _TorchRmsNorm(eps_kept), tnn.Linear(FEATURES, 5)

    def forward(self, x):
        h = self.fc1(x)
        side = self.side(h)
        return self.fc2(self.norm(h) + side)


class _MsRmsNorm(msnn.Cell):
    def __init__(self, eps: float, centred: bool = False) -> None:
        super().__init__()
        self.weight = mindspore.Parameter(mindspore.Tensor(np.ones(FEATURES, np.float32)))
        self.variance_epsilon = eps
        self.centred = centred

    def construct(self, x):
        if self.centred:        # a LayerNorm's centring, written into an RMS norm's port
            x = x - x.mean(-1, keep_dims=True)
        return self.weight * x * ops.rsqrt(x.pow(2).mean(-1, keep_dims=True) +
                                           self.variance_epsilon)


class _MsSideBeforeNorm(msnn.Cell):
    def __init__(self, norm: Optional[msnn.Cell] = None) -> None:
        super().__init__()
        self.fc1, self.fc2 = msnn.Dense(FEATURES, FEATURES), msnn.Dense(FEATURES, 5)
        self.norm = norm or _MsRmsNorm(0.05)

    def construct(self, x):
        h = self.fc1(x)
        return self.fc2(self.norm(h) + ops.tanh(h))


def torch_side_before_norm() -> tnn.Module:
    return _TorchSideBeforeNorm()


def torch_side_before_hf_norm() -> tnn.Module:
    return _TorchSideBeforeNorm(eps_kept=True)


def ms_side_before_norm_eps() -> msnn.Cell:
    return _MsSideBeforeNorm()


def ms_side_before_centred_norm() -> msnn.Cell:
    """The RMS norm ported subtracting each row's mean, as a LayerNorm does."""
    return _MsSideBeforeNorm(_MsRmsNorm(1e-6, centred=True))


# A net with a square projection, and ports of it as a dense cell of their own: one computes
# x @ W.T + b as nn.Dense does, the other x @ W + b (the weight used transposed).
class _TorchProjected(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = tnn.Conv2d(3, 8, 3, stride=4, padding=1)
        self.proj = tnn.Linear(8, 8)
        self.fc = tnn.Linear(8, 10)

    def forward(self, x):
        return self.fc(self.proj(self.conv(x).mean((2, 3))).relu())


class _OwnDense(msnn.Cell):
    def __init__(self, transposed: bool) -> None:
        super().__init__()
        self.weight = mindspore.Parameter(mindspore.Tensor(np.zeros((8, 8), np.float32)))
        self.bias = mindspore.Parameter(mindspore.Tensor(np.zeros(8, np.float32)))
        self.transposed = transposed

    def construct(self, x):
        return ops.matmul(x, self.weight if self.transposed else self.weight.T) + self.bias


class _MsProjected(msnn.Cell):
    def __init__(self, transposed: bool) -> None:
        super().__init__()
        self.conv = msnn.Conv2d(3, 8, 3, stride=4, pad_mode="pad", padding=1, has_bias=True)
        self.proj = _OwnDense(transposed)
        self.fc = msnn.Dense(8, 10)

    def construct(self, x):
        return self.fc(ops.relu(self.proj(self.conv(x).mean((2, 3)))))


def torch_projected() -> tnn.Module:
    return _TorchProjected()


def ms_projected() -> msnn.Cell:
    return _MsProjected(transposed=False)


def ms_projected_transposed() -> msnn.Cell:
    return _MsProjected(transposed=True)


# A conv net with torchvision's FrozenBatchNorm2d (detection backbones use it: running
# statistics always, weight and bias as buffers), and its port: a BatchNorm2d using its running
# statistics with gamma and beta frozen; one variant leaves use_batch_statistics None.
def torch_frozen_norm() -> tnn.Module:
    import torch
    from torchvision.ops.misc import FrozenBatchNorm2d
    net = tnn.Sequential(tnn.Conv2d(3, 8, 3, padding=1), FrozenBatchNorm2d(8), tnn.ReLU(),
                         tnn.AdaptiveAvgPool2d(1), tnn.Flatten(), tnn.Linear(8, 10))
    generator = torch.Generator().manual_seed(0)
    for name, low, high in (("running_mean", -0.5, 0.5), ("running_var", 0.5, 2.0),
                            ("weight", 0.5, 1.5), ("bias", -0.5, 0.5)):
        getattr(net[1], name).copy_(torch.empty(8).uniform_(low, high, generator=generator))
    return net


def _ms_frozen_norm(batch_statistics: Optional[bool]) -> msnn.Cell:
    norm = msnn.BatchNorm2d(8, use_batch_statistics=batch_statistics)
    norm.gamma.requires_grad = norm.beta.requires_grad = False
    return msnn.SequentialCell([
        msnn.Conv2d(3, 8, 3, pad_mode="pad", padding=1, has_bias=True), norm, msnn.ReLU(),
        GlobalAvgPool(), msnn.Flatten(), msnn.Dense(8, 10)])


def ms_frozen_norm() -> msnn.Cell:
    return _ms_frozen_norm(batch_statistics=False)


def ms_frozen_norm_batch_statistics() -> msnn.Cell:
    return _ms_frozen_norm(batch_statistics=None)


# Attention over a feature map's positions with a learned relative-position bias, indexed as
# Swin does by an integer buffer (torch) the port holds as a plain tensor.
RELATIVE_INDEX = np.add.outer(np.arange(4), np.arange(4))       # 4×4, into a table of 7


class _TorchRelativeBias(tnn.Module):
    def __init__(self) -> None:
        import torch
        super().__init__()
        self.conv = tnn.Conv2d(3, 4, 3, stride=4, padding=1)
        self.table = tnn.Parameter(torch.linspace(-0.3, 0.3, 7))
        self.register_buffer("index", torch.from_numpy(RELATIVE_INDEX))
        self.fc = tnn.Linear(16, 10)

    def forward(self, x):
        y = self.conv(x).flatten(2)                                  # N, 4, 16
        bias = self.table[self.index].repeat(4, 4)                  # 16, 16
        return self.fc((y.transpose(1, 2) @ y / 4 + bias).softmax(-1).mean(1))


class _MsRelativeBias(msnn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.conv = msnn.Conv2d(3, 4, 3, stride=4, pad_mode="pad", padding=1, has_bias=True)
        self.table = mindspore.Parameter(mindspore.Tensor(np.zeros(7, np.float32)))
        self.index = mindspore.Tensor(RELATIVE_INDEX)
        self.fc = msnn.Dense(16, 10)

    def construct(self, x):
        y = self.conv(x)
        y = y.reshape(y.shape[0], 4, 16)
        bias = ops.tile(self.table[self.index], (4, 4))
        return self.fc(ops.softmax(ops.matmul(y.transpose(0, 2, 1), y) / 4 + bias, -1).mean(1))


def torch_relative_bias() -> tnn.Module:
    return _TorchRelativeBias()


def ms_relative_bias() -> msnn.Cell:
    return _MsRelativeBias()


# A 1-D conv net (audio, time series). MindSpore computes its 1-D convs and pools as 2-D ones
# over a height of 1: nn.Conv1d's weight is (out, in, 1, k), torch's (out, in, k).
def torch_conv1d() -> tnn.Module:
    return tnn.Sequential(tnn.Conv1d(3, 8, 3, stride=2, padding=1), tnn.BatchNorm1d(8),
                          tnn.ReLU(), tnn.MaxPool1d(3, stride=2, padding=1),
                          tnn.Conv1d(8, 8, 3, padding=1), tnn.AdaptiveAvgPool1d(1), tnn.Flatten(),
                          tnn.Linear(8, 5))


def _ms_conv1d(conv: Optional[msnn.Cell] = None, pool: Optional[msnn.Cell] = None) -> msnn.Cell:
    return msnn.SequentialCell([
        conv or msnn.Conv1d(3, 8, 3, stride=2, pad_mode="pad", padding=1, has_bias=True),
        msnn.BatchNorm1d(8, momentum=0.9), msnn.ReLU(),
        pool or msnn.MaxPool1d(3, stride=2, pad_mode="pad", padding=1),
        msnn.Conv1d(8, 8, 3, has_bias=True),            # pad_mode 'same' at stride 1: torch's 1
        msnn.AdaptiveAvgPool1d(1), msnn.Flatten(), msnn.Dense(8, 5)])


def ms_conv1d() -> msnn.Cell:
    return _ms_conv1d()


def ms_conv1d_same_stride() -> msnn.Cell:
    """The strided conv left at pad_mode='same': it pads the end only."""
    return _ms_conv1d(conv=msnn.Conv1d(3, 8, 3, stride=2, has_bias=True))


def ms_conv1d_unpadded_pool() -> msnn.Cell:
    """The max pool left at pad_mode='valid': it pads nothing."""
    return _ms_conv1d(pool=msnn.MaxPool1d(3, stride=2))


def _half_gradient(x):
    """x's value with half its gradient (a wrong custom backward): 0.5·x + 0.5·stop_gradient(x)."""
    return x * 0.5 + ops.stop_gradient(x) * 0.5


class _HalfBiasGradientDense(msnn.Dense):
    """A dense layer whose forward is right and whose bias gets half its gradient."""

    def construct(self, x):
        return ops.matmul(x, self.weight.T) + _half_gradient(self.bias)


def ms_defaults_half_dense_bias_gradient() -> msnn.Cell:
    return _ms_defaults(dense=_HalfBiasGradientDense(8, 10))


# A conv padding with reflected values (image generators do): MindSpore's convolutions pad
# with zeros, so the port pads first.
def torch_reflect_padded() -> tnn.Module:
    return tnn.Sequential(tnn.Conv2d(3, 8, 3, padding=1, padding_mode="reflect"),
                          tnn.BatchNorm2d(8), tnn.ReLU(), tnn.AdaptiveAvgPool2d(1), tnn.Flatten(),
                          tnn.Linear(8, 10))


class _ReflectPaddedConv(msnn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.conv = msnn.Conv2d(3, 8, 3, pad_mode="valid", has_bias=True)

    def construct(self, x):
        return self.conv(mindspore.ops.pad(x, (1, 1, 1, 1), mode="reflect"))


def _ms_reflect_padded(conv: msnn.Cell) -> msnn.Cell:
    return msnn.SequentialCell([conv, msnn.BatchNorm2d(8, momentum=0.9), msnn.ReLU(),
                                GlobalAvgPool(), msnn.Flatten(), msnn.Dense(8, 10)])


def ms_reflect_padded() -> msnn.Cell:
    return _ms_reflect_padded(_ReflectPaddedConv())


def ms_reflect_padded_with_zeros() -> msnn.Cell:
    return _ms_reflect_padded(msnn.Conv2d(3, 8, 3, pad_mode="pad", padding=1, has_bias=True))


# A token-id model: integer inputs (embedding lookup) instead of an image batch.
VOCABULARY, WIDTH, TOKENS = 50, 8, 6


def torch_tokens() -> tnn.Module:
    return tnn.Sequential(tnn.Embedding(VOCABULARY, WIDTH), tnn.Flatten(),
                          tnn.Linear(WIDTH * TOKENS, 5))


class _ScaledEmbedding(msnn.Cell):
    """The embedding scaled by √width, as a Transformer's input is: applied on one side only."""

    def __init__(self) -> None:
        super().__init__()
        self.table = msnn.Embedding(VOCABULARY, WIDTH)

    def construct(self, tokens):
        return self.table(tokens) * WIDTH ** 0.5


def ms_tokens(embedding: Optional[msnn.Cell] = None) -> msnn.Cell:
    return msnn.SequentialCell([embedding or msnn.Embedding(VOCABULARY, WIDTH), msnn.Flatten(),
                                msnn.Dense(WIDTH * TOKENS, 5)])


def ms_tokens_scaled() -> msnn.Cell:
    return ms_tokens(_ScaledEmbedding())


# Tokens attending to those before them, the causal mask built in the forward as Hugging
# Face's CLIP and GPT-style models build it: torch.full((L, L), torch.finfo(dtype).min) in the
# hidden states' dtype (float64's least value overflows a float32 tensor). One port variant
# leaves the mask out.
class _TorchCausalTokens(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = tnn.Embedding(VOCABULARY, WIDTH)
        self.out_proj = tnn.Linear(WIDTH, WIDTH)
        self.head = tnn.Linear(WIDTH * TOKENS, 5)

    def forward(self, tokens):
        embedded = self.embedding(tokens)
        length = tokens.shape[1]
        mask = torch.full((length, length), torch.finfo(embedded.dtype).min).triu(1)
        scores = embedded @ embedded.transpose(1, 2) / WIDTH ** 0.5 + mask
        return self.head(self.out_proj(scores.softmax(-1) @ embedded).flatten(1))


class _MsCausalTokens(msnn.Cell):
    def __init__(self, causal: bool) -> None:
        super().__init__()
        self.causal = causal
        self.embedding = msnn.Embedding(VOCABULARY, WIDTH)
        self.out_proj = msnn.Dense(WIDTH, WIDTH)
        self.head = msnn.Dense(WIDTH * TOKENS, 5)

    def construct(self, tokens):
        embedded = self.embedding(tokens)
        length = tokens.shape[1]
        scores = ops.matmul(embedded, embedded.transpose(0, 2, 1)) / WIDTH ** 0.5
        if self.causal:
            scores = scores + ops.triu(ops.full((length, length),
                                                float(np.finfo(np.float32).min)), 1)
        mixed = self.out_proj(ops.matmul(ops.softmax(scores, axis=-1), embedded))
        return self.head(mixed.reshape(tokens.shape[0], -1))


def torch_causal_tokens() -> tnn.Module:
    return _TorchCausalTokens()


def ms_causal_tokens() -> msnn.Cell:
    return _MsCausalTokens(causal=True)


def ms_causal_tokens_unmasked() -> msnn.Cell:
    return _MsCausalTokens(causal=False)


# An encoder returning a dict, as Hugging Face's models return their outputs (CLIP's text model:
# last_hidden_state and pooler_output), its port returning the pooled tensor alone.
class _TorchDictEncoder(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = tnn.Embedding(VOCABULARY, WIDTH)
        self.norm = tnn.LayerNorm(WIDTH)

    def forward(self, tokens):
        hidden = self.norm(self.embedding(tokens))
        return {"last_hidden_state": hidden, "pooler_output": hidden[:, 0]}


class _TorchDictPooled(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = _TorchDictEncoder()
        self.head = tnn.Linear(WIDTH, 5)

    def forward(self, tokens):
        return self.head(self.encoder(tokens)["pooler_output"])


class _MsPooledEncoder(msnn.Cell):
    def __init__(self, position: int) -> None:
        super().__init__()
        self.embedding = msnn.Embedding(VOCABULARY, WIDTH)
        self.norm = msnn.LayerNorm((WIDTH,), epsilon=1e-5)
        self.position = position

    def construct(self, tokens):
        return self.norm(self.embedding(tokens))[:, self.position]


class _MsDictPooled(msnn.Cell):
    def __init__(self, position: int) -> None:
        super().__init__()
        self.encoder = _MsPooledEncoder(position)
        self.head = msnn.Dense(WIDTH, 5)

    def construct(self, tokens):
        return self.head(self.encoder(tokens))


def torch_dict_pooled() -> tnn.Module:
    return _TorchDictPooled()


def ms_dict_pooled() -> msnn.Cell:
    return _MsDictPooled(0)


def ms_dict_pooled_last_token() -> msnn.Cell:
    """Pooled at each sequence's last token, torch's at its first."""
    return _MsDictPooled(-1)


# An encoder returning a dict whose last module is a dropout after its norm (Hugging Face's T5
# encoder), the port's returning that norm's output, one variant's applying a ReLU torch lacks
# inside it: the port's encoder is paired with torch's dropout, a module recording nothing inside.
class _TorchDictDroppingEncoder(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = tnn.Embedding(VOCABULARY, WIDTH)
        self.norm = tnn.LayerNorm(WIDTH)
        self.dropout = tnn.Dropout(0.0)

    def forward(self, tokens):
        return {"last_hidden_state": self.dropout(self.norm(self.embedding(tokens)))}


class _TorchDictEncodedFirst(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = _TorchDictDroppingEncoder()
        self.head = tnn.Linear(WIDTH, 5)

    def forward(self, tokens):
        return self.head(self.encoder(tokens)["last_hidden_state"][:, 0])


class _MsNormedEncoder(msnn.Cell):
    def __init__(self, extra: bool) -> None:
        super().__init__()
        self.embedding = msnn.Embedding(VOCABULARY, WIDTH)
        self.extra = msnn.ReLU() if extra else None
        self.norm = msnn.LayerNorm((WIDTH,), epsilon=1e-5)

    def construct(self, tokens):
        embedded = self.embedding(tokens)
        return self.norm(embedded if self.extra is None else self.extra(embedded))


class _MsEncodedFirst(msnn.Cell):
    def __init__(self, extra: bool) -> None:
        super().__init__()
        self.encoder = _MsNormedEncoder(extra)
        self.head = msnn.Dense(WIDTH, 5)

    def construct(self, tokens):
        return self.head(self.encoder(tokens)[:, 0])


def torch_dict_encoded_first() -> tnn.Module:
    return _TorchDictEncodedFirst()


def ms_encoded_first() -> msnn.Cell:
    return _MsEncodedFirst(extra=False)


def ms_encoded_first_extra_relu() -> msnn.Cell:
    return _MsEncodedFirst(extra=True)


# A token tagger, or a language model's head: N×L×5 scores, the classes last, for N×L labels.
def torch_token_tagger() -> tnn.Module:
    return tnn.Sequential(tnn.Embedding(VOCABULARY, WIDTH), tnn.Linear(WIDTH, 5))


def ms_token_tagger() -> msnn.Cell:
    return msnn.SequentialCell([msnn.Embedding(VOCABULARY, WIDTH), msnn.Dense(WIDTH, 5)])


# Token, token-type and position embeddings summed (BERT's), the types all 0: Hugging Face's
# BERT looks the types up before the positions, a port may look them up after.
class _TorchTypedTokens(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.word = tnn.Embedding(VOCABULARY, WIDTH)
        self.token_type = tnn.Embedding(2, WIDTH)
        self.position = tnn.Embedding(TOKENS, WIDTH)
        self.head = tnn.Linear(WIDTH * TOKENS, 5)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1]).expand_as(tokens)
        embedded = self.word(tokens) + self.token_type(torch.zeros_like(tokens)) + \
            self.position(positions)
        return self.head(embedded.flatten(1))


class _MsTypedTokens(msnn.Cell):
    def __init__(self, positions_reversed: bool = False) -> None:
        super().__init__()
        self.positions_reversed = positions_reversed
        self.word = msnn.Embedding(VOCABULARY, WIDTH)
        self.token_type = msnn.Embedding(2, WIDTH)
        self.position = msnn.Embedding(TOKENS, WIDTH)
        self.head = msnn.Dense(WIDTH * TOKENS, 5)

    def construct(self, tokens):
        positions = ops.arange(tokens.shape[1]).broadcast_to(tokens.shape)
        if self.positions_reversed:     # looked up in torch's order
            embedded = self.word(tokens) + self.token_type(ops.zeros_like(tokens)) + \
                self.position(tokens.shape[1] - 1 - positions)
        else:
            embedded = self.word(tokens) + self.position(positions) + \
                self.token_type(ops.zeros_like(tokens))
        return self.head(embedded.reshape(tokens.shape[0], -1))


def torch_typed_tokens() -> tnn.Module:
    return _TorchTypedTokens()


def ms_typed_tokens_positions_first() -> msnn.Cell:
    return _MsTypedTokens()


def ms_typed_tokens_positions_reversed() -> msnn.Cell:
    """Positions counted from each sequence's end: other ids for torch's position table."""
    return _MsTypedTokens(positions_reversed=True)


# Each framework's own Transformer encoder layer over token ids: torch's attention returns
# (output, None) without its weights, MindSpore's (output,).
class _TorchEncoderLayer(tnn.Module):
    def __init__(self, norm_first: bool = False) -> None:
        super().__init__()
        self.embed = tnn.Embedding(VOCABULARY, WIDTH)
        self.encoder = tnn.TransformerEncoderLayer(WIDTH, 2, 2 * WIDTH, dropout=0.0,
                                                   batch_first=True, norm_first=norm_first)
        self.head = tnn.Linear(WIDTH, 5)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


class _MsEncoderLayer(msnn.Cell):
    def __init__(self, dropout: float = 0.0, norm_first: bool = False,
                 embedding_scale: float = 1.0, heads: int = 2, batch_first: bool = True) -> None:
        super().__init__()
        self.embed = msnn.Embedding(VOCABULARY, WIDTH)
        self.encoder = msnn.TransformerEncoderLayer(WIDTH, heads, 2 * WIDTH, dropout=dropout,
                                                    batch_first=batch_first,
                                                    norm_first=norm_first)
        self.head = msnn.Dense(WIDTH, 5)
        self.embedding_scale = embedding_scale

    def construct(self, tokens):
        return self.head(self.encoder(self.embed(tokens) * self.embedding_scale).mean(axis=1))


def torch_encoder_layer() -> tnn.Module:
    return _TorchEncoderLayer()


def torch_encoder_layer_norm_first() -> tnn.Module:
    """Pre-norm: each block's LayerNorm before its attention or feed-forward, not after."""
    return _TorchEncoderLayer(norm_first=True)


def ms_encoder_layer() -> msnn.Cell:
    return _MsEncoderLayer()


def ms_encoder_layer_dropout() -> msnn.Cell:
    """Ported with dropout=0.2 for torch's 0.0: its attention drops weights in the step, outside
    any dropout module."""
    return _MsEncoderLayer(dropout=0.2)


def ms_encoder_layer_norm_first() -> msnn.Cell:
    """Ported pre-norm (norm_first=True) for torch's post-norm layer."""
    return _MsEncoderLayer(norm_first=True)


def ms_encoder_layer_norm_first_scaled() -> msnn.Cell:
    """Pre-norm on both sides, but the embeddings doubled in the model's construct."""
    return _MsEncoderLayer(norm_first=True, embedding_scale=2.0)


def ms_encoder_layer_four_heads() -> msnn.Cell:
    """nhead=4 for torch's 2: the same weights, split into other heads."""
    return _MsEncoderLayer(heads=4)


def ms_encoder_layer_sequence_first() -> msnn.Cell:
    """batch_first left at its default (False): attention across the batch."""
    return _MsEncoderLayer(batch_first=False)


# A dense layer over every token of a long sequence: its bias gradient sums batch × tokens rows.
class _TorchTokenMixer(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = tnn.Embedding(4, 2 * WIDTH)
        self.mix = tnn.Linear(2 * WIDTH, 2 * WIDTH)
        self.head = tnn.Linear(2 * WIDTH, 5)

    def forward(self, tokens):
        return self.head(self.mix(self.embed(tokens)).tanh().mean(1))


class _MsTokenMixer(msnn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.embed = msnn.Embedding(4, 2 * WIDTH)
        self.mix = msnn.Dense(2 * WIDTH, 2 * WIDTH)
        self.head = msnn.Dense(2 * WIDTH, 5)

    def construct(self, tokens):
        return self.head(self.mix(self.embed(tokens)).tanh().mean(1))


def torch_token_mixer() -> tnn.Module:
    return _TorchTokenMixer()


def ms_token_mixer() -> msnn.Cell:
    return _MsTokenMixer()


# An LSTM over token ids, its last step classified (a GRU of two bidirectional layers, and an
# LSTM of two layers dropping between them, too).
class _TorchLstm(tnn.Module):
    def __init__(self, kind: str = "LSTM", layers: int = 1, bidirectional: bool = False,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.embed = tnn.Embedding(VOCABULARY, WIDTH)
        self.rnn = getattr(tnn, kind)(WIDTH, 2 * WIDTH, num_layers=layers, batch_first=True,
                                      bidirectional=bidirectional, dropout=dropout)
        self.head = tnn.Linear((4 if bidirectional else 2) * WIDTH, 5)

    def forward(self, tokens):
        return self.head(self.rnn(self.embed(tokens))[0][:, -1])


class _MsLstm(msnn.Cell):
    def __init__(self, batch_first: bool = True, kind: str = "LSTM", layers: int = 1,
                 bidirectional: bool = False, dropout: float = 0.0) -> None:
        super().__init__()
        self.embed = msnn.Embedding(VOCABULARY, WIDTH)
        self.rnn = getattr(msnn, kind)(WIDTH, 2 * WIDTH, num_layers=layers,
                                       batch_first=batch_first, bidirectional=bidirectional,
                                       dropout=dropout)
        self.head = msnn.Dense((4 if bidirectional else 2) * WIDTH, 5)

    def construct(self, tokens):
        return self.head(self.rnn(self.embed(tokens))[0][:, -1])


def torch_lstm() -> tnn.Module:
    return _TorchLstm()


def ms_lstm() -> msnn.Cell:
    return _MsLstm()


def torch_gru() -> tnn.Module:
    return _TorchLstm("GRU", layers=2, bidirectional=True)


def ms_gru() -> msnn.Cell:
    return _MsLstm(kind="GRU", layers=2, bidirectional=True)


def torch_lstm_stacked() -> tnn.Module:
    """Two layers, dropping 0.2 of the first's output in training (the word-language-model
    example's LSTM)."""
    return _TorchLstm(layers=2, dropout=0.2)


def ms_lstm_stacked() -> msnn.Cell:
    return _MsLstm(layers=2, dropout=0.2)


def ms_lstm_stacked_dropout_differs() -> msnn.Cell:
    return _MsLstm(layers=2, dropout=0.5)


def ms_lstm_sequence_first() -> msnn.Cell:
    """batch_first left at its default (False): the recurrence runs across the batch."""
    return _MsLstm(batch_first=False)


# The encoder layer given a padding mask (1 where a token is padding), as torch's
# src_key_padding_mask (True masks out) and MindSpore's, whose convention is the same.
class _TorchPaddedEncoderLayer(_TorchEncoderLayer):
    def forward(self, tokens, padding):
        return self.head(self.encoder(self.embed(tokens),
                                      src_key_padding_mask=padding > 0.5).mean(dim=1))


class _MsPaddedEncoderLayer(_MsEncoderLayer):
    def __init__(self, inverted: bool = False) -> None:
        super().__init__()
        self.inverted = inverted

    def construct(self, tokens, padding):
        masked_out = padding < 0.5 if self.inverted else padding > 0.5
        return self.head(self.encoder(self.embed(tokens),
                                      src_key_padding_mask=masked_out).mean(axis=1))


def torch_padded_encoder_layer() -> tnn.Module:
    return _TorchPaddedEncoderLayer()


def ms_padded_encoder_layer() -> msnn.Cell:
    return _MsPaddedEncoderLayer()


def ms_padded_encoder_layer_inverted() -> msnn.Cell:
    """The mask inverted (True where a token is kept): the attention sees only padding."""
    return _MsPaddedEncoderLayer(inverted=True)


# Token ids padded with id 0, torch's padding_idx: that row of the table gets no gradient.
def torch_padded_tokens() -> tnn.Module:
    return tnn.Sequential(tnn.Embedding(VOCABULARY, WIDTH, padding_idx=0), tnn.Flatten(),
                          tnn.Linear(WIDTH * TOKENS, 5))


class _PaddingRowEmbedding(msnn.Embedding):
    """MindSpore's nn.Embedding gives the padding row a gradient (padding_idx or not): looking
    the ids up in the table times a mask that zeroes that row stops it, as torch does, and
    leaves the output and its gradient as they are."""

    def __init__(self) -> None:
        import numpy as np
        super().__init__(VOCABULARY, WIDTH, padding_idx=0)
        keep = np.ones((VOCABULARY, 1), np.float32)
        keep[0] = 0
        self.keep = mindspore.Tensor(keep)

    def construct(self, tokens):
        return mindspore.ops.gather(self.embedding_table * self.keep, tokens, 0)


def ms_padded_tokens() -> msnn.Cell:
    return ms_tokens(_PaddingRowEmbedding())


def ms_padded_tokens_unmasked() -> msnn.Cell:
    """padding_idx=0 given, as torch's: the padding row still gets a gradient."""
    return ms_tokens(msnn.Embedding(VOCABULARY, WIDTH, padding_idx=0))


# Gemma's embedding scales its table's rows by √width (Gemma3TextScaledWordEmbedding, an
# nn.Embedding subclass: a module of no known op).
class _TorchScaledEmbedding(tnn.Embedding):
    def forward(self, tokens):
        return super().forward(tokens) * math.sqrt(WIDTH)


def torch_scaled_padded_tokens() -> tnn.Module:
    return tnn.Sequential(_TorchScaledEmbedding(VOCABULARY, WIDTH, padding_idx=0), tnn.Flatten(),
                          tnn.Linear(WIDTH * TOKENS, 5))


class _MsScaledEmbedding(msnn.Embedding):
    def construct(self, tokens):
        return super().construct(tokens) * math.sqrt(WIDTH)


class _MsScaledPaddingRowEmbedding(_PaddingRowEmbedding):
    def construct(self, tokens):
        return super().construct(tokens) * math.sqrt(WIDTH)


def ms_scaled_padded_tokens(masked: bool = True) -> msnn.Cell:
    return ms_tokens(_MsScaledPaddingRowEmbedding() if masked else
                     _MsScaledEmbedding(VOCABULARY, WIDTH, padding_idx=0))


# Tied weights, as a language model's: the output layer's weight is the embedding table, one
# parameter that torch's state dict lists under both names.
class _TorchTied(tnn.Module):
    def __init__(self, tied: bool = True, padding_idx: Optional[int] = None) -> None:
        super().__init__()
        self.embed = tnn.Embedding(VOCABULARY, WIDTH, padding_idx=padding_idx)
        self.mix = tnn.Linear(WIDTH, WIDTH)
        self.head = tnn.Linear(WIDTH, VOCABULARY, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def forward(self, tokens):
        return self.head(self.mix(self.embed(tokens)).mean(1))


class _MsTied(msnn.Cell):
    def __init__(self, tied: bool = True, embed: Optional[msnn.Embedding] = None) -> None:
        super().__init__()
        self.embed = embed or msnn.Embedding(VOCABULARY, WIDTH)
        self.mix = msnn.Dense(WIDTH, WIDTH)
        self.head = msnn.Dense(WIDTH, VOCABULARY, has_bias=False)
        if tied:
            self.head.weight = self.embed.embedding_table

    def construct(self, tokens):
        return self.head(self.mix(self.embed(tokens)).mean(1))


def torch_tied() -> tnn.Module:
    return _TorchTied()


def torch_untied() -> tnn.Module:
    return _TorchTied(tied=False)


def ms_tied() -> msnn.Cell:
    return _MsTied()


def ms_untied() -> msnn.Cell:
    """The port forgot the tie: its output layer has a weight of its own."""
    return _MsTied(tied=False)


def torch_tied_padded() -> tnn.Module:
    """Its table's row 0 the padding row (Gemma's): a gradient from the output layer alone."""
    return _TorchTied(padding_idx=0)


def ms_tied_padded(masked: bool = True) -> msnn.Cell:
    return _MsTied(embed=_PaddingRowEmbedding() if masked else
                   msnn.Embedding(VOCABULARY, WIDTH, padding_idx=0))


# Two inputs, as a Transformer takes them: token ids and an attention mask (1 keeps a token).
class _TorchMasked(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = tnn.Embedding(VOCABULARY, WIDTH)
        self.flatten = tnn.Flatten()
        self.classifier = tnn.Linear(WIDTH * TOKENS, 5)

    def forward(self, tokens, mask):
        return self.classifier(self.flatten(self.embedding(tokens) * mask.unsqueeze(-1)))


class _MsMasked(msnn.Cell):
    def __init__(self, use_mask: bool = True) -> None:
        super().__init__()
        self.embedding = msnn.Embedding(VOCABULARY, WIDTH)
        self.flatten = msnn.Flatten()
        self.classifier = msnn.Dense(WIDTH * TOKENS, 5)
        self.use_mask = use_mask

    def construct(self, tokens, mask):
        embedded = self.embedding(tokens)
        if self.use_mask:
            embedded = embedded * mask.expand_dims(-1)
        return self.classifier(self.flatten(embedded))


def torch_masked() -> tnn.Module:
    return _TorchMasked()


def ms_masked() -> msnn.Cell:
    return _MsMasked()


def ms_masked_ignoring_mask() -> msnn.Cell:
    """The port takes the mask and drops it."""
    return _MsMasked(use_mask=False)


# A segmentation head: one class score per pixel, a label per pixel.
SEGMENT_CLASSES = 5


def torch_segmenter() -> tnn.Module:
    return tnn.Sequential(tnn.Conv2d(3, 8, 3, padding=1), tnn.BatchNorm2d(8), tnn.ReLU(),
                          tnn.Conv2d(8, SEGMENT_CLASSES, 1))


def ms_segmenter() -> msnn.Cell:
    return msnn.SequentialCell([
        msnn.Conv2d(3, 8, 3, pad_mode="pad", padding=1, has_bias=True),
        msnn.BatchNorm2d(8, momentum=0.9), msnn.ReLU(),
        msnn.Conv2d(8, SEGMENT_CLASSES, 1, has_bias=True)])


# A small U-Net over 8×8 images: a skip connection concatenated in the forward, a transposed
# convolution (kernel 3, stride 2, padding 1, output_padding 1, as decoders often have) and a
# bilinear upsampling of a side output; one label per pixel.
UNET_IMAGE = 8


def _torch_conv_bn_relu(channels_in: int, channels_out: int) -> tnn.Module:
    return tnn.Sequential(tnn.Conv2d(channels_in, channels_out, 3, padding=1, bias=False),
                          tnn.BatchNorm2d(channels_out), tnn.ReLU())


def _ms_conv_bn_relu(channels_in: int, channels_out: int) -> msnn.Cell:
    return msnn.SequentialCell([
        msnn.Conv2d(channels_in, channels_out, 3, pad_mode="pad", padding=1, has_bias=False),
        msnn.BatchNorm2d(channels_out, momentum=0.9), msnn.ReLU()])


class _TorchUNet(tnn.Module):
    def __init__(self, mode: str = "bilinear", align_corners: Optional[bool] = None) -> None:
        super().__init__()
        self.down = _torch_conv_bn_relu(3, 8)
        self.pool = tnn.MaxPool2d(2)
        self.middle = _torch_conv_bn_relu(8, 16)
        self.up = tnn.ConvTranspose2d(16, 8, 3, stride=2, padding=1, output_padding=1)
        self.head = tnn.Conv2d(16, SEGMENT_CLASSES, 1)
        self.side = tnn.Conv2d(16, SEGMENT_CLASSES, 1)
        self.resize = tnn.Upsample(scale_factor=2, mode=mode, align_corners=align_corners)

    def forward(self, x):
        import torch
        skip = self.down(x)
        deep = self.middle(self.pool(skip))
        return self.head(torch.cat([skip, self.up(deep)], 1)) + self.resize(self.side(deep))


class _MsUNet(msnn.Cell):
    """MindSpore's nn.Upsample takes no scale_factor for bilinear 4-D input: a size instead."""

    def __init__(self, up: Optional[msnn.Cell] = None, align_corners: bool = False,
                 resize: Optional[msnn.Cell] = None) -> None:
        super().__init__()
        self.down = _ms_conv_bn_relu(3, 8)
        self.pool = msnn.MaxPool2d(2, 2)
        self.middle = _ms_conv_bn_relu(8, 16)
        # torch's padding 1 with output_padding 1 crops one row and column before, none after
        self.up = up or msnn.Conv2dTranspose(16, 8, 3, stride=2, pad_mode="pad",
                                             padding=(1, 0, 1, 0), has_bias=True)
        self.head = msnn.Conv2d(16, SEGMENT_CLASSES, 1, has_bias=True)
        self.side = msnn.Conv2d(16, SEGMENT_CLASSES, 1, has_bias=True)
        self.resize = resize or msnn.Upsample(size=(UNET_IMAGE, UNET_IMAGE), mode="bilinear",
                                              align_corners=align_corners)

    def construct(self, x):
        skip = self.down(x)
        deep = self.middle(self.pool(skip))
        return self.head(ops.cat((skip, self.up(deep)), 1)) + self.resize(self.side(deep))


def torch_unet() -> tnn.Module:
    return _TorchUNet()


def ms_unet() -> msnn.Cell:
    return _MsUNet()


def ms_unet_output_padding() -> msnn.Cell:
    """torch's arguments copied: MindSpore's output_padding appends zeros after the bias."""
    return _MsUNet(up=msnn.Conv2dTranspose(16, 8, 3, stride=2, pad_mode="pad", padding=1,
                                           output_padding=1, has_bias=True))


def ms_unet_same_padding() -> msnn.Cell:
    return _MsUNet(up=msnn.Conv2dTranspose(16, 8, 3, stride=2, pad_mode="same", has_bias=True))


def ms_unet_align_corners() -> msnn.Cell:
    return _MsUNet(align_corners=True)


# A segmentation head resizing its coarse map in its forward (a function, no module) and
# concatenating it with the fine one, the coarse first, for its fusing conv, as SegFormer's
# decode head does (there with each stage's MLP output, tokens, moved to a map first).
class _TorchResizedHead(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = tnn.Conv2d(3, 8, 3, padding=1)
        self.coarse = tnn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.fine_proj, self.coarse_proj = tnn.Conv2d(8, 8, 1), tnn.Linear(8, 8)
        self.fuse = tnn.Conv2d(16, SEGMENT_CLASSES, 1)

    def forward(self, x):
        fine = self.stem(x)
        coarse = self.coarse(fine)
        n, channels, height, width = coarse.shape
        coarse = self.coarse_proj(coarse.flatten(2).transpose(1, 2))
        coarse = torch.nn.functional.interpolate(
            coarse.transpose(1, 2).reshape(n, channels, height, width), size=fine.shape[-2:],
            mode="bilinear", align_corners=False)
        return self.fuse(torch.cat([coarse, self.fine_proj(fine)], 1))


class _MsResizedHead(msnn.Cell):
    def __init__(self, resize: str = "interpolate", align_corners: bool = False,
                 mode: str = "bilinear") -> None:
        super().__init__()
        self.stem = msnn.Conv2d(3, 8, 3, pad_mode="pad", padding=1, has_bias=True)
        self.coarse = msnn.Conv2d(8, 8, 3, stride=2, pad_mode="pad", padding=1, has_bias=True)
        self.fine_proj = msnn.Conv2d(8, 8, 1, has_bias=True)
        self.coarse_proj = msnn.Dense(8, 8)
        self.fuse = msnn.Conv2d(16, SEGMENT_CLASSES, 1, has_bias=True)
        self.resize, self.align_corners, self.mode = resize, align_corners, mode
        self.bilinear_v2 = ops.ResizeBilinearV2(align_corners=align_corners)
        self.bicubic_v1 = ops.ResizeBicubic()

    def construct(self, x):
        fine = self.stem(x)
        coarse = self.coarse(fine)
        n, channels, height, width = coarse.shape
        coarse = self.coarse_proj(coarse.reshape(n, channels, -1).swapaxes(1, 2))
        coarse = coarse.swapaxes(1, 2).reshape(n, channels, height, width)
        size = fine.shape[-2:]
        if self.resize == "interpolate":
            coarse = ops.interpolate(coarse, size=size, mode=self.mode,
                                     align_corners=self.align_corners
                                     if self.mode != "nearest" else None)
        elif self.resize == "bicubic_v1":
            coarse = self.bicubic_v1(coarse, mindspore.Tensor(np.array(size, np.int32)))
        else:
            coarse = self.bilinear_v2(coarse, size)
        return self.fuse(ops.cat((coarse, self.fine_proj(fine)), 1))


def torch_resized_head() -> tnn.Module:
    return _TorchResizedHead()


def ms_resized_head(**bug) -> msnn.Cell:
    return _MsResizedHead(**bug)


# A U-Net decoder block as segmentation_models_pytorch's DecoderBlock: given the deeper map and
# the skip connection, it resizes the first (F.interpolate, scale factor 2, nearest) and
# concatenates the skip after it, for its conv.
class _TorchDecoderBlock(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = tnn.Conv2d(12, 4, 3, padding=1)

    def forward(self, x, skip):
        x = torch.nn.functional.interpolate(x, scale_factor=2, mode="nearest")
        return self.conv1(torch.cat([x, skip], 1))


class _TorchDecoded(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = tnn.Conv2d(3, 4, 3, padding=1)
        self.down = tnn.Conv2d(4, 8, 3, stride=2, padding=1)
        self.decoder = _TorchDecoderBlock()
        self.head = tnn.Conv2d(4, SEGMENT_CLASSES, 1)

    def forward(self, x):
        skip = self.stem(x)
        return self.head(self.decoder(self.down(skip), skip))


class _MsDecoderBlock(msnn.Cell):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.conv1 = msnn.Conv2d(12, 4, 3, pad_mode="pad", padding=1, has_bias=True)
        self.mode = mode

    def construct(self, x, skip):
        if self.mode == "nearest":
            x = ops.interpolate(x, size=skip.shape[-2:], mode="nearest")
        else:
            x = ops.interpolate(x, size=skip.shape[-2:], mode=self.mode, align_corners=False)
        return self.conv1(ops.cat((x, skip), 1))


class _MsDecoded(msnn.Cell):
    def __init__(self, mode: str = "nearest") -> None:
        super().__init__()
        self.stem = msnn.Conv2d(3, 4, 3, pad_mode="pad", padding=1, has_bias=True)
        self.down = msnn.Conv2d(4, 8, 3, stride=2, pad_mode="pad", padding=1, has_bias=True)
        self.decoder = _MsDecoderBlock(mode)
        self.head = msnn.Conv2d(4, SEGMENT_CLASSES, 1, has_bias=True)

    def construct(self, x):
        skip = self.stem(x)
        return self.head(self.decoder(self.down(skip), skip))


def torch_decoded() -> tnn.Module:
    return _TorchDecoded()


def ms_decoded(**bug) -> msnn.Cell:
    return _MsDecoded(**bug)


# A feature pyramid's top-down step as torchvision's FeaturePyramidNetwork takes it: the deeper
# map's 1×1 conv resized (F.interpolate, nearest) to the lateral one's size and added to it,
# for the smoothing conv.
class _TorchPyramid(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = tnn.Conv2d(3, 4, 3, padding=1)
        self.down = tnn.Conv2d(4, 8, 3, stride=2, padding=1)
        self.lateral, self.top = tnn.Conv2d(4, 4, 1), tnn.Conv2d(8, 4, 1)
        self.smooth = tnn.Conv2d(4, SEGMENT_CLASSES, 3, padding=1)

    def forward(self, x):
        fine = self.stem(x)
        top = torch.nn.functional.interpolate(self.top(self.down(fine)), size=fine.shape[-2:],
                                              mode="nearest")
        return self.smooth(self.lateral(fine) + top)


class _MsPyramid(msnn.Cell):
    def __init__(self, mode: str = "nearest") -> None:
        super().__init__()
        self.stem = msnn.Conv2d(3, 4, 3, pad_mode="pad", padding=1, has_bias=True)
        self.down = msnn.Conv2d(4, 8, 3, stride=2, pad_mode="pad", padding=1, has_bias=True)
        self.lateral = msnn.Conv2d(4, 4, 1, has_bias=True)
        self.top = msnn.Conv2d(8, 4, 1, has_bias=True)
        self.smooth = msnn.Conv2d(4, SEGMENT_CLASSES, 3, pad_mode="pad", padding=1,
                                  has_bias=True)
        self.mode = mode

    def construct(self, x):
        fine = self.stem(x)
        top = self.top(self.down(fine))
        top = ops.interpolate(top, size=fine.shape[-2:], mode=self.mode) \
            if self.mode == "nearest" else \
            ops.interpolate(top, size=fine.shape[-2:], mode=self.mode, align_corners=False)
        return self.smooth(self.lateral(fine) + top)


def torch_pyramid() -> tnn.Module:
    return _TorchPyramid()


def ms_pyramid(**bug) -> msnn.Cell:
    return _MsPyramid(**bug)


# A segmenter resizing its logits to the image after its last module, in its forward, as
# torchvision's FCN, DeepLabV3 and LRASPP do (bilinear, align_corners=False).
class _TorchUpsampledLogits(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = tnn.Sequential(tnn.Conv2d(3, 8, 3, stride=2, padding=1), tnn.ReLU())
        self.classifier = tnn.Conv2d(8, SEGMENT_CLASSES, 1)

    def forward(self, x):
        return torch.nn.functional.interpolate(self.classifier(self.backbone(x)),
                                               size=x.shape[-2:], mode="bilinear",
                                               align_corners=False)


class _MsUpsampledLogits(msnn.Cell):
    def __init__(self, align_corners: bool = False) -> None:
        super().__init__()
        self.backbone = msnn.SequentialCell([
            msnn.Conv2d(3, 8, 3, stride=2, pad_mode="pad", padding=1, has_bias=True),
            msnn.ReLU()])
        self.classifier = msnn.Conv2d(8, SEGMENT_CLASSES, 1, has_bias=True)
        self.align_corners = align_corners

    def construct(self, x):
        return ops.interpolate(self.classifier(self.backbone(x)), size=x.shape[-2:],
                               mode="bilinear", align_corners=self.align_corners)


def torch_upsampled_logits() -> tnn.Module:
    return _TorchUpsampledLogits()


def ms_upsampled_logits(**bug) -> msnn.Cell:
    return _MsUpsampledLogits(**bug)


# A decoder's upsampling module resizing its conv's output in its own forward (a function, no
# module of its own): its output differs, its input and its conv's output matching.
class _TorchUpsamplingBlock(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = tnn.Conv2d(8, 8, 1)

    def forward(self, x):
        return torch.nn.functional.interpolate(self.conv(x), scale_factor=2, mode="bilinear",
                                               align_corners=False)


class _TorchUpsampled(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = tnn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.up = _TorchUpsamplingBlock()
        self.head = tnn.Conv2d(8, SEGMENT_CLASSES, 3, padding=1)

    def forward(self, x):
        return self.head(self.up(self.stem(x)))


class _MsUpsamplingBlock(msnn.Cell):
    def __init__(self, align_corners: bool) -> None:
        super().__init__()
        self.conv = msnn.Conv2d(8, 8, 1, has_bias=True)
        self.align_corners = align_corners

    def construct(self, x):
        y = self.conv(x)
        return ops.interpolate(y, size=(y.shape[2] * 2, y.shape[3] * 2), mode="bilinear",
                               align_corners=self.align_corners)


class _MsUpsampled(msnn.Cell):
    def __init__(self, align_corners: bool = False) -> None:
        super().__init__()
        self.stem = msnn.Conv2d(3, 8, 3, stride=2, pad_mode="pad", padding=1, has_bias=True)
        self.up = _MsUpsamplingBlock(align_corners)
        self.head = msnn.Conv2d(8, SEGMENT_CLASSES, 3, pad_mode="pad", padding=1,
                                has_bias=True)

    def construct(self, x):
        return self.head(self.up(self.stem(x)))


def torch_upsampled() -> tnn.Module:
    return _TorchUpsampled()


def ms_upsampled(**bug) -> msnn.Cell:
    return _MsUpsampled(**bug)


# PSPNet's pyramid pooling: each stage pools the map to 1, 2 and 3 cells a side and convolves
# it; the forward resizes each back (bilinear, align_corners=True) and concatenates them with
# the map for the bottleneck conv.
class _TorchPyramidPooling(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stages = tnn.ModuleList([tnn.Sequential(tnn.AdaptiveAvgPool2d(cells),
                                                     tnn.Conv2d(8, 2, 1)) for cells in (1, 2, 3)])
        self.bottleneck = tnn.Conv2d(14, 8, 1)

    def forward(self, x):
        return self.bottleneck(torch.cat([
            *(torch.nn.functional.interpolate(stage(x), size=x.shape[-2:], mode="bilinear",
                                              align_corners=True) for stage in self.stages),
            x], 1))


class _TorchPyramidPooled(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = tnn.Conv2d(3, 8, 3, padding=1)
        self.psp = _TorchPyramidPooling()
        self.head = tnn.Conv2d(8, SEGMENT_CLASSES, 1)

    def forward(self, x):
        return self.head(self.psp(self.stem(x)))


class _MsPyramidPooling(msnn.Cell):
    def __init__(self, align_corners: bool) -> None:
        super().__init__()
        self.stages = msnn.CellList([
            msnn.SequentialCell([msnn.AdaptiveAvgPool2d(cells),
                                 msnn.Conv2d(8, 2, 1, has_bias=True)]) for cells in (1, 2, 3)])
        self.bottleneck = msnn.Conv2d(14, 8, 1, has_bias=True)
        self.align_corners = align_corners

    def construct(self, x):
        priors = [ops.interpolate(stage(x), size=x.shape[-2:], mode="bilinear",
                                  align_corners=self.align_corners) for stage in self.stages]
        return self.bottleneck(ops.cat(priors + [x], 1))


class _MsPyramidPooled(msnn.Cell):
    def __init__(self, align_corners: bool = True) -> None:
        super().__init__()
        self.stem = msnn.Conv2d(3, 8, 3, pad_mode="pad", padding=1, has_bias=True)
        self.psp = _MsPyramidPooling(align_corners)
        self.head = msnn.Conv2d(8, SEGMENT_CLASSES, 1, has_bias=True)

    def construct(self, x):
        return self.head(self.psp(self.stem(x)))


def torch_pyramid_pooled() -> tnn.Module:
    return _TorchPyramidPooled()


def ms_pyramid_pooled(**bug) -> msnn.Cell:
    return _MsPyramidPooled(**bug)


# A U-Net-like classifier: its last BatchNorm, over 8,192 values a channel at batch 2, 64², is
# followed by a mean over space, so the gradient reaching it is nearly one value per channel.
class _TorchPooledUNet(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.down = _torch_conv_bn_relu(3, 8)
        self.pool = tnn.MaxPool2d(2)
        self.middle = _torch_conv_bn_relu(8, 16)
        self.up = tnn.ConvTranspose2d(16, 8, 2, stride=2)
        self.decode = _torch_conv_bn_relu(16, 8)
        self.fc = tnn.Linear(8, 10)

    def forward(self, x):
        import torch
        skip = self.down(x)
        decoded = self.decode(torch.cat([skip, self.up(self.middle(self.pool(skip)))], 1))
        return self.fc(decoded.mean((2, 3)))


class _MsPooledUNet(msnn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.down = _ms_conv_bn_relu(3, 8)
        self.pool = msnn.MaxPool2d(2, 2)
        self.middle = _ms_conv_bn_relu(8, 16)
        self.up = msnn.Conv2dTranspose(16, 8, 2, stride=2, has_bias=True)
        self.decode = _ms_conv_bn_relu(16, 8)
        self.fc = msnn.Dense(8, 10)

    def construct(self, x):
        skip = self.down(x)
        decoded = self.decode(ops.cat((skip, self.up(self.middle(self.pool(skip)))), 1))
        return self.fc(decoded.mean((2, 3)))


def torch_pooled_unet() -> tnn.Module:
    return _TorchPooledUNet()


def ms_pooled_unet() -> msnn.Cell:
    return _MsPooledUNet()


class _TorchPooledGroupNorm(tnn.Module):
    """Two conv-GroupNorm-ReLU blocks and a mean over space: 8,192 values a channel at batch 2,
    64², the gradient reaching the last GroupNorm nearly one value per channel."""

    def __init__(self, widths: Tuple[int, int] = (16, 32), groups: int = 4) -> None:
        super().__init__()
        self.features = tnn.Sequential(
            tnn.Conv2d(3, widths[0], 3, padding=1, bias=False), tnn.GroupNorm(groups, widths[0]),
            tnn.ReLU(),
            tnn.Conv2d(widths[0], widths[1], 3, padding=1, bias=False),
            tnn.GroupNorm(groups, widths[1]), tnn.ReLU())
        self.fc = tnn.Linear(widths[1], 10)

    def forward(self, x):
        return self.fc(self.features(x).mean((2, 3)))


class _MsPooledGroupNorm(msnn.Cell):
    def __init__(self, widths: Tuple[int, int] = (16, 32), groups: int = 4) -> None:
        super().__init__()
        self.features = msnn.SequentialCell([
            msnn.Conv2d(3, widths[0], 3, pad_mode="pad", padding=1),
            msnn.GroupNorm(groups, widths[0]), msnn.ReLU(),
            msnn.Conv2d(widths[0], widths[1], 3, pad_mode="pad", padding=1),
            msnn.GroupNorm(groups, widths[1]), msnn.ReLU()])
        self.fc = msnn.Dense(widths[1], 10)

    def construct(self, x):
        return self.fc(self.features(x).mean((2, 3)))


def torch_pooled_group_norm() -> tnn.Module:
    return _TorchPooledGroupNorm()


def ms_pooled_group_norm() -> msnn.Cell:
    return _MsPooledGroupNorm()


THIN_GROUP_NORM = {"widths": (4, 8), "groups": 2}


def torch_thin_pooled_group_norm() -> tnn.Module:
    """Four and eight channels: 65,536 values a channel at batch 1, 256², in little time."""
    return _TorchPooledGroupNorm(**THIN_GROUP_NORM)


def ms_thin_pooled_group_norm() -> msnn.Cell:
    return _MsPooledGroupNorm(**THIN_GROUP_NORM)


class _TorchPooledPReLU(tnn.Module):
    """Conv-PReLU blocks, one PReLU weight each, and a mean over space: 2,097,152 values in the
    second PReLU's weight gradient at batch 2, 256² with the default widths."""

    def __init__(self, widths: Tuple[int, ...] = (8, 16)) -> None:
        super().__init__()
        blocks = []
        for before, width in zip((3, *widths), widths):
            blocks += [tnn.Conv2d(before, width, 3, padding=1, bias=False), tnn.PReLU()]
        self.features = tnn.Sequential(*blocks)
        self.fc = tnn.Linear(widths[-1], 10)

    def forward(self, x):
        return self.fc(self.features(x).mean((2, 3)))


class _MsPooledPReLU(msnn.Cell):
    def __init__(self, widths: Tuple[int, ...] = (8, 16)) -> None:
        super().__init__()
        blocks = []
        for before, width in zip((3, *widths), widths):
            blocks += [msnn.Conv2d(before, width, 3, pad_mode="pad", padding=1), msnn.PReLU()]
        self.features = msnn.SequentialCell(blocks)
        self.fc = msnn.Dense(widths[-1], 10)

    def construct(self, x):
        return self.fc(self.features(x).mean((2, 3)))


def torch_pooled_prelu() -> tnn.Module:
    return _TorchPooledPReLU()


def ms_pooled_prelu() -> msnn.Cell:
    return _MsPooledPReLU()


DEEP_PRELU = (8,) * 8


def torch_deep_prelu() -> tnn.Module:
    """Eight PReLUs of one shape: MindSpore's kernel for them searches its thread count."""
    return _TorchPooledPReLU(DEEP_PRELU)


def ms_deep_prelu() -> msnn.Cell:
    return _MsPooledPReLU(DEEP_PRELU)


# ConvNeXt's stem: a patchifying conv and torchvision's LayerNorm2d (channels moved last), its
# port a cell wrapping nn.LayerNorm between two transposes; at 32² the feature map is 8 × 8 with
# 8 channels, so the inner LayerNorm's output has torch's shape too
class TorchLayerNorm2d(tnn.LayerNorm):
    """torchvision's LayerNorm2d: a LayerNorm over the channels, moved last and back."""

    def forward(self, x):
        x = tnn.functional.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape,
                                      self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class _MsLayerNorm2d(msnn.Cell):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = msnn.LayerNorm((channels,), epsilon=1e-5)

    def construct(self, x):
        return ops.transpose(self.norm(ops.transpose(x, (0, 2, 3, 1))), (0, 3, 1, 2))


def torch_patchified() -> tnn.Module:
    return tnn.Sequential(tnn.Conv2d(3, 8, 4, stride=4), TorchLayerNorm2d(8), tnn.ReLU(),
                          tnn.AdaptiveAvgPool2d(1), tnn.Flatten(), tnn.Linear(8, 10))


def ms_patchified() -> msnn.Cell:
    return msnn.SequentialCell([msnn.Conv2d(3, 8, 4, stride=4, has_bias=True, pad_mode="valid"),
                                _MsLayerNorm2d(8), msnn.ReLU(), msnn.AdaptiveAvgPool2d(1),
                                msnn.Flatten(), msnn.Dense(8, 10)])


# A LayerNorm over each sample's channels and space, as some ports normalise a feature map
LAYER_NORM_IMAGE = 256


class _TorchPooledLayerNorm(tnn.Module):
    """Two conv-LayerNorm-ReLU blocks and a mean over space: 524,288 values a sample at 256²
    in the second LayerNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.features = tnn.Sequential(
            tnn.Conv2d(3, 4, 3, padding=1, bias=False),
            tnn.LayerNorm([4, LAYER_NORM_IMAGE, LAYER_NORM_IMAGE]), tnn.ReLU(),
            tnn.Conv2d(4, 8, 3, padding=1, bias=False),
            tnn.LayerNorm([8, LAYER_NORM_IMAGE, LAYER_NORM_IMAGE]), tnn.ReLU())
        self.fc = tnn.Linear(8, 10)

    def forward(self, x):
        return self.fc(self.features(x).mean((2, 3)))


class _MsPooledLayerNorm(msnn.Cell):
    def __init__(self) -> None:
        super().__init__()

        def layer_norm(channels: int) -> msnn.Cell:
            return msnn.LayerNorm((channels, LAYER_NORM_IMAGE, LAYER_NORM_IMAGE),
                                  begin_norm_axis=1, begin_params_axis=1, epsilon=1e-5)
        self.features = msnn.SequentialCell([
            msnn.Conv2d(3, 4, 3, pad_mode="pad", padding=1), layer_norm(4), msnn.ReLU(),
            msnn.Conv2d(4, 8, 3, pad_mode="pad", padding=1), layer_norm(8), msnn.ReLU()])
        self.fc = msnn.Dense(8, 10)

    def construct(self, x):
        return self.fc(self.features(x).mean((2, 3)))


def torch_pooled_layer_norm() -> tnn.Module:
    return _TorchPooledLayerNorm()


def ms_pooled_layer_norm() -> msnn.Cell:
    return _MsPooledLayerNorm()


def torch_unet_bicubic() -> tnn.Module:
    return _TorchUNet(mode="bicubic")


def torch_unet_bicubic_aligned() -> tnn.Module:
    return _TorchUNet(mode="bicubic", align_corners=True)


def ms_unet_bicubic(align_corners: bool = False) -> msnn.Cell:
    """MindSpore's nn.Upsample takes no scale_factor for bicubic 4-D input either."""
    return _MsUNet(resize=msnn.Upsample(size=(UNET_IMAGE, UNET_IMAGE), mode="bicubic",
                                        align_corners=align_corners))


def ms_unet_bicubic_aligned() -> msnn.Cell:
    return ms_unet_bicubic(align_corners=True)


def _torch_cubic_weights(size_in: int, size_out: int) -> np.ndarray:
    """torch's bicubic resampling along one axis as a (size_out, size_in) matrix: Keys' kernel
    with a = -0.75, half-pixel centres, the border pixels repeated."""
    def kernel(d: float) -> float:
        a, d = -0.75, abs(d)
        if d <= 1:
            return (a + 2) * d ** 3 - (a + 3) * d ** 2 + 1
        return a * d ** 3 - 5 * a * d ** 2 + 8 * a * d - 4 * a if d < 2 else 0.0
    weights = np.zeros((size_out, size_in), np.float32)
    for row in range(size_out):
        source = (row + 0.5) * size_in / size_out - 0.5
        left = int(np.floor(source))
        for tap in range(left - 1, left + 3):
            weights[row, min(max(tap, 0), size_in - 1)] += kernel(source - tap)
    return weights


class _TorchBicubic(msnn.Cell):
    """torch's bicubic upsampling in MindSpore: two fixed interpolation matrices."""

    def __init__(self, size_in: int, size_out: int) -> None:
        super().__init__()
        import mindspore as ms
        weights = _torch_cubic_weights(size_in, size_out)
        self.rows, self.columns = ms.Tensor(weights), ms.Tensor(weights.T.copy())

    def construct(self, x):
        return ops.matmul(ops.matmul(self.rows, x), self.columns)


def ms_unet_torch_bicubic() -> msnn.Cell:
    return _MsUNet(resize=_TorchBicubic(UNET_IMAGE // 2, UNET_IMAGE))


# Small MLPs over 16 features, with the layer under test between two linear layers.
FEATURES = 16


def _torch_mlp(*middle: tnn.Module) -> tnn.Module:
    return tnn.Sequential(tnn.Linear(FEATURES, FEATURES), *middle, tnn.Linear(FEATURES, 5))


def _ms_mlp(*middle: msnn.Cell) -> msnn.Cell:
    return msnn.SequentialCell([msnn.Dense(FEATURES, FEATURES), *middle,
                                msnn.Dense(FEATURES, 5)])


def torch_layernorm_mlp() -> tnn.Module:
    return _torch_mlp(tnn.LayerNorm(FEATURES), tnn.ReLU())


def torch_layernorm_mlp_timm_eps() -> tnn.Module:
    """timm's LayerNorm eps, 1e-6: against MindSpore's 1e-7, features of unit variance agree
    within float32 error."""
    return _torch_mlp(tnn.LayerNorm(FEATURES, eps=1e-6), tnn.ReLU())


def ms_layernorm_mlp() -> msnn.Cell:
    return _ms_mlp(msnn.LayerNorm((FEATURES,), epsilon=1e-5), msnn.ReLU())


def ms_layernorm_mlp_default_epsilon() -> msnn.Cell:
    """LayerNorm ported without epsilon: MindSpore's default 1e-7 against torch's 1e-5."""
    return _ms_mlp(msnn.LayerNorm((FEATURES,)), msnn.ReLU())


def torch_gelu_mlp() -> tnn.Module:
    return _torch_mlp(tnn.GELU())


def ms_gelu_mlp() -> msnn.Cell:
    return _ms_mlp(msnn.GELU(approximate=False))


def ms_gelu_mlp_default() -> msnn.Cell:
    """nn.GELU() ported as is: MindSpore's default is the tanh approximation, torch's erf."""
    return _ms_mlp(msnn.GELU())


class _TorchFunctionalMlp(tnn.Module):
    """The activation written as a function in the forward: no module, no record of its own."""

    def __init__(self, activation) -> None:
        super().__init__()
        self.fc1, self.fc2 = tnn.Linear(FEATURES, FEATURES), tnn.Linear(FEATURES, 5)
        self.activation = activation

    def forward(self, x):
        return self.fc2(self.activation(self.fc1(x)))


class _MsFunctionalMlp(msnn.Cell):
    def __init__(self, activation) -> None:
        super().__init__()
        self.fc1, self.fc2 = msnn.Dense(FEATURES, FEATURES), msnn.Dense(FEATURES, 5)
        self.activation = activation

    def construct(self, x):
        return self.fc2(self.activation(self.fc1(x)))


class GELUActivation(tnn.Module):
    """Hugging Face transformers' GELU (ACT2FN["gelu"]): F.gelu in a class of its own name."""

    def forward(self, x):
        return tnn.functional.gelu(x)


class NewGELUActivation(msnn.Cell):
    """The tanh form written out (as transformers' NewGELUActivation), ported by hand."""

    def construct(self, x):
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * ops.pow(x, 3.0))
        return 0.5 * x * (1.0 + ops.tanh(inner))


def torch_hf_gelu_mlp() -> tnn.Module:
    return _torch_mlp(GELUActivation())


def ms_hand_tanh_gelu_mlp() -> msnn.Cell:
    return _ms_mlp(NewGELUActivation())


class QuickGELUActivation(tnn.Module):
    """Hugging Face's quick_gelu (CLIP's MLP): x·σ(1.702x), neither of torch's GELU forms."""

    def forward(self, x):
        return x * torch.sigmoid(1.702 * x)


def torch_quick_gelu_mlp() -> tnn.Module:
    return _torch_mlp(QuickGELUActivation())


def ms_fast_gelu_mlp() -> msnn.Cell:
    """MindSpore's nn.FastGelu: x·σ(1.702x), computed as x / (1 + e^(-1.702|x|)) ·
    e^(0.851(x - |x|))."""
    return _ms_mlp(msnn.FastGelu())


def torch_functional_gelu_mlp() -> tnn.Module:
    return _TorchFunctionalMlp(tnn.functional.gelu)


def torch_functional_silu_mlp() -> tnn.Module:
    return _TorchFunctionalMlp(tnn.functional.silu)


def torch_functional_quick_gelu_mlp() -> tnn.Module:
    """CLIP's quick GELU written in the forward (x·σ(1.702x))."""
    return _TorchFunctionalMlp(lambda x: x * torch.sigmoid(1.702 * x))


def ms_functional_gelu_mlp() -> msnn.Cell:
    return _MsFunctionalMlp(ops.gelu)


def ms_functional_gelu_tanh_mlp() -> msnn.Cell:
    """torch's exact F.gelu ported as the tanh form."""
    return _MsFunctionalMlp(lambda x: ops.gelu(x, approximate="tanh"))


def ms_functional_sigmoid_mlp() -> msnn.Cell:
    """torch's F.silu ported as sigmoid."""
    return _MsFunctionalMlp(ops.sigmoid)


# Two GELUs torch applies as functions, a parameter added after the second (Whisper's encoder:
# F.gelu after each conv, then its positions), ported as GELU cells; one variant leaves the
# parameter out.
class _TorchShiftedMlp(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = tnn.Linear(FEATURES, FEATURES), tnn.Linear(FEATURES, FEATURES)
        self.shift = tnn.Parameter(torch.linspace(-1.0, 1.0, FEATURES))
        self.fc3 = tnn.Linear(FEATURES, 5)

    def forward(self, x):
        hidden = tnn.functional.gelu(self.fc2(tnn.functional.gelu(self.fc1(x))))
        return self.fc3(hidden + self.shift)


class _MsShiftedMlp(msnn.Cell):
    def __init__(self, shifted: bool) -> None:
        super().__init__()
        self.fc1, self.fc2 = msnn.Dense(FEATURES, FEATURES), msnn.Dense(FEATURES, FEATURES)
        self.act1, self.act2 = msnn.GELU(approximate=False), msnn.GELU(approximate=False)
        self.shift = mindspore.Parameter(mindspore.ops.zeros(FEATURES, mindspore.float32))
        self.fc3 = msnn.Dense(FEATURES, 5)
        self.shifted = shifted

    def construct(self, x):
        hidden = self.act2(self.fc2(self.act1(self.fc1(x))))
        return self.fc3(hidden + self.shift if self.shifted else hidden)


def torch_shifted_mlp() -> tnn.Module:
    return _TorchShiftedMlp()


def ms_shifted_mlp() -> msnn.Cell:
    return _MsShiftedMlp(shifted=True)


def ms_shifted_mlp_unshifted() -> msnn.Cell:
    return _MsShiftedMlp(shifted=False)


# Layers held in a ModuleList (no forward of its own), the model's forward shifting the first
# one's output; one port variant leaves the shift out.
class _TorchListedLayers(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = tnn.ModuleList([tnn.Linear(FEATURES, FEATURES), tnn.Linear(FEATURES, 5)])

    def forward(self, x):
        return self.layers[1](self.layers[0](x) + 1.0)


class _MsListedLayers(msnn.Cell):
    def __init__(self, shifted: bool) -> None:
        super().__init__()
        self.layers = msnn.CellList([msnn.Dense(FEATURES, FEATURES), msnn.Dense(FEATURES, 5)])
        self.shift = 1.0 if shifted else 0.0

    def construct(self, x):
        return self.layers[1](self.layers[0](x) + self.shift)


def torch_listed_layers() -> tnn.Module:
    return _TorchListedLayers()


def ms_listed_layers_unshifted() -> msnn.Cell:
    return _MsListedLayers(shifted=False)


# Two heads, one over the first layer's output and one over the second's; one port variant
# hands both the second's (a cross-attention fed the decoder's states for the encoder's).
class _TorchHeadsOverTwoLayers(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = tnn.Linear(FEATURES, FEATURES), tnn.Linear(FEATURES, FEATURES)
        self.head1, self.head2 = tnn.Linear(FEATURES, 5), tnn.Linear(FEATURES, 5)

    def forward(self, x):
        first = self.fc1(x)
        second = self.fc2(first)
        return self.head1(first) + self.head2(second)


class _MsHeadsOverTheSecondLayer(msnn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = msnn.Dense(FEATURES, FEATURES), msnn.Dense(FEATURES, FEATURES)
        self.head1, self.head2 = msnn.Dense(FEATURES, 5), msnn.Dense(FEATURES, 5)

    def construct(self, x):
        second = self.fc2(self.fc1(x))
        return self.head1(second) + self.head2(second)


def torch_heads_over_two_layers() -> tnn.Module:
    return _TorchHeadsOverTwoLayers()


def ms_heads_over_the_second_layer() -> msnn.Cell:
    return _MsHeadsOverTheSecondLayer()


# A block ending at a norm and returning a dict (Whisper's decoder ends at its layer_norm and
# returns a model output); the port's block holds the norm and returns before it.
class _TorchEndingAtANorm(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = tnn.Linear(FEATURES, FEATURES)
        self.norm = tnn.LayerNorm(FEATURES)

    def forward(self, x):
        return {"last_hidden_state": self.norm(self.fc(x))}


class _TorchHeadedDictBlock(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = _TorchEndingAtANorm()
        self.head = tnn.Linear(FEATURES, 5)

    def forward(self, x):
        return self.head(self.block(x)["last_hidden_state"])


class _MsEndingBeforeItsNorm(msnn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.fc = msnn.Dense(FEATURES, FEATURES)
        self.norm = msnn.LayerNorm((FEATURES,), epsilon=1e-5)

    def construct(self, x):
        return self.fc(x)


class _MsHeadedBlock(msnn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.block = _MsEndingBeforeItsNorm()
        self.head = msnn.Dense(FEATURES, 5)

    def construct(self, x):
        return self.head(self.block(x))


def torch_block_ending_at_a_norm() -> tnn.Module:
    return _TorchHeadedDictBlock()


def ms_block_ending_before_its_norm() -> msnn.Cell:
    return _MsHeadedBlock()


# A shift added to a layer's output, then a dropout of rate 0 (GPT-2 adds its positions so,
# then drops), and a port holding the shift that never calls it, with no dropout.
class _TorchShiftThenDropout(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = tnn.Linear(FEATURES, FEATURES)
        self.shift = tnn.Linear(FEATURES, FEATURES)
        self.drop = tnn.Dropout(0.0)
        self.head = tnn.Linear(FEATURES, 5)

    def forward(self, x):
        hidden = self.fc1(x)
        return self.head(self.drop(hidden + self.shift(hidden)))


class _MsShiftNeverCalled(msnn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = msnn.Dense(FEATURES, FEATURES)
        self.shift = msnn.Dense(FEATURES, FEATURES)
        self.head = msnn.Dense(FEATURES, 5)

    def construct(self, x):
        return self.head(self.fc1(x))


def torch_shift_then_dropout() -> tnn.Module:
    return _TorchShiftThenDropout()


def ms_shift_never_called() -> msnn.Cell:
    return _MsShiftNeverCalled()


# A layer scaled by a constant torch holds as a non-persistent buffer (GPT-2's causal mask is
# one) and the port as a plain tensor.
class _TorchScaledByAConstant(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = tnn.Linear(FEATURES, 5)
        self.register_buffer("halves", torch.full((5,), 0.5), persistent=False)

    def forward(self, x):
        return self.fc(x) * self.halves


class _MsScaledByAConstant(msnn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.fc = msnn.Dense(FEATURES, 5)
        self.halves = mindspore.Tensor(np.full((5,), 0.5, np.float32))

    def construct(self, x):
        return self.fc(x) * self.halves


def torch_scaled_by_a_constant() -> tnn.Module:
    return _TorchScaledByAConstant()


def ms_scaled_by_a_constant() -> msnn.Cell:
    return _MsScaledByAConstant()


# A block adding its norm's input to its MLP's output (a residual connection), and ports that
# leave it out, add the block's input instead, scale the MLP's output, run the two branches in
# parallel (or torch does), or leave out the first branch's identity.
class _TorchResidualBlock(tnn.Module):
    def __init__(self, parallel: bool) -> None:
        super().__init__()
        self.parallel = parallel
        self.inner = tnn.Linear(FEATURES, FEATURES)
        self.norm = tnn.LayerNorm(FEATURES)
        self.mlp = tnn.Linear(FEATURES, FEATURES)

    def forward(self, x):
        hidden = x + self.inner(x)
        return hidden + self.mlp(self.norm(x if self.parallel else hidden))


class _TorchResidualNet(tnn.Module):
    def __init__(self, parallel: bool) -> None:
        super().__init__()
        self.fc = tnn.Linear(FEATURES, FEATURES)
        self.block = _TorchResidualBlock(parallel)
        self.head = tnn.Linear(FEATURES, 5)

    def forward(self, x):
        return self.head(self.block(self.fc(x)))


class _MsResidualBlock(msnn.Cell):
    def __init__(self, residual: str) -> None:
        super().__init__()
        self.residual = residual
        self.inner = msnn.Dense(FEATURES, FEATURES)
        self.norm = msnn.LayerNorm((FEATURES,), epsilon=1e-5)
        self.mlp = msnn.Dense(FEATURES, FEATURES)

    def construct(self, x):
        hidden = self.inner(x) if self.residual == "identity left out" else x + self.inner(x)
        out = self.mlp(self.norm(x if self.residual == "parallel" else hidden))
        if self.residual == "left out":
            return out
        if self.residual == "scaled":
            return out * 1.5
        return (x if self.residual == "block input" else hidden) + out


class _MsResidualNet(msnn.Cell):
    def __init__(self, residual: str) -> None:
        super().__init__()
        self.fc = msnn.Dense(FEATURES, FEATURES)
        self.block = _MsResidualBlock(residual)
        self.head = msnn.Dense(FEATURES, 5)

    def construct(self, x):
        return self.head(self.block(self.fc(x)))


def torch_residual_block(parallel: bool = False) -> tnn.Module:
    """x + inner(x) + mlp(norm(x + inner(x))), or, ``parallel``, x + inner(x) + mlp(norm(x))
    (GPT-NeoX's use_parallel_residual)."""
    return _TorchResidualNet(parallel)


def ms_residual_block(residual: str = "kept") -> msnn.Cell:
    """residual: "kept", "left out", "block input" (added instead of the norm's), "scaled"
    (none added, the MLP's output times 1.5), "parallel" (the norm given the block's input,
    as torch_residual_block(parallel=True)) or "identity left out" (the norm given inner(x),
    a ResNet block's out without + identity)."""
    return _MsResidualNet(residual)


# A table a module builds (a rotary embedding's cos) applied to the first half of the features
# in torch, built for all of them in the port (GPT-NeoX's rotary on a quarter of each head, ported
# onto all of it): the two tables, named alike, differ in shape and stay unpaired.
class _TorchHalfTable(tnn.Module):
    def forward(self, x):
        return torch.cos(torch.arange(FEATURES // 2, dtype=x.dtype))[None]


class _TorchTableApplied(tnn.Module):
    def __init__(self, built_first: bool) -> None:
        super().__init__()
        self.built_first = built_first
        self.fc, self.table, self.head = tnn.Linear(FEATURES, FEATURES), _TorchHalfTable(), \
            tnn.Linear(FEATURES, 5)

    def forward(self, x):
        if self.built_first:
            table = self.table(x)
            hidden = self.fc(x)
        else:
            hidden = self.fc(x)
            table = self.table(hidden)
        half = FEATURES // 2
        return self.head(torch.cat((hidden[:, :half] * table, hidden[:, half:]), 1))


class _MsWholeTable(msnn.Cell):
    def construct(self, x):
        return ops.cos(ops.arange(FEATURES, dtype=mindspore.float32))[None]


class _MsTableApplied(msnn.Cell):
    def __init__(self, built_first: bool) -> None:
        super().__init__()
        self.built_first = built_first
        self.fc, self.table, self.head = msnn.Dense(FEATURES, FEATURES), _MsWholeTable(), \
            msnn.Dense(FEATURES, 5)

    def construct(self, x):
        if self.built_first:
            table = self.table(x)
            return self.head(self.fc(x) * table)
        hidden = self.fc(x)
        return self.head(hidden * self.table(hidden))


def torch_table_on_half(built_first: bool = False) -> tnn.Module:
    """``built_first``: the table built before fc, else between fc and the head."""
    return _TorchTableApplied(built_first)


def ms_table_on_all(built_first: bool = False) -> msnn.Cell:
    return _MsTableApplied(built_first)


# A table added to the features as it is (a position embedding, timm's ``x + self.pos_embed``),
# which the port holds and may leave out; added in the model's forward, or in an embedding
# module's after its last module (Hugging Face ViT's embeddings).
class _TorchEmbedding(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = tnn.Linear(FEATURES, FEATURES)
        self.pos = tnn.Parameter(torch.linspace(-1, 1, FEATURES)[None])

    def forward(self, x):
        return self.fc(x) + self.pos


class _TorchTableAdded(tnn.Module):
    def __init__(self, inside: bool) -> None:
        super().__init__()
        self.inside = inside
        if inside:
            self.embed = _TorchEmbedding()
        else:
            self.fc = tnn.Linear(FEATURES, FEATURES)
            self.pos = tnn.Parameter(torch.linspace(-1, 1, FEATURES)[None])
        self.norm, self.head = tnn.LayerNorm(FEATURES), tnn.Linear(FEATURES, 5)

    def forward(self, x):
        return self.head(self.norm(self.embed(x) if self.inside else self.fc(x) + self.pos))


class _MsEmbedding(msnn.Cell):
    def __init__(self, added: bool) -> None:
        super().__init__()
        self.added = added
        self.fc = msnn.Dense(FEATURES, FEATURES)
        self.pos = mindspore.Parameter(mindspore.Tensor(np.zeros((1, FEATURES), np.float32)))

    def construct(self, x):
        return self.fc(x) + self.pos if self.added else self.fc(x)


class _MsTableAdded(msnn.Cell):
    def __init__(self, added: bool, inside: bool) -> None:
        super().__init__()
        self.added, self.inside = added, inside
        if inside:
            self.embed = _MsEmbedding(added)
        else:
            self.fc = msnn.Dense(FEATURES, FEATURES)
            self.pos = mindspore.Parameter(mindspore.Tensor(np.zeros((1, FEATURES), np.float32)))
        self.norm, self.head = msnn.LayerNorm((FEATURES,), epsilon=1e-5), msnn.Dense(FEATURES, 5)

    def construct(self, x):
        if self.inside:
            return self.head(self.norm(self.embed(x)))
        hidden = self.fc(x)
        return self.head(self.norm(hidden + self.pos if self.added else hidden))


def torch_table_added(inside: bool = False) -> tnn.Module:
    """``inside``: the table added by an embedding module after its layer, else by the model."""
    return _TorchTableAdded(inside)


def ms_table_added(added: bool = True, inside: bool = False) -> msnn.Cell:
    return _MsTableAdded(added, inside)


# Four tokens of four features and a class token, a position table added to all five in the
# embedding's forward (Hugging Face ViT's embeddings): the port may put the class token last.
class _TorchClassFirst(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = tnn.Linear(FEATURES, FEATURES)
        self.cls = tnn.Parameter(torch.linspace(-1, 1, 4)[None, None])
        self.pos = tnn.Parameter(torch.linspace(-0.5, 0.5, 20).reshape(1, 5, 4))

    def forward(self, x):
        tokens = self.fc(x).reshape(-1, 4, 4)
        return torch.cat((self.cls.expand(tokens.shape[0], -1, -1), tokens), 1) + self.pos


class _TorchClassNet(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = _TorchClassFirst(), tnn.Linear(20, 5)

    def forward(self, x):
        return self.head(self.embed(x).flatten(1))


class _MsClassToken(msnn.Cell):
    def __init__(self, last: bool) -> None:
        super().__init__()
        self.last = last
        self.fc = msnn.Dense(FEATURES, FEATURES)
        self.cls = mindspore.Parameter(mindspore.Tensor(np.zeros((1, 1, 4), np.float32)))
        self.pos = mindspore.Parameter(mindspore.Tensor(np.zeros((1, 5, 4), np.float32)))

    def construct(self, x):
        tokens = self.fc(x).reshape(-1, 4, 4)
        cls = ops.broadcast_to(self.cls, (tokens.shape[0], 1, 4))
        joined = ops.cat((tokens, cls) if self.last else (cls, tokens), axis=1)
        return joined + self.pos


class _MsClassNet(msnn.Cell):
    def __init__(self, last: bool) -> None:
        super().__init__()
        self.embed, self.head = _MsClassToken(last), msnn.Dense(20, 5)

    def construct(self, x):
        return self.head(self.embed(x).reshape(x.shape[0], -1))


def torch_class_token_first() -> tnn.Module:
    return _TorchClassNet()


def ms_class_token(last: bool = False) -> msnn.Cell:
    return _MsClassNet(last)


# Features laid out as a 4×4 map per sample: torch's module transposes each map, the port's only
# reshapes (ViT's patches ``flatten(2).transpose(1, 2)`` ported as ``reshape(n, -1, d)``): the
# same values in another order, along no one axis.
class _TorchMaps(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = tnn.Linear(FEATURES, FEATURES)

    def forward(self, x):
        return self.fc(x).reshape(-1, 4, 4).transpose(1, 2)


class _TorchMapsNet(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.maps, self.head = _TorchMaps(), tnn.Linear(FEATURES, 5)

    def forward(self, x):
        return self.head(self.maps(x).flatten(1))


class _MsMaps(msnn.Cell):
    def __init__(self, transposed: bool) -> None:
        super().__init__()
        self.transposed = transposed
        self.fc = msnn.Dense(FEATURES, FEATURES)

    def construct(self, x):
        maps = self.fc(x).reshape(-1, 4, 4)
        return maps.transpose(0, 2, 1) if self.transposed else maps


class _MsMapsNet(msnn.Cell):
    def __init__(self, transposed: bool) -> None:
        super().__init__()
        self.maps, self.head = _MsMaps(transposed), msnn.Dense(FEATURES, 5)

    def construct(self, x):
        return self.head(self.maps(x).reshape(x.shape[0], -1))


def torch_maps_transposed() -> tnn.Module:
    return _TorchMapsNet()


def ms_maps(transposed: bool = True) -> msnn.Cell:
    return _MsMapsNet(transposed)


# Those maps' first rows read as a class token by the head; the port may average the rows.
class _TorchFirstRow(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.maps, self.head = _TorchMaps(), tnn.Linear(4, 5)

    def forward(self, x):
        return self.head(self.maps(x)[:, 0])


class _MsRowsPooled(msnn.Cell):
    def __init__(self, mean: bool) -> None:
        super().__init__()
        self.mean = mean
        self.maps, self.head = _MsMaps(transposed=True), msnn.Dense(4, 5)

    def construct(self, x):
        maps = self.maps(x)
        return self.head(maps.mean(1) if self.mean else maps[:, 0])


def torch_first_row() -> tnn.Module:
    return _TorchFirstRow()


def ms_rows_pooled(mean: bool = False) -> msnn.Cell:
    return _MsRowsPooled(mean)


# A head over the first layer's output, run before the second layer, whose output torch adds;
# the port's head reads the model's input, after the second layer: the two heads read other
# inputs at other places, and stay unpaired.
class _TorchHeadBeforeTheSecondLayer(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = tnn.Linear(FEATURES, FEATURES)
        self.head = tnn.Linear(FEATURES, 5)
        self.fc2 = tnn.Linear(FEATURES, 5)

    def forward(self, x):
        hidden = self.fc1(x)
        logits = self.head(hidden)
        return logits + self.fc2(hidden)


class _MsHeadOverTheInput(msnn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = msnn.Dense(FEATURES, FEATURES)
        self.head = msnn.Dense(FEATURES, 5)
        self.fc2 = msnn.Dense(FEATURES, 5)

    def construct(self, x):
        hidden = self.fc1(x)
        second = self.fc2(hidden)
        return self.head(x) + second


def torch_head_before_the_second_layer() -> tnn.Module:
    return _TorchHeadBeforeTheSecondLayer()


def ms_head_over_the_input() -> msnn.Cell:
    return _MsHeadOverTheInput()


# A block returning its output and a bias it passes on, broadcast to the batch in torch and
# (1, ...) in the port (Hugging Face's T5 passes its position bias on so).
class _TorchPassingBias(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = tnn.Linear(FEATURES, FEATURES)
        self.bias_table = tnn.Embedding(2, FEATURES)

    def forward(self, x):
        bias = self.bias_table(torch.zeros(1, dtype=torch.long)).expand(x.shape[0], -1)
        return self.fc(x) + bias, bias


class _TorchBiasPassed(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = _TorchPassingBias()
        self.head = tnn.Linear(FEATURES, 5)

    def forward(self, x):
        hidden, bias = self.block(x)
        return self.head(hidden + bias)


class _MsPassingBias(msnn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.fc = msnn.Dense(FEATURES, FEATURES)
        self.bias_table = msnn.Embedding(2, FEATURES)

    def construct(self, x):
        bias = self.bias_table(ops.zeros(1, mindspore.int32))
        return self.fc(x) + bias, bias


class _MsBiasPassed(msnn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.block = _MsPassingBias()
        self.head = msnn.Dense(FEATURES, 5)

    def construct(self, x):
        hidden, bias = self.block(x)
        return self.head(hidden + bias)


def torch_bias_passed() -> tnn.Module:
    return _TorchBiasPassed()


def ms_bias_passed_once() -> msnn.Cell:
    return _MsBiasPassed()


def torch_selu_mlp() -> tnn.Module:
    return _torch_mlp(tnn.SELU())


def ms_selu_mlp() -> msnn.Cell:
    """nn.SeLU as is: MindSpore 2.8.0's gradient of it is wrong below zero."""
    return _ms_mlp(msnn.SeLU())


class _SeluByExpm1(msnn.Cell):
    """SELU from operations whose gradients are right: scale·(relu(x) + alpha·expm1(min(x, 0)))."""

    def construct(self, x):
        alpha, scale = 1.6732632423543772, 1.0507009873554805
        return scale * (ops.relu(x) + alpha * ops.expm1(ops.minimum(x, 0.0)))


def ms_selu_mlp_by_expm1() -> msnn.Cell:
    return _ms_mlp(_SeluByExpm1())


def torch_tanh_mlp() -> tnn.Module:
    return _torch_mlp(tnn.Tanh())


def ms_tanh_mlp() -> msnn.Cell:
    """nn.Tanh as is: MindSpore 2.8.0's CPU tanh is off by up to 1e-4 where 2 < |x| < 8."""
    return _ms_mlp(msnn.Tanh())


class _TanhByExpm1(msnn.Cell):
    """tanh as e / (e + 2), e = expm1(2x), x clamped to ±9 (where tanh rounds to ±1)."""

    def construct(self, x):
        e = ops.expm1(2 * ops.clamp(x, -9.0, 9.0))
        return e / (e + 2)


def ms_tanh_mlp_by_expm1() -> msnn.Cell:
    return _ms_mlp(_TanhByExpm1())


class _SlightlyScaledTanh(_TanhByExpm1):
    """A port's own small error in a tanh layer: its input scaled by 1.001."""

    def construct(self, x):
        return super().construct(x * 1.001)


def ms_tanh_mlp_slightly_scaled() -> msnn.Cell:
    return _ms_mlp(_SlightlyScaledTanh())


def ms_dense_activation_mlp() -> msnn.Cell:
    """torch's Linear then ReLU as MindSpore's idiom: nn.Dense(activation="relu")."""
    return msnn.SequentialCell([msnn.Dense(FEATURES, FEATURES, activation="relu"),
                                msnn.Dense(FEATURES, 5)])


def ms_dense_activation_twice_mlp() -> msnn.Cell:
    """nn.Dense(activation="gelu") and then the ReLU torch runs: one activation too many."""
    return msnn.SequentialCell([msnn.Dense(FEATURES, FEATURES, activation="gelu"), msnn.ReLU(),
                                msnn.Dense(FEATURES, 5)])


def torch_mish_mlp() -> tnn.Module:
    return _torch_mlp(tnn.Mish())


def ms_mish_mlp() -> msnn.Cell:
    """nn.Mish as is: MindSpore 2.8.0's CPU Mish gradient is off by up to 9e-4 where 2 < x < 8."""
    return _ms_mlp(msnn.Mish())


class _MishByExpm1(msnn.Cell):
    """Mish as x·tanh(softplus(x)), tanh written as e / (e + 2), e = expm1(2·softplus)."""

    def construct(self, x):
        softplus = ops.where(x > 20.0, x, ops.log1p(ops.exp(ops.minimum(x, 20.0))))
        e = ops.expm1(2 * ops.clamp(softplus, -9.0, 9.0))
        return x * (e / (e + 2))


def ms_mish_mlp_by_expm1() -> msnn.Cell:
    return _ms_mlp(_MishByExpm1())


class _HalfGradientReLU(msnn.Cell):
    """ReLU whose forward is right and whose backward passes half the gradient."""

    def construct(self, x):
        return _half_gradient(ops.relu(x))


def torch_relu_mlp() -> tnn.Module:
    return _torch_mlp(tnn.ReLU())


def ms_relu_mlp_half_gradient() -> msnn.Cell:
    return _ms_mlp(_HalfGradientReLU())


def ms_relu_mlp_without_a_bias() -> msnn.Cell:
    """Its first layer built with has_bias=False (mindcv's CaiT: timm's attention layers have
    biases)."""
    return msnn.SequentialCell([msnn.Dense(FEATURES, FEATURES, has_bias=False), msnn.ReLU(),
                                msnn.Dense(FEATURES, 5)])


# Two outputs, as a classifier with an auxiliary head returns in training (GoogLeNet's).
class _TorchTwoHeads(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = tnn.Sequential(tnn.Conv2d(3, 8, 3, padding=1), tnn.ReLU(),
                                   tnn.AdaptiveAvgPool2d(1), tnn.Flatten())
        self.head, self.aux = tnn.Linear(8, 10), tnn.Linear(8, 10)

    def forward(self, x):
        features = self.body(x)
        return self.head(features), self.aux(features)


class _MsTwoHeads(msnn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.body = msnn.SequentialCell([
            msnn.Conv2d(3, 8, 3, pad_mode="pad", padding=1, has_bias=True), msnn.ReLU(),
            GlobalAvgPool(), msnn.Flatten()])
        self.head, self.aux = msnn.Dense(8, 10), msnn.Dense(8, 10)

    def construct(self, x):
        features = self.body(x)
        return self.head(features), self.aux(features)


def torch_two_heads() -> tnn.Module:
    return _TorchTwoHeads()


class _TorchOutputObject(_TorchTwoHeads):
    """Its logits in a dict, as a Hugging Face model returns them (a ModelOutput)."""

    def forward(self, x):
        return {"logits": self.head(self.body(x))}


def torch_output_object() -> tnn.Module:
    return _TorchOutputObject()


def ms_two_heads() -> msnn.Cell:
    return _MsTwoHeads()


# A Transformer encoder layer over token ids and an attention mask: attention written in the
# forward (matmul, softmax, masking), LayerNorm, a GELU feed-forward, masked mean pooling.
class _TorchEncoder(tnn.Module):
    def __init__(self, width: int = WIDTH) -> None:
        import torch
        super().__init__()
        self.embedding = tnn.Embedding(VOCABULARY, width)
        self.position = tnn.Parameter(0.02 * torch.randn(TOKENS, width))
        self.query, self.key, self.value = (tnn.Linear(width, width) for _ in range(3))
        self.attention_norm = tnn.LayerNorm(width)
        self.feed_forward = tnn.Sequential(tnn.Linear(width, 4 * width), tnn.GELU(),
                                           tnn.Linear(4 * width, width))
        self.output_norm = tnn.LayerNorm(width)
        self.classifier = tnn.Linear(width, 5)

    def forward(self, tokens, mask):
        import torch
        h = self.embedding(tokens) + self.position
        scores = self.query(h) @ self.key(h).transpose(1, 2) / h.shape[-1] ** 0.5
        scores = scores.masked_fill(mask[:, None, :] == 0, -1e9)
        h = self.attention_norm(h + torch.softmax(scores, -1) @ self.value(h))
        h = self.output_norm(h + self.feed_forward(h))
        pooled = (h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        return self.classifier(pooled)


class _MsEncoder(msnn.Cell):
    def __init__(self, width: int = WIDTH, scale: Optional[float] = None) -> None:
        import mindspore as ms
        from mindspore.common.initializer import Normal
        super().__init__()
        self.embedding = msnn.Embedding(VOCABULARY, width)
        self.position = ms.Parameter(ms.Tensor(shape=(TOKENS, width), dtype=ms.float32,
                                               init=Normal(0.02)), name="position")
        self.query, self.key, self.value = (msnn.Dense(width, width) for _ in range(3))
        self.attention_norm = msnn.LayerNorm((width,), epsilon=1e-5)
        self.feed_forward = msnn.SequentialCell([
            msnn.Dense(width, 4 * width), msnn.GELU(approximate=False),
            msnn.Dense(4 * width, width)])
        self.output_norm = msnn.LayerNorm((width,), epsilon=1e-5)
        self.classifier = msnn.Dense(width, 5)
        self.scale = scale if scale is not None else width ** -0.5

    def construct(self, tokens, mask):
        from mindspore import ops
        h = self.embedding(tokens) + self.position
        scores = ops.matmul(self.query(h), self.key(h).swapaxes(1, 2)) * self.scale
        scores = ops.masked_fill(scores, (mask == 0).expand_dims(1), -1e9)
        h = self.attention_norm(h + ops.matmul(ops.softmax(scores, -1), self.value(h)))
        h = self.output_norm(h + self.feed_forward(h))
        pooled = (h * mask.expand_dims(-1)).sum(1) / mask.sum(1, keepdims=True)
        return self.classifier(pooled)


def torch_encoder() -> tnn.Module:
    return _TorchEncoder()


def ms_encoder() -> msnn.Cell:
    return _MsEncoder()


def ms_encoder_unscaled_attention() -> msnn.Cell:
    """Attention scores scaled by 1/width instead of 1/√width."""
    return _MsEncoder(scale=1 / WIDTH)


class _Float32Constant(tnn.Module):
    """Multiplies its input by a float32 matrix made in forward: fine in float32, a dtype
    error when the model runs in float64."""

    def forward(self, x):
        import torch
        return x @ torch.eye(x.shape[-1], dtype=torch.float32)


def torch_tiny_float32_constant() -> tnn.Module:
    return _torch_tiny(_Float32Constant())


class _RefusesSavedTensorHooks(tnn.Module):
    """A forward that refuses autograd's saved-tensor hooks, as some torch.func code does (an
    error if any are set when it runs)."""

    def forward(self, x):
        import torch
        with torch.autograd.graph.disable_saved_tensors_hooks("no saved-tensor hooks here"):
            return x * 2


def torch_tiny_refusing_saved_tensor_hooks() -> tnn.Module:
    return _torch_tiny(_RefusesSavedTensorHooks())


# The tiny net held as `self.module`: every parameter name starts with "module.", as in the
# state dict of a model wrapped in DataParallel.
class _TorchHolding(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.module = torch_tiny()

    def forward(self, x):
        return self.module(x)


class _MsHolding(msnn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.module = ms_tiny()

    def construct(self, x):
        return self.module(x)


def torch_holding_tiny() -> tnn.Module:
    return _TorchHolding()


def ms_holding_tiny() -> msnn.Cell:
    return _MsHolding()


# Activation checkpointing: the second conv-BN-ReLU block runs again in the backward
# (torch.utils.checkpoint, reentrant or not; MindSpore's Cell.recompute()), BatchNorm updates
# and all. The first block gets no gradient where it runs in a reentrant checkpoint (its input,
# the image, needs none) or under torch.no_grad() (a frozen backbone, as people write it). An
# auxiliary head the forward never calls gets none either.
class _TorchBlocks(tnn.Module):
    def __init__(self, checkpoint: Optional[str] = None, aux: bool = False,
                 first: Optional[str] = None) -> None:
        super().__init__()
        self.block1 = tnn.Sequential(tnn.Conv2d(3, 8, 3, padding=1, bias=False),
                                     tnn.BatchNorm2d(8), tnn.ReLU())
        self.block2 = tnn.Sequential(tnn.Conv2d(8, 8, 3, stride=2, padding=1, bias=False),
                                     tnn.BatchNorm2d(8), tnn.ReLU())
        self.head = tnn.Linear(8, 10)
        if aux:
            self.aux = tnn.Linear(8, 10)
        self.checkpoint, self.first = checkpoint, first

    def forward(self, x):
        if self.first == "checkpointed, reentrant":
            x = torch.utils.checkpoint.checkpoint(self.block1, x, use_reentrant=True)
        elif self.first == "no_grad":
            with torch.no_grad():
                x = self.block1(x)
        else:
            x = self.block1(x)
        if self.checkpoint is None:
            x = self.block2(x)
        else:
            x = torch.utils.checkpoint.checkpoint(self.block2, x,
                                                  use_reentrant=self.checkpoint == "reentrant")
        return self.head(x.mean((2, 3)))


class _MsBlocks(msnn.Cell):
    def __init__(self, recompute: Optional[str] = None, aux: bool = False,
                 frozen_first: bool = False) -> None:
        super().__init__()
        self.block1 = msnn.SequentialCell(msnn.Conv2d(3, 8, 3, pad_mode="pad", padding=1),
                                          msnn.BatchNorm2d(8, momentum=0.9), msnn.ReLU())
        self.block2 = msnn.SequentialCell(
            msnn.Conv2d(8, 8, 3, stride=2, pad_mode="pad", padding=1),
            msnn.BatchNorm2d(8, momentum=0.9), msnn.ReLU())
        if recompute == "block":
            self.block2.recompute()
        elif recompute == "cells":      # each cell holds its recomputation as a child cell
            for cell in self.block2:
                cell.recompute()
        self.head = msnn.Dense(8, 10)
        if aux:
            self.aux = msnn.Dense(8, 10)
        self.frozen_first = frozen_first

    def construct(self, x):
        x = self.block1(x)
        if self.frozen_first:           # its port: no gradient into block1
            x = mindspore.ops.stop_gradient(x)
        return self.head(self.block2(x).mean((2, 3)))


def torch_blocks() -> tnn.Module:
    return _TorchBlocks()


def torch_blocks_checkpointed() -> tnn.Module:
    return _TorchBlocks("non-reentrant")


def torch_blocks_checkpointed_reentrant() -> tnn.Module:
    return _TorchBlocks("reentrant")


def torch_blocks_first_checkpointed_reentrant() -> tnn.Module:
    return _TorchBlocks(first="checkpointed, reentrant")


def torch_blocks_first_no_grad() -> tnn.Module:
    return _TorchBlocks(first="no_grad")


def torch_blocks_aux() -> tnn.Module:
    return _TorchBlocks(aux=True)


def ms_blocks() -> msnn.Cell:
    return _MsBlocks()


def ms_blocks_recomputed() -> msnn.Cell:
    return _MsBlocks(recompute="block")


def ms_blocks_cells_recomputed() -> msnn.Cell:
    return _MsBlocks(recompute="cells")


def ms_blocks_aux() -> msnn.Cell:
    return _MsBlocks(aux=True)


def ms_blocks_first_stopped() -> msnn.Cell:
    return _MsBlocks(frozen_first=True)


# Weight normalisation (a vocoder's convs, say): torch's parametrization holds each conv's
# magnitude g and direction v as parametrizations.weight.original0 / original1; the port holds
# them as weight_g / weight_v and computes the weight g·v/‖v‖ itself. Spectral normalisation (a
# GAN discriminator's): torch's holds the weight as parametrizations.weight.original and its
# power iteration's vectors as parametrizations.weight.0._u / _v, updated in each training
# forward (u from v, then v from u); the port holds weight_orig, weight_u and weight_v.
class _TorchWeightNormed(tnn.Module):
    def __init__(self, norm: str = "weight_norm") -> None:
        super().__init__()
        normed = getattr(tnn.utils.parametrizations, norm)
        self.conv1 = normed(tnn.Conv2d(3, 8, 3, padding=1))
        self.act1 = tnn.ReLU()
        self.conv2 = normed(tnn.Conv2d(8, 8, 3, padding=1))
        self.act2 = tnn.ReLU()
        self.head = tnn.Linear(8, 10)

    def forward(self, x):
        return self.head(self.act2(self.conv2(self.act1(self.conv1(x)))).mean((2, 3)))


def _ms_parameter(shape: Tuple[int, ...], requires_grad: bool = True) -> mindspore.Parameter:
    return mindspore.Parameter(mindspore.Tensor(np.ones(shape, np.float32)),
                               requires_grad=requires_grad)


class _MsWeightNormedConv(msnn.Cell):
    def __init__(self, cin: int, cout: int, norm_axes: Tuple[int, ...]) -> None:
        super().__init__()
        self.weight_g = _ms_parameter((cout, 1, 1, 1))
        self.weight_v = _ms_parameter((cout, cin, 3, 3))
        self.bias = _ms_parameter((cout,))
        self.norm_axes = norm_axes

    def construct(self, x):
        v = self.weight_v
        weight = self.weight_g * v / ops.sqrt((v * v).sum(axis=self.norm_axes, keepdims=True))
        return ops.conv2d(x, weight, self.bias, pad_mode="pad", padding=1)


def _unit(x):
    return x / ops.maximum(ops.sqrt((x * x).sum()), mindspore.Tensor(1e-12, mindspore.float32))


class _MsSpectralNormedConv(msnn.Cell):
    def __init__(self, cin: int, cout: int, u_first: bool) -> None:
        super().__init__()
        self.weight_orig = _ms_parameter((cout, cin, 3, 3))
        self.bias = _ms_parameter((cout,))
        self.weight_u = _ms_parameter((cout,), requires_grad=False)
        self.weight_v = _ms_parameter((cin * 9,), requires_grad=False)
        self.u_first = u_first

    def construct(self, x):
        matrix = self.weight_orig.reshape(self.weight_orig.shape[0], -1)
        if self.training:
            fixed = ops.stop_gradient(matrix)
            if self.u_first:
                ops.assign(self.weight_u, _unit(ops.matmul(fixed, self.weight_v)))
                ops.assign(self.weight_v, _unit(ops.matmul(fixed.T, self.weight_u)))
            else:
                ops.assign(self.weight_v, _unit(ops.matmul(fixed.T, self.weight_u)))
                ops.assign(self.weight_u, _unit(ops.matmul(fixed, self.weight_v)))
        u, v = ops.stop_gradient(self.weight_u), ops.stop_gradient(self.weight_v)
        sigma = (u * ops.matmul(matrix, v)).sum()
        return ops.conv2d(x, self.weight_orig / sigma, self.bias, pad_mode="pad", padding=1)


class _MsWeightNormed(msnn.Cell):
    def __init__(self, conv=lambda cin, cout: _MsWeightNormedConv(cin, cout, (1, 2, 3))) -> None:
        super().__init__()
        self.conv1 = conv(3, 8)
        self.act1 = msnn.ReLU()
        self.conv2 = conv(8, 8)
        self.act2 = msnn.ReLU()
        self.head = msnn.Dense(8, 10)

    def construct(self, x):
        return self.head(self.act2(self.conv2(self.act1(self.conv1(x)))).mean((2, 3)))


def torch_weight_normed() -> tnn.Module:
    return _TorchWeightNormed()


def ms_weight_normed() -> msnn.Cell:
    return _MsWeightNormed()


def ms_weight_normed_per_input() -> msnn.Cell:
    """‖v‖ over the output channels and the kernel, per input channel: the wrong axes."""
    return _MsWeightNormed(lambda cin, cout: _MsWeightNormedConv(cin, cout, (0, 2, 3)))


def torch_spectral_normed() -> tnn.Module:
    return _TorchWeightNormed("spectral_norm")


def ms_spectral_normed() -> msnn.Cell:
    return _MsWeightNormed(lambda cin, cout: _MsSpectralNormedConv(cin, cout, u_first=True))


def ms_spectral_normed_v_first() -> msnn.Cell:
    """The power iteration of torch.nn.utils.spectral_norm, the older one: v from u first."""
    return _MsWeightNormed(lambda cin, cout: _MsSpectralNormedConv(cin, cout, u_first=False))


# A video clip's 3-D conv and BatchNorm3d: MindSpore's BatchNorm3d runs a BatchNorm2d it holds
# (bn2d) on the clip reshaped, and keeps its settings and statistics there.
class _TorchSpaceTimeMean(tnn.Module):
    def forward(self, x):
        return x.mean((2, 3, 4))


def torch_video() -> tnn.Module:
    return tnn.Sequential(tnn.Conv3d(3, 8, 3, padding=1, bias=False), tnn.BatchNorm3d(8),
                          tnn.ReLU(), _TorchSpaceTimeMean(), tnn.Linear(8, 10))


def _ms_video(**norm_settings) -> msnn.Cell:
    return msnn.SequentialCell([
        msnn.Conv3d(3, 8, 3, pad_mode="pad", padding=1), msnn.BatchNorm3d(8, **norm_settings),
        msnn.ReLU(), _MsSpaceTimeMean(), msnn.Dense(8, 10)])


class _MsSpaceTimeMean(msnn.Cell):
    def construct(self, x):
        return x.mean((2, 3, 4))


def ms_video() -> msnn.Cell:
    return _ms_video(momentum=0.9)


def ms_video_momentum_as_torch() -> msnn.Cell:
    return _ms_video(momentum=0.1)


def ms_video_eps() -> msnn.Cell:
    return _ms_video(momentum=0.9, eps=1e-3)


# A conv net averaging between its convs in the forward, as torchvision's Inception3 does in
# its branch pools (F.avg_pool2d(x, 3, stride=1, padding=1), counting the padding), and its
# port, a pool cell (mindcv's: nn.AvgPool2d(3, pad_mode="same"), which does not count it).
class _TorchPooledInForward(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = tnn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.conv2 = tnn.Conv2d(4, 4, 1)
        self.fc = tnn.Linear(4, 10)

    def forward(self, x):
        y = tnn.functional.avg_pool2d(self.conv1(x), 3, stride=1, padding=1)
        return self.fc(self.conv2(y).mean((2, 3)))


class _MsPooledInCell(msnn.Cell):
    def __init__(self, pool: msnn.Cell, scale: float = 1.0) -> None:
        super().__init__()
        self.conv1 = msnn.Conv2d(3, 4, 3, stride=2, pad_mode="pad", padding=1, has_bias=True)
        self.pool = pool
        self.conv2 = msnn.Conv2d(4, 4, 1, has_bias=True)
        self.fc = msnn.Dense(4, 10)
        self.scale = scale

    def construct(self, x):
        return self.fc(self.conv2(self.pool(self.conv1(x) * self.scale)).mean((2, 3)))


def torch_pooled_in_forward() -> tnn.Module:
    return _TorchPooledInForward()


def ms_pooled_in_cell() -> msnn.Cell:
    return _MsPooledInCell(msnn.AvgPool2d(3, 1, pad_mode="pad", padding=1,
                                          count_include_pad=True))


def ms_pooled_in_cell_same_padded() -> msnn.Cell:
    return _MsPooledInCell(msnn.AvgPool2d(3, 1, pad_mode="same"))


def ms_pooled_in_cell_same_padded_scaled_first() -> msnn.Cell:
    """Its pool's input scaled in the construct too: no record holds what the pool reads."""
    return _MsPooledInCell(msnn.AvgPool2d(3, 1, pad_mode="same"), scale=1.5)


# A conv and a BatchNorm in a block applying ReLU in its forward, as torchvision's Inception3
# BasicConv2d does; its port holds a ReLU cell in the block, as mindcv's does. ``relu``: False
# applies none (the port's ReLU is then one too many).
class _TorchBasicConv(tnn.Module):
    def __init__(self, relu: bool) -> None:
        super().__init__()
        self.conv = tnn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False)
        self.bn = tnn.BatchNorm2d(8)
        self.relu = relu

    def forward(self, x):
        y = self.bn(self.conv(x))
        return tnn.functional.relu(y) if self.relu else y


class _TorchBasicConvNet(tnn.Module):
    def __init__(self, relu: bool) -> None:
        super().__init__()
        self.block = _TorchBasicConv(relu)
        self.fc = tnn.Linear(8, 10)

    def forward(self, x):
        return self.fc(self.block(x).mean((2, 3)))


class _MsBasicConv(msnn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.conv = msnn.Conv2d(3, 8, 3, stride=2, pad_mode="pad", padding=1)
        self.bn = msnn.BatchNorm2d(8, momentum=0.9)
        self.relu = msnn.ReLU()

    def construct(self, x):
        return self.relu(self.bn(self.conv(x)))


class _MsBasicConvNet(msnn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.block = _MsBasicConv()
        self.fc = msnn.Dense(8, 10)

    def construct(self, x):
        return self.fc(self.block(x).mean((2, 3)))


def torch_relu_in_forward() -> tnn.Module:
    return _TorchBasicConvNet(relu=True)


def torch_relu_left_out() -> tnn.Module:
    return _TorchBasicConvNet(relu=False)


def ms_relu_cell() -> msnn.Cell:
    return _MsBasicConvNet()


class _MsSkipping(msnn.SequentialCell):
    """ms_tiny's cells, its second BatchNorm (``4``) given torch's weights but never called."""

    def construct(self, x):
        for index, cell in enumerate(self.cell_list):
            if index != 4:
                x = cell(x)
        return x


def ms_tiny_skipping_a_norm() -> msnn.Cell:
    return _MsSkipping(list(_ms_tiny().cell_list))


# Self-attention over a 4×4 grid of patches whose torch model holds one fused qkv layer and a
# relative position bias gathered by an integer index (torchvision's Swin); the port holds q, k
# and v layers and the index as a frozen one-hot matrix multiplying the table (mindcv's Swin).
PATCHES, PATCH_WIDTH = 16, 8


def _relative_index(flipped: bool = False) -> np.ndarray:
    """(PATCHES, PATCHES): row i, column j -> i - j shifted to count from 0 (j - i flipped)."""
    rows, cols = np.meshgrid(np.arange(PATCHES), np.arange(PATCHES), indexing="ij")
    return (cols - rows if flipped else rows - cols) + PATCHES - 1


class _TorchFusedAttention(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.proj = tnn.Linear(PATCH_WIDTH, 3 * PATCH_WIDTH), \
            tnn.Linear(PATCH_WIDTH, PATCH_WIDTH)
        self.relative_position_bias_table = tnn.Parameter(0.5 * torch.randn(2 * PATCHES - 1))
        self.register_buffer("relative_position_index", torch.from_numpy(_relative_index()))

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        logits = q @ k.transpose(-2, -1) / PATCH_WIDTH ** 0.5
        bias = self.relative_position_bias_table[self.relative_position_index]
        return self.proj((logits + bias).softmax(dim=-1) @ v)


class _TorchFusedAttentionKeyUnbiased(_TorchFusedAttention):
    """Its qkv layer's bias applied with k's part zeroed, in the forward, as torchvision's
    SwinV2 does (a bias on k shifts every logit of a row alike, which softmax ignores)."""

    def forward(self, x):
        bias = self.qkv.bias.clone()
        bias[PATCH_WIDTH:2 * PATCH_WIDTH] = 0
        q, k, v = tnn.functional.linear(x, self.qkv.weight, bias).chunk(3, dim=-1)
        logits = q @ k.transpose(-2, -1) / PATCH_WIDTH ** 0.5
        bias = self.relative_position_bias_table[self.relative_position_index]
        return self.proj((logits + bias).softmax(dim=-1) @ v)


class _TorchPatchAttention(tnn.Module):
    def __init__(self, attention: Callable[[], tnn.Module]) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = tnn.Conv2d(3, PATCH_WIDTH, 4, stride=4)
        self.attn = attention()
        self.head = tnn.Linear(PATCH_WIDTH, 10)

    def forward(self, x):
        tokens = self.embed(x).flatten(2).transpose(1, 2)
        return self.head(self.attn(tokens).mean(dim=1))


class _MsOneHotRelativeBias(msnn.Cell):
    def __init__(self, flipped: bool) -> None:
        super().__init__()
        self.relative_position_bias_table = mindspore.Parameter(
            mindspore.Tensor(np.zeros(2 * PATCHES - 1, np.float32)))
        one_hot = np.eye(2 * PATCHES - 1, dtype=np.float32)[_relative_index(flipped).reshape(-1)]
        self.index = mindspore.Parameter(mindspore.Tensor(one_hot), requires_grad=False)

    def construct(self):
        return ops.matmul(self.index, self.relative_position_bias_table).reshape(PATCHES, PATCHES)


class _MsSplitAttention(msnn.Cell):
    def __init__(self, flipped: bool, biased: Tuple[bool, bool, bool] = (True, True, True)
                 ) -> None:
        super().__init__()
        self.q, self.k, self.v = (msnn.Dense(PATCH_WIDTH, PATCH_WIDTH, has_bias=bias)
                                  for bias in biased)
        self.proj = msnn.Dense(PATCH_WIDTH, PATCH_WIDTH)
        self.relative_bias = _MsOneHotRelativeBias(flipped)

    def construct(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        logits = ops.matmul(q, k.swapaxes(-2, -1)) / PATCH_WIDTH ** 0.5
        return self.proj(ops.matmul(ops.softmax(logits + self.relative_bias(), axis=-1), v))


class _MsPatchAttention(msnn.Cell):
    def __init__(self, attention: msnn.Cell) -> None:
        super().__init__()
        self.embed = msnn.Conv2d(3, PATCH_WIDTH, 4, stride=4, pad_mode="valid", has_bias=True)
        self.attn = attention
        self.head = msnn.Dense(PATCH_WIDTH, 10)

    def construct(self, x):
        tokens = self.embed(x).flatten(start_dim=2).swapaxes(1, 2)
        return self.head(self.attn(tokens).mean(axis=1))


def torch_patch_attention() -> tnn.Module:
    return _TorchPatchAttention(_TorchFusedAttention)


def ms_patch_attention() -> msnn.Cell:
    return _MsPatchAttention(_MsSplitAttention(flipped=False))


def ms_patch_attention_flipped_index() -> msnn.Cell:
    """The relative index built j - i where torch's is i - j."""
    return _MsPatchAttention(_MsSplitAttention(flipped=True))


def torch_patch_attention_key_unbiased() -> tnn.Module:
    return _TorchPatchAttention(_TorchFusedAttentionKeyUnbiased)


def ms_patch_attention_key_unbiased() -> msnn.Cell:
    """Its k layer without a bias (mindcv's SwinV2)."""
    return _MsPatchAttention(_MsSplitAttention(flipped=False, biased=(True, False, True)))


def ms_patch_attention_value_unbiased() -> msnn.Cell:
    """Its v layer without a bias: a bias softmax does not ignore."""
    return _MsPatchAttention(_MsSplitAttention(flipped=False, biased=(True, True, False)))


class _BatchNormAct(tnn.BatchNorm2d):
    """timm's BatchNormAct2d: a BatchNorm whose forward applies its ``drop`` (an Identity) and
    its ``act`` after normalising."""

    def __init__(self, channels: int) -> None:
        super().__init__(channels)
        self.drop, self.act = tnn.Identity(), tnn.ReLU()

    def forward(self, x):
        return self.act(self.drop(super().forward(x)))


def torch_tiny_norm_act() -> tnn.Module:
    """The tiny net with each BatchNorm and the ReLU after it one BatchNormAct2d (timm's)."""
    torch.manual_seed(0)
    return tnn.Sequential(tnn.Conv2d(3, 8, 3, padding=1, bias=False), _BatchNormAct(8),
                          tnn.Conv2d(8, 8, 3, stride=2, padding=1, bias=False), _BatchNormAct(8),
                          tnn.AdaptiveAvgPool2d(1), tnn.Flatten(), tnn.Linear(8, 10))


class _TorchSiluBlock(tnn.Module):
    """A conv, a SiLU named act1, a conv, pooled (timm's squeeze-excite names its act1)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv1, self.act1 = tnn.Conv2d(3, 8, 3, padding=1), tnn.SiLU()
        self.conv2, self.fc = tnn.Conv2d(8, 8, 3, padding=1), tnn.Linear(8, 10)

    def forward(self, x):
        return self.fc(self.conv2(self.act1(self.conv1(x))).mean(dim=(2, 3)))


class _MsReluBlock(msnn.Cell):
    """Its port with a ReLU named act in the SiLU's place (mindcv's MixNet squeeze-excite), or
    another cell."""

    def __init__(self, act: Optional[msnn.Cell] = None) -> None:
        super().__init__()
        self.conv1 = msnn.Conv2d(3, 8, 3, pad_mode="pad", padding=1, has_bias=True)
        self.act, self.fc = act or msnn.ReLU(), msnn.Dense(8, 10)
        self.conv2 = msnn.Conv2d(8, 8, 3, pad_mode="pad", padding=1, has_bias=True)

    def construct(self, x):
        return self.fc(self.conv2(self.act(self.conv1(x))).mean(axis=(2, 3)))


def torch_silu_block() -> tnn.Module:
    return _TorchSiluBlock()


def ms_relu_block() -> msnn.Cell:
    return _MsReluBlock()


def ms_softmax_block() -> msnn.Cell:
    """A softmax over the channels in the SiLU's place."""
    return _MsReluBlock(msnn.Softmax(axis=1))


class _MsWrapped(msnn.Cell):
    """A cell holding one conv (mindcv's MixNet wraps each conv so)."""

    def __init__(self, conv: msnn.Cell) -> None:
        super().__init__()
        self.conv = conv

    def construct(self, x):
        return self.conv(x)


def ms_tiny_wrapped_convs() -> msnn.Cell:
    """The tiny port with each conv in a cell of its own."""
    return msnn.SequentialCell([
        _MsWrapped(msnn.Conv2d(3, 8, 3, pad_mode="pad", padding=1)),
        msnn.BatchNorm2d(8, momentum=0.9), msnn.ReLU(),
        _MsWrapped(msnn.Conv2d(8, 8, 3, stride=2, pad_mode="pad", padding=1)),
        msnn.BatchNorm2d(8, momentum=0.9), msnn.ReLU(), GlobalAvgPool(), msnn.Flatten(),
        msnn.Dense(8, 10)])


class _TorchTwoBranches(tnn.Module):
    """A RepVGG block as timm writes it: a 1×1 and a 3×3 branch summed (1×1 run first), an
    Identity ``drop_path`` on the sum, the input added, a ReLU."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv_1x1, self.conv_kxk = tnn.Conv2d(3, 3, 1), tnn.Conv2d(3, 3, 3, padding=1)
        self.drop_path, self.act = tnn.Identity(), tnn.ReLU()
        self.fc = tnn.Linear(3, 10)

    def forward(self, x):
        y = self.act(self.drop_path(self.conv_1x1(x) + self.conv_kxk(x)) + x)
        return self.fc(y.mean(dim=(2, 3)))


class _MsTwoBranches(msnn.Cell):
    """Its port as mindcv writes it: the 3×3 branch run first, an Identity ``se`` after adding
    the input."""

    def __init__(self) -> None:
        super().__init__()
        self.rbr_dense = msnn.Conv2d(3, 3, 3, pad_mode="pad", padding=1, has_bias=True)
        self.rbr_1x1 = msnn.Conv2d(3, 3, 1, has_bias=True)
        self.se, self.nonlinearity, self.fc = msnn.Identity(), msnn.ReLU(), msnn.Dense(3, 10)

    def construct(self, x):
        y = self.nonlinearity(self.se(self.rbr_dense(x) + self.rbr_1x1(x) + x))
        return self.fc(y.mean(axis=(2, 3)))


def torch_two_branches() -> tnn.Module:
    return _TorchTwoBranches()


def ms_two_branches_swapped() -> msnn.Cell:
    return _MsTwoBranches()


class _TorchScale(tnn.Module):
    """timm's LayerScale2d: a per-channel scale in a module of its own."""

    def __init__(self, value: float) -> None:
        super().__init__()
        self.scale = tnn.Parameter(torch.full((8,), value))

    def forward(self, x):
        return x * self.scale.view(1, -1, 1, 1)


class _TorchScaledBlock(tnn.Module):
    """Two residual convs, each scaled by a LayerScale module (timm's PoolFormer block)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.layer_scale1 = tnn.Conv2d(8, 8, 1), _TorchScale(0.5)
        self.conv2, self.layer_scale2 = tnn.Conv2d(8, 8, 1), _TorchScale(0.25)

    def forward(self, x):
        x = x + self.layer_scale1(self.conv1(x))
        return x + self.layer_scale2(self.conv2(x))


class _MsScaledBlock(msnn.Cell):
    """Its port as mindcv writes PoolFormer's: the scales parameters of the block itself."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = msnn.Conv2d(8, 8, 1, has_bias=True)
        self.conv2 = msnn.Conv2d(8, 8, 1, has_bias=True)
        self.layer_scale_1 = mindspore.Parameter(mindspore.Tensor(np.ones(8, np.float32)))
        self.layer_scale_2 = mindspore.Parameter(mindspore.Tensor(np.ones(8, np.float32)))

    def construct(self, x):
        x = x + self.layer_scale_1.reshape(1, -1, 1, 1) * self.conv1(x)
        return x + self.layer_scale_2.reshape(1, -1, 1, 1) * self.conv2(x)


class _TorchScaledNet(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stem, self.block = tnn.Conv2d(3, 8, 3, padding=1), _TorchScaledBlock()
        self.fc = tnn.Linear(8, 10)

    def forward(self, x):
        return self.fc(self.block(self.stem(x)).mean(dim=(2, 3)))


class _MsScaledNet(msnn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.stem = msnn.Conv2d(3, 8, 3, pad_mode="pad", padding=1, has_bias=True)
        self.block, self.fc = _MsScaledBlock(), msnn.Dense(8, 10)

    def construct(self, x):
        return self.fc(self.block(self.stem(x)).mean(axis=(2, 3)))


def torch_scaled_block() -> tnn.Module:
    return _TorchScaledNet()


def ms_scaled_block() -> msnn.Cell:
    return _MsScaledNet()


class _TorchNormedBlock(tnn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm1, self.conv = tnn.BatchNorm2d(width), tnn.Conv2d(width, width, 1)

    def forward(self, x):
        return x + self.conv(self.norm1(x))


class _TorchStage(tnn.Module):
    """timm's PVTv2 stage: its downsampling layer, its blocks and its norm in one module."""

    def __init__(self, width_in: int, width: int) -> None:
        super().__init__()
        self.downsample = tnn.Sequential(tnn.Conv2d(width_in, width, 2, stride=2),
                                         tnn.BatchNorm2d(width))
        self.blocks = tnn.Sequential(_TorchNormedBlock(width))
        self.norm = tnn.BatchNorm2d(width)

    def forward(self, x):
        return self.norm(self.blocks(self.downsample(x)))


class _TorchStagedNet(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stages = tnn.ModuleList([_TorchStage(3, 8), _TorchStage(8, 16)])
        self.fc = tnn.Linear(16, 10)
        for module in self.modules():   # norms told apart by their values
            if isinstance(module, tnn.BatchNorm2d):
                tnn.init.uniform_(module.weight, 0.5, 1.5)
                tnn.init.uniform_(module.bias, -0.5, 0.5)

    def forward(self, x):
        for stage in self.stages:
            x = stage(x)
        return self.fc(x.mean(dim=(2, 3)))


class _MsNormedBlock(msnn.Cell):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm1 = msnn.BatchNorm2d(width, momentum=0.9)
        self.conv = msnn.Conv2d(width, width, 1, has_bias=True)

    def construct(self, x):
        return x + self.conv(self.norm1(x))


class _MsStagedNet(msnn.Cell):
    """Its port as mindcv writes PVTv2: every stage's downsampling layer in one list, then
    every stage's blocks, then every stage's norm: the parameters in another order."""

    def __init__(self) -> None:
        super().__init__()
        self.downsamples = msnn.CellList([
            msnn.SequentialCell(msnn.Conv2d(a, b, 2, stride=2, has_bias=True),
                                msnn.BatchNorm2d(b, momentum=0.9)) for a, b in ((3, 8), (8, 16))])
        self.blocks = msnn.CellList([msnn.SequentialCell(_MsNormedBlock(w)) for w in (8, 16)])
        self.norms = msnn.CellList([msnn.BatchNorm2d(w, momentum=0.9) for w in (8, 16)])
        self.fc = msnn.Dense(16, 10)

    def construct(self, x):
        for downsample, blocks, norm in zip(self.downsamples, self.blocks, self.norms):
            x = norm(blocks(downsample(x)))
        return self.fc(x.mean(axis=(2, 3)))


def torch_staged() -> tnn.Module:
    return _TorchStagedNet()


def ms_staged_apart() -> msnn.Cell:
    return _MsStagedNet()


# Attention whose q, k and v layers torch holds apart (BERT's query, key and value; timm's class
# attention) and the port fuses into one qkv layer (mindcv's XCiT): the reverse of Swin's split.
class _TorchSeparateAttention(tnn.Module):
    """Its softmax written as a function, its attention weights through a Dropout (of rate 0,
    timm's attn_drop)."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.proj = (tnn.Linear(PATCH_WIDTH, PATCH_WIDTH)
                                             for _ in range(4))
        self.attn_drop = tnn.Dropout(0.0)

    def forward(self, x):
        logits = self.q(x) @ self.k(x).transpose(-2, -1) / PATCH_WIDTH ** 0.5
        return self.proj(self.attn_drop(logits.softmax(dim=-1)) @ self.v(x))


class _MsFusedAttention(msnn.Cell):
    """Its softmax a cell (mindcv's ``self.softmax = nn.Softmax(axis=-1)``)."""

    def __init__(self, order: str, scale: float = PATCH_WIDTH ** -0.5) -> None:
        super().__init__()
        self.qkv = msnn.Dense(PATCH_WIDTH, 3 * PATCH_WIDTH)
        self.softmax = msnn.Softmax(axis=-1)
        self.attn_drop = msnn.Dropout(p=0.0)
        self.proj = msnn.Dense(PATCH_WIDTH, PATCH_WIDTH)
        self.order, self.scale = order, scale

    def construct(self, x):
        parts = dict(zip(self.order, ops.split(self.qkv(x), PATCH_WIDTH, axis=-1)))
        logits = ops.matmul(parts["q"], parts["k"].swapaxes(-2, -1)) * self.scale
        return self.proj(ops.matmul(self.attn_drop(self.softmax(logits)), parts["v"]))


def torch_patch_attention_apart() -> tnn.Module:
    return _TorchPatchAttention(_TorchSeparateAttention)


def ms_patch_attention_fused() -> msnn.Cell:
    return _MsPatchAttention(_MsFusedAttention("qkv"))


def ms_patch_attention_fused_read_kqv() -> msnn.Cell:
    """Its fused layer's output read as k, q, v: q and k swapped."""
    return _MsPatchAttention(_MsFusedAttention("kqv"))


def ms_patch_attention_fused_unscaled() -> msnn.Cell:
    """Its attention logits left unscaled (no 1/√width)."""
    return _MsPatchAttention(_MsFusedAttention("qkv", scale=1.0))


# A position encoding computed from a constant grid of coordinates: once for the batch and
# broadcast (timm's XCiT), or for each sample (mindcv's XCiT expands the grid first; timm's
# ConViT expands its relative indices, mindcv's broadcasts).
POSITIONS = np.stack(np.meshgrid(np.linspace(-1, 1, 4), np.linspace(-1, 1, 4),
                                 indexing="ij"))[None].astype(np.float32)      # 1, 2, 4, 4


class _TorchPositionEncoded(tnn.Module):
    def __init__(self, per_sample: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = tnn.Conv2d(3, 8, 4, stride=4)
        self.pos_proj = tnn.Conv2d(2, 8, 1)
        self.head = tnn.Linear(8, 10)
        self.register_buffer("grid", torch.from_numpy(POSITIONS), persistent=False)
        self.per_sample = per_sample

    def forward(self, x):
        grid = self.grid.expand(x.shape[0], -1, -1, -1) if self.per_sample else self.grid
        return self.head((self.embed(x) + self.pos_proj(grid)).relu().mean(dim=(2, 3)))


class _MsPositionEncoded(msnn.Cell):
    def __init__(self, per_sample: bool, grid: np.ndarray = POSITIONS) -> None:
        super().__init__()
        self.embed = msnn.Conv2d(3, 8, 4, stride=4, pad_mode="valid", has_bias=True)
        self.pos_proj = msnn.Conv2d(2, 8, 1, has_bias=True)
        self.head = msnn.Dense(8, 10)
        self.grid = mindspore.Tensor(grid)
        self.per_sample = per_sample

    def construct(self, x):
        grid = ops.tile(self.grid, (x.shape[0], 1, 1, 1)) if self.per_sample else self.grid
        return self.head(ops.relu(self.embed(x) + self.pos_proj(grid)).mean(axis=(2, 3)))


def torch_position_encoded_once() -> tnn.Module:
    return _TorchPositionEncoded(per_sample=False)


def torch_position_encoded_per_sample() -> tnn.Module:
    return _TorchPositionEncoded(per_sample=True)


def ms_position_encoded_once() -> msnn.Cell:
    return _MsPositionEncoded(per_sample=False)


def ms_position_encoded_per_sample() -> msnn.Cell:
    return _MsPositionEncoded(per_sample=True)


def ms_position_encoded_per_sample_transposed() -> msnn.Cell:
    """Its grid of coordinates transposed (x for y)."""
    return _MsPositionEncoded(per_sample=True, grid=POSITIONS[:, ::-1].copy())


# A conv whose output channels two paths read apart (timm's DPN ``c1x1_w_s1``), ported as two
# convs (mindcv's ``c1x1_w_r`` and ``c1x1_w_d``), and a gated MLP torch holds as two layers
# that the port fuses (an LLM's gate and up projections): names no rule pairs, a --map does.
class _TorchDualPath(tnn.Module):
    def __init__(self):
        super().__init__()
        self.stem = tnn.Conv2d(3, 8, 3, padding=1)
        self.c1x1 = tnn.Conv2d(8, 12, 1, bias=False)
        self.mix = tnn.Conv2d(8, 4, 3, padding=1)
        self.gate = tnn.Linear(8, 6)
        self.up = tnn.Linear(8, 6)
        self.head = tnn.Linear(6, 10)

    def forward(self, x):
        stacked = self.c1x1(torch.relu(self.stem(x)))
        x = torch.cat([self.mix(stacked[:, :8]), stacked[:, 8:]], 1).mean((2, 3))
        return self.head(tnn.functional.silu(self.gate(x)) * self.up(x))


class _MsDualPath(msnn.Cell):
    def __init__(self, side_first: bool = False, up_first: bool = False):
        super().__init__()
        self.stem = msnn.Conv2d(3, 8, 3, pad_mode="pad", padding=1, has_bias=True)
        if side_first:
            self.c1x1_side = msnn.Conv2d(8, 4, 1)
        self.c1x1_main = msnn.Conv2d(8, 8, 1)
        if not side_first:
            self.c1x1_side = msnn.Conv2d(8, 4, 1)
        self.mix = msnn.Conv2d(8, 4, 3, pad_mode="pad", padding=1, has_bias=True)
        self.gate_up = msnn.Dense(8, 12)
        self.head = msnn.Dense(6, 10)
        self.up_first = up_first

    def construct(self, x):
        x = ops.relu(self.stem(x))
        x = ops.cat((self.mix(self.c1x1_main(x)), self.c1x1_side(x)), 1).mean(axis=(2, 3))
        gate, up = ops.split(self.gate_up(x), 6, axis=-1)
        if self.up_first:
            gate, up = up, gate
        return self.head(ops.silu(gate) * up)


def torch_dual_path() -> tnn.Module:
    return _TorchDualPath()


def ms_dual_path() -> msnn.Cell:
    return _MsDualPath()


def ms_dual_path_side_first() -> msnn.Cell:
    """Its side path's conv declared before the main one's (the rows a guess would give it)."""
    return _MsDualPath(side_first=True)


def ms_dual_path_up_first() -> msnn.Cell:
    """Its fused layer's output read as up, then gate."""
    return _MsDualPath(up_first=True)


def ms_tiny_relu_assigned() -> msnn.Cell:
    """Its cells named, its first ReLU "replaced" by assigning the SequentialCell's attribute:
    the ReLU6 is held (and hooked) but never runs, the ReLU it was built with runs unseen."""
    net = msnn.SequentialCell(OrderedDict((f"layer{index}", cell)
                                          for index, cell in enumerate(_ms_tiny().cell_list)))
    net.layer2 = msnn.ReLU6()
    return net


def ms_tiny_conv_assigned() -> msnn.Cell:
    """Its cells named, its strided conv "replaced" by assigning the SequentialCell's
    attribute: the new conv takes torch's weights and never runs, the old one runs unseen (its
    weights set here: drawn from MindSpore's unseeded generator, they matched torch's conv's
    output by the input's sketch once in 34 seeded draws)."""
    net = msnn.SequentialCell(OrderedDict((f"layer{index}", cell)
                                          for index, cell in enumerate(_ms_tiny().cell_list)))
    old = net.layer3
    old.weight.set_data(mindspore.Tensor(np.full(old.weight.shape, 0.05, np.float32)))
    net.layer3 = msnn.Conv2d(8, 8, 3, stride=2, pad_mode="pad", padding=1)
    return net


# A layer torch applies to the first token alone (timm's class attention: ``self.q(x[:, 0])``)
# ported to apply it to every token and take the first after (mindcv's XCiT): the same values
# at that position.
class _TorchFirstToken(tnn.Module):
    def __init__(self, every: bool = False):
        super().__init__()
        self.embed = tnn.Conv2d(3, 8, 4, stride=4)
        self.q = tnn.Linear(8, 8)
        self.head = tnn.Linear(8, 10)
        self.every = every

    def forward(self, x):
        tokens = self.embed(x).flatten(2).transpose(1, 2)
        first = self.q(tokens)[:, 0] if self.every else self.q(tokens[:, 0])
        return self.head(torch.relu(first))


class _MsFirstToken(msnn.Cell):
    def __init__(self, every: bool = True, position: int = 0):
        super().__init__()
        self.embed = msnn.Conv2d(3, 8, 4, stride=4, has_bias=True)
        self.q = msnn.Dense(8, 8)
        self.head = msnn.Dense(8, 10)
        self.every, self.position = every, position

    def construct(self, x):
        tokens = ops.flatten(self.embed(x), start_dim=2).transpose(0, 2, 1)
        taken = self.q(tokens)[:, self.position] if self.every else \
            self.q(tokens[:, self.position])
        return self.head(ops.relu(taken))


def torch_first_token() -> tnn.Module:
    return _TorchFirstToken()


def torch_every_token() -> tnn.Module:
    return _TorchFirstToken(every=True)


def ms_first_token() -> msnn.Cell:
    return _MsFirstToken(every=False)


def ms_every_token() -> msnn.Cell:
    return _MsFirstToken()


def ms_every_token_last_taken() -> msnn.Cell:
    """The last token's taken for the first's."""
    return _MsFirstToken(position=-1)


# A branch upsampled by a module in torch (timm's HRNet fuse layers: nn.Upsample) and in the
# construct in the port, which mindcv's HRNet casts to float16 after.
class _TorchUpsampledBranch(tnn.Module):
    def __init__(self):
        super().__init__()
        self.conv = tnn.Conv2d(3, 8, 3, padding=1)
        self.down = tnn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.up = tnn.Upsample(scale_factor=2, mode="nearest")
        self.act = tnn.ReLU()
        self.head = tnn.Linear(8, 10)

    def forward(self, x):
        x = torch.relu(self.conv(x))
        return self.head(self.act(x + self.up(self.down(x))).mean((2, 3)))


class _MsUpsampledBranch(msnn.Cell):
    def __init__(self, half: bool = False):
        super().__init__()
        self.conv = msnn.Conv2d(3, 8, 3, pad_mode="pad", padding=1, has_bias=True)
        self.down = msnn.Conv2d(8, 8, 3, stride=2, pad_mode="pad", padding=1, has_bias=True)
        self.act = msnn.ReLU()
        self.head = msnn.Dense(8, 10)
        self.half = half

    def construct(self, x):
        x = ops.relu(self.conv(x))
        branch = ops.ResizeNearestNeighbor(x.shape[2:])(self.down(x))
        if self.half:
            branch = ops.cast(branch, mindspore.float16)
        return self.head(self.act(x + branch).mean(axis=(2, 3)))


def torch_upsampled_branch() -> tnn.Module:
    return _TorchUpsampledBranch()


def ms_upsampled_branch() -> msnn.Cell:
    return _MsUpsampledBranch()


def ms_upsampled_branch_in_half() -> msnn.Cell:
    """Its upsampled branch cast to float16 (mindcv's HRNet)."""
    return _MsUpsampledBranch(half=True)


# A block computing its MLP with 1×1 convs over N×C×H×W (timm's ConvNeXtV2, conv_mlp), ported
# with dense layers over N×H×W×C (mindcv's): each output holds torch's values channels last.
class GELU(tnn.Module):
    """timm's GELU: F.gelu, holding no ``approximate`` setting."""

    def forward(self, x):
        return tnn.functional.gelu(x)


class _TorchConvMlp(tnn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = tnn.Conv2d(8, 16, 1)
        self.act = GELU()
        self.fc2 = tnn.Conv2d(16, 8, 1)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class _TorchConvMlpBlock(tnn.Module):
    def __init__(self):
        super().__init__()
        self.conv_dw = tnn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.mlp = _TorchConvMlp()

    def forward(self, x):
        return x + self.mlp(self.conv_dw(x))


class _MsDenseMlpBlock(msnn.Cell):
    def __init__(self, approximate: bool):
        super().__init__()
        self.dwconv = msnn.Conv2d(8, 8, 3, pad_mode="pad", padding=1, group=8, has_bias=True)
        self.pwconv1 = msnn.Dense(8, 16)
        self.act = msnn.GELU(approximate=approximate)
        self.pwconv2 = msnn.Dense(16, 8)

    def construct(self, x):
        y = self.dwconv(x).transpose(0, 2, 3, 1)
        return x + self.pwconv2(self.act(self.pwconv1(y))).transpose(0, 3, 1, 2)


def torch_conv_mlp() -> tnn.Module:
    return tnn.Sequential(tnn.Conv2d(3, 8, 3, padding=1), _TorchConvMlpBlock(),
                          tnn.AdaptiveAvgPool2d(1), tnn.Flatten(), tnn.Linear(8, 10))


def _ms_dense_mlp(approximate: bool) -> msnn.Cell:
    return msnn.SequentialCell(msnn.Conv2d(3, 8, 3, pad_mode="pad", padding=1, has_bias=True),
                               _MsDenseMlpBlock(approximate), GlobalAvgPool(), msnn.Flatten(),
                               msnn.Dense(8, 10))


def ms_dense_mlp() -> msnn.Cell:
    return _ms_dense_mlp(approximate=False)


def ms_dense_mlp_tanh_gelu() -> msnn.Cell:
    """Its GELU MindSpore's default, the tanh form."""
    return _ms_dense_mlp(approximate=True)


# A conv standardising its weight before convolving (timm's StdConv2d, its eps an attribute),
# ported with the eps written into the construct as a constant (mindcv's BiT: 1e-10, timm's
# BiT 1e-8; here timm's default 1e-6, which a 3×3×3 kernel shows at this size).
class _TorchStdConv(tnn.Conv2d):
    def __init__(self, *args, eps: float = 1e-6, declared: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.constant = eps
        if declared:
            self.eps = eps

    def forward(self, x):
        weight = tnn.functional.batch_norm(self.weight.reshape(1, self.out_channels, -1),
                                           None, None, training=True, momentum=0.0,
                                           eps=self.constant).reshape_as(self.weight)
        return self._conv_forward(x, weight, self.bias)


class _MsStdConv(msnn.Conv2d):
    def __init__(self, in_channels: int, out_channels: int, constant: float, declared: bool):
        super().__init__(in_channels, out_channels, 3, pad_mode="pad", padding=1)
        self.constant = constant
        if declared:
            self.eps = constant

    def construct(self, x):
        mean = self.weight.mean((1, 2, 3), keep_dims=True)
        variance = ((self.weight - mean) ** 2).mean((1, 2, 3), keep_dims=True)
        return self.conv2d(x, (self.weight - mean) / ops.sqrt(variance + self.constant))


def torch_standardised_conv(declared: bool = True) -> tnn.Module:
    return tnn.Sequential(_TorchStdConv(3, 8, 3, padding=1, bias=False, declared=declared),
                          tnn.GroupNorm(2, 8), tnn.ReLU(), tnn.AdaptiveAvgPool2d(1),
                          tnn.Flatten(), tnn.Linear(8, 10))


def torch_standardised_conv_written() -> tnn.Module:
    """Its eps written into its forward, declaring none."""
    return torch_standardised_conv(declared=False)


def ms_standardised_conv(constant: float = 1e-6, declared: bool = False) -> msnn.Cell:
    return msnn.SequentialCell([_MsStdConv(3, 8, constant, declared), msnn.GroupNorm(2, 8),
                                msnn.ReLU(), GlobalAvgPool(), msnn.Flatten(),
                                msnn.Dense(8, 10)])


def ms_standardised_conv_other_eps() -> msnn.Cell:
    return ms_standardised_conv(constant=1e-10)


def ms_standardised_conv_other_eps_declared() -> msnn.Cell:
    return ms_standardised_conv(constant=1e-10, declared=True)


# A head normalising the pooled features (timm's PoolFormer: pool, then GroupNorm), ported
# normalising the map before pooling it (mindcv's): the norm runs on another shape.
def torch_pooled_then_normed() -> tnn.Module:
    return tnn.Sequential(tnn.Conv2d(3, 8, 3, padding=1), tnn.ReLU(), tnn.AdaptiveAvgPool2d(1),
                          tnn.GroupNorm(2, 8), tnn.Flatten(), tnn.Linear(8, 10))


def ms_normed_then_pooled() -> msnn.Cell:
    return msnn.SequentialCell([msnn.Conv2d(3, 8, 3, pad_mode="pad", padding=1, has_bias=True),
                                msnn.ReLU(), msnn.GroupNorm(2, 8), GlobalAvgPool(),
                                msnn.Flatten(), msnn.Dense(8, 10)])


class _MsNormedThenPooledInConstruct(msnn.Cell):
    """mindcv's PoolFormer head: the norm over the map, the mean taken in the construct."""

    def __init__(self):
        super().__init__()
        self.conv = msnn.Conv2d(3, 8, 3, pad_mode="pad", padding=1, has_bias=True)
        self.relu = msnn.ReLU()
        self.norm = msnn.GroupNorm(2, 8)
        self.fc = msnn.Dense(8, 10)

    def construct(self, x):
        return self.fc(self.norm(self.relu(self.conv(x))).mean((2, 3)))


def ms_normed_then_pooled_in_construct() -> msnn.Cell:
    return _MsNormedThenPooledInConstruct()


# A block downsampling in its 3×3 conv and in a 1×1 conv on its shortcut, alike in what it holds
# to its first 1×1 conv (timm's RegNet: conv1 held first, downsample last), ported holding the
# shortcut's conv first (mindcv's: proj, then the branch).
class _TorchShortcutLast(tnn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = tnn.Sequential(tnn.Conv2d(8, 8, 1, bias=False), tnn.BatchNorm2d(8))
        self.conv2 = tnn.Sequential(tnn.Conv2d(8, 8, 3, stride=2, padding=1, bias=False),
                                    tnn.BatchNorm2d(8))
        self.downsample = tnn.Sequential(tnn.Conv2d(8, 8, 1, stride=2, bias=False),
                                         tnn.BatchNorm2d(8))

    def forward(self, x):
        return torch.relu(self.conv2(torch.relu(self.conv1(x))) + self.downsample(x))


class _MsShortcutFirst(msnn.Cell):
    def __init__(self, strided_first: bool = False, shortcut_first: bool = True):
        super().__init__()
        if shortcut_first:
            self._shortcut()
        self.a = msnn.Conv2d(8, 8, 1, stride=2 if strided_first else 1)
        self.a_bn = msnn.BatchNorm2d(8)
        self.b = msnn.Conv2d(8, 8, 3, stride=1 if strided_first else 2, pad_mode="pad",
                             padding=1)
        self.b_bn = msnn.BatchNorm2d(8)
        if not shortcut_first:
            self._shortcut()

    def _shortcut(self):
        self.proj = msnn.Conv2d(8, 8, 1, stride=2)
        self.bn = msnn.BatchNorm2d(8)

    def construct(self, x):
        branch = self.b_bn(self.b(ops.relu(self.a_bn(self.a(x)))))
        return ops.relu(branch + self.bn(self.proj(x)))


def torch_shortcut_last() -> tnn.Module:
    return tnn.Sequential(tnn.Conv2d(3, 8, 3, padding=1, bias=False), _TorchShortcutLast(),
                          tnn.AdaptiveAvgPool2d(1), tnn.Flatten(), tnn.Linear(8, 10))


def ms_shortcut_first(strided_first: bool = False, shortcut_first: bool = True) -> msnn.Cell:
    return msnn.SequentialCell([msnn.Conv2d(3, 8, 3, pad_mode="pad", padding=1),
                                _MsShortcutFirst(strided_first, shortcut_first),
                                GlobalAvgPool(), msnn.Flatten(), msnn.Dense(8, 10)])


def ms_shortcut_last_strided_1x1() -> msnn.Cell:
    """Its shortcut held last, as torch's, and the branch's stride on its 1×1 conv, where
    ResNet v1 puts it (torchvision's v1.5 on the 3×3): the classic port of the other paper."""
    return ms_shortcut_first(strided_first=True, shortcut_first=False)


# A mixture-of-experts layer over rows of tiny.FEATURES (each row a token), as Mixtral's, then a
# head: each row routed to its top two of three experts, their outputs weighted and added back
# in place.
EXPERTS = 3


class _TorchExpert(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.act, self.down = tnn.Linear(FEATURES, 8), tnn.SiLU(), tnn.Linear(8, FEATURES)

    def forward(self, x):
        return self.down(self.act(self.up(x)))


class _TorchMixture(tnn.Module):
    """Each expert's rows taken as Mixtral's torch.where lists them: by (slot, token)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = tnn.Linear(FEATURES, EXPERTS, bias=False)
        self.experts = tnn.ModuleList([_TorchExpert() for _ in range(EXPERTS)])

    def forward(self, x):
        weights, chosen = torch.topk(torch.softmax(self.gate(x), -1), 2)
        weights = weights / weights.sum(-1, keepdim=True)
        routed = tnn.functional.one_hot(chosen, EXPERTS).permute(2, 1, 0)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            slot, token = torch.where(routed[e])
            out = out.index_add(0, token, expert(x[token]) * weights[token, slot, None])
        return out + x


class _MsExpert(msnn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.act = msnn.Dense(FEATURES, 8), msnn.SiLU()
        self.down = msnn.Dense(8, FEATURES)

    def construct(self, x):
        return self.down(self.act(self.up(x)))


class _MsMixture(msnn.Cell):
    """``rows``: "token", each expert's rows listed by (token, slot); "every", each expert run
    on every row, weighted by a routing matrix zero off the top two (static shapes).
    ``routed_over``: the axis the router's softmax normalises; ``top``: experts a row."""

    def __init__(self, rows: str, renormalised: bool, routed_over: int, top: int) -> None:
        super().__init__()
        self.rows, self.renormalised, self.routed_over = rows, renormalised, routed_over
        self.top = top
        self.gate = msnn.Dense(FEATURES, EXPERTS, has_bias=False)
        self.experts = msnn.CellList([_MsExpert() for _ in range(EXPERTS)])

    def construct(self, x):
        weights, chosen = ops.topk(ops.softmax(self.gate(x), self.routed_over), self.top)
        if self.renormalised:
            weights = weights / weights.sum(-1, keepdims=True)
        out = ops.zeros_like(x)
        if self.rows == "every":
            routing = (ops.one_hot(chosen, EXPERTS, mindspore.Tensor(1.0), mindspore.Tensor(0.0))
                       * weights[..., None]).sum(1)
            for e, expert in enumerate(self.experts):
                out = out + expert(x) * routing[:, e:e + 1]
            return out + x
        for e, expert in enumerate(self.experts):
            token, slot = np.nonzero(chosen.asnumpy() == e)
            token, slot = mindspore.Tensor(token.astype(np.int32)), \
                mindspore.Tensor(slot.astype(np.int32))
            out = ops.index_add(out, token, expert(x[token]) * weights[token, slot][:, None], 0)
        return out + x


def torch_mixture() -> tnn.Module:
    return tnn.Sequential(_TorchMixture(), tnn.Linear(FEATURES, 5))


def ms_mixture(rows: str = "token", renormalised: bool = True, routed_over: int = -1,
               top: int = 2) -> msnn.Cell:
    return msnn.SequentialCell([_MsMixture(rows, renormalised, routed_over, top),
                                msnn.Dense(FEATURES, 5)])


# Gemma's RMSNorm, its weight centred on zero: x·rsqrt(mean(x²) + eps)·(1 + weight). Drawn away
# from zero (as a trained model's), not at its initial zeros.
class _TorchWeightPlusOneNorm(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.weight = tnn.Parameter(0.5 * torch.randn(FEATURES, generator=generator))
        self.eps = 1e-6

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1 + self.weight)


class _MsWeightPlusOneNorm(msnn.Cell):
    """``plus_one=False``: scaled by the weight, as Llama's RMSNorm."""

    def __init__(self, plus_one: bool) -> None:
        super().__init__()
        self.weight = mindspore.Parameter(mindspore.Tensor(np.zeros(FEATURES, np.float32)))
        self.eps, self.plus_one = 1e-6, plus_one

    def construct(self, x):
        normed = x * ops.rsqrt((x * x).mean(-1, keep_dims=True) + self.eps)
        return normed * (1 + self.weight) if self.plus_one else normed * self.weight


def torch_weight_plus_one_norm() -> tnn.Module:
    return tnn.Sequential(tnn.Linear(FEATURES, FEATURES), _TorchWeightPlusOneNorm(),
                          tnn.Linear(FEATURES, 5))


def ms_weight_plus_one_norm(plus_one: bool = True) -> msnn.Cell:
    return msnn.SequentialCell([msnn.Dense(FEATURES, FEATURES), _MsWeightPlusOneNorm(plus_one),
                                msnn.Dense(FEATURES, 5)])


# Features scaled by √FEATURES before the head in the model's forward, as Gemma scales its
# embeddings by √width; the port may leave the scale out.
class _TorchScaledFeatures(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = tnn.Linear(FEATURES, FEATURES), tnn.Linear(FEATURES, 5)

    def forward(self, x):
        return self.head(self.embed(x) * FEATURES ** 0.5)


class _MsScaledFeatures(msnn.Cell):
    def __init__(self, scaled: bool) -> None:
        super().__init__()
        self.embed, self.head = msnn.Dense(FEATURES, FEATURES), msnn.Dense(FEATURES, 5)
        self.scaled = scaled

    def construct(self, x):
        features = self.embed(x)
        return self.head(features * FEATURES ** 0.5 if self.scaled else features)


def torch_scaled_features() -> tnn.Module:
    return _TorchScaledFeatures()


def ms_scaled_features(scaled: bool = True) -> msnn.Cell:
    return _MsScaledFeatures(scaled)


# A block returning a tuple, as Hugging Face's mixture-of-experts layers return their output
# and router logits; the port's leaves its second layer out.
class _TorchTupleBlock(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = tnn.Linear(FEATURES, FEATURES), tnn.Linear(FEATURES, FEATURES)

    def forward(self, x):
        return x + self.b(torch.tanh(self.a(x))), x


class _MsTupleBlock(msnn.Cell):
    def __init__(self, whole: bool) -> None:
        super().__init__()
        self.a, self.b = msnn.Dense(FEATURES, FEATURES), msnn.Dense(FEATURES, FEATURES)
        self.whole = whole

    def construct(self, x):
        hidden = ops.tanh(self.a(x))
        return x + (self.b(hidden) if self.whole else hidden), x


class _TorchTupleNet(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block, self.head = _TorchTupleBlock(), tnn.Linear(FEATURES, 5)

    def forward(self, x):
        return self.head(self.block(x)[0])


class _MsTupleNet(msnn.Cell):
    def __init__(self, whole: bool) -> None:
        super().__init__()
        self.block, self.head = _MsTupleBlock(whole), msnn.Dense(FEATURES, 5)

    def construct(self, x):
        return self.head(self.block(x)[0])


def torch_tuple_block() -> tnn.Module:
    return _TorchTupleNet()


def ms_tuple_block(whole: bool = True) -> msnn.Cell:
    return _MsTupleNet(whole)


# A causal 1-D conv, as Hugging Face's Mamba writes it: padded k − 1 on both sides and cut to
# its first L outputs (``torch_causal_conv``), or over its input padded on the left alone
# (``left=True``; WaveNet's and TCNs' way). A port may write it either way, or pad 'same'.
SEQUENCE = 12


class _TorchCausalConv(tnn.Module):
    def __init__(self, left: bool) -> None:
        super().__init__()
        self.left = left
        self.conv = tnn.Conv1d(3, 8, 4, padding=0 if left else 3)
        self.head = tnn.Linear(8 * SEQUENCE, 5)

    def forward(self, x):
        if self.left:
            return self.head(torch.relu(self.conv(tnn.functional.pad(x, (3, 0)))).flatten(1))
        return self.head(torch.relu(self.conv(x)[..., :SEQUENCE]).flatten(1))


class _MsCausalConv(msnn.Cell):
    def __init__(self, padding: str) -> None:
        super().__init__()
        self.padding = padding
        settings = {"left": {"pad_mode": "valid"}, "both": {"pad_mode": "pad", "padding": 3},
                    "same": {"pad_mode": "same"}}[padding]
        self.conv = msnn.Conv1d(3, 8, 4, has_bias=True, **settings)
        self.head = msnn.Dense(8 * SEQUENCE, 5)

    def construct(self, x):
        if self.padding == "left":
            x = ops.pad(x, (3, 0))
        return self.head(ops.relu(self.conv(x)[..., :SEQUENCE]).flatten(start_dim=1))


def torch_causal_conv(left: bool = False) -> tnn.Module:
    return _TorchCausalConv(left)


def ms_causal_conv(padding: str = "both") -> msnn.Cell:
    return _MsCausalConv(padding)


# RWKV's feed-forward: value(relu(key(x))²) gated by sigmoid(receptance(x)). A port computing
# the receptance before the value runs the same modules in another order, harmlessly.
class _TorchSquaredReluGated(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.key = tnn.Linear(FEATURES, 2 * FEATURES)
        self.value = tnn.Linear(2 * FEATURES, FEATURES)
        self.receptance, self.head = tnn.Linear(FEATURES, FEATURES), tnn.Linear(FEATURES, 5)

    def forward(self, x):
        value = self.value(torch.square(torch.relu(self.key(x))))
        return self.head(torch.sigmoid(self.receptance(x)) * value)


class _MsSquaredReluGated(msnn.Cell):
    """``squared=False``: the key through a ReLU alone."""

    def __init__(self, squared: bool) -> None:
        super().__init__()
        self.squared = squared
        self.key = msnn.Dense(FEATURES, 2 * FEATURES)
        self.value = msnn.Dense(2 * FEATURES, FEATURES)
        self.receptance, self.head = msnn.Dense(FEATURES, FEATURES), msnn.Dense(FEATURES, 5)

    def construct(self, x):
        key = ops.relu(self.key(x))
        gate = ops.sigmoid(self.receptance(x))
        return self.head(gate * self.value(key * key if self.squared else key))


def torch_squared_relu_gated() -> tnn.Module:
    return _TorchSquaredReluGated()


def ms_squared_relu_gated(squared: bool = True) -> msnn.Cell:
    return _MsSquaredReluGated(squared)


# RWKV's token shift: each token mixed with the one before it, torch's ZeroPad2d((0, 0, 1, -1))
# over (N, T, C) (one zero row before the tokens, the last dropped), a cell of the port's own.
class _MsTokenShift(msnn.Cell):
    def __init__(self, taking: str) -> None:
        super().__init__()
        self.taking = taking

    def construct(self, x):
        zeros = ops.zeros_like(x[:, :1])
        if self.taking == "before":
            return ops.cat((zeros, x[:, :-1]), axis=1)
        if self.taking == "mean":
            return ops.cat((zeros, (x[:, :-1] + x[:, 1:]) / 2), axis=1)
        return ops.cat((x[:, 1:], zeros), axis=1) if self.taking == "after" else x


def torch_token_shift() -> tnn.Module:
    return tnn.Sequential(tnn.Embedding(VOCABULARY, WIDTH), tnn.ZeroPad2d((0, 0, 1, -1)),
                          tnn.Flatten(), tnn.Linear(WIDTH * TOKENS, 5))


def ms_token_shift(taking: str = "before") -> msnn.Cell:
    """``taking``: the token before each (torch's), "after" it, "none", or the "mean" of the
    one before and itself."""
    return msnn.SequentialCell([msnn.Embedding(VOCABULARY, WIDTH), _MsTokenShift(taking),
                                msnn.Flatten(), msnn.Dense(WIDTH * TOKENS, 5)])


# RWKV's first block: its input normalised (pre_ln), then a pre-norm residual branch (ln1) and
# a norm before the head (ln2). A port may hold pre_ln and never call it. The features are
# scaled up (var ≫ eps, as RWKV's embeddings are): ln1 of pre_ln's output is ln1's of its input.
class _TorchPreNormed(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.pre_ln = tnn.Linear(FEATURES, FEATURES), tnn.LayerNorm(FEATURES)
        with torch.no_grad():
            self.embed.weight.mul_(30.0)
        self.ln1, self.mix = tnn.LayerNorm(FEATURES), tnn.Linear(FEATURES, FEATURES)
        self.ln2, self.head = tnn.LayerNorm(FEATURES), tnn.Linear(FEATURES, 5)

    def forward(self, x):
        x = self.pre_ln(self.embed(x))
        return self.head(self.ln2(x + self.mix(self.ln1(x))))


class _MsPreNormed(msnn.Cell):
    def __init__(self, pre_normed: bool) -> None:
        super().__init__()
        self.pre_normed = pre_normed
        self.embed = msnn.Dense(FEATURES, FEATURES)
        self.pre_ln = msnn.LayerNorm((FEATURES,), epsilon=1e-5)
        self.ln1 = msnn.LayerNorm((FEATURES,), epsilon=1e-5)
        self.mix = msnn.Dense(FEATURES, FEATURES)
        self.ln2, self.head = msnn.LayerNorm((FEATURES,), epsilon=1e-5), msnn.Dense(FEATURES, 5)

    def construct(self, x):
        x = self.embed(x)
        if self.pre_normed:
            x = self.pre_ln(x)
        return self.head(self.ln2(x + self.mix(self.ln1(x))))


def torch_pre_normed() -> tnn.Module:
    return _TorchPreNormed()


def ms_pre_normed(pre_normed: bool = True) -> msnn.Cell:
    return _MsPreNormed(pre_normed)


# Hugging Face's RecurrentGemma, as far as a capture is concerned: its scale √width (√32 here,
# 5.65625 in bfloat16) kept as a bfloat16 buffer; a state carried from one call to the next,
# graph and all (its RG-LRU's recurrent_states, None until the first call); a model output (a
# dict) holding its logits, capped after its head (tanh(x / 3)·3) in its forward. The port
# computes the head in its construct from the cell's weights.
class _TorchCappedLM(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.mix = tnn.Linear(FEATURES, FEATURES), tnn.Linear(FEATURES, FEATURES)
        self.head = tnn.Linear(FEATURES, 5)
        self.register_buffer("normalizer", torch.tensor(32 ** 0.5, dtype=torch.bfloat16),
                             persistent=False)
        self.state = None

    def forward(self, x):
        hidden = self.mix(self.embed(x) * self.normalizer.float())
        if self.state is not None:
            hidden = hidden + 0 * self.state.sum()
        self.state = hidden
        return {"logits": torch.tanh(self.head(hidden) / 3) * 3, "hidden_states": (hidden,)}


class _TorchCappedScorer(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lm = _TorchCappedLM()

    def forward(self, x):
        return self.lm(x)["logits"]


class _MsCappedLM(msnn.Cell):
    def __init__(self, normalizer: float, capped: bool) -> None:
        super().__init__()
        self.embed, self.mix = msnn.Dense(FEATURES, FEATURES), msnn.Dense(FEATURES, FEATURES)
        self.head = msnn.Dense(FEATURES, 5)
        self.normalizer, self.capped = normalizer, capped

    def construct(self, x):
        hidden = self.mix(self.embed(x) * self.normalizer)
        logits = ops.matmul(hidden, self.head.weight.T) + self.head.bias
        return ops.tanh(logits / 3) * 3 if self.capped else logits


class _MsCappedScorer(msnn.Cell):
    def __init__(self, normalizer: float, capped: bool) -> None:
        super().__init__()
        self.lm = _MsCappedLM(normalizer, capped)

    def construct(self, x):
        return self.lm(x)


def torch_capped_lm() -> tnn.Module:
    return _TorchCappedScorer()


def ms_capped_lm(normalizer: float = 5.65625, capped: bool = True) -> msnn.Cell:
    """``normalizer``: torch's √32 in bfloat16, or another (float32's, 5.656854)."""
    return _MsCappedScorer(normalizer, capped)


# A Hugging Face encoder as far as the alignment sees it: a layer returning its output and its
# attention weights (a port returns the output alone), a final norm, the encoder's output a
# model output (a dict). A port may hold the norm and never call it.
class _TorchWeightsToo(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = tnn.Linear(FEATURES, FEATURES)

    def forward(self, x):
        y = self.proj(x)
        return y, torch.softmax(y, -1)


class _TorchDictEncoderWithWeights(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer, self.norm = _TorchWeightsToo(), tnn.LayerNorm(FEATURES)

    def forward(self, x):
        return {"last_hidden_state": self.norm(self.layer(x)[0])}


class _TorchDictEncoded(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder, self.head = _TorchDictEncoderWithWeights(), tnn.Linear(FEATURES, 5)

    def forward(self, x):
        return self.head(self.encoder(x)["last_hidden_state"])


class _MsOutputAlone(msnn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.proj = msnn.Dense(FEATURES, FEATURES)

    def construct(self, x):
        return self.proj(x)


class _MsEncoderOutputAlone(msnn.Cell):
    def __init__(self, normed: bool) -> None:
        super().__init__()
        self.normed = normed
        self.layer = _MsOutputAlone()
        self.norm = msnn.LayerNorm((FEATURES,), epsilon=1e-5)

    def construct(self, x):
        h = self.layer(x)
        return self.norm(h) if self.normed else h


class _MsEncoded(msnn.Cell):
    def __init__(self, normed: bool) -> None:
        super().__init__()
        self.encoder, self.head = _MsEncoderOutputAlone(normed), msnn.Dense(FEATURES, 5)

    def construct(self, x):
        return self.head(self.encoder(x))


def torch_dict_encoder() -> tnn.Module:
    return _TorchDictEncoded()


def ms_dict_encoder(normed: bool = True) -> msnn.Cell:
    return _MsEncoded(normed)


# A gated MLP, down(act(w1(x)) · w3(x)), its activation a module (Mixtral's expert); a port may
# swap the two projections' roles, act(w3(x)) · w1(x).
class _TorchGatedMLP(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1, self.w3 = tnn.Linear(FEATURES, FEATURES), tnn.Linear(FEATURES, FEATURES)
        self.act_fn, self.w2 = tnn.SiLU(), tnn.Linear(FEATURES, 5)

    def forward(self, x):
        return self.w2(self.act_fn(self.w1(x)) * self.w3(x))


class _MsGatedMLP(msnn.Cell):
    def __init__(self, swapped: bool) -> None:
        super().__init__()
        self.swapped = swapped
        self.w1, self.w3 = msnn.Dense(FEATURES, FEATURES), msnn.Dense(FEATURES, FEATURES)
        self.act_fn, self.w2 = msnn.SiLU(), msnn.Dense(FEATURES, 5)

    def construct(self, x):
        if self.swapped:
            gate = self.act_fn(self.w3(x))
            return self.w2(gate * self.w1(x))
        return self.w2(self.act_fn(self.w1(x)) * self.w3(x))


def torch_gated_mlp() -> tnn.Module:
    return _TorchGatedMLP()


def ms_gated_mlp(swapped: bool = False) -> msnn.Cell:
    return _MsGatedMLP(swapped)


# A linear scan over tokens, h_t = 0.8·h_(t-1) + c_t·x_t with c_0 = 1 and c_t = √(1 − 0.64)
# after (RecurrentGemma's RG-LRU normalises every input but the first, where it resets), in a
# module of its own. A port may normalise the first too, or leave out the last step's input.
SCAN_TOKENS = 8


def _scanned(x, stack, reset: bool = True, last: bool = True):
    states, state = [], 0 * x[:, 0]
    for t in range(x.shape[1]):
        scale = 1.0 if t == 0 and reset else 0.6
        state = 0.8 * state + (scale * x[:, t] if last or t < x.shape[1] - 1 else 0 * x[:, t])
        states.append(state)
    return stack(states, 1)


class _TorchScan(tnn.Module):
    def forward(self, x):
        return _scanned(x, torch.stack)


class _MsScan(msnn.Cell):
    def __init__(self, reset: bool, last: bool) -> None:
        super().__init__()
        self.reset, self.last = reset, last

    def construct(self, x):
        return _scanned(x, ops.stack, self.reset, self.last)


def torch_scan() -> tnn.Module:
    return tnn.Sequential(tnn.Linear(FEATURES, FEATURES), _TorchScan(), tnn.Flatten(),
                          tnn.Linear(SCAN_TOKENS * FEATURES, 5))


def ms_scan(reset: bool = True, last: bool = True) -> msnn.Cell:
    return msnn.SequentialCell([msnn.Dense(FEATURES, FEATURES), _MsScan(reset, last),
                                msnn.Flatten(), msnn.Dense(SCAN_TOKENS * FEATURES, 5)])


# A gated MLP whose gate and up projections are one fused layer (Phi-3's gate_up_proj), its
# output chunked in the forward: gate, up = gate_up(x).chunk(2, -1). A port may take the
# chunks the other way round.
class _TorchFusedGateUp(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_up_proj = tnn.Linear(FEATURES, 2 * FEATURES)
        self.act_fn, self.down_proj = tnn.SiLU(), tnn.Linear(FEATURES, 5)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, -1)
        return self.down_proj(self.act_fn(gate) * up)


class _MsFusedGateUp(msnn.Cell):
    def __init__(self, swapped: bool) -> None:
        super().__init__()
        self.swapped = swapped
        self.gate_up_proj = msnn.Dense(FEATURES, 2 * FEATURES)
        self.act_fn, self.down_proj = msnn.SiLU(), msnn.Dense(FEATURES, 5)

    def construct(self, x):
        gate, up = ops.chunk(self.gate_up_proj(x), 2, -1)
        if self.swapped:
            gate, up = up, gate
        return self.down_proj(self.act_fn(gate) * up)


def torch_fused_gate_up() -> tnn.Module:
    return _TorchFusedGateUp()


def ms_fused_gate_up(swapped: bool = False) -> msnn.Cell:
    return _MsFusedGateUp(swapped)


# Hugging Face's OPT, as far as a capture is concerned: its learned positions an nn.Embedding
# subclass given the attention mask (float ones), computing its ids inside with an offset of 2;
# each layer's feed-forward run on the tokens of all samples flattened, (N·L, W).
POSITION_OFFSET = 2


class _TorchOffsetPositions(tnn.Embedding):
    def __init__(self) -> None:
        super().__init__(TOKENS + POSITION_OFFSET, WIDTH)

    def forward(self, mask):
        return super().forward((torch.cumsum(mask, 1) * mask - 1).long() + POSITION_OFFSET)


class _TorchFlattenedFeedForward(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens, self.embed_positions = tnn.Embedding(VOCABULARY, WIDTH), \
            _TorchOffsetPositions()
        self.final_layer_norm, self.fc1 = tnn.LayerNorm(WIDTH), tnn.Linear(WIDTH, WIDTH)
        self.head = tnn.Linear(WIDTH * TOKENS, 5)

    def forward(self, ids):
        x = self.embed_tokens(ids) + self.embed_positions(torch.ones(ids.shape))
        shape = x.shape
        x = x.reshape(-1, WIDTH)
        x = (x + self.fc1(self.final_layer_norm(x))).view(shape)
        return self.head(x.flatten(1))


class _MsFlattenedFeedForward(msnn.Cell):
    def __init__(self, offset: int) -> None:
        super().__init__()
        self.offset = offset
        self.embed_tokens = msnn.Embedding(VOCABULARY, WIDTH)
        self.embed_positions = msnn.Embedding(TOKENS + POSITION_OFFSET, WIDTH)
        self.final_layer_norm = msnn.LayerNorm((WIDTH,), epsilon=1e-5)
        self.fc1, self.head = msnn.Dense(WIDTH, WIDTH), msnn.Dense(WIDTH * TOKENS, 5)

    def construct(self, ids):
        positions = ops.arange(ids.shape[1]).reshape(1, -1).tile((ids.shape[0], 1)) + self.offset
        x = self.embed_tokens(ids) + self.embed_positions(positions)
        x = x + self.fc1(self.final_layer_norm(x))
        return self.head(x.reshape(x.shape[0], -1))


def torch_flattened_feed_forward() -> tnn.Module:
    return _TorchFlattenedFeedForward()


def ms_flattened_feed_forward(offset: int = POSITION_OFFSET) -> msnn.Cell:
    """``offset``: the first row of the position table read (torch's 2)."""
    return _MsFlattenedFeedForward(offset)


# Hugging Face's BLOOM, as far as a capture is concerned: the model builds each head's ALiBi
# bias (a slope times the key's position) and hands it to the attention, whose port builds it
# itself.
ALIBI_SLOPE = 0.5


class _TorchBiasedAttention(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.query_key_value, self.dense = tnn.Linear(WIDTH, 3 * WIDTH), tnn.Linear(WIDTH, WIDTH)

    def forward(self, x, alibi):
        q, k, v = self.query_key_value(x).chunk(3, dim=-1)
        scores = q @ k.transpose(1, 2) / math.sqrt(WIDTH) + alibi
        return self.dense(torch.softmax(scores, -1) @ v)


class _TorchAlibi(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.self_attention = tnn.Embedding(VOCABULARY, WIDTH), \
            _TorchBiasedAttention()
        self.head = tnn.Linear(WIDTH * TOKENS, 5)

    def forward(self, ids):
        alibi = ALIBI_SLOPE * torch.arange(ids.shape[1], dtype=torch.float32)[None, None, :]
        return self.head(self.self_attention(self.embed(ids), alibi=alibi).flatten(1))


class _MsBiasedAttention(msnn.Cell):
    def __init__(self, slope: float) -> None:
        super().__init__()
        self.query_key_value, self.dense = msnn.Dense(WIDTH, 3 * WIDTH), msnn.Dense(WIDTH, WIDTH)
        self.alibi = mindspore.Tensor(
            slope * np.arange(TOKENS, dtype=np.float32)[None, None, :])

    def construct(self, x):
        q, k, v = ops.chunk(self.query_key_value(x), 3, axis=-1)
        scores = ops.matmul(q, k.swapaxes(1, 2)) / math.sqrt(WIDTH) + self.alibi
        return self.dense(ops.matmul(ops.softmax(scores, -1), v))


class _MsAlibi(msnn.Cell):
    def __init__(self, slope: float) -> None:
        super().__init__()
        self.embed, self.self_attention = msnn.Embedding(VOCABULARY, WIDTH), \
            _MsBiasedAttention(slope)
        self.head = msnn.Dense(WIDTH * TOKENS, 5)

    def construct(self, ids):
        return self.head(self.self_attention(self.embed(ids)).reshape(ids.shape[0], -1))


def torch_alibi() -> tnn.Module:
    return _TorchAlibi()


def ms_alibi(slope: float = ALIBI_SLOPE) -> msnn.Cell:
    return _MsAlibi(slope)


# Hugging Face's BLOOM and GPT-NeoX hold each head's q, k and v together in their fused
# projection's output, (heads, 3, head), and attend causally; a port may split it as three
# blocks [q | k | v].
class _TorchHeadwiseQkv(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = tnn.Embedding(VOCABULARY, WIDTH)
        self.query_key_value, self.dense = tnn.Linear(WIDTH, 3 * WIDTH), tnn.Linear(WIDTH, WIDTH)
        self.head = tnn.Linear(WIDTH * TOKENS, 5)

    def forward(self, ids):
        x = self.embed(ids)
        n, length, _ = x.shape
        q, k, v = self.query_key_value(x).view(n, length, 2, 3, WIDTH // 2).permute(
            3, 0, 2, 1, 4)
        scores = q @ k.transpose(-1, -2) / math.sqrt(WIDTH // 2)
        scores = scores.masked_fill(torch.ones(length, length).triu(1).bool(), float("-inf"))
        context = (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(n, length, WIDTH)
        return self.head(self.dense(context).flatten(1))


class _MsHeadwiseQkv(msnn.Cell):
    def __init__(self, blocks: bool) -> None:
        super().__init__()
        self.blocks = blocks
        self.embed = msnn.Embedding(VOCABULARY, WIDTH)
        self.query_key_value = msnn.Dense(WIDTH, 3 * WIDTH)
        self.dense, self.head = msnn.Dense(WIDTH, WIDTH), msnn.Dense(WIDTH * TOKENS, 5)
        self.causal = mindspore.Tensor(np.tril(np.ones((TOKENS, TOKENS), bool)))

    def construct(self, ids):
        x = self.embed(ids)
        n, length, _ = x.shape
        fused = self.query_key_value(x)
        fused = fused.reshape(n, length, 3, 2, WIDTH // 2).transpose(2, 0, 3, 1, 4) \
            if self.blocks else fused.reshape(n, length, 2, 3, WIDTH // 2).transpose(3, 0, 2, 1, 4)
        scores = ops.matmul(fused[0], fused[1].swapaxes(-1, -2)) / math.sqrt(WIDTH // 2)
        scores = ops.where(self.causal, scores, mindspore.Tensor(-1e30, mindspore.float32))
        context = ops.matmul(ops.softmax(scores, -1), fused[2]).swapaxes(1, 2)
        return self.head(self.dense(context.reshape(n, length, WIDTH)).reshape(n, -1))


def torch_headwise_qkv() -> tnn.Module:
    return _TorchHeadwiseQkv()


def ms_headwise_qkv(blocks: bool = False) -> msnn.Cell:
    """``blocks``: the fused output split as [q | k | v] (torch's is head by head)."""
    return _MsHeadwiseQkv(blocks)


# Falcon's fused projection shares 2 key-value heads among 4 query heads of 2 and holds each
# group's queries, key and value together, (groups, 2 + 2, head); Llama's and Gemma's
# projections of their own share theirs so too, query head h reading key-value head h // 2. A
# port may split the fused output as blocks [q | k | v], or have head h read h % 2 (tile).
GROUPS, QUERIES_PER_GROUP = 2, 2
HEAD_WIDTH = WIDTH // (GROUPS * QUERIES_PER_GROUP)


def _torch_causal_context(q, k, v):
    """Causal attention of q (n, heads, l, head) over k and v (n, groups, l, head), each group
    read by the query heads next to each other, as (n, l, heads · head)."""
    k, v = (x.repeat_interleave(QUERIES_PER_GROUP, dim=1) for x in (k, v))
    length = q.shape[2]
    scores = q @ k.transpose(-1, -2) / math.sqrt(HEAD_WIDTH)
    scores = scores.masked_fill(torch.ones(length, length).triu(1).bool(), float("-inf"))
    return (torch.softmax(scores, -1) @ v).transpose(1, 2).flatten(2)


class _TorchGroupedQkv(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = tnn.Embedding(VOCABULARY, WIDTH)
        self.query_key_value = tnn.Linear(WIDTH, WIDTH + 2 * GROUPS * HEAD_WIDTH, bias=False)
        self.dense, self.head = tnn.Linear(WIDTH, WIDTH), tnn.Linear(WIDTH * TOKENS, 5)

    def forward(self, ids):
        x = self.embed(ids)
        n, length, _ = x.shape
        fused = self.query_key_value(x).view(n, length, GROUPS, QUERIES_PER_GROUP + 2, HEAD_WIDTH)
        q = fused[:, :, :, :QUERIES_PER_GROUP].flatten(2, 3).transpose(1, 2)
        k, v = (fused[:, :, :, i].transpose(1, 2) for i in (-2, -1))
        return self.head(self.dense(_torch_causal_context(q, k, v)).flatten(1))


class _TorchSharedValues(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = tnn.Embedding(VOCABULARY, WIDTH)
        self.q_proj = tnn.Linear(WIDTH, WIDTH, bias=False)
        self.k_proj = tnn.Linear(WIDTH, GROUPS * HEAD_WIDTH, bias=False)
        self.v_proj = tnn.Linear(WIDTH, GROUPS * HEAD_WIDTH, bias=False)
        self.o_proj, self.head = tnn.Linear(WIDTH, WIDTH), tnn.Linear(WIDTH * TOKENS, 5)

    def forward(self, ids):
        x = self.embed(ids)
        n, length, _ = x.shape
        q, k, v = (projection(x).view(n, length, -1, HEAD_WIDTH).transpose(1, 2)
                   for projection in (self.q_proj, self.k_proj, self.v_proj))
        return self.head(self.o_proj(_torch_causal_context(q, k, v)).flatten(1))


def _ms_causal_context(q, k, v, tiled: bool, unscaled: bool = False):
    """_torch_causal_context in MindSpore; ``tiled``: query head h reads group h % GROUPS;
    ``unscaled``: the scores not divided by √head."""
    if tiled:
        k, v = (ops.tile(x, (1, QUERIES_PER_GROUP, 1, 1)) for x in (k, v))
    else:
        k, v = (ops.repeat_interleave(x, QUERIES_PER_GROUP, axis=1) for x in (k, v))
    length = q.shape[2]
    scores = ops.matmul(q, k.swapaxes(-1, -2)) / (1 if unscaled else math.sqrt(HEAD_WIDTH))
    scores = ops.where(mindspore.Tensor(np.tril(np.ones((length, length), bool))), scores,
                       mindspore.Tensor(-1e30, mindspore.float32))
    context = ops.matmul(ops.softmax(scores, -1), v).swapaxes(1, 2)
    return context.reshape(q.shape[0], length, WIDTH)


class _MsGroupedQkv(msnn.Cell):
    def __init__(self, blocks: bool, tiled: bool, unscaled: bool) -> None:
        super().__init__()
        self.blocks, self.tiled, self.unscaled = blocks, tiled, unscaled
        self.embed = msnn.Embedding(VOCABULARY, WIDTH)
        self.query_key_value = msnn.Dense(WIDTH, WIDTH + 2 * GROUPS * HEAD_WIDTH, has_bias=False)
        self.dense, self.head = msnn.Dense(WIDTH, WIDTH), msnn.Dense(WIDTH * TOKENS, 5)

    def construct(self, ids):
        x = self.embed(ids)
        n, length, _ = x.shape
        fused = self.query_key_value(x)
        if self.blocks:
            q = fused[:, :, :WIDTH].reshape(n, length, -1, HEAD_WIDTH)
            k, v = (fused[:, :, WIDTH + i * GROUPS * HEAD_WIDTH:
                          WIDTH + (i + 1) * GROUPS * HEAD_WIDTH].reshape(n, length, GROUPS,
                                                                        HEAD_WIDTH)
                    for i in (0, 1))
        else:
            fused = fused.reshape(n, length, GROUPS, QUERIES_PER_GROUP + 2, HEAD_WIDTH)
            q = fused[:, :, :, :QUERIES_PER_GROUP].reshape(n, length, -1, HEAD_WIDTH)
            k, v = fused[:, :, :, QUERIES_PER_GROUP], fused[:, :, :, QUERIES_PER_GROUP + 1]
        q, k, v = (t.swapaxes(1, 2) for t in (q, k, v))
        context = _ms_causal_context(q, k, v, self.tiled, self.unscaled)
        return self.head(self.dense(context).reshape(n, -1))


class _MsSharedValues(msnn.Cell):
    def __init__(self, tiled: bool) -> None:
        super().__init__()
        self.tiled = tiled
        self.embed = msnn.Embedding(VOCABULARY, WIDTH)
        self.q_proj = msnn.Dense(WIDTH, WIDTH, has_bias=False)
        self.k_proj = msnn.Dense(WIDTH, GROUPS * HEAD_WIDTH, has_bias=False)
        self.v_proj = msnn.Dense(WIDTH, GROUPS * HEAD_WIDTH, has_bias=False)
        self.o_proj, self.head = msnn.Dense(WIDTH, WIDTH), msnn.Dense(WIDTH * TOKENS, 5)

    def construct(self, ids):
        x = self.embed(ids)
        n, length, _ = x.shape
        q, k, v = (projection(x).reshape(n, length, -1, HEAD_WIDTH).swapaxes(1, 2)
                   for projection in (self.q_proj, self.k_proj, self.v_proj))
        return self.head(self.o_proj(_ms_causal_context(q, k, v, self.tiled)).reshape(n, -1))


def torch_grouped_qkv() -> tnn.Module:
    return _TorchGroupedQkv()


def ms_grouped_qkv(blocks: bool = False, tiled: bool = False, unscaled: bool = False
                   ) -> msnn.Cell:
    """``blocks``: the fused output split as [q | k | v] (torch's group by group); ``tiled``:
    query head h reads key-value head h % 2 (torch's h // 2); ``unscaled``: the scores not
    divided by √head."""
    return _MsGroupedQkv(blocks, tiled, unscaled)


def torch_shared_values() -> tnn.Module:
    return _TorchSharedValues()


def ms_shared_values(tiled: bool = False) -> msnn.Cell:
    """``tiled``: query head h reads key-value head h % 2 (torch's h // 2)."""
    return _MsSharedValues(tiled)


# timm's ViT attends over every token (no mask), reading its fused output as three blocks
# [q | k | v], (3, heads, head); a port may read it head by head, or leave the scores unscaled.
class _TorchBidirectionalQkv(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = tnn.Embedding(VOCABULARY, WIDTH)
        self.qkv, self.proj = tnn.Linear(WIDTH, 3 * WIDTH), tnn.Linear(WIDTH, WIDTH)
        self.head = tnn.Linear(WIDTH * TOKENS, 5)

    def forward(self, ids):
        x = self.embed(ids)
        n, length, _ = x.shape
        q, k, v = self.qkv(x).view(n, length, 3, 2, WIDTH // 2).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / math.sqrt(WIDTH // 2)
        context = (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(n, length, WIDTH)
        return self.head(self.proj(context).flatten(1))


class _MsBidirectionalQkv(msnn.Cell):
    def __init__(self, head_by_head: bool, unscaled: bool) -> None:
        super().__init__()
        self.head_by_head, self.unscaled = head_by_head, unscaled
        self.embed = msnn.Embedding(VOCABULARY, WIDTH)
        self.qkv, self.proj = msnn.Dense(WIDTH, 3 * WIDTH), msnn.Dense(WIDTH, WIDTH)
        self.head = msnn.Dense(WIDTH * TOKENS, 5)

    def construct(self, ids):
        x = self.embed(ids)
        n, length, _ = x.shape
        fused = self.qkv(x)
        fused = fused.reshape(n, length, 2, 3, WIDTH // 2).transpose(3, 0, 2, 1, 4) \
            if self.head_by_head else \
            fused.reshape(n, length, 3, 2, WIDTH // 2).transpose(2, 0, 3, 1, 4)
        scores = ops.matmul(fused[0], fused[1].swapaxes(-1, -2))
        if not self.unscaled:
            scores = scores / math.sqrt(WIDTH // 2)
        context = ops.matmul(ops.softmax(scores, -1), fused[2]).swapaxes(1, 2)
        return self.head(self.proj(context.reshape(n, length, WIDTH)).reshape(n, -1))


def torch_bidirectional_qkv() -> tnn.Module:
    return _TorchBidirectionalQkv()


def ms_bidirectional_qkv(head_by_head: bool = False, unscaled: bool = False) -> msnn.Cell:
    """``head_by_head``: the fused output read as (heads, 3, head) (torch's as three blocks);
    ``unscaled``: the scores not divided by √head."""
    return _MsBidirectionalQkv(head_by_head, unscaled)


# Hugging Face's ViT and BERT return the attention's context from a module of its own, which
# projects q, k and v each; a port may split them into other heads, leave the scores unscaled
# or scale them by the whole width, or take q from the key projection and k from the query one.
class _TorchContext(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.query, self.key, self.value = (tnn.Linear(WIDTH, WIDTH) for _ in range(3))

    def forward(self, x):
        n, length, _ = x.shape
        q, k, v = (projection(x).view(n, length, 2, WIDTH // 2).transpose(1, 2)
                   for projection in (self.query, self.key, self.value))
        scores = q @ k.transpose(-1, -2) / math.sqrt(WIDTH // 2)
        return (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(n, length, WIDTH)


class _TorchSeparateQkv(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.attention = tnn.Embedding(VOCABULARY, WIDTH), _TorchContext()
        self.dense, self.head = tnn.Linear(WIDTH, WIDTH), tnn.Linear(WIDTH * TOKENS, 5)

    def forward(self, ids):
        return self.head(self.dense(self.attention(self.embed(ids))).flatten(1))


class _MsContext(msnn.Cell):
    def __init__(self, heads: int, scale: str, swapped: bool) -> None:
        super().__init__()
        self.heads, self.swapped = heads, swapped
        self.scale = {"head": (WIDTH // heads) ** -0.5, "none": 1.0, "width": WIDTH ** -0.5,
                      "d": heads / WIDTH}[scale]
        self.query, self.key, self.value = (msnn.Dense(WIDTH, WIDTH) for _ in range(3))

    def construct(self, x):
        n, length, _ = x.shape
        q, k, v = (projection(x).reshape(n, length, self.heads, -1).swapaxes(1, 2)
                   for projection in (self.query, self.key, self.value))
        if self.swapped:
            q, k = k, q
        scores = ops.matmul(q, k.swapaxes(-1, -2)) * self.scale
        return ops.matmul(ops.softmax(scores, -1), v).swapaxes(1, 2).reshape(n, length, WIDTH)


class _MsSeparateQkv(msnn.Cell):
    def __init__(self, heads: int, scale: str, swapped: bool) -> None:
        super().__init__()
        self.embed = msnn.Embedding(VOCABULARY, WIDTH)
        self.attention = _MsContext(heads, scale, swapped)
        self.dense, self.head = msnn.Dense(WIDTH, WIDTH), msnn.Dense(WIDTH * TOKENS, 5)

    def construct(self, ids):
        context = self.attention(self.embed(ids))
        return self.head(self.dense(context).reshape(context.shape[0], -1))


def torch_separate_qkv() -> tnn.Module:
    return _TorchSeparateQkv()


def ms_separate_qkv(heads: int = 2, scale: str = "head", swapped: bool = False) -> msnn.Cell:
    """``heads``: the attention's (torch's 2); ``scale``: the scores scaled by 1/√head, not
    at all ("none"), by 1/√width ("width") or by 1/head ("d"); ``swapped``: q taken from the
    key projection, k from the query one."""
    return _MsSeparateQkv(heads, scale, swapped)


# Hugging Face's Llama and GPT-NeoX turn q and k by position with a table their rotary module
# returns, cos and sin of the angles laid out as cat(freqs, freqs), each head's first dims paired
# as two halves (rotate_half); GPT-NeoX's over a part of each head. Llama's query heads share
# fewer key-value heads (repeat_kv). A port computing the table in its construct may pair
# neighbours as GPT-J does, turn each whole head, take another base, leave the rotation out, or
# leave the scores unscaled.
ROTARY_WIDTH, ROTARY_HEADS, ROTARY_GROUPS, ROTARY_DIMS = 32, 4, 2, 4
ROTARY_HEAD = ROTARY_WIDTH // ROTARY_HEADS


def _rotary_angles(length: int, dims: int, base: float = 10000.0, long_scaled: bool = False
                   ) -> np.ndarray:
    """``long_scaled``: the frequencies of the longer half of the wavelengths divided by 8, as
    Llama 3.1's rope_scaling divides those past its original context's."""
    frequencies = 1.0 / base ** (np.arange(0, dims, 2, dtype=np.float32) / dims)
    if long_scaled:
        frequencies[dims // 4:] /= 8
    return np.outer(np.arange(length, dtype=np.float32), frequencies).astype(np.float32)


class _TorchRotaryEmbedding(tnn.Module):
    def __init__(self, base: float = 10000.0, dims: int = ROTARY_DIMS,
                 long_scaled: bool = False) -> None:
        super().__init__()
        self.base, self.dims, self.long_scaled = base, dims, long_scaled

    def forward(self, x):
        angles = torch.from_numpy(_rotary_angles(x.shape[1], self.dims, self.base,
                                                 self.long_scaled))
        angles = torch.cat((angles, angles), -1)[None]
        return angles.cos(), angles.sin()


class _TorchRotaryAttention(tnn.Module):
    """``model_width``: the width it takes and returns, its scores scaled by 1/√(model_width /
    heads) (Gemma's query_pre_attn_scalar)."""

    def __init__(self, normed: bool = False, model_width: int = ROTARY_WIDTH) -> None:
        super().__init__()
        self.model_width = model_width
        self.q_proj = tnn.Linear(model_width, ROTARY_WIDTH)
        self.o_proj = tnn.Linear(ROTARY_WIDTH, model_width)
        self.k_proj, self.v_proj = (tnn.Linear(model_width, ROTARY_GROUPS * ROTARY_HEAD)
                                    for _ in range(2))
        self.q_norm, self.k_norm = (tnn.LayerNorm(ROTARY_HEAD) if normed else None
                                    for _ in range(2))

    def turned(self, y, cos, sin):
        """Hugging Face's apply_rotary_pos_emb on the first dims of each head its table holds."""
        part, rest = y[..., :cos.shape[-1]], y[..., cos.shape[-1]:]
        first, second = part.chunk(2, -1)
        return torch.cat((part * cos[:, None] + torch.cat((-second, first), -1) * sin[:, None],
                          rest), -1)

    def forward(self, x, cos=None, sin=None):
        n, length, _ = x.shape
        q, k, v = (projection(x).view(n, length, -1, ROTARY_HEAD)
                   for projection in (self.q_proj, self.k_proj, self.v_proj))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (y.transpose(1, 2) for y in (q, k, v))
        k, v = (y.repeat_interleave(ROTARY_HEADS // ROTARY_GROUPS, 1) for y in (k, v))
        scores = self.turned(q, cos, sin) @ self.turned(k, cos, sin).transpose(-1, -2) \
            / math.sqrt(self.model_width / ROTARY_HEADS)
        scores = scores.masked_fill(torch.ones(length, length).triu(1).bool(), float("-inf"))
        context = (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(n, length, -1)
        return self.o_proj(context)


class _TorchComplexRotaryAttention(_TorchRotaryAttention):
    """Meta's Llama: each whole head turned in neighbouring pairs, read as complex numbers and
    multiplied by the freqs_cis its forward computes."""

    def turned(self, y, cos, sin):
        angles = torch.from_numpy(_rotary_angles(y.shape[2], ROTARY_HEAD))
        freqs_cis = torch.polar(torch.ones_like(angles), angles)
        pairs = torch.view_as_complex(y.reshape(*y.shape[:-1], -1, 2).contiguous())
        return torch.view_as_real(pairs * freqs_cis).flatten(-2)


class _TorchRotary(tnn.Module):
    """``normed_after``: its attention's output normed ("output", OLMo 2's) or added to its
    input and normed ("sum", a pre-norm layer's next norm), o_proj scaled by SMALL_ATTENTION's
    and its bias zeroed; ``long_scaled``: its table over each whole head, as
    ``_rotary_angles``'s."""

    def __init__(self, computed: bool = False, normed: bool = False, local: bool = False,
                 normed_after: str = "", model_width: int = ROTARY_WIDTH,
                 long_scaled: bool = False) -> None:
        super().__init__()
        self.embed = tnn.Embedding(VOCABULARY, model_width)
        self.rotary_emb = None if computed else _TorchRotaryEmbedding(
            dims=ROTARY_HEAD if long_scaled else ROTARY_DIMS, long_scaled=long_scaled)
        self.rotary_emb_local = _TorchRotaryEmbedding(base=10.0) if local else None
        self.self_attn = _TorchComplexRotaryAttention() if computed else \
            _TorchRotaryAttention(normed, model_width)
        self.normed_after = normed_after
        self.input_norm = tnn.LayerNorm(model_width) if normed_after == "sum" else None
        self.post_norm = tnn.LayerNorm(model_width) if normed_after else None
        if normed_after:
            with torch.no_grad():
                self.self_attn.o_proj.weight.mul_(SMALL_ATTENTION[normed_after])
                self.self_attn.o_proj.bias.zero_()
                self.embed.weight.mul_(SMALL_EMBEDDINGS[normed_after])
        self.head = tnn.Linear(model_width * TOKENS, 5)

    def forward(self, ids):
        x = self.embed(ids)
        cos, sin = (None, None) if self.rotary_emb is None else self.rotary_emb(x)
        if self.rotary_emb_local is not None:       # the local layers' table: none here
            self.rotary_emb_local(x)
        if self.input_norm is None:
            y = self.self_attn(x, cos, sin)
        else:
            y = x + self.self_attn(self.input_norm(x), cos, sin)
        return self.head((y if self.post_norm is None else self.post_norm(y)).flatten(1))


class _MsRotaryAttention(msnn.Cell):
    def __init__(self, pairs: str, dims: int, divisor: float, base: float, tiled: bool,
                 normed: bool, model_width: int, long_scaled: bool) -> None:
        super().__init__()
        self.pairs, self.dims, self.divisor, self.tiled = pairs, dims, divisor, tiled
        self.q_proj = msnn.Dense(model_width, ROTARY_WIDTH)
        self.o_proj = msnn.Dense(ROTARY_WIDTH, model_width)
        self.k_proj, self.v_proj = (msnn.Dense(model_width, ROTARY_GROUPS * ROTARY_HEAD)
                                    for _ in range(2))
        self.normed = normed
        if normed:
            self.q_norm, self.k_norm = (msnn.LayerNorm((ROTARY_HEAD,), epsilon=1e-5)
                                        for _ in range(2))
        angles = _rotary_angles(TOKENS, dims, base, long_scaled)
        angles = np.repeat(angles, 2, -1) if pairs == "neighbours" else \
            np.concatenate((angles, angles), -1)
        self.cos, self.sin = mindspore.Tensor(np.cos(angles)), mindspore.Tensor(np.sin(angles))
        self.causal = mindspore.Tensor(np.tril(np.ones((TOKENS, TOKENS), bool)))

    def turned(self, y):
        if self.pairs == "none":
            return y
        part, rest = y[..., :self.dims], y[..., self.dims:]
        if self.pairs == "neighbours":
            paired = ops.stack((-part[..., 1::2], part[..., ::2]), -1).reshape(part.shape)
        else:
            paired = ops.cat((-part[..., self.dims // 2:], part[..., :self.dims // 2]), -1)
        return ops.cat((part * self.cos + paired * self.sin, rest), -1)

    def construct(self, x):
        n, length, _ = x.shape
        q, k, v = (projection(x).reshape(n, length, -1, ROTARY_HEAD)
                   for projection in (self.q_proj, self.k_proj, self.v_proj))
        if self.normed:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (y.swapaxes(1, 2) for y in (q, k, v))
        per_group = ROTARY_HEADS // ROTARY_GROUPS
        k, v = ((ops.tile(y, (1, per_group, 1, 1)) if self.tiled else
                 ops.repeat_interleave(y, per_group, 1)) for y in (k, v))
        scores = ops.matmul(self.turned(q), self.turned(k).swapaxes(-1, -2)) / self.divisor
        scores = ops.where(self.causal, scores, mindspore.Tensor(-1e30, mindspore.float32))
        context = ops.matmul(ops.softmax(scores, -1), v).swapaxes(1, 2)
        return self.o_proj(context.reshape(n, length, ROTARY_WIDTH))


class _MsRotary(msnn.Cell):
    def __init__(self, *knobs, normed_after: str, model_width: int, long_scaled: bool,
                 post_norm_eps: float) -> None:
        super().__init__()
        self.embed = msnn.Embedding(VOCABULARY, model_width)
        self.self_attn = _MsRotaryAttention(*knobs, model_width, long_scaled)
        self.normed_after = normed_after
        if normed_after == "sum":
            self.input_norm = msnn.LayerNorm((model_width,), epsilon=1e-5)
        if normed_after:
            self.post_norm = msnn.LayerNorm((model_width,), epsilon=post_norm_eps)
        self.head = msnn.Dense(model_width * TOKENS, 5)

    def construct(self, ids):
        x = self.embed(ids)
        if self.normed_after == "sum":
            y = x + self.self_attn(self.input_norm(x))
        else:
            y = self.self_attn(x)
        if self.normed_after:
            y = self.post_norm(y)
        return self.head(y.reshape(ids.shape[0], -1))


def torch_rotary() -> tnn.Module:
    return _TorchRotary()


def ms_rotary(pairs: str = "halves", dims: int = ROTARY_DIMS, unscaled: bool = False,
              base: float = 10000.0, tiled: bool = False, normed: bool = False,
              normed_after: str = "", model_width: int = ROTARY_WIDTH,
              head_scaled: bool = False, long_scaled: bool = False,
              post_norm_eps: float = 1e-5) -> msnn.Cell:
    """The port computes its rotary table in the attention's construct. ``pairs``: "halves"
    (torch's), "neighbours" (GPT-J's pairs, the angles laid out to match) or "none" (no
    rotation); ``dims``: how many of each head's 8 it turns (torch's 4); ``unscaled``: the
    scores not divided by √head; ``base``: the frequencies' (torch's 10000); ``tiled``: query
    head h reads key-value head h % groups (torch's h // (heads / groups)); ``normed``: q and
    k normed over each head, as ``torch_normed_rotary``'s; ``normed_after``, as
    ``_TorchRotary``'s; ``model_width``: as ``_TorchRotaryAttention``'s, the scores scaled by
    1/√(model_width / heads) but where ``head_scaled`` (by 1/√head); ``long_scaled``: the
    table's long wavelengths scaled, as ``_rotary_angles``'s; ``post_norm_eps``: the epsilon of
    the norm ``normed_after`` adds (torch's 1e-5)."""
    divisor = 1.0 if unscaled else math.sqrt(ROTARY_HEAD) if head_scaled else \
        math.sqrt(model_width / ROTARY_HEADS)
    return _MsRotary(pairs, dims, divisor, base, tiled, normed, normed_after=normed_after,
                     model_width=model_width, long_scaled=long_scaled,
                     post_norm_eps=post_norm_eps)


# Qwen3 and Gemma 3 norm q and k over each head (q_norm, k_norm) before turning them.
def torch_normed_rotary() -> tnn.Module:
    return _TorchRotary(normed=True)


def ms_normed_rotary(**bug) -> msnn.Cell:
    return ms_rotary(normed=True, **bug)


# Gemma 2's and 3's 27B return more columns from their attention than its heads hold (Gemma 3's
# 5376 from 32 heads of 128), their scores scaled by 1/√(5376 / 32) (query_pre_attn_scalar);
# a port may scale them by 1/√head, as most attentions do.
WIDE_ROTARY = 48


def torch_wide_rotary() -> tnn.Module:
    return _TorchRotary(model_width=WIDE_ROTARY)


def ms_wide_rotary(**bug) -> msnn.Cell:
    return ms_rotary(model_width=WIDE_ROTARY, **bug)


# OLMo 2 norms its attention's output (post_attention_layernorm), small at its initial weights:
# rms 1.3e-4 at width 32, against the forward tolerance's atol of 1e-6. Here o_proj's weights
# are scaled down, its output's rms to 2.2e-5-2.5e-5 (torch seeds 0-3: a port turning each whole
# head passes it 9-15 % off), and its bias zeroed. A pre-norm layer's next norm takes the
# attention's output added to the layer's input (Llama's post_attention_layernorm at width 32:
# 0.0044 against embeddings of rms 0.02, its initial std): here the attention's input normed
# first, its output of rms 9.8e-6 to 1.2e-5 (torch seeds 0-1) against embeddings of 0.02.
SMALL_ATTENTION = {"output": 1e-4, "sum": 5e-5}
SMALL_EMBEDDINGS = {"output": 1.0, "sum": 0.02}


def torch_post_normed_rotary() -> tnn.Module:
    return _TorchRotary(normed_after="output")


def ms_post_normed_rotary(**bug) -> msnn.Cell:
    return ms_rotary(normed_after="output", **bug)


def torch_summed_rotary() -> tnn.Module:
    return _TorchRotary(normed_after="sum")


def ms_summed_rotary(**bug) -> msnn.Cell:
    return ms_rotary(normed_after="sum", **bug)


# Llama 3.1 scales its rotary's long wavelengths (rope_scaling); a port may leave them plain.
def torch_long_scaled_rotary() -> tnn.Module:
    return _TorchRotary(long_scaled=True)


def ms_long_scaled_rotary(**bug) -> msnn.Cell:
    return ms_rotary(**{"dims": ROTARY_HEAD, "long_scaled": True, **bug})


# Gemma 3's model computes two rotary tables, its global layers' and then its local layers'
# (another base); a global layer turns q and k by the first.
def torch_two_tables_rotary() -> tnn.Module:
    return _TorchRotary(local=True)


ms_two_tables_rotary = ms_rotary


# Meta's Llama computes its rotary angles itself (freqs_cis, complex) and turns each whole
# head's neighbouring pairs; no module records them. A port ported from Hugging Face's code
# turns two halves instead (Hugging Face's conversion permutes q's and k's rows to make up for
# it), or takes Llama 3's base, 500000.
def torch_computed_rotary() -> tnn.Module:
    return _TorchRotary(computed=True)


def ms_computed_rotary(**bug) -> msnn.Cell:
    """ms_rotary's knobs, its defaults Meta's: neighbouring pairs over each whole head."""
    return ms_rotary(**{"pairs": "neighbours", "dims": ROTARY_HEAD, **bug})


# Whisper's and BART's decoders attend over the encoder's output: keys and values of another
# length than the queries (here the first half of the positions); a port may leave the scores
# unscaled or split them into other heads.
class _TorchCrossAttention(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            tnn.Linear(WIDTH, WIDTH) for _ in range(4))

    def forward(self, x, memory):
        n, length, _ = x.shape
        q, k, v = (projection(source).view(n, source.shape[1], 2, -1).transpose(1, 2)
                   for projection, source in ((self.q_proj, x), (self.k_proj, memory),
                                              (self.v_proj, memory)))
        scores = q @ k.transpose(-1, -2) / math.sqrt(WIDTH // 2)
        context = (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(n, length, WIDTH)
        return self.out_proj(context)


class _TorchCross(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.encoder_attn = tnn.Embedding(VOCABULARY, WIDTH), _TorchCrossAttention()
        self.head = tnn.Linear(WIDTH * TOKENS, 5)

    def forward(self, ids):
        x = self.embed(ids)
        return self.head(self.encoder_attn(x, x[:, :TOKENS // 2]).flatten(1))


class _MsCrossAttention(msnn.Cell):
    def __init__(self, heads: int, unscaled: bool) -> None:
        super().__init__()
        self.heads, self.unscaled = heads, unscaled
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            msnn.Dense(WIDTH, WIDTH) for _ in range(4))

    def construct(self, x, memory):
        n, length, _ = x.shape
        q = self.q_proj(x).reshape(n, length, self.heads, -1).swapaxes(1, 2)
        k, v = (projection(memory).reshape(n, memory.shape[1], self.heads, -1).swapaxes(1, 2)
                for projection in (self.k_proj, self.v_proj))
        scores = ops.matmul(q, k.swapaxes(-1, -2))
        if not self.unscaled:
            scores = scores / math.sqrt(WIDTH // self.heads)
        context = ops.matmul(ops.softmax(scores, -1), v).swapaxes(1, 2)
        return self.out_proj(context.reshape(n, length, WIDTH))


class _MsCross(msnn.Cell):
    def __init__(self, heads: int, unscaled: bool) -> None:
        super().__init__()
        self.embed = msnn.Embedding(VOCABULARY, WIDTH)
        self.encoder_attn = _MsCrossAttention(heads, unscaled)
        self.head = msnn.Dense(WIDTH * TOKENS, 5)

    def construct(self, ids):
        x = self.embed(ids)
        return self.head(self.encoder_attn(x, x[:, :TOKENS // 2]).reshape(ids.shape[0], -1))


def torch_cross_attention() -> tnn.Module:
    return _TorchCross()


def ms_cross_attention(heads: int = 2, unscaled: bool = False) -> msnn.Cell:
    """``heads``: the attention's (torch's 2); ``unscaled``: the scores not divided by
    √head."""
    return _MsCross(heads, unscaled)


# Falcon's layer normalises its input twice, for the attention and for the MLP, with norms
# equal at their initial weights, and adds both to it in parallel; a port may call the first
# norm for both, or add the attention's output before normalising for the MLP.
class _TorchTwoNorms(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = tnn.Linear(FEATURES, FEATURES)
        self.ln_attn, self.ln_mlp = tnn.LayerNorm(FEATURES), tnn.LayerNorm(FEATURES)
        self.attention, self.mlp = tnn.Linear(FEATURES, FEATURES), tnn.Linear(FEATURES, FEATURES)
        self.head = tnn.Linear(FEATURES, 5)

    def forward(self, x):
        x = self.embed(x)
        attention_input, mlp_input = self.ln_attn(x), self.ln_mlp(x)
        return self.head(x + self.attention(attention_input) + self.mlp(mlp_input))


class _MsTwoNorms(msnn.Cell):
    def __init__(self, one_norm: bool, serial: bool) -> None:
        super().__init__()
        self.one_norm, self.serial = one_norm, serial
        self.embed = msnn.Dense(FEATURES, FEATURES)
        self.ln_attn = msnn.LayerNorm((FEATURES,), epsilon=1e-5)
        self.ln_mlp = msnn.LayerNorm((FEATURES,), epsilon=1e-5)
        self.attention, self.mlp = msnn.Dense(FEATURES, FEATURES), msnn.Dense(FEATURES, FEATURES)
        self.head = msnn.Dense(FEATURES, 5)

    def construct(self, x):
        x = self.embed(x)
        if self.serial:
            hidden = x + self.attention(self.ln_attn(x))
            return self.head(hidden + self.mlp(self.ln_mlp(hidden)))
        attention_input = self.ln_attn(x)
        mlp_input = self.ln_attn(x) if self.one_norm else self.ln_mlp(x)
        return self.head(x + self.attention(attention_input) + self.mlp(mlp_input))


def torch_two_norms() -> tnn.Module:
    return _TorchTwoNorms()


def ms_two_norms(one_norm: bool = False, serial: bool = False) -> msnn.Cell:
    """``one_norm``: ln_attn's output read in ln_mlp's place (its cell never called);
    ``serial``: the MLP's norm given the input plus the attention's output."""
    return _MsTwoNorms(one_norm, serial)


# Hugging Face's BLOOM hands its attention the residual to add: the layer's input, or the normed
# input where its config says apply_residual_connection_post_layernorm.
class _TorchResidualAdding(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dense = tnn.Linear(FEATURES, FEATURES)

    def forward(self, x, residual):
        return self.dense(x) + residual


class _TorchResidualGiven(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.input_layernorm = tnn.Linear(FEATURES, FEATURES), tnn.LayerNorm(FEATURES)
        self.attention, self.head = _TorchResidualAdding(), tnn.Linear(FEATURES, 5)

    def forward(self, x):
        x = self.embed(x)
        return self.head(self.attention(self.input_layernorm(x), x))


class _MsResidualAdding(msnn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.dense = msnn.Dense(FEATURES, FEATURES)

    def construct(self, x, residual):
        return self.dense(x) + residual


class _MsResidualGiven(msnn.Cell):
    def __init__(self, normed_residual: bool) -> None:
        super().__init__()
        self.normed_residual = normed_residual
        self.embed = msnn.Dense(FEATURES, FEATURES)
        self.input_layernorm = msnn.LayerNorm((FEATURES,), epsilon=1e-5)
        self.attention, self.head = _MsResidualAdding(), msnn.Dense(FEATURES, 5)

    def construct(self, x):
        x = self.embed(x)
        normed = self.input_layernorm(x)
        return self.head(self.attention(normed, normed if self.normed_residual else x))


def torch_residual_given() -> tnn.Module:
    return _TorchResidualGiven()


def ms_residual_given(normed_residual: bool = False) -> msnn.Cell:
    return _MsResidualGiven(normed_residual)


# DINOv2's embeddings add a position table of their own, resized to the image in their forward,
# after the modules they run; a port may place or resize the table otherwise. Here the table's
# 4 values are each repeated 4 times (repeat_interleave), or, in the port, tiled.
class _TorchTabled(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj, self.norm = tnn.Linear(FEATURES, FEATURES), tnn.LayerNorm(FEATURES)
        self.table = tnn.Parameter(torch.linspace(-1.0, 1.0, FEATURES // 4))

    def forward(self, x):
        return self.norm(self.proj(x)) + self.table.repeat_interleave(4)


class _MsTabled(msnn.Cell):
    def __init__(self, tiled: bool) -> None:
        super().__init__()
        self.tiled = tiled
        self.proj = msnn.Dense(FEATURES, FEATURES)
        self.norm = msnn.LayerNorm((FEATURES,), epsilon=1e-5)
        self.table = mindspore.Parameter(mindspore.Tensor(np.zeros(FEATURES // 4, np.float32)))

    def construct(self, x):
        table = ops.tile(self.table, (4,)) if self.tiled else ops.repeat_interleave(self.table, 4)
        return self.norm(self.proj(x)) + table


# DINOv2's layer scale, a module of its own multiplying by its lambda1; a port's may return its
# input as given (a flag read otherwise).
class _TorchScaling(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lambda1 = tnn.Parameter(torch.full((FEATURES,), 0.5))

    def forward(self, x):
        return x * self.lambda1


class _MsScaling(msnn.Cell):
    def __init__(self, scaling: bool) -> None:
        super().__init__()
        self.scaling = scaling
        self.lambda1 = mindspore.Parameter(mindspore.Tensor(np.ones(FEATURES, np.float32)))

    def construct(self, x):
        return x * self.lambda1 if self.scaling else x


def torch_tabled() -> tnn.Module:
    return tnn.Sequential(OrderedDict(embeddings=_TorchTabled(), layer_scale=_TorchScaling(),
                                      head=tnn.Linear(FEATURES, 5)))


def ms_tabled(tiled: bool = False, scaling: bool = True) -> msnn.Cell:
    """``tiled``: the table tiled where torch repeats each value; ``scaling``: the layer scale
    multiplies (else returns its input)."""
    return msnn.SequentialCell(OrderedDict(embeddings=_MsTabled(tiled),
                                           layer_scale=_MsScaling(scaling),
                                           head=msnn.Dense(FEATURES, 5)))


# Hugging Face's DINOv2: its model returns its states and, recorded after them, its pooled class
# token; its classifier reads the class token and the mean of the tokens after it, concatenated.
class _TorchStatesAndPooled(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.norm = tnn.Embedding(VOCABULARY, WIDTH), tnn.LayerNorm(WIDTH)

    def forward(self, ids):
        states = self.norm(self.embed(ids))
        return states, states[:, 0]


class _TorchTwoPooled(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model, self.classifier = _TorchStatesAndPooled(), tnn.Linear(2 * WIDTH, 5)

    def forward(self, ids):
        states, _ = self.model(ids)
        return self.classifier(torch.cat([states[:, 0], states[:, 1:].mean(1)], 1))


class _MsStates(msnn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.embed = msnn.Embedding(VOCABULARY, WIDTH)
        self.norm = msnn.LayerNorm((WIDTH,), epsilon=1e-5)

    def construct(self, ids):
        return self.norm(self.embed(ids))


class _MsTwoPooled(msnn.Cell):
    def __init__(self, pooled: str) -> None:
        super().__init__()
        self.pooled = pooled
        self.model, self.classifier = _MsStates(), msnn.Dense(2 * WIDTH, 5)

    def construct(self, ids):
        states = self.model(ids)
        pooled = states[:, 1:].mean(1) if self.pooled == "after" else \
            states.mean(1) if self.pooled == "all" else states[:, 0]
        return self.classifier(ops.cat((states[:, 0], pooled), axis=1))


def torch_two_pooled() -> tnn.Module:
    return _TorchTwoPooled()


def ms_two_pooled(pooled: str = "after") -> msnn.Cell:
    """``pooled``, beside the class token: the mean of the tokens "after" it (torch's), of
    "all" of them, or the "first" again."""
    return _MsTwoPooled(pooled)


# BEiT's relative position bias: a table of its own gathered by a relative-position index it
# builds, (heads, T, T), added to attention scores; a port may build the index otherwise (here
# j - i for torch's i - j).
class _TorchGatheredBias(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = tnn.Parameter(torch.randn(2 * TOKENS - 1, 2))
        positions = torch.arange(TOKENS)
        self.index = positions[:, None] - positions[None, :] + TOKENS - 1

    def forward(self):
        return self.table[self.index].permute(2, 0, 1)


class _TorchBiasedScores(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.relative_bias = tnn.Embedding(VOCABULARY, WIDTH), _TorchGatheredBias()
        self.head = tnn.Linear(WIDTH * TOKENS, 5)

    def forward(self, ids):
        x = self.embed(ids)
        scores = x @ x.transpose(1, 2) / math.sqrt(WIDTH) + self.relative_bias().sum(0)
        return self.head((torch.softmax(scores, -1) @ x).flatten(1))


class _MsGatheredBias(msnn.Cell):
    def __init__(self, transposed: bool) -> None:
        super().__init__()
        self.table = mindspore.Parameter(mindspore.Tensor(np.zeros((2 * TOKENS - 1, 2),
                                                                   np.float32)))
        positions = np.arange(TOKENS)
        index = positions[:, None] - positions[None, :] + TOKENS - 1
        self.index = mindspore.Tensor((index.T if transposed else index).reshape(-1))

    def construct(self):
        return ops.gather(self.table, self.index, 0).reshape(TOKENS, TOKENS, 2).transpose(2, 0, 1)


class _MsBiasedScores(msnn.Cell):
    def __init__(self, transposed: bool) -> None:
        super().__init__()
        self.embed = msnn.Embedding(VOCABULARY, WIDTH)
        self.relative_bias = _MsGatheredBias(transposed)
        self.head = msnn.Dense(WIDTH * TOKENS, 5)

    def construct(self, ids):
        x = self.embed(ids)
        scores = ops.matmul(x, x.swapaxes(1, 2)) / math.sqrt(WIDTH) + self.relative_bias().sum(0)
        return self.head(ops.matmul(ops.softmax(scores, -1), x).reshape(x.shape[0], -1))


def torch_biased_scores() -> tnn.Module:
    return _TorchBiasedScores()


def ms_biased_scores(transposed: bool = False) -> msnn.Cell:
    """``transposed``: the relative index j - i where torch's is i - j."""
    return _MsBiasedScores(transposed)


# BEiT's layer multiplies its attention's output by a parameter of its own, lambda_1, in its
# forward; a port may leave it out.
class _TorchScaledResidual(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = tnn.Linear(FEATURES, FEATURES)
        self.lambda_1 = tnn.Parameter(torch.full((FEATURES,), 0.1))

    def forward(self, x):
        return x + self.lambda_1 * self.fc(x)


class _MsScaledResidual(msnn.Cell):
    def __init__(self, scaled: bool) -> None:
        super().__init__()
        self.scaled = scaled
        self.fc = msnn.Dense(FEATURES, FEATURES)
        self.lambda_1 = mindspore.Parameter(mindspore.Tensor(np.ones(FEATURES, np.float32)))

    def construct(self, x):
        return x + (self.lambda_1 * self.fc(x) if self.scaled else self.fc(x))


def torch_scaled_residual() -> tnn.Module:
    return tnn.Sequential(OrderedDict(layer=_TorchScaledResidual(),
                                      norm=tnn.LayerNorm(FEATURES), head=tnn.Linear(FEATURES, 5)))


def ms_scaled_residual(scaled: bool = True) -> msnn.Cell:
    return msnn.SequentialCell(OrderedDict(layer=_MsScaledResidual(scaled),
                                           norm=msnn.LayerNorm((FEATURES,), epsilon=1e-5),
                                           head=msnn.Dense(FEATURES, 5)))
