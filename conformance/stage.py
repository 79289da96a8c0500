"""The conformance package's pipeline stage: export dir + checkpoint -> report and manifest verdict.

python -c "from prodip.conformance.stage import STAGES; print([s.name for s in STAGES])"
"""

from __future__ import annotations

import logging
from pathlib import Path

from prodip.base.errors import StageFailed
from prodip.base.files import read_json_or_none
from prodip.base.manifest import MANIFEST_FILE, verdict_is_current
from prodip.base.stage import Plan, Stage
from prodip.conformance.suite import run_conformance

log = logging.getLogger(__name__)


def conformance_done(plan: Plan) -> bool:
    """The current export carries a passing verdict (a re-export clears it) that was measured on
    the export's current files (the sha256 of its manifest's files table), and the report exists."""
    manifest = read_json_or_none(Path(plan["export"].out) / MANIFEST_FILE) or {}
    verdict = manifest.get("conformance") or {}
    if verdict.get("passed") and not verdict_is_current(manifest):
        log.warning("%s: the conformance verdict was measured on other files; checking again", plan["export"].out)
        return False
    return bool(verdict.get("passed")) and (Path(plan["conformance"].out) / "report.json").exists()


def conformance_run(plan: Plan) -> None:
    """Run every check; a failed verdict stops the pipeline.

    Raises:
        StageFailed: conformance failed (the report names each failed check).
    """
    report = run_conformance(plan["conformance"])
    if not report.get("passed"):
        raise StageFailed(f"conformance failed: see {Path(plan['conformance'].out) / 'report.md'}")


STAGES = (
    Stage(
        name="conformance",
        tables={"conformance": "prodip.conformance.config:ConformanceConfig"},
        reads=("export", "train", "shards"),
        writes="conformance",
        needs="export",
        describe=lambda p: f"compare every artifact with the training model -> {p['conformance'].out}",
        done=conformance_done,
        run=conformance_run,
    ),
)
