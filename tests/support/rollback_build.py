"""A rollback template for the tests (run by the worker as argv, no shell): put an engine back on
the build the local supervisor is configured with and restart it.

    python rollback_build.py SUPERVISOR_URL IID

Exits non-zero (with the supervisor's answer) when either call is refused.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request


def post(url: str, body: dict[str, object]) -> None:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never a proxy
    try:
        with opener.open(req, timeout=120) as r:
            print(url, r.status, r.read()[:300].decode(errors="replace"))
    except urllib.error.HTTPError as exc:
        sys.exit(f"{url}: HTTP {exc.code} {exc.read()[:300].decode(errors='replace')}")


def main() -> None:
    supervisor, iid = sys.argv[1].rstrip("/"), sys.argv[2]
    post(f"{supervisor}/engines/{iid}/build", {"build": ""})  # "" = as configured (the previous build)
    post(f"{supervisor}/engines/{iid}/restart", {})


if __name__ == "__main__":
    main()
