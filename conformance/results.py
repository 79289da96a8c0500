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
