"""``python -m rgtune.cli ...`` is ``rgtune ...``."""

import sys

from rgtune.cli import main

sys.exit(main())
