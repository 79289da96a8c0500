"""``prodip train`` (and ``prodip eval``, provided by train/eval.py) subcommand registration.

    prodip train --config configs/demo.toml --steps 50
    python -m prodip.train train --config configs/demo.toml --resume true
"""

from __future__ import annotations

import argparse
import os

from prodip.base.config import add_arguments, resolve
from prodip.train.config import ModelConfig


def _train_main(args: argparse.Namespace) -> int:
    from prodip.train.trainer import TrainConfig, train

    model_cfg = resolve(ModelConfig, args, toml_path=args.config, section="model")
    train_cfg = resolve(TrainConfig, args, toml_path=args.config, section="train")
    run_dir = train(train_cfg, model_cfg)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"run dir: {run_dir}")
    return 0


def _add_train(subparsers) -> None:
    from prodip.train.trainer import TrainConfig

    parser = subparsers.add_parser(
        "train", help="train a Llama-style model on token shards (torchrun for several GPUs)",
        description="Train from a TOML file's [model] and [train] tables; flags override the file.")
    parser.add_argument("--config", metavar="TOML", help="file with [model] and [train] tables")
    add_arguments(parser, TrainConfig, skip=("resume", "force"))
    parser.add_argument("--resume", action="store_const", const=True, default=argparse.SUPPRESS,
                        help="continue from OUT_DIR/checkpoints/latest (weights, Adam moments, RNG, data position)")
    parser.add_argument("--force", action="store_const", const=True, default=argparse.SUPPRESS,
                        help="train even if the tokenizer failed its fertility gate")
    add_arguments(parser, ModelConfig)
    parser.set_defaults(func=_train_main)


def add_subcommands(subparsers, only: str | None = None) -> None:
    """Register ``train`` and ``eval`` (or just ``only``) on the ``prodip`` subparsers."""
    if only in (None, "train"):
        _add_train(subparsers)
    if only in (None, "eval"):
        from prodip.train.eval import add_eval_subcommand
        add_eval_subcommand(subparsers)
