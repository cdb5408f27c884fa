"""Each engine's build identity as the router last read it: ``/version`` and, where the engine (or
its sidecar) attests, the attestation's launch and document digests.

Pure bookkeeping: ``EngineControl`` reports what it read (every identity read of the startup check,
the monitor and the readmission goes through it); the lifecycle document shows it per engine as
``build``, so a mixed-version fleet is visible during and after a restart wave. What is shown is
what the engine answered; whether it was verified is what the engine's ``checks`` say.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from router.engines.identity import same_process


class BuildView(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: str = Field(description="the engine's /version")
    process_start: float = Field(description="process_start_time_seconds of the process that answered")
    launch_digest: str = Field(
        default="", description="attestation launch_digest (launch + config), if attested"
    )
    attestation_digest: str = Field(default="", description="attestation_digest, if attested")


class EngineBuilds:
    def __init__(self) -> None:
        self.builds: dict[str, BuildView] = {}

    def saw_identity(self, iid: str, version: str, process_start: float) -> None:
        old = self.builds.get(iid)
        if old is not None and old.version == version and old.process_start == process_start:
            return
        self.builds[iid] = BuildView(version=version, process_start=process_start)

    def saw_attestation(self, iid: str, doc: Any) -> None:
        old = self.builds.get(iid)
        if old is None or not isinstance(doc, dict):
            return
        engine = doc.get("engine")
        start = engine.get("process_start_time_seconds") if isinstance(engine, dict) else None
        if not isinstance(start, int | float) or not same_process(float(start), old.process_start):
            return  # another process's document (one read while the engine restarted): not this build's
        launch, whole = doc.get("launch_digest"), doc.get("attestation_digest")
        self.builds[iid] = old.model_copy(
            update={
                "launch_digest": launch if isinstance(launch, str) else "",
                "attestation_digest": whole if isinstance(whole, str) else "",
            }
        )

    def view(self, iid: str) -> BuildView | None:
        return self.builds.get(iid)
