"""The tokenizer package's two pipeline stages: ``tokenizer`` (train, audit, gate; or, for an imported base,
extend its vocabulary, ``[extend] base``) and ``data`` (shards).

python -c "from prodip.tokenizer.stage import STAGES; print([s.name for s in STAGES])"
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prodip.base.errors import StageFailed
from prodip.base.files import file_sha256
from prodip.base.jsontypes import JSONObject
from prodip.base.stage import RunContext, Stage, made_from
from prodip.tokenizer import audit, bpe, encode, extend, shards
from prodip.tokenizer.config import AuditConfig, DataPrepareConfig, ExtendConfig, TokenizerTrainConfig


@dataclass(frozen=True)
class TokenizerStageConfig:
    """The tokenizer stage's config: how to train the tokenizer (``[tokenizer]``) and how to audit it (``[audit]``),
    or, when ``[extend] base`` names an imported model, how to extend that base's vocabulary instead."""

    tokenizer: TokenizerTrainConfig
    audit: AuditConfig
    extend: ExtendConfig

    @property
    def extending(self) -> bool:
        """The run adapts an imported base (``[extend] base``) rather than training a tokenizer."""
        return bool(self.extend.base)


def read_extension_or_none(folder: str | Path) -> JSONObject | None:
    """``FOLDER/extension.json`` (``prodip tokenizer extend``'s record), or None when missing or unreadable."""
    try:
        data = json.loads((Path(folder) / extend.RECORD_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def tokenizer_done(cfg: TokenizerStageConfig) -> bool:
    """Trained, audited and through the fertility gate (``fertility.json`` says passed); for an adapted base,
    extended from the current base's tokenizer and through the gate (``extension.json``)."""
    if cfg.extending:
        record = read_extension_or_none(cfg.extend.out)
        try:
            base = file_sha256(extend.base_tokenizer_path(cfg.extend.base))
        except (OSError, ValueError):
            return False
        if record is None:
            return False
        gate, recorded = record.get("gate"), record.get("base_tokenizer_sha256")
        return (
            isinstance(gate, dict)
            and bool(gate.get("passed"))
            and made_from(cfg.extend.out, {"base": recorded if isinstance(recorded, str) else None}, {"base": base})
        )
    fert = audit.read_fertility_or_none(cfg.tokenizer.out_dir)
    return fert is not None and fert.gate.passed


def tokenizer_run(cfg: TokenizerStageConfig, ctx: RunContext | None = None) -> None:
    """Train the tokenizer, audit it on held-out text and apply the fertility gate; or, for an imported base,
    extend its vocabulary (``prodip tokenizer extend``) and apply the gate of ``[extend]``.

    Raises:
        StageFailed: the gate failed (the message names each language, its figure and the minimum).
    """
    if cfg.extending:
        record = extend.extend(dataclasses.replace(cfg.extend, overwrite=True))
        print(extend.format_record(record), flush=True)
        if not record["gate"]["passed"]:
            raise StageFailed(  # extend wrote nothing: the record printed above holds the figures
                "extended tokenizer's gate failed: "
                + "; ".join(record["gate"]["failures"])
                + f"; nothing written to {cfg.extend.out}"
            )
        return
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
    tables={"tokenizer": TokenizerTrainConfig, "audit": AuditConfig, "extend": ExtendConfig},
    config=TokenizerStageConfig,
    reads=(),
    writes="tokenizer",
    needs=None,
    describe=lambda c: (
        f"extend {c.extend.base}'s vocabulary by up to {c.extend.new_tokens} tokens -> {c.extend.out}"
        if c.extending
        else f"train BPE + fertility audit -> {c.tokenizer.out_dir}"
    ),
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
