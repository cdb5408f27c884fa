#!/usr/bin/env bash
# The project's test command: lint, type-check, then the whole pytest suite (unit + integration).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
# Two pytest-xdist workers (NARWHAL_TEST_WORKERS=N to change; 0 runs in this process), one test file
# per worker at a time: module-scoped fixtures stay in one process; each worker starts its own
# session services (Temporal dev server, etcd cluster, narwhal-worker) and picks ports from its own
# slice of the loopback range (fleet/up/ports.py, free_port). Later arguments win (e.g. `-n 0`).
.venv/bin/python -m pytest -q -p no:cacheprovider -n "${NARWHAL_TEST_WORKERS:-2}" --dist loadfile "$@"
# aiohttp is pinned to a range: the listener / connection / front tests again against its lowest
# version (~1 min; after a full run only, not when tests are named)
if [ $# -eq 0 ]; then
  bash scripts/test_aiohttp_range.sh
fi
