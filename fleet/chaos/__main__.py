"""``python -m fleet.chaos``: the chaos drill's command line (``fleet.chaos.cli``)."""

import sys

from fleet.chaos.cli import main

sys.exit(main())
