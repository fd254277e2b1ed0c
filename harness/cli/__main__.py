"""``python -m harness.cli``: the same as the ``harness`` command (study workers start this way)."""

import sys

from harness.cli.main import main

sys.exit(main())
