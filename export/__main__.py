"""``python -m prodip.export export CHECKPOINT --out DIR``: the export stage without the ``prodip`` wrapper.

    python -m prodip.export export runs/demo/train --out runs/demo/export
"""

from __future__ import annotations

import argparse
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    from prodip.export.cli import add_subcommands
    from prodip.config import ConfigError

    parser = argparse.ArgumentParser(prog="python -m prodip.export")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_subcommands(sub)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        return int(args.func(args) or 0)
    except (ConfigError, ValueError, FileNotFoundError, FileExistsError) as err:
        print(f"export: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
