"""The tokenizer package's two pipeline stages: ``tokenizer`` (train, audit, gate) and ``data`` (shards).

python -c "from prodip.tokenizer.stage import STAGES; print([s.name for s in STAGES])"
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from prodip.base.errors import StageFailed
from prodip.base.stage import Plan, Stage, made_from
from prodip.tokenizer import audit, bpe, encode, shards


def tokenizer_done(plan: Plan) -> bool:
    """Trained, audited and through the fertility gate (``fertility.json`` says passed)."""
    fert = audit.read_fertility_or_none(plan["tokenizer"].out_dir)
    return fert is not None and fert.gate.passed


def tokenizer_run(plan: Plan) -> None:
    """Train the tokenizer, audit it on held-out text and apply the fertility gate.

    Raises:
        StageFailed: the gate failed (the message names each language, its figure and the minimum).
    """
    # Not done means never trained, or audited and failed: (re)train, since the [tokenizer] table
    # may have changed since (a run that never passed this stage takes the new config).
    bpe.train_tokenizer(dataclasses.replace(plan["tokenizer"], overwrite=True))
    report = audit.run_audit(plan["audit"])  # writes fertility.json
    print(audit.format_table(report), flush=True)
    if not report.gate.passed:
        raise StageFailed(
            "tokenizer fertility gate failed: "
            + "; ".join(report.gate.failures)
            + f" (see {Path(plan['tokenizer'].out_dir) / audit.FERTILITY_NAME})"
        )


def data_done(plan: Plan) -> bool:
    """Shards exist and were encoded with the current tokenizer (``meta.json`` names its sha256)."""
    meta = shards.read_meta_or_none(plan["data"].out_dir)
    try:
        current = bpe.tokenizer_sha256(plan["data"].tokenizer_dir)
    except (FileNotFoundError, ValueError):
        return False
    return meta is not None and made_from(
        plan["data"].out_dir, {"tokenizer": meta.tokenizer_sha256}, {"tokenizer": current}
    )


def data_run(plan: Plan) -> None:
    """Encode the corpus into shards (replacing shards of an earlier tokenizer of this run)."""
    cfg = plan["data"]
    stale = (Path(cfg.out_dir) / shards.META_NAME).exists()
    encode.prepare_shards(dataclasses.replace(cfg, overwrite=True) if stale else cfg)


STAGES = (
    Stage(
        name="tokenizer",
        tables={
            "tokenizer": "prodip.tokenizer.bpe:TokenizerTrainConfig",
            "audit": "prodip.tokenizer.audit:AuditConfig",
        },
        reads=(),
        writes="tokenizer",
        needs=None,
        describe=lambda p: f"train BPE + fertility audit -> {p['tokenizer'].out_dir}",
        done=tokenizer_done,
        run=tokenizer_run,
    ),
    Stage(
        name="data",
        tables={"data": "prodip.tokenizer.encode:DataPrepareConfig"},
        reads=("tokenizer",),
        writes="shards",
        needs="tokenizer",
        describe=lambda p: f"encode corpus -> {p['data'].out_dir}",
        done=data_done,
        run=data_run,
    ),
)
