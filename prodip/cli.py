"""The ``prodip`` command: one subcommand per stage, plus ``prodip run CONFIG`` for all of them.

Each stage package registers its own subcommands through ``<pkg>.cli.add_subcommands``; this
module only assembles them, so that ``prodip serve`` never imports torch.

    prodip --help
    prodip run configs/demo.toml
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable

from prodip import __version__
from prodip.base.cli import leave_after_interrupt, run_command, setup_logging
from prodip.base.variants import ONNX_VARIANTS

# (subcommand, package providing it, one-line help). Packages are imported lazily so that
# `prodip serve --help` does not pay for (or need) torch.
_STAGES = [
    ("tokenizer", "prodip.tokenizer", "train, audit and gate a Bangla-aware BPE tokenizer, or extend a base model's"),
    ("data", "prodip.tokenizer", "encode a corpus into token shards with a tokenizer dir"),
    ("train", "prodip.train", "train a Llama-style model on token shards (torchrun for several GPUs)"),
    ("sft", "prodip.train", "chat fine-tuning on conversations, loss on the assistant's tokens only"),
    ("eval", "prodip.train", "held-out NLL and bits/char of a checkpoint vs its random-initialised twin"),
    ("export", "prodip.export", f"checkpoint -> HF safetensors + ONNX ({'/'.join(ONNX_VARIANTS)}) + manifest"),
    ("conformance", "prodip.conformance", "prove every exported artifact computes what the training model computes"),
    ("serve", "prodip.serve", "HTTP generation (OpenAI-compatible) from an export dir on ONNX Runtime"),
    ("run", "prodip.pipeline", "run the whole pipeline from one TOML config"),
]


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The top-level parser. Only the stage named in ``argv`` is imported and registered."""
    parser = argparse.ArgumentParser(
        prog="prodip", description="Train small LMs in PyTorch, export, verify and serve them on device."
    )
    parser.add_argument("--version", action="version", version=f"prodip {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = next((a for a in (argv or []) if not a.startswith("-")), None)
    for name, package, help_text in _STAGES:
        if wanted == name:
            module = importlib.import_module(package if package == "prodip.pipeline" else f"{package}.cli")
            module.add_subcommands(sub, only=name)
        else:
            sub.add_parser(name, help=help_text)
    return parser


def _whole_file_checked(func: Callable[[argparse.Namespace], int | None]) -> Callable[[argparse.Namespace], int | None]:
    """``func`` after the whole ``--config`` file passed ``prodip run``'s validator
    (:func:`prodip.pipeline.validate_config_file`): a stage command reads one table, but a typo in any
    other (``[serve] varaint``) is refused as ``prodip run`` refuses it, not silently ignored.

    ``prodip serve`` too: the validator reads every table into its config class (``prodip.plan.RunPlan``),
    whose modules import nothing beyond the default install, so it runs where serve runs, without torch.
    """

    def checked(args: argparse.Namespace) -> int | None:
        from prodip.pipeline import validate_config_file  # noqa: PLC0415 (lazy: only with --config)

        validate_config_file(args.config)
        return func(args)

    return checked


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``prodip`` console script; returns the process exit code.

    Called as the command (``argv`` None), a run stopped by Ctrl-C ends the process right after saying so
    (:func:`prodip.base.cli.leave_after_interrupt`); called with ``argv`` (tests), it returns 130.
    """
    as_command = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    func = getattr(args, "func", None)
    if func is None:
        try:  # a stage group without its verb, e.g. `prodip tokenizer`: show that group's help
            parser.parse_args([args.command, "--help"] if args.command else ["--help"])
        except SystemExit:
            pass
        return 2
    if args.command != "run" and getattr(args, "config", None):
        func = _whole_file_checked(func)
    code = run_command(func, args, args.command)
    return leave_after_interrupt(code) if as_command else code


if __name__ == "__main__":
    sys.exit(main())
