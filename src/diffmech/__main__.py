"""``python -m diffmech ...``: the command line of :mod:`diffmech.cli`."""

import sys

from .cli import main

sys.exit(main())
