"""``python -m prodip ...`` is the same as the ``prodip`` command."""

import sys

from prodip.cli import main

sys.exit(main())
