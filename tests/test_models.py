"""The MindSpore ResNet port matches torchvision, and the weight transfer is validated."""

from __future__ import annotations

import re

import mindspore as ms
import numpy as np
import pytest
import torch
import torchvision

from models import PAIRS, get_pair
from models import resnet_mindspore as port
from parity.errors import ParityInputError
from parity.records import split_part, value_of
from parity.weights import (TransferRefused, load_into_mindspore, mindspore_param_specs,
                            plan_transfer)

DEPTHS = (18, 34, 50, 101, 152)
# Eval-mode forward, batch 2 × 3 × 64², seeded torchvision init: measured
# max|ms - torch| / max|torch| <= 7.9e-7 for every depth (torch's own float32 error against a
# float64 run is the same size, <= 8.5e-7). 1e-5 is ~10x that; a wrong padding, eps or missing
# op gives >= 1e-3.
EVAL_RTOL = 1e-5


def _pair(depth: int, seed: int = 0):
    torch.manual_seed(seed)
    reference = getattr(torchvision.models, f"resnet{depth}")(num_classes=10).eval()
    net = getattr(port, f"resnet{depth}")(num_classes=10)
    return reference, net


def _state_dict(model):
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("depth", DEPTHS)
def test_eval_forward_matches_torchvision(depth):
    ms.set_context(mode=ms.PYNATIVE_MODE)
    reference, net = _pair(depth)
    mapping = load_into_mindspore(net, _state_dict(reference)).plan
    net.set_train(False)
    x = np.random.default_rng(depth).standard_normal((2, 3, 64, 64)).astype(np.float32)
    expected = reference(torch.from_numpy(x)).detach().numpy()
    actual = net(ms.Tensor(x)).asnumpy()
    assert actual.shape == expected.shape == (2, 10)
    assert np.abs(actual - expected).max() <= EVAL_RTOL * np.abs(expected).max()
    assert len(mapping) == len(mindspore_param_specs(net))


def test_parameter_dtypes_are_named_as_numpy_names_them_without_a_deprecated_call(monkeypatch):
    """They came from ms.dtype_to_nptype, which logs "deprecated from version 2.7" at each call
    (unless GLOG_v silences it): a line per parameter on the console of every parity.check."""
    def deprecated(_dtype):
        raise AssertionError("ms.dtype_to_nptype is deprecated since MindSpore 2.7")

    monkeypatch.setattr(ms, "dtype_to_nptype", deprecated)
    cell = ms.nn.Cell()
    for dtype in (ms.float32, ms.float16, ms.float64, ms.int32, ms.int64, ms.uint8, ms.bool_):
        name = f"p_{dtype}".lower()
        setattr(cell, name, ms.Parameter(ms.Tensor(np.zeros(2), dtype), name=name))
    specs = mindspore_param_specs(cell)
    assert {dtype for _, _, dtype in specs} == \
        {"float32", "float16", "float64", "int32", "int64", "uint8", "bool"}
    assert all(np.dtype(dtype).name == dtype for _, _, dtype in specs)


def test_mobilenet_v2_port_matches_torchvision_by_name_and_in_eval():
    from models.mobilenet_mindspore import mobilenet_v2
    ms.set_context(mode=ms.PYNATIVE_MODE)
    torch.manual_seed(0)
    reference = torchvision.models.mobilenet_v2(num_classes=10).eval()
    net = mobilenet_v2(num_classes=10)
    assert {n for n, _ in net.cells_and_names() if n} == \
        {n for n, _ in reference.named_modules() if n}
    load_into_mindspore(net, _state_dict(reference))
    net.set_train(False)
    x = np.random.default_rng(0).standard_normal((2, 3, 64, 64)).astype(np.float32)
    expected = reference(torch.from_numpy(x)).detach().numpy()
    actual = net(ms.Tensor(x)).asnumpy()
    assert np.abs(actual - expected).max() <= EVAL_RTOL * np.abs(expected).max()


def test_registry_names_every_depth():
    assert set(PAIRS) == {f"resnet{d}" for d in DEPTHS} | {"mobilenet_v2"}
    assert get_pair("resnet50").mindspore_factory == "models.resnet_mindspore:resnet50"
    with pytest.raises(KeyError, match="resnet18"):
        get_pair("vgg16")


def test_cell_names_follow_torchvision():
    reference, net = _pair(50)
    torch_modules = {name for name, _ in reference.named_modules() if name}
    ms_cells = {name for name, _ in net.cells_and_names() if name}
    assert ms_cells == torch_modules


def test_bn_momentum_is_converted():
    """torch momentum 0.1 weights the new value; MindSpore's 0.9 weights the old one."""
    net = port.resnet18()
    assert port.torch_to_mindspore_bn_momentum(0.1) == pytest.approx(0.9)
    # MindSpore stores 1 - momentum internally, i.e. torch's convention
    assert float(net.bn1.momentum) == pytest.approx(0.1)
    assert net.bn1.eps == pytest.approx(1e-5)


def _specs():
    reference, net = _pair(18)
    return _state_dict(reference), mindspore_param_specs(net)


def test_transfer_maps_bn_names_and_drops_step_counter():
    state_dict, specs = _specs()
    plan = plan_transfer(state_dict, specs)
    assert plan["bn1.gamma"] == "bn1.weight"
    assert plan["layer1.0.bn2.moving_variance"] == "layer1.0.bn2.running_var"
    assert not any(v.endswith("num_batches_tracked") for v in plan.values())


@pytest.mark.parametrize("module", ["bn1", "stem.norm"])
def test_a_port_s_step_counter_takes_torch_s(module):
    """mindspore.mint.nn's BatchNorm2d keeps torch's names and a num_batches_tracked of its own
    (with momentum=None its update is a cumulative average over that count): the transfer
    refused it as a missing key. It takes the counter of the torch module its other tensors
    come from; a port's counter torch lacks starts at zero, as torch's would."""
    import mindspore.mint.nn as mint_nn
    import mindspore.nn as msnn

    from parity.weights import load_into_mindspore

    class Port(msnn.Cell):
        def __init__(self) -> None:
            super().__init__()
            norm = mint_nn.BatchNorm2d(4)
            if module == "bn1":
                self.bn1 = norm
            else:
                self.stem = msnn.SequentialCell()
                self.stem.norm = norm
            self.other = mint_nn.BatchNorm2d(4)

    state_dict = {"bn1.weight": np.full(4, 2.0, np.float32), "bn1.bias": np.zeros(4, np.float32),
                  "bn1.running_mean": np.zeros(4, np.float32),
                  "bn1.running_var": np.ones(4, np.float32),
                  "bn1.num_batches_tracked": np.array(7, np.int64),
                  "other.weight": np.ones(4, np.float32), "other.bias": np.zeros(4, np.float32),
                  "other.running_mean": np.zeros(4, np.float32),
                  "other.running_var": np.ones(4, np.float32)}
    net = Port()
    transfer = load_into_mindspore(net, state_dict)
    params = dict(net.parameters_and_names())
    assert transfer.plan[f"{module}.num_batches_tracked"] == "bn1.num_batches_tracked"
    assert "other.num_batches_tracked" not in transfer.plan
    assert int(params[f"{module}.num_batches_tracked"].asnumpy()) == 7
    assert int(params["other.num_batches_tracked"].asnumpy()) == 0
    assert transfer.left_out == []


def test_transfer_refuses_missing_key():
    state_dict, specs = _specs()
    del state_dict["layer2.1.conv1.weight"]
    with pytest.raises(ParityInputError, match=r"layer2\.1\.conv1\.weight.*missing key"):
        plan_transfer(state_dict, specs)


def test_transfer_names_a_class_count_only_when_every_problem_is_one():
    state_dict, specs = _specs()
    state_dict["fc.weight"] = np.zeros((100, 512), np.float32)      # the port has 10 classes
    state_dict["fc.bias"] = np.zeros((100,), np.float32)
    with pytest.raises(ParityInputError, match=r"Weights of a 100-class model\? Pass "
                                               r"--num-classes 100") as told:
        plan_transfer(state_dict, specs)
    assert "Fix the weights" not in str(told.value)
    del state_dict["layer2.1.conv1.weight"]         # a missing key too: not only the classes
    with pytest.raises(ParityInputError, match="Fix the weights or the port") as told:
        plan_transfer(state_dict, specs)
    assert "class" not in str(told.value)


def test_a_part_only_one_model_is_built_with_is_named_once():
    """mindcv's InceptionV3 holds an auxiliary classifier, timm's is built without: the
    refusal listed its parameters one by one (its norms as norms torch's model lacks). Where
    every parameter left lies on one side, in modules inside one of which nothing pairs, that
    one is named; not where they lie apart, or where something inside it pairs."""
    state_dict, specs = _specs()
    aux = [("aux.conv.weight", (8, 512, 1, 1)), ("aux.bn.gamma", (8,)), ("aux.bn.beta", (8,)),
           ("aux.fc.weight", (10, 8)), ("aux.fc.bias", (10,))]
    with pytest.raises(ParityInputError, match=r"All 5 missing keys lie in the port's aux, of "
                       r"which nothing pairs: a part torch's model is built without \(an "
                       r"auxiliary classifier, another head\?\); build both with the same "
                       r"parts$"):
        plan_transfer(state_dict, specs + [(n, s, "float32") for n, s in aux])
    torch_aux = {f"AuxLogits.{name[4:]}": np.zeros(shape, np.float32) for name, shape in aux}
    with pytest.raises(ParityInputError, match=r"All 5 extra keys lie in torch's AuxLogits, "
                       r"of which nothing pairs: a part the port is built without"):
        plan_transfer({**state_dict, **torch_aux}, specs)
    apart = [(name.replace("aux.fc", "head2"), shape) for name, shape in aux]
    with pytest.raises(ParityInputError, match="Fix the weights or the port"):
        plan_transfer(state_dict, specs + [(n, s, "float32") for n, s in apart])
    with pytest.raises(ParityInputError, match="Fix the weights or the port"):
        plan_transfer({**state_dict, **torch_aux}, specs + [("AuxLogits.fc.weight", (10, 8),
                                                            "float32")])


def test_a_constant_torch_holds_as_a_buffer_goes_to_the_ports_frozen_one():
    """torchvision's SwinV2 holds its relative coordinates table as a float buffer of its
    attention, mindcv's as a frozen parameter of a cell inside it: left on both sides, torch's
    kept the attention's logit_scale from pairing (refused, 65 problems). A tensor left in the
    torch module holding what the port's cell around the constant pairs with, of its name and
    shape, takes it now; an integer index of another shape stays the port's own."""
    state_dict = {"attn.logit_scale": np.zeros((3, 1, 1), np.float32),
                  "attn.relative_coords_table": np.ones((1, 15, 15, 2), np.float32),
                  "attn.relative_position_index": np.zeros(64, np.int64),
                  "attn.proj.weight": np.zeros((8, 8), np.float32),
                  "attn.cpb_mlp.0.weight": np.zeros((16, 2), np.float32)}
    specs = [("attn.logit_scale", (3, 1, 1), "float32"),
             ("attn.bias.relative_coords_table", (1, 15, 15, 2), "float32"),
             ("attn.bias.relative_position_index", (8, 8), "int32"),
             ("attn.bias.cpb_mlp0.weight", (16, 2), "float32"),
             ("attn.proj.weight", (8, 8), "float32")]
    frozen = {"attn.bias.relative_coords_table", "attn.bias.relative_position_index"}
    plan = plan_transfer(state_dict, specs, frozen=frozen)
    assert plan["attn.bias.relative_coords_table"] == "attn.relative_coords_table"
    assert plan["attn.logit_scale"] == "attn.logit_scale"
    assert "attn.bias.relative_position_index" not in plan
    # refused for a tensor left elsewhere: the constant that took torch's is not listed
    with pytest.raises(ParityInputError, match="extra key") as refused:
        plan_transfer({**state_dict, "other.weight": np.zeros(3, np.float32)}, specs,
                      frozen=frozen)
    assert "relative_coords_table" not in str(refused.value)


def test_transfer_refuses_extra_key():
    state_dict, specs = _specs()
    state_dict["head.extra.weight"] = np.zeros((3, 3), np.float32)
    with pytest.raises(ParityInputError, match=r"head\.extra\.weight.*extra key"):
        plan_transfer(state_dict, specs)


def test_a_refusal_of_many_problems_lists_each_kind():
    """mindcv's GoogLeNet (no BatchNorm, 5×5 convs where torchvision's are 3×3) was refused
    with 246 problems, the six listed all its 5×5 convs' missing keys: torchvision's 237 extra
    BatchNorm tensors went unseen."""
    state_dict, specs = _specs()
    for name in [k for k in state_dict if k.startswith("layer2.") and k.endswith(".weight")][:8]:
        del state_dict[name]
    for index in range(8):
        state_dict[f"head.extra{index}.weight"] = np.zeros((3, 3), np.float32)
    with pytest.raises(ParityInputError, match=r"16 problem\(s\) \(8 missing keys, 8 extra "
                                               r"keys\): ") as refused:
        plan_transfer(state_dict, specs)
    listed = str(refused.value).split(" and 10 more")[0]
    assert listed.count("(missing key)") == listed.count("(extra key)") == 3


def test_a_fused_projection_the_port_splits_goes_to_its_layers_in_parts():
    """mindcv's Swin holds q, k and v layers for torchvision's fused qkv: its transfer was
    refused, the fused tensors listed as extra keys, the split ones as missing, and torch's
    proj given to the port's q (same shapes, in order). Each layer now takes its rows, named
    as torch indexes them, and proj takes proj."""
    f32 = np.float32
    state_dict = {"blocks.0.attn.qkv.weight": np.arange(48, dtype=f32).reshape(12, 4),
                  "blocks.0.attn.qkv.bias": np.arange(12, dtype=f32),
                  "blocks.0.attn.proj.weight": np.zeros((4, 4), f32),
                  "blocks.0.attn.proj.bias": np.zeros(4, f32)}
    specs = [(f"layers.0.attn.{layer}.{role}", (4, 4) if role == "weight" else (4,), "float32")
             for layer in ("q", "k", "v", "proj") for role in ("weight", "bias")]
    plan = plan_transfer(state_dict, specs)
    assert plan == {**{f"layers.0.attn.{layer}.{role}": f"blocks.0.attn.qkv.{role}[{start}:"
                       f"{start + 4}]" for layer, start in (("q", 0), ("k", 4), ("v", 8))
                       for role in ("weight", "bias")},
                    "layers.0.attn.proj.weight": "blocks.0.attn.proj.weight",
                    "layers.0.attn.proj.bias": "blocks.0.attn.proj.bias"}
    assert np.array_equal(value_of(state_dict, plan["layers.0.attn.k.weight"]),
                          state_dict["blocks.0.attn.qkv.weight"][4:8])
    # rows that do not add up to torch's are no split of it: refused as before
    specs[4] = ("layers.0.attn.v.weight", (3, 4), "float32")
    with pytest.raises(ParityInputError, match=r"torch tensor blocks\.0\.attn\.qkv\.weight "
                                               r"\(12, 4\) is used by no MindSpore parameter"):
        plan_transfer(state_dict, specs)


@pytest.mark.parametrize("layers", [("q", "k", "v"), ("query", "key", "value")])
def test_torch_layers_the_port_fuses_go_to_its_parameter_in_parts(layers):
    """mindcv's XCiT holds one qkv layer for timm's class attention q, k and v (a port may
    fuse BERT's query, key and value alike): its transfer was refused. Each torch tensor now
    goes to its rows of the port's parameter, named so on the port's side, and the loaded
    parameter holds them stacked in order."""
    f32 = np.float32
    state_dict = {f"blocks.0.attn.{layer}.{role}":
                  np.arange(16 if role == "weight" else 4, dtype=f32).reshape(
                      (4, 4) if role == "weight" else (4,)) + 100 * index
                  for index, layer in enumerate((*layers, "proj"))
                  for role in ("weight", "bias")}
    specs = [(f"cls.0.attn.{layer}.{role}", (rows, 4) if role == "weight" else (rows,),
              "float32") for layer, rows in (("qkv", 12), ("proj", 4))
             for role in ("weight", "bias")]
    plan = plan_transfer(state_dict, specs)
    assert plan == {**{f"cls.0.attn.qkv.{role}[{start}:{start + 4}]":
                       f"blocks.0.attn.{layer}.{role}"
                       for layer, start in zip(layers, (0, 4, 8))
                       for role in ("weight", "bias")},
                    "cls.0.attn.proj.weight": "blocks.0.attn.proj.weight",
                    "cls.0.attn.proj.bias": "blocks.0.attn.proj.bias"}
    port = ms.nn.SequentialCell()
    port.attn = ms.nn.SequentialCell()
    port.attn.qkv, port.attn.proj = ms.nn.Dense(4, 12), ms.nn.Dense(4, 4)
    transfer = load_into_mindspore(port, {name.replace("blocks.0.", ""): value
                                          for name, value in state_dict.items()})
    assert transfer.plan["attn.qkv.bias[8:12]"] == f"attn.{layers[2]}.bias"
    np.testing.assert_array_equal(
        port.attn.qkv.weight.asnumpy(),
        np.concatenate([state_dict[f"blocks.0.attn.{layer}.weight"] for layer in layers]))
    # rows that do not add up to the port's are no fusion of them: refused as before
    specs[0] = ("cls.0.attn.qkv.weight", (11, 4), "float32")
    with pytest.raises(ParityInputError, match=r"MindSpore parameter cls\.0\.attn\.qkv\.weight "
                                               r"\(11, 4\) receives no torch tensor"):
        plan_transfer(state_dict, specs)


# the --map lines the refusal suggests for _dual_path_weights
DUAL_PATH_ROWS = {"b.c1x1_main.weight": "block.c1x1.weight[0:8]",
                  "b.c1x1_side.weight": "block.c1x1.weight[8:12]",
                  "b.gate_up.weight[0:6]": "block.gate.weight",
                  "b.gate_up.weight[6:12]": "block.up.weight",
                  "b.gate_up.bias[0:6]": "block.gate.bias", "b.gate_up.bias[6:12]": "block.up.bias"}


def _dual_path_weights():
    """timm's DPN-like block: one conv whose rows two paths read (``c1x1``); a port holds
    them as two convs (``c1x1_main``, ``c1x1_side``) and fuses torch's ``gate`` and ``up``
    layers as one (``gate_up``): names no rule pairs."""
    f32 = np.float32
    state_dict = {"block.c1x1.weight": np.arange(96, dtype=f32).reshape(12, 8, 1, 1),
                  "block.gate.weight": np.ones((6, 8), f32), "block.gate.bias": np.ones(6, f32),
                  "block.up.weight": np.zeros((6, 8), f32), "block.up.bias": np.zeros(6, f32),
                  "block.head.weight": np.zeros((10, 6), f32),
                  "block.head.bias": np.zeros(10, f32)}
    specs = [("b.c1x1_main.weight", (8, 8, 1, 1), "float32"),
             ("b.c1x1_side.weight", (4, 8, 1, 1), "float32"),
             ("b.gate_up.weight", (12, 8), "float32"), ("b.gate_up.bias", (12,), "float32"),
             ("b.head.weight", (10, 6), "float32"), ("b.head.bias", (10,), "float32")]
    return state_dict, specs


def test_a_refused_transfer_suggests_the_rows_one_side_holds_stacked():
    """timm's DPN holds each block's ``c1x1_w_s1`` as one conv, mindcv's port as
    ``c1x1_w_r`` and ``c1x1_w_d``: the transfer was refused naming 68 missing and 34 extra keys,
    with no way forward but writing a map by hand. The refusal now names the first tensor that
    stacks the other side's, the --map lines taking its rows (in the order the other side
    declares them), and carries them all."""
    state_dict, specs = _dual_path_weights()
    with pytest.raises(TransferRefused) as refused:
        plan_transfer(state_dict, specs)
    assert refused.value.suggested_map == DUAL_PATH_ROWS
    assert "torch's block.c1x1.weight (12, 8, 1, 1) may hold the port's b.c1x1_main.weight " \
        "(8 rows) and b.c1x1_side.weight (4 rows) stacked (and 2 more tensor(s) alike): if it " \
        "computes them so, in this order, map their rows with --map FILE: " \
        '"b.c1x1_main.weight" = "block.c1x1.weight[0:8]", "b.c1x1_side.weight" = ' \
        '"block.c1x1.weight[8:12]"' in str(refused.value)
    # the map it suggests is taken: each part its rows, the fused parameter stacked in order
    plan = plan_transfer(state_dict, specs, overrides=refused.value.suggested_map)
    assert plan == {**refused.value.suggested_map, "b.head.weight": "block.head.weight",
                    "b.head.bias": "block.head.bias"}
    np.testing.assert_array_equal(value_of(state_dict, plan["b.c1x1_side.weight"]),
                                  state_dict["block.c1x1.weight"][8:])
    # two sets of the port's tensors adding up to torch's: no guess
    specs.insert(2, ("b.c1x1_other.weight", (4, 8, 1, 1), "float32"))
    with pytest.raises(TransferRefused) as ambiguous:
        plan_transfer(state_dict, specs)
    assert "block.c1x1.weight" not in " ".join(ambiguous.value.suggested_map.values())


@pytest.mark.parametrize("rows, problem", [
    ({"b.c1x1_main.weight": "block.c1x1.weight[0:8]",
      "b.c1x1_side.weight": "block.c1x1.weight[7:11]"},
     r"torch tensor block\.c1x1\.weight is mapped in parts \[0:8\], \[7:11\], which do not "
     r"cover its 12 rows once each"),
    ({"b.gate_up.weight[0:6]": "block.gate.weight", "b.gate_up.weight[8:14]": "block.up.weight"},
     r"MindSpore parameter b\.gate_up\.weight is mapped in parts \[0:6\], \[8:14\]"),
    ({"b.c1x1_main.weight": "block.c1x1.weight[:, 0:8]",
      "b.c1x1_side.weight": "block.c1x1.weight[:, 8:12]"},
     r"mapped in parts of an axis other than its first \(\[0:8\], \[8:12\]\): name a "
     r"parameter's rows, block\.c1x1\.weight\[start:stop\]")])
def test_mapped_rows_must_cover_a_tensor_once(rows, problem):
    """Rows a --map gives that leave some of a tensor's out or take some twice would load
    a parameter partly (or raise in numpy's concatenate): refused, naming them."""
    state_dict, specs = _dual_path_weights()
    replaced = {split_part(name)[0] for pair in rows.items() for name in pair}
    kept = {ms: t for ms, t in DUAL_PATH_ROWS.items()
            if not {split_part(ms)[0], split_part(t)[0]} & replaced}
    with pytest.raises(TransferRefused, match=problem):
        plan_transfer(state_dict, specs, overrides={**kept, **rows})


@pytest.mark.parametrize("fused, values", [("qk", "val"), ("fused", "v")])
def test_fused_queries_and_keys_go_to_the_port_layers_they_hold(fused, values):
    """timm's ConViT holds q and k as ``qk`` beside ``v``, mindcv's q, k and v: ``qk`` went to
    the port's k and v (they add up alike), and timm's v to the port's q. Parts go first to the
    layers whose names spell the fused one's (``qk``), and never to a parameter that took
    torch's tensor of its own name (``v``); either tells them apart here."""
    f32 = np.float32
    state_dict = {f"attn.{fused}.weight": np.arange(32, dtype=f32).reshape(8, 4),
                  f"attn.{values}.weight": np.ones((4, 4), f32),
                  "attn.proj.weight": np.zeros((4, 4), f32)}
    specs = [(f"attn.{layer}.weight", (4, 4), "float32") for layer in ("q", "k", "v", "proj")]
    assert plan_transfer(state_dict, specs) == {
        "attn.q.weight": f"attn.{fused}.weight[0:4]", "attn.k.weight": f"attn.{fused}.weight[4:8]",
        "attn.v.weight": f"attn.{values}.weight", "attn.proj.weight": "attn.proj.weight"}


def test_a_frozen_parameter_of_the_port_no_torch_tensor_feeds_keeps_its_values():
    """mindcv's Swin holds its relative position index (a one-hot matrix) and its window mask
    as frozen parameters, which torchvision computes or holds as integer tensors: refused as
    missing keys, they are the port's constants now (and its relative position table, which
    the index stood beside, is paired with torch's). Where torch holds a tensor no parameter
    took, they are named with it."""
    f32 = np.float32
    state_dict = {"attn.table": np.zeros(7, f32), "attn.index": np.zeros((4, 4), np.int64),
                  "fc.weight": np.zeros((3, 4), f32)}
    specs = [("attn.bias.table", (7,), "float32"), ("attn.bias.index", (16, 7), "float32"),
             ("fc.weight", (3, 4), "float32")]
    with pytest.raises(ParityInputError, match=r"attn\.bias\.index \(16, 7\) receives no"):
        plan_transfer(state_dict, specs)
    plan = plan_transfer(state_dict, specs, frozen={"attn.bias.index"})
    assert plan == {"attn.bias.table": "attn.table", "fc.weight": "fc.weight"}
    state_dict["attn.mask"] = np.zeros((4, 4), f32)
    with pytest.raises(ParityInputError) as refused:
        plan_transfer(state_dict, specs, frozen={"attn.bias.index"})
    assert "attn.mask (4, 4) is used by no MindSpore parameter" in str(refused.value)
    assert "attn.bias.index (16, 7) (frozen) receives no torch tensor" in str(refused.value)


def test_an_integer_or_boolean_constant_the_port_computes_itself_is_left_out():
    """Swin's relative_position_index, BERT's position_ids, GPT-2's causal mask: integer and
    boolean torch buffers a port holds as plain tensors, not parameters. The transfer refused
    such a port ("extra key"); a float tensor without a taker is still refused."""
    state_dict, specs = _specs()
    state_dict["layer1.0.index"] = np.arange(16, dtype=np.int64).reshape(4, 4)
    state_dict["layer1.0.mask"] = np.tril(np.ones((4, 4), bool))
    plan = plan_transfer(state_dict, specs)
    assert "layer1.0.index" not in plan.values() and "layer1.0.mask" not in plan.values()
    state_dict["layer1.0.table"] = np.zeros(7, np.float32)
    with pytest.raises(ParityInputError, match=r"1 problem\(s\): torch tensor layer1\.0\.table "
                                               r"\(7,\) is used by no MindSpore parameter"):
        plan_transfer(state_dict, specs)


def test_transfer_refuses_wrong_shape():
    state_dict, specs = _specs()
    state_dict["fc.weight"] = np.zeros((11, 512), np.float32)
    with pytest.raises(ParityInputError, match=r"fc\.weight: torch shape \(11, 512\)"):
        plan_transfer(state_dict, specs)


def test_transfer_takes_a_shape_of_the_same_layout_and_no_other():
    """MindSpore's Conv1d weight is (out, in, 1, k) for torch's (out, in, k): the same values
    in the same order. A weight whose sizes differ is still refused."""
    specs = [("conv.weight", (8, 3, 1, 3), "float32"), ("conv.bias", (8,), "float32")]
    state_dict = {"conv.weight": np.zeros((8, 3, 3), np.float32),
                  "conv.bias": np.zeros(8, np.float32)}
    assert plan_transfer(state_dict, specs) == {"conv.weight": "conv.weight",
                                                "conv.bias": "conv.bias"}
    state_dict["conv.weight"] = np.zeros((8, 3, 1), np.float32)
    with pytest.raises(ParityInputError, match=r"conv\.weight: torch shape \(8, 3, 1\)"):
        plan_transfer(state_dict, specs)


def test_a_layernorm_for_a_norm_holding_a_weight_alone_is_told_of_rms_norms():
    """Hugging Face's T5LayerNorm (an RMS norm: a weight, no bias) ported as nn.LayerNorm: its
    beta was a missing key, nothing more said."""
    specs = [("fc.weight", (8, 8), "float32"), ("norm.gamma", (8,), "float32"),
             ("norm.beta", (8,), "float32")]
    state_dict = {"fc.weight": np.zeros((8, 8), np.float32),
                  "norm.weight": np.ones(8, np.float32)}
    with pytest.raises(ParityInputError, match=r"norm\.beta \(8,\) receives no torch tensor "
                       r"\(missing key\): torch's norm holds a weight and no bias\. A norm "
                       r"holding a weight alone is an RMS norm") as refused:
        plan_transfer(state_dict, specs)
    assert "not nn.LayerNorm" in str(refused.value)
    state_dict["norm.bias"] = np.zeros(8, np.float32)
    assert plan_transfer(state_dict, specs)["norm.beta"] == "norm.bias"


def test_a_port_holding_copies_of_a_module_torch_holds_once_is_told_so():
    """Hugging Face's ALBERT calls one layer group for each layer; a port holding a group for
    each was refused with its missing keys alone."""
    layer = [("fc.weight", (8, 8)), ("fc.bias", (8,)), ("norm.gamma", (8,))]
    specs = [(f"groups.{i}.{name}", shape, "float32") for i in range(3) for name, shape in layer]
    state_dict = {"groups.0.fc.weight": np.zeros((8, 8), np.float32),
                  "groups.0.fc.bias": np.zeros(8, np.float32),
                  "groups.0.norm.weight": np.ones(8, np.float32)}
    with pytest.raises(ParityInputError, match=r"The 6 missing keys lie in the port's groups\.1, "
                       r"groups\.2: copies of its groups\.0 \(the same parameters, of the same "
                       r"shapes\), which alone took torch's tensors\. torch holds that module "
                       r"once: it calls it for each layer"):
        plan_transfer(state_dict, specs)
    # a copy of another shape is no copy
    specs[-1] = ("groups.2.norm.gamma", (4,), "float32")
    with pytest.raises(ParityInputError) as refused:
        plan_transfer(state_dict, specs)
    assert "copies of" not in str(refused.value)


def test_transfer_takes_the_same_name_first_and_leaves_out_only_what_it_is_told():
    """A parameter named gamma on both sides (a LayerScale) was renamed weight on the MindSpore
    side, found nothing, and the transfer was refused. A BatchNorm(affine=False)'s frozen
    gamma and beta take no torch tensor when they are said to be left out, and only then."""
    specs = [("ls.gamma", (8,), "float32"), ("act.w", (1,), "float32"),
             ("bn.gamma", (8,), "float32"), ("bn.beta", (8,), "float32"),
             ("bn.moving_mean", (8,), "float32"), ("bn.moving_variance", (8,), "float32")]
    state_dict = {"ls.gamma": np.zeros(8, np.float32), "act.weight": np.zeros(1, np.float32),
                  "bn.running_mean": np.zeros(8, np.float32),
                  "bn.running_var": np.ones(8, np.float32)}
    assert plan_transfer(state_dict, specs, left_out={"bn.gamma", "bn.beta"}) == {
        "ls.gamma": "ls.gamma", "act.w": "act.weight", "bn.moving_mean": "bn.running_mean",
        "bn.moving_variance": "bn.running_var"}
    # trainable there: torch's norm has no weight or bias, and the refusal says to freeze them
    with pytest.raises(ParityInputError, match=r"bn\.gamma \(8,\) receives no torch tensor "
                       r"\(missing key\): torch's bn has no weight or bias \(a norm built with "
                       r"affine=False or elementwise_affine=False\); freeze the port's bn\.gamma "
                       r"and bn\.beta \(requires_grad=False\)"):
        plan_transfer(state_dict, specs)
    # a port of another architecture: torch holds nothing beside that norm (in its block), and
    # nothing says it is a norm without weight or bias
    nested = [(f"block.{name}", shape, dtype) for name, shape, dtype in specs]
    with pytest.raises(ParityInputError, match=r"block\.bn\.gamma \(8,\) receives no torch "
                       r"tensor \(missing key\); ") as refused:
        plan_transfer(state_dict, nested)
    assert "affine=False" not in str(refused.value)
    # a norm only the port has: its running statistics receive nothing either (mindcv's
    # ResNetV2 holds one after its stem, timm's none)
    extra = specs + [(f"extra.{role}", (8,), "float32")
                     for role in ("gamma", "beta", "moving_mean", "moving_variance")]
    with pytest.raises(ParityInputError, match=r"extra\.gamma \(8,\) receives no torch tensor "
                       r"\(missing key\): nothing of torch's pairs with the port's extra, its "
                       r"running statistics included: a norm torch's model lacks \(take it out "
                       r"of the port\)"):
        plan_transfer(state_dict, extra, left_out={"bn.gamma", "bn.beta", "extra.moving_mean",
                                                   "extra.moving_variance"})
    # a norm torch holds beside under another name and width, its running statistics left
    # over too (timm's SK-ResNeXt against mindcv's: each norm was told torch's had no weight)
    elsewhere = {"block.conv.weight": np.zeros((8, 8, 1, 1), np.float32),
                 **{f"block.bn.{role}": np.ones(16, np.float32)
                    for role in ("weight", "bias", "running_mean", "running_var")}}
    other_width = [("block.conv.weight", (8, 8, 1, 1), "float32")] + [
        (f"block.1.{role}", (8,), "float32")
        for role in ("gamma", "beta", "moving_mean", "moving_variance")]
    with pytest.raises(ParityInputError, match=r"block\.1\.gamma \(8,\) receives no torch "
                       r"tensor \(missing key\); ") as refused:
        plan_transfer(elsewhere, other_width)
    assert "no weight or bias" not in str(refused.value)
    # a weights file that lost one running statistic: a missing key, frozen initial values or
    # not (convert-weights wrote such a file without a word)
    del state_dict["bn.running_mean"]
    with pytest.raises(ParityInputError, match=r"bn\.moving_mean \(8,\) receives no torch"):
        plan_transfer(state_dict, specs, left_out={"bn.gamma", "bn.beta", "bn.moving_mean",
                                                   "bn.moving_variance"})


def test_transfer_refuses_wrong_dtype():
    state_dict, specs = _specs()
    state_dict["conv1.weight"] = state_dict["conv1.weight"].astype(np.float64)
    with pytest.raises(ParityInputError, match=r"conv1\.weight: torch dtype float64"):
        plan_transfer(state_dict, specs)


def test_transfer_lists_every_problem_at_once():
    state_dict, specs = _specs()
    del state_dict["layer1.0.conv1.weight"]
    state_dict["fc.bias"] = np.zeros(7, np.float32)
    with pytest.raises(ParityInputError) as error:
        plan_transfer(state_dict, specs)
    assert "2 problem(s)" in str(error.value)
    assert "layer1.0.conv1.weight" in str(error.value) and "fc.bias" in str(error.value)


def test_a_transfer_between_different_models_says_so_and_lists_a_few_problems():
    """MobileNetV2's weights offered to the ResNet18 port: one readable line, not 300 names."""
    from parity.weights import MAX_PROBLEMS_LISTED
    _, specs = _specs()
    state_dict = _state_dict(torchvision.models.mobilenet_v2())
    with pytest.raises(ParityInputError) as error:
        plan_transfer(state_dict, specs)
    message = str(error.value)
    assert "are the two models the same architecture?" in message
    count = int(re.search(r"(\d+) problem\(s\)", message).group(1))
    assert count > MAX_PROBLEMS_LISTED
    assert f"and {count - MAX_PROBLEMS_LISTED} more" in message
    assert message.count("(missing key)") + message.count("(extra key)") <= MAX_PROBLEMS_LISTED
    assert len(message) < 2000


def test_a_dense_weight_held_transposed_is_told_so():
    """A port's own dense cell holding its weight as (in, out) for x @ W (or torch's layer so,
    met by convert-weights): the refusal says the shape is torch's transposed and what to hold
    instead; another shape is told as it is."""
    state_dict = {"proj.weight": np.zeros((6, 8), np.float32)}
    with pytest.raises(ParityInputError, match=r"proj\.weight: torch shape \(6, 8\) but MindSpore "
                       r"proj\.weight expects \(8, 6\), its transpose: one side's layer holds it "
                       r"as \(in, out\) for x @ W, the other's as \(out, in\)"):
        plan_transfer(state_dict, [("proj.weight", (8, 6), "float32")])
    with pytest.raises(ParityInputError, match=r"expects \(8, 7\)\. Fix"):
        plan_transfer(state_dict, [("proj.weight", (8, 7), "float32")])
