"""The conformance package's pipeline stage: export dir + checkpoint -> report and manifest verdict.

python -c "from prodip.conformance.stage import STAGES; print([s.name for s in STAGES])"
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from prodip.base.errors import StageFailed
from prodip.base.files import file_sha256
from prodip.base.manifest import MANIFEST_FILE, ExportManifest, files_table_sha256, verdict_is_current
from prodip.base.stage import RunContext, Stage, made_from
from prodip.conformance.config import ConformanceConfig
from prodip.conformance.report import REPORT_FILE, ConformanceReport
from prodip.conformance.suite import run_conformance
from prodip.conformance.tasks import task_plan
from prodip.train.records import EvalReport

log = logging.getLogger(__name__)


def conformance_done(cfg: ConformanceConfig) -> bool:
    """``[conformance] out``'s report passed, was measured on ``[conformance] export_dir``'s current files (its
    ``export_files_sha256`` is the sha256 of the manifest's files table now), checked every variant
    the manifest lists, holds the task figures eval.json (or ``[conformance] tasks``) asks for, and is the
    report the export's verdict names (``report_sha256``): a report left from an earlier export, or one of a
    subset run, is not complete."""
    manifest = ExportManifest.read_or_none(Path(cfg.export_dir) / MANIFEST_FILE)
    report_path = cfg.report_dir() / REPORT_FILE
    report = ConformanceReport.read_or_none(report_path)
    if report is None or manifest is None or not manifest.files:
        return False
    try:
        report_sha = file_sha256(report_path)
    except OSError:
        return False
    verdict = manifest.conformance
    if verdict is None or not made_from(
        str(report_path),
        {"export files table": report.export_files_sha256, "report": verdict.report_sha256 or "?"},
        {"export files table": files_table_sha256(manifest.files_table()), "report": report_sha},
    ):
        return False
    ev = EvalReport.read_or_none(cfg.eval_json) if cfg.eval_json else None
    want = task_plan(cfg, ev.to_dict() if ev is not None else None)
    if ((getattr(report, "tasks", None) or {}).get("settings")) != want:
        log.info(
            "%s: its task figures are not the ones eval.json / [conformance] tasks ask for; checking again", report_path
        )
        return False
    unchecked = sorted(set(manifest.variants) - set(report.variants))
    if unchecked:
        log.warning("%s did not check variant(s) %s of the export; checking again", report_path, ", ".join(unchecked))
        return False
    return report.passed and verdict.passed and verdict_is_current(manifest)


def conformance_run(cfg: ConformanceConfig, ctx: RunContext | None = None) -> None:
    """Run every check; a failed verdict stops the pipeline.

    Raises:
        StageFailed: conformance failed (the report names each failed check).
    """
    report = run_conformance(cfg)
    if not report.get("passed"):
        raise StageFailed(f"conformance failed: see {cfg.report_dir() / 'report.md'}")


CONFORMANCE: Stage[ConformanceConfig] = Stage(
    name="conformance",
    tables={"conformance": ConformanceConfig},
    reads=("export", "train", "shards"),
    writes="conformance",
    needs="export",
    describe=lambda c: f"compare every artifact with the training model -> {c.report_dir()}",
    done=conformance_done,
    run=conformance_run,
)
STAGES: tuple[Stage[Any], ...] = (CONFORMANCE,)
