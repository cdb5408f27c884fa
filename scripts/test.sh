#!/usr/bin/env bash
# The project's test command: lint, type-check, then the whole pytest suite (unit + integration).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
