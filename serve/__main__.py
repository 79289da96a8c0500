"""``python -m prodip.serve serve EXPORT_DIR [flags]``: the same as ``prodip serve``."""
import sys

from prodip.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
