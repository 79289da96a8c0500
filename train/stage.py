"""The train package's two pipeline stages: ``train`` (checkpoints) and ``eval`` (eval.json).

python -c "from prodip.train.stage import STAGES; print([s.name for s in STAGES])"
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

from prodip.base.files import file_sha256_cached, read_json_or_none
from prodip.base.stage import Plan, Stage
from prodip.train import checkpoint, trainer
from prodip.train import eval as evaluation

log = logging.getLogger(__name__)


def latest_model_sha256(run_dir: str | Path) -> str | None:
    """sha256 of the newest complete checkpoint's ``model.safetensors`` (None if there is none yet)."""
    try:
        weights = checkpoint.resolve_checkpoint(run_dir) / "model.safetensors"
        return file_sha256_cached(weights)
    except (FileNotFoundError, ValueError):
        return None


def train_done(plan: Plan) -> bool:
    """The newest complete checkpoint has reached ``[train] steps``."""
    try:
        ckpt = checkpoint.resolve_checkpoint(plan["train"].out_dir)
    except (FileNotFoundError, ValueError):
        return False
    try:
        state = json.loads((ckpt / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:  # damaged: training resumes, and names what is wrong
        log.warning("%s: unreadable trainer_state.json (%s); the checkpoint is not complete", ckpt, err)
        return False
    return int(state["step"]) >= plan["train"].steps


def train_run(plan: Plan) -> None:
    """Train (an interrupted run, one with ``checkpoints/latest``, continues from it)."""
    cfg = plan["train"]
    if (Path(cfg.out_dir) / "checkpoints" / "latest").exists():
        cfg = dataclasses.replace(cfg, resume=True)
    trainer.train(cfg, plan["model"])


def eval_done(plan: Plan) -> bool:
    """``eval.json`` exists and scores the newest checkpoint."""
    ev = read_json_or_none(Path(plan["eval"].out))
    return bool(ev) and ev.get("checkpoint", {}).get("model_sha256") == latest_model_sha256(plan["train"].out_dir)


def eval_run(plan: Plan) -> None:
    """Held-out NLL and bits/char of the newest checkpoint and its random twin -> ``eval.json``."""
    evaluation.evaluate(plan["eval"])


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
)
