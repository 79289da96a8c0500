"""The checks of a conformance run one by one, for pytest: which (candidate, metric) pairs a
config will gate, and one check of a report.

    pytest -p prodip.conformance.pytest_plugin --pyargs prodip.conformance --export-dir runs/demo/export --checkpoint runs/demo/train
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prodip.base.manifest import load_manifest
from prodip.conformance.config import DEFAULT_TOLERANCES, ConformanceConfig
from prodip.conformance.runtimes import planned_metrics
from prodip.conformance.suite import preflight


def plan_checks(cfg: ConformanceConfig) -> list[tuple[str, str]]:
    """The (candidate, metric) pairs :func:`evaluate` will gate, known before anything runs.

    Export-wide checks have candidate ``"export"``. Used by the pytest plugin to name one test
    per check at collection time.

    Raises:
        ValueError / FileNotFoundError: unreadable manifest, bad tolerance file, missing file
            (see :func:`preflight`).
    """
    manifest = load_manifest(cfg.export_dir)
    tolerances, candidates = preflight(
        Path(cfg.export_dir),
        manifest,
        Path(cfg.tolerances) if cfg.tolerances else DEFAULT_TOLERANCES,
        cfg.variants,
        shards_dir=cfg.shards_dir or None,
        heldout_files=cfg.heldout,
        heldout_tokens=cfg.heldout_tokens,
    )
    out = [("export", m) for m, t in tolerances.get("global", {}).items() if not isinstance(t, str)]
    for cand in candidates:
        table = tolerances.get(cand.tolerance_table)
        out.append((cand.name, "run_errors"))
        if table is None:
            out.append((cand.name, "tolerances"))
        else:
            out += [(cand.name, m) for m, t in table.items() if not isinstance(t, str)]
        if cand.kind == "onnx" and cand.is_variant_file:  # the runtimes run each variant's own file
            out += [(cand.name, m) for m in planned_metrics(cand.variant, cfg.runtimes)]
    return out


def find_check(report: dict[str, Any], candidate: str, metric: str) -> dict[str, Any]:
    """The check record of ``candidate``/``metric`` in a report (``"export"`` = export-wide).

    Raises:
        KeyError: no such check.
    """
    checks = report["global"]["checks"] if candidate == "export" else report["candidates"][candidate]["checks"]
    for c in checks:
        if c["metric"] == metric:
            return c
    raise KeyError(f"no check {candidate}/{metric} in the report")
