"""Typed results of a conformance run, built where they are measured: one gated :class:`Check`, and a
variant's :class:`VariantResult` (what the manifest verdict records of it).

``report.json`` holds them as dicts (``Check.to_dict``: ``{metric, value, tolerance, passed, note?}``); the
report's layout is unchanged by them.

    python -c "from prodip.conformance.results import Check; print(Check.equals('x', True).to_dict())"
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class Check:
    """One gated check.

    Attributes:
        metric: the metric name (a tolerance table's key, or a fixed check's name).
        value: the measured value (None: not measured, which fails).
        tolerance: the bound (``{"max"|"min"|"equals": x}``), or None where none applies (a missing table).
        passed: the verdict of this check (None: informational, it does not fail its candidate).
        note: why it failed, or what was compared; left out of the report when None.
    """

    metric: str
    value: Any
    tolerance: Optional[dict[str, Any]]
    passed: Optional[bool]
    note: Optional[str] = None

    @classmethod
    def equals(cls, metric: str, value: Optional[bool], note: Optional[str] = None) -> Check:
        """A check that ``value`` is True (``{"equals": true}``); ``note`` kept only when it fails."""
        ok = value is True
        return cls(metric, value, {"equals": True}, ok, None if ok else note)

    @property
    def failed(self) -> bool:
        """False when it passed or is informational (``passed is not False``)."""
        return self.passed is False

    def to_dict(self) -> dict[str, Any]:
        """The report's form: ``{metric, value, tolerance, passed}`` and ``note`` when there is one."""
        out = {"metric": self.metric, "value": self.value, "tolerance": self.tolerance, "passed": self.passed}
        if self.note is not None:
            out["note"] = self.note
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Check:
        """A check record of a report (the inverse of :meth:`to_dict`)."""
        return cls(d["metric"], d.get("value"), d.get("tolerance"), d.get("passed"), d.get("note"))


def all_passed(checks: Iterable[Check]) -> bool:
    """No check failed (an informational one, ``passed`` None, does not fail)."""
    return not any(c.failed for c in checks)


@dataclass
class VariantResult:
    """What one run found for one export variant, as the manifest verdict records it.

    Attributes:
        name: the variant (a manifest ``variants`` key).
        passed: every candidate of the variant passed, and the export-wide checks did.
        tolerance_tables: the tolerance tables that gated its candidates (``[global]`` is added by the verdict).
        runtimes: on-device runtime -> whether its greedy ids equalled ONNX Runtime's (runtimes that did not
            run, or were skipped, are absent: the verdict vouches for none it did not run).
    """

    name: str
    passed: bool
    tolerance_tables: list[str] = field(default_factory=list)
    runtimes: dict[str, bool] = field(default_factory=dict)


@dataclass
class CandidateResult:
    """One candidate of a run, measured and gated (``report.json`` ``candidates.<name>``).

    Attributes:
        variant / kind / path / tolerance_table: the candidate (``prodip.conformance.suite.Candidate``).
        metrics: metric name -> value (the report's figures; gated ones are in ``checks``).
        errors: phase -> error text (a phase that raised).
        checks: the gated checks (its tolerance table's, then each on-device runtime's).
        seconds / cpu_seconds: wall and CPU time of its measurement (s).
        runtimes: the on-device runtimes on it (``prodip.conformance.runtimes.CandidateRuntimes``), or None.
    """

    variant: str
    kind: str
    path: str
    tolerance_table: str
    metrics: dict[str, Any]
    errors: dict[str, str]
    checks: list[Check]
    seconds: float
    cpu_seconds: float
    runtimes: Optional[Any] = None

    @property
    def passed(self) -> bool:
        return all_passed(self.checks)

    def on_device(self) -> dict[str, bool]:
        """Runtime -> its greedy ids met its row's rule against ONNX Runtime's (identical, or parted only at a
        near tie), for the runtimes that ran (not skipped)."""
        if self.runtimes is None:
            return {}
        return {r: res.passed for r, res in self.runtimes.runtimes.items() if res.skipped is None}

    def to_dict(self) -> dict[str, Any]:
        out = {
            "variant": self.variant,
            "kind": self.kind,
            "path": self.path,
            "tolerance_table": self.tolerance_table,
            "metrics": self.metrics,
            "errors": self.errors,
            "checks": [c.to_dict() for c in self.checks],
            "passed": self.passed,
            "seconds": self.seconds,
            "cpu_seconds": self.cpu_seconds,
        }
        if self.runtimes is not None:
            out["runtimes"] = self.runtimes.to_dict()
        return out


def variant_results(candidates: Iterable[CandidateResult], export_passed: bool) -> list[VariantResult]:
    """Each variant's result from its candidates' (in first-seen order): passed when every candidate of it
    passed and ``export_passed`` (the export-wide checks) did."""
    out: dict[str, VariantResult] = {}
    for cand in candidates:
        v = out.setdefault(cand.variant, VariantResult(cand.variant, export_passed))
        v.passed = v.passed and cand.passed
        v.tolerance_tables.append(cand.tolerance_table)
        v.runtimes.update(cand.on_device())
    return list(out.values())


@dataclass
class RunOutcome:
    """What the manifest verdict takes from one run: each variant's result, the export files measured
    (``prodip.base.manifest.files_table_sha256``) and the tolerance file used (the report's ``tolerances``:
    ``{path, sha256, shipped, loosened: [{table, metric, shipped, used}]}``, or None)."""

    variants: list[VariantResult]
    export_files_sha256: str
    tolerances: Optional[dict[str, Any]] = None

    @classmethod
    def from_report(cls, report: dict[str, Any]) -> RunOutcome:
        """The outcome a ``report.json`` (as a dict) records: ``variants`` {name: bool}, ``export_files_sha256``,
        ``tolerances`` and the ``candidates`` (their variant, tolerance table and on-device runtimes)."""
        cands = list((report.get("candidates") or {}).values())
        variants = []
        for name, ok in report["variants"].items():
            mine = [c for c in cands if c.get("variant") == name]
            runtimes = {
                r: bool(res.get("agrees", res["ids_identical"]))  # a margin-judged variant: the rule's verdict
                for c in mine
                for r, res in ((c.get("runtimes") or {}).get("runtimes") or {}).items()
                if not res.get("skipped")
            }
            tables = [c["tolerance_table"] for c in mine if c.get("tolerance_table")]
            variants.append(VariantResult(name, bool(ok), tables, runtimes))
        return cls(variants, report["export_files_sha256"], report.get("tolerances"))
