"""The self-contained HTML divergence report: one file, inline CSS/JS/SVG, works offline.

Every name reaches the page through Jinja's autoescaping, so a layer called ``<script>`` shows
as text.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone

import jinja2

from parity.io import MARKER
from parity.report.charts import error_chart, histogram_chart
from parity.result import CheckResult

MAX_DETAILED = 20        # failing records shown with a histogram and worst elements


def _number(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–" if value is None or math.isnan(value) else str(value)
    return f"{value:.{digits}g}"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("parity", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters["num"] = _number
    env.filters["pretty"] = lambda value: json.dumps(value, indent=1, default=str)
    return env


def render_html(result: CheckResult) -> str:
    forward = [c for c in result.comparisons if c.kind == "forward"]
    grads = [c for c in result.comparisons if c.kind in ("grad", "update")]
    details = []
    for comparison in result.comparisons:
        key = f"{comparison.kind}:{comparison.name}"
        if key in result.details and len(details) < MAX_DETAILED:
            detail = result.details[key]
            details.append({"comparison": comparison, "detail": detail,
                            "histogram": histogram_chart(detail)})
    charts = {
        "forward": error_chart(forward, "forward activations, execution order",
                               "forward record (execution order)"),
        "backward": error_chart(grads, "gradients (backward order) and updates Δw",
                                "gradient / update record"),
    }
    template = _environment().get_template("report.html.j2")
    return template.render(
        marker=MARKER, result=result, records=result.records.to_dict(orient="records"),
        summary=result.summary_by_kind().to_dict(orient="records"), charts=charts,
        details=details, created=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        failed=sum(not c.passed for c in result.comparisons),
        calibrated=result.noise_calibrated)
