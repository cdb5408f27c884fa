#!/usr/bin/env bash
# Create .venv and install the project with its dev extras (idempotent; reinstalls when pyproject changes).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[dev]'
  rm -f .venv/.installed-*
  touch "$stamp"
fi
# etcd (tests only: the etcd-backend integration tests start a three-member cluster; the router
# never needs etcd unless --etcd-endpoints / ha.etcd_endpoints is configured).
if ! command -v etcd >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends etcd-server etcd-client >/dev/null
fi
