"""One torch training step with every tensor recorded (the reference side)."""

from __future__ import annotations

import ctypes
import math
import platform
import warnings
from collections import Counter, OrderedDict
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path
from typing import (Any, Callable, ContextManager, Dict, Iterator, List, Mapping, Optional,
                    Sequence, Set, Tuple)

import numpy as np

from parity import kinks
from parity.capture.batch import Batch, batch_for
from parity.capture.common import (PhaseClock, failure_explained, fingerprint, manifest_meta,
                                   numpy_on_one_thread, refuse_map_names_not_in,
                                   refuse_several_outputs, several_outputs, weight_update)
from parity.capture.hooks import (ACTIVATION, NOT_IN_STATE_DICT, ForwardPassOnly,
                                  dropping_modules, recording_hooks)
from parity.capture.layouts import weights_held_in_out
from parity.capture.masks import RELU, ReluMasks
from parity.capture.selfcheck import Fingerprints, observer_check, tee
from parity.capture.sequential_sums import sequential_kernel_sums
from parity.capture.spill import SavedTensorSpill
from parity.config import OPTIMIZER_STATE, StepConfig, classes_last
from parity.errors import SMALLER_BATCH, ParityInputError, first_few
from parity.models_loader import build_loss
from parity.resources import peak_resident_bytes
from parity.records import RecordInfo
from parity.rundir import INITIAL_WEIGHTS, RunWriter, SafetensorsFile, same_bytes
from parity.weights import (MAX_PROBLEMS_LISTED, StateDict, class_count_hint, is_ignored,
                            load_state_dict, outer_prefix, save_state_dict_bytes, tied_keys,
                            tensor_values, widened_from, without_prefix)

BLOCK = 1 << 18     # elements per float64 block: temporaries stay small
M_MMAP_THRESHOLD = -3       # glibc's mallopt parameter (malloc.h)
SPILL_FILE = "float64-saved-tensors.scratch"    # in the partial run directory, while it steps


def refuse_map_names_not_in_model(model, overrides: Mapping[str, str]) -> None:
    """Checked before the step, so that a misspelt torch name costs no capture."""
    known = {name for name, _ in model.named_modules(remove_duplicate=False)} | \
        set(model.state_dict())           # parameters and buffers, a tied one by each name
    refuse_map_names_not_in(overrides.values(), known,
                            "module, parameter or buffer of the torch model")


def _load_weights(model, path: Path) -> None:
    arrays = load_state_dict(path)
    expected = model.state_dict()
    inner = without_prefix(arrays, outer_prefix(arrays))    # DataParallel's "module.", ...
    if not set(arrays) & set(expected) and set(inner) & set(expected):
        arrays = inner
    for alias, key in tied_keys(expected).items():     # a file may hold a tied tensor once
        if alias not in arrays and key in arrays:
            arrays[alias] = arrays[key]
        elif key not in arrays and alias in arrays:
            arrays[key] = arrays[alias]
        elif alias in arrays and not same_bytes(arrays[alias], arrays[key]):   # NaN == NaN
            raise ParityInputError(f"{path}: {alias} and {key} differ, but the torch model ties "
                                   "them (one parameter): are these weights of an untied model?")
    missing = [k for k in expected if k not in arrays]
    extra = [k for k in arrays if k not in expected]
    misfits = {k: (tuple(v.shape), tuple(expected[k].shape)) for k, v in arrays.items()
               if k in expected and tuple(v.shape) != tuple(expected[k].shape)}
    shapes = [f"{k}: file {theirs} vs model {ours}" for k, (theirs, ours) in misfits.items()]
    if missing or extra or shapes:
        parts = [f"{what}: {first_few(names, MAX_PROBLEMS_LISTED, separator)}"
                 for what, names, separator in (("missing keys", missing, ", "),
                                                ("unexpected keys", extra, ", "),
                                                ("wrong shapes", shapes, "; ")) if names]
        hint = class_count_hint(list(misfits.values())) if not (missing or extra) else ""
        raise ParityInputError(f"{path} does not fit the torch model: {' | '.join(parts)}"
                               f"{'. ' + hint if hint else ''}")
    _restore(model, arrays)


def _restore(model, state: Mapping[str, np.ndarray], carried: Carried = ()) -> None:
    """Load these arrays into the model, under the model's own version metadata (which module
    code wrote each entry): torchvision's MNASNet refuses a state dict without it ("version
    should be set to 1 or 2 instead of None"), and a file's own is not kept. The attributes
    ``carried`` (_carried_state) are set back as they were before the first step."""
    import torch
    tensors = OrderedDict((k, torch.from_numpy(v)) for k, v in state.items())
    tensors._metadata = getattr(model.state_dict(), "_metadata", OrderedDict())
    model.load_state_dict(tensors, strict=True)
    for module, name, value in carried:
        setattr(module, name, value)


# (module, attribute, value before the first step) of each attribute _carried_state found
Carried = Sequence[Tuple[Any, str, Any]]


def _carried_state(model) -> Carried:
    """Each attribute of the model's modules, outside their parameters and buffers, that is a
    tensor or None: state a forward may carry to the next call. Hugging Face's RecurrentGemma
    keeps its RG-LRU's last state, graph and all, in ``self.recurrent_states`` (None until its
    first call), and the observer rerun's backward ran into the first step's freed graph
    ("Trying to backward through the graph a second time"). Each rerun starts from these as the
    first step did."""
    import torch
    return [(module, name, value) for module in model.modules()
            for name, value in vars(module).items()
            if value is None or (isinstance(value, torch.Tensor)
                                 and not isinstance(value, torch.nn.Parameter))]


def _infer_num_classes(model, inputs: Tuple[np.ndarray, ...]) -> int:
    """Class count of a user model: one forward in eval mode, which changes no state."""
    import torch
    was_training = model.training
    model.eval()
    # under no_grad, a reentrant torch.utils.checkpoint warns that "Gradients will be None":
    # of this forward only, not the step's
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "None of the inputs have requires_grad=True")
        logits = model(*(torch.from_numpy(x[:1]) for x in inputs))
    model.train(was_training)
    several = several_outputs(logits)
    if several:
        raise ParityInputError(f"the torch model returns {several}, so the synthetic labels' "
                               "class count cannot be read from it: pass --num-classes K (or "
                               "your batch with --input FILE.npz)")
    return int(logits.shape[-1])


def _forward_hooks(model, record: Callable[..., None]) -> List:
    """Forward hooks on every module; each output's gradient is recorded by a tensor hook.

    A tensor hook registered before an in-place op (torchvision's ReLU(inplace=True)) receives
    the gradient w.r.t. the value it was registered on, so a BN's record is its own output's.
    """
    import torch

    def to_numpy(tensor):
        return tensor_values(tensor) if isinstance(tensor, torch.Tensor) else None

    def watch(name: str, tensor, shape=None) -> None:
        if tensor.requires_grad:
            tensor.register_hook(lambda grad: record(
                name, "grad", to_numpy(grad if shape is None else grad.reshape(shape)),
                attrs=ACTIVATION))

    return recording_hooks(layers(model), record, to_numpy, watch)


def layers(model) -> List[Tuple[str, Any]]:
    """The model's named modules but for those inside a parametrization
    (``torch.nn.utils.parametrize``: weight_norm's, say): called whenever their parameter is
    read, they compute a weight, not a layer's output, and a port computes it inside its layer."""
    from torch.nn.utils.parametrize import ParametrizationList
    inside = [name for name, module in model.named_modules()
              if isinstance(module, ParametrizationList)]
    return [(name, module) for name, module in model.named_modules()
            if not any(name == p or name.startswith(p + ".") for p in inside)]


def _loss_function(config: StepConfig, dtype) -> Callable:
    """--torch-loss's loss in the model's dtype, or mean cross entropy (--label-smoothing)."""
    import torch
    import torch.nn.functional as F
    if config.torch_loss is None:
        return partial(F.cross_entropy, label_smoothing=config.label_smoothing)
    loss = build_loss(config.torch_loss)
    return loss.to(dtype) if isinstance(loss, torch.nn.Module) else loss


def _optimizer(param, config: StepConfig):
    """torch.optim's SGD, Adam or AdamW of one parameter, as the configuration says."""
    import torch
    if config.optimizer == "sgd":
        return torch.optim.SGD([param], lr=config.lr, momentum=config.momentum,
                               dampening=config.dampening, weight_decay=config.weight_decay,
                               nesterov=config.nesterov)
    adam = torch.optim.Adam if config.optimizer == "adam" else torch.optim.AdamW
    return adam([param], lr=config.lr, betas=(config.beta1, config.beta2), eps=config.eps,
                weight_decay=config.weight_decay)


def _train_step(model, initial: Mapping[str, np.ndarray], batch: Batch, config: StepConfig,
                record: Callable[..., None], *, hooks: bool = True) -> List[str]:
    """One optimizer step of ``model`` (in its own dtype) from the state ``initial``, every tensor
    handed to ``record``. Δw is taken against ``initial``: no copy of the weights is made.
    Returns the trainable parameters no gradient reached, which the step left as they were.

    ``record`` receives views valid only during the call: it copies what it keeps.
    """
    import torch

    dtype = next(model.parameters()).dtype
    model.train()
    for _, dropping in dropping_modules(model.named_modules()):
        dropping.eval()
    forward_pass = ForwardPassOnly(record)
    handles = _forward_hooks(model, forward_pass) if hooks else []
    model.zero_grad(set_to_none=True)
    try:
        inputs = [torch.from_numpy(x) for x in batch.inputs]    # token ids stay integers
        logits = model(*(x.to(dtype) if x.is_floating_point() else x for x in inputs))
        forward_pass.done = True
        if config.torch_loss is None:
            refuse_several_outputs(logits, "torch")
            if classes_last(logits.shape, batch.labels.shape):
                logits = logits.movedim(-1, 1)
        loss = _loss_function(config, dtype)(logits, torch.from_numpy(batch.labels))
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ParityInputError(f"the torch loss {config.torch_loss} returned "
                                   f"{tuple(getattr(loss, 'shape', ()))}, not one number: "
                                   "reduce it")
        record("loss", "loss", loss.detach().numpy())
        loss.backward()
    finally:
        for handle in handles:
            handle.remove()
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    # torch's optimizers skip a parameter no gradient reaches (one this forward does not use):
    # state the step keeps, recorded as a frozen one is. The MindSpore capture leaves it out.
    params = [(name, p) for name, p in trainable if p.grad is not None]
    no_gradient = [name for name, p in trainable if p.grad is None]
    for name, param in params:
        record(name, "grad", param.grad.numpy())
    # SGD and Adam step each parameter on its own (torch's per-tensor loop on CPU): stepped one
    # at a time, each gradient and its optimizer state is freed once recorded instead of all
    # being held with the weights (the float64 step's peak at batch 2, 64²). The same bits
    # either way.
    for name, param in params:
        optimizer = _optimizer(param, config)
        optimizer.step()
        after = param.detach().numpy()
        record(name, "update", weight_update(after, initial[name]))
        record(name, "weight", after)
        for state in OPTIMIZER_STATE[config.optimizer]:
            value = optimizer.state[param].get(state)
            if value is not None:       # SGD without momentum keeps no buffer
                record(f"{name}.{state}", "optimizer_state", value.numpy())
        param.grad = None
    # a frozen parameter is state the step keeps, as MindSpore records its own (requires_grad
    # False): a buffer
    kept = set(no_gradient)
    for name, param in model.named_parameters():
        if not param.requires_grad or name in kept:
            record(name, "buffer", tensor_values(param))
    constants = _non_persistent_buffers(model)
    for name, buffer in model.named_buffers():
        if not is_ignored(name):
            attrs = {**(NOT_IN_STATE_DICT if name in constants else {}),
                     **widened_from(buffer)}
            record(name, "buffer", tensor_values(buffer), **({"attrs": attrs} if attrs else {}))
    return no_gradient


def _non_persistent_buffers(model) -> Set[str]:
    """The buffers a module registered with persistent=False: constants it builds (GPT-2's
    causal mask, CLIP's position ids), outside its state dict and any checkpoint."""
    return {f"{prefix}.{name}".lstrip(".") for prefix, module in model.named_modules()
            for name in getattr(module, "_non_persistent_buffers_set", ())}


def float64_noise(t32: np.ndarray, t64: np.ndarray) -> Tuple[float, float]:
    """rms(t32 - t64) and rms(t64) in float64 blocks; an element not finite in both counts as
    zero, as in the comparison. ``t64`` may be float32 too (a rerounded step's tensor): it is
    widened a block at a time, not copied whole."""
    t32, t64 = t32.reshape(-1), t64.reshape(-1)
    difference = np.empty(min(t32.size, BLOCK))
    widened = None if t64.dtype == np.float64 else np.empty(difference.size)
    noise2 = exact2 = 0.0
    for start in range(0, t32.size, BLOCK):
        exact = t64[start:start + BLOCK]
        if widened is not None:
            widened[:exact.size] = exact
            exact = widened[:exact.size]
        block = np.subtract(t32[start:start + BLOCK], exact, out=difference[:exact.size])
        noise2 += float(np.dot(block, block))
        exact2 += float(np.dot(exact, exact))
    if not (math.isfinite(noise2) and math.isfinite(exact2)):     # rare: mask and redo
        t64 = t64.astype(np.float64, copy=False)
        keep = np.isfinite(t32) & np.isfinite(t64)
        difference = t32[keep] - t64[keep]
        noise2, exact2 = float(np.dot(difference, difference)), float(np.dot(t64[keep], t64[keep]))
    size = max(t32.size, 1)
    return math.sqrt(noise2 / size), math.sqrt(exact2 / size)


def _hooked_step_records(writer: RunWriter,
                         annotate: Callable[[RecordInfo, np.ndarray, np.ndarray], None]
                         ) -> Callable[..., None]:
    """A ``record`` for a later step of the same model: ``annotate(match, t32, array)`` with
    the hooked step's record each tensor matches and that record's float32 tensor.

    The k-th record named (kind, name) matches the hooked step's k-th one: same model, same
    hooks, same order. Only numbers are kept, never the later step's tensors.
    """
    step32: Dict[Tuple[str, str], List[RecordInfo]] = {}
    for record in writer.records:
        step32.setdefault((record.kind, record.name), []).append(record)
    seen: Counter = Counter()

    def record(name: str, kind: str, array: np.ndarray, **_: object) -> None:
        index = seen[(kind, name)]
        seen[(kind, name)] += 1
        matches = step32.get((kind, name), [])
        # sizes, not shapes: the writer stores a 0-d loss as shape (1,)
        if index < len(matches) and int(np.prod(matches[index].shape)) == array.size:
            annotate(matches[index], writer.array(matches[index]), array)
    return record


def _noise_recorder(writer: RunWriter) -> Callable[..., None]:
    """A ``record`` for the float64 step: per float32 record rms(t32 - t64) and rms(t64), and
    per ReLU record the units active in float32 but not in float64 or back (their effect is in
    torch's float32 error; parity/kinks.py): none at an nn.ReLU, which replays float32's units
    (capture/masks.py)."""
    def annotate(match: RecordInfo, t32: np.ndarray, t64: np.ndarray) -> None:
        noise_rms, exact_rms = float64_noise(t32, t64)
        flipped = None
        if match.kind == "forward" and match.op in kinks.ACTIVE:
            flipped = () if match.op == RELU else \
                tuple(kinks.flipped_units(match.op, t32, t64.reshape(t32.shape)).tolist())
        writer.annotate(match, fp32_noise_rms=noise_rms, exact_rms=exact_rms,
                        fp32_flipped=flipped)
    return _hooked_step_records(writer, annotate)


def _spread_recorder(writer: RunWriter) -> Callable[..., None]:
    """A ``record`` for a rerounded step: per float32 record the largest rms(t32' - t32) so far."""
    def annotate(match: RecordInfo, t32: np.ndarray, moved: np.ndarray) -> None:
        spread = float64_noise(t32, moved)[0]
        writer.annotate(match, fp32_spread_rms=max(spread, match.fp32_spread_rms or 0.0))
    return _hooked_step_records(writer, annotate)


def one_rounding_off(array: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A float array with each value moved to its float neighbour, up or down at random
    (other dtypes as they are): as far as one rounding can move it."""
    if not np.issubdtype(array.dtype, np.floating):
        return array
    toward = np.where(rng.random(array.shape) < 0.5, -np.inf, np.inf).astype(array.dtype)
    return np.nextafter(array, toward)


REROUNDED_DRAWS = 2


def _rerounded_step(model, initial: Mapping[str, np.ndarray], batch: Batch,
                    config: StepConfig, writer: RunWriter, masks: ReluMasks,
                    carried: Carried) -> None:
    """The float32 step again, REROUNDED_DRAWS times, from trainable weights each one rounding
    off, every record annotated with the farthest it moved (rms(t32' - t32)).

    One float64 rerun measures one draw of torch's float32 error, and where a record is
    ill-conditioned (BatchNorm over 2 values per channel) that draw varies by a hundredfold:
    ResNet18 at batch 2, 32², from torchvision's initial weights (seed 14), torch's float32
    error at layer4.1.bn1 was 2.8e-5 of its size, MindSpore's 9.3e-4, and eight forwards from
    inputs and weights one rounding off were 1.5e-5 to 1.5e-3 off float64. These draws make
    such a lucky first one show; where a record is well-conditioned they move it about as far
    as the float64 draw and change little. Inputs and buffers stay as they are: a mask's zeros
    and ones, compared exactly, are no rounding of anything. A tied weight is one tensor,
    moved once. ReLU units are those of the float32 step (``masks``), as in the float64 step.
    Each training BatchNorm's backward rounds its channel means, each LayerNorm's its row
    means, each GroupNorm's its weight and bias gradients, and each PReLU's its weight gradient,
    as a sequential float32 sum would (capture/sequential_sums.py): MindSpore's kernels leave
    ten times more of that rounding than torch's, which torch's own draws missed.
    """
    import torch

    trainable = [param for param in model.parameters() if param.requires_grad]
    for draw in range(REROUNDED_DRAWS):
        rng = np.random.default_rng((config.seed, draw))
        _restore(model, initial, carried)
        with torch.no_grad():
            for param in trainable:
                param.copy_(torch.from_numpy(one_rounding_off(param.detach().numpy(), rng)))
        moved = {name: tensor_values(value).copy() for name, value in model.state_dict().items()}
        with masks.replayed(model), sequential_kernel_sums(model):
            _train_step(model, moved, batch, config, _spread_recorder(writer))


def _refuse_compiled(model) -> None:
    """A torch.compile'd module runs its layers as compiled code: their hooks are traced into
    it or not at all, and its names gain "_orig_mod.". A ResNet18 so compiled stepped in
    float32 for 90 s, compiling, then failed in float64 with an AssertionError from dynamo."""
    compiled = next((name for name, module in model.named_modules()
                     if type(module).__name__ == "OptimizedModule"), None)
    if compiled is not None:
        where = "the torch model" if not compiled else f"the torch model's {compiled}"
        raise ParityInputError(f"{where} is torch.compile'd: parity hooks each layer, which "
                               "compiled code hides; return the module before torch.compile "
                               "(parity checks its eager step, layer by layer)")


def _refuse_other_precisions(model) -> None:
    """The reference is torch's float32 step (parity reruns it in float64 itself); a model
    built in float64 or float16 failed on the float32 batch, told that it may need other
    inputs."""
    import torch
    others = [(name, str(p.dtype).removeprefix("torch.")) for name, p in model.named_parameters()
              if p.is_floating_point() and p.dtype != torch.float32]
    if others:
        held = ", ".join(f"{count} {dtype}" for dtype, count in
                         Counter(dtype for _, dtype in others).items())
        raise ParityInputError(f"the torch model's parameters are not all float32 ({held}; the "
                               f"first: {others[0][0]}): parity's reference is torch's float32 "
                               "step, which it reruns in float64 itself; build the model in "
                               "float32 (model.float())")


def _synthetic_batch_errors(config: StepConfig, *, probe: bool = False) -> ContextManager[None]:
    """A model failing on the synthetic image batch most often takes other inputs or labels,
    or needs a larger batch (BatchNorm in training wants more than one value per channel).
    ``probe``: the failure met its first sample alone (_infer_num_classes), whose shape the
    framework's message quotes."""
    size = f"3×{config.image_size}×{config.image_size} float32 images"
    fed = f"on the first sample of parity's synthetic batch (1×{size}, in eval mode, for the " \
        "class count its output gives)" if probe else \
        f"on parity's synthetic batch ({config.batch_size}×{size}, one label per sample)"
    return failure_explained(
        "torch", fed,
        "A model that takes other inputs or labels needs them from --input FILE.npz; one that "
        "needs a larger batch, a larger --batch-size or --image-size")


def _own_batch_errors(batch: Batch, source: str) -> ContextManager[None]:
    """A model failing on the user's own batch most often takes other arrays than it holds;
    integer images (uint8 straight from the files) are passed as token ids."""
    integer_images = [f"x{i or ''}" for i, x in enumerate(batch.inputs)
                      if x.ndim == 4 and np.issubdtype(x.dtype, np.integer)]
    images = (f" {', '.join(integer_images)} holds integers, which parity passes as int64 "
              "(token ids): images go in as floats, converted and normalised as in training."
              if integer_images else "")
    return failure_explained(
        "torch", f"on {source} ({batch.summary()})",
        "Check that its arrays are what the model and its loss take: x, x1... the inputs in "
        f"order, y the labels.{images}")


def _float64_step_errors() -> ContextManager[None]:
    """The float32 steps ran, so a failure now is the model's in float64 (a float32 tensor made
    in its forward, say)."""
    return failure_explained(
        "torch", "in parity's float64 rerun of its step (after its float32 steps ran)",
        "A model that cannot run in float64 runs with --no-fp64-reference (parity.check: "
        "fp64_reference=False); verdicts then use fixed tolerances",
        "that step, the torch capture's largest, is skipped with --no-fp64-reference "
        f"(verdicts then use fixed tolerances); or {SMALLER_BATCH}")


@contextmanager
def _float64_step_memory() -> Iterator[None]:
    """glibc only: the float64 step's large allocations get their own mappings.

    After the float32 steps glibc's dynamic mmap threshold has grown, so the float64 step's
    activations would come from a heap that keeps whatever backward frees. Measured at batch
    8, 224² (torch capture): peak 2.80 GB and 21.4 s as is; 2.54 GB and 21.7 to 25.4 s with
    the freed heap trimmed and a fixed 128 KiB threshold for this step only; 2.49 GB and
    30.6 s with that threshold for the whole process (GLIBC_TUNABLES). Afterwards the
    threshold is left at 32 MiB, the most the dynamic one reaches.
    """
    libc = ctypes.CDLL(None) if platform.libc_ver()[0] == "glibc" else None
    if libc is None:
        yield
        return
    libc.malloc_trim(0)
    libc.mallopt(M_MMAP_THRESHOLD, 128 << 10)
    try:
        yield
    finally:
        libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)
        libc.malloc_trim(0)


@contextmanager
def _float64_by_default() -> Iterator[None]:
    """Tensors a forward makes of Python numbers (torch.full, torch.tensor, a float arange) are
    float64 in the float64 step, as the model is: Hugging Face's CLIP text model fills its
    causal mask with torch.finfo(dtype).min of its hidden states' dtype, which overflowed a
    float32 tensor ("value cannot be converted to type float without overflow"), and a constant
    made in float32 would round the reference."""
    import torch

    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(default)


def _float64_step(model, initial: Mapping[str, np.ndarray], batch: Batch, config: StepConfig,
                  writer: RunWriter, own_process: bool, masks: ReluMasks,
                  carried: Carried) -> int:
    """The step again in float64, each float32 record annotated with its noise, by the model
    itself (not a copy: one set of parameters in memory, not two); returns the bytes spilled.
    Its ReLU units are the float32 step's (``masks``).

    Its activations, twice the float32 ones, are kept near the float32 steps' peak: the forward
    spills past that peak less room for what backward adds (the gradients, and about as much
    again: ResNet50's backward, batch 8, 224², grew 300-450 MB over the forward's end with
    205 MB of float64 gradients). A forward that refuses saved-tensor hooks (some torch.func
    code does) gets the step again without the spill.
    """
    gradients = sum(8 * p.numel() for p in model.parameters() if p.requires_grad)
    spill = SavedTensorSpill(writer.partial / SPILL_FILE, peak_resident_bytes() - 2 * gradients,
                             written_for=writer.out)

    def step(spilling: ContextManager) -> None:
        model.zero_grad(set_to_none=True)
        _restore(model, initial, carried)
        with spilling, masks.replayed(model), _float64_by_default():
            _train_step(model.double(), initial, batch, config, _noise_recorder(writer))

    try:
        with _float64_step_errors(), _float64_step_memory() if own_process else nullcontext():
            try:
                step(spill)
                return spill.spilled_bytes
            except ParityInputError:
                raise
            except Exception:
                pass    # leaving the handler frees the failed step's tensors its traceback held
            step(nullcontext())
            return 0
    finally:
        model.float()


class _StateOnDisk(SafetensorsFile):
    """A state dict read from its safetensors file at each use, not held in memory: 100 MB
    (ResNet50) less at the float64 step's peak. Each tensor is memory-mapped from offsets read
    once (opening the file with safetensors at each use parsed its header each time: 0.4 s of
    a torch capture at batch 2, 64², cProfile). Keys in the model's order."""

    def __init__(self, path: Path, keys: List[str]) -> None:
        super().__init__(path)
        self.keys_in_order = keys

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys_in_order)

    def __len__(self) -> int:
        return len(self.keys_in_order)

    def items(self):                                # one read of the whole file
        return load_state_dict(self.path).items()


def _write_starting_point(writer: RunWriter, initial: StateDict, batch: Batch) -> str:
    """The initial weights (for the MindSpore capture) and the batch; returns their fingerprint.

    A function so the file's bytes (100 MB for ResNet50) are freed before the steps run.
    """
    weights_file = save_state_dict_bytes(initial)
    writer.write_file(INITIAL_WEIGHTS, weights_file)
    for name, array in batch.named():
        writer.add(name, "input", array)
    return fingerprint(weights_file, *batch.inputs, batch.labels)


def capture_torch(config: StepConfig, out: Path, *, factory: str = "", model=None,
                  weights: Optional[Path] = None, batch_file: Optional[Path] = None,
                  batch: Optional[Batch] = None, fp64_reference: bool = True,
                  own_process: bool = False, overrides: Optional[Mapping[str, str]] = None
                  ) -> Path:
    """The torch step in float32, plus (by default) the same step in float64 and twice more in
    float32 from trainable weights one rounding off (_rerounded_step).

    The float64 rerun measures how far float32 itself is from the exact result, record by
    record (rms(t32 - t64), kept in the manifest): the comparison then judges MindSpore's
    difference from torch against torch's own float32 error instead of a constant (the
    approach of torch dynamo's accuracy checker). ``own_process``: the capture is the process
    (``parity capture``), so it may tune glibc's malloc for the float64 step; in a caller's
    process (``parity.check``) malloc is left alone. ``overrides``: the --map table, whose
    PyTorch names are checked here (the MindSpore capture uses it).
    """
    import torch
    from parity.models_loader import build_torch_model, load_factory

    if model is None:
        load_factory(factory)       # its imports (torchvision: 1.2 s) are start-up, not the step
    clock = PhaseClock("start")
    torch.manual_seed(config.seed)
    torch.use_deterministic_algorithms(True)
    if model is None:
        model = build_torch_model(factory, num_classes=config.num_classes)
    _refuse_compiled(model)
    _refuse_other_precisions(model)
    refuse_map_names_not_in_model(model, overrides or {})
    if weights is not None:
        _load_weights(model, weights)
    if not any(param.requires_grad for param in model.parameters()):
        raise ParityInputError("the torch model has no trainable parameter: parity checks a "
                               "training step (forward, gradients, update), which needs at least "
                               "one (frozen ones are compared as buffers)")
    num_classes = config.num_classes
    synthetic = batch is None and batch_file is None
    if batch is None:
        if num_classes is None and synthetic:       # a file's labels need no count
            probe = batch_for(config, batch_file, 1)
            with _synthetic_batch_errors(config, probe=True):
                num_classes = _infer_num_classes(model, probe.inputs)
        batch = batch_for(config, batch_file, num_classes)
    batch_errors = _synthetic_batch_errors(config) if synthetic else \
        _own_batch_errors(batch, f"your --input {batch_file}" if batch_file else "your batch")
    with torch.random.fork_rng():       # the probe draws nothing, but a layer it calls might
        in_out = weights_held_in_out(model.named_modules())
    state, carried = model.state_dict(), _carried_state(model)
    initial = StateDict({k: tensor_values(v).copy() for k, v in state.items()},
                        tied_keys(state))

    with RunWriter(out, "torch") as writer, numpy_on_one_thread():
        starts_from = _write_starting_point(writer, initial, batch)
        initial = _StateOnDisk(writer.partial / INITIAL_WEIGHTS, list(initial))
        hooked, masks = Fingerprints(), ReluMasks()
        clock.next("hooked step")
        with batch_errors:
            no_gradient = _train_step(model, initial, batch, config,
                                      tee(writer.add, hooked, masks))

        def rerun_without_hooks(record: Callable[..., None]) -> None:
            _restore(model, initial, carried)
            _train_step(model, initial, batch, config, record, hooks=False)

        clock.next("observer rerun")
        observer = observer_check(hooked, rerun_without_hooks)
        spilled = 0
        if fp64_reference:
            clock.next("rerounded step")
            _rerounded_step(model, initial, batch, config, writer, masks, carried)
            clock.next("float64 step")
            spilled = _float64_step(model, initial, batch, config, writer, own_process, masks,
                                    carried)
        clock.next("writes")
        # leave a caller's model as it came: the rerun stepped it
        _restore(model, initial, carried)
        writer.wait()
        meta = manifest_meta("torch", config, num_classes, factory or type(model).__name__, {},
                             observer, clock, fp64_reference=fp64_reference,
                             fingerprint=starts_from, no_gradient=no_gradient,
                             in_out_weights=in_out)
        meta["resources"]["float64_spilled_mb"] = spilled / 2**20
        return writer.finish(meta)
