#!/usr/bin/env bash
# Validate docker-compose.yml without a Docker engine: `docker-compose config` only parses,
# interpolates and schema-checks the file. Installs Debian's docker-compose (v1.29) when missing;
# --no-install-recommends keeps docker.io (the engine) out.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v docker-compose >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "check_compose: docker-compose is not installed and cannot be installed here (needs root + apt-get)" >&2
    exit 1
  fi
  echo "check_compose: installing docker-compose with apt-get" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends docker-compose >/dev/null
fi
# The stack reads the control token from deploy/narwhal.env, which an operator creates (never
# committed): validate with a throwaway one when it does not exist.
if [ -z "${NARWHAL_ENV_FILE:-}" ] && [ ! -f deploy/narwhal.env ]; then
  NARWHAL_ENV_FILE="$(mktemp)"
  trap 'rm -f "$NARWHAL_ENV_FILE"' EXIT
  echo "NARWHAL_CONTROL_TOKEN=check-compose-only" > "$NARWHAL_ENV_FILE"
  export NARWHAL_ENV_FILE
fi
docker-compose -f docker-compose.yml config -q
docker-compose -f docker-compose.yml -f deploy/compose.router-a-standby.yml config -q
docker-compose -f docker-compose.yml -f deploy/compose.active-active.yml config -q
echo "check_compose: docker-compose.yml is valid ($(docker-compose version --short))"
