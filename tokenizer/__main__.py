"""``python -m prodip.tokenizer train|audit|prepare``: the tokenizer stage without the ``prodip`` wrapper.

    python -m prodip.tokenizer audit --tokenizer-dir runs/tok --heldout bn=data/heldout/udhr_ben.txt
"""

from __future__ import annotations

import argparse
import logging
import sys

from prodip.config import ConfigError
from prodip.tokenizer.cli import add_subcommands


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (``train``/``audit`` of ``prodip tokenizer``, or ``prepare`` of ``prodip data``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m prodip.tokenizer")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_subcommands(sub)
    if argv and argv[0] in ("train", "audit"):
        argv = ["tokenizer", *argv]
    elif argv and argv[0] == "prepare":
        argv = ["data", *argv]
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (ConfigError, ValueError, FileNotFoundError, FileExistsError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
