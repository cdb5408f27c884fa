#!/usr/bin/env bash
# Create .venv and install the project with its dev extras (idempotent; reinstalls when pyproject changes).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# (setup.py builds the relay's C loop in place: a changed source reinstalls too)
stamp=.venv/.installed-$(cat pyproject.toml setup.py router/serving/_relay.c | sha256sum | cut -c1-16)
native_missing() {  # the relay's C loop is built in place: a clean of the tree removes it
  command -v cc >/dev/null 2>&1 && ! .venv/bin/python -c 'import router.serving._relay' 2>/dev/null
}
if [ ! -f "$stamp" ] || native_missing; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[dev]'
  rm -f .venv/.installed-*
  touch "$stamp"
fi
# Debian packages the tests use (the router itself needs none of them):
# jq — the operator guide's jq expressions run with the real jq;
# etcd-server / etcd-client — the etcd-backend integration tests start a three-member cluster (the
# router never needs etcd unless --etcd-endpoints / ha.etcd_endpoints is configured).
need=()
command -v jq >/dev/null 2>&1 || need+=(jq)
command -v etcd >/dev/null 2>&1 || need+=(etcd-server etcd-client)
command -v openssl >/dev/null 2>&1 || need+=(openssl)  # TLS tests make their certificates with it
if [ ${#need[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    echo "bootstrap: not installed (the tests need them): ${need[*]} (apt-get install ${need[*]})" >&2
  fi
fi
