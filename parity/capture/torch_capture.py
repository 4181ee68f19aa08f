"""One torch training step with every tensor recorded (the reference side)."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from parity.capture.common import ACTIVATION, batch_for, manifest_meta, output_recorder
from parity.capture.selfcheck import Fingerprints, observer_check, tee
from parity.config import StepConfig
from parity.errors import ParityInputError
from parity.records import FP64
from parity.rundir import INITIAL_WEIGHTS, RunWriter
from parity.weights import is_ignored, load_state_dict, save_state_dict_bytes


def _load_weights(model, path: Path) -> None:
    import torch
    state_dict = {k: torch.from_numpy(v) for k, v in load_state_dict(path).items()}
    expected = model.state_dict()
    missing = [k for k in expected if k not in state_dict]
    extra = [k for k in state_dict if k not in expected]
    shapes = [f"{k}: file {tuple(v.shape)} vs model {tuple(expected[k].shape)}"
              for k, v in state_dict.items() if k in expected and v.shape != expected[k].shape]
    if missing or extra or shapes:
        parts = ([f"missing keys: {', '.join(missing)}"] if missing else []) + \
                ([f"unexpected keys: {', '.join(extra)}"] if extra else []) + \
                ([f"wrong shapes: {'; '.join(shapes)}"] if shapes else [])
        raise ParityInputError(f"{path} does not fit the torch model: {' | '.join(parts)}")
    model.load_state_dict(state_dict, strict=True)


def _restore(model, state: Dict[str, np.ndarray]) -> None:
    import torch
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})


def _infer_num_classes(model, x: np.ndarray) -> int:
    """Class count of a user model: one forward in eval mode, which changes no state."""
    import torch
    was_training = model.training
    model.eval()
    with torch.no_grad():
        logits = model(torch.from_numpy(x[:1]))
    model.train(was_training)
    return int(logits.shape[-1])


def _forward_hooks(model, record: Callable[..., None]) -> List:
    """Forward hooks on every module; each output's gradient is recorded by a tensor hook.

    A tensor hook registered before an in-place op (torchvision's ReLU(inplace=True)) receives
    the gradient w.r.t. the value it was registered on, so a BN's record is its own output's.
    """
    import torch

    def to_numpy(tensor):
        return tensor.detach().cpu().numpy().copy() if isinstance(tensor, torch.Tensor) else None

    def watch(name: str, tensor) -> None:
        if tensor.requires_grad:
            tensor.register_hook(lambda grad: record(name, "grad", to_numpy(grad),
                                                     attrs=ACTIVATION))

    return [module.register_forward_hook(output_recorder(name, module, record, to_numpy, watch))
            for name, module in model.named_modules() if name]


def _train_step(model, x: np.ndarray, y: np.ndarray, config: StepConfig,
                record: Callable[..., None], *, hooks: bool = True) -> None:
    """One SGD step of ``model`` (in its own dtype), every tensor handed to ``record``."""
    import torch
    import torch.nn.functional as F

    dtype = next(model.parameters()).dtype
    model.train()
    handles = _forward_hooks(model, record) if hooks else []
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum,
                                dampening=config.dampening, weight_decay=config.weight_decay,
                                nesterov=config.nesterov)
    optimizer.zero_grad(set_to_none=True)
    try:
        logits = model(torch.from_numpy(x).to(dtype))
    finally:
        for handle in handles:
            handle.remove()
    loss = F.cross_entropy(logits, torch.from_numpy(y), label_smoothing=config.label_smoothing)
    record("loss", "loss", loss.detach().numpy().copy())
    loss.backward()
    params = list(model.named_parameters())
    missing_grads = [name for name, p in params if p.grad is None]
    if missing_grads:
        raise ParityInputError(f"no gradient reached {', '.join(missing_grads)}: "
                               "unused parameters cannot be compared; remove them")
    for name, param in params:
        record(name, "grad", param.grad.numpy().copy())
    before: Dict[str, np.ndarray] = {n: p.detach().numpy().copy() for n, p in params}
    optimizer.step()
    for name, param in params:
        after = param.detach().numpy()
        # Δw in float64 from the stored values: comparing w1 alone hides small update bugs
        record(name, "update", after.astype(np.float64) - before[name].astype(np.float64))
        record(name, "weight", after.copy())
        state = optimizer.state.get(param, {})
        if state.get("momentum_buffer") is not None:
            record(f"{name}.momentum_buffer", "optimizer_state",
                   state["momentum_buffer"].numpy().copy())
    for name, buffer in model.named_buffers():
        if not is_ignored(name):
            record(name, "buffer", buffer.detach().numpy().copy())


def capture_torch(config: StepConfig, out: Path, *, factory: str = "", model=None,
                  weights: Optional[Path] = None, batch_file: Optional[Path] = None,
                  inputs: Optional[Tuple[np.ndarray, np.ndarray]] = None,
                  fp64_reference: bool = True) -> Path:
    """The torch step in float32, plus (by default) the same step in float64.

    The float64 rerun measures how far float32 itself is from the exact result, record by
    record: the comparison then judges MindSpore's error against torch's own float32 error
    instead of a constant (the approach of torch dynamo's accuracy checker).
    """
    import torch
    from parity.models_loader import build_torch_model

    started = time.perf_counter()
    torch.manual_seed(config.seed)
    torch.use_deterministic_algorithms(True)
    if model is None:
        model = build_torch_model(factory, num_classes=config.num_classes)
    if weights is not None:
        _load_weights(model, weights)
    num_classes = config.num_classes
    if inputs is not None:
        x, y = inputs
    else:
        if num_classes is None:
            probe, _ = batch_for(config, batch_file, 1)
            num_classes = _infer_num_classes(model, probe)
        x, y = batch_for(config, batch_file, num_classes)
    initial = {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}

    with RunWriter(out, "torch") as writer:
        writer.write_file(INITIAL_WEIGHTS, save_state_dict_bytes(initial))
        writer.add("input", "input", x)
        writer.add("target", "input", y)
        hooked = Fingerprints()
        _train_step(model, x, y, config, tee(writer.add, hooked))

        def rerun_without_hooks(record: Callable[..., None]) -> None:
            _restore(model, initial)
            _train_step(model, x, y, config, record, hooks=False)

        observer = observer_check(hooked, rerun_without_hooks)
        if fp64_reference:
            reference = copy.deepcopy(model)
            _restore(reference, initial)
            reference.double()

            def record_fp64(name: str, kind: str, array: np.ndarray, **extra) -> None:
                # Rounded to float32 (except Δw): the rounding, ~3e-8 relative, is far below
                # the float32 noise it measures and the verdict's noise_floor (1e-6), and it
                # halves the reference's size.
                if kind != "update":
                    array = array.astype(np.float32)
                writer.add(name, kind, array, variant=FP64, **extra)

            _train_step(reference, x, y, config, record_fp64)
        _restore(model, initial)        # leave a caller's model as it came: the rerun stepped it
        return writer.finish(manifest_meta(
            "torch", config, num_classes, factory or type(model).__name__, {}, observer,
            started, fp64_reference=fp64_reference))
