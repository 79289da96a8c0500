"""The train package's pipeline stages: ``train`` (checkpoints), ``eval`` (eval.json) and ``sft`` (chat
fine-tuning of the trained checkpoint, when ``[sft] inputs`` names conversations; export then takes it).

python -c "from prodip.train.stage import STAGES; print([s.name for s in STAGES])"
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prodip.base.errors import StageFailed
from prodip.base.files import file_sha256_cached
from prodip.base.stage import RunContext, Stage, made_from
from prodip.tokenizer.shards import meta_sha256
from prodip.train import checkpoint, sft, trainer
from prodip.train import eval as evaluation
from prodip.train.config import EvalConfig, ModelConfig, SFTConfig, TrainConfig
from prodip.train.records import TRAINER_STATE_FILE, EvalReport, SftEvalReport, TrainerState

log = logging.getLogger(__name__)


def latest_model_sha256(run_dir: str | Path) -> str | None:
    """sha256 of the newest complete checkpoint's ``model.safetensors`` (None if there is none yet)."""
    try:
        weights = checkpoint.resolve_checkpoint(run_dir) / "model.safetensors"
        return file_sha256_cached(weights)
    except (FileNotFoundError, ValueError):
        return None


@dataclass(frozen=True)
class TrainStageConfig:
    """The train stage's config: the model to build (``[model]``) and how to train it (``[train]``)."""

    model: ModelConfig
    train: TrainConfig


def _train_inputs(cfg: TrainConfig) -> tuple[dict[str, str | None], dict[str, str | None], Path] | None:
    """(recorded, current, checkpoint) input hashes of the newest checkpoint: its tokenizer and shards."""
    try:
        ckpt = checkpoint.resolve_checkpoint(cfg.out_dir)
    except (FileNotFoundError, ValueError):
        return None
    state = TrainerState.read_or_none(ckpt / TRAINER_STATE_FILE)
    recorded = {
        "tokenizer": state.tokenizer_sha256 if state is not None else None,
        "shards": state.shards_meta_sha256 if state is not None else None,
    }
    try:
        tok = file_sha256_cached(Path(cfg.tokenizer_dir) / "tokenizer.json")
    except OSError:
        tok = None
    return recorded, {"tokenizer": tok, "shards": meta_sha256(cfg.shards_dir)}, ckpt


def train_done(cfg: TrainStageConfig) -> bool:
    """The newest complete checkpoint has reached ``[train] steps`` and was trained on the current
    tokenizer and shards (the sha256s its ``trainer_state.json`` recorded)."""
    inputs = _train_inputs(cfg.train)
    if inputs is None:
        return False
    recorded, current, ckpt = inputs
    try:
        state = TrainerState.read(ckpt / TRAINER_STATE_FILE)
    except (OSError, ValueError) as err:  # damaged: training resumes, and names what is wrong
        log.warning("%s: unreadable %s (%s); the checkpoint is not complete", ckpt, TRAINER_STATE_FILE, err)
        return False
    return state.step >= cfg.train.steps and made_from(str(ckpt), recorded, current)


def train_run(stage_cfg: TrainStageConfig, ctx: RunContext | None = None) -> None:
    """Train (an interrupted run, one with ``checkpoints/latest``, continues from it).

    Raises:
        StageFailed: the checkpoints were trained on another tokenizer or other shards (an earlier stage
            was made again): training is not resumed on other data, and hours of training are not
            deleted without being asked.
    """
    cfg = stage_cfg.train
    inputs = _train_inputs(cfg)
    if inputs is not None:
        recorded, current, ckpt = inputs
        changed = [k for k, v in current.items() if recorded.get(k) is not None and recorded[k] != v]
        if changed:
            raise StageFailed(
                f"{ckpt} was trained on another {' and '.join(changed)} than {cfg.tokenizer_dir} / {cfg.shards_dir} "
                f"hold now; move {cfg.out_dir} aside (or delete it) to train again on them"
            )
    if (Path(cfg.out_dir) / "checkpoints" / "latest").exists():
        cfg = dataclasses.replace(cfg, resume=True)
    trainer.train(cfg, stage_cfg.model)


def _eval_out(cfg: EvalConfig) -> Path | None:
    """Where ``[eval]`` writes eval.json: ``out``, else beside the newest checkpoint's run dir (None: no checkpoint)."""
    if cfg.out:
        return Path(cfg.out)
    try:
        return evaluation.default_out(checkpoint.resolve_checkpoint(cfg.checkpoint))
    except (FileNotFoundError, ValueError):
        return None


def eval_done(cfg: EvalConfig) -> bool:
    """``eval.json`` exists, scores the newest checkpoint of ``[eval] checkpoint``, read the current shards, and
    holds the task figures ``[eval] tasks`` asks for, measured with the current task settings."""
    out = _eval_out(cfg)
    ev = EvalReport.read_or_none(out) if out is not None else None
    if ev is None:
        return False
    want = evaluation.task_settings(cfg) if cfg.tasks else None
    if (ev.tasks or {}).get("settings") != want:
        log.info("%s: its task figures are not those [eval] tasks asks for; scoring again", out)
        return False
    recorded = {"checkpoint": ev.checkpoint.model_sha256, "shards": ev.shards_meta_sha256}
    current = {"checkpoint": latest_model_sha256(cfg.checkpoint), "shards": meta_sha256(cfg.shards_dir)}
    return made_from(str(out), recorded, current)


def eval_run(cfg: EvalConfig, ctx: RunContext | None = None) -> None:
    """Held-out NLL and bits/char of the newest checkpoint and its random twin -> ``eval.json``."""
    evaluation.evaluate(cfg)


def _sft_inputs(cfg: SFTConfig) -> tuple[dict[str, str | None], dict[str, str | None]]:
    """(recorded, current) hashes of what the fine-tuning run read: the starting weights and the conversations."""
    doc = SftEvalReport.read_or_none(Path(cfg.out_dir) / sft.EVAL_FILE)
    recorded = {
        "init": doc.init_model_sha256 if doc is not None else None,
        "conversations": doc.inputs_sha256 if doc is not None else None,
    }
    return recorded, {"init": sft.source_sha256(cfg.init_from), "conversations": sft.inputs_sha256(cfg.inputs)}


def sft_done(cfg: SFTConfig) -> bool:
    """The fine-tuning run reached ``[sft] steps``, ``sft_eval.json`` scores its newest checkpoint, and it
    started from the current pretrained checkpoint and conversations."""
    if not sft.sft_done(cfg):
        return False
    recorded, current = _sft_inputs(cfg)
    return made_from(str(Path(cfg.out_dir) / sft.EVAL_FILE), recorded, current)


def sft_run(cfg: SFTConfig, ctx: RunContext | None = None) -> None:
    """Chat fine-tuning of the pretrained checkpoint (an interrupted run continues from its latest checkpoint).

    Raises:
        StageFailed: the run's checkpoints started from other weights or other conversations than the
            current ones (an earlier stage was made again): move the run aside to fine-tune again.
    """
    if (Path(cfg.out_dir) / "checkpoints" / "latest").exists():
        recorded, current = _sft_inputs(cfg)
        changed = [k for k, v in current.items() if recorded.get(k) is not None and recorded[k] != v]
        if changed:
            raise StageFailed(
                f"{cfg.out_dir} was fine-tuned from other {' and '.join(changed)} than {cfg.init_from} / [sft] "
                f"inputs hold now; move {cfg.out_dir} aside (or delete it) to fine-tune again"
            )
        cfg = dataclasses.replace(cfg, resume=True)
    sft.sft(cfg)


TRAIN: Stage[TrainStageConfig] = Stage(
    name="train",
    tables={"model": ModelConfig, "train": TrainConfig},
    config=TrainStageConfig,
    reads=("tokenizer", "shards"),
    writes="train",
    needs="data",
    describe=lambda c: f"{c.train.steps} steps -> {c.train.out_dir}",
    done=train_done,
    run=train_run,
)
EVAL: Stage[EvalConfig] = Stage(
    name="eval",
    tables={"eval": EvalConfig},
    reads=("train", "shards"),
    writes="eval",
    needs="train",
    describe=lambda c: f"held-out NLL and bits/char vs random twin -> {c.out}",
    done=eval_done,
    run=eval_run,
)
SFT: Stage[SFTConfig] = Stage(
    name="sft",
    tables={"sft": SFTConfig},
    reads=("train",),
    writes="sft",
    needs="train",
    describe=lambda c: f"chat fine-tuning, {c.steps} steps on {', '.join(c.inputs)} conversations -> {c.out_dir}",
    done=sft_done,
    run=sft_run,
    active=lambda c: bool(c.inputs),
)
STAGES: tuple[Stage[Any], ...] = (TRAIN, EVAL, SFT)
