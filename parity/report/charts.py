"""Charts for the HTML report, rendered by matplotlib to inline SVG strings."""

from __future__ import annotations

import io
import math
from typing import List, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from parity.records import Comparison  # noqa: E402
from parity.result import RecordDetail  # noqa: E402

plt.rcParams.update({"svg.fonttype": "none", "font.size": 9, "axes.spines.top": False,
                     "axes.spines.right": False})
FLOOR = 1e-12      # log axes need positive values; exact agreement is drawn here


def _svg(figure) -> str:
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight")
    plt.close(figure)
    text = buffer.getvalue()
    return text[text.index("<svg"):]          # drop the XML prolog and DOCTYPE


def _positive(values: Sequence[float]) -> List[float]:
    return [max(v, FLOOR) if v is not None and math.isfinite(v) else float("nan")
            for v in values]


def error_chart(comparisons: Sequence[Comparison], title: str, xlabel: str) -> str:
    """Error per record in order, on a log scale, with the tolerance and the violations."""
    if not comparisons:
        return ""
    x = list(range(len(comparisons)))
    figure, axis = plt.subplots(figsize=(11, 3.2))
    calibrated = any(math.isfinite(c.noise_ratio) for c in comparisons)
    if calibrated:
        axis.plot(x, _positive([c.ms_error for c in comparisons]), color="#d62728", lw=1.2,
                  label="MindSpore vs torch float32")
        axis.plot(x, _positive([c.fp32_noise for c in comparisons]), color="#1f77b4", lw=1.2,
                  label="torch float32 error (vs float64 or rerounded)")
        allowed = any(c.allowance for c in comparisons)
        axis.plot(x, _positive([c.noise_factor * (c.fp32_noise + c.allowance)
                                for c in comparisons]),
                  color="#1f77b4", lw=0.8, ls="--",
                  label="tolerance (noise_factor × (torch's + allowances))" if allowed
                  else "tolerance (noise_factor × torch's)")
    else:
        axis.plot(x, _positive([c.max_rel for c in comparisons]), color="#d62728", lw=1.2,
                  label="max relative error")
        axis.plot(x, _positive([c.rtol for c in comparisons]), color="#1f77b4", lw=0.8,
                  ls="--", label="tolerance (rtol)")
    axis.plot(x, _positive([1 - c.cosine for c in comparisons]), color="#7f7f7f", lw=0.8,
              alpha=0.7, label="1 − cosine")
    failed = [(i, c) for i, c in enumerate(comparisons) if not c.passed]
    if failed:
        first = failed[0][0]
        axis.axvline(first, color="black", lw=0.8, ls=":")
        axis.annotate(f"first divergence: {failed[0][1].name}", (first, 0.0), parse_math=False,
                      xycoords=("data", "axes fraction"), xytext=(4, 6),
                      textcoords="offset points", fontsize=8)
        y = _positive([c.ms_error if calibrated else c.max_rel for _, c in failed])
        axis.scatter([i for i, _ in failed], [v if math.isfinite(v) else 1.0 for v in y],
                     marker="x", color="black", zorder=5, label="violation")
    axis.set_yscale("log")
    axis.set_xlabel(xlabel)
    axis.set_ylabel("relative error (RMS)" if calibrated else "relative error")
    axis.set_title(title, loc="left")
    axis.grid(True, which="major", alpha=0.3)
    axis.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), fontsize=8, ncol=5,
                frameon=False)
    return _svg(figure)


def histogram_chart(detail: RecordDetail) -> str:
    edges, counts = detail.histogram_edges, detail.histogram_counts
    figure, axis = plt.subplots(figsize=(4.2, 1.9))
    axis.bar(edges[:-1], counts, width=[b - a for a, b in zip(edges[:-1], edges[1:])],
             align="edge", color="#d62728", alpha=0.8)
    axis.set_yscale("symlog")
    axis.set_xlabel("log10 relative error per element")
    axis.set_ylabel("elements")
    return _svg(figure)
