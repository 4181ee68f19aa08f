"""Determinism and the observer effect: captures that can be trusted to mean what they say."""

from __future__ import annotations

import numpy as np
import torch

from parity.capture.selfcheck import Fingerprints, observer_check
from parity.rundir import RunReader
from tests.conftest import TINY, parity_cli, read_json
from tests.tiny import torch_tiny


def _capture(framework: str, out, *extra):
    process = parity_cli("capture", "--framework", framework, *TINY, "--out", out, *extra)
    assert process.returncode == 0, process.stderr
    return RunReader.open(out)


def test_two_captures_with_the_same_seed_are_bit_identical(tmp_path):
    for framework in ("torch", "mindspore"):
        extra = () if framework == "torch" else ("--reference", tmp_path / "a-torch")
        first = _capture(framework, tmp_path / f"a-{framework}", *extra)
        second = _capture(framework, tmp_path / f"b-{framework}", *extra)
        assert [r.name for r in first.records] == [r.name for r in second.records]
        for a, b in zip(first.records, second.records):
            assert a.crc32 == b.crc32, f"{framework} {a.kind} {a.name} differs between captures"


def test_every_capture_proves_hooks_change_nothing(tiny_run):
    for framework in ("torch", "mindspore"):
        check = read_json(tiny_run / framework / "manifest.json")["self_checks"]["observer_effect"]
        assert check["checked"] > 0 and check["differing_count"] == 0
    report = read_json(tiny_run.parent / "report.json")
    assert any("mindspore: hooks change nothing" in note for note in report["meta"]["notes"])


def test_every_capture_says_what_each_check_cost(tiny_run):
    expected = {"torch": ["start", "hooked step", "observer rerun", "rerounded step",
                          "float64 step", "writes"],
                "mindspore": ["start", "hooked step", "observer rerun", "writes"]}
    for framework, phases in expected.items():
        resources = read_json(tiny_run / framework / "manifest.json")["resources"]
        assert list(resources["phases"]) == phases
        assert all(seconds >= 0 for seconds in resources["phases"].values())
        # the phases partition the capture's time (each is rounded to a millisecond)
        assert abs(sum(resources["phases"].values()) - resources["seconds"]) < 0.01
        after = resources["peak_rss_mb_after"]          # a peak only grows
        peaks = [after[phase] for phase in phases] + [resources["peak_rss_mb"]]
        assert all(0 < a <= b for a, b in zip(peaks, peaks[1:]))


def test_observer_check_names_what_hooks_changed():
    hooked = Fingerprints()
    hooked("fc.weight", "grad", np.ones(3, np.float32))
    hooked("loss", "loss", np.array(1.0, np.float32))

    def rerun(record):
        record("fc.weight", "grad", np.array([1, 1, 1.0000001], np.float32))
        record("loss", "loss", np.array(1.0, np.float32))

    check = observer_check(hooked, rerun)
    assert check["differing"] == ["fc.weight · grad"] and check["deterministic"] is True


def test_observer_check_tells_nondeterminism_apart():
    hooked = Fingerprints()
    hooked("loss", "loss", np.array(1.0, np.float32))
    values = iter([2.0, 3.0])

    def rerun(record):
        record("loss", "loss", np.array(next(values), np.float32))

    check = observer_check(hooked, rerun)
    assert check["differing_count"] == 1 and check["deterministic"] is False


def test_observer_check_sets_apart_a_kernel_whose_sums_vary_between_calls():
    """A parameter whose gradient a kernel sums in another order from call to call (MindSpore's
    CPU PReLU) is listed apart: the step is neither called random nor changed by hooks."""
    hooked = Fingerprints()
    hooked("prelu.w", "grad", np.array([1.0], np.float32))
    hooked("loss", "loss", np.array(1.0, np.float32))
    values = iter([2.0, 3.0, 4.0, 5.0])

    def rerun(record):
        record("prelu.w", "grad", np.array([next(values)], np.float32))
        record("loss", "loss", np.array(1.0, np.float32))

    check = observer_check(hooked, rerun, frozenset({"prelu.w"}), "its sums vary")
    assert check["differing_count"] == 0 and check["deterministic"] is True
    assert check["unsteady"] == {"differing": ["prelu.w · grad"], "count": 1,
                                 "cause": "its sums vary"}
    check = observer_check(hooked, rerun)
    assert check["differing_count"] == 1 and check["deterministic"] is False


def test_a_port_with_prelus_is_not_called_random(tmp_path):
    """Eight PReLUs of one shape: MindSpore 2.8.0's kernel searches its thread count over its
    first calls, and the order of its weight gradients' sums changes between steps (3 to 5 of
    37 tensors differed between two hook-free steps, in four runs of four). The MindSpore step
    was told "not deterministic", and a run failing elsewhere would have been diagnosed as
    random; the PReLU weights are now listed apart, with the kernel named."""
    process = parity_cli("run", "--torch-model", "tests.tiny:torch_deep_prelu", "--ms-model",
                         "tests.tiny:ms_deep_prelu", "--image-size", "64", "--out",
                         tmp_path / "run", "--json", tmp_path / "r.json", "--quiet")
    assert process.returncode == 0, process.stderr
    check = read_json(tmp_path / "run" / "mindspore" / "manifest.json")[
        "self_checks"]["observer_effect"]
    assert check["differing_count"] == 0 and check["deterministic"] is True
    assert all(name.split(" · ")[0].endswith(".w")           # MindSpore's PReLU weights
               for name in check.get("unsteady", {}).get("differing", []))
    notes = read_json(tmp_path / "r.json")["meta"]["notes"]
    assert any(note.startswith("mindspore: hooks change nothing") for note in notes)


def test_nan_in_the_weights_is_reported_not_a_crash(tmp_path):
    torch.manual_seed(0)
    state = torch_tiny().state_dict()
    state["0.weight"][0, 0, 0, 0] = float("nan")
    torch.save(state, tmp_path / "w.pth")
    process = parity_cli("run", *TINY, "--torch-weights", tmp_path / "w.pth", "--out",
                         tmp_path / "run", "--json", tmp_path / "r.json", "--quiet")
    assert process.returncode == 1, process.stderr
    report = read_json(tmp_path / "r.json")
    assert report["first_divergence"]["name"] == "0"
    assert report["first_divergence"]["kind"] == "forward"
    assert report["diagnosis"]["cause"] == "non-finite values"


def test_every_torch_record_carries_its_float64_noise(tiny_run):
    run = RunReader.open(tiny_run / "torch")
    missing = [f"{r.kind} {r.name}" for r in run.records
               if r.kind != "input" and None in (r.fp32_noise_rms, r.exact_rms, r.fp32_spread_rms)]
    assert not missing
    loss = next(r for r in run.records if r.kind == "loss")
    assert loss.exact_rms > 0
