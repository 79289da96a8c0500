"""The conformance verdict in the export manifest: merge a new report into the earlier verdict, per variant.

The verdict's shape is :class:`prodip.base.manifest.Verdict` (defined once, in the torch-free base, since
``prodip serve`` reads it); this module only computes one from a report.

python -c "from prodip.conformance.verdict import merge_verdict; help(merge_verdict)"
"""

from __future__ import annotations

from typing import Any, Optional

from prodip.base.manifest import Verdict, utc_now


def merge_verdict(
    previous: Verdict | dict[str, Any] | None,
    report: dict[str, Any],
    manifest_variants: list[str],
    report_path: str,
    report_sha256: str,
    checked_utc: Optional[str] = None,
) -> dict[str, Any]:
    """The manifest ``conformance`` slot after a run that checked ``report["variants"]``.

    Per-variant results of an earlier run are kept when that slot belongs to the same export files
    (equal ``export_files_sha256``, the sha256 of the manifest's ``files`` table); otherwise the slot
    starts afresh (a re-export starts with ``conformance: null`` anyway). A variant checked again is
    replaced. Top-level ``passed`` is true only when every manifest variant has a verdict and all pass,
    so a subset run (``--variants fp32``) never vouches for variants it did not check.

    Args:
        previous: the manifest's current ``conformance`` verdict (``ExportManifest.conformance``, or the
            dict a previous call returned), or None.
        report: this run's report (``variants`` {name: bool}, ``export_files_sha256``).
        manifest_variants: the export's variant names.
        report_path / report_sha256: this run's report.json (path as recorded, sha256 of its bytes).
        checked_utc: time stamp of this run (default: now, ISO 8601 UTC).
    Returns:
        ``{passed, variants: {name: bool}, checks: {name: {passed, checked_utc, report,
        report_sha256, tolerances, runtimes: {runtime: bool}}}, export_files_sha256, report, report_sha256, checked_utc,
        tolerances}`` (``report``, ``checked_utc`` and ``tolerances`` are those of this latest run;
        ``checks`` says which run checked each variant, and with which tolerance file:
        ``tolerances = {path, sha256, shipped, loosened: [{table, metric, shipped, used}]}``, loosened
        filtered to the tables that gated that variant, ``[global]`` included). A report without
        ``tolerances`` gives checks without it, which ``prodip serve`` does not accept.
    """

    if isinstance(previous, Verdict):
        previous = previous.to_dict()
    now = checked_utc or utc_now()
    files_sha = report["export_files_sha256"]
    checks: dict[str, Any] = {}
    if previous and previous.get("export_files_sha256") == files_sha:
        checks = {k: v for k, v in (previous.get("checks") or {}).items() if k in manifest_variants}
    tol = report.get("tolerances")
    for name, ok in report["variants"].items():
        checks[name] = {"passed": bool(ok), "checked_utc": now, "report": report_path, "report_sha256": report_sha256}
        if tol is not None:
            tables = {
                "global",
                *(
                    c.get("tolerance_table")
                    for c in (report.get("candidates") or {}).values()
                    if c.get("variant") == name
                ),
            }
            checks[name]["tolerances"] = {**tol, "loosened": [b for b in tol["loosened"] if b["table"] in tables]}
        on_device = {
            r: bool(res["ids_identical"])
            for c in (report.get("candidates") or {}).values()
            if c.get("variant") == name
            for r, res in ((c.get("runtimes") or {}).get("runtimes") or {}).items()
            if not res.get("skipped")
        }
        if on_device:
            checks[name]["runtimes"] = on_device
    variants = {k: checks[k]["passed"] for k in manifest_variants if k in checks}
    passed = bool(variants) and len(variants) == len(manifest_variants) and all(variants.values())
    fields: dict[str, Any] = {
        "passed": passed,
        "variants": variants,
        "checks": {k: checks[k] for k in variants},
        "export_files_sha256": files_sha,
        "report": report_path,
        "report_sha256": report_sha256,
        "checked_utc": now,
    }
    if tol is not None:
        fields["tolerances"] = tol
    return Verdict.parse(fields, "the merged conformance verdict").to_dict()  # its shape: prodip.base.manifest
