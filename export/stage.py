"""The export package's pipeline stage: checkpoint -> export dir.

python -c "from prodip.export.stage import STAGES; print([s.name for s in STAGES])"
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from prodip.base.files import file_sha256_cached
from prodip.base.manifest import MANIFEST_FILE, verify_files
from prodip.base.stage import RunContext, Stage, made_from
from prodip.export.config import ExportConfig
from prodip.export.core import export_checkpoint
from prodip.train.stage import latest_model_sha256

log = logging.getLogger(__name__)


def export_done(cfg: ExportConfig) -> bool:
    """Every file the export manifest lists is there with its recorded size and sha256 (a deleted,
    truncated or altered file means export again), and the export was made from the newest
    checkpoint with ``[export] variants``. Hashing reads the whole export once per invocation (~10 s at the 0.4B scale)."""
    out = Path(cfg.out)
    if not (out / MANIFEST_FILE).is_file():
        return False
    try:
        manifest = verify_files(out, allow_unlisted=True, hash_file=file_sha256_cached)
    except (OSError, ValueError) as err:
        log.warning("%s; exporting again", err)
        return False
    made_with = manifest.export_config.variants if manifest.export_config else None
    if made_with is not None and sorted(made_with) != sorted(cfg.variants):
        log.warning("%s holds variants %s, [export] variants are %s; exporting again", out, made_with, cfg.variants)
        return False
    return made_from(
        str(out),
        {"checkpoint": manifest.source_checkpoint.model_sha256 or "?"},
        # the checkpoint export takes: the pretrained run, or the chat fine-tuned one when [sft] is configured
        {"checkpoint": latest_model_sha256(cfg.checkpoint)},
    )


def export_run(cfg: ExportConfig, ctx: RunContext | None = None) -> None:
    """Export the newest checkpoint (replacing an export of an earlier checkpoint of this run)."""
    stale = (Path(cfg.out) / MANIFEST_FILE).exists()
    export_checkpoint(dataclasses.replace(cfg, force=True) if stale else cfg)


EXPORT: Stage[ExportConfig] = Stage(
    name="export",
    tables={"export": ExportConfig},
    reads=("train",),
    writes="export",
    needs="train",
    describe=lambda c: f"safetensors + ONNX variants -> {c.out}",
    done=export_done,
    run=export_run,
)
STAGES: tuple[Stage[Any], ...] = (EXPORT,)
