"""``python -m prodip.conformance EXPORT_DIR --checkpoint CKPT`` is ``prodip conformance ...``.

python -m prodip.conformance runs/demo/export --checkpoint runs/demo/train --shards-dir runs/demo/shards
"""

import sys

from prodip.base.cli import stage_main
from prodip.conformance.cli import add_subcommands

if __name__ == "__main__":
    sys.exit(stage_main("python -m prodip.conformance", add_subcommands, ["conformance", *sys.argv[1:]]))
