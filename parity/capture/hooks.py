"""What the captures' hooks record, in both frameworks: each module's outputs as forward
records (op type and settings attached), the sketches of its inputs, and, through ``watch``, the
gradient w.r.t. each output."""

from __future__ import annotations

import math
import sys
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import numpy as np

from parity.records import DROPPING_OPS, drops_between_layers
from parity.sketch import (input_sketch, integer_input_checksum, magnitude,
                           other_input_sketch)

# Operation types that mean the same thing in both frameworks, keyed by class name.
OPS = {
    "Conv1d": "conv1d", "Conv2d": "conv2d", "Conv3d": "conv3d",
    "ConvTranspose1d": "convtranspose1d", "ConvTranspose2d": "convtranspose2d",
    "Conv1dTranspose": "convtranspose1d", "Conv2dTranspose": "convtranspose2d",
    "Upsample": "upsample", "UpsamplingBilinear2d": "upsample", "UpsamplingNearest2d": "upsample",
    "BatchNorm1d": "batchnorm1d", "BatchNorm2d": "batchnorm2d", "BatchNorm3d": "batchnorm3d",
    "LayerNorm": "layernorm",
    "FrozenBatchNorm2d": "batchnorm2d",
    "GroupNorm": "groupnorm",
    "ReLU": "relu", "ReLU6": "relu6", "GELU": "gelu", "SiLU": "silu", "Sigmoid": "sigmoid",
    "Swish": "silu",                                          # mindcv's, x · sigmoid(x)
    "Tanh": "tanh", "Softmax": "softmax", "LogSoftmax": "logsoftmax", "LeakyReLU": "leakyrelu",
    "SELU": "selu", "SeLU": "selu", "Hardswish": "hardswish", "HSwish": "hardswish",
    "Hardsigmoid": "hardsigmoid", "HSigmoid": "hardsigmoid", "ELU": "elu",
    "Mish": "mish", "ChannelShuffle": "channelshuffle",
    "MaxPool1d": "maxpool1d", "AvgPool1d": "avgpool1d", "AdaptiveAvgPool1d": "adaptiveavgpool1d",
    "MaxPool2d": "maxpool2d", "AvgPool2d": "avgpool2d", "MaxPool3d": "maxpool3d",
    "AvgPool3d": "avgpool3d", "AdaptiveAvgPool3d": "adaptiveavgpool3d",
    "AdaptiveAvgPool2d": "globalavgpool", "GlobalAvgPool": "globalavgpool",
    "GlobalAvgPooling": "globalavgpool",                      # mindcv's
    "Linear": "dense", "Dense": "dense", "Flatten": "flatten", "Dropout": "dropout",
    "Dropout1d": "dropout", "Dropout2d": "dropout", "Dropout3d": "dropout",
    "DropoutExt": "dropout", "Dropout2dExt": "dropout", "AlphaDropout": "dropout",
    "StochasticDepth": "droppath", "DropPath": "droppath",
    "Identity": "identity", "Embedding": "embedding", "MultiheadAttention": "attention",
    "LSTM": "lstm", "GRU": "gru", "RNN": "rnn",
    "Sequential": "sequential", "SequentialCell": "sequential",
    "ModuleList": "list", "CellList": "list",
    # the pad modules, by the values they pad with (a ZeroPad2d is a ConstantPad2d of 0)
    **{f"{kind}Pad{n}d": f"{values}pad{n}d" for n in (1, 2, 3) for kind, values in (
        ("Reflection", "reflection"), ("Replication", "replication"), ("Circular", "circular"),
        ("Constant", "constant"), ("Zero", "constant"))},
}

# Module settings worth recording: they let the diagnosis name a cause instead of guessing.
ATTRIBUTE_NAMES = ("stride", "padding", "pad_mode", "kernel_size", "dilation", "groups", "group",
                   "eps", "epsilon", "momentum", "training", "use_batch_statistics", "ceil_mode",
                   "inplace", "negative_slope", "alpha", "p", "keep_prob", "approximate",
                   "output_padding", "mode", "align_corners", "padding_idx", "padding_mode",
                   "num_heads", "batch_first", "track_running_stats", "num_groups",
                   "count_include_pad", "dim", "axis", "drop_prob", "normalized_shape",
                   "begin_norm_axis", "value", "dropout", "variance_epsilon")
# Settings a MindSpore cell keeps only in the primitive it calls: (primitive attribute, setting).
PRIMITIVE_SETTINGS = {"ceil_mode": ("max_pool", "avg_pool"), "count_include_pad": ("avg_pool",),
                      "axis": ("softmax", "log_softmax"), "alpha": ("elu",)}


def op_type(module: Any) -> str:
    name = type(module).__name__
    if name in OPS:
        return OPS[name]
    # a GELU of another name (Hugging Face's GELUActivation, NewGELUActivation): its form is
    # told from what it computes (module_attrs), as for any GELU holding no setting
    if "gelu" in name.lower() and _computes_alone(module):
        return "gelu"
    # Hugging Face's model-named copies of timm's DropPath (SegformerDropPath, BeitDropPath):
    # run at random in the torch step, the port's as identity, they failed a correct SegFormer
    return "droppath" if name.endswith("DropPath") and hasattr(module, "drop_prob") else "module"


def _computes_alone(module: Any) -> bool:
    """A torch module or MindSpore cell holding no parameter and no module of its own."""
    children, parameters = (("children", "parameters") if hasattr(module, "children") else
                            ("cells", "get_parameters"))
    return not any(True for _ in getattr(module, children)()) and \
        not any(True for _ in getattr(module, parameters)())


def dropping_modules(named_modules: Iterable[Tuple[str, Any]]) -> List[Tuple[str, Any]]:
    """The dropout and stochastic-depth modules, and the recurrent layers dropping between
    their stacked layers, which the captures run in eval mode (dropout as identity, the rest
    alike): the two frameworks draw their random masks differently, so no mask can be
    compared. Their rates are compared instead."""
    return [(name, module) for name, module in named_modules
            if op_type(module) in DROPPING_OPS or
            drops_between_layers(op_type(module), {"dropout": getattr(module, "dropout", None)})]


def json_value(value: Any) -> Any:
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (tuple, list)):
        return [json_value(v) for v in value]
    if hasattr(value, "item") and getattr(value, "size", 2) == 1:
        return value.item()
    return str(value)


# MindSpore layers that keep their settings in a cell they are built of: nn.BatchNorm3d runs a
# BatchNorm2d on the map reshaped (not recorded itself: mindspore_capture.port_cells).
SETTINGS_HELD_BY = {"BatchNorm3d": "bn2d"}


def module_attrs(module: Any) -> Dict[str, Any]:
    held_by = SETTINGS_HELD_BY.get(type(module).__name__)
    if held_by is not None:
        module = getattr(module, held_by, module)   # torch's BatchNorm3d keeps its own
    attrs = {}
    for name in ATTRIBUTE_NAMES:
        value = getattr(module, name, None)
        if value is None or callable(value):
            continue
        if hasattr(value, "asnumpy"):          # MindSpore Parameter / Tensor
            value = value.asnumpy()
        attrs[name] = json_value(value)
    statistics = _batch_statistics(module)
    if statistics is not None:
        attrs["batch_statistics"] = statistics
    if op_type(module) == "gelu" and "approximate" not in attrs:
        form = _gelu_form_computed(module)
        if form is not None:
            attrs["approximate"] = form
    for name, primitives in PRIMITIVE_SETTINGS.items():
        for primitive in primitives:
            value = getattr(getattr(module, primitive, None), name, None)
            if name not in attrs and isinstance(value, (bool, int, float, tuple)):
                attrs[name] = json_value(value)
    return attrs


# Where a GELU module's output tells its form apart: the exact and tanh forms differ there by
# up to 4.1e-4 (at -3), the quick one from either by up to 1.4e-2; GELU_FORMS holds each form's
# values there (x·Φ(x), its tanh approximation, and x·σ(1.702x): Hugging Face's quick_gelu,
# CLIP's, which MindSpore's nn.FastGelu computes).
GELU_PROBE = (-3.0, -1.0, 0.5, 2.0)
GELU_FORMS = {
    "none": np.array([0.5 * x * (1 + math.erf(x / math.sqrt(2))) for x in GELU_PROBE]),
    "tanh": np.array([0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
                      for x in GELU_PROBE]),
    "quick": np.array([x / (1 + math.exp(-1.702 * x)) for x in GELU_PROBE]),
}


def _gelu_form_computed(module: Any) -> Optional[str]:
    """The form ('none', 'tanh' or 'quick') a GELU module without an ``approximate`` setting
    computes, told from its output over GELU_PROBE (its forward or construct called, not its
    hooks): timm's GELU calls F.gelu and holds no setting, so its pair with MindSpore's
    tanh-form nn.GELU went unflagged (mindcv's ConvNeXtV2 failed three stages on at 8×, told
    "input in another order"); Hugging Face's BERT and a port writing the tanh form out passed
    on their numbers; CLIP's quick GELU against nn.GELU was "gelu computes something different"
    (a guess). None for a module computing none of the forms, or one holding parameters."""
    if not _computes_alone(module):
        return None
    probe = np.array(GELU_PROBE, np.float32)
    output = called_alone(module, probe)
    if output is None or output.shape != probe.shape:
        return None
    # within a fortieth of the forms' largest difference: a form written out rounds
    # otherwise than the framework's kernel
    return next((form for form, values in GELU_FORMS.items()
                 if np.max(np.abs(output - values)) <= 1e-5), None)


def called_alone(module: Any, array: np.ndarray) -> Optional[np.ndarray]:
    """A torch module's forward or a MindSpore cell's construct (not their hooks) on ``array``,
    as numpy; None where it takes no such input or returns no one tensor."""
    torch, mindspore = sys.modules.get("torch"), sys.modules.get("mindspore")
    try:        # a module taking only another shape of input tells nothing
        if torch is not None and isinstance(module, torch.nn.Module):
            with torch.no_grad():
                output = module.forward(torch.from_numpy(array))
            return output.numpy() if isinstance(output, torch.Tensor) else None
        if mindspore is not None and isinstance(module, mindspore.nn.Cell):
            output = module.construct(mindspore.Tensor(array))
            return output.asnumpy() if isinstance(output, mindspore.Tensor) else None
    except Exception:
        return None
    return None


def _batch_statistics(module: Any) -> Optional[bool]:
    """Whether a BatchNorm normalises with the batch's statistics in the step (else with its
    running ones): torch's in training mode or keeping none, never torchvision's
    FrozenBatchNorm2d; MindSpore's as use_batch_statistics says, or as its training flag when
    that is None. None for other modules."""
    if type(module).__name__ == "FrozenBatchNorm2d":
        return False
    if not op_type(module).startswith("batchnorm"):
        return None
    if hasattr(module, "use_batch_statistics"):                     # MindSpore
        chosen = module.use_batch_statistics
        return bool(module.training) if chosen is None else bool(chosen)
    return bool(module.training) or getattr(module, "running_mean", None) is None


# attrs of a "grad" record that is the gradient w.r.t. a module's output, not a parameter's
ACTIVATION = {"activation": True}
# a buffer record's attributes where torch's module registered it with persistent=False
NOT_IN_STATE_DICT = {"persistent": False}


def output_names(name: str, outputs: Any) -> List[Tuple[str, Any]]:
    """(record name, value) per output: ``name`` alone, or ``name.out0``... for tuples, and
    for a dict's tensors in order (a Hugging Face model output: a causal LM's logits, beside
    the hidden states it may hold as a tuple).

    Trailing Nones do not count: torch's attention without weights returns (output, None),
    MindSpore's (output,), and both are the one output ``name``."""
    if isinstance(outputs, dict):
        outputs = [value for value in outputs.values() if hasattr(value, "shape")]
    values = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    while len(values) > 1 and values[-1] is None:
        values.pop()
    if len(values) == 1:
        return [(name, values[0])]
    return [(f"{name}.out{index}", value) for index, value in enumerate(values)]


def input_sketcher(name: str, sketches: Dict[str, Dict[str, Any]],
                   to_numpy: Callable[[Any], Optional[np.ndarray]]) -> Callable:
    """A forward pre-hook (given keyword arguments too) keeping the sketches of ``module``'s
    inputs for its output hook, as they enter: before an in-place ReLU overwrites them.

    The first input's is ``input_sketch`` and its ``magnitude`` (``integer_input_crc32`` for
    ids); each further tensor input's, by position ("1", "2") or keyword, goes under
    ``other_inputs``. An input passed again (attention's query, key and value, one tensor) is
    sketched once. MindSpore calls it without keyword arguments inside a construct compiled
    with @jit (2.8.0)."""
    def hook(_module, args, kwargs=None) -> None:
        array = to_numpy(args[0]) if args else None
        first = input_sketch(array)
        attrs: Dict[str, Any] = {} if first is None else \
            {"input_sketch": first, "input_magnitude": magnitude(array)}
        checksum = integer_input_checksum(array)
        if checksum is not None:
            attrs["integer_input_crc32"] = checksum
        others: Dict[str, Any] = {}
        by_identity: Dict[int, Any] = {}
        for key, value in [*((str(i), v) for i, v in enumerate(args[1:], 1)),
                           *(kwargs or {}).items()]:
            if id(value) not in by_identity:
                by_identity[id(value)] = other_input_sketch(to_numpy(value))
            if by_identity[id(value)] is not None:
                others[key] = by_identity[id(value)]
        if others:
            attrs["other_inputs"] = others
        sketches[name] = attrs
    return hook


def output_recorder(name: str, module: Any, record: Callable[..., None],
                    to_numpy: Callable[[Any], Optional[np.ndarray]],
                    watch: Callable[[str, Any], None],
                    sketches: Dict[str, Dict[str, Any]]) -> Callable:
    """A forward hook storing each tensor output of ``module`` as a forward record.

    ``to_numpy`` returns a view (or None for a non-tensor output) and ``record`` copies it
    before the hook returns: the framework may overwrite the buffer a moment later
    (torchvision's ReLU(inplace=True) overwrites BN outputs).
    ``watch(record_name, tensor)`` sees each output (to hook its gradient); ``sketches``
    holds the input sketches the module's ``input_sketcher`` took, as record attributes.
    """
    op, attrs = op_type(module), module_attrs(module)

    def hook(_module, _inputs, output) -> None:
        # as MindSpore's @jit compiler can trace it (2.8.0 rejected {**attrs, **pop(name, {})})
        sketched = sketches.pop(name, None)
        call_attrs = attrs if sketched is None else {**attrs, **sketched}
        for record_name, tensor in output_names(name, output):
            array = to_numpy(tensor)
            if array is not None:
                record(record_name, "forward", array, op=op, attrs=call_attrs)
                watch(record_name, tensor)
    return hook


def activation_inside(module: Any) -> Optional[Any]:
    """The activation cell MindSpore's nn.Dense(activation="relu") applies inside its
    construct, where torch runs an activation module after its Linear; None for other modules
    and for an activation given as a primitive, which no hook sees."""
    inner = getattr(module, "activation", None)
    if getattr(module, "activation_flag", False) and hasattr(inner, "register_forward_pre_hook"):
        return inner
    return None


def pre_activation_recorder(name: str, module: Any, record: Callable[..., None],
                            to_numpy: Callable[[Any], Optional[np.ndarray]],
                            watch: Callable[..., None], sketches: Dict[str, Dict[str, Any]],
                            input_shapes: Dict[str, Tuple[int, ...]]) -> Callable:
    """A forward pre-hook on the activation inside ``module`` recording its input, the layer's
    output before the activation, as ``module``'s forward record (and gradient), in the shape
    the layer returns (nn.Dense flattens a 3-D input to 2-D around its matmul and activation).
    The layer then pairs with torch's Linear, and its activation, recorded as a module of its
    own, with the activation module torch runs next: a correct port had failed as "extra
    operation in the port". The layer's output, the activation's, is that module's record."""
    op, attrs = op_type(module), module_attrs(module)

    def hook(_cell, args, kwargs=None) -> None:
        sketched = sketches.pop(name, None)
        call_attrs = attrs if sketched is None else {**attrs, **sketched}
        shape = input_shapes.pop(name)[:-1] + tuple(args[0].shape[-1:])
        record(name, "forward", to_numpy(args[0]).reshape(shape), op=op, attrs=call_attrs)
        watch(name, args[0], shape)
    return hook


def _input_shape_keeper(name: str, input_shapes: Dict[str, Tuple[int, ...]]) -> Callable:
    def hook(_module, args, kwargs=None) -> None:
        input_shapes[name] = tuple(args[0].shape)
    return hook


class ForwardPassOnly:
    """A ``record`` passing on the forward records of the forward pass alone, once ``done``.

    Activation checkpointing (torch.utils.checkpoint, MindSpore's Cell.recompute) runs a block
    again within the backward, to rebuild the tensors it did not keep: its modules' outputs are
    not recorded a second time (as "#1" calls the other side did not make), but the hooks stay
    on through the backward, so the gradients of the outputs it rebuilt are recorded: in a
    reentrant checkpoint and in MindSpore's recomputation they are the ones the backward uses.
    """

    def __init__(self, record: Callable[..., None]) -> None:
        self._record = record
        self.done = False

    def __call__(self, name: str, kind: str, array: Any, **kwargs: Any) -> None:
        if kind != "forward" or not self.done:
            self._record(name, kind, array, **kwargs)


def recording_hooks(modules: Iterable[Tuple[str, Any]], record: Callable[..., None],
                    to_numpy: Callable[[Any], Optional[np.ndarray]],
                    watch: Callable[..., None]) -> List:
    """Handles of the hooks recording every named module's outputs (and input sketches).

    ``watch(record_name, tensor, shape=None)`` hooks the tensor's gradient, recorded in
    ``shape`` when given."""
    sketches: Dict[str, Dict[str, Any]] = {}
    input_shapes: Dict[str, Tuple[int, ...]] = {}
    handles = []
    for name, module in modules:
        if name:
            handles.append(module.register_forward_pre_hook(
                input_sketcher(name, sketches, to_numpy), with_kwargs=True))
            inner = activation_inside(module)
            if inner is None:
                handles.append(module.register_forward_hook(
                    output_recorder(name, module, record, to_numpy, watch, sketches)))
                continue
            handles.append(module.register_forward_pre_hook(
                _input_shape_keeper(name, input_shapes), with_kwargs=True))
            handles.append(inner.register_forward_pre_hook(
                pre_activation_recorder(name, module, record, to_numpy, watch, sketches,
                                        input_shapes), with_kwargs=True))
    return handles
