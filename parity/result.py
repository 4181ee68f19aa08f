"""The result of one parity check: what the API returns and every renderer reads."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pandas as pd

from parity.errors import ParityInputError, damage
from parity.io import (CSV_REPORT, HTML_REPORT, JSON_REPORT, MARKER, read_parity_json,
                       write_text)
from parity.records import KINDS, Comparison, Diagnosis, Divergence, Meta

RECORD_COLUMNS = ("name", "kind", "shape", "passed", "max_abs", "max_rel", "cosine",
                  "noise_ratio", "fp32_noise", "ms_error", "noise_factor", "fails_above",
                  "flip_allowance", "sum_allowance", "logits_allowance", "mean_abs", "rms",
                  "ref_rms", "frac_within", "needed_rtol", "rtol", "atol", "min_cosine",
                  "nan_torch", "nan_mindspore", "inf_torch", "inf_mindspore", "worst_index",
                  "worst_torch", "worst_mindspore", "mindspore_name", "order", "reason")
JSON_FORMAT_VERSION = 1


@dataclass(frozen=True)
class RecordDetail:
    """What the report shows for a failing record: error histogram and worst elements."""

    histogram_counts: Tuple[int, ...]
    histogram_edges: Tuple[float, ...]      # log10 of the guarded relative error
    worst: Tuple[Tuple[Tuple[int, ...], float, float, float], ...]  # index, torch, ms, |diff|


def _row(comparison: Comparison) -> Dict[str, Any]:
    """A record's columns, as the DataFrame and the JSON report hold them (every field of a
    Comparison, and what is computed from them)."""
    return {column: getattr(comparison, column) for column in RECORD_COLUMNS}


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def _fields_of(cls: type, values: Dict[str, Any]) -> Dict[str, Any]:
    """``values`` for the dataclass ``cls``, read back from a JSON report; TypeError names the
    first of the wrong type, so that a damaged report is refused on reading, not met while
    being rendered."""
    for item in dataclasses.fields(cls):
        if item.name in values:
            _field_of(cls, item.name, values[item.name])
    return values


def _field_of(cls: type, name: str, value: Any) -> Any:
    """``value`` for field ``name`` of the dataclass ``cls``; TypeError if of another type."""
    annotation = next(item.type for item in dataclasses.fields(cls) if item.name == name)
    if not _of_type(value, annotation):
        raise TypeError(f"{cls.__name__} field {name} is {value!r}, not {annotation}")
    return value


def _of_type(value: Any, annotation: str) -> bool:
    """Whether a JSON value fits a field annotated ``annotation`` (a string: this module and
    parity.records use postponed annotations)."""
    if annotation.startswith("Tuple["):
        items = _arguments(annotation)
        if not isinstance(value, (list, tuple)):
            return False
        if items[-1] == "...":
            return all(_of_type(v, items[0]) for v in value)
        return len(value) == len(items) and all(map(_of_type, value, items))
    if annotation.startswith("Dict["):
        key, item = _arguments(annotation)
        return isinstance(value, dict) and all(_of_type(k, key) and _of_type(v, item)
                                               for k, v in value.items())
    if isinstance(value, bool):
        return annotation == "bool"
    return isinstance(value, {"float": (int, float), "int": int, "bool": bool,
                              "str": str}.get(annotation, object))


def _arguments(annotation: str) -> List[str]:
    """The arguments of a generic annotation: 'Tuple[Tuple[int, ...], float]' gives
    ['Tuple[int, ...]', 'float']."""
    inner = annotation[annotation.index("[") + 1:-1]
    arguments, depth, start = [], 0, 0
    for at, character in enumerate(inner):
        depth += {"[": 1, "]": -1}.get(character, 0)
        if character == "," and depth == 0:
            arguments.append(inner[start:at].strip())
            start = at + 1
    return arguments + [inner[start:].strip()]


def _median(values: pd.Series) -> float:
    """The median of the values that are not NaN; NaN if none is (without numpy's warning)."""
    present = values.dropna()
    return float(present.median()) if len(present) else float("nan")


def _from_json_number(value: Any) -> Any:
    if value is None:
        return float("nan")
    if value in ("inf", "-inf"):
        return float(value)
    return value


@dataclass(frozen=True)
class CheckResult:
    comparisons: Tuple[Comparison, ...]
    first_divergence: Optional[Divergence]
    diagnosis: Optional[Diagnosis]
    unmatched: Dict[str, Tuple[str, ...]]
    details: Dict[str, RecordDetail]
    meta: Meta
    extra: Dict[str, Any] = field(default_factory=dict)   # report path, self-checks, ...
    drift: Optional[Any] = None          # parity.baseline.Drift when checked against a baseline

    def __repr__(self) -> str:
        first = "None" if self.first_divergence is None else \
            f"{self.first_divergence.name} · {self.first_divergence.kind}"
        return (f"CheckResult(passed={self.passed}, first_divergence={first}, "
                f"records={len(self.comparisons)})")

    def _repr_html_(self) -> str:
        """Notebooks show the verdict and the first divergence, not 900 records."""
        from html import escape
        text = self.failure_message(count=5) if not self.passed else \
            f"parity: all {len(self.comparisons)} records within tolerance"
        return f"<pre>{escape(text)}</pre>"

    @property
    def passed(self) -> bool:
        return bool(self.comparisons) and all(c.passed for c in self.comparisons) and \
            (self.drift is None or self.drift.passed)

    def __bool__(self) -> bool:
        return self.passed

    @property
    def records(self) -> pd.DataFrame:
        """One row per compared record, in divergence order."""
        return pd.DataFrame(list(map(_row, self.comparisons)), columns=list(RECORD_COLUMNS))

    @property
    def noise_calibrated(self) -> bool:
        """Judged against torch's float32 error (its float64 rerun), not fixed tolerances."""
        return any(math.isfinite(c.noise_ratio) for c in self.comparisons)

    def summary_by_kind(self) -> pd.DataFrame:
        """Per kind: records, failures, the worst figures, and the smallest error the run can
        see (``fails_above``) at the median record and at the most sensitive one."""
        frame = self.records
        rows = []
        for kind in KINDS:
            part = frame[frame.kind == kind]
            if len(part):
                rows.append({"kind": kind, "records": len(part),
                             "failed": int((~part.passed.astype(bool)).sum()),
                             "worst_max_rel": float(part.max_rel.max()),
                             "min_cosine": float(part.cosine.min()),
                             "median_fails_above": _median(part.fails_above),
                             "min_fails_above": float(part.fails_above.min())})
        return pd.DataFrame(rows, columns=["kind", "records", "failed", "worst_max_rel",
                                           "min_cosine", "median_fails_above",
                                           "min_fails_above"])

    def worst(self, count: int = 10) -> pd.DataFrame:
        """The records furthest beyond (or closest to) their tolerance."""
        frame = self.records
        if frame.empty:
            return frame
        fixed = frame.needed_rtol / frame.rtol.where(frame.rtol > 0, 1e-300)
        frame = frame.assign(excess=(frame.noise_ratio / frame.noise_factor).fillna(fixed))
        return frame.sort_values(["passed", "excess"], ascending=[True, False]).head(count)

    def failure_message(self, count: int = 5) -> str:
        if self.passed:
            return "parity: all records within tolerance"
        lines = []
        if self.drift is not None and not self.drift.passed:
            lines.append(self.drift.message())
        if self.first_divergence is not None:
            d = self.first_divergence
            lines.append(f"parity: first divergence at {d.name} · {d.kind} "
                         f"(MindSpore {d.mindspore_name}): {d.reason}")
        if self.diagnosis is not None:
            lines.append(f"likely cause: {self.diagnosis.cause} — {self.diagnosis.detail}")
        failed = self.records[~self.records.passed.astype(bool)]
        lines.append(f"{len(failed)} of {len(self.records)} records beyond tolerance; worst:")
        for row in self.worst(count).itertuples():
            if not row.passed:
                lines.append(f"  {row.name} · {row.kind}: {row.reason}")
        if "report" in self.extra:
            lines.append(f"report: {self.extra['report']}")
        return "\n".join(lines)

    def assert_passed(self) -> None:
        __tracebackhide__ = True
        if not self.passed:
            raise AssertionError(self.failure_message())

    # -- serialisation -------------------------------------------------------------------------

    def to_dict(self) -> Dict[str, Any]:
        records = [{k: _finite_or_none(v) if not isinstance(v, tuple) else list(v)
                    for k, v in _row(c).items()}
                   for c in self.comparisons]
        return {
            "format": MARKER, "format_version": JSON_FORMAT_VERSION,
            "passed": self.passed,
            "first_divergence": None if self.first_divergence is None else
            {k: _finite_or_none(v) for k, v in dataclasses.asdict(self.first_divergence).items()},
            "diagnosis": None if self.diagnosis is None else dataclasses.asdict(self.diagnosis),
            "summary": [{k: _finite_or_none(v) for k, v in row.items()}
                        for row in self.summary_by_kind().to_dict(orient="records")],
            "unmatched": {k: list(v) for k, v in self.unmatched.items()},
            "records": records,
            "details": {k: dataclasses.asdict(v) for k, v in self.details.items()},
            "extra": self.extra,
            "baseline": None if self.drift is None else
            {"passed": self.drift.passed, "message": self.drift.message()},
            "meta": dataclasses.asdict(self.meta),
        }

    def to_json(self, path: Path) -> Path:
        return write_text(Path(path), json.dumps(self.to_dict(), indent=1, default=str),
                          JSON_REPORT)

    def to_csv(self, path: Path) -> Path:
        return write_text(Path(path), self.records.to_csv(index=False), CSV_REPORT)

    def to_html(self, path: Path) -> Path:
        from parity.report.html import render_html
        return write_text(Path(path), render_html(self), HTML_REPORT)

    @classmethod
    def from_json(cls, path: Path) -> "CheckResult":
        again = "report its run directory again ('parity report RUN_DIR --json PATH')"
        try:
            data = read_parity_json(path, what="JSON report", marker=MARKER,
                                    version=JSON_FORMAT_VERSION, redo=again)
        except FileNotFoundError:
            raise ParityInputError(f"{path} does not exist") from None
        try:
            return cls.from_dict(data)
        except (KeyError, ValueError, TypeError, AttributeError) as error:
            raise ParityInputError(f"{path} is not a readable parity JSON report "
                                   f"({damage(error)}): {again}") from None

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "CheckResult":
        fields = {f.name for f in dataclasses.fields(Comparison)}
        comparisons = []
        for row in data["records"]:
            values = {k: _from_json_number(v) for k, v in row.items() if k in fields}
            _fields_of(Comparison, values)
            if values["kind"] not in KINDS:
                raise ValueError(f"record {values['name']} has kind {values['kind']!r}")
            values["shape"] = tuple(row["shape"])
            values["worst_index"] = tuple(row["worst_index"])
            comparisons.append(Comparison(**values))
        first = data.get("first_divergence")
        diagnosis = data.get("diagnosis")
        details = {}
        for name, detail in _field_of(cls, "details", data.get("details", {})).items():
            _fields_of(RecordDetail, detail)
            details[name] = RecordDetail(
                histogram_counts=tuple(detail["histogram_counts"]),
                histogram_edges=tuple(detail["histogram_edges"]),
                worst=tuple((tuple(w[0]), w[1], w[2], w[3]) for w in detail["worst"]))
        unmatched = _field_of(cls, "unmatched", data.get("unmatched", {}))
        meta = data["meta"]
        return cls(comparisons=tuple(comparisons),
                   first_divergence=None if first is None else Divergence(**_fields_of(
                       Divergence, {k: _from_json_number(v) for k, v in first.items()})),
                   diagnosis=None if diagnosis is None else Diagnosis(
                       **_fields_of(Diagnosis, diagnosis)),
                   unmatched={k: tuple(v) for k, v in unmatched.items()},
                   details=details,
                   meta=Meta(**_fields_of(Meta, {**meta,
                                                 "notes": tuple(meta.get("notes", ()))})),
                   extra=dict(data.get("extra", {})))
