"""One MindSpore training step reproducing torch's semantics, with every tensor recorded.

Import order matters: mindspore is imported before anything can pull in torch (a libgomp
"static TLS block" failure is known elsewhere otherwise; DESIGN.md).
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from pathlib import Path
from typing import (Any, Callable, Collection, Dict, FrozenSet, Iterator, List, Mapping,
                    Optional, Tuple)

import numpy as np

from parity.align import largest_stride
from parity.capture.batch import Batch, batch_for, input_name
from parity.capture.common import (PhaseClock, failure_explained, manifest_meta,
                                   numpy_on_one_thread, refuse_map_names_not_in,
                                   refuse_several_outputs, weight_update)
from parity.capture.hooks import (ACTIVATION, ForwardPassOnly, dropping_modules,
                                  recording_hooks)
from parity.capture.layouts import weights_held_in_out
from parity.capture.selfcheck import Fingerprints, observer_check, tee
from parity.config import StepConfig, classes_last, split_state
from parity.errors import ParityInputError, first_few
from parity.io import same_file
from parity.models_loader import build_loss
from parity.records import PARAM_KINDS
from parity.rundir import INITIAL_WEIGHTS, RunReader, RunWriter, SafetensorsFile, same_bytes
from parity.weights import MAX_PROBLEMS_LISTED, is_ignored, load_into_mindspore, load_state_dict


def _set_pynative() -> None:
    """Forward hooks never fire in GRAPH_MODE (0 calls, no error): always capture in PyNative.

    The device is left as the user's MindSpore has it (CPU here, Ascend on an Ascend box).
    """
    import mindspore as ms
    ms.set_context(mode=ms.PYNATIVE_MODE)


@contextmanager
def _synchronous_on_cpu() -> Iterator[None]:
    """On CPU, PyNative runs each op before returning while the capture runs; the caller's
    setting is put back afterwards.

    By default PyNative hands ops to a dispatch thread, and every hook's asnumpy() waits for
    it to drain: on two cores the dispatching and waiting take CPU from the kernels. Measured
    on MindSpore 2.8.0 CPU, ResNet50 at batch 8, 224², two runs each in one hour: the hooked
    step with its records discarded 12.0-13.0 s queued against 8.4-8.9 s synchronous; with
    the run writer 16.2-16.9 s against 13.1-13.7 s; the bare step 9.2-10.4 s against 8.3-8.7
    s. Every record is the same bit for bit either way (ResNet50 at batch 2, 64², 1,115
    records; MobileNetV2 at batch 8, 224², 1,161). The hook-free rerun stays synchronous too:
    queued again after the hooked step it took 10.4-11.4 s of a capture against 7.4-8.6 s. On
    Ascend a synchronous launch would stall the device: the setting is left alone there.

    One op runs first in the caller's mode: MindSpore 2.8.0 whose first op runs synchronous
    corrupts its heap at a copying reshape (of a transposed tensor, as nn.PixelShuffle makes),
    and the process aborts at exit ("malloc_consolidate(): unaligned fastbin chunk detected"):
    a script of one transpose and reshape aborted in 3 of 3 runs, 0 of 3 after this warm-up;
    parity.check of a PixelShuffle pair, which passed, in 4 of 8, then 0 of 12.
    """
    import mindspore as ms
    if ms.get_context("device_target") != "CPU":
        yield
        return
    before = ms.get_context("pynative_synchronize")
    (ms.Tensor(np.zeros(1, np.float32)) + 1).asnumpy()
    _set_synchronous(True)
    try:
        yield
    finally:
        _set_synchronous(before)


def _set_synchronous(synchronous: bool) -> None:
    """set_context(pynative_synchronize=...) without the warning MindSpore 2.8 logs at each
    call (the setting is to move to runtime.launch_blocking(), which cannot be undone, so a
    capture in the caller's process could not put it back)."""
    import logging

    import mindspore as ms
    from mindspore import log
    logger = log._get_logger() if hasattr(log, "_get_logger") else logging.getLogger("mindspore")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        ms.set_context(pynative_synchronize=synchronous)
    finally:
        logger.setLevel(level)


def _reference_inputs(reference: Path) -> Tuple[Path, Batch, Dict[str, Any], Dict[str, int]]:
    """The torch capture's starting-point weights file, its batch, its manifest, and its
    modules' largest strides (align.largest_stride), read from their forward records."""
    run = RunReader.open(reference)
    if run.framework != "torch":
        raise ParityInputError(f"--reference {reference} is a {run.framework} capture; "
                               "pass the torch capture")
    by_name = {r.name: r for r in run.records if r.kind == "input"}
    if "input" not in by_name or "target" not in by_name:
        raise ParityInputError(f"{reference} holds no input batch; capture torch again")
    inputs = []
    while input_name(len(inputs)) in by_name:       # input, input1, input2...
        inputs.append(run.tensor(by_name[input_name(len(inputs))]))
    batch = Batch(tuple(inputs), run.tensor(by_name["target"]))
    strides = {record.name.partition("#")[0]: largest_stride(record.attrs.get("stride"))
               for record in run.records if record.kind == "forward"}
    return reference / INITIAL_WEIGHTS, batch, run.manifest, \
        {module: stride for module, stride in strides.items() if stride is not None}


# MindSpore 2.8.0 refuses a gradient hook on a tensor no gradient flows to (a cell's output
# made from constants: a mask, a table of ones) with this RuntimeError, and has no public
# requires_grad on a tensor to ask first. Such an output has no gradient to record, as in torch.
CONSTANT_OUTPUT = "requires grad is false"


def _hooks(net, record: Callable[..., None], loss_scale: float) -> List:
    """Forward hooks on every cell; each output's gradient is recorded by a tensor hook.

    As on the torch side: a cell's output gradient is the one w.r.t. the tensor it returned,
    in torch's order (a container right after its last child). ``register_backward_hook`` on
    every cell gave the same values bit for bit but cost more: hooked ResNet50 step at 8 / 224²
    11.8–11.9 s with it, 8.8–9.2 s with tensor hooks, 2.8–2.9 s bare (MindSpore 2.8.0).
    The gradient is of the scaled loss, so it is divided by the scale.
    """
    def to_numpy(tensor):
        return tensor.asnumpy() if hasattr(tensor, "asnumpy") else None

    def watch(name: str, tensor, shape=None) -> None:
        def on_gradient(grad) -> None:          # returns None: the gradient is unchanged
            gradient = _unscaled(grad.asnumpy(), loss_scale)
            record(name, "grad", gradient if shape is None else gradient.reshape(shape),
                   attrs=ACTIVATION)
        try:
            tensor.register_hook(on_gradient)
        except RuntimeError as error:
            if CONSTANT_OUTPUT not in str(error):
                raise

    return recording_hooks(port_cells(net), record, to_numpy, watch)


# Cell.recompute() holds its machinery as a child of the recomputed cell (outside MindSpore's
# containers): a _RecomputeCell named so, wrapping the cell's construct as its wrap_cell.
RECOMPUTE_MACHINERY = "_recompute_cell"


def port_cells(net) -> List[Tuple[str, Any]]:
    """The network's named cells but for MindSpore's machinery inside them: recomputation's,
    and the cells MindSpore builds a layer from where torch's is one module: nn.RNN's, nn.GRU's
    and nn.LSTM's recurrence (a cell a layer and direction), nn.BatchNorm3d's BatchNorm2d.
    Recorded, their outputs were extra records torch has none of."""
    import mindspore.nn as nn
    built_of_cells = [name for name, cell in net.cells_and_names()
                      if isinstance(cell, (nn.RNN, nn.GRU, nn.LSTM, nn.BatchNorm3d))]
    return [(name, cell) for name, cell in net.cells_and_names()
            if RECOMPUTE_MACHINERY not in name.split(".")
            and not any(name.startswith(layer + ".") for layer in built_of_cells)]


def cells_not_run(net) -> List[str]:
    """The cells a SequentialCell holds but does not run: it runs the list it was built with,
    and a cell assigned to its attribute after (``seq.maxpool = nn.MaxPool2d(...)``) replaces
    the held one, which parity hooks, not the one it runs, which runs unseen. A port patched so
    (mindcv's DPN stem pool, 53rd round) was told "extra operation in the port" at the
    container. Assigning by index (``seq[3] = ...``) replaces both."""
    import mindspore.nn as nn
    not_run = []
    for name, cell in net.cells_and_names():
        if isinstance(cell, nn.SequentialCell) and hasattr(cell, "cell_list"):
            running = {id(inner) for inner in cell.cell_list}
            not_run += [f"{name}.{key}".lstrip(".") for key, inner in cell.name_cells().items()
                        if id(inner) not in running]
    return not_run


def _unscaled(gradient: np.ndarray, loss_scale: float) -> np.ndarray:
    """A gradient of the scaled loss as one of the loss itself, in float32; without a loss
    scale the array itself (the writer copies it once; dividing by 1 was a second copy)."""
    gradient = gradient.astype(np.float32, copy=False)
    return gradient if loss_scale == 1 else gradient / np.float32(loss_scale)


def _name_parameters_by_path(net) -> None:
    """Give every Parameter its path as name, as records are named by path.

    A cell assigned after construction keeps parameter names relative to itself
    (``bn2.gamma``), which MindSpore's optimizers reject as duplicates.
    """
    for path, param in net.parameters_and_names():
        if param.name != path:
            param.name = path


def _optimizer(net, config: StepConfig, left_out: Collection[str]):
    """nn.Momentum with torch's weight-decay scope by default (MindSpore skips gamma/beta);
    nn.SGD for Nesterov: nn.Momentum(use_nesterov=True) steps plain momentum on the CPU in
    MindSpore 2.7.0 to 2.10.0 (its ApplyMomentum kernel ignores the attribute; measured: a
    first step of -lr·g where torch's and nn.SGD(nesterov=True)'s is -lr·g·(1 + momentum)).
    Adam and AdamW: _adamw. The parameters ``left_out`` (those torch's step gave no gradient)
    are not stepped."""
    from mindspore import nn
    params = [p for p in net.trainable_params() if p.name not in left_out]
    decayed_names = _decayed(params, config)
    decayed = [p for p in params if p.name in decayed_names]
    kept = [p for p in params if p.name not in decayed_names]
    if config.optimizer != "sgd":
        return _adamw(decayed, kept, config)
    groups = [{"params": decayed, "weight_decay": config.weight_decay}]
    if kept:
        groups.append({"params": kept, "weight_decay": 0.0})
    groups.append({"order_params": params})
    if config.nesterov:
        return nn.SGD(groups, learning_rate=config.lr, momentum=config.momentum, nesterov=True,
                      loss_scale=config.ms_loss_scale)
    return nn.Momentum(groups, learning_rate=config.lr, momentum=config.momentum,
                       loss_scale=config.ms_loss_scale)


def _decayed(params, config: StepConfig) -> FrozenSet[str]:
    """The names of the parameters weight decay applies to, in the configured scope."""
    excluded = {"all": (), "no-gamma-beta": ("gamma", "beta"),
                "no-gamma-beta-bias": ("gamma", "beta", "bias")}[config.ms_weight_decay_scope]
    return frozenset(p.name for p in params if p.name.rpartition(".")[2] not in excluded)


def _adamw(decayed: List, kept: List, config: StepConfig):
    """mindspore.experimental.optim.AdamW: torch's AdamW to float32 rounding (measured on
    MindSpore 2.8.0: 99.3 % of 100,000 first updates bit-equal to torch 2.14.1's, README).
    torch's Adam is it with no decay of its own, _train_step adding wd·w to the gradient as
    torch's does: MindSpore's Adams add eps before the bias correction (nn.Adam,
    experimental.optim.Adam), and nn.AdamWeightDecay corrects no bias (README, Known limits):
    each of those three with --ms-adam. None takes the loss scale here: _train_step divides
    the gradients by it, as nn.Momentum does."""
    from mindspore import nn
    from mindspore.experimental.optim import Adam, AdamW
    # MindSpore's own decay as each does (--ms-adam); AdamW's matches torch's
    own = config.ms_adam is not None
    decay = config.weight_decay if own or config.optimizer == "adamw" else 0.0
    groups = [group for group in ({"params": decayed, "weight_decay": decay},
                                  {"params": kept, "weight_decay": 0.0}) if group["params"]]
    if config.ms_adam in ("nn.Adam", "nn.AdamWeightDecay"):
        adam = nn.Adam if config.ms_adam == "nn.Adam" else nn.AdamWeightDecay
        return adam([*groups, {"order_params": decayed + kept}], learning_rate=config.lr,
                    beta1=config.beta1, beta2=config.beta2, eps=config.eps)
    adam = Adam if config.ms_adam else AdamW
    return adam(groups, lr=config.lr, betas=(config.beta1, config.beta2), eps=config.eps,
                weight_decay=0.0)


def _optimizer_state(optimizer) -> Dict[str, tuple]:
    """Each parameter's optimizer state, in the order of ``optimizer.parameters``, by the name
    torch gives it (config.OPTIMIZER_STATE)."""
    from mindspore import nn
    if isinstance(optimizer, nn.SGD):
        return {"momentum_buffer": optimizer.accum}
    if isinstance(optimizer, nn.Momentum):
        return {"momentum_buffer": optimizer.moments}
    if isinstance(optimizer, nn.Adam):
        return {"exp_avg": optimizer.moment1, "exp_avg_sq": optimizer.moment2}
    if isinstance(optimizer, nn.AdamWeightDecay):
        return {"exp_avg": optimizer.moments1, "exp_avg_sq": optimizer.moments2}
    return {"exp_avg": optimizer.exp_avg, "exp_avg_sq": optimizer.exp_avg_sq}


# MindSpore 2.8.0's CPU PReLU adds up its weight gradient over the whole input (one weight) or
# each channel's values (one a channel), and its thread search tries one thread and more over
# its first calls: one after another in float32 (five calls of one shape here) or in another
# order, which moves the sum's rounding from call to call. Measured: eight conv-PReLU blocks of
# 8 channels at batch 2, 64² (tests/tiny.py's ms_deep_prelu): two hook-free steps had 3 to 5 of
# 37 tensors apart in each of four runs, all PReLU weights' gradients and updated values.
UNSTEADY_PRELU = ("MindSpore's CPU PReLU sums its weight gradient in an order its thread "
                  "search changes from call to call (measured on MindSpore 2.8.0)")


def _prelu_parameters(net) -> FrozenSet[str]:
    import mindspore.nn as nn
    return frozenset(param.name for _, cell in net.cells_and_names()
                     if isinstance(cell, nn.PReLU) for param in cell.get_parameters())


def refuse_map_names_not_in_port(net, overrides: Mapping[str, str]) -> None:
    known = {name for name, _ in port_cells(net)} | \
        {name for name, _ in net.parameters_and_names()}
    refuse_map_names_not_in(overrides, known, "cell or parameter of the MindSpore model")


def capture_mindspore(config: StepConfig, out: Path, *, factory: str = "", model=None,
                      reference: Optional[Path] = None, weights: Optional[Path] = None,
                      batch_file: Optional[Path] = None,
                      overrides: Optional[Mapping[str, str]] = None) -> Path:
    if reference is not None and same_file(Path(out), Path(reference)):
        raise ParityInputError(f"--out {out} is the --reference capture, which this one would "
                               "replace: write the MindSpore capture beside it (say "
                               f"{Path(reference).parent / 'mindspore'})")
    import mindspore as ms

    from parity.models_loader import build_mindspore_model, load_factory

    if model is None:
        load_factory(factory)       # its imports are start-up, not the step
    clock = PhaseClock("start")
    _set_pynative()
    num_classes = config.num_classes
    # the torch capture's starting point, when this one starts from it too: compare checks
    # that the two captures it is given belong together
    starts_from: Dict[str, str] = {}
    torch_no_gradient: Collection[str] = ()     # parameters torch's step left as they were
    torch_strides: Optional[Dict[str, int]] = None      # by module, where the capture knows
    torch_in_out: Collection[str] = ()          # torch's weights held (in, out): layouts.py
    if reference is not None:
        reference_weights, batch, reference_manifest, torch_strides = \
            _reference_inputs(reference)
        torch_no_gradient = frozenset(reference_manifest.get("no_gradient", ()))
        torch_in_out = reference_manifest.get("in_out_weights", ())
        num_classes = reference_manifest.get("config", {}).get("num_classes")
        # the seed that drew the weights and batch taken from the reference, not the caller's
        config = dataclasses.replace(config, seed=reference_manifest["seed"])
        if weights is None and batch_file is None and "fingerprint" in reference_manifest:
            starts_from = {"fingerprint": reference_manifest["fingerprint"]}
        weights = weights or reference_weights
    ms.set_seed(config.seed)
    if weights is None:
        raise ParityInputError("the MindSpore capture needs the torch weights: pass --reference "
                               "TORCH_RUN_DIR (from 'parity capture --framework torch') or "
                               "--weights FILE")
    if batch_file is None and reference is None and num_classes is None:
        raise ParityInputError("without --reference, pass --num-classes (or --input FILE.npz) "
                               "so both sides draw the same labels")
    if batch_file is not None or reference is None:
        batch = batch_for(config, batch_file, num_classes)
    net = model if model is not None else \
        build_mindspore_model(factory, num_classes=num_classes)
    _name_parameters_by_path(net)
    refuse_map_names_not_in_port(net, overrides or {})
    transfer = load_into_mindspore(net, load_state_dict(weights), overrides, torch_strides,
                                   torch_in_out, weights_held_in_out(net.cells_and_names())
                                   if torch_in_out else ())
    param_map = transfer.plan
    recorded = in_torch_layouts(transfer.torch_shapes, transfer.transposed)
    initial = _InitialState(net, weights, param_map)
    left_out = {param_map[p.name]: p for p in net.trainable_params()
                if param_map.get(p.name) in torch_no_gradient}     # by torch's name

    with RunWriter(out, "mindspore") as writer, numpy_on_one_thread(), _synchronous_on_cpu():
        for name, array in batch.named():
            writer.add(name, "input", array)
        hooked = Fingerprints()
        # One optimizer for every step: MindSpore keeps each nn.Momentum alive (measured:
        # 240 MB more per step for ResNet50 at batch 2, 64², against 10 MB when reused).
        optimizer = _optimizer(net, config, {p.name for p in left_out.values()})
        clock.next("hooked step")
        with failure_explained(
                "MindSpore", f"on the batch {'of --input' if batch_file else 'torch took'} "
                f"({batch.summary()})", "The port takes what the torch model takes: the same "
                "inputs, in the same layout and dtypes (its loss: int32 labels)"):
            _train_step(net, optimizer, initial, batch, config,
                        recorded(tee(writer.add, hooked)), left_out)
        if not any(r.kind == "forward" for r in writer.records):
            raise ParityInputError("no forward hook fired in the MindSpore model: a construct "
                                   "compiled with @jit / GRAPH_MODE, or a network rewritten by "
                                   "amp.auto_mixed_precision at level O1, hides its cells; "
                                   "check the plain network, in PyNative mode")

        def rerun_without_hooks(record: Callable[..., None]) -> None:
            _restore(net, initial, optimizer)
            _train_step(net, optimizer, initial, batch, config,
                        recorded(record), left_out, hooks=False)

        clock.next("observer rerun")
        observer = observer_check(hooked, rerun_without_hooks, _prelu_parameters(net),
                                  UNSTEADY_PRELU)
        clock.next("writes")
        _restore(net, initial)       # leave a caller's network as it came
        writer.wait()
        return writer.finish(manifest_meta(
            "mindspore", config, num_classes, factory or type(net).__name__, param_map,
            observer, clock, no_gradient=list(left_out),
            port_constants=transfer.port_constants, torch_rows_left=transfer.rows_left,
            transposed=transfer.transposed,
            cells_not_run=cells_not_run(net),
            **starts_from))


def _adam_gradients(optimizer, grads: tuple, config: StepConfig) -> tuple:
    """What _adamw steps with: the gradients divided by the optimizer's loss scale (as
    MindSpore's optimizers take it), and for torch's Adam its weight decay wd·w added (MindSpore's
    own Adams decay as they do)."""
    coupled = config.optimizer == "adam" and not config.ms_adam
    decayed = _decayed(optimizer.parameters, config) if coupled else ()
    return tuple(grad / config.ms_loss_scale + config.weight_decay * param
                 if param.name in decayed else grad / config.ms_loss_scale
                 for param, grad in zip(optimizer.parameters, grads))


def in_torch_layouts(torch_shapes: Mapping[str, Tuple[int, ...]], transposed: Collection[str]
                     ) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A wrapper of a ``record`` storing each parameter's records in torch's layout: in torch's
    shape where MindSpore holds it in another of the same order (its Conv1d weight, gradient,
    update and momentum: (out, in, 1, k) for torch's (out, in, k)), and transposed where it
    holds torch's tensor transposed (a Dense layer's of Hugging Face's Conv1D), so that every
    record compares with torch's as it is."""
    transposed = frozenset(transposed)

    def wrapped(record: Callable[..., None]) -> Callable[..., None]:
        if not torch_shapes and not transposed:
            return record

        def in_torch_layout(name: str, kind: str, array: np.ndarray, **details: Any) -> None:
            param = split_state(name)[0]
            if kind in PARAM_KINDS and param in transposed:
                array = array.T
            shape = torch_shapes.get(param)
            if shape is not None and kind in PARAM_KINDS:
                array = array.reshape(shape)
            record(name, kind, array, **details)
        return in_torch_layout
    return wrapped


class _InitialState(Mapping):
    """The network's starting values by parameter name, as loaded from ``weights``.

    A value the safetensors file holds byte for byte (every one, from the torch capture's
    starting point that ``parity run`` passes) is read from the file at each use instead of
    kept: 100 MB (ResNet50) less through the whole capture. Any other is copied.
    """

    def __init__(self, net, weights: Path, param_map: Mapping[str, str]) -> None:
        file = SafetensorsFile(weights) if Path(weights).suffix == ".safetensors" else {}
        self._file, self._in_file, self._copies = file, {}, {}
        for name, param in net.parameters_and_names():
            value, key = param.asnumpy(), param_map.get(name)
            stored = file[key] if key in file else None
            if stored is not None and same_bytes(stored, value):
                self._in_file[name] = key
            else:
                self._copies[name] = value.copy()

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self._copies:
            return self._copies[name]
        return self._file[self._in_file[name]]

    def __iter__(self) -> Iterator[str]:
        return iter([*self._in_file, *self._copies])

    def __len__(self) -> int:
        return len(self._in_file) + len(self._copies)


def _restore(net, values: Mapping[str, np.ndarray], optimizer=None) -> None:
    """Parameters back to ``values`` and the optimizer's state to zero, written in place: the
    optimizer's compiled update keeps the buffers it first saw, so ``set_data`` would leave
    it stepping the old ones (measured: later steps' weights differed, loss and grads not)."""
    import mindspore as ms
    for name, param in net.parameters_and_names():
        ms.ops.assign(param, ms.Tensor(values[name]))
    if optimizer is not None:
        counted = [getattr(optimizer, step) for step in ("global_step", "state_step")
                   if hasattr(optimizer, step)]
        for state in (*(s for states in _optimizer_state(optimizer).values() for s in states),
                      *getattr(optimizer, "max_exp_avg_sq", ()), *counted):
            ms.ops.assign(state, ms.ops.zeros_like(state))
        # nn.SGD's first-step flags and nn.Adam's powers of the betas start at 1
        for one in (*getattr(optimizer, "stat", ()),
                    *(getattr(optimizer, power) for power in ("beta1_power", "beta2_power")
                      if hasattr(optimizer, power))):
            ms.ops.assign(one, ms.ops.ones_like(one))


def _train_step(net, optimizer, initial: Mapping[str, np.ndarray], batch: Batch,
                config: StepConfig, record: Callable[..., None], left_out: Mapping[str, Any], *,
                hooks: bool = True) -> None:
    """One optimizer step reproducing torch's from the state ``initial``, every tensor
    handed to ``record`` (as views valid during the call: it copies what it keeps). The
    parameters ``left_out`` (by torch's name), to which torch's step passed no gradient, must
    get none here either: they are not stepped, and recorded as state."""
    import mindspore as ms
    from mindspore import nn, ops

    net.set_train(True)
    for _, dropping in dropping_modules(net.cells_and_names()):
        dropping.set_train(False)
    scale = config.ms_loss_scale if config.ms_scale_loss else 1.0
    forward_pass = ForwardPassOnly(record)
    handles = _hooks(net, forward_pass, scale) if hooks else []
    loss_fn = build_loss(config.ms_loss) if config.ms_loss else \
        nn.CrossEntropyLoss(reduction="mean", label_smoothing=config.label_smoothing)

    def forward(*inputs_and_labels):
        *inputs, labels = inputs_and_labels
        outputs = net(*inputs)
        forward_pass.done = True
        if not config.ms_loss:
            refuse_several_outputs(outputs, "MindSpore")
            if classes_last(outputs.shape, labels.shape):
                outputs = ops.moveaxis(outputs, -1, 1)
        loss = loss_fn(outputs, labels)
        return loss * scale, loss

    stepped = len(optimizer.parameters)
    grad_fn = ms.value_and_grad(forward, None, [*optimizer.parameters, *left_out.values()]
                                if left_out else optimizer.parameters, has_aux=True)
    try:
        (_, loss), grads = grad_fn(*(ms.Tensor(x) for x in batch.inputs),
                                   ms.Tensor(batch.labels.astype(np.int32)))
    finally:
        for handle in handles:
            handle.remove()
    grads, left_out_grads = grads[:stepped], grads[stepped:]
    reached = [name for name, grad in zip(left_out, left_out_grads) if grad.asnumpy().any()]
    if reached:
        raise ParityInputError(
            f"torch's step gives {first_few(reached, MAX_PROBLEMS_LISTED)} no gradient, "
            "MindSpore's gives them one: the torch model leaves them out of its forward or runs "
            "them under torch.no_grad() (the port then needs ops.stop_gradient on what they "
            "compute), or a reentrant torch.utils.checkpoint none of whose inputs needs a "
            "gradient passes them none (use_reentrant=False passes them)")
    if loss.size != 1:
        raise ParityInputError(f"the MindSpore loss {config.ms_loss} returned {loss.shape}, not "
                               "one number: reduce it")
    record("loss", "loss", loss.asnumpy())
    names = [p.name for p in optimizer.parameters]
    for name, grad in zip(names, grads):
        # the gradient of the unscaled loss, which is what torch's .grad holds
        record(name, "grad", _unscaled(grad.asnumpy(), scale))
    optimizer(grads if config.optimizer == "sgd" else _adam_gradients(optimizer, grads, config))
    states = _optimizer_state(optimizer)
    for index, param in enumerate(optimizer.parameters):
        after = param.asnumpy()
        record(param.name, "update", weight_update(after, initial[param.name]))
        record(param.name, "weight", after)
        for state, values in states.items():
            record(f"{param.name}.{state}", "optimizer_state", values[index].asnumpy())
    trainable = set(names)
    for name, param in net.parameters_and_names():
        if name not in trainable and not is_ignored(name):
            record(name, "buffer", param.asnumpy())
