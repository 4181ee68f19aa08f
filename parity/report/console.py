"""The console summary: rich renderables built by pure functions; the CLI prints them."""

from __future__ import annotations

import math
from typing import List

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from parity.result import CheckResult


def _number(value: float, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}g}"


def verdict_text(result: CheckResult) -> Text:
    if result.passed:
        return Text("PARITY: all records within tolerance", style="bold green")
    failed = sum(not c.passed for c in result.comparisons)
    return Text(f"DIVERGENCE: {failed} of {len(result.comparisons)} records beyond tolerance",
                style="bold red")


def kinds_table(result: CheckResult) -> Table:
    frame = result.records
    calibrated = result.noise_calibrated
    # a passing run's gradients show max_rel of several: worth saying why that is no alarm
    caption = ("noise ratio: rms(MindSpore − torch) over torch's own float32 error (from its "
               "float64 and rerounded reruns); it decides the verdict. fails above: the "
               "relative RMS difference from torch that fails the median record of a kind, "
               "the smallest bug this run can see there (an update is also checked against "
               "torch's step of MindSpore's own gradient, to float32 rounding). max_rel is one "
               "element's error over max(|value|, tensor rms): float32 noise alone reaches "
               "several in gradients.") \
        if calibrated else None
    table = Table(title="per kind", title_justify="left", expand=False, caption=caption,
                  caption_justify="left")
    columns = [column for column in ("kind", "records", "failed", "worst noise ratio",
                                     "fails above", "worst max_rel", "min cosine")
               if calibrated or column != "fails above"]    # NaN without float64
    for column in columns:
        table.add_column(column, justify="left" if column == "kind" else "right")
    for row in result.summary_by_kind().itertuples():
        part = frame[frame.kind == row.kind]
        cells = {"kind": row.kind, "records": str(row.records),
                 "failed": Text(str(row.failed), style="red" if row.failed else "green"),
                 "worst noise ratio": _number(part.noise_ratio.max()),
                 "fails above": _number(row.median_fails_above, 2),
                 "worst max_rel": _number(row.worst_max_rel),
                 "min cosine": f"{row.min_cosine:.6f}"}
        table.add_row(*(cells[column] for column in columns))
    return table


def worst_table(result: CheckResult, count: int = 10) -> Table:
    table = Table(title=f"{count} worst records", title_justify="left")
    for column in ("record", "kind", "verdict", "noise ratio", "max_rel", "max_abs", "cosine"):
        table.add_column(column, justify="left" if column in ("record", "kind") else "right")
    for row in result.worst(count).itertuples():
        table.add_row(Text(row.name), row.kind,       # Text: a name is not rich markup
                      Text("pass", style="green") if row.passed else Text("FAIL", style="red"),
                      _number(row.noise_ratio), _number(row.max_rel), _number(row.max_abs),
                      _number(row.cosine, 7))
    return table


def divergence_panel(result: CheckResult) -> RenderableType:
    first, diagnosis = result.first_divergence, result.diagnosis
    if first is None:
        return Text("first divergence: none")
    lines = Text()
    lines.append("first divergence: ", style="bold")
    lines.append(f"{first.name} · {first.kind}", style="bold red")
    if first.mindspore_name and first.mindspore_name != first.name:
        lines.append(f"  (MindSpore {first.mindspore_name})")
    lines.append(f"\n{first.reason}")
    if diagnosis is not None:
        lines.append("\nlikely cause: ", style="bold")
        lines.append(f"{diagnosis.cause} ({diagnosis.confidence})", style="yellow")
        lines.append(f"\n{diagnosis.detail}")
    return lines


def summary(result: CheckResult) -> RenderableType:
    """Verdict, counts per kind, first divergence with its cause, the 10 worst records."""
    parts: List[RenderableType] = [verdict_text(result), divergence_panel(result),
                                   kinds_table(result), worst_table(result)]
    for side, names in result.unmatched.items():
        shown = ", ".join(names[:8]) + (f" … (+{len(names) - 8})" if len(names) > 8 else "")
        parts.append(Text(f"unmatched {side} records: {shown}", style="yellow"))
    for note in result.meta.notes:
        parts.append(Text(f"note: {note}", style="dim"))
    style = "green" if result.passed else "red"
    return Panel(Group(*parts), title="parity", border_style=style, expand=False)
