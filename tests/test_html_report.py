"""The HTML divergence report: self-contained, escaped, and working in a real browser."""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

import pytest

from parity.result import CheckResult
from tests.conftest import REPO, parity_cli

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
SCREENSHOTS = REPO / "reports" / "screenshots"


@pytest.fixture(scope="module")
def failing_report(compare_mindspore) -> Path:
    process, out = compare_mindspore("--ms-model", "tests.ports:same_padding_bug",
                                     "--torch-model", "torchvision.models:resnet50")
    assert process.returncode == 1, process.stderr
    return out


def test_failing_report_names_the_first_divergence(failing_report):
    html = (failing_report / "report.html").read_text()
    assert 'id="first-divergence">layer2.0.conv2</span>' in html
    assert "pad_mode=&#39;same&#39; with stride &gt; 1" in html
    assert html.count("<svg") >= 3           # two depth charts and per-record histograms
    assert '<dt>batch</dt><dd class="mono">input 2×3×64×64 float32 · target 2 int64</dd>' in html
    # what the run can see, on each kind's card but the inputs' (compared exactly)
    assert len(re.findall(r'class="muted sees">fails above \d', html)) == 7


def test_report_is_self_contained_and_small(failing_report):
    html = (failing_report / "report.html").read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "<link" not in html and "@import" not in html and "url(http" not in html
    assert (failing_report / "report.html").stat().st_size < 3 * 2**20


def test_names_are_escaped(failing_report, tmp_path):
    result = CheckResult.from_json(failing_report / "report.json")
    hostile = "<script>alert('pwned')</script>"
    first_failing = next(i for i, c in enumerate(result.comparisons) if not c.passed)
    renamed = tuple(dataclasses.replace(c, name=hostile) if i in (5, first_failing) else c
                    for i, c in enumerate(result.comparisons))
    first = dataclasses.replace(result.first_divergence, name=hostile)
    html = dataclasses.replace(result, comparisons=renamed, first_divergence=first) \
        .to_html(tmp_path / "r.html").read_text()
    assert hostile not in html
    assert "&lt;script&gt;alert(&#39;pwned&#39;)&lt;/script&gt;" in html


def test_names_are_not_read_as_console_markup(failing_report, tmp_path):
    """rich reads "[x]" as markup: a name holding it lost it in the console, "[/b]" failed."""
    from rich.console import Console

    from parity.report.console import summary
    result = CheckResult.from_json(failing_report / "report.json")
    hostile = "blocks[/b].[bold]conv"
    first_failing = next(i for i, c in enumerate(result.comparisons) if not c.passed)
    renamed = tuple(dataclasses.replace(c, name=hostile) if i == first_failing else c
                    for i, c in enumerate(result.comparisons))
    console = Console(record=True, width=200)
    console.print(summary(dataclasses.replace(result, comparisons=renamed)))
    assert f"│ {hostile} " in console.export_text()
    report = tmp_path / "r [x].json"
    process = parity_cli("report", failing_report / "report.json", "--json", report, "--quiet")
    assert process.stdout.splitlines()[-1] == f"wrote {report}"


def test_report_subcommand_renders_from_json(failing_report, tmp_path):
    process = parity_cli("report", failing_report / "report.json",
                         "--html", tmp_path / "again.html", "--quiet")
    assert process.returncode == 1
    assert "layer2.0.conv2" in (tmp_path / "again.html").read_text()


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("Chromium is not installed: run 'make browser' (Debian chromium, "
                    "chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--window-size=1280,1700"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def _visible_rows(driver):
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('#records tbody tr'))"
        ".filter(r => !r.hidden).map(r => [r.cells[1].textContent, r.dataset.kind, "
        "r.dataset.passed, parseFloat(r.cells[5].dataset.value)]);")


def test_report_works_in_chromium(browser, failing_report):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select
    browser.get((failing_report / "report.html").as_uri())
    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert errors == []
    assert browser.find_element(By.ID, "first-divergence").text == "layer2.0.conv2"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SCREENSHOTS / "failing-report.png"))

    everything = _visible_rows(browser)
    browser.find_element(By.ID, "only-failures").click()
    failures = _visible_rows(browser)
    assert 0 < len(failures) < len(everything)
    assert all(row[2] == "false" for row in failures)

    Select(browser.find_element(By.ID, "kind-filter")).select_by_value("grad")
    assert {row[1] for row in _visible_rows(browser)} == {"grad"}

    search = browser.find_element(By.ID, "search")
    search.send_keys("layer4.2.conv")
    rows = _visible_rows(browser)
    assert rows and all("layer4.2.conv" in row[0] and row[1] == "grad" for row in rows)

    search.clear()
    search.send_keys(" ")          # clear() fires no input event; any keystroke re-filters
    browser.find_element(By.ID, "only-failures").click()
    Select(browser.find_element(By.ID, "kind-filter")).select_by_value("")
    header = browser.find_elements(By.CSS_SELECTOR, "#records thead th")[5]   # max rel
    header.click()
    header.click()                 # descending
    values = [row[3] for row in _visible_rows(browser)]
    assert values == sorted(values, reverse=True)
    browser.execute_script("window.scrollTo(0, 0)")
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
