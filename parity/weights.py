"""Weight transfer: a torch state dict -> MindSpore parameters, validated before anything moves.

The transfer never silently drops or misplaces a tensor: every torch tensor is used exactly
once, every MindSpore parameter receives a value, and shapes and dtypes agree (shapes up to
size-1 dimensions: MindSpore's nn.Conv1d weight is (out, in, 1, k)). Any violation is one
ParityInputError listing each offending name.

State dicts are read without executing code: ``.safetensors`` directly, ``.pth``/``.pt`` with
``torch.load(..., weights_only=True)``, which refuses pickled objects that are not tensors.
Floating-point types numpy lacks (bfloat16, float8) are widened to float32, which holds each of
their values exactly: the models step in float32 either way.
"""

from __future__ import annotations

import json
import re
import zipfile
from itertools import accumulate, combinations, zip_longest
from pathlib import Path
from dataclasses import dataclass, field
from typing import (Any, Collection, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence,
                    Set, Tuple)

import numpy as np

from parity.align import (align_parameters, common_module, largest_stride,
                          module_map_from_parameters, same_order, split_param, torch_role)
from parity.errors import ParityInputError, first_few
from parity.records import Alignment, Part, split_part, value_of

# torch bookkeeping, a step counter, not a weight: left out of the alignment (nn.BatchNorm2d has
# no counterpart), given to a port holding one (mindspore.mint.nn's BatchNorm2d, torch's
# convention throughout) and not compared.
IGNORED_TORCH_SUFFIXES = (".num_batches_tracked",)

ORDER_KEY = "parity.order"      # safetensors metadata: the state dict's key order, as JSON
TIED_KEY = "parity.tied"        # and its tied keys, as JSON: {key: the earlier key it is}
# safetensors dtypes numpy lacks (by prefix): parity widens BF16 itself, and refuses the others
NOT_NUMPY_SAFETENSORS_DTYPES = ("BF16", "F8_", "F6_", "F4")
TORCH_SUFFIXES = (".pth", ".pt", ".bin")     # torch.save's files, read with weights_only=True
# How a torch.save file from before torch 1.6's zip format (or _use_new_zipfile_serialization=
# False) starts: pickle protocol 2, then torch's magic number 0x1950a86a20f9469cfc6c
LEGACY_TORCH_MAGIC = b"\x80\x02\x8a\x0a" + (0x1950a86a20f9469cfc6c).to_bytes(10, "little")
MAX_PROBLEMS_LISTED = 6         # named in a one-line error about weights; the rest are counted
FIX_THE_TRANSFER = "Fix the weights or the port, or map names with --map FILE"


class TransferRefused(ParityInputError):
    """plan_transfer's refusal, with how many problems it found, and the --map lines it
    suggests for tensors one side seems to hold stacked (_suggested_rows)."""

    def __init__(self, problems: int, message: str,
                 suggested_map: Optional[Mapping[str, str]] = None) -> None:
        super().__init__(message)
        self.problems = problems
        self.suggested_map = dict(suggested_map or {})


class StateDict(Dict[str, np.ndarray]):
    """A torch state dict as numpy arrays, in its order. ``tied`` maps each key whose tensor is
    an earlier key's to that key: torch ties parameters (a language model's output layer to its
    embedding) and lists the one tensor under each name; a port ties them too, so it has one
    parameter where the state dict has two keys."""

    def __init__(self, arrays: Mapping[str, np.ndarray],
                 tied: Optional[Mapping[str, str]] = None) -> None:
        super().__init__(arrays)
        self.tied = {alias: key for alias, key in (tied or {}).items()
                     if isinstance(alias, str) and isinstance(key, str) and alias in self
                     and key in self and alias != key}


def tied_keys(tensors: Mapping[str, Any]) -> Dict[str, str]:
    """key -> the earlier key holding the same tensor, of torch tensors (a model's state dict,
    one torch.load returned, which keeps what the saved ones shared)."""
    first: Dict[Tuple, str] = {}
    tied = {}
    for name, tensor in tensors.items():
        if not tensor.numel():
            continue
        where = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(),
                 tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)
        if where in first:
            tied[name] = first[where]
        else:
            first[where] = name
    return tied


def is_ignored(name: str) -> bool:
    return name.endswith(IGNORED_TORCH_SUFFIXES)


def load_state_dict(path: Path) -> StateDict:
    """A torch state dict as numpy arrays, from .safetensors or a torch.save file: .pth, .pt,
    .bin (Hugging Face's pytorch_model.bin) or a PyTorch Lightning .ckpt."""
    path = Path(path)
    if not path.is_file():
        raise ParityInputError(f"weights file {path} " + ("is not a file: pass the file your "
                               "training saved" if path.exists() else "does not exist"))
    if path.stat().st_size == 0:
        raise ParityInputError(f"weights file {path} is empty; pass the file your training "
                               "saved (torch.save(model.state_dict(), ...) or .safetensors)")
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        state_dict = _load_safetensors(path)
    elif suffix in TORCH_SUFFIXES or (suffix == ".ckpt" and _is_torch_save(path)):
        state_dict = _load_torch_file(path)         # a .ckpt torch saved: PyTorch Lightning's
    elif suffix == ".ckpt":
        raise ParityInputError(f"{path} is not a torch file (a MindSpore checkpoint?): the "
                               "weights parity starts from are torch's, the state dict the "
                               "port's weights come from (.pth, .pt, .bin or .safetensors)")
    else:
        raise ParityInputError(f"{path}: unknown weights format {suffix!r}; "
                               "use .safetensors, .pth, .pt or .bin")
    if not state_dict:
        raise ParityInputError(f"{path} holds no tensors; pass the file your training saved")
    return state_dict


def _is_torch_save(path: Path) -> bool:
    """Whether torch.save wrote ``path``: a zip (torch 1.6 on), or its legacy pickle."""
    with open(path, "rb") as handle:
        legacy = handle.read(len(LEGACY_TORCH_MAGIC)) == LEGACY_TORCH_MAGIC
    return legacy or zipfile.is_zipfile(path)


def outer_prefix(state_dict: Mapping[str, Any]) -> str:
    """The first component every key shares, with its dot: "module." (saved from a model wrapped
    in DataParallel), "model." (a PyTorch Lightning checkpoint: the attribute holding the model);
    '' if they share none. Whether to drop it is for the model's names to decide: a model of its
    own may hold its network as ``self.module``."""
    firsts = {key.split(".", 1)[0] for key in state_dict}
    if len(firsts) != 1 or not all("." in key for key in state_dict):
        return ""
    return f"{firsts.pop()}."


def without_prefix(state_dict: Mapping[str, np.ndarray], prefix: str) -> StateDict:
    return StateDict({key.removeprefix(prefix): value for key, value in state_dict.items()},
                     {alias.removeprefix(prefix): key.removeprefix(prefix)
                      for alias, key in getattr(state_dict, "tied", {}).items()})


def save_state_dict_bytes(state_dict: Mapping[str, np.ndarray]) -> bytes:
    """safetensors bytes that remember the state dict's order (safetensors sorts keys) and a
    StateDict's tied keys, if it has any: without, the bytes are those of earlier versions,
    and so is the starting point's fingerprint that baselines saved with them carry."""
    from safetensors.numpy import save
    metadata = {ORDER_KEY: json.dumps(list(state_dict))}
    tied = getattr(state_dict, "tied", {})
    if tied:
        metadata[TIED_KEY] = json.dumps(tied)
    return save(dict(state_dict), metadata=metadata)


def _natural_key(name: str) -> List:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _load_safetensors(path: Path) -> StateDict:
    """Tensors in the state dict's own order: structural alignment matches in order.

    Files written by parity carry the order; other files are sorted naturally
    (``layer2`` before ``layer10``), which is definition order for most numbered models.
    """
    from safetensors import safe_open

    from parity.rundir import safetensors_entries
    try:
        with safe_open(str(path), framework="numpy") as handle:
            names = list(handle.keys())
            metadata = handle.metadata() or {}
            order = json.loads(metadata.get(ORDER_KEY, "null"))
            if not isinstance(order, list) or sorted(order) != sorted(names):
                order = sorted(names, key=_natural_key)
            tied = json.loads(metadata.get(TIED_KEY, "{}"))
            not_numpy = {name: entry for name, entry
                         in safetensors_entries(path, path.stat().st_size).items()
                         if entry[2].startswith(NOT_NUMPY_SAFETENSORS_DTYPES)}
            return StateDict({name: _bfloat16_widened(path, *not_numpy[name])
                              if name in not_numpy else handle.get_tensor(name)
                              for name in order},
                             tied if isinstance(tied, dict) else None)
    except ParityInputError:
        raise
    except Exception as error:  # safetensors raises its own error types, json ValueError
        raise ParityInputError(f"{path} is not a readable safetensors file ({error})") from None


def _bfloat16_widened(path: Path, start: int, end: int, dtype: str,
                      shape: Tuple[int, ...]) -> np.ndarray:
    """A BF16 tensor as float32: bfloat16 is float32's upper 16 bits."""
    if dtype != "BF16":
        raise ParityInputError(f"{path} holds {dtype} tensors, which parity cannot read; save "
                               "the weights in float32, float16 or bfloat16")
    upper = np.fromfile(path, dtype="<u2", count=(end - start) // 2, offset=start)
    return (upper.astype(np.uint32) << 16).view(np.float32).reshape(shape)


def _load_torch_file(path: Path) -> StateDict:
    import pickle

    import torch
    try:
        loaded = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        # torch names the first object it refused ("Unsupported global: GLOBAL pkg.Class ...")
        refused = re.search(r"GLOBAL ([\w.]+)", str(error))
        what = f" (the first: {refused.group(1)})" if refused else ""
        raise ParityInputError(
            f"{path} holds pickled objects that are not tensors{what}; refused without "
            "executing them. Save model.state_dict() (torch.save(model) pickles the whole "
            "model) or use .safetensors") from None
    except Exception as error:      # torch's own errors name the problem, some only by type
        said = str(error).strip().split(". ")[0][:160]
        raise ParityInputError(f"{path} is not a readable torch file ({type(error).__name__}"
                               f"{': ' if said else ''}{said}); pass a state dict saved by "
                               "torch.save, or a .safetensors file") from None
    if not isinstance(loaded, dict):
        raise ParityInputError(f"{path} holds a {type(loaded).__name__}, not a state dict")
    state_dict = _the_state_dict(path, loaded)
    return StateDict({k: _as_numpy(path, k, v) for k, v in state_dict.items()},
                     tied_keys(state_dict))


def widened_from(tensor) -> Dict[str, str]:
    """{"widened_from": its dtype} for a float tensor of a dtype numpy lacks (bfloat16, float8),
    which is read widened to float32, exactly; else {}."""
    import torch
    if tensor.is_floating_point() and tensor.dtype not in (torch.float16, torch.float32,
                                                           torch.float64):
        return {"widened_from": str(tensor.dtype).removeprefix("torch.")}
    return {}


def tensor_values(tensor) -> np.ndarray:
    """A torch tensor's values in numpy, a dtype numpy lacks (bfloat16, float8) widened to
    float32, exactly (widened_from): Hugging Face's RecurrentGemma keeps its embedding scale
    √width as a bfloat16 buffer, and the capture stopped at it ("unsupported ScalarType
    BFloat16", told as the model failing on the batch)."""
    tensor = tensor.detach().cpu()
    return (tensor.float() if widened_from(tensor) else tensor).numpy()


def _as_numpy(path: Path, name: str, tensor) -> np.ndarray:
    try:
        return tensor_values(tensor).copy()
    except (TypeError, RuntimeError) as error:     # quantized tensors, say
        raise ParityInputError(f"{path}: {name} is a {tensor.dtype} tensor, which parity cannot "
                               f"read ({error}); save the weights as float tensors") from None


def _the_state_dict(path: Path, loaded: Dict) -> Dict:
    """The model's state dict in what torch.load returned: the dict itself, or a training
    checkpoint's one dict of tensors beside its other entries ({"state_dict": ..., "epoch": 3},
    {"model": ...})."""
    import torch

    def all_tensors(entry: object) -> bool:
        return isinstance(entry, dict) and bool(entry) and \
            all(isinstance(v, torch.Tensor) for v in entry.values())
    if loaded and not all_tensors(loaded):
        nested = [key for key, entry in loaded.items() if all_tensors(entry)]
        if len(nested) > 1:
            raise ParityInputError(f"{path} holds several state dicts ({', '.join(nested)}); "
                                   "save the one to check alone: torch.save(checkpoint[NAME])")
        if not nested:
            not_tensors = [k for k, v in loaded.items() if not isinstance(v, torch.Tensor)]
            raise ParityInputError(f"{path}: entries that are not tensors: "
                                   f"{first_few(not_tensors)}; save model.state_dict()")
        loaded = loaded[nested[0]]
    return loaded


# An integer or boolean torch tensor no MindSpore parameter takes is a constant the port holds
# as a plain tensor (Swin's relative_position_index, BERT's position_ids, GPT-2's causal mask):
# it is left out of the transfer, listed as an unmatched torch buffer, and a port computing it
# otherwise shows in the forward. No parameter is integer, so none is left out so.
CONSTANT_TABLES = "biu"


def plan_transfer(state_dict: Mapping[str, np.ndarray],
                  mindspore_params: Sequence[Tuple[str, Tuple[int, ...], str]],
                  overrides: Optional[Mapping[str, str]] = None,
                  port_ties: Optional[Mapping[str, str]] = None,
                  left_out: Optional[Set[str]] = None,
                  frozen: Optional[Set[str]] = None,
                  strides: Optional[Tuple[Mapping[str, int], Mapping[str, int]]] = None
                  ) -> Dict[str, str]:
    """MindSpore parameter name -> torch key, validated; raises listing every problem.

    ``mindspore_params`` is (name, shape, dtype) in the network's parameter order. A
    StateDict's tied keys are left out: the port's one parameter takes the first name's tensor.
    ``port_ties`` (mindspore_ties): a torch tensor left over by a port's tie is the copy a
    weights file holds of a tie it did not keep, if the bits are the same; else it is named as
    left over by a tie torch lacks. ``left_out`` (frozen_norm_defaults): port parameters that
    need no torch tensor where torch holds none of their group (_norm_group_torch_lacks).
    A torch tensor the port holds split into q, k and v layers goes to them in parts, each
    named as torch indexes it (``qkv.weight[0:32]``, records.split_part); torch's q, k and v
    layers the port fuses go to their parts of its parameter, each so named on the port's side
    (``qkv.weight[0:32]`` -> ``q.weight``). ``frozen``: the port's
    parameters that take no gradient; those no torch tensor feeds, where no torch tensor is left
    over either, are constants the port computes itself (mindcv's Swin holds its relative
    position index and window mask so) and keep its values (port_constants). ``strides``:
    torch's and the port's modules' largest strides, where known (align_parameters).
    """
    tied = getattr(state_dict, "tied", {})
    torch_params = [(k, tuple(v.shape)) for k, v in state_dict.items()
                    if not is_ignored(k) and k not in tied]
    aligned = [(n, s) for n, s, _ in mindspore_params if not is_ignored(n)]
    ms_shapes = {n: (tuple(s), d) for n, s, d in mindspore_params}
    alignment = align_parameters(torch_params, aligned, overrides, strides)
    fused = _fused_in_torch(state_dict, alignment, ms_shapes, overrides or {})
    joined = _fused_in_port(state_dict, alignment, ms_shapes, overrides or {})
    constants = [n for n in alignment.unmatched_mindspore if _a_port_constant(n, frozen)]
    torch_constants = {n for n in alignment.unmatched_torch
                       if state_dict[n].dtype.kind in CONSTANT_TABLES}
    held = _constants_torch_holds(state_dict, alignment, constants, ms_shapes)
    if fused or joined or constants or (torch_constants and alignment.unmatched_mindspore):
        # aligned again without them: they stood in the way (the parameter alignment gave
        # torchvision's Swin attn.proj the port's attn.q; its relative position table was
        # not paired with the port's, its module holding the index as an integer tensor,
        # the port's as a frozen parameter)
        split = {part for parts in fused.values() for part, _ in parts} | set(joined)
        apart = set(fused) | {part for parts in joined.values() for part in parts} | \
            set(held.values())
        alignment = align_parameters(
            [p for p in torch_params if p[0] not in apart and p[0] not in torch_constants],
            [p for p in aligned if p[0] not in split and p[0] not in constants], overrides,
            strides)
    missing: Dict[str, str] = {}    # the port's parameters no torch tensor goes to: why
    extra: Dict[str, str] = {}      # torch tensors going to no parameter of the port: why
    problems: List[str] = []    # of the pairs made
    mapping = {**alignment.mindspore_to_torch, **held}
    for torch_name, parts in fused.items():
        for part, rows in parts:
            mapping[part] = rows.of(torch_name)
    for ms_name, parts in joined.items():
        for part, rows in _stacked_rows(parts, [state_dict[p].shape[0] for p in parts]):
            mapping[rows.of(ms_name)] = part
    modules = module_map_from_parameters(mapping)
    for name in filter(is_ignored, ms_shapes):
        module, role = split_param(name)
        counter = f"{modules[module]}.{role}" if modules.get(module) else None
        if counter in state_dict:   # else it counts from zero, as torch's would
            mapping[name] = counter
    torch_statistics_left = any(split_param(name)[1] == "running_mean"
                                for name in alignment.unmatched_torch)
    rms_norms = False
    for name in alignment.unmatched_mindspore:
        group = _norm_group_torch_lacks(name, alignment.unmatched_mindspore, state_dict)
        if group and set(group) <= (left_out or set()):
            continue        # frozen at the identity torch applies without them
        alike = [f"{alias} to {key}" for alias, key in tied.items()
                 if tuple(state_dict[alias].shape) == ms_shapes[name][0]]
        advice = f": torch ties {', '.join(alike)} (one parameter); tie the port's as well" \
            if alike else ""
        module, role = split_param(name)
        freeze = f"freeze the port's {' and '.join(group)} (requires_grad=False) at ones and zeros"
        if group and role == "gamma" and f"{module}.moving_mean" in alignment.unmatched_mindspore \
                and not torch_statistics_left:
            advice = f": nothing of torch's pairs with the port's {module}, its running " \
                "statistics included: a norm torch's model lacks (take it out of the port), " \
                f"or one with affine=False and track_running_stats=False ({freeze})"
        # its running statistics, if it keeps any, found torch's: a norm whose statistics are
        # left too, where torch's are, may be torch's under another name or width (mindcv's
        # SK-ResNeXt-50 for timm's, of other widths, was told each norm had no weight in torch)
        elif group and role == "gamma" and _torch_holds_beside(name, state_dict) and \
                f"{module}.moving_mean" not in alignment.unmatched_mindspore:
            advice = f": torch's {module} has no weight or bias (a norm built with " \
                f"affine=False or elementwise_affine=False); {freeze}"
        elif role == "beta" and _weight_alone(modules.get(module), state_dict):
            advice = f": torch's {modules[module]} holds a weight and no bias"
            rms_norms = True
        missing[name] = f"MindSpore parameter {name} {ms_shapes[name][0]} receives no torch " \
            f"tensor (missing key){advice}"
    transferred = set(alignment.mindspore_to_torch.values())
    for name in alignment.unmatched_torch:
        if _a_tie_the_file_lost(state_dict, name, alignment.mindspore_to_torch, port_ties):
            continue
        if state_dict[name].dtype.kind in CONSTANT_TABLES:
            continue        # a constant the port computes itself (CONSTANT_TABLES)
        module, role = split_param(name)
        shape = tuple(state_dict[name].shape)
        why = ""
        if role == "bias" and f"{module}.weight" in transferred:
            default = "nn.Conv2d and nn.Conv2dTranspose default to has_bias=False" \
                if state_dict[f"{module}.weight"].ndim > 2 else "built with has_bias=False"
            why = f": the MindSpore layer taking {module}.weight has no bias ({default}: " \
                "pass has_bias=True)"
        alike = [f"{alias} to {key}" for alias, key in (port_ties or {}).items()
                 if ms_shapes[key][0] == shape]
        if alike and not why:
            why = f": the port ties {', '.join(alike)} (one parameter), torch does not; " \
                "untie the port's"
        extra[name] = f"torch tensor {name} {shape} is used by no MindSpore parameter " \
            f"(extra key){why}"
    if extra:       # torch holds a tensor no parameter took: the frozen ones may be its
        missing.update((name, f"MindSpore parameter {name} {ms_shapes[name][0]} (frozen) "
                        "receives no torch tensor (missing key)")
                       for name in constants if name not in held)
    seen: Dict[str, str] = {}
    misfits: List[Tuple[Tuple[int, ...], Tuple[int, ...]]] = []
    for ms_name, torch_name in mapping.items():
        if split_part(torch_name)[0] not in state_dict:
            problems.append(f"{ms_name} is mapped to {torch_name}, which the torch weights lack")
            continue
        if torch_name in seen:
            problems.append(f"torch tensor {torch_name} is used twice ({seen[torch_name]}, "
                            f"{ms_name})")
        seen[torch_name] = ms_name
        value = value_of(state_dict, torch_name)
        t_shape, (m_shape, m_dtype) = tuple(value.shape), _port_shape(ms_shapes, ms_name)
        if not same_order(t_shape, m_shape):    # a conv's weight flattened fits a dense's
            transposed = ", its transpose: one side's layer holds it as (in, out) for x @ W, " \
                "the other's as (out, in) for x @ W.T (torch's Linear, MindSpore's Dense); " \
                "parity run transposes the weights of torch's layers it finds computing x @ W " \
                "(Hugging Face's Conv1D), which convert-weights has no torch model to find; " \
                "otherwise hold the weight in the port as torch's layer holds it" \
                if len(t_shape) == 2 and t_shape[::-1] == m_shape else ""
            problems.append(f"{torch_name}: torch shape {t_shape} but MindSpore {ms_name} "
                            f"expects {m_shape}{transposed}")
            misfits.append((t_shape, m_shape))
        t_dtype = str(value.dtype)
        if t_dtype != m_dtype:
            problems.append(f"{torch_name}: torch dtype {t_dtype} but MindSpore {ms_name} "
                            f"expects {m_dtype}")
    keys_left = _rows_left([rows.of(name) for name, parts in fused.items() for _, rows in parts],
                           state_dict)      # a fused bias's key rows (_key_unbiased)
    problems.extend(_parts_not_tiling(mapping, state_dict, ms_shapes, keys_left))
    if missing or extra or problems:
        hint = class_count_hint(misfits) if len(misfits) == len(problems) and not \
            (missing or extra) else ""
        suggested, rows_hint = _with_rows_suggested(state_dict, alignment, ms_shapes)
        hint = hint or rows_hint or _a_part_one_side_holds(missing, extra, mapping) or \
            _copies_of_one_module(missing, extra, mapping, ms_shapes) or \
            (RMS_NORM_PORTED if rms_norms else "")
        count = len(missing) + len(extra) + len(problems)
        kinds = [f"{len(group)} {what}" for group, what in ((missing, "missing keys"),
                                                             (extra, "extra keys"),
                                                             (problems, "pairs that do not fit"))
                 if group]
        tally = f" ({', '.join(kinds)})" if len(kinds) > 1 else ""
        # each kind in turn: the few listed show them all
        listed = [p for row in zip_longest(problems, missing.values(), extra.values())
                  for p in row if p]
        raise TransferRefused(count, f"weight transfer refused, {count} problem(s){tally}: "
                              f"{_not_the_same_model(alignment, aligned, torch_params)}"
                              f"{first_few(listed, MAX_PROBLEMS_LISTED, '; ')}. "
                              f"{hint or FIX_THE_TRANSFER}", suggested)
    return mapping


def _a_part_one_side_holds(missing: Sequence[str], extra: Sequence[str],
                           mapping: Mapping[str, str]) -> str:
    """Where the parameters left are all on one side, in two or more modules inside one of which
    nothing pairs: the hint naming it as a part one model is built with and the other without
    (mindcv's InceptionV3 holds its auxiliary classifier ``aux``, timm's is built without one:
    the refusal listed its 8 parameters one by one, its norms each as "a norm torch's model
    lacks"); else "". One module's parameters alone are told in their own advice."""
    names, paired = (missing, mapping) if missing else (extra, mapping.values())
    module = common_module([split_param(name)[0] for name in names])
    if (missing and extra) or len({split_param(name)[0] for name in names}) < 2 or \
            not module or any(split_part(name)[0].startswith(module + ".") for name in paired):
        return ""
    keys, holder, other = ("missing keys", "the port's", "torch's model") if missing else \
        ("extra keys", "torch's", "the port")
    return f"All {len(names)} {keys} lie in {holder} {module}, of which nothing pairs: a part " \
        f"{other} is built without (an auxiliary classifier, another head?); build both " \
        "with the same parts"


def _copies_of_one_module(missing: Sequence[str], extra: Sequence[str],
                          mapping: Mapping[str, str],
                          ms_shapes: Mapping[str, Tuple[Tuple[int, ...], str]]) -> str:
    """Where every missing key is the parameter of a numbered copy of a port module that took
    torch's tensors (``layers.1.fc.weight`` beside ``layers.0.fc.weight``, of one shape): the
    hint naming them as copies of a module torch holds once; else "". Hugging Face's ALBERT
    calls one layer group for each of its layers, and a port holding a group for each was told
    only the 32 missing keys and "the same architecture?"."""
    if extra or not missing:
        return ""
    copies: Dict[str, str] = {}         # the port's copy -> the module that took torch's tensors
    for name in missing:
        found = _numbered_copy_of(name, mapping, ms_shapes)
        if found is None:
            return ""
        copies[found[0]] = found[1]
    originals = sorted(set(copies.values()))
    return f"The {len(missing)} missing keys lie in the port's {', '.join(sorted(copies))}: " \
        f"copies of its {', '.join(originals)} (the same parameters, of the same shapes), " \
        "which alone took torch's tensors. torch holds that module once: it calls it for each " \
        "layer (ALBERT shares its layers so), or it is built with fewer layers; call one cell " \
        "for each layer as torch does, or build both with as many"


def _numbered_copy_of(name: str, mapping: Mapping[str, str],
                      ms_shapes: Mapping[str, Tuple[Tuple[int, ...], str]]
                      ) -> Optional[Tuple[str, str]]:
    """(the numbered module ``name`` is in, the module of another number holding a parameter
    of its name and shape that took a torch tensor), or None."""
    parts = name.split(".")
    for index, part in enumerate(parts[:-1]):
        if not part.isdigit():
            continue
        for other in sorted({n.split(".")[index] for n in mapping
                             if n.count(".") == name.count(".")}):
            twin = ".".join(parts[:index] + [other] + parts[index + 1:])
            if other != part and twin in mapping and ms_shapes[twin][0] == ms_shapes[name][0]:
                return ".".join(parts[:index + 1]), ".".join(parts[:index] + [other])
    return None


def _parts_not_tiling(mapping: Mapping[str, str], state_dict: Mapping[str, np.ndarray],
                      ms_shapes: Mapping[str, Tuple[Tuple[int, ...], str]],
                      left: Sequence[str]) -> List[str]:
    """The tensors of either side mapped in parts (a --map naming rows) whose parts are not
    rows that cover its first axis once each, or that are mapped whole besides; torch's rows
    ``left`` to no parameter (named as parts) count as covered."""
    problems = []
    for side, names, shapes in (
            ("torch tensor", [*mapping.values(), *left],
             {n: v.shape for n, v in state_dict.items()}),
            ("MindSpore parameter", mapping, {n: shape for n, (shape, _) in ms_shapes.items()})):
        parts: Dict[str, List[Part]] = {}
        wholes = set()
        for name in names:
            whole, part = split_part(name)
            if part is None:
                wholes.add(whole)
            else:
                parts.setdefault(whole, []).append(part)
        for whole, pieces in parts.items():
            if whole not in shapes or not shapes[whole]:
                continue        # named as missing already
            rows = sorted((p.start, p.stop) for p in pieces)
            spans = ", ".join(f"[{start}:{stop}]" for start, stop in rows)
            starts = [0] + [stop for _, stop in rows]
            if whole in wholes:
                problems.append(f"{side} {whole} is mapped whole and in parts ({spans})")
            elif any(p.axis != 0 for p in pieces):
                problems.append(f"{side} {whole} is mapped in parts of an axis other than its "
                                f"first ({spans}): name a parameter's rows, {whole}[start:stop]")
            elif [start for start, _ in rows] != starts[:-1] or starts[-1] != shapes[whole][0]:
                problems.append(f"{side} {whole} is mapped in parts {spans}, which do not cover "
                                f"its {shapes[whole][0]} rows once each")
    return problems


def _with_rows_suggested(state_dict: Mapping[str, np.ndarray], alignment: Alignment,
                         ms_shapes: Mapping[str, Tuple[Tuple[int, ...], str]]
                         ) -> Tuple[Dict[str, str], str]:
    """_suggested_rows, and the hint naming the first tensor they stack, its map lines, and how
    many more there are; ({}, "") where none stacks."""
    suggested = _suggested_rows(state_dict, alignment, ms_shapes)
    stacks: Dict[Tuple[str, bool], List[Tuple[str, str]]] = {}  # (whole, torch's?) -> lines
    for ms_name, torch_name in suggested.items():
        torch_whole, torch_part = split_part(torch_name)
        whole = torch_whole if torch_part else split_part(ms_name)[0]
        stacks.setdefault((whole, torch_part is not None), []).append((ms_name, torch_name))
    if not stacks:
        return {}, ""
    (whole, torch_holds), lines = next(iter(stacks.items()))
    if torch_holds:
        holder, shape = "torch's", tuple(state_dict[whole].shape)
        held = [(ms_name, _port_shape(ms_shapes, ms_name)[0]) for ms_name, _ in lines]
    else:
        holder, shape = "the port's", ms_shapes[whole][0]
        held = [(torch_name, tuple(state_dict[torch_name].shape)) for _, torch_name in lines]
    stacked = " and ".join(f"{name} ({rows[0]} rows)" for name, rows in held)
    more = f" (and {len(stacks) - 1} more tensor(s) alike)" if len(stacks) > 1 else ""
    mapped = ", ".join(f'"{ms_name}" = "{torch_name}"' for ms_name, torch_name in lines)
    return suggested, (f"{holder} {whole} {shape} may hold "
                       f"{'the port' if torch_holds else 'torch'}'s {stacked} stacked{more}: "
                       f"if it computes them so, in this order, map their rows with "
                       f"--map FILE: {mapped}")


def _suggested_rows(state_dict: Mapping[str, np.ndarray], alignment: Alignment,
                   ms_shapes: Mapping[str, Tuple[Tuple[int, ...], str]]) -> Dict[str, str]:
    """--map lines (MindSpore name -> torch name) for the tensors left on one side that stack
    tensors left on the other along its first axis, named in no SPLIT_PROJECTIONS (timm's DPN
    holds one conv ``c1x1_w_s1``, mindcv's port its rows as ``c1x1_w_r`` and ``c1x1_w_d``): the
    parts in the order the other side declares them, for the user to check."""
    modules = list(module_map_from_parameters(alignment.mindspore_to_torch).items())
    torch_left = [(n, *split_param(n), tuple(state_dict[n].shape))
                  for n in alignment.unmatched_torch
                  if state_dict[n].dtype.kind not in CONSTANT_TABLES]
    ms_left = [(n, *split_param(torch_role(n)), ms_shapes[n][0])
               for n in alignment.unmatched_mindspore]
    claimed: Set[str] = set()
    suggested: Dict[str, str] = {}
    for name, parts in _stackings(torch_left, ms_left, [(t, m) for m, t in modules], claimed):
        for part, rows in _stacked_rows([n for n, _ in parts], [s[0] for _, s in parts]):
            suggested[part] = rows.of(name)
    for name, parts in _stackings(ms_left, torch_left, modules, claimed):
        for part, rows in _stacked_rows([n for n, _ in parts], [s[0] for _, s in parts]):
            suggested[rows.of(name)] = part
    return suggested


def _stackings(wholes: Sequence[Tuple[str, str, str, Tuple[int, ...]]],
               candidates: Sequence[Tuple[str, str, str, Tuple[int, ...]]],
               module_pairs: Sequence[Tuple[str, str]], claimed: Set[str]
               ) -> Iterator[Tuple[str, List[Tuple[str, Tuple[int, ...]]]]]:
    """Each of ``wholes`` (name, module, role, shape) that stacks ``candidates`` of the other
    side, with them: those of its role under the modules its neighbours pair with
    (``module_pairs``: its side's module, the other's), none ``claimed``; none where more than
    one set of them adds up (_one_stacking)."""
    for name, module, role, shape in wholes:
        if name in claimed:
            continue
        parents = _parents_beside(module, module_pairs)
        parts = _one_stacking(shape, [(n, s) for n, m, r, s in candidates
                                      if r == role and n not in claimed
                                      and m.rpartition(".")[0] in parents])
        if parts:
            claimed.update([name] + [n for n, _ in parts])
            yield name, parts


STACKING_CANDIDATES = 12        # of one tensor: the subsets tried are 2 ** this


def _one_stacking(shape: Tuple[int, ...], candidates: Sequence[Tuple[str, Tuple[int, ...]]]
                  ) -> List[Tuple[str, Tuple[int, ...]]]:
    """The one subset of ``candidates`` (two or more, in their order) whose first dimensions
    add up to ``shape``'s and whose others are its own; [] if none or several do."""
    fitting = [(n, s) for n, s in candidates
               if len(s) == len(shape) and s and s[1:] == shape[1:]][:STACKING_CANDIDATES]
    found = [subset for size in range(2, len(fitting) + 1)
             for subset in combinations(fitting, size)
             if sum(s[0] for _, s in subset) == shape[0]]
    return list(found[0]) if len(found) == 1 else []


def _stacked_rows(parts: Sequence[str], counts: Sequence[int]) -> List[Tuple[str, Part]]:
    """Each of ``parts`` stacked in order, ``counts`` rows each, with its rows of the whole."""
    stops = list(accumulate(counts))
    return [(part, Part(stop - count, stop)) for part, count, stop in zip(parts, counts, stops)]


def _port_shape(ms_shapes: Mapping[str, Tuple[Tuple[int, ...], str]],
                name: str) -> Tuple[Tuple[int, ...], str]:
    """The shape and dtype of the port's parameter ``name``, or of the part of one it names
    (``qkv.weight[0:32]``, records.split_part)."""
    whole, part = split_part(name)
    shape, dtype = ms_shapes[whole]
    return (shape, dtype) if part is None else ((part.stop - part.start, *shape[1:]), dtype)


def class_count_hint(misfits: Sequence[Tuple[Tuple[int, ...], Tuple[int, ...]]]) -> str:
    """For (weights' shape, model's shape) pairs that do not fit: when each differs from the
    model's in its first dimension only, K in the weights throughout, the weights are most likely
    of a K-class model (a classifier trained for another dataset), and the model was built for
    another count. Empty otherwise."""
    if not misfits or any(not theirs or not ours or theirs[1:] != ours[1:]
                          for theirs, ours in misfits):
        return ""
    counts = {theirs[0] for theirs, _ in misfits}
    if len(counts) != 1 or len({ours[0] for _, ours in misfits}) != 1:
        return ""
    count = counts.pop()
    return (f"Weights of a {count}-class model? Pass --num-classes {count} (a built-in model) "
            f"or build yours with {count} classes")


def _constants_torch_holds(state_dict: Mapping[str, np.ndarray], alignment: Alignment,
                           constants: Sequence[str],
                           ms_shapes: Mapping[str, Tuple[Tuple[int, ...], str]]
                           ) -> Dict[str, str]:
    """The port's constants (frozen parameters no torch tensor took) -> torch's float tensor
    of their name and shape left in the torch module holding what the port's cells around them
    pair with, the innermost such where one is alone there. torchvision's SwinV2 holds its
    relative coordinates table as a buffer of its attention, mindcv's as a frozen parameter of
    a cell inside its attention: left on both sides, torch's kept the attention's logit_scale
    from pairing (refused, 65 problems)."""
    modules = module_map_from_parameters(alignment.mindspore_to_torch)
    left = [n for n in alignment.unmatched_torch if state_dict[n].dtype.kind == "f"]
    held: Dict[str, str] = {}
    for name in constants:
        module, leaf = split_param(name)
        alike = [t for t in left if split_param(t)[1] == leaf
                 and tuple(state_dict[t].shape) == ms_shapes[name][0]]
        while alike and module:
            module = split_param(module)[0]
            inside = [theirs for ours, theirs in modules.items()
                      if not module or ours.startswith(module + ".")]
            if not inside:
                continue
            holder = common_module(inside)
            found = [t for t in alike if t not in held.values()
                     and (not holder or t.startswith(holder + "."))]
            if len(found) == 1:
                held[name] = found[0]
                break
    return held


# The layers a fused attention projection holds stacked, as ports split them, in torch's order
# (timm's ConViT holds q and k as ``qk``).
SPLIT_PROJECTIONS = (("q", "k", "v"), ("query", "key", "value"), ("k", "v"), ("key", "value"),
                     ("q", "k"), ("query", "key"))


def _fused_in_torch(state_dict: Mapping[str, np.ndarray], alignment: Alignment,
                    ms_shapes: Mapping[str, Tuple[Tuple[int, ...], str]],
                    overrides: Mapping[str, str]) -> Dict[str, List[Tuple[str, Part]]]:
    """Each torch tensor no port parameter took that holds the port's parameters stacked
    along its first axis -> those parameters, each with its rows, in order (_stacked). mindcv's
    Swin splits torchvision's fused qkv so. A fused layer's bias goes so to the port's biases
    where only its key layer has none (_key_unbiased)."""
    modules = module_map_from_parameters(alignment.mindspore_to_torch)
    shapes = {name: shape for name, (shape, _) in ms_shapes.items()}
    fused: Dict[str, List[Tuple[str, Part]]] = {}
    # a parameter that took torch's tensor of its own name is that tensor's, no part
    taken: Set[str] = set(overrides) | {ms for ms, t in alignment.mindspore_to_torch.items()
                                        if t in (ms, torch_role(ms))}
    for name in alignment.unmatched_torch:
        value = state_dict[name]
        if value.dtype.kind in CONSTANT_TABLES:
            continue
        module, role = split_param(name)
        ms_parents = _parents_beside(module, [(t, ms) for ms, t in modules.items()])
        parts = _stacked(name, tuple(value.shape), role, ms_parents, shapes, taken)
        if parts:
            fused[name] = _stacked_rows(parts, [shapes[p][0] for p in parts])
            taken.update(parts)
    for name in alignment.unmatched_torch:
        module, role = split_param(name)
        if role == "bias" and name not in fused and f"{module}.weight" in fused:
            parts = _key_unbiased(fused[f"{module}.weight"], shapes, taken)
            if parts:
                fused[name] = parts
                taken.update(part for part, _ in parts)
    return fused


# The layers whose bias attention's softmax ignores: it shifts every logit of a row alike.
KEY_LAYERS = ("k", "key")


def _key_unbiased(weight_parts: Sequence[Tuple[str, Part]], shapes: Mapping[str, Tuple[int, ...]],
                  taken: Set[str]) -> List[Tuple[str, Part]]:
    """The port's biases of the layers a fused weight went to (``weight_parts``), with their
    rows of the fused bias, where every one of those layers but the key layer holds one
    (torchvision's SwinV2 zeroes its qkv bias's k part in its forward, mindcv's port builds k
    without a bias: refused, 101 problems); else []."""
    parts = []
    for weight, rows in weight_parts:
        layer = split_param(weight)[0]
        bias = f"{layer}.bias"
        if bias in shapes and bias not in taken and shapes[bias] == (rows.stop - rows.start,):
            parts.append((bias, rows))
        elif split_param(layer)[1] not in KEY_LAYERS:
            return []
    return parts if 0 < len(parts) < len(weight_parts) else []


def _fused_in_port(state_dict: Mapping[str, np.ndarray], alignment: Alignment,
                   ms_shapes: Mapping[str, Tuple[Tuple[int, ...], str]],
                   overrides: Mapping[str, str]) -> Dict[str, List[str]]:
    """Each port parameter no torch tensor went to that holds torch's stacked along its first
    axis -> those torch tensors, in order (_stacked): the reverse of _fused_in_torch. mindcv's
    XCiT fuses timm's class attention q, k and v so; a port may fuse BERT's query, key and
    value alike."""
    modules = module_map_from_parameters(alignment.mindspore_to_torch)
    shapes = {name: tuple(value.shape) for name, value in state_dict.items()
              if value.dtype.kind not in CONSTANT_TABLES}
    # a torch tensor that went to the port's parameter of its name is that parameter's
    taken: Set[str] = set(overrides.values()) | {t for ms, t in
                                                 alignment.mindspore_to_torch.items()
                                                 if t in (ms, torch_role(ms))}
    joined: Dict[str, List[str]] = {}
    for name in alignment.unmatched_mindspore:
        module, role = split_param(torch_role(name))
        torch_parents = {module.rpartition(".")[0]} | _parents_beside(module, modules.items())
        parts = _stacked(name, ms_shapes[name][0], role, torch_parents, shapes, taken)
        if parts:
            joined[name] = parts
            taken.update(parts)
    return joined


def _parents_beside(module: str, module_pairs: Iterable[Tuple[str, str]]) -> Set[str]:
    """The parents, on the other side, of the modules paired with ``module``'s siblings
    (``module_pairs``: a module of its side, the other side's): where the other side holds what
    ``module`` does, if it holds it under other modules."""
    parent = module.rpartition(".")[0]
    return {other.rpartition(".")[0] for mine, other in module_pairs
            if mine.rpartition(".")[0] == parent}


def _stacked(name: str, shape: Tuple[int, ...], role: str, parents: Set[str],
             shapes: Mapping[str, Tuple[int, ...]], taken: Set[str]) -> List[str]:
    """The other side's tensors that one side's ``name`` holds stacked along its first axis:
    those of ``role`` in its q, k and v layers (or another SPLIT_PROJECTIONS) under one of
    ``parents`` (the modules its neighbours pair with), whose first dimensions add up to its
    own and whose others are its own, none ``taken``; first the layers whose names make the
    fused one's (``qk``: q and k, where k and v add up alike). By name: the first alignment
    pairs same-shaped parameters in order, and gave torchvision's proj the port's q."""
    fused = split_param(split_param(name)[0])[1]
    spelled = sorted(SPLIT_PROJECTIONS, key=lambda layers: "".join(layers) != fused)
    for parent in sorted(parents):
        for layers in spelled:
            parts = [f"{parent}.{layer}.{role}".lstrip(".") for layer in layers]
            if taken & set(parts):
                continue
            if all(p in shapes and len(shapes[p]) == len(shape) and shapes[p][1:] == shape[1:]
                   for p in parts) and sum(shapes[p][0] for p in parts) == shape[0]:
                return parts
    return []


def _a_tie_the_file_lost(state_dict: Mapping[str, np.ndarray], name: str,
                         mindspore_to_torch: Mapping[str, str],
                         port_ties: Optional[Mapping[str, str]]) -> bool:
    """Whether the torch tensor ``name``, which no port parameter takes, holds the same bits as
    one a tied port parameter takes: a tie torch made and the weights file did not keep (a
    .safetensors holds a tied tensor as a copy under each name), so the port's one parameter
    takes both."""
    from parity.rundir import same_bytes
    array = state_dict[name]
    for key in set((port_ties or {}).values()):
        taken = state_dict.get(mindspore_to_torch.get(key, ""))
        if taken is not None and same_bytes(taken, array):
            return True
    return False


def _not_the_same_model(alignment, mindspore_params: Sequence, torch_params: Sequence) -> str:
    """When most of the port's parameters found no torch tensor, the two models are most likely
    not the same architecture: said first, before the names."""
    matched, wanted = len(alignment.mindspore_to_torch), len(mindspore_params)
    if matched >= wanted / 2:
        return ""
    return (f"only {matched} of the port's {wanted} parameters found a torch tensor (the torch "
            f"weights hold {len(torch_params)}): are the two models the same architecture? ")


def mindspore_param_specs(net) -> List[Tuple[str, Tuple[int, ...], str]]:
    """(name, shape, numpy dtype) of every parameter of a MindSpore cell, buffers included.
    The dtype's name is MindSpore's lowercased ("Float32" -> "float32"): its converter to numpy,
    ``dtype_to_nptype``, is deprecated since 2.7 and logs a warning at each call."""
    return [(name, tuple(param.shape), str(param.dtype).lower() if param.dtype is not None else "?")
            for name, param in net.parameters_and_names()]


def mindspore_ties(net) -> Dict[str, str]:
    """Each further name a MindSpore network holds one of its parameters under (a port tying
    its output layer to its embedding) -> the parameter's own name, which parameters_and_names
    gives alone."""
    named = {id(param): name for name, param in net.parameters_and_names()}
    ties = {}
    for cell_name, cell in net.cells_and_names():
        for attribute, param in cell.parameters_and_names(expand=False):
            alias = f"{cell_name}.{attribute}" if cell_name else attribute
            if alias != named[id(param)]:
                ties[alias] = named[id(param)]
    return ties


@dataclass(frozen=True)
class Transfer:
    """What load_into_mindspore did: the names' mapping (MindSpore parameter -> torch key, or a
    part of one), torch's shape of each parameter MindSpore holds in another shape of the same
    layout (its Conv1d weight: (out, in, 1, k) for torch's (out, in, k)), the torch keys no
    MindSpore parameter took (step counters, integer constants the port holds itself), the
    port's frozen parameters no torch tensor fed, kept at its own values (plan_transfer), and
    the rows of torch's tensors no parameter took where the others did (a fused bias's key
    rows: _key_unbiased), each named as a part (``qkv.bias[8:16]``), and the parameters holding
    their torch tensor transposed (a Dense layer's of Hugging Face's Conv1D: see
    load_into_mindspore)."""
    plan: Dict[str, str]
    torch_shapes: Dict[str, Tuple[int, ...]]
    left_out: List[str]
    port_constants: List[str] = field(default_factory=list)
    rows_left: List[str] = field(default_factory=list)
    transposed: List[str] = field(default_factory=list)


def load_into_mindspore(net, state_dict: Mapping[str, np.ndarray],
                        overrides: Optional[Mapping[str, str]] = None,
                        torch_strides: Optional[Mapping[str, int]] = None,
                        torch_in_out: Collection[str] = (),
                        port_in_out: Collection[str] = ()) -> Transfer:
    """Copy a torch state dict into a MindSpore network. Keys that all carry an outer prefix
    (a Lightning checkpoint's "model.") are tried without it when they do not fit as they
    are. ``torch_strides``: torch's modules' largest strides, from its capture.

    ``torch_in_out``: torch's weights held (in, out) by layers computing x @ W (Hugging Face's
    Conv1D; capture/layouts.py), ``port_in_out`` the port's: each is planned and transferred
    as the (out, in) of torch's Linear and MindSpore's Dense, so a Dense port of GPT-2 takes
    each Conv1D weight transposed and a port holding them as torch does takes them as they
    are. A port's layers computing x @ W count only where torch's model holds such layers too:
    elsewhere a port's weight used transposed is its bug (tests/tiny.py's
    ms_projected_transposed)."""
    import mindspore as ms
    params = dict(net.parameters_and_names())
    frozen = {name for name, param in params.items() if not param.requires_grad}
    norm_defaults = frozen_norm_defaults(net)
    strides = None if torch_strides is None else (torch_strides, _cell_strides(net))
    torch_in_out = set(torch_in_out) & set(state_dict)
    port_in_out = set(port_in_out) if torch_in_out else set()
    if torch_in_out:
        state_dict = StateDict({name: value.T if name in torch_in_out else value
                                for name, value in state_dict.items()},
                               getattr(state_dict, "tied", {}))
    specs = [(name, shape[::-1] if name in port_in_out else shape, dtype)
             for name, shape, dtype in mindspore_param_specs(net)]
    state_dict, plan = _names_that_fit(state_dict, specs, overrides, mindspore_ties(net),
                                       norm_defaults, frozen, strides)
    torch_shapes = {}
    joined: Dict[str, List[Tuple[int, np.ndarray]]] = {}     # port parameter -> its parts
    for ms_name, torch_name in plan.items():
        value, (whole, part) = value_of(state_dict, torch_name), split_part(ms_name)
        if part is not None:
            joined.setdefault(whole, []).append((part.start, value))
            continue
        if ms_name in port_in_out:
            value = value.T
        shape = tuple(params[ms_name].shape)
        if tuple(value.shape) != shape:
            torch_shapes[ms_name] = tuple(value.shape)
        params[ms_name].set_data(ms.Tensor(np.ascontiguousarray(value).reshape(shape)))
    for ms_name, parts in joined.items():
        stacked = np.concatenate([value for _, value in sorted(parts, key=lambda p: p[0])])
        params[ms_name].set_data(ms.Tensor(stacked.T if ms_name in port_in_out else stacked))
    transposed = [ms_name for ms_name, torch_name in plan.items()
                  if (split_part(torch_name)[0] in torch_in_out) !=
                  (split_part(ms_name)[0] in port_in_out)]
    if any(split_part(ms_name)[1] is not None for ms_name in transposed):
        raise ParityInputError(
            f"the port stacks torch tensors into one parameter "
            f"({first_few(sorted({split_part(m)[0] for m in transposed}))}) where one side's "
            "layer holds its weight as (in, out) for x @ W: parity does not compare such a "
            "parameter; hold the weights as torch does (one layer each)")
    plan = {ms_name: _in_torch_layout(torch_name, torch_in_out)
            for ms_name, torch_name in plan.items()}
    taken = {split_part(key)[0] for key in plan.values()} | set(getattr(state_dict, "tied", {}))
    constants = [name for name in params if name not in plan and name not in joined
                 and not is_ignored(name) and _a_port_constant(name, frozen)]
    return Transfer(plan, torch_shapes, [key for key in state_dict if key not in taken],
                    constants, _rows_left(plan.values(), state_dict), transposed)


def _in_torch_layout(name: str, torch_in_out: Collection[str]) -> str:
    """A part of a torch weight held (in, out), planned on its transpose, named on torch's own
    tensor: rows there are columns here (a port's q layer of GPT-2's c_attn)."""
    whole, part = split_part(name)
    if part is None or whole not in torch_in_out:
        return name
    return Part(part.start, part.stop, 1 - part.axis_of(2)).of(whole)


def _rows_left(torch_names: Iterable[str], state_dict: Mapping[str, np.ndarray]) -> List[str]:
    """The rows of each torch tensor taken in parts that no part covers, named as parts."""
    taken: Dict[str, List[Part]] = {}
    for name in torch_names:
        whole, part = split_part(name)
        if part is not None and part.axis == 0:
            taken.setdefault(whole, []).append(part)
    left = []
    for whole, parts in taken.items():
        start = 0
        for part in sorted(parts, key=lambda p: p.start) + [Part(len(state_dict[whole]), 0)]:
            if part.start > start:
                left.append(Part(start, part.start).of(whole))
            start = max(start, part.stop)
    return left


def _cell_strides(net) -> Dict[str, int]:
    """The port's cells' largest strides (align.largest_stride), by cell path."""
    found = {}
    for name, cell in net.cells_and_names():
        stride = largest_stride(getattr(cell, "stride", None))
        if name and stride is not None:
            found[name] = stride
    return found


# A norm's frozen parameters at their initial values, which MindSpore keeps where torch has none.
INITIAL_NORM_VALUES = {"gamma": 1.0, "beta": 0.0, "moving_mean": 0.0, "moving_variance": 1.0}
# Each group of them, and the torch entries of the same module that would stand for it.
NORM_GROUPS = ((("gamma", "beta"), ("weight", "bias")),
               (("moving_mean", "moving_variance"),
                ("running_mean", "running_var", "num_batches_tracked")))


def _norm_group_torch_lacks(name: str, unmatched: Sequence[str],
                            state_dict: Mapping[str, np.ndarray]) -> List[str]:
    """The group of norm parameters ``name`` belongs to (gamma and beta, or the running
    statistics) if none of it found a torch tensor while torch holds nothing for that group in
    the module of the same name (a BatchNorm(affine=False), not a weights file that lost one of
    its running statistics: that is a missing key); else []."""
    module, role = split_param(name)
    for group, torch_roles in NORM_GROUPS:
        if role in group:
            names = [f"{module}.{member}" for member in group]
            lacks = all(n in unmatched for n in names) and \
                not any(f"{module}.{torch_role}" in state_dict for torch_role in torch_roles)
            return names if lacks else []
    return []


RMS_NORM_PORTED = "A norm holding a weight alone is an RMS norm (Hugging Face's T5LayerNorm, " \
    "LlamaRMSNorm: x·rsqrt(mean(x²) + eps)·weight, no mean subtracted, no bias added) or a " \
    "LayerNorm built without bias; port an RMS norm as a cell computing it, not nn.LayerNorm " \
    "(MindSpore 2.8.0's ops.rms_norm has no CPU kernel)"


def _weight_alone(module: Optional[str], state_dict: Mapping[str, np.ndarray]) -> bool:
    """Whether torch's ``module`` holds a weight and no bias."""
    return module is not None and f"{module}.weight" in state_dict and \
        f"{module}.bias" not in state_dict


def _torch_holds_beside(name: str, state_dict: Mapping[str, np.ndarray]) -> bool:
    """Whether torch holds tensors in the module holding ``name``'s module: a norm without
    weight or bias leaves nothing of its own in the state dict, but its neighbours do. A port of
    another architecture (mindcv's ShuffleNetV2, whose blocks hold a ``branch_main`` where
    torchvision's hold ``branch1`` and ``branch2``) was told each of its norms had none."""
    parent = split_param(split_param(name)[0])[0]
    return not parent or any(key.startswith(parent + ".") for key in state_dict)


def _a_port_constant(name: str, frozen: Optional[Set[str]]) -> bool:
    """Whether the port's parameter ``name``, if no torch tensor feeds it, may be a constant it
    computes itself (plan_transfer): a frozen one, not a norm's (those: frozen_norm_defaults)."""
    return name in (frozen or set()) and split_param(name)[1] not in INITIAL_NORM_VALUES


def frozen_norm_defaults(net) -> Set[str]:
    """The frozen norm parameters at their initial values a MindSpore network holds where
    torch's may hold none: BatchNorm(affine=False)'s gamma of ones and beta of zeros (the
    identity torch applies), the running statistics of one using batch statistics only (for
    torch's track_running_stats=False). No torch tensor needs to go into them."""
    left_out = set()
    for name, param in net.parameters_and_names():
        identity = INITIAL_NORM_VALUES.get(name.rpartition(".")[2])
        if identity is not None and not param.requires_grad and \
                bool((param.asnumpy() == identity).all()):
            left_out.add(name)
    return left_out


def _names_that_fit(state_dict: Mapping[str, np.ndarray], specs: Sequence,
                    overrides: Optional[Mapping[str, str]], ties: Mapping[str, str],
                    left_out: Set[str], frozen: Set[str],
                    strides: Optional[Tuple[Mapping[str, int], Mapping[str, int]]]
                    ) -> Tuple[Mapping[str, np.ndarray], Dict[str, str]]:
    """The state dict, without its keys' outer prefix if only that way they fit, and its
    transfer plan; if neither fits, the refusal naming fewer problems."""
    try:
        return state_dict, plan_transfer(state_dict, specs, overrides, ties, left_out, frozen,
                                         strides)
    except TransferRefused as as_they_are:
        prefix = outer_prefix(state_dict)
        if not prefix:
            raise
        inner = without_prefix(state_dict, prefix)
        try:
            return inner, plan_transfer(inner, specs, overrides, ties, left_out, frozen,
                                        strides)
        except TransferRefused as without:
            raise min(as_they_are, without, key=lambda refusal: refusal.problems) from None


def not_finite(state_dict: Mapping[str, np.ndarray]) -> List[str]:
    """'name: 3 NaN, 1 Inf' for each floating-point tensor holding values that are not finite."""
    found = []
    for name, array in state_dict.items():
        if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
            nan = int(np.isnan(array).sum())
            found.append(f"{name}: {nan} NaN, {int((~np.isfinite(array)).sum()) - nan} Inf")
    return found


def convert_weights(model_factory: str, torch_weights: Path, out: Path, *,
                    num_classes: Optional[int] = None,
                    overrides: Optional[Mapping[str, str]] = None
                    ) -> Tuple[Transfer, List[str]]:
    """Write a MindSpore checkpoint (.ckpt) or .safetensors of the port with torch's weights;
    returns the transfer, and the tensors holding NaN or Inf (copied as they are)."""
    from parity.io import atomic_output
    from parity.models_loader import build_mindspore_model
    out = Path(out)
    if out.suffix not in (".ckpt", ".safetensors"):
        raise ParityInputError(f"--out {out}: use a .ckpt or .safetensors file name")
    state_dict = load_state_dict(torch_weights)
    net = build_mindspore_model(model_factory, num_classes=num_classes)
    transfer = load_into_mindspore(net, state_dict, overrides)
    import mindspore as ms
    with atomic_output(out) as tmp:
        if out.suffix == ".safetensors":
            from safetensors.numpy import save_file
            save_file({n: p.asnumpy() for n, p in net.parameters_and_names()}, str(tmp))
        else:
            ms.save_checkpoint(net, str(tmp))
    return transfer, not_finite(state_dict)
