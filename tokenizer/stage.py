"""The tokenizer package's two pipeline stages: ``tokenizer`` (train, audit, gate) and ``data`` (shards).

python -c "from prodip.tokenizer.stage import STAGES; print([s.name for s in STAGES])"
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prodip.base.errors import StageFailed
from prodip.base.stage import RunContext, Stage, made_from
from prodip.tokenizer import audit, bpe, encode, shards
from prodip.tokenizer.config import AuditConfig, DataPrepareConfig, TokenizerTrainConfig


@dataclass(frozen=True)
class TokenizerStageConfig:
    """The tokenizer stage's config: how to train the tokenizer (``[tokenizer]``) and how to audit it (``[audit]``)."""

    tokenizer: TokenizerTrainConfig
    audit: AuditConfig


def tokenizer_done(cfg: TokenizerStageConfig) -> bool:
    """Trained, audited and through the fertility gate (``fertility.json`` says passed)."""
    fert = audit.read_fertility_or_none(cfg.tokenizer.out_dir)
    return fert is not None and fert.gate.passed


def tokenizer_run(cfg: TokenizerStageConfig, ctx: RunContext | None = None) -> None:
    """Train the tokenizer, audit it on held-out text and apply the fertility gate.

    Raises:
        StageFailed: the gate failed (the message names each language, its figure and the minimum).
    """
    # Not done means never trained, or audited and failed: (re)train, since the [tokenizer] table
    # may have changed since (a run that never passed this stage takes the new config).
    bpe.train_tokenizer(dataclasses.replace(cfg.tokenizer, overwrite=True))
    report = audit.run_audit(cfg.audit)  # writes fertility.json
    print(audit.format_table(report), flush=True)
    if not report.gate.passed:
        raise StageFailed(
            "tokenizer fertility gate failed: "
            + "; ".join(report.gate.failures)
            + f" (see {Path(cfg.tokenizer.out_dir) / audit.FERTILITY_NAME})"
        )


def data_done(cfg: DataPrepareConfig) -> bool:
    """Shards exist and were encoded with the current tokenizer (``meta.json`` names its sha256)."""
    meta = shards.read_meta_or_none(cfg.out_dir)
    try:
        current = bpe.tokenizer_sha256(cfg.tokenizer_dir)
    except (FileNotFoundError, ValueError):
        return False
    return meta is not None and made_from(cfg.out_dir, {"tokenizer": meta.tokenizer_sha256}, {"tokenizer": current})


def data_run(cfg: DataPrepareConfig, ctx: RunContext | None = None) -> None:
    """Encode the corpus into shards (replacing shards of an earlier tokenizer of this run)."""
    stale = (Path(cfg.out_dir) / shards.META_NAME).exists()
    encode.prepare_shards(dataclasses.replace(cfg, overwrite=True) if stale else cfg)


TOKENIZER: Stage[TokenizerStageConfig] = Stage(
    name="tokenizer",
    tables={"tokenizer": TokenizerTrainConfig, "audit": AuditConfig},
    config=TokenizerStageConfig,
    reads=(),
    writes="tokenizer",
    needs=None,
    describe=lambda c: f"train BPE + fertility audit -> {c.tokenizer.out_dir}",
    done=tokenizer_done,
    run=tokenizer_run,
)
DATA: Stage[DataPrepareConfig] = Stage(
    name="data",
    tables={"data": DataPrepareConfig},
    reads=("tokenizer",),
    writes="shards",
    needs="tokenizer",
    describe=lambda c: f"encode corpus -> {c.out_dir}",
    done=data_done,
    run=data_run,
)
STAGES: tuple[Stage[Any], ...] = (TOKENIZER, DATA)
