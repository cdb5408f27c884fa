"""The control OpenAPI document of a real router against the router's real answers: every answer of
the control API — 200/409/422/503, the control token's 401/403, the client listener's 404 — is
valid by the schema the document gives for its status, and request bodies valid by the document's
own request schemas (its edge values) are never refused as a 422."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from narwhal_testing.openapi import check_response, edge_bodies
from tests.support import loopback
from tests.support.fleet import start_sims, write_fleet
from tests.support.procs import free_port, proc_group
from tests.support.router import RouterHandle, start_router

pytestmark = pytest.mark.integration
TOKEN_ENV = "NARWHAL_OPENAPI_TEST_TOKEN"
GOOD = {"authorization": "Bearer s3cret"}
LIFECYCLE = "/narwhal/lifecycle"


def _call(r: RouterHandle, method: str, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
    if method == "GET":
        resp = loopback.get(r.control_url + path, timeout=5, **kw)
    else:
        resp = r.post(path, body, control=True, **kw)
    return resp.status_code, resp.json()


def test_real_answers_match_the_control_openapi_document(tmp_path: Path) -> None:
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 3)
        extra = {"control": {"port": free_port(), "token_env": TOKEN_ENV, "protect_reads": True}}
        fleet = write_fleet(tmp_path, sims, extra=extra)
        r = start_router(group, fleet, tmp_path, wait_ready=True, env={TOKEN_ENV: "s3cret"})
        resp = loopback.get(r.control_url + "/narwhal/openapi.json", timeout=5, headers=GOOD)
        assert resp.status_code == 200
        doc = resp.json()
        seen: set[tuple[str, int]] = set()

        def checked(method: str, path: str, body: Any = None, **kw: Any) -> int:
            status, answer = _call(r, method, path, body, **kw)
            check_response(doc, path, method, status, answer)
            seen.add((path, status))
            return status

        for method, path in (
            ("GET", LIFECYCLE),
            ("POST", LIFECYCLE + "/drain"),
            ("POST", LIFECYCLE + "/readmit"),
        ):
            assert checked(method, path, {}) == 401, path  # no token
            assert checked(method, path, {}, headers={"authorization": "Bearer wrong"}) == 403
        # the client listener: /narwhal/* is the control listener's
        wrong_listener = r.post(LIFECYCLE + "/drain", {}, headers=GOOD)
        check_response(doc, LIFECYCLE + "/drain", "post", wrong_listener.status_code, wrong_listener.json())
        assert wrong_listener.status_code == 404

        assert checked("GET", LIFECYCLE, headers=GOOD) == 200
        assert checked("POST", LIFECYCLE + "/drain", {"engines": ["e0", "e0"]}, headers=GOOD) == 422
        engines = [s.iid for s in sims]
        for action in ("drain", "readmit"):
            path = f"{LIFECYCLE}/{action}"
            for body in edge_bodies(doc, path, engines):
                assert checked("POST", path, body, headers=GOOD) != 422, body
        assert {(LIFECYCLE + "/drain", 200), (LIFECYCLE + "/drain", 409)} <= seen, seen
