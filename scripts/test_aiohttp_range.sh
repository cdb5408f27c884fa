#!/usr/bin/env bash
# aiohttp is pinned to a range (pyproject.toml). The venv holds the newest version of it; this runs the
# tests of what aiohttp carries for us — the listeners, the connection bound and header timeout, the
# front's hand-off and graceful stop, the control listener, and the check that router/ uses no
# private aiohttp API — against the range's LOWEST version, installed (once) into a directory of
# its own that is put first on PYTHONPATH (the router processes the integration test starts inherit
# it). Nothing in .venv changes. (The floor, 3.11.12, is the first release whose server log of a
# malformed head names the peer, which serving/front.MalformedHeadLog reports.)
set -euo pipefail
cd "$(dirname "$0")/.."
low=$(.venv/bin/python - <<'PY'
import re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
(spec,) = [d for d in deps if re.match(r"aiohttp\b", d)]
print(re.search(r">=\s*([0-9][0-9.]*)", spec).group(1))
PY
)
dir=.venv/aiohttp-range/$low
if [ ! -f "$dir/aiohttp/__init__.py" ]; then
  rm -rf "$dir"
  .venv/bin/python -m pip install -q --no-deps --target "$dir" "aiohttp==$low"
fi
export PYTHONPATH="$PWD/$dir${PYTHONPATH:+:$PYTHONPATH}"
got=$(.venv/bin/python -c 'import aiohttp; print(aiohttp.__version__)')
echo "aiohttp range check: lowest version $low (imported: $got)"
case "$got" in "$low"|"$low".*) ;; *) echo "expected aiohttp $low, imported $got" >&2; exit 1 ;; esac
.venv/bin/python -m pytest -q -p no:cacheprovider -n 0 \
  tests/unit/test_aiohttp_public.py tests/unit/test_connections.py tests/unit/test_front.py \
  tests/unit/test_listeners.py tests/unit/lifecycle/test_client_leaves.py \
  tests/integration/test_connection_hygiene.py \
  tests/integration/test_request_bounds.py::test_bare_lf_heads_are_a_400_at_once_with_one_info_line "$@"
