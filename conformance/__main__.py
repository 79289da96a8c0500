"""``python -m prodip.conformance EXPORT_DIR --checkpoint CKPT`` is ``prodip conformance ...``."""
import sys

from prodip.cli import main

sys.exit(main(["conformance", *sys.argv[1:]]))
