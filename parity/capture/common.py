"""What the torch and MindSpore captures share: the batch, op names, versions, attributes."""

from __future__ import annotations

import platform
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import numpy as np

from parity.errors import ParityInputError
from parity.rundir import crc32

# Operation types that mean the same thing in both frameworks, keyed by class name.
OPS = {
    "Conv1d": "conv1d", "Conv2d": "conv2d", "Conv3d": "conv3d",
    "BatchNorm1d": "batchnorm1d", "BatchNorm2d": "batchnorm2d", "LayerNorm": "layernorm",
    "GroupNorm": "groupnorm",
    "ReLU": "relu", "ReLU6": "relu6", "GELU": "gelu", "SiLU": "silu", "Sigmoid": "sigmoid",
    "Tanh": "tanh", "Softmax": "softmax", "LeakyReLU": "leakyrelu",
    "MaxPool2d": "maxpool2d", "AvgPool2d": "avgpool2d",
    "AdaptiveAvgPool2d": "globalavgpool", "GlobalAvgPool": "globalavgpool",
    "Linear": "dense", "Dense": "dense", "Flatten": "flatten", "Dropout": "dropout",
    "Dropout1d": "dropout", "Dropout2d": "dropout", "Dropout3d": "dropout",
    "DropoutExt": "dropout", "Dropout2dExt": "dropout", "AlphaDropout": "dropout",
    "Identity": "identity", "Embedding": "embedding",
    "Sequential": "sequential", "SequentialCell": "sequential",
    "ModuleList": "list", "CellList": "list",
}

# Module settings worth recording: they let the diagnosis name a cause instead of guessing.
ATTRIBUTE_NAMES = ("stride", "padding", "pad_mode", "kernel_size", "dilation", "groups", "group",
                   "eps", "epsilon", "momentum", "training", "use_batch_statistics", "ceil_mode",
                   "inplace", "negative_slope", "p", "keep_prob", "approximate")


def op_type(module: Any) -> str:
    return OPS.get(type(module).__name__, "module")


def dropout_modules(named_modules: Iterable[Tuple[str, Any]]) -> List[Tuple[str, Any]]:
    """The dropout modules, which the captures run as identity: the two frameworks draw their
    random masks differently, so no mask can be compared. Their rates are compared instead."""
    return [(name, module) for name, module in named_modules if op_type(module) == "dropout"]


def json_value(value: Any) -> Any:
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (tuple, list)):
        return [json_value(v) for v in value]
    if hasattr(value, "item") and getattr(value, "size", 2) == 1:
        return value.item()
    return str(value)


def module_attrs(module: Any) -> Dict[str, Any]:
    attrs = {}
    for name in ATTRIBUTE_NAMES:
        value = getattr(module, name, None)
        if value is None or callable(value):
            continue
        if hasattr(value, "asnumpy"):          # MindSpore Parameter / Tensor
            value = value.asnumpy()
        attrs[name] = json_value(value)
    return attrs


# attrs of a "grad" record that is the gradient w.r.t. a module's output, not a parameter's
ACTIVATION = {"activation": True}


def output_names(name: str, outputs: Any) -> List[Tuple[str, Any]]:
    """(record name, value) per output: ``name`` alone, or ``name.out0``... for tuples."""
    values = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    if len(values) == 1:
        return [(name, values[0])]
    return [(f"{name}.out{index}", value) for index, value in enumerate(values)]


# Each module's first input is summarised as it enters (a pre-hook: before an in-place ReLU
# overwrites it): its norm and two fixed ±1 projections, a few numbers per call. When a module's
# output is the first to diverge, they tell whether its input already differed (the code
# between modules: a parent's forward, attention's matmul and softmax) or the module itself.
SKETCH_PERIOD = 4096
_SIGNS = np.random.default_rng(0).choice(np.array([-1, 1], np.float32), size=(SKETCH_PERIOD, 2))


def input_sketch(array: Optional[np.ndarray]) -> Optional[List[float]]:
    """[‖x‖, Σ x·s₁, Σ x·s₂] of a float32 array (s: ±1 signs repeating every SKETCH_PERIOD
    elements): a difference between two inputs shows in the projections at about its RMS
    relative to ‖x‖, whatever its pattern."""
    if array is None or array.dtype != np.float32 or array.size == 0:
        return None
    flat = array.reshape(-1)
    whole = flat.size - flat.size % SKETCH_PERIOD
    projections = (flat[:whole].reshape(-1, SKETCH_PERIOD) @ _SIGNS).sum(axis=0, dtype=np.float64)
    projections += flat[whole:] @ _SIGNS[:flat.size - whole]
    return [float(np.sqrt(np.dot(flat, flat))), *(float(v) for v in projections)]


def input_sketcher(name: str, sketches: Dict[str, Optional[List[float]]],
                   to_numpy: Callable[[Any], Optional[np.ndarray]]) -> Callable:
    """A forward pre-hook keeping the sketch of ``module``'s first input for its output hook."""
    def hook(_module, inputs) -> None:
        first = inputs[0] if isinstance(inputs, tuple) and inputs else None
        sketches[name] = input_sketch(to_numpy(first)) if first is not None else None
    return hook


def output_recorder(name: str, module: Any, record: Callable[..., None],
                    to_numpy: Callable[[Any], Optional[np.ndarray]],
                    watch: Callable[[str, Any], None],
                    sketches: Dict[str, Optional[List[float]]]) -> Callable:
    """A forward hook storing each tensor output of ``module`` as a forward record.

    ``to_numpy`` returns a view (or None for a non-tensor output) and ``record`` copies it
    before the hook returns: the framework may overwrite the buffer a moment later
    (torchvision's ReLU(inplace=True) overwrites BN outputs).
    ``watch(record_name, tensor)`` sees each output (to hook its gradient); ``sketches``
    holds the input sketch the module's ``input_sketcher`` took.
    """
    op, attrs = op_type(module), module_attrs(module)

    def hook(_module, _inputs, output) -> None:
        sketch = sketches.pop(name, None)
        call_attrs = attrs if sketch is None else {**attrs, "input_sketch": sketch}
        for record_name, tensor in output_names(name, output):
            array = to_numpy(tensor)
            if array is not None:
                record(record_name, "forward", array, op=op, attrs=call_attrs)
                watch(record_name, tensor)
    return hook


def recording_hooks(modules: Iterable[Tuple[str, Any]], record: Callable[..., None],
                    to_numpy: Callable[[Any], Optional[np.ndarray]],
                    watch: Callable[[str, Any], None]) -> List:
    """Handles of the hooks recording every named module's outputs (and input sketches)."""
    sketches: Dict[str, Optional[List[float]]] = {}
    handles = []
    for name, module in modules:
        if name:
            handles.append(module.register_forward_pre_hook(
                input_sketcher(name, sketches, to_numpy)))
            handles.append(module.register_forward_hook(
                output_recorder(name, module, record, to_numpy, watch, sketches)))
    return handles


def several_outputs(outputs: Any) -> str:
    """'a tuple of 2 outputs' (or list, dict) when a model returned more than one value, else
    '': such a model has no one logits tensor for the default loss or the class count."""
    if isinstance(outputs, (tuple, list, dict)):
        return f"a {type(outputs).__name__} of {len(outputs)} outputs"
    return ""


def refuse_several_outputs(outputs: Any, framework: str) -> None:
    """The default loss is cross entropy of one logits tensor: a model with several outputs
    (an auxiliary head, say) is told to pass the loss its training script uses."""
    several = several_outputs(outputs)
    if several:
        raise ParityInputError(
            f"the {framework} model returns {several}; parity's default loss (mean cross "
            "entropy) takes one logits tensor: pass --torch-loss and --ms-loss (parity.check: "
            "torch_loss=, ms_loss=) factories of the losses that take them")


def weight_update(after: np.ndarray, before: np.ndarray) -> np.ndarray:
    """Δw = after - before in the weights' dtype: comparing w1 alone hides small update bugs.

    IEEE subtraction rounds the exact difference once: exact wherever w and w1 are within a
    factor of 2 of each other (Sterbenz's lemma: nearly every element), elsewhere off by at
    most half an ulp of Δw (2**-24 relative in float32) — under a tenth of the noise floor
    (1e-6 · rms) the verdict adds anyway. Keeping float64 wherever one element needed it made
    the Δw of nearly every large conv float64: 204 of 527 MB of a ResNet50 run at 2×64².
    """
    return after - before


def fingerprint(*blobs: Any) -> str:
    """CRC-32 of what a run starts from (initial-weight bytes, batch arrays): two runs with
    equal fingerprints checked the same numbers, so their errors may be compared (baselines)."""
    crc = 0
    for blob in blobs:
        crc = crc32(np.ascontiguousarray(blob) if isinstance(blob, np.ndarray) else blob, crc)
    return f"{crc:08x}"


def input_name(position: int) -> str:
    """The record (and --input array) of the model's ``position``-th input: ``input`` / ``x``
    first, then ``input1`` / ``x1``, ``input2`` / ``x2``..."""
    return "input" if position == 0 else f"input{position}"


@dataclass(frozen=True)
class Batch:
    """What both models are fed: ``model(*inputs)``, and ``loss(outputs, labels)``."""

    inputs: Tuple[np.ndarray, ...]
    labels: np.ndarray

    def named(self) -> List[Tuple[str, np.ndarray]]:
        """(record name, array) of each input, then of the labels (``target``)."""
        return [(input_name(i), x) for i, x in enumerate(self.inputs)] + \
            [("target", self.labels)]


def synthetic_batch(batch_size: int, image_size: int, num_classes: int, seed: int) -> Batch:
    """A seeded batch both frameworks can regenerate without sharing a file."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch_size, 3, image_size, image_size), dtype=np.float32)
    y = rng.integers(0, num_classes, size=batch_size, dtype=np.int64)
    return Batch((x,), y)


def model_input(x: np.ndarray) -> np.ndarray:
    """The batch as both models take it: floats in float32, integers (token ids, indices) in
    int64, as torch's embedding and gather require; anything else is refused."""
    if np.issubdtype(x.dtype, np.floating):
        return x.astype(np.float32, copy=False)
    if np.issubdtype(x.dtype, np.integer):
        return x.astype(np.int64, copy=False)
    raise ParityInputError(f"the input batch holds {x.dtype}: pass floats (images, features) "
                           "or integers (token ids)")


def _input_keys(path: Path, keys: List[str]) -> List[str]:
    """x, then x1, x2... as present in the file: any other array is refused, not ignored."""
    numbered = sorted(int(key[1:]) for key in keys if re.fullmatch(r"x[1-9][0-9]*", key))
    unknown = sorted(set(keys) - {"x", "y"} - {f"x{i}" for i in numbered})
    if unknown:
        raise ParityInputError(f"{path} holds array(s) {', '.join(unknown)} parity does not "
                               "read: a model's inputs are x, x1, x2... in the order it takes "
                               "them, its labels y")
    if numbered != list(range(1, len(numbered) + 1)):
        raise ParityInputError(f"{path}: inputs x, {', '.join(f'x{i}' for i in numbered)} skip "
                               "a number: after x come x1, x2... in the order the model takes "
                               "them")
    return ["x"] + [f"x{i}" for i in numbered]


def load_batch(path: Path) -> Batch:
    """A user batch from an .npz with ``x`` (float N×C×H×W, or integer token ids N×L), further
    inputs ``x1``, ``x2``... (an attention mask, say) and ``y`` (integer labels)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = [key for key in ("x", "y") if key not in data.files]
            if missing:
                raise ParityInputError(f"{path} lacks array(s) {', '.join(missing)}; an --input "
                                       ".npz needs 'x' (N×C×H×W or token ids) and 'y' (class "
                                       "indices)")
            keys = _input_keys(path, list(data.files))
            inputs, y = [data[key] for key in keys], data["y"]
    except (OSError, ValueError) as error:
        raise ParityInputError(f"{path} is not a readable .npz file ({error})") from None
    if inputs[0].ndim < 2 or y.ndim < 1 or any(x.ndim < 1 or len(x) != len(y) for x in inputs):
        shapes = ", ".join(f"{key} {x.shape}" for key, x in zip(keys, inputs))
        raise ParityInputError(f"{path}: {shapes} and y {y.shape} must share the batch size "
                               "(y holds class indices: one per sample, or per pixel or token)")
    if not np.issubdtype(y.dtype, np.integer):
        raise ParityInputError(f"{path}: y must hold integer class indices, not {y.dtype}")
    return Batch(tuple(model_input(x) for x in inputs), y.astype(np.int64, copy=False))


def framework_versions(framework: str) -> Dict[str, str]:
    versions = {"python": platform.python_version(), "numpy": np.__version__,
                "platform": platform.platform()}
    if framework == "torch":
        import torch
        import torchvision
        versions.update(torch=torch.__version__, torchvision=torchvision.__version__)
    else:
        import mindspore
        versions.update(mindspore=mindspore.__version__,
                        device=str(mindspore.get_context("device_target")))
    return versions


class PhaseClock:
    """Where a capture's time goes: ``clock.next("hooked step")`` ends the phase running and
    starts the named one. The clock starts after the model factory's imports, as the bench's
    bare steps do; each phase's seconds land in the manifest (``resources.phases``), so the
    cost of every check parity adds is measured, not guessed."""

    def __init__(self, first: str) -> None:
        self.phases: Dict[str, float] = {}
        self.started = self._mark = time.perf_counter()
        self._current = first

    def next(self, phase: str) -> None:
        now = time.perf_counter()
        self.phases[self._current] = self.phases.get(self._current, 0.0) + now - self._mark
        self._current, self._mark = phase, now

    def usage(self) -> Dict[str, Any]:
        """Seconds so far (the phase running included), by phase, and peak resident memory."""
        import resource                 # Unix only, like the figure it gives
        self.next(self._current)
        return {"seconds": self._mark - self.started,
                "phases": {name: round(seconds, 3) for name, seconds in self.phases.items()},
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def manifest_meta(framework: str, config, num_classes: Optional[int], factory: str,
                  param_map: Dict[str, str], observer: Dict[str, Any], clock: PhaseClock,
                  **extra: Any) -> Dict[str, Any]:
    """What a capture's manifest says about the run besides its records."""
    return {"versions": framework_versions(framework), "seed": config.seed,
            "config": {**config.to_dict(), "num_classes": num_classes}, "factory": factory,
            "param_map": param_map, "self_checks": {"observer_effect": observer},
            "resources": clock.usage(), **extra}


def batch_for(config, batch_file: Optional[Path], num_classes: int) -> Batch:
    if batch_file is not None:
        return load_batch(batch_file)
    return synthetic_batch(config.batch_size, config.image_size, num_classes, config.seed)
