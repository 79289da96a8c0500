"""The conformance verdict: the export manifest's ``conformance`` slot (:class:`Verdict`), its one definition.

``prodip.conformance.verdict.merge_verdict`` builds it, :func:`prodip.base.manifest.set_conformance`
validates and writes it into ``manifest.json``, and ``prodip serve`` asks :meth:`Verdict.serve_problem`
whether it vouches for a variant. Layout (CONTRACTS.md "Conformance report and verdict")::

    {passed, variants: {name: bool}, report, report_sha256, checked_utc,
     checks: {name: {passed, checked_utc, report, report_sha256, tolerances, runtimes}},  # VariantCheck
     export_files_sha256}

Read and written only inside the manifest (:class:`prodip.base.manifest.ExportManifest`); this module opens
no file.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import StrictBool, ValidationError

from prodip.base.errors import InvalidInput
from prodip.base.jsontypes import JSONObject
from prodip.base.records import RecordPart, describe_errors


class ToleranceRecord(RecordPart):
    """The tolerance file a conformance run used (``conformance.checks[name].tolerances``)."""

    path: str | None = None
    sha256: str
    shipped: StrictBool
    #: bounds looser than the shipped file: ``[{table, metric, shipped, used}]``
    loosened: list[JSONObject]


class VariantCheck(RecordPart):
    """One variant's entry of the verdict's ``checks``: which run checked it, and how."""

    passed: StrictBool
    checked_utc: str | None = None
    report: str | None = None
    report_sha256: str | None = None
    tolerances: ToleranceRecord | None = None
    #: on-device runtime -> whether its ids were identical
    runtimes: dict[str, StrictBool] | None = None


_HEX64 = re.compile(r"[0-9a-f]{64}")


def _is_sha256(value: object) -> bool:
    return isinstance(value, str) and _HEX64.fullmatch(value) is not None


class Verdict(RecordPart):
    """The conformance verdict in the export manifest's ``conformance`` slot: its one definition.

    ``prodip.conformance.verdict.merge_verdict`` builds it, :func:`prodip.base.manifest.set_conformance` validates and writes
    it, and ``prodip serve`` asks :meth:`serve_problem` whether it vouches for a variant. Only ``passed``
    is required of a slot (older prodips wrote ``{passed, variants, report, report_sha256}``); what
    ``merge_verdict`` always writes, and serve requires, is checked by :meth:`serve_problem`.
    Fields in the order ``merge_verdict`` writes them.
    """

    passed: StrictBool
    variants: dict[str, StrictBool] | None = None
    checks: dict[str, VariantCheck] | None = None
    #: :func:`prodip.base.manifest.files_table_sha256` of the files table the run measured
    export_files_sha256: str | None = None
    report: str | None = None
    report_sha256: str | None = None
    checked_utc: str | None = None
    #: the tolerance file of this latest run (as each variant's ``checks[name].tolerances``)
    tolerances: ToleranceRecord | None = None

    @classmethod
    def parse(cls, slot: Any, where: str = "manifest.json") -> Verdict:
        """Validate a ``conformance`` slot.

        Raises:
            InvalidInput: not an object, no boolean ``passed``, or a mistyped field (named).
        """
        if not isinstance(slot, dict):
            raise InvalidInput(f"{where}: conformance verdict is {type(slot).__name__}, not an object")
        try:
            return cls.model_validate(slot)
        except ValidationError as err:
            raise InvalidInput(f"{where}: conformance verdict: {describe_errors(err)}") from None

    def serve_problem(self, variant: str) -> str | None:
        """What this verdict lacks to vouch for ``variant`` as ``merge_verdict`` writes it (None: complete;
        a verdict that does not mention ``variant`` at all is also None: the caller says so).

        Required: per-variant ``variants`` and ``checks``, ``export_files_sha256`` and ``report_sha256``
        (64 hex digits), a ``report``, and for ``variant`` a consistent entry in both tables naming its
        report and the tolerances it was checked with.
        """
        for key in ("variants", "checks"):
            if getattr(self, key) is None:
                return f"has no per-variant {key!r} table"
        for key in ("export_files_sha256", "report_sha256"):
            if not _is_sha256(getattr(self, key)):
                return f"has no {key!r} (64 hex digits)"
        if not self.report:
            return "names no report"
        per_variant, checks = self.variants or {}, self.checks or {}
        if variant not in per_variant and variant not in checks:
            return None
        ok, check = per_variant.get(variant), checks.get(variant)
        if ok is None or check is None or check.passed is not ok:
            return f"has no consistent entry for variant {variant!r} in 'variants' and 'checks'"
        if not _is_sha256(check.report_sha256) or check.report is None:
            return f"names no report for variant {variant!r}"
        if check.tolerances is None or not _is_sha256(check.tolerances.sha256):
            return (
                f"does not record the tolerances variant {variant!r} was checked with "
                "(made by an older prodip conformance)"
            )
        return None
