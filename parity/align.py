"""Name alignment between a PyTorch model and its MindSpore port.

Built-in pairs share names, so alignment is the identity plus MindSpore's BatchNorm parameter
names. User pairs may name things differently (``max_pool`` vs ``maxpool``, ``classifier`` vs
``fc``): parameters are then matched by structure (module, parameter role, shape, order) and
forward records by execution order, operation type and output shape. A ``--map`` file overrides
any pair. Whatever stays unmatched is listed, never dropped silently.
"""

from __future__ import annotations

import math
import operator
import re
from collections import Counter, OrderedDict
from dataclasses import replace
from itertools import accumulate
from typing import (Callable, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Set,
                    Tuple)

from parity.records import (CONTAINER_OPS, DROPPING_OPS, LAST_AXIS, Alignment, Part, RecordInfo,
                            dropping_for_identity, module_of, split_part)
from parity.sketch import sketch_distance

# MindSpore parameter names (BatchNorm's, Embedding's table, PReLU's) -> the PyTorch role they play.
MINDSPORE_PARAM_ROLES = {"gamma": "weight", "beta": "bias", "moving_mean": "running_mean",
                         "moving_variance": "running_var", "embedding_table": "weight",
                         "w": "weight"}
GENERIC_OP = "module"
# An Identity's output is its input, of whichever point it is put at: it pairs only with a
# module of its name, or a dropout as its rate of 0 (timm's BatchNormAct2d runs an Identity
# ``drop`` after its norm, paired with the cell wrapping mindcv's MixNet conv before the norm;
# timm's RepVGG block its ``drop_path`` before adding the identity branch, paired with
# mindcv's ``se`` after it: both failed a correct port). Identities left unpaired compute
# nothing, and are named in a note (engine.pair_records).
IDENTITY_OP = "identity"
# A module whose output has another shape on each side (a stride, padding or kernel that
# differs; pad widths given top and bottom first, which transposes a square map's) is still
# paired when it is the same module, well below any same-shape match: the first divergence is
# then named where the shape changed, not left unmatched. Outputs that differ only by size-1
# dimensions or merged adjacent ones hold the same values in the same order and are paired as
# outputs of one shape (same_order): mindcv's GlobalAvgPooling returns (N, C) where torch's
# AdaptiveAvgPool2d returns (N, C, 1, 1), and compare reads the two in torch's shape.
SHAPE_DIFFERS = 0.25
# A module the parameter mapping (or a --map entry) pins to the MindSpore one: above any other.
PINNED = 10.0
# Modules of one signature whose last names agree (``norm1``, ``norm1``), where the paths do
# not: mindcv's PVTv2 block's norm1 was paired with timm's downsampling norm just before it, alike
# in order and layout, and timm's norm1 with the port's downsampling norm.
SAME_LEAF = 0.5
# A torch module whose port holds all it holds but its bias (a MindSpore layer built with
# has_bias=False, nn.Conv2d's default): paired below any match, for the transfer to refuse the
# bias with that advice (mindcv's MLP-Mixer patch embedding was refused as a missing conv and an
# extra one).
BIAS_THE_PORT_LACKS = 1.0
# Modules alike in what they hold, inside modules their siblings' pairs put side by side
# (_agreeing_parents): mindcv's ResNetV2 holds a BatchNorm after its stem that timm's lacks; in
# order, timm's first block's norm1 went to it and every norm after it one BatchNorm early.
# Below SAME_LEAF: a name says more than a neighbourhood.
SAME_PARENTS = 0.25
# A container of the user's own paired with the torch module holding what the modules inside it
# pair with (_holders): mindcv's ConvNeXtV2 block holds its dense layers itself, timm's in an
# ``mlp`` module; the block was paired with that module's output, scored alike and run first.
HOLDS_THE_SAME = 0.25
# Two activations of different operations where nothing better pairs either: one computed in
# place of the other, paired to be flagged (timm's MobileNetV1 applies ReLU6 inside its
# BatchNormAct2d, mindcv's port a ReLU cell after its BatchNorm: left apart, the port failed
# two blocks on, "extra operation in the port", the ReLU6 unnamed).
ACTIVATION_OPS = ("relu", "relu6", "gelu", "silu", "sigmoid", "tanh", "leakyrelu", "hardswish",
                  "hardsigmoid", "elu", "selu", "mish", "prelu")
ANOTHER_ACTIVATION = 0.25
# Modules alike in what they hold whose strides differ (align_parameters' strides): still a
# pair, a port's stride may be its bug (ResNet v1's on the 1×1 conv for v1.5's on the 3×3),
# but below a pair striding alike beside them (timm's RegNet block holds its stride-1 conv1
# first, mindcv's its strided shortcut conv: the shortcut took conv1's weights).
STRIDING_OTHERWISE = 1.0
# A tie-break between MindSpore records scored alike against a user's own torch module, far
# below any score's step even summed over 10⁵ such pairs.
LATER_GENERIC = 1e-6


def normalise(name: str) -> str:
    """Names compared loosely: ``down_sample`` == ``downsample``, call index dropped."""
    return re.sub(r"[_\-]", "", name.split("#")[0].lower())


def _leaf(path: str) -> str:
    return path.rsplit(".", 1)[-1]


def layout(shape: Sequence[int]) -> Tuple[int, ...]:
    """A shape without its size-1 dimensions: two shapes of one layout hold the same values in
    the same order. MindSpore's nn.Conv1d keeps its weight as (out, in, 1, k), torch's as
    (out, in, k)."""
    return tuple(size for size in shape if size != 1)


def channels_to_torch_layout(t_shape: Sequence[int], m_shape: Sequence[int]
                             ) -> Optional[Tuple[int, ...]]:
    """The transposition reading a port's output in torch's layout where one side holds its
    channels last and the other right after the batch (N×H×W×C, N×C×H×W); None otherwise, or
    where both readings fit and differ."""
    if len(t_shape) < 3 or len(m_shape) != len(t_shape):
        return None
    fitting = {order for order in _channels_moved(len(t_shape))     # one order at rank 3
               if tuple(t_shape[axis] for axis in order) == tuple(m_shape)}
    return _inverse(fitting.pop()) if len(fitting) == 1 else None


def _channels_moved(rank: int) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """torch's axes in the order of the other side's layout where that side holds the channels
    last, and where it holds them right after the batch (torch's last)."""
    return (0, *range(2, rank), 1), (0, rank - 1, *range(1, rank - 1))


def _inverse(order: Sequence[int]) -> Tuple[int, ...]:
    """The permutation undoing ``order``."""
    return tuple(sorted(range(len(order)), key=order.__getitem__))


def once_for_the_batch(shape: Sequence[int], other: Sequence[int]) -> bool:
    """Whether one shape is the other's computed once for the batch: (1, ...) for (N, ...). Of a
    module of the user's own, named alike on both sides, such outputs are one (Hugging Face's
    T5 passes its position bias on broadcast to the batch, a port as (1, H, L, L): the two were
    left unpaired)."""
    return len(shape) == len(other) > 0 and tuple(shape[1:]) == tuple(other[1:]) and \
        1 in (shape[0], other[0])


def same_order(shape: Sequence[int], other: Sequence[int], first_merged: bool = False) -> bool:
    """Whether two shapes hold as many values in one order: one is the other with runs of
    adjacent dimensions merged, or with size-1 dimensions (layout). torchvision's Swin keeps
    its tokens as (N, H, W, C), mindcv's as (N, H·W, C). The first dimension is merged only
    where ``first_merged`` (two outputs already paired by name; see compare/engine.py's
    _read_alike): mindcv's SwinV2 attends over 8×8 windows, (N·64, 64, C) at a 64×64 map, which
    is not torchvision's (N, 64, 64, C) in another shape (its attention was paired with the
    port's and failed, "input in another order"); nor is an index flattened, (N², ) for (N, N).
    A conv's weight over a whole map, (out, in, k, k), holds a dense layer's over it flattened,
    (out, in·k·k)."""
    if layout(shape) == layout(other):
        return True
    ends, other_ends = (set(accumulate(s, operator.mul)) for s in (shape, other))
    return math.prod(shape) == math.prod(other) > 0 and \
        (first_merged or shape[0] == other[0]) and (ends <= other_ends or other_ends <= ends)


def split_param(name: str) -> Tuple[str, str]:
    module, _, role = name.rpartition(".")
    return module, role


def torch_role(mindspore_param: str) -> str:
    module, role = split_param(mindspore_param)
    role = MINDSPORE_PARAM_ROLES.get(role, role)
    return f"{module}.{role}" if module else role


# torch.nn.utils.parametrizations keeps a parametrized weight's tensors under
# <module>.parametrizations.<name>: weight_norm's magnitude and direction as original0 and
# original1, spectral_norm's weight as original and its power iteration's vectors as 0._u and
# 0._v. The older torch.nn.utils.weight_norm and spectral_norm named them <name>_g, <name>_v,
# <name>_orig, <name>_u and <name>_v: the names a port (and older torch code) holds them by.
PARAMETRIZED = re.compile(r"^(?:(.*)\.)?parametrizations\.([^.]+)\."
                          r"(original0|original1|original|0\._u|0\._v)$")
OLDER_SUFFIXES = {"original0": "g", "original1": "v", "original": "orig", "0._u": "u",
                  "0._v": "v"}


def older_name(torch_name: str) -> str:
    """``torch_name`` as torch's older weight_norm and spectral_norm named such a tensor
    (itself where that is the same)."""
    found = PARAMETRIZED.match(torch_name)
    if found is None:
        return torch_name
    module, name, part = found.groups()
    role = f"{name}_{OLDER_SUFFIXES[part]}"
    return f"{module}.{role}" if module else role


def align_sequences(n: int, m: int, score: Callable[[int, int], float]) -> List[Tuple[int, int]]:
    """Order-preserving matching of two sequences maximising the summed score (0 = no match)."""
    best = [[0.0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        row, below = best[i], best[i + 1]
        for j in range(m - 1, -1, -1):
            value = max(below[j], row[j + 1])
            s = score(i, j)
            if s > 0:
                value = max(value, below[j + 1] + s)
            row[j] = value
    pairs, i, j = [], 0, 0
    while i < n and j < m:
        s = score(i, j)
        if s > 0 and best[i][j] == best[i + 1][j + 1] + s:
            pairs.append((i, j))
            i, j = i + 1, j + 1
        elif best[i][j] == best[i + 1][j]:
            i += 1
        else:
            j += 1
    return pairs


def _group_by_module(params: Sequence[Tuple[str, Tuple[int, ...]]]
                     ) -> "OrderedDict[str, Dict[str, Tuple[str, Tuple[int, ...]]]]":
    """module path -> {role: (full name, shape)}, in first-appearance order."""
    modules: "OrderedDict[str, Dict[str, Tuple[str, Tuple[int, ...]]]]" = OrderedDict()
    for name, shape in params:
        module, role = split_param(name)
        modules.setdefault(module, {})[role] = (name, tuple(shape))
    return modules


def _signature(roles: Mapping[str, Tuple[str, Tuple[int, ...]]]) -> Tuple:
    """A module's parameters as (role, layout) pairs, sorted: what it holds, not its name."""
    return tuple(sorted((role, layout(shape)) for role, (_, shape) in roles.items()))


def align_parameters(torch_params: Sequence[Tuple[str, Tuple[int, ...]]],
                     mindspore_params: Sequence[Tuple[str, Tuple[int, ...]]],
                     overrides: Optional[Mapping[str, str]] = None,
                     strides: Optional[Tuple[Mapping[str, int], Mapping[str, int]]] = None
                     ) -> Alignment:
    """Match MindSpore parameters to torch state-dict entries.

    ``strides``: torch's and the port's modules' largest strides (largest_stride), where known:
    modules alike in what they hold but striding otherwise pair below those striding alike
    (STRIDING_OTHERWISE).

    Order of evidence: an explicit override; the same name and layout; the same name and layout
    once MindSpore's roles are renamed (BatchNorm's gamma -> weight) and torch's weight_norm and
    spectral_norm parametrizations' are given their older names (weight_g, weight_orig...);
    then whole modules matched by their (role, layout) signature in order; then names agreeing
    but for separators (_named_but_for_separators); then the modules left, by signature in any
    order (_modules_by_signature); then the same name in another layout, which the weight
    transfer refuses naming both shapes, unless it holds the same values flattened (a port
    holding torch's nested stem flat names its BatchNorm ``1`` where torch's ``1`` is the next
    conv: its gamma was given that conv's weight by name; timm's Swin and mindcv's name
    different patch mergings alike); last, what is left on both sides, one to one in order
    where every pair agrees (_leftovers_in_order).
    """
    torch_names = {older_name(name): name for name, _ in torch_params}
    torch_layouts = {name: layout(shape) for name, shape in torch_params}
    mapping: Dict[str, str] = {}
    misfits: Dict[str, str] = {}        # same name, another layout
    overridden = {split_part(ms_name)[0] for ms_name in overrides or {}}
    for ms_name, shape in mindspore_params:
        if ms_name in overridden:       # the parameter, or its parts (a layer torch holds apart)
            mapping.update((key, torch_name) for key, torch_name in overrides.items()
                           if split_part(key)[0] == ms_name)
            continue
        # the name itself first: a LayerScale's gamma on both sides
        named = [torch_names[n] for n in (ms_name, torch_role(ms_name)) if n in torch_names]
        fitting = [name for name in named if torch_layouts[name] == layout(shape)]
        if fitting:
            mapping[ms_name] = fitting[0]
        elif named:
            misfits[ms_name] = named[0]

    def left() -> Tuple[List[Tuple[str, Tuple[int, ...]]], List[Tuple[str, Tuple[int, ...]]]]:
        """The parameters no pass has paired yet, torch's and MindSpore's."""
        used = {split_part(name)[0] for name in mapping.values()}
        paired = {split_part(name)[0] for name in mapping}
        return ([p for p in torch_params if p[0] not in used],
                [p for p in mindspore_params if p[0] not in paired])

    def in_torch_terms(torch_left, ms_left):
        """Both sides' names as the module passes read them: torch's older parametrization
        names, MindSpore's roles renamed (gamma -> weight)."""
        return ([(older_name(n), s) for n, s in torch_left],
                [(torch_role(n), s) for n, s in ms_left])

    torch_grouped, ms_grouped = map(_group_by_module, in_torch_terms(*left()))
    ms_original = {torch_role(n): n for n, _ in mindspore_params}

    t_modules, m_modules = list(torch_grouped.items()), list(ms_grouped.items())

    torch_strides, ms_strides = strides or ({}, {})

    def score(i: int, j: int) -> float:
        (t_name, t_roles), (m_name, m_roles) = t_modules[i], m_modules[j]
        if _signature(t_roles) != _signature(m_roles):
            return BIAS_THE_PORT_LACKS if _signature(
                {role: held for role, held in t_roles.items() if role != "bias"}) == \
                _signature(m_roles) else 0.0
        same_path = normalise(t_name) == normalise(m_name)
        same_leaf = normalise(_leaf(t_name)) == normalise(_leaf(m_name))
        striding = None not in (torch_strides.get(t_name), ms_strides.get(m_name)) and \
            torch_strides[t_name] != ms_strides[m_name]
        return 2.0 + (1.0 if same_path else SAME_LEAF if same_leaf else 0.0) - \
            (STRIDING_OTHERWISE if striding else 0.0)

    in_order = align_sequences(len(t_modules), len(m_modules), score)
    agreeing = _agreeing_parents([(t_modules[i][0], m_modules[j][0]) for i, j in in_order])

    def score_in_context(i: int, j: int) -> float:
        alike = score(i, j)
        parents = (split_param(t_modules[i][0])[0], split_param(m_modules[j][0])[0])
        return alike + SAME_PARENTS if alike and parents in agreeing else alike

    for i, j in align_sequences(len(t_modules), len(m_modules), score_in_context):
        mapping.update(_paired_roles(t_modules[i][1], m_modules[j][1], torch_names, ms_original))
    mapping.update(_named_but_for_separators(*left(), torch_params, mindspore_params))
    mapping.update(_modules_by_signature(*in_torch_terms(*left()), mapping, torch_names,
                                         ms_original))
    used = {split_part(name)[0] for name in mapping.values()}
    for ms_name, torch_name in misfits.items():
        if ms_name not in mapping and torch_name not in used:
            mapping[ms_name] = torch_name
            used.add(torch_name)
    mapping.update(_leftovers_in_order(*left(), mapping))
    torch_left, ms_left = left()
    return Alignment(mindspore_to_torch=mapping,
                     unmatched_torch=tuple(n for n, _ in torch_left),
                     unmatched_mindspore=tuple(n for n, _ in ms_left))


def largest_stride(stride: object) -> Optional[int]:
    """A module's stride setting as its largest step (2 for (1, 2): MindSpore's Conv1d keeps
    its stride so), or None where it is none."""
    steps = stride if isinstance(stride, (list, tuple)) else [stride]
    if not steps or not all(isinstance(step, int) and not isinstance(step, bool)
                            for step in steps):
        return None
    return max(steps)


def _agreeing_parents(pairs: Sequence[Tuple[str, str]]) -> Set[Tuple[str, str]]:
    """The (torch, MindSpore) parent modules of paired modules that pair with each other more
    often than with any other: each side's one most frequent partner of the other's."""
    counts = Counter((split_param(theirs)[0], split_param(ours)[0]) for theirs, ours in pairs)

    def most_frequent(side: int) -> Dict[str, Tuple[str, str]]:
        partners: Dict[str, List[Tuple[int, Tuple[str, str]]]] = {}
        for parents, count in counts.items():
            partners.setdefault(parents[side], []).append((count, parents))
        return {parent: max(found)[1] for parent, found in partners.items()
                if [count for count, _ in found].count(max(found)[0]) == 1}

    torch_best, ms_best = most_frequent(0), most_frequent(1)
    return {parents for parents in torch_best.values() if ms_best.get(parents[1]) == parents}


def _paired_roles(torch_roles: Mapping[str, Tuple[str, Tuple[int, ...]]],
                  ms_roles: Mapping[str, Tuple[str, Tuple[int, ...]]],
                  torch_names: Mapping[str, str], ms_original: Mapping[str, str]
                  ) -> Dict[str, str]:
    """A torch module's parameters given to those of the MindSpore module paired with it, role
    by role, in both sides' own names (a torch bias the port lacks is left)."""
    return {ms_original[ms_name]: torch_names[torch_roles[role][0]]
            for role, (ms_name, _) in ms_roles.items()}


def _dotted(name: str) -> str:
    return re.sub(r"[_\-]", ".", name.lower())


def _named_but_for_separators(torch_left: Sequence[Tuple[str, Tuple[int, ...]]],
                              ms_left: Sequence[Tuple[str, Tuple[int, ...]]],
                              torch_params: Sequence[Tuple[str, Tuple[int, ...]]],
                              mindspore_params: Sequence[Tuple[str, Tuple[int, ...]]]
                              ) -> Dict[str, str]:
    """The parameters left whose names agree but for their separators, ``.``, ``_`` or ``-``
    (timm's CrossViT holds ``pos_embed_0``, mindcv's a ParameterTuple ``pos_embed.0``: in
    another order, one module against two), where each side holds one such name and the layouts
    agree. Separators are told apart from none: ``blocks.1.0`` is no ``blocks_10``."""
    torch_count = Counter(_dotted(older_name(n)) for n, _ in torch_params)
    ms_count = Counter(_dotted(torch_role(n)) for n, _ in mindspore_params)
    torch_by_name = {_dotted(older_name(n)): (n, layout(shape)) for n, shape in torch_left}
    pairs = {}
    for ms_name, shape in ms_left:
        key = _dotted(torch_role(ms_name))
        if torch_count[key] == ms_count[key] == 1 and key in torch_by_name and \
                torch_by_name[key][1] == layout(shape):
            pairs[ms_name] = torch_by_name[key][0]
    return pairs


def _modules_by_signature(torch_left: Sequence[Tuple[str, Tuple[int, ...]]],
                          ms_left: Sequence[Tuple[str, Tuple[int, ...]]],
                          mapping: Mapping[str, str], torch_names: Mapping[str, str],
                          ms_original: Mapping[str, str]) -> Dict[str, str]:
    """The modules left on each side paired by their (role, layout) signature, in order among
    the modules of one signature, where each side holds as many of it: a port declaring its
    layers in another order than torch (mindcv's PVTv2 holds every stage's downsampling layer in
    one list before the blocks, timm's each in its stage; the order-preserving pass pairs the
    blocks and leaves those). A signature held a different number of times on each side pairs
    nothing here."""
    torch_modules, ms_modules = _group_by_module(torch_left), _group_by_module(ms_left)
    by_signature: Dict[Tuple, Tuple[List[str], List[str]]] = {}
    for side, modules in enumerate((torch_modules, ms_modules)):
        for module, roles in modules.items():
            by_signature.setdefault(_signature(roles), ([], []))[side].append(module)
    paired = module_map_from_parameters(mapping)
    pairs = {}
    for torch_group, ms_group in by_signature.values():
        if len(torch_group) != len(ms_group) or not all(
                _sibling_modules_agree(ours, theirs, paired)
                for theirs, ours in zip(torch_group, ms_group)):
            continue
        for theirs, ours in zip(torch_group, ms_group):
            pairs.update(_paired_roles(torch_modules[theirs], ms_modules[ours], torch_names,
                                       ms_original))
    return pairs


def _leftovers_in_order(torch_left: Sequence[Tuple[str, Tuple[int, ...]]],
                        ms_left: Sequence[Tuple[str, Tuple[int, ...]]],
                        mapping: Mapping[str, str]) -> Dict[str, str]:
    """The parameters left on each side paired one to one in order, where there are as many
    on each side, each pair holds its values in one order (same_order), and each lies in the
    module its siblings' mapping says: a role named otherwise on each side (torchvision's
    ConvNeXt holds each block's layer scale as ``layer_scale`` (C, 1, 1), mindcv's as ``gamma_``
    (C,): 18 left on each side); a layer one side computes as a conv over its whole input map,
    the other as a dense layer over the flattened map (timm's VGG, (4096, 512, 7, 7); mindcv's,
    (4096, 25088)).
    Else nothing: a port missing one parameter is refused naming what is left."""
    if not torch_left or len(torch_left) != len(ms_left):
        return {}
    modules = module_map_from_parameters(mapping)
    pairs = {}
    for (torch_name, torch_shape), (ms_name, ms_shape) in zip(torch_left, ms_left):
        ms_module, torch_module = split_param(ms_name)[0], split_param(torch_name)[0]
        # torch may hold it one module deeper, in a module holding nothing the mapping paired
        # (timm's PoolFormer: layer_scale1.scale, mindcv's layer_scale_1 on the block)
        holder = torch_module if _holds_paired(torch_module, modules) else \
            split_param(torch_module)[0]
        if not same_order(torch_shape, ms_shape) or \
                not _sibling_modules_agree(ms_module, holder, modules):
            return {}
        pairs[ms_name] = torch_name
    return pairs


def _holds_paired(torch_module: str, modules: Mapping[str, str]) -> bool:
    """Whether ``torch_module`` is, or holds, a module the mapping pairs."""
    return any(theirs == torch_module or theirs.startswith(torch_module + ".")
               for theirs in modules.values())


def _sibling_modules_agree(ms_module: str, torch_module: str, modules: Mapping[str, str]) -> bool:
    """Whether the modules the mapping pairs inside ``ms_module`` lie inside ``torch_module``
    (true where the mapping pairs none there)."""
    inside = [theirs for ours, theirs in modules.items()
              if ours == ms_module or ours.startswith(ms_module + ".")] if ms_module else []
    return all(theirs == torch_module or theirs.startswith(torch_module + ".")
               for theirs in inside)


def module_map_from_parameters(param_map: Mapping[str, str]) -> Dict[str, str]:
    """MindSpore module path -> torch module path, as implied by the parameter mapping (a
    parametrized weight's tensors are its module's: conv1.parametrizations.weight.original's
    module is conv1, as weight_orig's). A part of a parameter (``qkv.weight[0:32]``) is its
    whole's, where it is rows of a layer's weight or bias (_rows_of_a_layer)."""
    held: Dict[str, List[str]] = {}
    for ms, t in param_map.items():
        if not (_rows_of_a_layer(ms) and _rows_of_a_layer(t)):
            continue        # the layer computes part of the module's work, not its output
        held.setdefault(split_param(split_part(ms)[0])[0], []).append(
            split_param(older_name(t))[0])
    return {ms: common_module(modules) for ms, modules in held.items()}


def common_module(modules: Sequence[str]) -> str:
    """The innermost module holding all of ``modules``: a MindSpore cell whose parameters torch
    holds in several modules is their parent's counterpart (mindcv's PoolFormer block holds
    ``layer_scale_1`` and ``layer_scale_2``, timm's in ``layer_scale1`` and ``layer_scale2``:
    the block was paired with ``layer_scale2``'s output, its last)."""
    parts = [module.split(".") for module in modules]
    common = []
    for names in zip(*parts):
        if len(set(names)) > 1:
            break
        common.append(names[0])
    return ".".join(common)


def _holders(modules: Mapping[str, str]) -> Dict[str, str]:
    """MindSpore container -> the innermost torch module holding the torch modules that two or
    more modules inside it pair with."""
    inside: Dict[str, Set[str]] = {}
    for ours, theirs in modules.items():
        parts = ours.split(".")
        for end in range(1, len(parts)):
            inside.setdefault(".".join(parts[:end]), set()).add(theirs)
    return {container: common_module(sorted(paired)) for container, paired in inside.items()
            if len(paired) > 1}


def cells_never_run(modules: Mapping[str, str], mindspore_records: Sequence[RecordInfo]
                    ) -> Dict[str, List[str]]:
    """Torch module -> the MindSpore cells holding its weights, where none of them recorded an
    output: defined, loaded, never run (a construct that skips a layer or returns before it; a
    cell replaced by setattr in a SequentialCell, whose cell_list still runs the old one)."""
    ran = {module_of(r.name.partition("#")[0]) for r in mindspore_records}
    holders: Dict[str, List[str]] = {}
    for ours, theirs in modules.items():
        if ours:        # the model's own parameters (a class token): the root records no output
            holders.setdefault(theirs, []).append(ours)
    return {theirs: cells for theirs, cells in holders.items() if not ran.intersection(cells)}


def _pinned_to_wrappers(pinned: Mapping[str, str], torch_records: Sequence[RecordInfo],
                        mindspore_records: Sequence[RecordInfo]) -> Dict[str, str]:
    """The parameters' pins, each moved from a MindSpore module to the one enclosing it that is
    named as its torch module, where that one reads torch's module's input and the inner one
    does not: a cell wrapping a LayerNorm between two transposes, as a port of torchvision's
    LayerNorm2d (ConvNeXt) writes it. The inner LayerNorm gives the same values channels last,
    and, where the feature map is as wide and high as it has channels, the same shape (a
    ConvNeXt-like pair's 32-channel stem at 128² failed at 6.4·10⁵× torch's float32 error,
    paired with it). A wrapper that reads the same input as the module inside it (an embedding
    scaled in a cell) leaves the pin inside: that wrapper's own work is what differs."""
    theirs = {r.name: r for r in torch_records}
    ours = {r.name: r for r in mindspore_records}
    moved: Dict[str, str] = {}
    for ms, torch_name in pinned.items():
        wraps = ms.startswith(torch_name + ".") and torch_name not in pinned and \
            _reads_input(ours.get(torch_name), theirs.get(torch_name)) and \
            not _reads_input(ours.get(ms), theirs.get(torch_name))
        moved[torch_name if wraps else ms] = torch_name
    return moved


def _applying_more(torch_records: Sequence[RecordInfo], ends: Mapping[str, str]) -> Set[str]:
    """The torch modules whose output is that of a module they hold (``ends``, _last_modules)
    that computes something after their own work (timm's BatchNormAct2d: its BatchNorm's
    weights, then its ``act``'s ReLU; one whose ``act`` is an Identity applies nothing more)."""
    ops = {r.name: r.op for r in torch_records}
    return {name for name, end in ends.items() if ops[end] != IDENTITY_OP}


def _reads_input(ms_record: Optional[RecordInfo], torch_record: Optional[RecordInfo]) -> bool:
    """Whether the first inputs' sketches agree to a hundredth of their norm, or integer ones
    (an embedding's ids) are equal."""
    if ms_record is None or torch_record is None:
        return False
    ids = [record.attrs.get("integer_input_crc32") for record in (torch_record, ms_record)]
    if ids != [None, None]:
        return ids[0] == ids[1]
    distance = sketch_distance(torch_record.attrs.get("input_sketch"),
                               ms_record.attrs.get("input_sketch"))
    return distance is not None and distance <= 1e-2


def _input_read_nowhere_else(torch_record: RecordInfo, ms_record: RecordInfo,
                             torch_records: Sequence[RecordInfo],
                             ms_records: Sequence[RecordInfo]) -> bool:
    """Whether both records' first inputs are sketched and neither is what a module of the
    other side reads."""
    if not torch_record.attrs.get("input_sketch") or not ms_record.attrs.get("input_sketch"):
        return False
    return not any(_reads_input(ms_record, other) for other in torch_records
                   if other is not torch_record) and \
        not any(_reads_input(other, torch_record) for other in ms_records
                if other is not ms_record)


class _Site(NamedTuple):
    """A forward record as the alignment compares it, worked out once: the alignment scores
    every (torch, MindSpore) pair, 33 thousand for ResNet50."""
    name: str
    base: str           # without the call index: layer1.0.relu#2 -> layer1.0.relu
    call: str           # the call index: "2", or "" for a module called once
    normalised: str
    op: str
    shape: Tuple[int, ...]
    layout: Tuple[int, ...]
    moved: Tuple[Tuple[int, ...], ...]      # the shape, its channels moved to the other end

    @classmethod
    def of(cls, record: RecordInfo) -> "_Site":
        base, _, call = record.name.partition("#")
        shape = tuple(record.shape)
        moved = tuple(tuple(shape[axis] for axis in order)
                      for order in _channels_moved(len(shape))) if len(shape) > 2 else ()
        return cls(record.name, base, call, normalise(record.name), record.op, shape,
                   layout(shape), moved)


def align_forward(torch_records: Sequence[RecordInfo], mindspore_records: Sequence[RecordInfo],
                  param_map: Mapping[str, str],
                  overrides: Optional[Mapping[str, str]] = None) -> Alignment:
    """Match forward records by execution order, operation type and output shape.

    Modules that own parameters are pinned by the parameter mapping; an override pins any name.
    """
    # the layers a port splits off torch's fused one are paired with its output's parts, and
    # torch's layers a port fuses with their parts of its fused one's
    split, joined = split_layers(param_map), joined_layers(param_map)
    torch_parted = {split_part(t)[0] for t in split.values()} | set(joined)
    ms_parted = set(split) | {split_part(m)[0] for m in joined.values()}
    all_torch_records, all_ms_records = torch_records, mindspore_records
    split_records = [r for r in mindspore_records if r.name.partition("#")[0] in split]
    joined_records = [r for r in torch_records if r.name.partition("#")[0] in joined]
    # the outputs a module returns apart that its counterpart returns concatenated
    modules = module_map_from_parameters(param_map)
    concatenated_in_torch = _outputs_concatenated_apart(mindspore_records, torch_records,
                                                        modules.items())
    concatenated_in_port = _outputs_concatenated_apart(
        torch_records, mindspore_records, [(t, m) for m, t in modules.items()])
    apart = set(concatenated_in_torch) | set(concatenated_in_port) | {
        split_part(name)[0] for name in [*concatenated_in_torch.values(),
                                         *concatenated_in_port.values()]}
    torch_records = [r for r in torch_records if r.name.partition("#")[0] not in torch_parted
                     and r.name not in apart]
    mindspore_records = [r for r in mindspore_records
                         if r.name.partition("#")[0] not in ms_parted and r.name not in apart]
    torch_sites = [_Site.of(r) for r in torch_records]
    ms_sites = [_Site.of(r) for r in mindspore_records]
    # A torch module applying more after its own work (_applying_more) pairs only with a
    # MindSpore cell whose output is a cell's it holds too, or with a cell of the user's own
    # (which may apply the same): not with a cell doing only that work (a BatchNorm, its ReLU a
    # cell after it), whose output is of another point, and to which its weights pinned it,
    # keeping torch's ReLU (recorded before the module holding it) from the port's (after its
    # BatchNorm): mindcv's port of timm's GhostNet failed there, "missing activation". It is
    # compared as the module it ends at (engine._compared_container).
    torch_ends, ms_ends = _last_modules(torch_records), _last_modules(mindspore_records)
    applying, ms_ending = _applying_more(torch_records, torch_ends), set(ms_ends)
    pinned = {ms: torch_name for ms, torch_name in _pinned_to_wrappers(
                  modules, torch_records, mindspore_records).items()
              if torch_name not in applying or ms in ms_ending}
    pinned.update(overrides or {})
    targets = [pinned.get(m.name, pinned.get(m.base)) for m in ms_sites]   # None: not pinned
    # a torch module whose weights only cells that never ran hold has no counterpart: Whisper's
    # decoder ported without its final layer_norm had torch's norm paired with the port's model
    # cell, the output it has there, and was told "computation between modules differs"
    never_run = cells_never_run(modules, all_ms_records)
    idle_targets = {i for i, t in enumerate(torch_sites) if module_of(t.base) in never_run}
    holders = _holders(modules)
    wrapping = _wrapping_containers(torch_records)

    def score(i: int, j: int) -> float:
        t, m, target = torch_sites[i], ms_sites[j], targets[j]
        pinned_here = None if target is None else target in (t.name, t.base) and t.call == m.call
        if i in idle_targets and not pinned_here:
            return 0.0
        # a container returning a container's output is the same point as that one: where the
        # port draws one container there, the other is left, never paired with the port's
        # operation after it (_wrapping_containers)
        if t.name in wrapping and m.op not in CONTAINER_OPS and not pinned_here:
            return 0.0
        if t.name in applying and m.name not in ms_ending and m.op != GENERIC_OP and \
                not pinned_here:
            return 0.0
        # one operation's output held channels last on one side: its values are torch's in
        # another layout. An identity's or a dropout's say only where it runs: timm's EdgeNeXt
        # drops after its MLP channels last, mindcv's port runs its Identity after transposing
        # back, and the two were paired (a correct port failing at 7·10³×).
        moved = m.shape in t.moved and t.op == m.op and t.op not in (IDENTITY_OP, *DROPPING_OPS)
        if t.layout != m.layout and not same_order(t.shape, m.shape) and not moved:
            same_module = pinned_here if pinned_here is not None else \
                t.op == m.op and t.normalised == m.normalised and t.call == m.call and \
                (t.op != GENERIC_OP or once_for_the_batch(t.shape, m.shape))
            return SHAPE_DIFFERS if same_module else 0.0
        if pinned_here is not None:
            return PINNED if pinned_here else 0.0
        if t.op == m.op == IDENTITY_OP and t.normalised != m.normalised:
            return 0.0
        if t.op == m.op:
            value = 3.0
        elif dropping_for_identity(t.op, m.op):
            value = 2.0
        elif IDENTITY_OP in (t.op, m.op) and t.normalised != m.normalised:
            return 0.0
        elif GENERIC_OP in (t.op, m.op):
            value = 1.0
        elif t.normalised == m.normalised:
            return 0.5        # the same place, another op (ReLU for ReLU6): paired, then flagged
        elif t.op in ACTIVATION_OPS and m.op in ACTIVATION_OPS and t.call == m.call:
            return ANOTHER_ACTIVATION
        else:
            return 0.0
        if t.normalised == m.normalised:
            value += 1.0
        if t.call == m.call:
            value += 0.5
        if GENERIC_OP in (t.op, m.op) and holders.get(m.base) == t.base:
            value += HOLDS_THE_SAME
        if GENERIC_OP in (t.op, m.op):
            # of equally scored records, the last: a module's output is its computation's
            # last step (torchvision's Swin attention returns what mindcv's roll_pos does, after
            # its roll_neg, window_partition, attn and window_reverse of that shape or order)
            value += LATER_GENERIC * j / len(ms_sites)
        return value

    pairs = align_sequences(len(torch_records), len(mindspore_records), score)
    # modules their weights pin together that the order kept apart, reading one input:
    # branches run in another order (timm's RepVGG runs its 1×1 branch first, mindcv's its
    # 3×3: they were left unmatched). A module run at another place reads another input, one a
    # module of the other side reads (a pre-norm layer's norm reads what a post-norm layer's
    # attention does), and stays apart; one whose input no module of the other side reads is
    # in its place, its input computed otherwise (a port of RWKV's feed-forward computing its
    # receptance before its value, with ReLU for torch's squared ReLU: its value and torch's
    # were left apart, and "operations run in another order" was said).
    paired_torch, paired_ms = {i for i, _ in pairs}, {j for _, j in pairs}
    for j, target in enumerate(targets):
        if target is None or j in paired_ms:
            continue
        i = next((i for i, t in enumerate(torch_sites) if i not in paired_torch
                  and target in (t.name, t.base) and t.call == ms_sites[j].call), None)
        if i is not None and score(i, j) == PINNED and (
                _reads_input(mindspore_records[j], torch_records[i])
                or _input_read_nowhere_else(torch_records[i], mindspore_records[j],
                                            torch_records, mindspore_records)):
            pairs.append((i, j))
            paired_torch.add(i)
    mapping = {mindspore_records[j].name: torch_records[i].name for i, j in pairs}
    for ms_name in _containers_ending_apart(mapping, torch_ends, ms_ends):
        del mapping[ms_name]
    torch_shapes = {r.name: r.shape for r in all_torch_records}
    for record in split_records:
        _, call, index = record.name.partition("#")
        whole, part = split_part(split[record.name.partition("#")[0]])
        whole_shape = torch_shapes.get(whole + call + index)
        mapping[record.name] = _along_the_axis_apart(part, whole_shape, record.shape).of(
            whole + call + index)
    ms_shapes = {r.name: r.shape for r in all_ms_records}
    for record in joined_records:
        _, call, index = record.name.partition("#")
        whole, part = split_part(joined[record.name.partition("#")[0]])
        if whole + call + index in ms_shapes:
            part = _along_the_axis_apart(part, ms_shapes[whole + call + index], record.shape)
            mapping[part.of(whole + call + index)] = record.name
    mapping.update(concatenated_in_torch)
    mapping.update((part, torch_name) for torch_name, part in concatenated_in_port.items())
    matched_torch = {split_part(name)[0] for name in mapping.values()}
    matched_ms = {split_part(name)[0] for name in mapping}
    return Alignment(
        mindspore_to_torch=mapping,
        unmatched_torch=tuple(r.name for r in all_torch_records if r.name not in matched_torch),
        unmatched_mindspore=tuple(r.name for r in all_ms_records if r.name not in matched_ms))


def _outputs_concatenated_apart(apart: Sequence[RecordInfo], whole: Sequence[RecordInfo],
                                module_pairs: Iterable[Tuple[str, str]]) -> Dict[str, str]:
    """Each output record (``block.out0``, hooks.output_names) of a module returning several
    on one side (``apart``) -> its part of the output of the module the other side's
    parameters inside it pair with (``module_pairs``: its side's module, the other's), where
    that module returns them concatenated along one axis, in order. timm's DPN block returns
    its residual and dense paths as one tensor, mindcv's as two: the two were unmatched, and
    torch's block was paired with the next block's BatchNorm. A container returning a module's
    output inside it (_computed_inside) is compared there: mindcv's DPN ``features`` returns its
    last block's two, timm's the BatchNorm and ReLU after it."""
    wholes = {r.name: r for r in whole}
    ends = _computed_inside(apart) | _computed_inside(whole)
    outputs: Dict[Tuple[str, str], List[Tuple[int, RecordInfo]]] = {}
    for record in apart:
        base, _, call = record.name.partition("#")
        found = re.fullmatch(r"(.+)\.out(\d+)", base)
        if found:
            outputs.setdefault((found[1], call), []).append((int(found[2]), record))
    pairs = list(module_pairs)
    parts: Dict[str, str] = {}
    for (module, call), numbered in outputs.items():
        inside = [other for mine, other in pairs
                  if mine == module or mine.startswith(module + ".")]
        counterpart = wholes.get(common_module(inside) + (f"#{call}" if call else "")) \
            if inside else None
        records = [record for _, record in sorted(numbered, key=lambda n: n[0])]
        if counterpart is None or ends & {counterpart.name, *(r.name for r in records)}:
            continue
        axis = _concatenation_axis(counterpart.shape, [r.shape for r in records])
        if axis is None:
            continue
        stops = accumulate(record.shape[axis] for record in records)
        for record, stop in zip(records, stops):
            part = Part(stop - record.shape[axis], stop,
                        LAST_AXIS if axis == len(counterpart.shape) - 1 else axis)
            parts[record.name] = part.of(counterpart.name)
    return parts


def _computed_inside(records: Sequence[RecordInfo]) -> Set[str]:
    """The records whose stored tensor is a record's inside their module too (a container
    returning a module's output, each of a tuple's, ``block.out0``, alike). Unlike
    _last_modules, a container inside counts (mindcv's DPN ``features.out0`` is its last
    block's ``out0``, a cell of the user's): the pairing and the flags built on _last_modules
    take a container's end to be the innermost module's."""
    by_tensor: Dict[Tuple[str, str], List[str]] = {}
    for record in records:
        by_tensor.setdefault((record.shard, record.key), []).append(record.name)
    inside = set()
    for names in by_tensor.values():
        for name in names:
            module = module_of(name.partition("#")[0]) + "."
            if any(other.startswith(module) for other in names if other != name):
                inside.add(name)
    return inside


def _concatenation_axis(whole: Sequence[int], pieces: Sequence[Sequence[int]]) -> Optional[int]:
    """The one axis along which ``pieces`` (two or more) concatenate to ``whole``'s shape."""
    axis = _the_axis_apart(whole, pieces) if len(pieces) > 1 else None
    return axis if axis is not None and sum(p[axis] for p in pieces) == whole[axis] else None


def _the_axis_apart(whole: Sequence[int], pieces: Sequence[Sequence[int]]) -> Optional[int]:
    """The one axis on which ``pieces``, each of ``whole``'s rank, differ from it in size;
    None where they differ on none or several."""
    if any(len(piece) != len(whole) for piece in pieces):
        return None
    differing = {axis for piece in pieces for axis, size in enumerate(piece)
                 if size != whole[axis]}
    return differing.pop() if len(differing) == 1 else None


def split_layers(param_map: Mapping[str, str]) -> Dict[str, str]:
    """MindSpore module -> the part of its torch module's output it computes, for each layer
    a port splits off a fused torch layer (each of its parameters the same rows of that layer's:
    mindcv's Swin's attn.q, "attn.qkv[..., 0:32]" for torchvision's attn.qkv)."""
    return _layers_of_parts(param_map.items())


def joined_layers(param_map: Mapping[str, str]) -> Dict[str, str]:
    """torch module -> the part of its MindSpore module's output it computes, for each torch
    layer a port fuses (each of its parameters the same rows of the port's: timm's class
    attention q, "attn.qkv[..., 0:32]" for mindcv's XCiT's attn.qkv); split_layers' reverse."""
    return _layers_of_parts((torch_name, ms_name) for ms_name, torch_name in param_map.items())


def _layers_of_parts(pairs: Iterable[Tuple[str, str]]) -> Dict[str, str]:
    """For (parameter, the other side's parameter or part of one) pairs: each module all of
    whose parameters are the same rows of the other side's module's weight and bias -> that
    part of its output (not rows of a tensor the module computes more from: an
    ``in_proj_weight``'s rows are no columns of nn.MultiheadAttention's output)."""
    outputs: Dict[str, set] = {}
    for name, other in pairs:
        whole, part = split_part(other)
        outputs.setdefault(split_param(split_part(name)[0])[0], set()).add(
            Part(part.start, part.stop, LAST_AXIS).of(split_param(whole)[0])
            if part and _rows_of_a_layer(other) else "")
    return {module: names.pop() for module, names in outputs.items()
            if len(names) == 1 and "" not in names}


def _rows_of_a_layer(name: str) -> bool:
    """Whether ``name`` is a whole parameter, or rows of a layer's weight or bias (whose
    output's columns they compute): not rows of a tensor the module computes more from
    (nn.MultiheadAttention's ``in_proj_weight``)."""
    whole, part = split_part(name)
    return part is None or split_param(torch_role(whole))[1] in ("weight", "bias")


def _along_the_axis_apart(part: Part, whole: Optional[Sequence[int]],
                          piece: Sequence[int]) -> Part:
    """``part`` of a fused layer's output along the one axis where its size (``whole``) and
    that of the output of the layer computing those rows (``piece``) differ: a Linear's last, a
    conv's channels (1). Along the last where they differ on none or several (then compared as
    shapes that differ)."""
    axis = _the_axis_apart(whole, [piece]) if whole is not None else None
    return replace(part, axis=LAST_AXIS if axis in (None, len(piece) - 1) else axis)


def _containers_ending_apart(mapping: Mapping[str, str], torch_ends: Mapping[str, str],
                             ms_ends: Mapping[str, str]) -> List[str]:
    """The MindSpore containers paired with torch containers that end (_last_modules) at
    modules which are not each other's pair. A container's output is its last module's, stored
    once for both names; where the two sides draw the container around other modules, their
    outputs are of different points in the same computation. torchvision's DenseNet
    ``features`` ends at its ``norm5`` and applies the ReLU in its forward, mindcv's at a
    ``relu5`` it holds: the correct port failed at ``features`` ("extra operation in the
    port"), every record after it passing. The modules inside are compared as they are paired."""
    return [ms_name for ms_name, torch_name in mapping.items()
            if ms_name in ms_ends and torch_name in torch_ends
            and mapping.get(ms_ends[ms_name]) != torch_ends[torch_name]]


def _wrapping_containers(records: Sequence[RecordInfo]) -> Set[str]:
    """The containers whose output is that of a container inside them (one stored tensor):
    timm's ResNetV2 stage returns its ``blocks``'. Paired with the port's GroupNorm beginning
    the next stage (mindcv's BiT, one container there, timm's norm computed inside its
    GroupNormAct), a correct port failed at 3.5·10⁵× torch's float32 error."""
    containers: Dict[Tuple[str, str], List[str]] = {}
    for record in records:
        if record.op in CONTAINER_OPS:
            containers.setdefault((record.shard, record.key), []).append(record.name)
    return {name for names in containers.values() for name in names
            if any(other.startswith(name.split("#")[0] + ".") for other in names)}


def _last_modules(records: Sequence[RecordInfo]) -> Dict[str, str]:
    """Container name -> the module inside it whose output it returns (the same stored tensor),
    for each container returning one."""
    stored: Dict[Tuple[str, str], List[RecordInfo]] = {}
    for record in records:
        if record.op not in CONTAINER_OPS:
            stored.setdefault((record.shard, record.key), []).append(record)
    ends: Dict[str, str] = {}
    for container in records:
        prefix = container.name.split("#")[0] + "."
        inside = [r for r in stored.get((container.shard, container.key), [])
                  if r.name.startswith(prefix)] if container.op in CONTAINER_OPS else []
        if inside:
            ends[container.name] = max(inside, key=lambda r: r.order).name
    return ends
