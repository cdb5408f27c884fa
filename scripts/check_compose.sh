#!/usr/bin/env bash
# Validate docker-compose.yml without a Docker engine, and check every image it names.
#
#   scripts/check_compose.sh                 # docker-compose.yml and each deploy/compose.*.yml override
#   scripts/check_compose.sh FILE [FILE...]  # only this combination (-f FILE -f FILE ...)
#
# `docker-compose config` only parses, interpolates and schema-checks the files. The docs use the
# `docker compose` (v2) command; this machine's Debian offers the v1.29 parser only, which reads the
# same file format (the files use nothing v2-specific). Installs Debian's docker-compose when missing;
# --no-install-recommends keeps docker.io (the engine) out.
#
# Images: each resolved `image:` must match a pattern of deploy/image-allowlist.txt (maintained
# registries and publishers, pinned by a version tag); anything else is refused by name.
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

mapfile -t allowed < <(sed -e 's/#.*//' -e 's/[[:space:]]*$//' deploy/image-allowlist.txt | grep -v '^$')
bad=0

check() {  # check -f A -f B ...: valid, and every image on the allow-list
  local config image pattern ok
  config="$(docker-compose "$@" config)"
  while read -r image; do
    ok=0
    for pattern in "${allowed[@]}"; do
      # shellcheck disable=SC2053  # the pattern is a glob on purpose
      if [[ "$image" == $pattern ]]; then ok=1; break; fi
    done
    if [ "$ok" -ne 1 ]; then
      echo "check_compose: image $image (in $*) is not on deploy/image-allowlist.txt" >&2
      bad=1
    fi
  done < <(printf '%s\n' "$config" | sed -n 's/^[[:space:]]*image:[[:space:]]*//p' | tr -d "\"'" | sort -u)
}

if [ "$#" -gt 0 ]; then
  args=()
  for f in "$@"; do args+=(-f "$f"); done
  check "${args[@]}"
else
  check -f docker-compose.yml
  for override in deploy/compose.*.yml; do
    check -f docker-compose.yml -f "$override"
  done
fi
if [ "$bad" -ne 0 ]; then
  exit 1
fi
echo "check_compose: docker-compose.yml is valid ($(docker-compose version --short)); images on the allow-list"
