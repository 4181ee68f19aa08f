"""`parity convert-weights`: checkpoints MindSpore loads completely; bad files exit 2."""

from __future__ import annotations

import json
import os
import re

import mindspore as ms
import numpy as np
import pytest
import torch
import torchvision
from safetensors.numpy import save_file

from models import resnet_mindspore as port
from parity.errors import ParityInputError
from tests.conftest import assert_one_line_error, parity_cli


class _Exploit:
    """Unpickling this would run a shell command that creates a file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _resnet18_weights(path, num_classes=10):
    torch.manual_seed(1)
    state = torchvision.models.resnet18(num_classes=num_classes).state_dict()
    torch.save(state, path)
    return state


def _converted_resnet18(weights, out):
    """The 10-class ResNet18 port loaded from the checkpoint convert-weights wrote of
    ``weights``, every parameter of it loaded."""
    process = parity_cli("convert-weights", "--model", "resnet18", "--num-classes", "10",
                         "--torch-weights", weights, "--out", out)
    assert process.returncode == 0, process.stderr
    net = port.resnet18(num_classes=10)
    not_loaded, _ = ms.load_param_into_net(net, ms.load_checkpoint(str(out)))
    assert not_loaded == []
    return net


def test_ckpt_loads_with_no_parameter_left_unloaded(tmp_path):
    state = _resnet18_weights(tmp_path / "w.pth")
    net = _converted_resnet18(tmp_path / "w.pth", tmp_path / "w.ckpt")
    np.testing.assert_array_equal(net.layer3[1].bn2.moving_variance.asnumpy(),
                                  state["layer3.1.bn2.running_var"].numpy())
    np.testing.assert_array_equal(net.fc.weight.asnumpy(), state["fc.weight"].numpy())


def test_convert_weights_says_which_torch_tensors_it_left_out(tmp_path):
    """ResNet18's 20 BatchNorm step counters have no MindSpore parameter: the conversion said
    only how many parameters it wrote."""
    _resnet18_weights(tmp_path / "w.pth")
    process = parity_cli("convert-weights", "--model", "resnet18", "--num-classes", "10",
                         "--torch-weights", tmp_path / "w.pth", "--out", tmp_path / "w.ckpt")
    assert process.returncode == 0, process.stderr
    assert "wrote" in process.stdout and "102 MindSpore parameters" in process.stdout
    assert "left out 20 torch tensor(s) no MindSpore parameter takes" in process.stdout
    assert "layer1.0.bn1.num_batches_tracked" in process.stdout


@pytest.mark.parametrize("zipped", [True, False], ids=["zip", "legacy"])
@pytest.mark.parametrize("name, wrap", [
    ("pytorch_model.bin", lambda state: state),                             # Hugging Face's
    ("epoch=3-step=10.ckpt", lambda state: {"state_dict": state, "epoch": 3,  # Lightning's
                                            "global_step": 10}),
])
def test_torch_save_files_under_other_names_are_read(tmp_path, name, wrap, zipped):
    """Both were refused as "unknown weights format"; a .ckpt in torch.save's format from
    before torch 1.6 (not a zip) was told it was not a torch file."""
    from parity.weights import load_state_dict
    state = _resnet18_weights(tmp_path / "w.pth")
    torch.save(wrap(state), tmp_path / name, _use_new_zipfile_serialization=zipped)
    loaded = load_state_dict(tmp_path / name)
    assert list(loaded) == list(state)
    for key, tensor in state.items():
        np.testing.assert_array_equal(loaded[key], tensor.numpy())


def _prefixed(prefix, state):
    return {f"{prefix}{key}": tensor for key, tensor in state.items()}


def _lightning_checkpoint(path, state):
    """What PyTorch Lightning saves of a LightningModule holding the network as ``self.model``."""
    torch.save({"state_dict": _prefixed("model.", state), "epoch": 3, "global_step": 10}, path)


@pytest.mark.parametrize("name, saved", [
    ("last.ckpt", lambda state: {"state_dict": _prefixed("model.", state), "epoch": 3}),
    ("dp.pth", lambda state: _prefixed("module.", state)),                      # DataParallel
    ("dp-checkpoint.pth", lambda state: {"model": _prefixed("module.", state), "epoch": 3}),
    ("compiled.pth", lambda state: _prefixed("_orig_mod.", state)),    # from torch.compile'd
])
def test_an_outer_prefix_is_dropped_where_only_then_the_names_fit(tmp_path, name, saved):
    """A Lightning checkpoint's keys ("model.conv1.weight") were all missing and unexpected, on
    both sides; DataParallel's "module." was dropped whether or not the model had it."""
    from parity.capture.torch_capture import _load_weights
    state = _resnet18_weights(tmp_path / "w.pth")
    torch.save(saved(state), tmp_path / name)
    model = torchvision.models.resnet18(num_classes=10)
    _load_weights(model, tmp_path / name)
    assert torch.equal(model.layer2[1].conv2.weight, state["layer2.1.conv2.weight"])
    net = _converted_resnet18(tmp_path / name, tmp_path / "w.ckpt")
    np.testing.assert_array_equal(net.fc.weight.asnumpy(), state["fc.weight"].numpy())


def test_a_data_parallel_file_with_a_key_too_many_is_told_by_the_names_without_module(tmp_path):
    """Its names fit but for one: that one is named, not all of them twice."""
    from parity.capture.torch_capture import _load_weights
    state = _resnet18_weights(tmp_path / "w.pth")
    state["aux.weight"] = torch.zeros(3)
    torch.save(_prefixed("module.", state), tmp_path / "dp.pth")
    with pytest.raises(ParityInputError, match=r"does not fit the torch model: unexpected keys: "
                                               r"aux.weight$"):
        _load_weights(torchvision.models.resnet18(num_classes=10), tmp_path / "dp.pth")


@pytest.mark.parametrize("attribute", ["model", "module"])
def test_a_model_whose_own_names_share_a_prefix_keeps_them(tmp_path, attribute):
    from parity.capture.torch_capture import _load_weights

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            setattr(self, attribute, torchvision.models.resnet18(num_classes=10))

    torch.manual_seed(2)
    saved = Wrapper()
    torch.save(saved.state_dict(), tmp_path / "w.pth")
    model = Wrapper()
    _load_weights(model, tmp_path / "w.pth")
    assert torch.equal(getattr(model, attribute).fc.weight, getattr(saved, attribute).fc.weight)


def test_a_lightning_checkpoint_of_another_class_count_is_told_so(tmp_path):
    """Without its prefix the checkpoint fits but for the classes: that refusal, the shorter,
    is the one told, not 'model.fc.weight is used by no MindSpore parameter'."""
    _lightning_checkpoint(tmp_path / "last.ckpt", _resnet18_weights(tmp_path / "w.pth"))
    process = parity_cli("convert-weights", "--model", "resnet18", "--torch-weights",
                         tmp_path / "last.ckpt", "--out", tmp_path / "w.ckpt")
    assert_one_line_error(process, "2 problem(s): fc.weight: torch shape (10, 512)",
                          "Weights of a 10-class model? Pass --num-classes 10")
    assert not (tmp_path / "w.ckpt").exists()


def test_a_mindspore_checkpoint_given_as_torch_weights_is_told_as_such(tmp_path):
    """It read "unknown weights format '.ckpt'"."""
    ms.save_checkpoint(port.resnet18(num_classes=10), str(tmp_path / "port.ckpt"))
    process = parity_cli("run", "--model", "resnet18", "--torch-weights",
                         tmp_path / "port.ckpt", "--out", tmp_path / "run")
    assert_one_line_error(process, f"{tmp_path / 'port.ckpt'} is not a torch file (a MindSpore "
                                   "checkpoint?)")
    assert not (tmp_path / "run").exists()


def test_weights_of_another_class_count_are_told_to_pass_it(tmp_path):
    """A 10-class fine-tune given for the 1000-class default: the error said "torch shape
    (10, 512) but MindSpore fc.weight expects (1000, 512)" and no way out; now it names the
    option, for the transfer and for the torch capture of 'parity run'."""
    _resnet18_weights(tmp_path / "w.pth", num_classes=10)
    process = parity_cli("convert-weights", "--model", "resnet18",
                         "--torch-weights", tmp_path / "w.pth", "--out", tmp_path / "w.ckpt")
    assert_one_line_error(process, "fc.weight: torch shape (10, 512) but MindSpore fc.weight "
                                   "expects (1000, 512)",
                          "Weights of a 10-class model? Pass --num-classes 10")
    assert not (tmp_path / "w.ckpt").exists()
    process = parity_cli("run", "--model", "resnet18", "--torch-weights", tmp_path / "w.pth",
                         "--out", tmp_path / "run", "--json", tmp_path / "r.json")
    assert_one_line_error(process, "fc.bias: file (10,) vs model (1000,). Weights of a 10-class "
                                   "model? Pass --num-classes 10")
    assert not (tmp_path / "run").exists() and not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("misfits, told", [
    ([((10, 512), (1000, 512)), ((10,), (1000,))], "Weights of a 10-class model?"),
    ([((1000, 512), (10, 512))], "Weights of a 1000-class model?"),
    ([], ""),
    ([((10, 512), (1000, 256))], ""),                       # not the first dimension alone
    ([((10, 512), (1000, 512)), ((12,), (1000,))], ""),     # two counts
    ([((10, 512), (1000, 512)), ((10,), (20,))], ""),       # two counts in the model
    ([((), (3,))], ""),                                     # a scalar
])
def test_a_class_count_is_read_only_from_first_dimensions_that_agree(misfits, told):
    from parity.weights import class_count_hint
    assert class_count_hint(misfits).startswith(told) and bool(told) == bool(
        class_count_hint(misfits))


def test_weights_holding_nan_or_inf_are_converted_as_they_are_and_told(tmp_path):
    import torch
    state = _resnet18_weights(tmp_path / "w.pth")
    state["fc.weight"][0, :3] = torch.tensor([float("nan"), float("inf"), float("-inf")])
    state["layer1.0.bn1.running_var"][5] = float("nan")
    torch.save(state, tmp_path / "w.pth")
    process = parity_cli("convert-weights", "--model", "resnet18", "--num-classes", "10",
                         "--torch-weights", tmp_path / "w.pth", "--out", tmp_path / "w.ckpt")
    assert process.returncode == 0, process.stderr
    assert process.stderr == (
        f"parity: warning: {tmp_path / 'w.pth'} holds values that are not finite, copied as "
        "they are (layer1.0.bn1.running_var: 1 NaN, 0 Inf; fc.weight: 1 NaN, 2 Inf): the port "
        "computes NaN from them; 'parity run --torch-weights' names where it starts\n")
    net = port.resnet18(num_classes=10)
    ms.load_param_into_net(net, ms.load_checkpoint(str(tmp_path / "w.ckpt")))
    np.testing.assert_array_equal(net.fc.weight.asnumpy(), state["fc.weight"].numpy())


def test_safetensors_output_when_the_suffix_says_so(tmp_path):
    state = _resnet18_weights(tmp_path / "w.pth")
    process = parity_cli("convert-weights", "--model", "resnet18", "--num-classes", "10",
                         "--torch-weights", tmp_path / "w.pth",
                         "--out", tmp_path / "w.safetensors")
    assert process.returncode == 0, process.stderr
    from safetensors.numpy import load_file
    loaded = load_file(str(tmp_path / "w.safetensors"))
    np.testing.assert_array_equal(loaded["layer1.0.bn1.gamma"],
                                  state["layer1.0.bn1.weight"].numpy())


def test_safetensors_input(tmp_path):
    state = _resnet18_weights(tmp_path / "w.pth")
    save_file({k: v.numpy() for k, v in state.items()}, str(tmp_path / "w.safetensors"))
    process = parity_cli("convert-weights", "--model", "resnet18", "--num-classes", "10",
                         "--torch-weights", tmp_path / "w.safetensors",
                         "--out", tmp_path / "w.ckpt")
    assert process.returncode == 0, process.stderr


def test_missing_key_exits_2_naming_it(tmp_path):
    state = _resnet18_weights(tmp_path / "w.pth")
    del state["layer4.1.bn2.running_mean"]
    torch.save(state, tmp_path / "w.pth")
    process = parity_cli("convert-weights", "--model", "resnet18", "--num-classes", "10",
                         "--torch-weights", tmp_path / "w.pth", "--out", tmp_path / "w.ckpt")
    assert_one_line_error(process, "layer4.1.bn2.moving_mean", "missing key")
    assert not (tmp_path / "w.ckpt").exists()


def test_extra_key_exits_2_naming_it(tmp_path):
    state = _resnet18_weights(tmp_path / "w.pth")
    state["aux.weight"] = torch.zeros(4)
    torch.save(state, tmp_path / "w.pth")
    process = parity_cli("convert-weights", "--model", "resnet18", "--num-classes", "10",
                         "--torch-weights", tmp_path / "w.pth", "--out", tmp_path / "w.ckpt")
    assert_one_line_error(process, "aux.weight", "extra key")


def test_wrong_shape_exits_2_naming_it(tmp_path):
    _resnet18_weights(tmp_path / "w.pth", num_classes=7)
    process = parity_cli("convert-weights", "--model", "resnet18", "--num-classes", "10",
                         "--torch-weights", tmp_path / "w.pth", "--out", tmp_path / "w.ckpt")
    assert_one_line_error(process, "fc.weight: torch shape (7, 512)")


@pytest.mark.parametrize("name, zipped", [("evil.pth", True), ("evil.ckpt", False)])
def test_pickled_object_is_refused_never_executed(tmp_path, name, zipped):
    marker = tmp_path / "pwned"
    torch.save({"conv1.weight": _Exploit(str(marker))}, tmp_path / name,
               _use_new_zipfile_serialization=zipped)
    process = parity_cli("convert-weights", "--model", "resnet18",
                         "--torch-weights", tmp_path / name, "--out", tmp_path / "w.ckpt")
    assert_one_line_error(process, "refused without executing")
    assert not marker.exists()


def test_existing_output_is_never_overwritten(tmp_path):
    _resnet18_weights(tmp_path / "w.pth")
    (tmp_path / "w.ckpt").write_text("my precious checkpoint")
    process = parity_cli("convert-weights", "--model", "resnet18", "--num-classes", "10",
                         "--torch-weights", tmp_path / "w.pth", "--out", tmp_path / "w.ckpt")
    assert_one_line_error(process, "already exists")
    assert (tmp_path / "w.ckpt").read_text() == "my precious checkpoint"


@pytest.mark.parametrize("name, content, message", [
    ("w.pth", b"", "is empty"),
    ("w.safetensors", b"", "is empty"),
    ("w.pth", b"hello\n", r"not a readable torch file \([A-Z]\w*Error"),     # its type at least
])
def test_a_file_that_holds_no_weights_is_named_with_what_is_wrong(tmp_path, name, content,
                                                                  message):
    from parity.weights import load_state_dict
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ParityInputError, match=message):
        load_state_dict(tmp_path / name)


@pytest.mark.parametrize("path, message", [
    ("missing.pth", "weights file {tmp_path}/missing.pth does not exist"),
    ("folder.pth", "weights file {tmp_path}/folder.pth is not a file: pass the file your training "
                   "saved"),       # it said "does not exist"; so did /dev/null
])
def test_a_weights_path_that_is_no_file_is_told_apart_from_a_missing_one(tmp_path, path,
                                                                         message):
    from parity.weights import load_state_dict
    (tmp_path / "folder.pth").mkdir()
    with pytest.raises(ParityInputError, match=re.escape(message.format(tmp_path=tmp_path))):
        load_state_dict(tmp_path / path)


def test_a_truncated_torch_file_is_named_with_the_first_sentence_of_torchs_error(tmp_path):
    from parity.weights import load_state_dict
    torch.save({"w": torch.zeros(1000)}, tmp_path / "w.pth")
    data = (tmp_path / "w.pth").read_bytes()
    (tmp_path / "w.pth").write_bytes(data[:len(data) // 2])
    with pytest.raises(ParityInputError, match=r"not a readable torch file \(\w+Error: [^.()]+\); "
                                               "pass a state dict"):
        load_state_dict(tmp_path / "w.pth")


@pytest.mark.parametrize("saved", [
    lambda state: {"state_dict": state, "epoch": 3, "best_acc1": 0.7},    # torchvision's recipe
    lambda state: {"model": state, "optimizer": {"state": {}}, "epoch": 3},
])
def test_a_training_checkpoint_gives_its_model_state_dict(tmp_path, saved):
    from parity.weights import load_state_dict
    state = torchvision.models.resnet18(num_classes=10).state_dict()
    torch.save(saved(state), tmp_path / "checkpoint.pth")
    loaded = load_state_dict(tmp_path / "checkpoint.pth")
    assert list(loaded) == list(state)
    assert all(np.array_equal(loaded[name], tensor.numpy()) for name, tensor in state.items())


@pytest.mark.parametrize("saved, message", [
    ({"model": {"w": torch.ones(2)}, "ema": {"w": torch.zeros(2)}, "epoch": 3},
     r"holds several state dicts \(model, ema\); save the one to check alone"),
    ({"epoch": 3, "arch": "resnet18"}, "entries that are not tensors: epoch, arch; save "
                                       r"model.state_dict\(\)"),
    ({}, "holds no tensors"),
    (torch.nn.Linear(2, 2), r"pickled objects that are not tensors \(the first: "
                            r"torch.nn.modules.linear.Linear\); refused without executing them. "
                            r"Save model.state_dict\(\) \(torch.save\(model\) pickles the whole "
                            r"model\)"),
])
def test_a_checkpoint_without_one_clear_state_dict_is_told_what_it_holds(tmp_path, saved,
                                                                       message):
    from parity.weights import load_state_dict
    torch.save(saved, tmp_path / "checkpoint.pth")
    with pytest.raises(ParityInputError, match=message):
        load_state_dict(tmp_path / "checkpoint.pth")


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=str)
def test_weights_in_a_type_numpy_lacks_are_widened_to_float32_exactly(tmp_path, suffix, dtype):
    """bfloat16 checkpoints failed "unexpected TypeError: Got unsupported ScalarType BFloat16"
    (.pth), or "data type 'bfloat16' not understood" (.safetensors)."""
    from safetensors.torch import save_file as save_torch_file

    from parity.weights import load_state_dict
    state = {"conv.weight": torch.randn(4, 3, 3, 3).to(dtype), "bn.running_mean": torch.randn(4),
             "bn.num_batches_tracked": torch.tensor(7)}
    path = tmp_path / f"w{suffix}"
    if suffix == ".pth":
        torch.save(state, path)
    elif dtype == torch.bfloat16:
        save_torch_file(state, str(path))
    else:   # numpy lacks it and its bits are not float32's upper half: named, not guessed
        save_torch_file(state, str(path))
        with pytest.raises(ParityInputError, match=r"holds F8_E4M3 tensors, which parity cannot "
                                                   "read; save the weights in float32"):
            load_state_dict(path)
        return
    loaded = load_state_dict(path)
    assert {name: array.dtype for name, array in loaded.items()} == {
        "conv.weight": np.float32, "bn.running_mean": np.float32,
        "bn.num_batches_tracked": np.int64}
    for name, tensor in state.items():
        assert np.array_equal(loaded[name], tensor.float().numpy() if tensor.is_floating_point()
                              else tensor.numpy()), name


def test_a_bfloat16_checkpoint_is_checked_like_its_float32_values(tmp_path):
    from safetensors.torch import save_file as save_torch_file
    state = {name: tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor
             for name, tensor in torchvision.models.resnet18(num_classes=10).state_dict().items()}
    save_torch_file(state, str(tmp_path / "w.safetensors"))
    process = parity_cli("convert-weights", "--torch-weights", tmp_path / "w.safetensors",
                         "--model", "resnet18", "--num-classes", "10", "--out", tmp_path / "w.ckpt")
    assert process.returncode == 0, process.stderr
    net = port.resnet18(num_classes=10)
    not_loaded, _ = ms.load_param_into_net(net, ms.load_checkpoint(str(tmp_path / "w.ckpt")))
    assert not_loaded == []
    assert np.array_equal(net.fc.weight.asnumpy(), state["fc.weight"].float().numpy())


def test_tied_keys_are_read_from_a_torch_file_and_kept_in_parity_s_own(tmp_path):
    """torch.load keeps the tensors a file shared: the second name is the first's tensor. The
    torch capture's starting point (safetensors, which holds each name's copy) says so in its
    metadata."""
    from parity.weights import load_state_dict, save_state_dict_bytes
    from tests.tiny import torch_tied, torch_untied
    torch.save(torch_tied().state_dict(), tmp_path / "tied.pth")
    tied = load_state_dict(tmp_path / "tied.pth")
    assert tied.tied == {"head.weight": "embed.weight"}
    (tmp_path / "copy.safetensors").write_bytes(save_state_dict_bytes(tied))
    again = load_state_dict(tmp_path / "copy.safetensors")
    assert (list(again), again.tied) == (list(tied), tied.tied)
    torch.save(torch_untied().state_dict(), tmp_path / "untied.pth")
    assert load_state_dict(tmp_path / "untied.pth").tied == {}


def test_a_tied_tensor_saved_once_loads_into_the_tied_model_and_untied_weights_do_not(tmp_path):
    """safetensors' save_model keeps one name of tied tensors; weights of an untied model hold
    two different tensors that torch would load one over the other."""
    from safetensors.torch import save_model

    from parity.capture.torch_capture import _load_weights
    from tests.tiny import torch_tied, torch_untied
    saved = torch_tied()
    save_model(saved, str(tmp_path / "once.safetensors"))
    model = torch_tied()
    _load_weights(model, tmp_path / "once.safetensors")
    assert torch.equal(model.head.weight, saved.embed.weight)
    assert model.head.weight is model.embed.weight
    torch.save(torch_untied().state_dict(), tmp_path / "untied.pth")
    with pytest.raises(ParityInputError, match="head.weight and embed.weight differ, but the "
                                               "torch model ties them"):
        _load_weights(torch_tied(), tmp_path / "untied.pth")


def test_tied_copies_holding_nan_load_into_the_tied_model(tmp_path):
    """A diverged checkpoint is when parity is needed most: its tied tensor's copies hold the
    same NaN, which == calls different, so they were refused as weights of an untied model."""
    from safetensors.torch import save_file

    from parity.capture.torch_capture import _load_weights
    from tests.tiny import torch_tied
    state = {k: v.clone() for k, v in torch_tied().state_dict().items()}
    for name in ("embed.weight", "head.weight"):
        state[name][0, 0] = float("nan")
    save_file(state, tmp_path / "copies.safetensors")
    model = torch_tied()
    _load_weights(model, tmp_path / "copies.safetensors")
    assert torch.isnan(model.head.weight[0, 0]) and model.head.weight is model.embed.weight


def test_convert_weights_gives_a_tied_port_its_one_parameter(tmp_path):
    from tests.tiny import torch_tied
    state = torch_tied().state_dict()
    torch.save(state, tmp_path / "tied.pth")
    process = parity_cli("convert-weights", "--ms-model", "tests.tiny:ms_tied", "--torch-weights",
                         tmp_path / "tied.pth", "--out", tmp_path / "tied.ckpt")
    assert process.returncode == 0, process.stderr
    converted = ms.load_checkpoint(str(tmp_path / "tied.ckpt"))
    assert np.array_equal(converted["embed.embedding_table"].asnumpy(),
                          state["embed.weight"].numpy())


@pytest.mark.parametrize("tied, converted", [(True, True), (False, False)])
def test_a_safetensors_file_of_tied_copies_goes_into_a_tied_port(tmp_path, tied, converted):
    """A .safetensors file keeps no tie: it holds torch's tied tensor as a copy under each
    name. Copies holding the same bits go into the port's one parameter (they were refused as
    an extra key); different tensors are torch's untied ones."""
    from safetensors.torch import save_file

    from tests.tiny import torch_tied, torch_untied
    state = (torch_tied() if tied else torch_untied()).state_dict()
    save_file({k: v.clone() for k, v in state.items()}, tmp_path / "copies.safetensors")
    process = parity_cli("convert-weights", "--ms-model", "tests.tiny:ms_tied", "--torch-weights",
                         tmp_path / "copies.safetensors", "--out", tmp_path / "tied.ckpt")
    if converted:
        assert process.returncode == 0, process.stderr
        assert np.array_equal(ms.load_checkpoint(str(tmp_path / "tied.ckpt"))[
            "embed.embedding_table"].asnumpy(), state["embed.weight"].numpy())
    else:
        assert_one_line_error(process, "torch tensor head.weight (50, 8) is used by no "
                              "MindSpore parameter (extra key): the port ties head.weight to "
                              "embed.embedding_table (one parameter), torch does not")


def test_a_starting_point_without_ties_is_written_as_by_earlier_versions():
    """Its bytes make the fingerprint a saved baseline is checked against: a key added to
    every file would have refused every baseline saved before it."""
    from safetensors.numpy import save

    from parity.weights import ORDER_KEY, StateDict, save_state_dict_bytes
    arrays = {"b.weight": np.ones(3, np.float32), "a.weight": np.zeros(2, np.float32)}
    earlier = save(arrays, metadata={ORDER_KEY: json.dumps(["b.weight", "a.weight"])})
    assert save_state_dict_bytes(StateDict(arrays)) == earlier
    assert save_state_dict_bytes(StateDict(arrays, {"b.weight": "a.weight"})) != earlier


def test_weights_load_under_the_models_own_version_metadata(tmp_path):
    """torchvision's MNASNet reads its version from the loaded state dict's metadata and
    refused parity's ("version should be set to 1 or 2 instead of None"): the torch capture,
    which loads the initial weights again for its observer rerun, stopped, and so did loading
    --torch-weights. Both load now, under the model's own metadata."""
    import torch
    import torchvision

    from parity.capture.torch_capture import _load_weights, _restore
    saved = torchvision.models.mnasnet0_5(num_classes=10)
    torch.save(saved.state_dict(), tmp_path / "w.pth")
    model = torchvision.models.mnasnet0_5(num_classes=10)
    _load_weights(model, tmp_path / "w.pth")
    assert torch.equal(model.layers[0].weight, saved.layers[0].weight)
    other = torchvision.models.mnasnet0_5(num_classes=10)
    _restore(model, {k: v.numpy() for k, v in other.state_dict().items()})
    assert torch.equal(model.classifier[1].weight, other.classifier[1].weight)


def test_a_split_fused_layer_and_the_ports_own_constants_are_converted(tmp_path):
    """A port of q, k and v layers for torch's fused qkv, holding its relative position index
    as a frozen parameter (mindcv's Swin): refused before; each layer now takes its rows, the
    index keeps the port's values, and the conversion says so."""
    from tests import tiny
    model = tiny.torch_patch_attention()
    torch.save(model.state_dict(), tmp_path / "w.pth")
    process = parity_cli("convert-weights", "--ms-model", "tests.tiny:ms_patch_attention",
                         "--torch-weights", tmp_path / "w.pth", "--out", tmp_path / "w.ckpt")
    assert process.returncode == 0, process.stderr
    assert "kept 1 frozen MindSpore parameter(s) no torch tensor feeds at the port's own " \
        "values (constants it computes itself): attn.relative_bias.index" in process.stdout
    assert "left out 1 torch tensor(s)" in process.stdout and \
        "attn.relative_position_index" in process.stdout
    saved = ms.load_checkpoint(str(tmp_path / "w.ckpt"))
    qkv = model.attn.qkv.weight.detach().numpy()
    np.testing.assert_array_equal(saved["attn.v.weight"].asnumpy(), qkv[16:24])
    np.testing.assert_array_equal(saved["attn.relative_bias.index"].asnumpy(),
                                  tiny.ms_patch_attention().attn.relative_bias.index.asnumpy())


def test_a_fused_bias_whose_key_rows_the_port_lacks_is_converted_saying_so(tmp_path):
    """A port whose k layer has no bias (mindcv's SwinV2 for torchvision's): its q and v
    biases take their rows of torch's fused bias, and the conversion names k's rows left."""
    from tests import tiny
    model = tiny.torch_patch_attention_key_unbiased()
    torch.save(model.state_dict(), tmp_path / "w.pth")
    process = parity_cli("convert-weights", "--ms-model",
                         "tests.tiny:ms_patch_attention_key_unbiased", "--torch-weights",
                         tmp_path / "w.pth", "--out", tmp_path / "w.ckpt")
    assert process.returncode == 0, process.stderr
    assert "left out torch's rows no MindSpore parameter takes (the port's k layer has no " \
        "bias): attn.qkv.bias[8:16]" in process.stdout
    saved = ms.load_checkpoint(str(tmp_path / "w.ckpt"))
    bias = model.attn.qkv.bias.detach().numpy()
    np.testing.assert_array_equal(saved["attn.v.bias"].asnumpy(), bias[16:24])
    assert "attn.k.bias" not in saved


def test_torch_layers_the_port_fuses_are_converted_stacked(tmp_path):
    """torch's q, k and v layers for a port's one qkv layer (mindcv's XCiT class attention):
    refused before; the port's parameter now holds their rows stacked in order."""
    from tests import tiny
    model = tiny.torch_patch_attention_apart()
    torch.save(model.state_dict(), tmp_path / "w.pth")
    process = parity_cli("convert-weights", "--ms-model", "tests.tiny:ms_patch_attention_fused",
                         "--torch-weights", tmp_path / "w.pth", "--out", tmp_path / "w.ckpt")
    assert process.returncode == 0, process.stderr
    saved = ms.load_checkpoint(str(tmp_path / "w.ckpt"))
    np.testing.assert_array_equal(
        saved["attn.qkv.bias"].asnumpy(),
        np.concatenate([getattr(model.attn, layer).bias.detach().numpy() for layer in "qkv"]))
