#!/usr/bin/env bash
# The embedded demo: Temporal dev server, supervisor + simulated engines, router pair, worker, load,
# and a rolling restart (see README). Extra arguments go to narwhal-up.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/narwhal-up "$@"
