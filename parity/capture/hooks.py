"""What the captures' hooks record, in both frameworks: each module's outputs as forward
records (op type and settings attached), the sketch of its input, and, through ``watch``, the
gradient w.r.t. each output."""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import numpy as np

# Operation types that mean the same thing in both frameworks, keyed by class name.
OPS = {
    "Conv1d": "conv1d", "Conv2d": "conv2d", "Conv3d": "conv3d",
    "ConvTranspose1d": "convtranspose1d", "ConvTranspose2d": "convtranspose2d",
    "Conv1dTranspose": "convtranspose1d", "Conv2dTranspose": "convtranspose2d",
    "Upsample": "upsample", "UpsamplingBilinear2d": "upsample", "UpsamplingNearest2d": "upsample",
    "BatchNorm1d": "batchnorm1d", "BatchNorm2d": "batchnorm2d", "LayerNorm": "layernorm",
    "GroupNorm": "groupnorm",
    "ReLU": "relu", "ReLU6": "relu6", "GELU": "gelu", "SiLU": "silu", "Sigmoid": "sigmoid",
    "Tanh": "tanh", "Softmax": "softmax", "LeakyReLU": "leakyrelu", "SELU": "selu",
    "SeLU": "selu",
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
                   "inplace", "negative_slope", "alpha", "p", "keep_prob", "approximate",
                   "output_padding", "mode", "align_corners", "padding_idx", "padding_mode")


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
    """(record name, value) per output: ``name`` alone, or ``name.out0``... for tuples.

    Trailing Nones do not count: torch's attention without weights returns (output, None),
    MindSpore's (output,), and both are the one output ``name``."""
    values = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    while len(values) > 1 and values[-1] is None:
        values.pop()
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
