"""Pure pieces of the captures. No framework needed."""

from __future__ import annotations

import json
import math
import re
from contextlib import nullcontext

import numpy as np
import pytest

from parity.bench import rerun_seconds
from parity.capture.common import PhaseClock, several_outputs, weight_update
from parity.capture.hooks import output_names
from parity.capture.torch_capture import float64_noise, one_rounding_off


def test_float64_noise_skips_non_finite_elements():
    t64 = np.array([1.0, 2.0, np.inf, 4.0])
    t32 = np.array([1.5, 2.0, 3.0, np.nan], np.float32)
    noise_rms, exact_rms = float64_noise(t32, t64)
    assert noise_rms == pytest.approx(math.sqrt(0.25 / 4))
    assert exact_rms == pytest.approx(math.sqrt(5 / 4))


def test_weight_update_is_exact_in_float32_when_w_changes_by_less_than_2x():
    before = np.array([1.0, 1e-3, -2.0], np.float32)
    after = np.array([1.1, 0.9e-3, -2.5], np.float32)
    update = weight_update(after, before)
    assert update.dtype == np.float32
    np.testing.assert_array_equal(update.astype(np.float64),
                                  after.astype(np.float64) - before.astype(np.float64))


def test_weight_update_rounds_once_where_float32_cannot_hold_the_difference():
    before, after = np.array([1e-8, 2.0], np.float32), np.array([1.0, 2.5], np.float32)
    update = weight_update(after, before)
    exact = after.astype(np.float64) - before.astype(np.float64)
    assert update.dtype == np.float32
    assert update[0] != exact[0]                       # 1 - 1e-8 is not a float32 number
    assert update[0] == np.float32(exact[0])           # ... and is rounded to nearest, once
    assert update[1] == exact[1]


def test_phase_clock_adds_up_a_phase_entered_twice_with_the_peak_at_its_last_end(monkeypatch):
    now = iter([0.0, 1.0, 3.0, 6.0])
    peak_mb = iter([100.0, 500.0, 600.0, 600.0])
    monkeypatch.setattr("parity.capture.common.time.perf_counter", lambda: next(now))
    monkeypatch.setattr("parity.capture.common.peak_resident_mb", lambda: next(peak_mb))
    clock = PhaseClock("step")          # t=0
    clock.next("rerun")                 # t=1
    clock.next("step")                  # t=3
    usage = clock.usage()               # t=6 ends the running phase
    assert usage["phases"] == {"step": 4.0, "rerun": 2.0} and usage["seconds"] == 6.0
    # a phase entered twice: the peak as it ended last
    assert usage["peak_rss_mb_after"] == {"step": 600.0, "rerun": 500.0}
    assert usage["peak_rss_mb"] == 600.0
    assert rerun_seconds({"torch": {"observer rerun": 2.0, "hooked step": 4.0,
                                    "rerounded step": 0.25},
                          "mindspore": {"observer rerun": 1.0, "float64 step": 0.5}}) == 3.75


@pytest.mark.parametrize("settings", [dict(nesterov=True), dict(dampening=0.5)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_torch_step_records_what_one_sgd_over_all_parameters_gives(settings, dtype):
    """The capture steps one parameter at a time to free each gradient and momentum buffer once
    recorded; the result is torch's SGD over the whole model, bit for bit."""
    import torch

    from parity.capture.batch import Batch
    from parity.capture.torch_capture import _train_step
    from parity.config import StepConfig

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4),
                                torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 36, 5))
    model = model.to(getattr(torch, dtype))
    initial = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    batch = Batch((np.random.default_rng(0).standard_normal((2, 3, 8, 8), np.float32),),
                  np.array([1, 3]))
    config = StepConfig(lr=0.1, momentum=0.9, weight_decay=1e-2, **settings)
    parameters = list(model.parameters())
    recorded, grads_held = {}, []

    def record(name, kind, array, **_):
        recorded[(kind, name)] = np.array(array, copy=True)
        if kind == "update":
            grads_held.append(sum(p.grad is not None for p in parameters))

    _train_step(model, initial, batch, config, record, hooks=False)

    model.load_state_dict({k: torch.from_numpy(v) for k, v in initial.items()})
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum,
                                dampening=config.dampening, weight_decay=config.weight_decay,
                                nesterov=config.nesterov)
    model.train()
    torch.nn.functional.cross_entropy(
        model(torch.from_numpy(batch.inputs[0]).to(model[0].weight.dtype)),
        torch.from_numpy(batch.labels)).backward()
    optimizer.step()
    for name, param in model.named_parameters():
        assert np.array_equal(recorded[("weight", name)], param.detach().numpy()), name
        assert np.array_equal(recorded[("optimizer_state", f"{name}.momentum_buffer")],
                              optimizer.state[param]["momentum_buffer"].numpy()), name
    # each gradient is gone once its parameter is stepped and recorded
    assert grads_held == list(range(len(parameters), 0, -1))


def test_mindspore_starting_point_is_read_from_the_weights_file_where_it_holds_the_bytes(
        tmp_path):
    from safetensors.numpy import save_file

    from parity.capture.mindspore_capture import _InitialState

    class Parameter:
        def __init__(self, value):
            self.value = value

        def asnumpy(self):
            return self.value

    class Network:
        def parameters_and_names(self):
            return [("m.a", Parameter(a.copy())), ("m.b", Parameter(b + 1)),
                    ("m.c", Parameter(np.zeros(2, np.float32)))]

    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(4, np.float32)
    save_file({"t.a": a, "t.b": b}, str(tmp_path / "w.safetensors"))
    state = _InitialState(Network(), tmp_path / "w.safetensors", {"m.a": "t.a", "m.b": "t.b"})
    # the file holds m.a's bytes: mapped from it at each use (read-only), not kept
    assert np.array_equal(state["m.a"], a) and not state["m.a"].flags.writeable
    # the network holds other bytes than the file for m.b, and m.c is not in it: copies
    assert np.array_equal(state["m.b"], b + 1) and state["m.b"].flags.writeable
    assert np.array_equal(state["m.c"], np.zeros(2)) and state["m.c"].flags.writeable
    assert sorted(state) == ["m.a", "m.b", "m.c"] and len(state) == 3


def test_torch_weights_of_another_model_are_refused_in_one_readable_line(tmp_path):
    """MobileNetV2's state dict given for ResNet18: a few names of each kind, the rest counted."""
    import torchvision

    from parity.capture.torch_capture import _load_weights
    from parity.errors import ParityInputError
    from parity.weights import save_state_dict_bytes
    path = tmp_path / "mobilenet.safetensors"
    path.write_bytes(save_state_dict_bytes(
        {k: v.numpy() for k, v in torchvision.models.mobilenet_v2().state_dict().items()}))
    with pytest.raises(ParityInputError, match="does not fit the torch model") as error:
        _load_weights(torchvision.models.resnet18(), path)
    message = str(error.value)
    assert re.search(r"missing keys: .* and \d+ more", message)
    assert re.search(r"unexpected keys: .* and \d+ more", message)
    assert len(message) < 2000


def test_a_framework_error_becomes_one_line_with_the_advice():
    """MindSpore's messages run to a C++ stack: the first line is kept, then the advice."""
    from parity.capture.common import failure_explained
    from parity.errors import ParityInputError
    with pytest.raises(ParityInputError) as error:
        with failure_explained("MindSpore", "on the batch", "Do this."):
            raise ValueError("shape is wrong.\n\n- C++ Call Stack:\nframe 0")
    assert str(error.value) == ("the MindSpore model failed on the batch: ValueError: shape is "
                                "wrong. Do this.")


def test_integer_settings_take_integers_of_any_kind_and_only_integers():
    """A fractional count passed (2.5 >= 1) into the captures; numpy's integers are integers,
    kept as Python's so that the configuration is written as JSON."""
    from parity.config import StepConfig
    for name in ("batch_size", "image_size", "num_classes", "seed"):
        with pytest.raises(ValueError, match=f"{name} must be .*integer.*, got 2.5"):
            StepConfig(**{name: 2.5})
    config = StepConfig(batch_size=np.int64(4), seed=np.uint32(7), lr=np.float32(0.5))
    assert json.loads(json.dumps(config.to_dict()))["batch_size"] == 4
    assert (type(config.seed), type(config.lr)) == (int, float)
    assert StepConfig(batch_size=None, image_size=None).batch_size is None


def test_switches_take_true_or_false_only():
    """A string "no" is true to Python: it would have switched Nesterov momentum on."""
    from parity.config import StepConfig
    for name in ("nesterov", "ms_scale_loss"):
        for value in ("no", None, 1):
            with pytest.raises(ValueError, match=f"{name} must be true or false, got"):
                StepConfig(**{name: value})
    config = StepConfig(ms_scale_loss=np.False_)
    assert type(config.ms_scale_loss) is bool and not config.ms_scale_loss


@pytest.mark.parametrize("error, ran_out", [
    (RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't "
                  "allocate memory: you tried to allocate 102760448 bytes."),   # torch, measured
     "ran out of memory"),
    (MemoryError("Unable to allocate 98.0 MiB for an array"), "ran out of memory"),   # numpy
    # MindSpore 2.8.0 under ulimit -v 2500000 and 3000000 (batch 2, 64²), measured; each was
    # told the port took the wrong inputs
    (RuntimeError("Allocate output memory failed, alloc node:Default/Conv2D-op0 alloc "
                  "size:524288B."), "ran out of memory"),
    (RuntimeError("could not create a primitive"), "most likely ran out of memory")])
def test_a_step_out_of_memory_is_told_to_take_a_smaller_batch(error, ran_out):
    """It was told the batch might be too small ("a larger --batch-size or --image-size")."""
    from parity.capture.common import failure_explained
    from parity.errors import ParityInputError
    with pytest.raises(ParityInputError) as told:
        with failure_explained("torch", "on the batch", "A larger batch, maybe."):
            raise error
    message = str(told.value)
    assert message.startswith(f"the torch step {ran_out} on the batch: "
                              f"{type(error).__name__}: ")
    assert message.endswith("a smaller batch needs less (--batch-size, --image-size, or fewer "
                            "samples in --input)")
    assert "larger" not in message


@pytest.mark.parametrize("message", [
    "could not create a primitive descriptor for a convolution forward propagation primitive",
    "Sync stream failed", "For 'Conv2D', the 'x' shape must be 4-D"])
def test_other_framework_errors_are_not_taken_for_memory(message):
    from parity.errors import memory_ran_out
    assert memory_ran_out(RuntimeError(message)) == ""


def test_the_float64_step_out_of_memory_is_told_it_can_be_skipped():
    from parity.capture.torch_capture import _float64_step_errors
    from parity.errors import ParityInputError
    with pytest.raises(ParityInputError, match="ran out of memory in parity's float64 rerun .*: "
                       "MemoryError; that step, the torch capture's largest, is skipped with "
                       "--no-fp64-reference"):
        with _float64_step_errors():
            raise MemoryError()


@pytest.mark.parametrize("seed", [-1, 2**32])
def test_a_seed_mindspore_cannot_take_is_refused_before_any_capture(seed):
    from parity.config import StepConfig
    with pytest.raises(ValueError, match="seed must be an integer between 0 and 2\\*\\*32 - 1"):
        StepConfig(seed=seed)


def test_the_platform_is_named_without_starting_a_process(monkeypatch):
    """platform.platform() runs `uname -p`, which the MindSpore capture did at its memory peak
    (the bench's sampler once counted that child as a second copy of the capture)."""
    import platform
    import subprocess

    from parity.capture.common import framework_versions
    expected = platform.platform()
    monkeypatch.setattr(platform, "_uname_cache", None)     # platform's caches: read afresh
    monkeypatch.setattr(platform, "_platform_cache", {})

    def started(*args, **kwargs):
        raise AssertionError(f"started {args}")

    monkeypatch.setattr(subprocess, "check_output", started)
    assert framework_versions("torch")["platform"] == expected


@pytest.mark.parametrize("outputs, said", [
    ({"logits": 0}, "a dict ('logits') (as Hugging Face models return: to train on its logits "
                    "alone, wrap the model in a module returning model(...).logits)"),
    ({"logits": 0, "aux": 1}, "a dict ('logits', 'aux') (as Hugging Face models return: to "
                              "train on its logits alone, wrap the model in a module returning "
                              "model(...).logits)"),
    ({"out": 0, "aux": 1}, "a dict ('out', 'aux')"),
    ((0,), "a tuple of 1 output"), ([0, 1], "a list of 2 outputs"),
    (np.zeros(2), "")])
def test_a_model_s_several_outputs_are_named(outputs, said):
    """A dict of outputs was "a dict of 1 outputs": its keys say what the loss must take, and
    one holding logits how to take them alone."""
    assert several_outputs(outputs) == said


@pytest.mark.parametrize("outputs, names", [
    ("t", ["attn"]), (("t",), ["attn"]),
    (("t", None), ["attn"]),           # torch's MultiheadAttention with need_weights=False
    (("t", "w"), ["attn.out0", "attn.out1"]), ((None, "t"), ["attn.out0", "attn.out1"])])
def test_an_output_is_named_alike_whatever_trailing_nones_a_framework_returns(outputs, names):
    """torch's attention returned (output, None) and MindSpore's (output,): the first was
    named attn.out0, the second attn, and the two stayed unmatched."""
    assert [name for name, _ in output_names("attn", outputs)] == names


def test_a_rerounded_value_is_its_float_neighbour_and_integers_stay():
    """The rerounded step's draw: every float moved by exactly one step of its own spacing,
    up or down, both ways taken; token ids untouched."""
    rng = np.random.default_rng(0)
    values = np.array([0.0, 1.0, -3.5, 1e-30, 6e4, 0.1] * 50, np.float32)
    moved = one_rounding_off(values, rng)
    assert moved.dtype == np.float32
    down, up = np.nextafter(values, -np.inf) == moved, np.nextafter(values, np.inf) == moved
    assert down.any() and up.any() and (down | up).all()
    ids = np.arange(6)
    assert one_rounding_off(ids, rng) is ids


def _flipping_pair_model():
    """A ReLU unit active in float64 and not in float32: 1 + 3e-8 - 1, added in that order, is
    0 in float32 (3e-8 is under half a rounding of 1) and 3e-8 in float64."""
    import torch

    class InOrder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(3))

        def forward(self, x):
            x = x * self.scale
            return (x[:, 0:1] + x[:, 1:2]) + x[:, 2:3]

    return torch.nn.Sequential(InOrder(), torch.nn.ReLU(inplace=True), torch.nn.Linear(1, 2))


def test_the_float64_step_replays_the_float32_step_s_relu_units(tmp_path):
    """A unit blocked in float32 passed the gradient in float64, so torch's float32 error of
    every gradient before it was the share that unit passed (here 90 % of `0.scale`'s): units
    flipping, not rounding, were most of torch's measured float32 gradient error (4.2 % of
    ResNet50's at batch 2, 64², median over its parameters; 0.028 % replayed)."""
    import torch

    from parity.capture.batch import Batch
    from parity.capture.torch_capture import capture_torch
    from parity.config import StepConfig
    from parity.rundir import RunReader

    torch.manual_seed(0)
    x = np.array([[1.0, 3e-8, -1.0], [2.0, 0.0, -1.0]], np.float32)   # the second: 1 in both
    model = _flipping_pair_model()
    capture_torch(StepConfig(), tmp_path / "run", model=model, batch=Batch.of((x,), [0, 1]))
    assert model[1].inplace                 # as it came
    records = {(r.kind, r.name): r for r in RunReader.open(tmp_path / "run").records}
    relu, scale = records[("forward", "1")], records[("grad", "0.scale")]
    assert relu.fp32_flipped == ()
    assert scale.exact_rms > 0 and scale.fp32_noise_rms < 1e-6 * scale.exact_rms
    assert scale.fp32_spread_rms < 1e-6 * scale.exact_rms      # so in the rerounded steps


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_relu_run_again_by_activation_checkpointing_replays_its_float32_units(tmp_path,
                                                                               reentrant):
    """The flipping pair's ReLU inside torch.utils.checkpoint runs again in the backward: the
    torch capture stopped there (non-reentrant: the rerun kept other tensors than the first), or
    the rerun, whose graph the backward uses (reentrant), let the float32-blocked unit pass in
    float64, and torch's float32 error of `scale`'s gradient was three times its size."""
    import torch

    from parity.capture.batch import Batch
    from parity.capture.torch_capture import capture_torch
    from parity.config import StepConfig
    from parity.rundir import RunReader

    class Checkpointed(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return torch.utils.checkpoint.checkpoint(self.inner, x, use_reentrant=reentrant)

    torch.manual_seed(0)
    x = np.array([[1.0, 3e-8, -1.0], [2.0, 0.0, -1.0]], np.float32)
    pair = _flipping_pair_model()
    pair[1].inplace = False         # in place, it would overwrite the checkpoint's input
    model = torch.nn.Sequential(pair[0], Checkpointed(pair[1]), pair[2])
    capture_torch(StepConfig(), tmp_path / "run", model=model, batch=Batch.of((x,), [0, 1]))
    records = {(r.kind, r.name): r for r in RunReader.open(tmp_path / "run").records}
    assert ("forward", "1.inner#1") not in records        # recorded once
    scale = records[("grad", "0.scale")]
    assert scale.exact_rms > 0 and scale.fp32_noise_rms < 1e-6 * scale.exact_rms
    assert scale.fp32_spread_rms < 1e-6 * scale.exact_rms


@pytest.mark.parametrize("unused", ["head", "checkpointed"])
def test_parameters_no_gradient_reaches_are_left_as_they_are_and_listed(tmp_path, unused):
    """A parameter the forward never uses (an auxiliary head), or one inside a reentrant
    torch.utils.checkpoint whose inputs need no gradient, gets no gradient, and torch's SGD
    leaves it as it is. It was refused ("unused parameters cannot be compared"); now it is
    recorded as state, as a frozen one is, and the manifest lists it for the MindSpore capture,
    which leaves it out of its step too."""
    import torch

    from parity.capture.batch import Batch
    from parity.capture.torch_capture import capture_torch
    from parity.config import StepConfig
    from parity.rundir import RunReader

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = torch.nn.Linear(3, 4)
            self.head = torch.nn.Linear(4, 2)

        def forward(self, x):
            if unused == "head":
                return self.stem(x)[:, :2]
            x = torch.utils.checkpoint.checkpoint(self.stem, x, use_reentrant=True)
            return self.head(x)

    batch = Batch.of((np.ones((2, 3), np.float32),), [0, 1])
    missing = ["head.weight", "head.bias"] if unused == "head" else ["stem.weight", "stem.bias"]
    model = Net()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    with pytest.warns(UserWarning, match="None of the inputs have requires_grad=True") \
            if unused == "checkpointed" else nullcontext():
        capture_torch(StepConfig(), tmp_path / "run", model=model, batch=batch)
    run = RunReader.open(tmp_path / "run")
    assert run.manifest["no_gradient"] == missing
    kinds = {(r.name, r.kind) for r in run.records}
    for name in missing:
        assert (name, "buffer") in kinds and (name, "grad") not in kinds
        assert np.array_equal(run.tensor(run.record(name, "buffer")), before[name].numpy())
    stepped = {"stem.weight", "stem.bias", "head.weight", "head.bias"} - set(missing)
    assert {name for name, kind in kinds if kind == "update"} == stepped


def test_the_synchronous_capture_leaves_mindspores_heap_whole():
    """MindSpore 2.8.0 whose first op runs synchronous corrupts its heap at a copying reshape
    of a transposed tensor (nn.PixelShuffle's), and the process aborts at exit (SIGABRT,
    "malloc_consolidate(): unaligned fastbin chunk detected"): parity.check in a user's pytest
    did after a PixelShuffle pair passed. The capture's synchronous mode runs one op first,
    in a fresh process as here."""
    import subprocess
    import sys
    script = ("import mindspore as ms, numpy as np\n"
              "from parity.capture.mindspore_capture import _synchronous_on_cpu\n"
              "ms.set_context(mode=ms.PYNATIVE_MODE)\n"
              "with _synchronous_on_cpu():\n"
              "    x = ms.Tensor(np.ones((2, 8, 4, 4), np.float32))\n"
              "    print(x.transpose(0, 2, 3, 1).reshape(2, -1).shape)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-500:]
    assert "(2, 128)" in done.stdout


def test_rerounded_batch_norms_sum_each_channel_one_value_after_another():
    """Within sequential_kernel_sums (torch's rerounded steps) a BatchNorm on batch statistics
    passes back dx moved by γ/σ · (sequential float32 Σdy − Σdy)/n in each channel and a bias
    gradient moved by sequential float32 Σdy − Σdy, as a kernel summing one value after another
    would; one using its running statistics is left as it is, and so is everything after."""
    import torch

    from parity.capture.sequential_sums import sequential_kernel_sums
    torch.manual_seed(0)
    conv, bn, fc = torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), \
        torch.nn.Linear(4, 3)
    frozen = torch.nn.BatchNorm2d(4).eval()
    x = torch.randn(2, 3, 32, 32)

    def step():
        seen = {}
        for param in (*conv.parameters(), *bn.parameters(), *frozen.parameters()):
            param.grad = None
        h = conv(x)
        h.register_hook(lambda g: seen.__setitem__("dx", g.numpy().copy()))
        y = bn(h)
        y.register_hook(lambda g: seen.__setitem__("dy", g.numpy().copy()))
        fc(frozen(torch.relu(y)).mean((2, 3))).sum().backward()
        return seen, {name: p.grad.numpy().copy() for name, p in
                      (("bias", bn.bias), ("frozen", frozen.bias), ("conv", conv.weight))}

    plain, plain_grads = step()
    with sequential_kernel_sums(torch.nn.Sequential(conv, bn, frozen)):
        moved, moved_grads = step()
    after, after_grads = step()

    rows = plain["dy"].transpose(0, 2, 3, 1).reshape(-1, 4)
    off = np.add.accumulate(rows, axis=0, dtype=np.float32)[-1].astype(np.float64) - \
        rows.sum(axis=0, dtype=np.float64)
    assert np.abs(off).max() > 0
    sigma = np.sqrt(conv(x).detach().numpy().astype(np.float64).var(axis=(0, 2, 3)) + bn.eps)
    shift = (np.abs(bn.weight.detach().numpy()) / sigma * off / rows.shape[0]).reshape(1, 4, 1, 1)
    eps = np.finfo(np.float32).eps
    np.testing.assert_allclose(moved["dx"] - plain["dx"],
                               np.broadcast_to(-shift, plain["dx"].shape), rtol=1e-2,
                               atol=4 * eps * np.abs(plain["dx"]).max())
    np.testing.assert_allclose(moved_grads["bias"] - plain_grads["bias"], off, rtol=1e-3,
                               atol=4 * eps * np.abs(plain_grads["bias"]).max())
    assert np.array_equal(moved_grads["frozen"], plain_grads["frozen"])
    for name in plain_grads:
        assert np.array_equal(after_grads[name], plain_grads[name]), name
    assert np.array_equal(after["dx"], plain["dx"])


def test_rerounded_layer_norms_take_each_rows_mean_one_value_after_another():
    """Within sequential_kernel_sums a LayerNorm passes back dx moved by
    (sequential float32 Σγ·dy − Σγ·dy)/(n·σ) in each normalised row, as a kernel summing one
    value after another would; its own gradients, and the steps after, are left as they are."""
    import torch

    from parity.capture.sequential_sums import sequential_kernel_sums
    torch.manual_seed(0)
    conv, norm = torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.LayerNorm([4, 256, 256])
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 3, 256, 256)

    def step():
        seen = {}
        for param in (*conv.parameters(), *norm.parameters()):
            param.grad = None
        h = conv(x)
        h.register_hook(lambda g: seen.__setitem__("dx", g.numpy().copy()))
        y = norm(h)
        y.register_hook(lambda g: seen.__setitem__("dy", g.numpy().copy()))
        torch.relu(y).mean().backward()       # dy of one sign: the sum rounds coherently
        seen["x"] = h.detach().numpy()
        return seen, {name: p.grad.numpy().copy() for name, p in
                      (("weight", norm.weight), ("bias", norm.bias), ("conv", conv.weight))}

    plain, plain_grads = step()
    with sequential_kernel_sums(torch.nn.Sequential(conv, norm)):
        moved, moved_grads = step()
    after, after_grads = step()

    rows = (plain["dy"] * norm.weight.detach().numpy()).reshape(2, -1)
    off = np.add.accumulate(rows, axis=1, dtype=np.float32)[:, -1].astype(np.float64) - \
        rows.sum(axis=1, dtype=np.float64)
    sigma = np.sqrt(plain["x"].astype(np.float64).reshape(2, -1).var(axis=1) + norm.eps)
    shift = (off / sigma / rows.shape[1]).reshape(2, 1, 1, 1)
    # each dx element moved by the shift and rounded to float32 (eps/2 · |dx|): elementwise,
    # and in each row's mean, where the roundings average out and the shift stays
    moved_by = moved["dx"] - plain["dx"]
    eps = np.finfo(np.float32).eps
    assert np.all(np.abs(moved_by + shift) <= 1e-2 * np.abs(shift) + eps * np.abs(plain["dx"]))
    np.testing.assert_allclose(moved_by.reshape(2, -1).mean(axis=1, dtype=np.float64),
                               -shift.reshape(2), rtol=1e-2)
    assert not np.array_equal(moved_grads["conv"], plain_grads["conv"])
    for name in ("weight", "bias"):
        assert np.array_equal(moved_grads[name], plain_grads[name]), name
    for name in plain_grads:
        assert np.array_equal(after_grads[name], plain_grads[name]), name
    assert np.array_equal(after["dx"], plain["dx"])


@pytest.mark.parametrize("channels", [1, 4])
def test_rerounded_prelus_sum_their_weight_gradient_one_value_after_another(channels):
    """Within sequential_kernel_sums a PReLU's weight gradient is moved by what a sequential
    float32 sum of x·dy over x < 0 leaves, over the whole input in memory order for one weight,
    over each channel's values (samples, then space) for one a channel: MindSpore 2.8.0's CPU
    kernel sums so. dx, the layers before and the steps after are left as they are."""
    import torch

    from parity.capture.sequential_sums import sequential_kernel_sums
    torch.manual_seed(0)
    conv, prelu = torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.PReLU(channels)
    x = torch.randn(2, 3, 256, 256)

    def step():
        seen = {}
        for param in (*conv.parameters(), *prelu.parameters()):
            param.grad = None
        h = conv(x)
        h.register_hook(lambda g: seen.__setitem__("dx", g.numpy().copy()))
        y = prelu(h)
        y.register_hook(lambda g: seen.__setitem__("dy", g.numpy().copy()))
        y.mean().backward()          # dy of one sign: the sum rounds coherently
        seen["x"] = h.detach().numpy()
        return seen, {"weight": prelu.weight.grad.numpy().copy(),
                      "conv": conv.weight.grad.numpy().copy()}

    plain, plain_grads = step()
    with sequential_kernel_sums(torch.nn.Sequential(conv, prelu)):
        moved, moved_grads = step()
    after, after_grads = step()

    terms = np.where(plain["x"] < 0, plain["x"] * plain["dy"], np.float32(0))
    rows = terms.reshape(-1, 1) if channels == 1 else np.moveaxis(terms, 1, 0).reshape(4, -1).T
    off = np.add.accumulate(rows, axis=0, dtype=np.float32)[-1].astype(np.float64) - \
        rows.sum(axis=0, dtype=np.float64)
    grad = plain_grads["weight"]        # moved by off, then rounded to float32: eps/2 · |grad|
    eps = np.finfo(np.float32).eps
    assert np.all(np.abs(off) > 4 * eps * np.abs(grad))
    assert np.all(np.abs(moved_grads["weight"] - grad - off) <= 1e-3 * np.abs(off)
                  + eps * np.abs(grad))
    assert np.array_equal(moved_grads["conv"], plain_grads["conv"])
    assert np.array_equal(moved["dx"], plain["dx"])
    for name in plain_grads:
        assert np.array_equal(after_grads[name], plain_grads[name]), name


def test_rerounded_norms_leave_a_subclass_normalising_other_axes_as_it_is():
    """torchvision's LayerNorm2d (ConvNeXt) is a LayerNorm whose forward normalises its input's
    channels, moved last: drawn as a LayerNorm over its input's last axis, its backward failed
    (γ of 16 channels against 8 columns; where the two sizes match, the wrong rows would move)."""
    import torch

    from parity.capture.sequential_sums import sequential_kernel_sums
    from tests.tiny import TorchLayerNorm2d
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), TorchLayerNorm2d(16))
    x = torch.randn(2, 3, 8, 8)
    net(x).relu().mean().backward()
    plain = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    with sequential_kernel_sums(net):
        net(x).relu().mean().backward()
    assert all(torch.equal(p.grad, g) for p, g in zip(net.parameters(), plain))


def test_rerounded_group_norms_sum_each_sample_channel_one_value_after_another():
    """Within sequential_kernel_sums a GroupNorm's bias gradient is moved by what sequential
    float32 sums of dy over each sample's channel leave, and its weight gradient by those of dy·x
    less μ times those of dy, over σ (the sums MindSpore 2.8.0's kernel takes, one value after
    another); dx, the layers before and the steps after are left as they are."""
    import torch

    from parity.capture.sequential_sums import sequential_kernel_sums
    torch.manual_seed(0)
    conv, gn, fc = torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.GroupNorm(2, 4), \
        torch.nn.Linear(4, 3)
    x = torch.randn(2, 3, 128, 128) + 1     # μ ≠ 0: γ's two sums cancel

    def step():
        seen = {}
        for param in (*conv.parameters(), *gn.parameters()):
            param.grad = None
        h = conv(x)
        h.register_hook(lambda g: seen.__setitem__("dx", g.numpy().copy()))
        y = gn(h)
        y.register_hook(lambda g: seen.__setitem__("dy", g.numpy().copy()))
        fc(torch.relu(y).mean((2, 3))).sum().backward()
        seen["x"] = h.detach().numpy()
        return seen, {name: p.grad.numpy().copy() for name, p in
                      (("weight", gn.weight), ("bias", gn.bias), ("conv", conv.weight))}

    plain, plain_grads = step()
    with sequential_kernel_sums(torch.nn.Sequential(conv, gn)):
        moved, moved_grads = step()
    after, after_grads = step()

    def rounding(terms):
        rows = terms.reshape(2 * 4, -1)
        return (np.add.accumulate(rows, axis=1, dtype=np.float32)[:, -1].astype(np.float64)
                - rows.sum(axis=1, dtype=np.float64)).reshape(2, 4)
    dy, h = plain["dy"], plain["x"]
    groups = h.astype(np.float64).reshape(2, 2, -1)
    mean, sigma = (np.repeat(v, 2, axis=1) for v in
                   (groups.mean(axis=-1), np.sqrt(groups.var(axis=-1) + gn.eps)))
    dy_sum, dyx_sum = rounding(dy), rounding(dy * h)
    eps = np.finfo(np.float32).eps
    for name, off in (("bias", dy_sum.sum(axis=0)),
                      ("weight", ((dyx_sum - mean * dy_sum) / sigma).sum(axis=0))):
        grad = plain_grads[name]      # moved by off, then rounded to float32: eps/2 · |grad|
        assert np.all(np.abs(off) > 10 * eps * np.abs(grad)), name
        assert np.all(np.abs(moved_grads[name] - grad - off) <= 1e-3 * np.abs(off)
                      + eps * np.abs(grad)), name
    assert np.array_equal(moved_grads["conv"], plain_grads["conv"])
    assert np.array_equal(moved["dx"], plain["dx"])
    for name in plain_grads:
        assert np.array_equal(after_grads[name], plain_grads[name]), name

