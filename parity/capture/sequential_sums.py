"""Torch's rerounded steps with each training BatchNorm's backward rounding its channel means
as a sequential float32 sum would: as another correct float32 kernel may.

A BatchNorm on batch statistics removes each channel's mean from the gradient it passes back,
dx = γ/σ · (dy − mean(dy) − x̂·mean(dy·x̂)): in exact arithmetic dx sums to zero in every
channel, and what is left is the rounding of mean(dy). Where dy is nearly one value per channel
(a head averaging over space right after the BatchNorm) that rounding grows with the values a
channel holds, and the weight gradient of the layer before adds it up over every position of an
input that after a ReLU is not centred. Torch's kernel leaves little of it, MindSpore 2.8.0's
CPU kernel about ten times more. Measured on correct pairs at batch 2 (two conv-BN-ReLU blocks,
a mean over space and a dense layer, a scratch pair; tests/tiny.py's torch_pooled_unet), per
channel, the rms of each side's Σdx, and the error of a sequential float32 sum of dy (N, H, W
order) times γ/σ:

    values a channel                       torch      MindSpore   sequential float32 sum
    8,192 (64²)                            1.7e-7     1.5e-6      4.9e-6
    32,768 (128²)                          7.6e-7     6.1e-6      1.4e-5
    8,192, a U-Net-like pair's last BN     2.3e-7     3.1e-6      8.0e-6
    8,192, dy of mixed signs (the first BN, layers after it)
                                           6.5e-10    5.8e-10     8.3e-10

Torch's float32 error, drawn from its own kernel alone, missed it: those correct ports failed at
the last conv's weight gradient (in the U-Net-like pair also at the layers before it, which the
constant reaches) at 8.1 to 17.7 times torch's float32 error, 0.10 to 0.36 % apart. So each
rerounded step subtracts from dx, per channel, γ/σ · (sequential float32 Σdy − Σdy)/n: the
rounding such a kernel leaves, 1.4 to 3.3 times MindSpore's above. Where dy's signs are mixed
that is about the kernels' own rounding, and the draws change little (ResNet50 at batch 2, 64²:
no record's float32 error moved by 5 %). The bias gradient, Σdy itself, is moved by that sum's
rounding too (MindSpore's was 6.8 times torch's float32 error in the U-Net-like pair). The
rounding of mean(dy·x̂) is not drawn: it was the same on both sides.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import lru_cache, partial
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from parity.rounding import sequential_sum_error


@contextmanager
def sequential_channel_sums(model: Any) -> Iterator[None]:
    """Each BatchNorm of ``model`` that normalises with batch statistics passes back the
    gradient a kernel summing dy's channels sequentially in float32 would, while active."""
    import torch
    handles = []
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and \
                (module.training or module.running_mean is None):
            calls: List[Optional[Dict[str, Any]]] = []    # per call in flight: it may run twice
            sums: List[np.ndarray] = []                   # each call's, for the bias gradient
            handles += [module.register_forward_pre_hook(partial(_before, calls)),
                        module.register_forward_hook(partial(_after, calls, sums))]
            if module.bias is not None and module.bias.requires_grad:
                handles.append(module.bias.register_hook(partial(_bias_moved, sums)))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _before(calls: List[Optional[Dict[str, Any]]], _module: Any,
            inputs: Tuple[Any, ...]) -> Any:
    """The BatchNorm's input through an identity whose backward moves dx by the rounding
    measured from the output's gradient."""
    import torch
    x = inputs[0] if inputs else None
    if not isinstance(x, torch.Tensor) or not x.requires_grad or x.dim() < 2 or \
            not x.is_floating_point():
        calls.append(None)
        return None
    call: Dict[str, Any] = {}
    calls.append(call)
    return (_moved().apply(x, call), *inputs[1:])


def _after(calls: List[Optional[Dict[str, Any]]], sums: List[np.ndarray], module: Any,
           inputs: Tuple[Any, ...], output: Any) -> None:
    """γ/σ per channel (σ as the forward computed it, kept for its backward), and the hook
    measuring the rounding from the output's gradient."""
    import torch
    call = calls.pop()
    if call is None or not getattr(output, "requires_grad", False):
        return
    x = inputs[0]
    invstd = getattr(output.grad_fn, "_saved_result2", None)     # torch's native batch norm
    with torch.no_grad():
        if not isinstance(invstd, torch.Tensor) or invstd.shape != (x.shape[1],):
            invstd = torch.rsqrt(torch.var(x, dim=[0, *range(2, x.dim())], unbiased=False)
                                 + module.eps)
        scale = invstd if module.weight is None else invstd * module.weight.abs()
    call.update(scale=scale.double().numpy(), count=x.numel() // x.shape[1], sums=sums)
    output.register_hook(partial(_measure, call))


def _measure(call: Dict[str, Any], dy: Any) -> None:
    """γ/σ · (sequential float32 Σdy − Σdy)/n per channel, for the input's backward, and
    sequential float32 Σdy − Σdy, for the bias gradient (which is Σdy)."""
    off = sequential_sum_error(dy.detach().movedim(1, -1).reshape(-1, dy.shape[1]).float().numpy())
    call["shift"] = call["scale"] * off / call["count"]
    call["sums"].append(off)


def _bias_moved(sums: List[np.ndarray], grad: Any) -> Any:
    """The bias gradient as a sequential float32 sum of dy would make it (every call's)."""
    import torch
    if not sums:
        return None
    off = np.sum(sums, axis=0)
    sums.clear()
    return grad + torch.from_numpy(off).to(grad.dtype).reshape(grad.shape)


@lru_cache(maxsize=None)
def _moved() -> Any:
    """The identity whose backward subtracts the shift (made at first use: importing this
    module imports no torch)."""
    import torch

    class Moved(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, call):
            ctx.call = call
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            shift = ctx.call.pop("shift", None)
            if shift is None:
                return grad, None
            shape = [1] * grad.dim()
            shape[1] = -1
            return grad - torch.from_numpy(shift).to(grad.dtype).reshape(shape), None
    return Moved
