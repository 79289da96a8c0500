"""The train package's pipeline stages: ``train`` (checkpoints), ``eval`` (eval.json) and ``sft`` (chat
fine-tuning of the trained checkpoint, when ``[sft] inputs`` names conversations; export then takes it).

python -c "from prodip.train.stage import STAGES; print([s.name for s in STAGES])"
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from prodip.base.errors import StageFailed
from prodip.base.files import file_sha256_cached
from prodip.base.stage import Plan, Stage, made_from
from prodip.tokenizer.shards import meta_sha256
from prodip.train import checkpoint, sft, trainer
from prodip.train import eval as evaluation
from prodip.train.records import TRAINER_STATE_FILE, EvalReport, SftEvalReport, TrainerState

log = logging.getLogger(__name__)


def latest_model_sha256(run_dir: str | Path) -> str | None:
    """sha256 of the newest complete checkpoint's ``model.safetensors`` (None if there is none yet)."""
    try:
        weights = checkpoint.resolve_checkpoint(run_dir) / "model.safetensors"
        return file_sha256_cached(weights)
    except (FileNotFoundError, ValueError):
        return None


def _train_inputs(plan: Plan) -> tuple[dict[str, Any], dict[str, Any], Path] | None:
    """(recorded, current, checkpoint) input hashes of the newest checkpoint: its tokenizer and shards."""
    try:
        ckpt = checkpoint.resolve_checkpoint(plan["train"].out_dir)
    except (FileNotFoundError, ValueError):
        return None
    state = TrainerState.read_or_none(ckpt / TRAINER_STATE_FILE)
    recorded = {
        "tokenizer": state.tokenizer_sha256 if state is not None else None,
        "shards": state.shards_meta_sha256 if state is not None else None,
    }
    try:
        tok = file_sha256_cached(Path(plan["train"].tokenizer_dir) / "tokenizer.json")
    except OSError:
        tok = None
    return recorded, {"tokenizer": tok, "shards": meta_sha256(plan["train"].shards_dir)}, ckpt


def train_done(plan: Plan) -> bool:
    """The newest complete checkpoint has reached ``[train] steps`` and was trained on the current
    tokenizer and shards (the sha256s its ``trainer_state.json`` recorded)."""
    inputs = _train_inputs(plan)
    if inputs is None:
        return False
    recorded, current, ckpt = inputs
    try:
        state = TrainerState.read(ckpt / TRAINER_STATE_FILE)
    except (OSError, ValueError) as err:  # damaged: training resumes, and names what is wrong
        log.warning("%s: unreadable %s (%s); the checkpoint is not complete", ckpt, TRAINER_STATE_FILE, err)
        return False
    return state.step >= plan["train"].steps and made_from(str(ckpt), recorded, current)


def train_run(plan: Plan) -> None:
    """Train (an interrupted run, one with ``checkpoints/latest``, continues from it).

    Raises:
        StageFailed: the checkpoints were trained on another tokenizer or other shards (an earlier stage
            was made again): training is not resumed on other data, and hours of training are not
            deleted without being asked.
    """
    cfg = plan["train"]
    inputs = _train_inputs(plan)
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
    trainer.train(cfg, plan["model"])


def eval_done(plan: Plan) -> bool:
    """``eval.json`` exists, scores the newest checkpoint, read the current shards, and holds the task figures
    ``[eval] tasks`` asks for, measured with the current task settings."""
    ev = EvalReport.read_or_none(plan["eval"].out)
    if ev is None:
        return False
    want = evaluation.task_settings(plan["eval"]) if plan["eval"].tasks else None
    if (ev.tasks or {}).get("settings") != want:
        log.info("%s: its task figures are not those [eval] tasks asks for; scoring again", plan["eval"].out)
        return False
    recorded = {"checkpoint": ev.checkpoint.model_sha256, "shards": ev.shards_meta_sha256}
    current = {"checkpoint": latest_model_sha256(plan["train"].out_dir), "shards": meta_sha256(plan["eval"].shards_dir)}
    return made_from(plan["eval"].out, recorded, current)


def eval_run(plan: Plan) -> None:
    """Held-out NLL and bits/char of the newest checkpoint and its random twin -> ``eval.json``."""
    evaluation.evaluate(plan["eval"])


def _sft_inputs(plan: Plan) -> tuple[dict[str, Any], dict[str, Any]]:
    """(recorded, current) hashes of what the fine-tuning run read: the starting weights and the conversations."""
    cfg = plan["sft"]
    doc = SftEvalReport.read_or_none(Path(cfg.out_dir) / sft.EVAL_FILE)
    recorded = {
        "init": doc.init_model_sha256 if doc is not None else None,
        "conversations": doc.inputs_sha256 if doc is not None else None,
    }
    return recorded, {"init": sft.source_sha256(cfg.init_from), "conversations": sft.inputs_sha256(cfg.inputs)}


def sft_done(plan: Plan) -> bool:
    """The fine-tuning run reached ``[sft] steps``, ``sft_eval.json`` scores its newest checkpoint, and it
    started from the current pretrained checkpoint and conversations."""
    if not sft.sft_done(plan["sft"]):
        return False
    recorded, current = _sft_inputs(plan)
    return made_from(str(Path(plan["sft"].out_dir) / sft.EVAL_FILE), recorded, current)


def sft_run(plan: Plan) -> None:
    """Chat fine-tuning of the pretrained checkpoint (an interrupted run continues from its latest checkpoint).

    Raises:
        StageFailed: the run's checkpoints started from other weights or other conversations than the
            current ones (an earlier stage was made again): move the run aside to fine-tune again.
    """
    cfg = plan["sft"]
    if (Path(cfg.out_dir) / "checkpoints" / "latest").exists():
        recorded, current = _sft_inputs(plan)
        changed = [k for k, v in current.items() if recorded.get(k) is not None and recorded[k] != v]
        if changed:
            raise StageFailed(
                f"{cfg.out_dir} was fine-tuned from other {' and '.join(changed)} than {cfg.init_from} / [sft] "
                f"inputs hold now; move {cfg.out_dir} aside (or delete it) to fine-tune again"
            )
        cfg = dataclasses.replace(cfg, resume=True)
    sft.sft(cfg)


STAGES = (
    Stage(
        name="train",
        tables={"model": "prodip.train.config:ModelConfig", "train": "prodip.train.trainer:TrainConfig"},
        reads=("tokenizer", "shards"),
        writes="train",
        needs="data",
        describe=lambda p: f"{p['train'].steps} steps -> {p['train'].out_dir}",
        done=train_done,
        run=train_run,
    ),
    Stage(
        name="eval",
        tables={"eval": "prodip.train.eval:EvalConfig"},
        reads=("train", "shards"),
        writes="eval",
        needs="train",
        describe=lambda p: f"held-out NLL and bits/char vs random twin -> {p['eval'].out}",
        done=eval_done,
        run=eval_run,
    ),
    Stage(
        name="sft",
        tables={"sft": "prodip.train.sft:SFTConfig"},
        reads=("train",),
        writes="sft",
        needs="train",
        describe=lambda p: (
            f"chat fine-tuning, {p['sft'].steps} steps on {', '.join(p['sft'].inputs)} "
            f"conversations -> {p['sft'].out_dir}"
        ),
        done=sft_done,
        run=sft_run,
        active=lambda p: bool(p["sft"].inputs),
    ),
)
