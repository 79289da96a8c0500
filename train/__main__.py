"""``python -m prodip.train train|eval ...`` (same as ``prodip train|eval``; torchrun-friendly: ``-m prodip.train``).

    python -m prodip.train train --config configs/demo.toml
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from prodip.cli import main as prodip_main

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("train", "eval"):
        argv = ["--help"] if not argv else argv
        print("usage: python -m prodip.train {train,eval} ...", file=sys.stderr)
        return 2
    return prodip_main(argv)


if __name__ == "__main__":
    sys.exit(main())
