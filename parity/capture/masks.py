"""Each ReLU unit's state in torch's float32 step, replayed in the steps that measure its error.

A ReLU unit whose input lies within rounding of zero may be active in the float32 step and not
in the float64 one (or in a rerounded step): its gradient passes in one and is blocked in the
other, and every gradient before it moves by far more than rounding. In the default ResNet50
run (batch 2, 64²) that put torch's float32 gradients 4.2 % off its float64 ones (median over
the parameters); with each ReLU call's float32 units replayed in the float64 step, 0.028 %.
Replayed, the reruns measure rounding alone, and a gradient is judged against that; units the
two frameworks' float32 steps set differently are allowed for apart, from the gradient they
redirect (parity/kinks.py).

Only ``nn.ReLU`` modules are replayed: a functional ReLU has no hook, and the other kinks
(ReLU6, LeakyReLU, max pooling) stay in the measured error.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Tuple

import numpy as np

from parity.capture.hooks import OPS

RELU = OPS["ReLU"]      # the op of the records replayed


class ReluMasks:
    """A ``record`` callback for the float32 step keeping, per ReLU module, each call's active
    units as packed bits (1 bit a unit: 9 MB for ResNet50 at batch 8, 224²), and ``replayed``,
    which makes a later step of the model use them."""

    def __init__(self) -> None:
        self._calls: Dict[str, List[Tuple[np.ndarray, Tuple[int, ...]]]] = {}

    def __call__(self, name: str, kind: str, array: np.ndarray, *, op: str = "",
                 **_: Any) -> None:
        if kind == "forward" and op == RELU:
            self._calls.setdefault(name, []).append((np.packbits(array > 0), array.shape))

    @contextmanager
    def replayed(self, model: Any) -> Iterator[None]:
        """Each ReLU module of ``model`` outputs its input where the float32 step's unit was
        active in that call, 0 elsewhere, so its gradient passes where float32's did. Hooks
        registered after these (the recording ones) see that output. In place, a ReLU would
        have overwritten the input kept: it runs out of place meanwhile."""
        handles, in_place = [], []
        for name, module in model.named_modules():
            if name in self._calls:
                if getattr(module, "inplace", False):
                    in_place.append(module)
                    module.inplace = False
                handles.append(module.register_forward_hook(_Replay(self._calls[name])))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
            for module in in_place:
                module.inplace = True


SAMPLED = 64    # input values a call is known by, when activation checkpointing repeats it


class _Replay:
    """One ReLU module's float32 calls, replayed in the order the step makes them.

    Activation checkpointing (``torch.utils.checkpoint``) runs a block's forward again in the
    backward, to rebuild what it did not keep: such a call replays the forward call whose input
    it repeats (to the bit: the recomputation is deterministic), known by its shape and
    SAMPLED of its values. Without that, the recomputed ReLU kept other tensors for its
    backward than the first, and torch's checkpoint stopped the step."""

    def __init__(self, calls: List[Tuple[np.ndarray, Tuple[int, ...]]]) -> None:
        self._calls = calls
        self._inputs: List[Tuple[Tuple[int, ...], bytes]] = []   # this step's forward calls

    def __call__(self, _module: Any, inputs: Tuple[Any, ...], output: Any) -> Any:
        import torch

        known_by = _sampled(inputs[0])
        if not _in_backward():
            index = len(self._inputs)
            self._inputs.append(known_by)
        elif known_by in self._inputs:
            index = self._inputs.index(known_by)
        else:
            return None     # a rerun of no forward call of this step
        if index >= len(self._calls) or tuple(output.shape) != self._calls[index][1]:
            return None     # a call the float32 step did not make
        bits, shape = self._calls[index]
        active = torch.from_numpy(np.unpackbits(bits, count=int(np.prod(shape))).reshape(shape))
        # where(), not a product: its backward keeps the boolean units (a byte each), not a
        # float64 copy of them beside every ReLU's output
        return torch.where(active.bool(), inputs[0], 0.0)


def _sampled(x: Any) -> Tuple[Tuple[int, ...], bytes]:
    """``x``'s shape and SAMPLED of its values spread over it, gathered where they lie (a
    channels-last input is not copied)."""
    import torch
    if x.numel() == 0 or x.dim() == 0:
        return tuple(x.shape), x.detach().numpy().tobytes()
    positions = torch.linspace(0, x.numel() - 1, SAMPLED).long()
    return tuple(x.shape), x.detach()[torch.unravel_index(positions, x.shape)].numpy().tobytes()


def _in_backward() -> bool:
    """Whether autograd's engine is running a backward on this thread (torch's checkpoint asks
    the same, through the same private call)."""
    import torch
    return torch._C._current_graph_task_id() != -1
