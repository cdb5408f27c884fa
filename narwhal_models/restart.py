"""Inputs, outputs and the progress document of the restart workflows (and their activities).

Everything that crosses the Temporal boundary is a pydantic model (serialised with
``pydantic_data_converter``). Documents an operator reads — the progress document and the final
result — carry ``schema`` + ``schema_version``. Secrets never appear here: the router control token
lives in the worker's configuration (activities/worker_config.py): workflow input *names* a router
and a command template the worker knows, never a command, a token or a token destination.

Imported by workflow code, so: stdlib + pydantic only.
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from narwhal_models.evidence import AnalysisPolicy, Sample

PROGRESS_SCHEMA = "narwhal.restart-progress"
RESULT_SCHEMA = "narwhal.restart-result"
SCHEMA_VERSION = 1

DeadlinePolicy = Literal["wait", "fail", "approve"]
SupervisorBackend = Literal["local", "command", "manual"]
RestartMode = Literal["rolling", "wave"]

# Steps one engine goes through (EngineRestart) — also used for the whole wave (WaveRestart).
Step = Literal[
    "pending",
    "draining",
    "waiting_to_stop",
    "awaiting_approval",
    "restarting",
    "waiting_for_new_process",
    "readmitting",
    "confirming",
    "blocked",
    "done",
    "aborted",
    "failed",
    "refused",
]
WAITING_FOR_OPERATOR: frozenset[str] = frozenset({"awaiting_approval", "blocked"})
FINAL_STEPS: frozenset[str] = frozenset({"done", "aborted", "failed", "refused"})
Outcome = Literal["pending", "running", "restarted", "aborted", "failed", "refused"]
RunState = Literal[
    "starting", "running", "paused", "waiting_operator", "done", "aborted", "failed", "analysis_failed"
]

_FLEET_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")


def fleet_slug(text: str) -> str:
    """A fleet name usable in workflow ids and as a search-attribute keyword."""
    slug = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")
    return (slug or "fleet")[:63]


def fleet_workflow_id(fleet: str) -> str:
    return f"narwhal-restart-{fleet}"


def engine_workflow_id(fleet: str, iid: str) -> str:
    return f"engine-restart-{fleet}-{iid}"


FLEET_LOCK_PREFIX = "narwhal-fleet-lock-"


def fleet_identity(engine_urls: dict[str, str]) -> str:
    """The canonical identity of a fleet: the engines it restarts, as the router reports them
    (``iid=URL`` of every engine, sorted, hashed). Independent of the ``--fleet`` name, the same on
    both routers of an HA pair (one fleet file), different for two stacks with the same engine ids."""
    text = "\n".join(f"{iid}={url.rstrip('/')}" for iid, url in sorted(engine_urls.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def fleet_lock_id(identity: str) -> str:
    """The fixed workflow id of the fleet's lock (Temporal keeps one running workflow per id)."""
    return FLEET_LOCK_PREFIX + identity


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


def iso(ts: float | None) -> str:
    """Epoch seconds → ISO 8601 UTC with milliseconds (``2026-12-01T08:30:12.841Z``); "" for None."""
    if ts is None:
        return ""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _WithIso(_Model):
    """A document whose epoch fields each get an ISO 8601 twin (``<field>_iso``) when serialised,
    recomputed on every dump so it can never disagree with the epoch value."""

    _iso_fields: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _with_iso(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            for name in self._iso_fields:
                data[f"{name}_iso"] = iso(getattr(self, name))
        return data


# ---------------------------------------------------------------------------------------------
# Connection settings passed to activities (no secrets)


class RouterRef(_Model):
    """Which router the lifecycle calls go to: ``name`` of a router in the worker's configuration
    (and/or ``routers``, URLs that must all be configured under one name — the form older inputs
    used). The activity follows the holder among the configured URLs. ``token_env`` is a field of
    older inputs only: a worker refuses input that sets it (tokens are worker configuration)."""

    name: str = ""
    routers: list[str] = Field(default_factory=list)
    token_env: str = ""
    request_timeout_s: float = Field(default=10.0, gt=0)

    @field_validator("routers")
    @classmethod
    def _strip(cls, v: list[str]) -> list[str]:
        return [u.rstrip("/") for u in v]

    @model_validator(mode="after")
    def _named(self) -> RouterRef:
        if not self.name and not self.routers:
            raise ValueError("name a router of the worker's configuration (or its URLs)")
        return self


class SupervisorRef(_Model):
    """``command`` backend: ``template`` names a command template of the worker's configuration
    (default ``restart``). ``command`` and ``command_timeout_s`` are fields of older inputs: a
    worker refuses input that carries a command (the template's own timeout applies)."""

    backend: SupervisorBackend = "local"
    url: str = ""
    template: str = ""
    command: str = ""
    command_timeout_s: float = Field(default=300.0, gt=0)

    @field_validator("url")
    @classmethod
    def _strip(cls, v: str) -> str:
        return v.rstrip("/")


class Timing(_Model):
    """Tunables of the waits (seconds). Defaults suit real engines; tests shrink them."""

    poll_interval_s: float = Field(default=1.0, gt=0)
    heartbeat_timeout_s: float = Field(default=15.0, gt=0)
    restart_timeout_s: float = Field(default=600.0, gt=0)
    new_process_timeout_s: float = Field(default=600.0, gt=0)  # restart timeout (--restart-timeout-s)
    confirm_timeout_s: float = Field(default=120.0, gt=0)
    router_call_timeout_s: float = Field(default=600.0, gt=0)


# ---------------------------------------------------------------------------------------------
# Workflow inputs


class RestartPlan(_Model):
    """What `narwhal-restart start` asks for. ``engines`` empty = every engine the router knows."""

    fleet: str
    mode: RestartMode = "rolling"
    router: RouterRef
    supervisor: SupervisorRef = Field(default_factory=SupervisorRef)
    engines: list[str] = Field(default_factory=list)
    engine_urls: dict[str, str] = Field(default_factory=dict)
    max_unavailable: int = Field(default=1, ge=1)
    deadline_s: float = Field(default=300.0, gt=0)
    deadline_policy: DeadlinePolicy = "wait"
    timing: Timing = Field(default_factory=Timing)
    requested_by: str = ""
    pause_after: int = Field(default=0, ge=0)  # canary gate: wait for resume/approve after N engines
    # canary analysis after each readmission (workflows/analysis.py, --analysis FILE); None: none
    analysis: AnalysisPolicy | None = None
    # a command template of the worker's configuration (by name, never a command) that puts an
    # engine the analysis failed back on its previous build; "": the failed engine stays held
    rollback_template: str = Field(default="", pattern=r"^([A-Za-z0-9._-]{1,64})?$")

    @field_validator("fleet")
    @classmethod
    def _fleet(cls, v: str) -> str:
        if not _FLEET_RE.match(v):
            raise ValueError(f"fleet name {v!r} must match {_FLEET_RE.pattern}")
        return v


class EngineRestartInput(_Model):
    fleet: str
    iid: str
    engine_url: str = ""
    router: RouterRef
    supervisor: SupervisorRef = Field(default_factory=SupervisorRef)
    deadline_s: float = Field(default=300.0, gt=0)
    deadline_policy: DeadlinePolicy = "wait"
    timing: Timing = Field(default_factory=Timing)
    report_to_parent: bool = False


# ---------------------------------------------------------------------------------------------
# Progress / result documents


class OperatorEvent(_WithIso):
    """Something an operator did or is asked to do (pause, resume, approve, retry, abort, a wait)."""

    _iso_fields = ("at",)
    at: float
    at_iso: str = ""
    kind: Literal["paused", "resumed", "approved", "retried", "aborted", "waiting_for_operator"]
    iid: str = ""
    by: str = ""
    detail: str = ""


class EngineProgress(_WithIso):
    _iso_fields = ("old_process_start", "new_process_start", "started_at", "finished_at", "step_started_at")
    iid: str
    step: Step = "pending"
    outcome: Outcome = "pending"
    router_state: str = ""
    accepts_new: bool | None = None
    checks: list[str] = Field(default_factory=list)
    error: str = ""
    build: str = ""  # build identity the router last read (version · launch digest)
    old_process_start: float | None = None
    new_process_start: float | None = None
    restarted_by_us: bool = False
    note: str = ""
    waiting_for: str = ""
    decisions: int = 0
    started_at: float | None = None
    finished_at: float | None = None
    step_started_at: float | None = None
    timings: dict[str, float] = Field(default_factory=dict)
    step_times: dict[str, float] = Field(default_factory=dict)  # step -> when it was first entered
    old_process_start_iso: str = ""
    new_process_start_iso: str = ""
    started_at_iso: str = ""
    finished_at_iso: str = ""
    step_started_at_iso: str = ""


class RestartProgress(_WithIso):
    _iso_fields = ("started_at", "updated_at")
    schema_: Literal["narwhal.restart-progress"] = Field(default="narwhal.restart-progress", alias="schema")
    schema_version: Literal[1] = 1
    fleet: str
    mode: RestartMode
    workflow_id: str = ""
    state: RunState = "starting"
    paused: bool = False
    abort_requested: bool = False
    message: str = ""
    deadline_policy: DeadlinePolicy = "wait"
    max_unavailable: int = 1
    supervisor: SupervisorBackend = "local"
    wave_id: str = ""
    started_at: float | None = None
    updated_at: float | None = None
    started_at_iso: str = ""
    updated_at_iso: str = ""
    pause_after: int = 0
    fleet_lock: str = ""  # the lock workflow this run holds (empty: not held / not yet)
    engines: dict[str, EngineProgress] = Field(default_factory=dict)
    events: list[OperatorEvent] = Field(default_factory=list)
    analysis: list[Sample] = Field(default_factory=list)  # canary analysis samples, oldest first

    model_config = ConfigDict(extra="forbid", populate_by_name=True, serialize_by_alias=True)


class RestartResult(_WithIso):
    _iso_fields = ("started_at", "finished_at")
    schema_: Literal["narwhal.restart-result"] = Field(default="narwhal.restart-result", alias="schema")
    schema_version: Literal[1] = 1
    fleet: str
    mode: RestartMode
    ok: bool
    state: RunState
    message: str = ""
    started_at: float | None = None
    finished_at: float | None = None
    started_at_iso: str = ""
    finished_at_iso: str = ""
    engines: dict[str, EngineProgress] = Field(default_factory=dict)
    events: list[OperatorEvent] = Field(default_factory=list)
    analysis: list[Sample] = Field(default_factory=list)  # the canary analysis evidence

    model_config = ConfigDict(extra="forbid", populate_by_name=True, serialize_by_alias=True)


# ---------------------------------------------------------------------------------------------
# Operator messages


class OperatorRequest(_Model):
    """Body of the `approve` / `retry` / `abort` updates. ``iid`` empty = the engine that waits."""

    iid: str = ""
    by: str = ""
    reason: str = ""


class OperatorAnswer(_Model):
    accepted: bool
    message: str


class Decision(_Model):
    """What a parent forwards to an engine child (signal ``decide``)."""

    kind: Literal["approve", "retry", "abort"]
    by: str = ""
    reason: str = ""


# ---------------------------------------------------------------------------------------------
# Activity inputs / outputs


class EngineView(_Model):
    """The part of one `narwhal.lifecycle` engine entry the workflows use."""

    state: str
    draining: bool = False
    accepts_new: bool = False
    ready_to_stop: bool = False
    resident: int = 0
    old_process_start: float | None = None
    new_process_start: float | None = None
    restart_required: bool = False
    wave_id: str = ""
    checks: list[str] = Field(default_factory=list)
    error: str = ""
    build: str = ""  # the engine's build identity as the router read it ("" = unknown)


class FleetView(_Model):
    """`GET /narwhal/lifecycle` (+ roles from the handoff) as seen on the lease holder."""

    router_url: str
    controls_fleet: bool
    ready: bool
    wave_id: str = ""
    wave_active: bool = False
    wave_ready_to_stop: bool = False
    engine_restart_policy: str = "individual"
    engines: dict[str, EngineView] = Field(default_factory=dict)
    roles: dict[str, str] = Field(default_factory=dict)
    model: str = ""
    roles_error: str = ""  # the handoff (roles) could not be read: role safety cannot be decided
    # From ``GET /narwhal/state`` (empty when the router does not serve it): what the router's own
    # floor rule counts — pins (unpinned engines serve either leg) and controller.min_prefill/decode.
    pins: dict[str, bool] = Field(default_factory=dict)
    floors: dict[str, int] = Field(default_factory=dict)


class DrainRequest(_Model):
    """``supervisor``: the restart backend the workflow will use, checked by the worker against its
    configuration before anything is drained (None in requests of older workflows)."""

    router: RouterRef
    engines: list[str]
    wave: bool = False
    deadline_s: float = Field(default=300.0, gt=0)
    supervisor: SupervisorRef | None = None


class DrainOutcome(_Model):
    """A drain that holds its targets. ``capture_failures`` non-empty = the router answered 503
    (identity unreadable, targets held): start those engines under the hold and drain again."""

    engines: dict[str, EngineView] = Field(default_factory=dict)
    wave_id: str = ""
    capture_failures: dict[str, str] = Field(default_factory=dict)
    already_active: bool = False


class StopWaitRequest(_Model):
    router: RouterRef
    engines: list[str]
    wave: bool = False
    stop_on_deadline: bool = True
    poll_interval_s: float = Field(default=1.0, gt=0)


class StopWait(_Model):
    status: Literal["ready_to_stop", "deadline_exceeded", "unexpected"]
    engines: dict[str, EngineView] = Field(default_factory=dict)
    message: str = ""


class RollbackRequest(_Model):
    """Run the worker's rollback template (by name) for an engine the canary analysis failed."""

    iid: str
    url: str = ""
    template: str
    supervisor: SupervisorRef


class ReadmitRequest(_Model):
    router: RouterRef
    engines: list[str]
    wave: bool = False
    old_process_starts: dict[str, float] = Field(default_factory=dict)


class ReadmitOutcome(_Model):
    engines: dict[str, EngineView] = Field(default_factory=dict)
    already_active: bool = False


class ConfirmRequest(_Model):
    router: RouterRef
    engines: list[str]
    require_ready: bool = False


class EngineTarget(_Model):
    """One engine as the supervisor activities see it. ``launch`` > 0: the workflow's launch number
    for this engine — the restart activity reports it (signal ``launch_started``) before it runs
    anything, so the workflow knows durably whether a launch may have happened."""

    iid: str
    url: str = ""
    old_process_start: float
    supervisor: SupervisorRef
    launch: int = 0


class LaunchReport(_Model):
    """Signal ``launch_started``: the restart activity is about to launch (command / supervisor)."""

    iid: str
    launch: int
    at: float
    what: str = ""


class ProcessProbe(_Model):
    """The engine's live ``process_start_time_seconds`` (None: it does not answer)."""

    iid: str
    url: str = ""
    process_start: float | None = None


class RestartOutcome(_Model):
    iid: str
    restarted: bool
    note: str = ""
    old_pid: int | None = None
    new_pid: int | None = None
    new_process_start: float | None = None


class NewProcess(_Model):
    iid: str
    process_start: float


class StartEngineRequest(_Model):
    iid: str
    supervisor: SupervisorRef


# ---------------------------------------------------------------------------------------------
# Preflight from the worker, and the fleet lock


class PreflightRequest(_Model):
    """The first activity of every run: checks from the worker, before anything is drained."""

    router: RouterRef
    engines: list[str] = Field(default_factory=list)  # empty: every engine the router knows
    engine_urls: dict[str, str] = Field(default_factory=dict)
    rollback_template: str = ""  # the plan's rollback template: the worker must have it


class PreflightOutcome(_Model):
    view: FleetView
    identity: str
    lock_id: str
    engine_urls: dict[str, str] = Field(default_factory=dict)  # what the router reported
    checked: list[str] = Field(default_factory=list)  # one line per check that passed


class FleetLockInput(_Model):
    identity: str
    owner: str  # the restart workflow id holding the lock
    fleet: str = ""


class LockOwnerRequest(_Model):
    lock_id: str
    fleet: str = ""


class LockOwner(_Model):
    """Who holds a fleet lock (read from Temporal by the worker): owner id, its state, how to steer."""

    lock_id: str
    owner: str = ""
    owner_run_id: str = ""
    state: str = ""
    message: str = ""
