"""pytest plugin (entry point ``pytest11``): the ``parity_check`` fixture.

    def test_port(parity_check):
        parity_check(TorchNet(), MsNet(), batch_size=2, image_size=64).assert_passed()

Each call writes an HTML and a JSON report into the test's output directory (or
``--parity-report-dir``) and names the HTML in the failure message. With ``baseline=PATH`` the
run is also checked for drift against that golden file; ``--parity-update-baseline`` rewrites
it instead.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, Callable, Optional

import pytest


def pytest_addoption(parser) -> None:
    group = parser.getgroup("parity", "numerical parity of PyTorch → MindSpore ports")
    group.addoption("--parity-report-dir", metavar="DIR", default=None,
                    help="write parity reports here (default: each test's tmp_path)")
    group.addoption("--parity-update-baseline", action="store_true", default=False,
                    help="rewrite parity baselines from this run instead of checking them")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "parity"


@pytest.fixture
def parity_check(request, tmp_path) -> Callable[..., Any]:
    """``parity.check`` with reports written for the test; see the module docstring."""
    from parity import baseline as baselines
    from parity.api import check

    option = request.config.getoption("parity_report_dir")
    report_dir = Path(option) if option else tmp_path
    update = request.config.getoption("parity_update_baseline")
    calls = {"count": 0}

    def run(torch_model, ms_model, *, baseline: Optional[Path] = None, **kwargs):
        __tracebackhide__ = True
        calls["count"] += 1
        stem = _slug(request.node.name) + (f"-{calls['count']}" if calls["count"] > 1 else "")
        report_dir.mkdir(parents=True, exist_ok=True)
        result = check(torch_model, ms_model, **kwargs)
        html = report_dir / f"{stem}.html"
        drift, not_saved = None, ""
        if baseline is not None and update:
            if result.passed:
                baselines.save(result, Path(baseline))
            else:
                not_saved = (f"parity baseline {baseline} not saved: a baseline comes from a run "
                             "known to be good, and this one is not")
        elif baseline is not None and not Path(baseline).exists():
            not_saved = (f"parity baseline {baseline} does not exist: save it from a run known "
                         "to be good with 'pytest --parity-update-baseline'")
        elif baseline is not None:
            drift = baselines.check(result, Path(baseline))
        result = dataclasses.replace(result, drift=drift,
                                     extra={**result.extra, "report": str(html)})
        result.to_html(html)
        result.to_json(report_dir / f"{stem}.json")
        if not_saved:
            pytest.fail(f"{not_saved} (this run's report: {html})" if result.passed else
                        f"{not_saved}; this run:\n{result.failure_message()}", pytrace=False)
        return result

    return run
