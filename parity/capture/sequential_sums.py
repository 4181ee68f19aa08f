"""Torch's rerounded steps with each training BatchNorm's, LayerNorm's, GroupNorm's and PReLU's
backward summing as a sequential float32 sum would: as another correct float32 kernel may, and
as MindSpore 2.8.0's CPU kernels do.

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

A GroupNorm's bias and weight gradients are where MindSpore's GroupNorm kernel rounds more: it
sums dy and dy·x over each sample's channel one value after another (H, W order) in float32,
and takes γ's gradient as Σ over samples of (Σdy·x − μ·Σdy)/σ, μ and σ its group's, so Σdy's
rounding, times μ/σ, does not cancel. That model is MindSpore's gradients to the bit or nearly
(two conv-GroupNorm-ReLU blocks, a mean over space and a dense layer, scratch pairs; the rms
off the exact sums, torch's, MindSpore's, and the rms of MindSpore's less the model's):

    pair, batch, image                            torch      MindSpore  MindSpore − model
    16/32 channels, 2, 224²             beta      1.6e-6     1.2e-5     1.1e-9
                                        gamma     1.4e-7     1.6e-6     3.1e-9
    4/8 channels, 1, 256²               beta      6.1e-6     5.9e-5     0
                                        gamma     1.8e-6     1.8e-5     2.0e-9

The first pair passed narrowly (worst 7.7 and 7.8 times torch's float32 error, seeds 0 and 1, at
beta's gradient), the second failed (up to 9.8 times there, and at gamma's, as not the sum of
its own terms, 41.3 and 43.4 times a sum's rounding) until torch's rerounded steps moved both
gradients by what those sums leave (worst 1.1 and 1.2). dx is left alone: there MindSpore's
kernel is the more exact (the rms of Σdx over a group, torch 7.6e-6, MindSpore 2.2e-11, in the
first pair).

A LayerNorm removes each row's mean from dx as a BatchNorm does each channel's, and MindSpore's
kernel takes mean(γ·dy) as a sequential float32 sum over the row: where a LayerNorm normalises
a sample's channels and space (two conv-LayerNorm-ReLU blocks, a mean over space and a dense
layer, 4/8 channels, batch 2, 256², tests/tiny.py's torch_pooled_layer_norm), MindSpore's Σdx
over a row was minus that sum's rounding over σ, within 3 % (5.66e-4 and 4.38e-4 in the second
LayerNorm, 524,288 values a row; 5.81e-7 and -9.2e-8 in the first), torch's 1.1e-5 and -8.5e-6
(-5.4e-8 and -9.1e-9), and the convs before, which add that constant up over every position,
failed the correct port in 3 of 6 seeds (up to 142 times torch's float32 error; worst 1.5
with the draw). So each rerounded step subtracts (sequential float32 Σγ·dy − Σγ·dy)/(n·σ) from
dx in each row. A LayerNorm over a channels-last feature map's channels (16 values a row) passed
before and after (worst 3.2, 3.6): its rows are short. Its weight and bias gradients are not
drawn: MindSpore's bias gradient is a sequential float32 sum over the rows to the bit, but
torch's is off the exact sum by as much (rms 2.3e-5 and 9.1e-5 against MindSpore's 5.2e-5 and
7.1e-5, batch 2, 224² and batch 4, 320²), so torch's own error covers it.

A PReLU's weight gradient is Σx·dy over x < 0: MindSpore's kernel adds it up one value after
another in float32, over the whole input in memory order for one weight, over each channel's
values for one a channel (its gradient off that model by torch's own rounding: rms 6.1e-5 and
2.5e-6, torch's off the exact sum 4.0e-5 and 2.2e-6, MindSpore's 5.1e-2 and 2.0e-4, one weight
and sixteen over 2×16×256² values). Two conv-PReLU blocks with one weight each, a mean over
space and a dense layer (tests/tiny.py's torch_pooled_prelu, batch 2, 256²) failed its correct
port there at 11.1 and 183 times torch's float32 error (seeds 0 and 1) until torch's rerounded
steps moved each PReLU's weight gradient by what that sum leaves.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import lru_cache, partial
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from parity.rounding import sequential_sum_error


@contextmanager
def sequential_kernel_sums(model: Any) -> Iterator[None]:
    """Each BatchNorm of ``model`` that normalises with batch statistics, each LayerNorm,
    each GroupNorm with weight and bias, and each PReLU, passes back the gradients a kernel
    summing sequentially in float32 would, while active."""
    import torch
    handles = []
    for module in model.modules():
        if _runs_its_class_forward(module, torch.nn.modules.batchnorm._BatchNorm) and \
                (module.training or module.running_mean is None):
            handles += _batch_norm_hooks(module)
        elif _runs_its_class_forward(module, torch.nn.LayerNorm):
            handles += _layer_norm_hooks(module)
        elif _runs_its_class_forward(module, torch.nn.GroupNorm) and module.affine:
            handles += _group_norm_hooks(module)
        elif _runs_its_class_forward(module, torch.nn.PReLU) and module.weight.requires_grad:
            handles += _prelu_hooks(module)
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _runs_its_class_forward(module: Any, kind: type) -> bool:
    """A ``kind`` whose forward is that class's own: a subclass's may compute over other axes
    (torchvision's LayerNorm2d, in ConvNeXt, normalises its input's channels, moved last)."""
    return isinstance(module, kind) and type(module).forward is kind.forward


def _batch_norm_hooks(module: Any) -> List[Any]:
    calls: List[Optional[Dict[str, Any]]] = []    # per call in flight: it may run twice
    sums: List[np.ndarray] = []                   # each call's, for the bias gradient
    handles = [module.register_forward_pre_hook(partial(_before, calls)),
               module.register_forward_hook(partial(_after, calls, sums))]
    if module.bias is not None and module.bias.requires_grad:
        handles.append(module.bias.register_hook(partial(_moved_by, sums)))
    return handles


def _layer_norm_hooks(module: Any) -> List[Any]:
    calls: List[Optional[Dict[str, Any]]] = []
    return [module.register_forward_pre_hook(partial(_before, calls)),
            module.register_forward_hook(partial(_layer_norm_after, calls))]


def _before(calls: List[Optional[Dict[str, Any]]], _module: Any,
            inputs: Tuple[Any, ...]) -> Any:
    """The norm's input through an identity whose backward moves dx by the rounding measured
    from the output's gradient."""
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
    """γ/σ per channel, and the hook measuring the rounding from the output's gradient.

    σ is computed again (0.26 s over ResNet50's BatchNorm inputs at batch 8, 224²), not read
    from what the forward kept for its backward: inside activation checkpointing, reading a
    kept tensor in the forward makes torch run the block once more, updating its running
    statistics a third time."""
    import torch
    call = calls.pop()
    if call is None or not getattr(output, "requires_grad", False):
        return
    x = inputs[0]
    with torch.no_grad():
        invstd = torch.rsqrt(torch.var(x, dim=[0, *range(2, x.dim())], unbiased=False)
                             + module.eps)
        scale = invstd if module.weight is None else invstd * module.weight.abs()
    call.update(scale=scale.double().numpy(), count=x.numel() // x.shape[1], sums=sums)
    output.register_hook(partial(_measure, call))


def _measure(call: Dict[str, Any], dy: Any) -> None:
    """γ/σ · (sequential float32 Σdy − Σdy)/n per channel, for the input's backward, and
    sequential float32 Σdy − Σdy, for the bias gradient (which is Σdy)."""
    off = sequential_sum_error(_channel_rows(dy.detach().float()))
    shape = [1] * dy.dim()
    shape[1] = -1
    call["shift"] = (call["scale"] * off / call["count"]).reshape(shape)
    call["sums"].append(off)


def _layer_norm_after(calls: List[Optional[Dict[str, Any]]], module: Any,
                      inputs: Tuple[Any, ...], output: Any) -> None:
    """1/σ per normalised row, and the hook measuring the rounding from the output's
    gradient."""
    import torch
    call = calls.pop()
    if call is None or not getattr(output, "requires_grad", False):
        return
    dims = tuple(range(-len(module.normalized_shape), 0))
    with torch.no_grad():
        var = torch.var(inputs[0].detach().float(), dim=dims, unbiased=False, keepdim=True)
    call["invstd"] = torch.rsqrt(var + module.eps).double().numpy()
    output.register_hook(partial(_measure_layer_norm, call, module))


def _measure_layer_norm(call: Dict[str, Any], module: Any, dy: Any) -> None:
    """(sequential float32 Σγ·dy − Σγ·dy)/(n·σ) per row: dx's mean as such a kernel leaves it
    (MindSpore's: above)."""
    terms = dy.detach().float()
    if module.weight is not None:
        terms = terms * module.weight.detach().float()
    invstd = call["invstd"]
    rows = _runs_as_columns(terms, invstd.size)
    call["shift"] = sequential_sum_error(rows).reshape(invstd.shape) * invstd / len(rows)


def _group_norm_hooks(module: Any) -> List[Any]:
    offsets: Dict[str, List[np.ndarray]] = {"weight": [], "bias": []}   # each call's
    handles = [module.register_forward_hook(partial(_group_norm_after, offsets))]
    for name, values in offsets.items():
        param = getattr(module, name)
        if param.requires_grad:
            handles.append(param.register_hook(partial(_moved_by, values)))
    return handles


def _group_norm_after(offsets: Dict[str, List[np.ndarray]], module: Any,
                      inputs: Tuple[Any, ...], output: Any) -> None:
    if getattr(output, "requires_grad", False) and output.dim() > 2:
        output.register_hook(partial(_measure_group_norm, offsets, module, inputs[0].detach()))


def _measure_group_norm(offsets: Dict[str, List[np.ndarray]], module: Any, x: Any,
                        dy: Any) -> None:
    """What the sums over each sample's channel, Σdy and Σdy·x, leave in β's and γ's gradients
    when taken one value after another in float32: γ's is Σ over samples of
    (Σdy·x − μ·Σdy)/σ, whose two terms cancel, so Σdy's rounding, times μ/σ, is most of it."""
    import torch
    batch, channels = dy.shape[:2]
    dy = dy.detach().float()
    with torch.no_grad():
        var, mean = torch.var_mean(x.float().reshape(batch, module.num_groups, -1), dim=-1,
                                   unbiased=False)
        per_channel = channels // module.num_groups
        mean, invstd = (t.repeat_interleave(per_channel, dim=1).double().numpy()
                        for t in (mean, torch.rsqrt(var + module.eps)))
        dy_sum, dyx_sum = (sequential_sum_error(_runs_as_columns(terms, batch * channels))
                           .reshape(batch, channels) for terms in (dy, dy * x.float()))
    offsets["bias"].append(dy_sum.sum(axis=0))
    offsets["weight"].append(((dyx_sum - mean * dy_sum) * invstd).sum(axis=0))


def _prelu_hooks(module: Any) -> List[Any]:
    offsets: List[np.ndarray] = []
    return [module.register_forward_hook(partial(_prelu_after, offsets)),
            module.weight.register_hook(partial(_moved_by, offsets))]


def _prelu_after(offsets: List[np.ndarray], module: Any, inputs: Tuple[Any, ...],
                 output: Any) -> None:
    x = inputs[0]
    if getattr(output, "requires_grad", False) and (x.dim() > 1 or module.weight.numel() == 1):
        output.register_hook(partial(_measure_prelu, offsets, module, x.detach()))


def _measure_prelu(offsets: List[np.ndarray], module: Any, x: Any, dy: Any) -> None:
    """What Σx·dy over x < 0 leaves, summed one value after another in float32: over the whole
    input in memory order for one weight, over each channel's values for one a channel."""
    import torch
    with torch.no_grad():
        terms = torch.where(x < 0, x.float() * dy.detach().float(), torch.zeros(()))
        rows = terms.reshape(-1, 1).numpy() if module.weight.numel() == 1 else \
            _channel_rows(terms)
        offsets.append(sequential_sum_error(rows))


def _runs_as_columns(values: Any, runs: int) -> np.ndarray:
    """``values`` cut into ``runs`` runs of consecutive values (a LayerNorm's rows, a
    GroupNorm's sample channels), each run one column, its values down the rows in order."""
    return values.reshape(runs, -1).t().numpy()


def _channel_rows(values: Any) -> np.ndarray:
    """One column a channel (axis 1), its values down the rows in the order a kernel walks
    them through memory: sample after sample, position after position."""
    return values.movedim(1, -1).reshape(-1, values.shape[1]).numpy()


def _moved_by(offsets: List[np.ndarray], grad: Any) -> Any:
    """A parameter's gradient moved by what every call's sequential float32 sums left."""
    import torch
    if not offsets:
        return None
    off = np.sum(offsets, axis=0)
    offsets.clear()
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
            return grad - torch.from_numpy(shift).to(grad.dtype), None
    return Moved
