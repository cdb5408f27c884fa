"""The worker's own configuration: the routers it may talk to (and the token for each), and the
named command templates it may run (``restart``, ``rollback``, …).

Workflow input is data: it *names* a router and a template this configuration knows, never a
command, a token or a token destination. ``narwhal-worker --config worker.json`` (re-read when the
file changes: the next activity sees the edit; a file that no longer parses refuses every activity
until it is fixed) and/or flags (``--router NAME=URL[,URL]``, ``--router-token-env NAME=VAR``,
``--template NAME=COMMAND``; flags win over the file)::

    {
      "schema": "narwhal.worker-config", "schema_version": 1,
      "routers": {
        "prod": {"urls": ["http://router-a:8100", "http://router-b:8100"],
                 "token_env": "NARWHAL_CONTROL_TOKEN"}
      },
      "templates": {
        "restart": {"command": "ssh -o BatchMode=yes -- {host} sudo systemctl restart vllm@{iid!q}",
                    "pass_env": ["HOME", "SSH_AUTH_SOCK"], "timeout_s": 300},
        "rollback": {"command": "/usr/local/bin/vllm-rollback {iid} {url}"}
      }
    }

Not a workflow module (never loaded into the sandbox).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from activities.commands import TemplateError, check_shell, parse_exec
from activities.documents import describe
from narwhal_models.restart import RouterRef, SupervisorRef
from router.ids import UnsafeValue, check_engine_url

NAME_PATTERN = r"[A-Za-z0-9._-]{1,64}"
_NAME = re.compile(NAME_PATTERN)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
DEFAULT_TEMPLATE = "restart"


class WorkerConfigError(ValueError):
    """A worker configuration that cannot be used (names the file/flag and the key)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RouterEntry(_Model):
    """One router (or HA pair / active-active replicas): every control URL the worker may call."""

    urls: list[str] = Field(min_length=1)
    token_env: str = ""  # environment variable of the worker holding the bearer token
    token_file: str = ""  # or a file holding it (e.g. a mounted secret)

    @field_validator("urls")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        try:
            return [check_engine_url(u, "router URL") for u in v]
        except UnsafeValue as exc:
            raise ValueError(str(exc)) from None

    @field_validator("token_env")
    @classmethod
    def _env(cls, v: str) -> str:
        if v and not _ENV_NAME.fullmatch(v):
            raise ValueError(f"token_env {v!r} is not an environment variable name")
        return v

    @model_validator(mode="after")
    def _one_token_source(self) -> RouterEntry:
        if self.token_env and self.token_file:
            raise ValueError("give token_env or token_file, not both")
        return self


class CommandTemplate(_Model):
    """A command the worker may run for an engine. ``shell`` false (default): argv, no shell."""

    command: str = Field(min_length=1)
    shell: bool = False
    timeout_s: float = Field(default=300.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict)  # fixed variables for the command
    pass_env: list[str] = Field(default_factory=list)  # worker variables copied (e.g. HOME, SSH_AUTH_SOCK)

    @model_validator(mode="after")
    def _parse(self) -> CommandTemplate:
        try:
            check_shell(self.command) if self.shell else parse_exec(self.command)
        except TemplateError as exc:
            raise ValueError(str(exc)) from None
        for name in [*self.env, *self.pass_env]:
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an environment variable name")
        return self

    def argv(self) -> tuple[str, ...]:
        return parse_exec(self.command)


class WorkerConfig(_Model):
    schema_: Literal["narwhal.worker-config"] = Field(default="narwhal.worker-config", alias="schema")
    schema_version: Literal[1] = 1
    routers: dict[str, RouterEntry] = Field(default_factory=dict)
    templates: dict[str, CommandTemplate] = Field(default_factory=dict)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("routers", "templates")
    @classmethod
    def _names(cls, v: dict[str, object]) -> dict[str, object]:
        for name in v:
            if not _NAME.fullmatch(name):
                raise ValueError(f"name {name!r} must match {NAME_PATTERN}")
        return v

    @model_validator(mode="after")
    def _no_token_in_commands(self) -> WorkerConfig:
        tokens = {r.token_env for r in self.routers.values() if r.token_env}
        for name, t in self.templates.items():
            leaked = sorted(tokens & (set(t.pass_env) | set(t.env)))
            if leaked:
                raise ValueError(
                    f"template {name} passes the router token variable(s) {leaked} to its command"
                )
        return self


def parse_config(doc: object, source: str) -> WorkerConfig:
    try:
        return WorkerConfig.model_validate(doc)
    except ValidationError as exc:
        raise WorkerConfigError(describe(exc, f"{source}: not a usable worker configuration")) from None


def load_file(path: Path) -> WorkerConfig:
    try:
        text = path.read_text()
    except OSError as exc:
        raise WorkerConfigError(f"{path}: {exc.strerror or exc}") from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise WorkerConfigError(f"{path}: not JSON ({exc})") from None
    return parse_config(doc, str(path))


def _pairs(values: Sequence[str], flag: str) -> list[tuple[str, str]]:
    out = []
    for v in values:
        name, sep, rest = v.partition("=")
        if not sep or not name or not rest:
            raise WorkerConfigError(f"{flag} {v!r}: expected NAME=VALUE")
        out.append((name, rest))
    return out


def flag_overrides(args: argparse.Namespace) -> dict[str, dict[str, dict[str, object]]]:
    """``--router`` / ``--router-token-env`` / ``--template`` as a partial configuration."""
    routers: dict[str, dict[str, object]] = {}
    for name, urls in _pairs(args.router, "--router"):
        routers.setdefault(name, {})["urls"] = [u for u in urls.split(",") if u]
    for name, var in _pairs(args.router_token_env, "--router-token-env"):
        if name not in routers:
            raise WorkerConfigError(f"--router-token-env {name}={var}: no --router {name}=URL")
        routers[name]["token_env"] = var
    templates: dict[str, dict[str, object]] = {
        name: {"command": command} for name, command in _pairs(args.template, "--template")
    }
    return {"routers": routers, "templates": templates}


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        default=os.environ.get("NARWHAL_WORKER_CONFIG", ""),
        metavar="PATH",
        help="worker configuration (JSON: routers, tokens, command templates; env NARWHAL_WORKER_CONFIG); "
        "re-read when it changes",
    )
    p.add_argument(
        "--router",
        action="append",
        default=[],
        metavar="NAME=URL[,URL]",
        help="a router (HA pair / replicas) this worker may call, by name (repeatable)",
    )
    p.add_argument(
        "--router-token-env",
        action="append",
        default=[],
        metavar="NAME=VAR",
        help="the environment variable holding router NAME's control token",
    )
    p.add_argument(
        "--template",
        action="append",
        default=[],
        metavar="NAME=COMMAND",
        help="a named command template (argv, no shell; {iid} {url} {host} {port}, {iid!q} shell-quoted) "
        "(repeatable)",
    )


class WorkerSettings:
    """The configuration as of now: the file (re-read when its mtime/size change) + flags."""

    def __init__(self, path: str = "", overrides: Mapping[str, Mapping[str, object]] | None = None) -> None:
        self.path = Path(path) if path else None
        self.overrides = {k: dict(v) for k, v in (overrides or {}).items()}
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._config: WorkerConfig | None = None
        self._error = ""
        self.current()  # a bad file or flag fails at start

    @classmethod
    def of(cls, config: WorkerConfig) -> WorkerSettings:
        s = cls()
        s._config = config
        return s

    def _merge(self, base: WorkerConfig) -> WorkerConfig:
        if not any(self.overrides.values()):
            return base
        doc = base.model_dump(by_alias=True)
        for key in ("routers", "templates"):
            doc[key] = {**doc[key], **self.overrides.get(key, {})}
        return parse_config(doc, "narwhal-worker flags")

    def current(self) -> WorkerConfig:
        with self._lock:
            if self.path is None:
                if self._config is None:
                    self._config = self._merge(WorkerConfig())
                return self._config
            try:
                st = self.path.stat()
                stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            except OSError as exc:
                raise WorkerConfigError(f"{self.path}: {exc.strerror or exc}") from None
            if stamp != self._stamp:
                self._stamp = stamp
                try:
                    self._config, self._error = self._merge(load_file(self.path)), ""
                except WorkerConfigError as exc:
                    self._config, self._error = None, str(exc)
            if self._config is None:
                raise WorkerConfigError(self._error)
            return self._config


# -- what a workflow's input may name -------------------------------------------------------------


@dataclass(frozen=True)
class Router:
    name: str
    urls: tuple[str, ...]
    token_env: str
    token_file: str

    def token(self, env: Mapping[str, str]) -> str:
        """The bearer token ("" when none is configured); raises when configured but empty."""
        if self.token_env:
            token = env.get(self.token_env, "")
            if not token:
                raise WorkerConfigError(
                    f"router {self.name}: control token variable {self.token_env} is not set on the worker"
                )
            return token
        if self.token_file:
            try:
                token = Path(self.token_file).read_text().strip()
            except OSError as exc:
                raise WorkerConfigError(
                    f"router {self.name}: token file {self.token_file}: {exc.strerror or exc}"
                ) from None
            if not token:
                raise WorkerConfigError(f"router {self.name}: token file {self.token_file} is empty")
            return token
        return ""


class Refused(ValueError):
    """Workflow input naming something this worker does not know (or may not do)."""


def resolve_router(cfg: WorkerConfig, ref: RouterRef) -> Router:
    """The configured router a workflow names (by ``name``, or by URLs all configured under one name)."""
    if ref.token_env:
        raise Refused(
            f"workflow input names a token variable ({ref.token_env!r}): tokens come from the worker's "
            "configuration only"
        )
    known = ", ".join(sorted(cfg.routers)) or "none"
    if ref.name:
        entry = cfg.routers.get(ref.name)
        if entry is None:
            raise Refused(f"router {ref.name!r} is not in this worker's configuration (known: {known})")
        outside = [u for u in ref.routers if u not in entry.urls]
        if outside:
            raise Refused(f"router URL(s) {outside} are not configured for router {ref.name} ({entry.urls})")
        name = ref.name
    else:
        matches = sorted(n for n, e in cfg.routers.items() if ref.routers and set(ref.routers) <= set(e.urls))
        if len(matches) != 1:
            why = "are not in" if not matches else f"match several routers ({', '.join(matches)}) of"
            raise Refused(
                f"router URL(s) {ref.routers} {why} this worker's configuration (known routers: {known}); "
                "name one of its routers"
            )
        name = matches[0]
        entry = cfg.routers[name]
    urls = [*ref.routers, *(u for u in entry.urls if u not in ref.routers)]
    return Router(name=name, urls=tuple(urls), token_env=entry.token_env, token_file=entry.token_file)


def resolve_template(cfg: WorkerConfig, sup: SupervisorRef, name: str = "") -> tuple[str, CommandTemplate]:
    """The named template of a ``command`` backend (``restart`` unless the input names another)."""
    if sup.command:
        raise Refused(
            "workflow input carries a command: the worker runs only the templates of its configuration "
            f"(name one: {', '.join(sorted(cfg.templates)) or 'none configured'})"
        )
    wanted = name or sup.template or DEFAULT_TEMPLATE
    t = cfg.templates.get(wanted)
    if t is None:
        raise Refused(
            f"command template {wanted!r} is not in this worker's configuration "
            f"(known: {', '.join(sorted(cfg.templates)) or 'none'})"
        )
    return wanted, t
