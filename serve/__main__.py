"""``python -m prodip.serve serve EXPORT_DIR [flags]``: the same as ``prodip serve`` (imports no torch).

python -m prodip.serve serve runs/demo/export --port 8000
"""

import sys

from prodip.base.cli import stage_main
from prodip.serve.cli import add_subcommands

if __name__ == "__main__":
    sys.exit(stage_main("python -m prodip.serve", add_subcommands, sys.argv[1:]))
