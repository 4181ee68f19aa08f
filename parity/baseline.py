"""Golden baselines: the per-record errors of a known-good run, to catch drift.

A port that matches today can drift after a MindSpore upgrade while every record still passes
its absolute tolerance. ``check`` fails when any record's error grows beyond ``factor`` times
its baseline (errors below ``FLOOR`` count as ``FLOOR``: float32's own resolution, so that a
baseline of ~0 does not turn every rounding change into drift).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from parity.errors import ParityInputError, first_few
from parity.io import BASELINE, BASELINE_FORMAT, read_parity_json, write_text
from parity.records import Comparison
from parity.result import CheckResult

FORMAT = BASELINE_FORMAT
FORMAT_VERSION = 1
SAVE_COMMAND = "'parity baseline save RUN --out FILE'"     # how a baseline is made again
DEFAULT_FACTOR = 4.0
FLOOR = 1e-7           # relative error at float32 resolution (eps = 1.2e-7)


def record_error(comparison: Comparison) -> float:
    """The error a baseline tracks: with torch's float64 rerun, ms_error + fp32_noise, a bound
    on MindSpore's RMS distance from the float64 result (triangle inequality: fp32_noise is at
    least torch's distance from it, more where a rerounded step moved it further) that is never
    ~0 by luck (MindSpore often reproduces torch's float32 bit for bit in small layers, and
    then any rounding change would look like drift); without it, max_rel."""
    bound = comparison.ms_error + comparison.fp32_noise
    return bound if math.isfinite(bound) else comparison.max_rel


@dataclass(frozen=True)
class Drift:
    factor: float
    grown: Tuple[Tuple[str, str, float, float], ...] = ()       # name, kind, baseline, now
    missing: Tuple[str, ...] = ()
    added: Tuple[str, ...] = field(default=())

    @property
    def passed(self) -> bool:
        return not self.grown and not self.missing

    def message(self) -> str:
        if self.passed:
            extra = f"; {len(self.added)} new record(s) not in the baseline" if self.added else ""
            return f"baseline: no record's error grew beyond {self.factor:g}x{extra}"
        lines = [f"baseline drift: {len(self.grown)} record(s) grew beyond {self.factor:g}x "
                 f"their baseline error, {len(self.missing)} record(s) missing"]
        for name, kind, before, now in self.grown[:10]:
            lines.append(f"  {name} · {kind}: {before:.3g} -> {now:.3g} "
                         f"({now / max(before, FLOOR):.3g}x)")
        if self.missing:
            lines.append(f"  missing: {', '.join(self.missing[:10])}")
        lines.append("If the change is intended, re-save the baseline "
                     "(parity baseline save, or pytest --parity-update-baseline).")
        return "\n".join(lines)


def _errors(result: CheckResult) -> Dict[str, float]:
    return {f"{c.kind}:{c.name}": record_error(c) for c in result.comparisons}


def save(result: CheckResult, out: Path) -> Path:
    if not result.passed:
        raise ParityInputError("refusing to save a baseline from a run that fails parity; "
                               "a baseline must come from a known-good run")
    data = {"format": FORMAT, "format_version": FORMAT_VERSION,
            "versions": result.meta.versions, "seed": result.meta.seed,
            "fingerprint": result.meta.fingerprint, "errors": _errors(result)}
    return write_text(Path(out), json.dumps(data, indent=1, sort_keys=False), BASELINE)


def load(path: Path) -> Dict[str, Any]:
    """The baseline's fields, checked; ``errors`` as floats."""
    try:
        data = read_parity_json(path, what="baseline", marker=FORMAT, version=FORMAT_VERSION,
                                redo=f"save it again ({SAVE_COMMAND})")
    except FileNotFoundError:
        raise ParityInputError(f"baseline {path} does not exist; create it with "
                               f"{SAVE_COMMAND}") from None
    table = data.get("errors")
    if not isinstance(table, dict):
        held = "no 'errors' field" if "errors" not in data else \
            f"its 'errors' is {json.dumps(table)[:40]}"
        problem = f"{held}, not a table of \"kind:record\": error"
    else:
        not_numbers = [f"{name} {json.dumps(value)[:40]}" for name, value in table.items()
                       if isinstance(value, bool) or not isinstance(value, (int, float))]
        problem = f"not numbers: {first_few(not_numbers)}" if not_numbers else ""
    if problem:
        raise ParityInputError(f"baseline {path} has no readable table of errors ({problem}); "
                               f"save it again ({SAVE_COMMAND})")
    return {**data, "errors": {name: float(value) for name, value in table.items()}}


def check(result: CheckResult, baseline: Path, factor: Optional[float] = None) -> Drift:
    factor = DEFAULT_FACTOR if factor is None else float(factor)
    if not 1 <= factor < math.inf:                    # NaN too
        raise ParityInputError(f"--factor must be a finite number >= 1, got {factor:g}")
    golden = load(baseline)
    saved_from, checked = golden.get("fingerprint", ""), result.meta.fingerprint
    if saved_from and checked and saved_from != checked:
        raise ParityInputError(
            f"baseline {baseline} was saved from other initial weights or another batch "
            f"(fingerprint {saved_from}, this run {checked}), so its errors say nothing about "
            "drift: build the models after torch.manual_seed(...) or load fixed weights, then "
            "re-save the baseline")
    before, now = golden["errors"], _errors(result)
    grown: List[Tuple[str, str, float, float]] = []
    for key, error in now.items():
        if key in before and not error <= factor * max(before[key], FLOOR):
            kind, _, name = key.partition(":")
            grown.append((name, kind, before[key], error))
    grown.sort(key=lambda g: -g[3] / max(g[2], FLOOR))
    return Drift(factor=factor, grown=tuple(grown),
                 missing=tuple(k for k in before if k not in now),
                 added=tuple(k for k in now if k not in before))
