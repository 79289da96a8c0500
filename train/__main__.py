"""``python -m prodip.train train|eval ...`` (same as ``prodip train|eval``; torchrun-friendly: ``-m prodip.train``).

python -m prodip.train train --config configs/demo.toml
torchrun --nproc_per_node 2 -m prodip.train train --config configs/demo.toml --device cpu
"""

import sys

from prodip.base.cli import leave_after_interrupt, stage_main
from prodip.train.cli import add_subcommands

if __name__ == "__main__":
    sys.exit(leave_after_interrupt(stage_main("python -m prodip.train", add_subcommands, sys.argv[1:])))
