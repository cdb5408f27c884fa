"""The activities' (and ``narwhal-restart``'s) view of the router's documents, as pydantic models.

Consumer-side models: they name every field the restart workflows rely on and fail loudly
(``pydantic.ValidationError`` naming the field) when a router answers something else — no
``.get()`` defaults that would turn a missing ``accepts_new`` into ``False`` or a missing role into
``"any"``. Fields the workflows do not use are ignored, so a router that adds fields (ours or the
peer, Narwhal 0.7.0) still parses. Workflows never import the router's own models: the HTTP API is
the only door between the two planes.

- ``narwhal.lifecycle`` v1 (``GET /narwhal/lifecycle`` and every lifecycle POST answer)
- ``narwhal.handoff`` v1 — only the roles and the model (``GET /narwhal/handoff``)
- ``narwhal.state`` v1 — only the pins and role floors (``GET /narwhal/state``)
- the Prometheus HTTP-SD target list (``GET /narwhal/targets``) and the fleet file's engine list,
  the two sources of engine addresses

Engine ids and URLs are held to ``router/ids.py`` (a hostile router's id is refused, naming it).
No I/O here: workflow modules may import it (stdlib + pydantic + router/ids.py only).
"""

from __future__ import annotations

from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from router.ids import EngineId, UnsafeValue, check_engine_id, check_engine_url

LifecycleState = Literal["active", "draining", "drained", "deadline_exceeded", "validating", "blocked"]
KNOWN_ROLES: frozenset[str] = frozenset({"prefill", "decode"})


class DocumentError(ValueError):
    """A router document that does not have the shape the workflows rely on."""


class _Read(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Resident(_Read):
    prefill: int = Field(ge=0)
    decode: int = Field(ge=0)


class LifecycleBuild(_Read):
    """Additive ``build`` of an engine entry (this router's; the peer's documents have none)."""

    version: str
    launch_digest: str = ""
    attestation_digest: str = ""

    def text(self) -> str:
        """``0.12.0 · launch sha256:1a2b3c4d5e6f`` (the digest of what was launched, when attested)."""
        digest = self.launch_digest or self.attestation_digest
        kind = "launch" if self.launch_digest else "attestation"
        return self.version + (f" · {kind} {digest[:19]}" if digest else "")


class LifecycleEngine(_Read):
    state: LifecycleState
    draining: bool
    accepts_new: bool
    ready_to_stop: bool
    resident: Resident
    restart_required: bool
    wave_id: str
    old_process_start: float | None
    new_process_start: float | None
    checks: list[str]
    error: str
    build: LifecycleBuild | None = None


class LifecycleRouter(_Read):
    controls_fleet: bool
    ready: bool


class LifecycleWave(_Read):
    id: str
    active: bool
    ready_to_stop: bool


class LifecycleDocument(_Read):
    schema_: Literal["narwhal.lifecycle"] = Field(alias="schema")
    schema_version: Literal[1]
    router: LifecycleRouter
    wave: LifecycleWave
    engines: dict[EngineId, LifecycleEngine]
    engine_restart_policy: Literal["individual", "whole_wave"]
    error: str = ""


class HandoffRoles(_Read):
    """The part of ``narwhal.handoff`` v1 the rolling plan needs: who serves which role."""

    schema_: Literal["narwhal.handoff"] = Field(alias="schema")
    schema_version: Literal[1]
    model: str
    engines: list[str]
    roles: dict[str, str]

    def unknown_roles(self, iids: list[str]) -> dict[str, str]:
        """Engines whose role is missing or not prefill/decode (role safety cannot be decided)."""
        return {i: self.roles.get(i, "(missing)") for i in iids if self.roles.get(i) not in KNOWN_ROLES}


class StateEngine(_Read):
    role: str
    pin: bool


class StateFloors(_Read):
    prefill: int = Field(ge=0)
    decode: int = Field(ge=0)


class StateScheduler(_Read):
    floors: StateFloors
    engines: dict[str, StateEngine]


class StateFloorsDocument(_Read):
    """The part of ``narwhal.state`` v1 the floor rule needs: pins and ``controller.min_*``."""

    schema_: Literal["narwhal.state"] = Field(alias="schema")
    schema_version: Literal[1]
    scheduler: StateScheduler


class TargetGroup(_Read):
    """One Prometheus HTTP-SD target group: ``{"targets": ["host:port"], "labels": {...}}``."""

    targets: list[str]
    labels: dict[str, str] = Field(default_factory=dict)


TARGET_LIST = TypeAdapter(list[TargetGroup])


class FleetFileEngine(_Read):
    iid: EngineId
    url: str = Field(min_length=1)
    role: str = ""


class FleetFileEngines(_Read):
    """The ``engines`` list of a router fleet file (``narwhal.fleet``); every other key ignored."""

    engines: list[FleetFileEngine]


def describe(exc: ValidationError, what: str) -> str:
    """One line naming the first bad fields: ``engines.e0.accepts_new: Field required``."""
    parts = []
    for err in exc.errors()[:3]:
        loc = ".".join(str(p) for p in err["loc"]) or "(document)"
        parts.append(f"{loc}: {err['msg']}")
    more = f" (+{exc.error_count() - 3} more)" if exc.error_count() > 3 else ""
    return f"{what}: " + "; ".join(parts) + more


M = TypeVar("M", bound=BaseModel)


def _validated(model: type[M], doc: object, source: str, schema: str) -> M:
    """``doc`` as ``model``; a ``DocumentError`` naming the source, the schema and the bad fields."""
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        raise DocumentError(
            describe(exc, f"{source or 'router'}: not a usable {schema} v1 document")
        ) from exc


def lifecycle_document(doc: object, source: str = "") -> LifecycleDocument:
    return _validated(LifecycleDocument, doc, source, "narwhal.lifecycle")


def handoff_roles(doc: object, source: str = "") -> HandoffRoles:
    return _validated(HandoffRoles, doc, source, "narwhal.handoff")


def state_floors(doc: object, source: str = "") -> StateFloorsDocument:
    return _validated(StateFloorsDocument, doc, source, "narwhal.state")


# Label names that carry the engine id, in the order they are tried: ours, then common spellings.
IID_LABELS = ("iid", "narwhal_iid", "engine", "instance_id", "engine_id", "__meta_narwhal_iid")


def target_urls(doc: object, source: str = "") -> dict[str, str]:
    """``GET /narwhal/targets`` (Prometheus HTTP-SD) → {iid: base URL}.

    Each group's engine id comes from its labels (``iid`` first, see ``IID_LABELS``); the URL from
    ``__meta_narwhal_url`` or ``__scheme__`` + target + ``__metrics_path__`` prefix. A group with several targets or without an id label is an
    error: the addresses must be unambiguous to restart the right process.
    """
    try:
        groups = TARGET_LIST.validate_python(doc)
    except ValidationError as exc:
        raise DocumentError(
            describe(exc, f"{source or 'router'}: not a Prometheus HTTP-SD target list")
        ) from exc
    urls: dict[str, str] = {}
    for n, g in enumerate(groups):
        iid = next((g.labels[k] for k in IID_LABELS if g.labels.get(k)), "")
        if not iid:
            raise DocumentError(
                f"{source}: target group {n} ({g.targets}) has no engine id label ({', '.join(IID_LABELS[:2])})"
            )
        try:
            check_engine_id(iid, f"{source}: target group {n}: engine id")
            if len(g.targets) != 1:
                raise DocumentError(
                    f"{source}: target group of {iid} lists {len(g.targets)} targets, expected 1"
                )
            urls[iid] = check_engine_url(_base_url(g), f"{source}: URL of {iid}")
        except UnsafeValue as exc:
            raise DocumentError(str(exc)) from None
    return urls


def _base_url(g: TargetGroup) -> str:
    """The engine's base URL: ``__meta_narwhal_url`` when the router gives it (ours), else scheme +
    target + the path in front of ``/metrics`` (``__metrics_path__``, Prometheus' default /metrics)."""
    if g.labels.get("__meta_narwhal_url"):
        return g.labels["__meta_narwhal_url"].rstrip("/")
    target = g.targets[0]
    if "://" not in target:
        target = f"{g.labels.get('__scheme__', 'http')}://{target}"
    path = g.labels.get("__metrics_path__", "/metrics")
    prefix = path[: -len("/metrics")] if path.endswith("/metrics") else ""
    return (target.rstrip("/") + prefix).rstrip("/")


def fleet_file_urls(doc: object, source: str) -> dict[str, str]:
    try:
        fleet = FleetFileEngines.model_validate(doc)
    except ValidationError as exc:
        raise DocumentError(describe(exc, f"{source}: not a fleet file with an engines list")) from exc
    try:
        return {e.iid: check_engine_url(e.url, f"{source}: URL of {e.iid}") for e in fleet.engines}
    except UnsafeValue as exc:
        raise DocumentError(str(exc)) from None
