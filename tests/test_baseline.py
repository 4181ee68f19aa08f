"""Golden baselines catch drift that absolute tolerances let through."""

from __future__ import annotations

import dataclasses
import json

import pytest

from parity import baseline
from parity.errors import ParityInputError
from parity.result import CheckResult
from tests.conftest import assert_one_line_error, parity_cli


@pytest.fixture(scope="module")
def good(tiny_run) -> CheckResult:
    from parity.compare.engine import compare_runs
    return compare_runs(tiny_run / "torch", tiny_run / "mindspore")


def _drifted(result: CheckResult, factor: float) -> CheckResult:
    """Every error multiplied by ``factor`` (records keep passing their tolerances)."""
    return dataclasses.replace(result, comparisons=tuple(
        dataclasses.replace(c, ms_error=c.ms_error * factor, max_rel=c.max_rel * factor)
        for c in result.comparisons))


def test_drift_beyond_the_factor_fails(good, tmp_path):
    path = baseline.save(good, tmp_path / "golden.json")
    drift = baseline.check(_drifted(good, 50.0), path, factor=4)
    assert not drift.passed
    assert drift.grown and "grew beyond 4x" in drift.message()


def test_drift_within_the_factor_passes(good, tmp_path):
    path = baseline.save(good, tmp_path / "golden.json")
    assert baseline.check(_drifted(good, 3.0), path, factor=4).passed


@pytest.mark.parametrize("factor", [0.5, float("nan"), float("inf")])
def test_a_factor_that_cannot_bound_growth_is_refused(good, tmp_path, factor):
    """NaN made every record 'grow' (no comparison with it holds); inf let any growth pass."""
    path = baseline.save(good, tmp_path / "golden.json")
    with pytest.raises(ParityInputError, match="--factor must be a finite number >= 1"):
        baseline.check(good, path, factor=factor)


def test_errors_below_float32_resolution_are_not_drift(good, tmp_path):
    path = baseline.save(dataclasses.replace(good, comparisons=tuple(
        dataclasses.replace(c, ms_error=0.0) for c in good.comparisons)), tmp_path / "g.json")
    tiny_growth = dataclasses.replace(good, comparisons=tuple(
        dataclasses.replace(c, ms_error=3e-7) for c in good.comparisons))
    assert baseline.check(tiny_growth, path, factor=4).passed


def test_missing_records_fail(good, tmp_path):
    path = baseline.save(good, tmp_path / "golden.json")
    fewer = dataclasses.replace(good, comparisons=good.comparisons[:-3])
    drift = baseline.check(fewer, path)
    assert not drift.passed and len(drift.missing) == 3


def test_failing_run_is_never_saved_as_a_baseline(good, tmp_path):
    failing = dataclasses.replace(good, comparisons=(
        dataclasses.replace(good.comparisons[0], passed=False),) + good.comparisons[1:])
    with pytest.raises(ParityInputError, match="known-good"):
        baseline.save(failing, tmp_path / "golden.json")


def test_cli_save_and_check(tiny_run, tmp_path):
    golden = tmp_path / "golden.json"
    assert parity_cli("baseline", "save", tiny_run.parent / "report.json",
                      "--out", golden).returncode == 0
    checked = parity_cli("baseline", "check", tiny_run, golden)
    assert checked.returncode == 0, checked.stderr
    data = json.loads(golden.read_text())
    data["errors"] = {k: v / 100 for k, v in data["errors"].items()}
    golden.write_text(json.dumps(data))
    drifted = parity_cli("baseline", "check", tiny_run, golden)
    assert drifted.returncode == 1
    assert "baseline drift" in drifted.stdout


def test_baseline_from_other_weights_or_batch_is_refused(good, tmp_path):
    """Errors of a run that started elsewhere say nothing about drift (an unseeded model)."""
    assert len(good.meta.fingerprint) == 8
    path = baseline.save(good, tmp_path / "golden.json")
    other = dataclasses.replace(good, meta=dataclasses.replace(good.meta, fingerprint="0badf00d"))
    with pytest.raises(ParityInputError, match="other initial weights or another batch"):
        baseline.check(other, path)


def test_cli_refuses_a_baseline_of_another_batch(tiny_run, tmp_path):
    golden = tmp_path / "golden.json"
    assert parity_cli("baseline", "save", tiny_run.parent / "report.json",
                      "--out", golden).returncode == 0
    data = json.loads(golden.read_text())
    golden.write_text(json.dumps({**data, "fingerprint": "0badf00d"}))
    assert_one_line_error(parity_cli("baseline", "check", tiny_run, golden),
                          "torch.manual_seed", "re-save the baseline")


def test_cli_missing_baseline_file(tiny_run, tmp_path):
    process = parity_cli("baseline", "check", tiny_run, tmp_path / "nope.json")
    assert_one_line_error(process, "does not exist")


@pytest.mark.parametrize("errors, told", [
    (None, "its 'errors' is null, not a table"), (["forward:fc"], "its 'errors' is [\"forward:fc"),
    ({"forward:fc": "x", "loss:loss": 0.1, "grad:fc": True}, 'not numbers: forward:fc "x", '
                                                            "grad:fc true)"),
    ("drop", "no 'errors' field")])
def test_a_baseline_without_a_table_of_errors_is_refused(good, tmp_path, errors, told):
    path = baseline.save(good, tmp_path / "golden.json")
    data = json.loads(path.read_text())
    if errors == "drop":
        del data["errors"]
    else:
        data["errors"] = errors
    path.write_text(json.dumps(data))
    with pytest.raises(ParityInputError, match="has no readable table of errors") as refused:
        baseline.check(good, path)
    assert told in str(refused.value) and "save it again ('parity baseline save" in \
        str(refused.value)
