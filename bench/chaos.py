"""Chaos drill (``fleet/chaos``): steady client load on an HA router pair while rolling restarts
run, with seeded kill -9 faults of the worker, the active router, an engine, or the Temporal dev
server. What it measures and the invariants it checks: ``fleet/chaos/__init__.py``.

    .venv/bin/python bench/chaos.py --short --json bench/results/chaos-short.json
    .venv/bin/python bench/chaos.py --duration 300 --engines 8 --seed 7 --faults worker,router,engine,temporal
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleet.chaos.cli import main

if __name__ == "__main__":
    sys.exit(main())
