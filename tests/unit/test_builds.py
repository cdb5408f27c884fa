"""Build identity per engine (router/builds.py): what the lifecycle document's ``build`` shows."""

from __future__ import annotations

from router.attestation import build_attestation
from router.builds import EngineBuilds


def test_version_and_the_attested_digests_of_the_process_that_answered() -> None:
    b = EngineBuilds()
    assert b.view("e0") is None
    b.saw_attestation("e0", build_attestation({}, {}, "1.0", 100.0, launch={"args": []}))  # no identity yet
    assert b.view("e0") is None
    b.saw_identity("e0", "1.0", 100.0)
    doc = build_attestation({}, {}, "1.0", 100.0, launch={"args": ["--x"]})
    b.saw_attestation("e0", doc)
    v = b.view("e0")
    assert v is not None and (v.version, v.launch_digest) == ("1.0", doc["launch_digest"])
    b.saw_identity("e0", "1.0", 100.0)  # the same process again: digests kept
    assert b.view("e0") == v
    b.saw_identity("e0", "2.0", 200.0)  # a new process: its own build, digests once attested
    assert b.view("e0") is not None and b.view("e0").launch_digest == ""  # type: ignore[union-attr]
    b.saw_attestation("e0", doc)  # the old process's document (read across the restart): ignored
    assert b.view("e0").launch_digest == ""  # type: ignore[union-attr]
    new = build_attestation({}, {}, "2.0", 200.0, launch={"args": ["--y"]})
    b.saw_attestation("e0", new)
    assert b.view("e0").launch_digest == new["launch_digest"] != doc["launch_digest"]  # type: ignore[union-attr]
