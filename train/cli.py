"""``prodip train`` and ``prodip eval`` subcommand registration.

prodip train --config configs/demo.toml --steps 50
python -m prodip.train train --config configs/demo.toml --resume
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from prodip.base.config import add_arguments, resolve
from prodip.base.errors import InvalidInput
from prodip.train.config import EvalConfig, ModelConfig, SFTConfig, TrainConfig
from prodip.train.eval import evaluate, format_table
from prodip.train.trainer import train

_RESUME_HELP = "continue from OUT_DIR/checkpoints/latest (weights, Adam moments, RNG, data position)"


def _add_flag(parser: argparse.ArgumentParser, flag: str, help_text: str) -> None:
    """A flag that sets its config field to True when given; absent, the TOML file's value stands."""
    parser.add_argument(flag, action="store_const", const=True, default=argparse.SUPPRESS, help=help_text)


def _done(run_dir: Any) -> int:
    """Print the run dir once (rank 0 under torchrun) and return exit code 0."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"run dir: {run_dir}")
    return 0


def _train_main(args: argparse.Namespace) -> int:
    model_cfg = resolve(ModelConfig, args, toml_path=args.config, section="model")
    train_cfg = resolve(TrainConfig, args, toml_path=args.config, section="train")
    return _done(train(train_cfg, model_cfg))


def _add_train(subparsers) -> None:

    parser = subparsers.add_parser(
        "train",
        help="train a Llama-style model on token shards (torchrun for several GPUs)",
        description="Train from a TOML file's [model] and [train] tables; flags override the file.",
    )
    parser.add_argument("--config", metavar="TOML", help="file with [model] and [train] tables")
    add_arguments(parser, TrainConfig, skip=("resume", "force"), section="train")
    _add_flag(parser, "--resume", _RESUME_HELP)
    _add_flag(parser, "--force", "train even if the tokenizer failed its fertility gate")
    add_arguments(parser, ModelConfig, section="model")
    parser.set_defaults(func=_train_main)


def _sft_main(args: argparse.Namespace) -> int:
    from prodip.train.sft import sft  # noqa: PLC0415 (only this subcommand needs it)

    return _done(sft(resolve(SFTConfig, args, toml_path=args.config, section="sft")))


def _add_sft(subparsers) -> None:
    parser = subparsers.add_parser(
        "sft",
        help="chat fine-tuning: conversations (OpenAI messages) with the loss on assistant tokens only",
        description="Fine-tune a prodip checkpoint or HF Llama folder on conversations from a TOML file's "
        "[sft] table; flags override the file. Writes a chat model (its tokenizer carries the chat template).",
    )
    parser.add_argument("--config", metavar="TOML", help="file with an [sft] table")
    add_arguments(parser, SFTConfig, skip=("resume",), section="sft")
    _add_flag(parser, "--resume", _RESUME_HELP)
    parser.set_defaults(func=_sft_main)


def add_subcommands(subparsers, only: str | None = None) -> None:
    """Register ``train``, ``sft`` and ``eval`` (or just ``only``) on the ``prodip`` subparsers."""
    if only in (None, "train"):
        _add_train(subparsers)
    if only in (None, "sft"):
        _add_sft(subparsers)
    if only in (None, "eval"):
        add_eval_subcommand(subparsers)


# ---- prodip eval ------------------------------------------------------------------------------


def _eval_main(args: argparse.Namespace) -> int:
    alias = getattr(args, "mc_alias", None)
    if alias is not None:
        if getattr(args, "mc_file", None) not in (None, alias):
            raise InvalidInput(f"two multiple-choice files given: --mc {alias} and --mc-file {args.mc_file}; give one")
        args.mc_file = alias
    cfg = resolve(EvalConfig, args, toml_path=args.config, section="eval")
    result = evaluate(cfg)
    print(format_table(result))
    print(f"wrote {result['out']}")
    return 0


def add_eval_subcommand(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``eval`` on the ``prodip`` subparsers (``--config TOML`` table ``[eval]`` + flags)."""
    parser = subparsers.add_parser(
        "eval",
        help="held-out NLL and bits/char of a checkpoint vs its random-initialised twin",
        description="Per-language validation NLL (nats/token) and bits per character of a checkpoint and "
        "of its random-initialised twin, plus optional multiple-choice accuracy and lm-evaluation-harness tasks "
        "(--tasks, with standard errors; docs/eval.md); writes eval.json.",
    )
    parser.add_argument("--config", metavar="TOML", help="file with an [eval] table")
    add_arguments(parser, EvalConfig, section="eval")
    parser.add_argument("--mc", dest="mc_alias", metavar="JSONL", default=argparse.SUPPRESS, help="same as --mc-file")
    parser.set_defaults(func=_eval_main)
    return parser
