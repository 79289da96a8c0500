"""``python -m prodip.export export CHECKPOINT --out DIR``: the export stage without the ``prodip`` wrapper.

python -m prodip.export export runs/demo/train --out runs/demo/export
"""

import sys

from prodip.base.cli import stage_main
from prodip.export.cli import add_subcommands

if __name__ == "__main__":
    sys.exit(stage_main("python -m prodip.export", add_subcommands, sys.argv[1:]))
