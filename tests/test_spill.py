"""The float64 step's saved tensors spilled to a scratch file: same numbers, nothing left; and
a model that fails only in that float64 step (told how to skip it, or run again unspilled)."""

from __future__ import annotations

import errno
import gc
import os
import weakref

import pytest
import torch
import torch.nn as tnn

from parity.capture import spill as spill_module
from parity.capture.spill import MIN_BYTES, SavedTensorSpill
from parity.errors import ParityInputError
from parity.rundir import RunReader
from tests.conftest import assert_one_line_error, parity_cli, skip_without_o_direct


def _net() -> tnn.Module:
    """conv → in-place ReLU → conv: the ReLU's output (2 × 32 × 64² float64, 2 MiB) is saved
    by the ReLU and by the second convolution."""
    torch.manual_seed(0)
    return tnn.Sequential(tnn.Conv2d(3, 32, 3, padding=1), tnn.ReLU(inplace=True),
                          tnn.Conv2d(32, 4, 3, padding=1)).double()


def _gradients(model: tnn.Module, x: torch.Tensor) -> list:
    model.zero_grad(set_to_none=True)
    model(x).square().sum().backward()
    return [p.grad.numpy().copy() for p in model.parameters()]


def test_a_spilled_step_gives_the_same_gradients_bit_for_bit(tmp_path):
    model, x = _net(), torch.randn(2, 3, 64, 64, dtype=torch.float64)
    kept = _gradients(model, x)
    scratch = tmp_path / "saved.scratch"
    with SavedTensorSpill(scratch, budget=0) as spill:
        spilled = _gradients(model, x)
    relu_output_bytes = 2 * 32 * 64 * 64 * 8
    assert relu_output_bytes >= MIN_BYTES
    assert spill.spilled_bytes == relu_output_bytes       # written once, though saved twice
    for a, b in zip(kept, spilled):
        assert a.tobytes() == b.tobytes()
    assert not scratch.exists()


@pytest.mark.parametrize("refused_at", ["", "open", "first write", "second write"])
def test_spilled_tensors_come_back_the_same_past_the_page_cache_or_through_it(
        tmp_path, monkeypatch, refused_at):
    """Written and read with O_DIRECT; where the file system refuses it, at open or at a write,
    through the page cache from then on."""
    from parity import direct_io
    if refused_at != "open":
        skip_without_o_direct(tmp_path)
    opened, written = [], []

    class Refusing(direct_io.DirectFile):
        def __init__(self, *args, **kwargs):
            opened.append(1)
            if refused_at == "open":
                raise OSError(errno.EINVAL, "Invalid argument")
            super().__init__(*args, **kwargs)

        def write(self, offset, chunks):
            written.append(offset)
            if refused_at == ("first write", "second write")[min(len(written), 2) - 1]:
                raise OSError(errno.EINVAL, "Invalid argument")
            return super().write(offset, chunks)
    monkeypatch.setattr(direct_io, "O_DIRECT", direct_io.O_DIRECT or os.O_SYNC)   # any platform
    monkeypatch.setattr(direct_io, "DirectFile", Refusing)
    monkeypatch.setattr(spill_module, "MIN_BYTES", 0)
    model, x = _net(), torch.randn(2, 3, 64, 64, dtype=torch.float64)
    kept = _gradients(model, x)
    with SavedTensorSpill(tmp_path / "saved.scratch", budget=0) as spill:
        spilled = _gradients(model, x)
    assert spill.spilled_bytes > 2 * 32 * 64 * 64 * 8       # more than one tensor
    assert len(opened) == 1
    if refused_at:
        assert len(written) == {"open": 0, "first write": 1, "second write": 2}[refused_at]
    else:       # every tensor, each on a block boundary
        assert len(written) > 1 and all(offset % direct_io.BLOCK == 0 for offset in written)
    assert [a.tobytes() for a in kept] == [b.tobytes() for b in spilled]


@pytest.mark.parametrize("budget, freed", [(0, True), (1 << 50, False)])
def test_a_spilled_tensor_leaves_memory_until_backward_reads_it(tmp_path, budget, freed):
    model, x = _net(), torch.randn(2, 3, 64, 64, dtype=torch.float64)
    with SavedTensorSpill(tmp_path / "saved.scratch", budget=budget):
        hidden = model[1](model[0](x))
        storage = weakref.ref(hidden.untyped_storage())
        loss = model[2](hidden).square().sum()
        del hidden
        gc.collect()
        assert (storage() is None) is freed
        loss.backward()


def test_parameters_and_their_views_stay_in_memory(tmp_path):
    """Autograd saves a convolution's weight itself and a matmul's operand as passed (here a
    view of a parameter): both live on with the model, so writing them would free nothing."""
    conv = tnn.Conv2d(512, 512, 3).double()                 # weight 18 MiB
    flat = tnn.Parameter(torch.randn(1024 * 1024, dtype=torch.float64))      # 8 MiB
    x = torch.randn(1, 512, 8, 8, dtype=torch.float64, requires_grad=True)
    with SavedTensorSpill(tmp_path / "saved.scratch", budget=0) as spill:
        (conv(x).sum() + (x.reshape(32, 1024) @ flat.view(1024, 1024)).sum()).backward()
    assert spill.spilled_bytes == 0


def test_nothing_is_spilled_under_the_budget(tmp_path):
    model, x = _net(), torch.randn(2, 3, 64, 64, dtype=torch.float64)
    with SavedTensorSpill(tmp_path / "saved.scratch", budget=1 << 50) as spill:
        _gradients(model, x)
    assert spill.spilled_bytes == 0 and list(tmp_path.iterdir()) == []


def test_a_full_disk_while_spilling_is_a_clean_error(tmp_path, monkeypatch):
    def full_disk(*_):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(spill_module.os, "pwrite", full_disk)
    model, x = _net(), torch.randn(2, 3, 64, 64, dtype=torch.float64)
    with pytest.raises(ParityInputError) as refused:
        with SavedTensorSpill(tmp_path / "saved.scratch", budget=0, written_for=tmp_path):
            _gradients(model, x)
    assert str(refused.value) == (f"no space left on the device while writing {tmp_path}; free "
                                  "some space or write elsewhere")     # not the hidden scratch
    assert list(tmp_path.iterdir()) == []


def _capture(out, monkeypatch, spill_everything: bool):
    from parity.capture import torch_capture
    from parity.config import StepConfig
    if spill_everything:
        monkeypatch.setattr(torch_capture, "peak_resident_bytes", lambda: 0)
        monkeypatch.setattr(spill_module, "MIN_BYTES", 0)
    torch_capture.capture_torch(StepConfig(batch_size=2, image_size=16), out,
                                factory="tests.tiny:torch_tiny")
    return RunReader.open(out)


def test_a_capture_that_spills_measures_the_same_float64_noise(tmp_path, monkeypatch):
    plain = _capture(tmp_path / "plain", monkeypatch, spill_everything=False)
    spilled = _capture(tmp_path / "spilled", monkeypatch, spill_everything=True)
    assert plain.manifest["resources"]["float64_spilled_mb"] == 0
    assert spilled.manifest["resources"]["float64_spilled_mb"] > 0
    noise = [(r.kind, r.name, r.fp32_noise_rms, r.exact_rms, r.fp32_flipped)
             for r in plain.records]
    assert noise == [(r.kind, r.name, r.fp32_noise_rms, r.exact_rms, r.fp32_flipped)
                     for r in spilled.records]
    assert any(r.fp32_noise_rms for r in spilled.records)
    for record in plain.records:
        assert plain.tensor(record).tobytes() == spilled.tensor(record).tobytes()
    assert sorted(p.name for p in (tmp_path / "spilled").iterdir()) == \
        sorted(p.name for p in (tmp_path / "plain").iterdir())


def test_a_full_disk_while_a_capture_spills_names_its_run_directory(tmp_path, monkeypatch):
    def full_disk(*_):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(spill_module.os, "pwrite", full_disk)
    with pytest.raises(ParityInputError) as refused:
        _capture(tmp_path / "run", monkeypatch, spill_everything=True)
    assert str(refused.value).startswith(
        f"no space left on the device while writing {tmp_path / 'run'}; ")
    assert list(tmp_path.iterdir()) == []


def test_a_model_failing_only_in_the_float64_rerun_is_told_how_to_skip_it(tmp_path):
    capture = ("capture", "--framework", "torch", "--torch-model",
               "tests.tiny:torch_tiny_float32_constant", "--ms-model", "tests.tiny:ms_tiny",
               "--image-size", "16")
    process = parity_cli(*capture, "--out", tmp_path / "run")
    assert_one_line_error(process, "float64 rerun", "same dtype", "--no-fp64-reference")
    assert list(tmp_path.iterdir()) == []
    process = parity_cli(*capture, "--out", tmp_path / "run", "--no-fp64-reference")
    assert process.returncode == 0, process.stderr


def test_a_forward_refusing_saved_tensor_hooks_gets_its_float64_step_without_the_spill(
        tmp_path):
    from parity.capture.torch_capture import SPILL_FILE, capture_torch
    from parity.config import StepConfig
    capture_torch(StepConfig(batch_size=2, image_size=16), tmp_path / "run",
                  factory="tests.tiny:torch_tiny_refusing_saved_tensor_hooks")
    run = RunReader.open(tmp_path / "run")
    assert run.manifest["resources"]["float64_spilled_mb"] == 0
    assert all(r.exact_rms is not None for r in run.records if r.kind != "input")
    assert not (tmp_path / "run" / SPILL_FILE).exists()
