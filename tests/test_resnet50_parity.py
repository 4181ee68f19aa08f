"""The project's own regression test of the built-in pair, through the pytest plugin."""

from __future__ import annotations

import mindspore  # noqa: F401  (before torch)
import torch
import torchvision

from models import resnet_mindspore


def test_resnet50_port_keeps_parity(parity_check):
    torch.manual_seed(0)
    parity_check(torchvision.models.resnet50(), resnet_mindspore.resnet50(),
                 batch_size=2, image_size=64).assert_passed()
