"""The pytest plugin, driven with pytester as a user's own test suite would use it."""

from __future__ import annotations

import json

import pytest

from tests.conftest import REPO

USER_TEST = """
import mindspore
import torch
from tests.tiny import torch_tiny, ms_tiny, ms_tiny_same_padding

def test_good_port(parity_check):
    torch.manual_seed(0)
    parity_check(torch_tiny(), ms_tiny(), batch_size=2, image_size=16).assert_passed()

def test_broken_port(parity_check):
    torch.manual_seed(0)
    parity_check(torch_tiny(), ms_tiny_same_padding(), batch_size=2,
                 image_size=16).assert_passed()
"""


@pytest.fixture
def user_suite(pytester, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("GLOG_v", "3")
    pytester.makepyfile(test_user_port=USER_TEST)
    return pytester


def test_good_pair_passes_and_broken_pair_names_the_layer(user_suite, tmp_path):
    reports = tmp_path / "parity-reports"
    result = user_suite.runpytest_subprocess(f"--parity-report-dir={reports}")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*parity: first divergence at 3 · forward*",
        "*likely cause: Conv2d pad_mode='same' with stride > 1*",
        f"*report: {reports}/test_broken_port.html*",
    ])
    assert (reports / "test_good_port.html").exists()
    broken = json.loads((reports / "test_broken_port.json").read_text())
    assert broken["first_divergence"]["name"] == "3"


def test_plugin_is_registered_by_the_installed_entry_point(user_suite):
    result = user_suite.runpytest_subprocess("--help")
    result.stdout.fnmatch_lines(["*--parity-report-dir=DIR*", "*--parity-update-baseline*"])


def test_baseline_written_then_checked(user_suite, tmp_path):
    baseline = tmp_path / "golden.json"
    user_suite.makepyfile(test_baseline=f"""
import mindspore
import torch
from tests.tiny import torch_tiny, ms_tiny

def test_against_baseline(parity_check):
    torch.manual_seed(0)        # a baseline needs the same initial weights on every run
    parity_check(torch_tiny(), ms_tiny(), batch_size=2, image_size=16,
                 baseline={str(baseline)!r}).assert_passed()
""")
    unsaved = user_suite.runpytest_subprocess("test_baseline.py")
    unsaved.assert_outcomes(failed=1)       # it said "create it with 'parity baseline save ..."
    unsaved.stdout.fnmatch_lines([f"*parity baseline {baseline} does not exist: save it from a "
                                  "run known to be good with 'pytest --parity-update-baseline'*"])
    assert not baseline.exists()
    first = user_suite.runpytest_subprocess("test_baseline.py", "--parity-update-baseline")
    first.assert_outcomes(passed=1)
    assert json.loads(baseline.read_text())["errors"]
    again = user_suite.runpytest_subprocess("test_baseline.py")
    again.assert_outcomes(passed=1)

    golden = json.loads(baseline.read_text())
    golden["errors"] = {k: v / 1000 for k, v in golden["errors"].items()}
    baseline.write_text(json.dumps(golden))
    drifted = user_suite.runpytest_subprocess("test_baseline.py")
    drifted.assert_outcomes(failed=1)
    drifted.stdout.fnmatch_lines(["*baseline drift:*grew beyond 4x*"])

    # the user's pitfall that once made this test flaky: models built without a seed start
    # from other weights on every run, so their errors cannot be held to a baseline
    test_file = user_suite.path / "test_baseline.py"
    test_file.write_text(test_file.read_text().replace("torch.manual_seed(0)", "pass"))
    unseeded = user_suite.runpytest_subprocess("test_baseline.py")
    unseeded.assert_outcomes(failed=1)
    unseeded.stdout.fnmatch_lines(["*saved from other initial weights or another batch*"])


def test_a_broken_port_whose_baseline_is_not_saved_yet_is_told_both(user_suite, tmp_path):
    """The missing baseline was told, and the divergence, which assert_passed would have named,
    was not."""
    user_suite.makepyfile(test_unsaved=f"""
import mindspore
import torch
from tests.tiny import torch_tiny, ms_tiny_same_padding

def test_against_baseline(parity_check):
    torch.manual_seed(0)
    parity_check(torch_tiny(), ms_tiny_same_padding(), batch_size=2, image_size=16,
                 baseline={str(tmp_path / "golden.json")!r}).assert_passed()
""")
    result = user_suite.runpytest_subprocess("test_unsaved.py")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*golden.json does not exist: save it from a run known to be "
                                 "good with 'pytest --parity-update-baseline'; this run:*",
                                 "*parity: first divergence at 3 · forward*"])
    # nor is it saved from this run: it said "ParityInputError: refusing to save a baseline
    # from a run that fails parity", with a traceback into the plugin, and wrote no report
    result = user_suite.runpytest_subprocess("test_unsaved.py", "--parity-update-baseline",
                                             f"--parity-report-dir={tmp_path / 'reports'}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*golden.json not saved: a baseline comes from a run known to "
                                 "be good, and this one is not; this run:*",
                                 "*parity: first divergence at 3 · forward*"])
    assert "Traceback" not in result.stdout.str() and "ParityInputError" not in result.stdout.str()
    assert not (tmp_path / "golden.json").exists()
    assert (tmp_path / "reports" / "test_against_baseline.html").exists()
