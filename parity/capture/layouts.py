"""Layers holding their weight as (in, out) and computing x @ W + b, told by what they compute:
Hugging Face's ``Conv1D`` (GPT-2's every linear layer), or a port's own cell written so. torch's
Linear and MindSpore's Dense hold theirs as (out, in), and a port of GPT-2 with Dense layers
needs each Conv1D weight transposed: the weight transfer takes such weights transposed where
one side holds them so and the other not, and the port's records are stored in torch's layout.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterable, Iterator, List, Optional, Tuple

import numpy as np

from parity.capture.hooks import called_alone, op_type

# How close a layer's output must be to x @ W + b to be that, relative to its largest value:
# float32 rounding of sums of products, far below x @ W.T's distance from it for a random W.
PRODUCT_ROUNDING = 1e-4


def weights_held_in_out(named_modules: Iterable[Tuple[str, Any]]) -> List[str]:
    """The parameter names (``module.weight``) of the layers of unknown type, holding a 2-D
    ``weight`` and perhaps a ``bias`` and nothing else, that compute x @ W + b on a probe."""
    found = []
    for name, module in named_modules:
        if op_type(module) != "module":          # torch's Linear, MindSpore's Dense: (out, in)
            continue
        weight = _layer_weight(module)
        if weight is not None and _computes_x_at_w(module, weight):
            found.append(f"{name}.weight" if name else "weight")
    return found


def _own_parameters(module: Any) -> Optional[dict]:
    """A torch module's or MindSpore cell's parameters by attribute name, where it holds no
    module of its own; else None."""
    if hasattr(module, "named_parameters"):                   # torch
        if any(True for _ in module.children()):
            return None
        return dict(module.named_parameters(recurse=False))
    if hasattr(module, "cells"):                              # MindSpore
        if module.cells():
            return None
        return dict(module.parameters_and_names(expand=False))
    return None


def _as_numpy(param: Any) -> np.ndarray:
    return param.asnumpy() if hasattr(param, "asnumpy") else param.detach().numpy()


def _layer_weight(module: Any) -> Optional[Tuple[Any, Optional[np.ndarray]]]:
    """(W, b as numpy or None) of a leaf holding a 2-D float32 ``weight`` and at most a
    ``bias`` of W's columns."""
    params = _own_parameters(module)
    if not params or set(params) - {"weight", "bias"} or "weight" not in params:
        return None
    weight, bias = params["weight"], params.get("bias")
    shape = tuple(weight.shape)
    if len(shape) != 2 or (bias is not None and tuple(bias.shape) != (shape[1],)) or \
            _as_numpy(weight).dtype != np.float32:
        return None
    return weight, None if bias is None else _as_numpy(bias)


def _computes_x_at_w(module: Any, weight_and_bias: Tuple[Any, Optional[np.ndarray]]) -> bool:
    """Whether the layer's forward (or construct: not its hooks) computes x @ W + b on a probe,
    its weight set for the call to a random one (its own may be symmetric, or zeros, which
    compute x @ W.T alike), then set back."""
    weight, bias = weight_and_bias
    rows, columns = tuple(weight.shape)
    rng = np.random.default_rng(0)
    probe = rng.standard_normal((2, rows)).astype(np.float32)
    trial = rng.standard_normal((rows, columns)).astype(np.float32)
    with _set_for_the_call(weight, trial):
        output = called_alone(module, probe)
    if output is None or output.shape != (2, columns):
        return False
    wanted = probe.astype(np.float64) @ trial + (0.0 if bias is None else bias)
    scale = float(np.max(np.abs(wanted)))
    return float(np.max(np.abs(output - wanted))) <= PRODUCT_ROUNDING * scale


@contextmanager
def _set_for_the_call(param: Any, value: np.ndarray) -> Iterator[None]:
    """``param`` holding ``value`` inside the block, and its own values, bit for bit, after."""
    saved = _as_numpy(param).copy()
    if hasattr(param, "set_data"):                            # MindSpore
        from mindspore import Tensor
        param.set_data(Tensor(value))
        try:
            yield
        finally:
            param.set_data(Tensor(saved))
        return
    import torch
    with torch.no_grad():
        param.copy_(torch.from_numpy(value))
    try:
        yield
    finally:
        with torch.no_grad():
            param.copy_(torch.from_numpy(saved))
