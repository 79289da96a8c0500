"""``python -m prodip.tokenizer train|audit|prepare``: the tokenizer stage without the ``prodip`` wrapper.

python -m prodip.tokenizer audit --tokenizer-dir runs/tok --heldout bn=data/heldout/udhr_ben.txt
"""

import sys

from prodip.base.cli import stage_main
from prodip.tokenizer.cli import add_subcommands


def main(argv: list[str]) -> int:
    """``train``/``audit`` of ``prodip tokenizer``, or ``prepare`` of ``prodip data``."""
    if argv and argv[0] in ("train", "audit"):
        argv = ["tokenizer", *argv]
    elif argv and argv[0] == "prepare":
        argv = ["data", *argv]
    return stage_main("python -m prodip.tokenizer", add_subcommands, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
