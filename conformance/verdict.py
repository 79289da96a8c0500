"""The conformance verdict in the export manifest: merge a new report into the earlier verdict, per variant.

The verdict's shape is :class:`prodip.base.manifest.Verdict` (defined once, in the torch-free base, since
``prodip serve`` reads it); this module only computes one from a report.

python -c "from prodip.conformance.verdict import merge_verdict; help(merge_verdict)"
"""

from __future__ import annotations

from typing import Any, Optional

from prodip.base.jsontypes import obj
from prodip.base.manifest import Verdict, utc_now
from prodip.conformance.results import RunOutcome, VariantResult


def _variant_check(v: VariantResult, run: RunOutcome, now: str, report_path: str, report_sha256: str) -> dict[str, Any]:
    """The verdict's ``checks.<variant>`` record of this run."""
    out: dict[str, Any] = {
        "passed": v.passed,
        "checked_utc": now,
        "report": report_path,
        "report_sha256": report_sha256,
    }
    if run.tolerances is not None:
        tables = {"global", *v.tolerance_tables}
        out["tolerances"] = {
            **run.tolerances,
            "loosened": [b for b in run.tolerances["loosened"] if b["table"] in tables],
        }
    if v.runtimes:
        out["runtimes"] = dict(v.runtimes)
    return out


def merge_verdict(
    previous: Verdict | dict[str, Any] | None,
    run: RunOutcome | dict[str, Any],
    manifest_variants: list[str],
    report_path: str,
    report_sha256: str,
    checked_utc: Optional[str] = None,
) -> dict[str, Any]:
    """The manifest ``conformance`` slot after a run that checked ``run.variants``.

    Per-variant results of an earlier run are kept when that slot belongs to the same export files
    (equal ``export_files_sha256``, the sha256 of the manifest's ``files`` table); otherwise the slot
    starts afresh (a re-export starts with ``conformance: null`` anyway). A variant checked again is
    replaced. Top-level ``passed`` is true only when every manifest variant has a verdict and all pass,
    so a subset run (``--variants fp32``) never vouches for variants it did not check.

    Args:
        previous: the manifest's current ``conformance`` verdict (``ExportManifest.conformance``, or the
            dict a previous call returned), or None.
        run: this run's typed outcome (:class:`prodip.conformance.results.RunOutcome`, built by the suite),
            or its report as a dict (``variants`` {name: bool}, ``export_files_sha256``, ...; read with
            :meth:`RunOutcome.from_report`).
        manifest_variants: the export's variant names.
        report_path / report_sha256: this run's report.json (path as recorded, sha256 of its bytes).
        checked_utc: time stamp of this run (default: now, ISO 8601 UTC).
    Returns:
        ``{passed, variants: {name: bool}, checks: {name: {passed, checked_utc, report,
        report_sha256, tolerances, runtimes: {runtime: bool}}}, export_files_sha256, report, report_sha256, checked_utc,
        tolerances}`` (``report``, ``checked_utc`` and ``tolerances`` are those of this latest run;
        ``checks`` says which run checked each variant, and with which tolerance file:
        ``tolerances = {path, sha256, shipped, loosened: [{table, metric, shipped, used}]}``, loosened
        filtered to the tables that gated that variant, ``[global]`` included). A run without
        ``tolerances`` gives checks without it, which ``prodip serve`` does not accept.
    """
    if isinstance(run, dict):
        run = RunOutcome.from_report(run)
    if isinstance(previous, Verdict):
        previous = previous.to_dict()
    now = checked_utc or utc_now()
    checks: dict[str, Any] = {}
    if previous and previous.get("export_files_sha256") == run.export_files_sha256:
        kept = obj(previous.get("checks") or {}, where="manifest.json conformance.checks")
        checks = {k: v for k, v in kept.items() if k in manifest_variants}
    for v in run.variants:
        checks[v.name] = _variant_check(v, run, now, report_path, report_sha256)
    variants = {k: checks[k]["passed"] for k in manifest_variants if k in checks}
    passed = bool(variants) and len(variants) == len(manifest_variants) and all(variants.values())
    fields: dict[str, Any] = {
        "passed": passed,
        "variants": variants,
        "checks": {k: checks[k] for k in variants},
        "export_files_sha256": run.export_files_sha256,
        "report": report_path,
        "report_sha256": report_sha256,
        "checked_utc": now,
    }
    if run.tolerances is not None:
        fields["tolerances"] = run.tolerances
    return Verdict.parse(fields, "the merged conformance verdict").to_dict()  # its shape: prodip.base.manifest
