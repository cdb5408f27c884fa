"""Restart backends (runbook §13.1 step 3) and the "newer process" probe.

Backends, chosen per workflow by ``SupervisorRef.backend``:

- ``local``: the ``narwhal-supervisor`` HTTP API. Every restart sends ``if_process_start`` = the
  process start the router recorded at drain, so a retried activity never restarts twice (the
  supervisor refuses when the engine already runs another process).
- ``command``: a command template *of the worker's configuration*, named by the workflow
  (``SupervisorRef.template``, default ``restart``; activities/worker_config.py). Split into argv
  once, placeholders substituted inside one argument in a single pass, run with
  ``create_subprocess_exec`` — no shell unless the template says ``shell: true``, and then every
  value is shell-quoted (activities/commands.py). The environment holds ``PATH``, the template's
  ``env`` and ``pass_env`` and ``NARWHAL_ENGINE_ID``/``NARWHAL_ENGINE_URL`` — never a token. Run in
  its own session with its output in a temporary file (its exit is what counts). Guarded the same
  way: the engine's live process start is read first and the command only runs while the engine
  still serves the drain-recorded process. Engine ids and URLs are checked (router/ids.py) first.

Exactly once (both backends): the workflow probes first (``probe_process``) and runs
``restart_engine`` with one attempt; the activity signals ``launch_started`` to its workflow before
it launches, so the workflow knows after a lost attempt whether a launch may have happened.
- ``manual``: does nothing; the workflow waits for the newer process and tells the operator.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import tempfile
import time
from collections.abc import Mapping
from datetime import timedelta

import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from activities import errors
from activities.commands import Values, render_exec, render_shell
from activities.engine_process import read_process_start
from activities.heartbeat import heartbeating
from activities.worker_config import (
    CommandTemplate,
    Refused,
    WorkerConfigError,
    WorkerSettings,
    resolve_template,
)
from narwhal_models.restart import (
    EngineTarget,
    LaunchReport,
    NewProcess,
    ProcessProbe,
    RestartOutcome,
    RollbackRequest,
    StartEngineRequest,
    SupervisorRef,
    iso,
)
from router.engines.identity import newer_process, process_start_or_none, same_process
from router.ids import UnsafeValue, check_engine_id, check_engine_url

SHELL = "/bin/sh"


def parse_process_start(metrics_text: str) -> float | None:
    """``process_start_time_seconds`` via the shared parser (None when missing or unusable)."""
    return process_start_or_none(metrics_text)


def command_argv(t: CommandTemplate, iid: str, url: str) -> list[str]:
    """What runs: the rendered argv, or ``/bin/sh -c <rendered>`` for a ``shell: true`` template."""
    values = Values(iid=iid, url=url)
    return [SHELL, "-c", render_shell(t.command, values)] if t.shell else render_exec(t.argv(), values)


def command_env(t: CommandTemplate, iid: str, url: str, worker_env: Mapping[str, str]) -> dict[str, str]:
    """Only what the template needs: PATH, its ``pass_env`` and ``env``, the engine's id and URL."""
    env = {"PATH": worker_env.get("PATH", os.defpath)}
    env.update({k: worker_env[k] for k in t.pass_env if k in worker_env})
    env.update(t.env)
    env.update({"NARWHAL_ENGINE_ID": iid, "NARWHAL_ENGINE_URL": url})
    return env


def checked(iid: str, url: str) -> tuple[str, str]:
    """Engine id and URL from workflow input or a supervisor's list; non-retryable refusal."""
    try:
        return check_engine_id(iid, "workflow input: engine id"), (
            check_engine_url(url, f"URL of {iid}") if url else ""
        )
    except UnsafeValue as exc:
        raise errors.worker_refused(str(exc)) from None


class SupervisorActivities:
    def __init__(
        self, http: httpx.AsyncClient, settings: WorkerSettings, env: Mapping[str, str] | None = None
    ) -> None:
        self.http = http
        self.settings = settings
        self.env = env if env is not None else os.environ

    # -- probes -------------------------------------------------------------------------------

    async def engine_url(self, iid: str, url: str, sup: SupervisorRef) -> str:
        _, url = checked(iid, url)
        if url:
            return url
        if sup.backend == "local" and sup.url:
            try:
                r = await self.http.get(f"{sup.url}/engines", timeout=10.0)
                if r.status_code == 200:
                    entry = (r.json().get("engines") or {}).get(iid) or {}
                    return checked(iid, str(entry.get("url", "")))[1]
            except (httpx.HTTPError, ValueError):
                return ""
        return ""

    async def live_process_start(self, url: str) -> float | None:
        """The engine's ``process_start_time_seconds``; None while it does not answer."""
        if not url:
            return None
        return (await read_process_start(self.http, url)).start

    @activity.defn(name="probe_process")
    async def probe_process(self, target: EngineTarget) -> ProcessProbe:
        """Which process does the engine run now? (Before a launch: skip it when already newer.)"""
        url = await self.engine_url(target.iid, target.url, target.supervisor)
        live = await heartbeating(self.live_process_start(url))
        return ProcessProbe(iid=target.iid, url=url, process_start=live)

    @activity.defn(name="wait_new_process")
    async def wait_new_process(self, target: EngineTarget) -> NewProcess:
        """Poll-by-retry: succeeds once the engine serves a process newer than the drain record."""
        return await heartbeating(self._new_process(target))

    async def _new_process(self, target: EngineTarget) -> NewProcess:
        url = await self.engine_url(target.iid, target.url, target.supervisor)
        live = await self.live_process_start(url)
        if live is None:
            raise errors.not_ready_yet(f"{target.iid}: process start unreadable at {url or '(no url)'}")
        if not newer_process(live, target.old_process_start):
            raise errors.not_ready_yet(f"{target.iid} still runs the drained process (started {iso(live)})")
        activity.logger.info("%s runs a new process (started %s)", target.iid, iso(live))
        return NewProcess(iid=target.iid, process_start=live)

    # -- restart --------------------------------------------------------------------------------

    @activity.defn(name="restart_engine")
    async def restart_engine(self, target: EngineTarget) -> RestartOutcome:
        checked(target.iid, target.url)
        sup = target.supervisor
        if sup.backend == "manual":
            return RestartOutcome(
                iid=target.iid,
                restarted=False,
                note=f"manual backend: restart {target.iid} yourself; waiting for a newer process start",
            )
        if sup.backend == "local":
            await self._report_launch(target, f"supervisor restart {target.iid}")
            return await self._restart_local(target)
        return await self._restart_command(target)

    async def _report_launch(self, target: EngineTarget, what: str) -> None:
        """Durable record of the launch before anything runs: a signal to the workflow (in its
        history once this returns). Fails retryably (nothing launched) when Temporal is unreachable."""
        if target.launch <= 0:
            return  # a workflow from before exactly-once launches
        info = activity.info()
        if not info.workflow_id:
            raise ApplicationError(
                "restart_engine runs only inside a workflow", type=errors.LAUNCH_NOT_RECORDED
            )
        report = LaunchReport(iid=target.iid, launch=target.launch, at=time.time(), what=what)
        try:
            handle = activity.client().get_workflow_handle(info.workflow_id, run_id=info.workflow_run_id)
            await handle.signal("launch_started", report, rpc_timeout=timedelta(seconds=10))
        except (RPCError, RuntimeError) as exc:
            raise ApplicationError(
                f"could not record the launch of {target.iid} ({exc}); nothing was launched",
                type=errors.LAUNCH_NOT_RECORDED,
            ) from exc

    async def _restart_local(self, target: EngineTarget) -> RestartOutcome:
        sup = target.supervisor
        url = f"{sup.url}/engines/{target.iid}/restart"
        try:
            r = await heartbeating(
                self.http.post(url, json={"if_process_start": target.old_process_start}, timeout=120.0)
            )
        except httpx.HTTPError as exc:
            raise ApplicationError(
                f"{url}: {type(exc).__name__}", type=errors.SUPERVISOR_UNAVAILABLE
            ) from exc
        if r.status_code == 404:
            raise ApplicationError(
                f"supervisor does not know {target.iid}", type=errors.ENGINE_NOT_FOUND, non_retryable=True
            )
        if r.status_code != 200:
            raise ApplicationError(
                f"{url}: HTTP {r.status_code} {r.text[:200]}", type=errors.SUPERVISOR_UNAVAILABLE
            )
        body = r.json()
        restarted = bool(body.get("restarted"))
        note = (
            "restarted by the supervisor"
            if restarted
            else "not restarted: the engine already runs another process"
        )
        activity.logger.info("%s %s", target.iid, note)
        return RestartOutcome(
            iid=target.iid,
            restarted=restarted,
            note=note,
            old_pid=body.get("old_pid"),
            new_pid=body.get("new_pid"),
            new_process_start=body.get("new_process_start"),
        )

    def template(self, sup: SupervisorRef) -> tuple[str, CommandTemplate]:
        try:
            return resolve_template(self.settings.current(), sup)
        except (Refused, WorkerConfigError) as exc:
            raise errors.worker_refused(str(exc)) from None

    async def run_template(self, name: str, template: CommandTemplate, iid: str, url: str) -> str:
        """Run one named template of the worker's configuration for an engine (no shell unless the
        template says so; heartbeats while it runs). Returns the command line; a non-zero exit, a
        timeout or a program that cannot start is a non-retryable ``RestartCommandFailed``. For
        other templates than ``restart`` (e.g. ``rollback``) resolve them with
        ``resolve_template(settings.current(), sup, name=...)``."""
        iid, url = checked(iid, url)
        argv = command_argv(template, iid, url)
        command = f"{name}: {shlex.join(argv)}"
        activity.heartbeat({"command_issued": True, "command": command})
        # Its own session: a worker that dies mid-command does not take the restart down with it.
        # Output goes to a temporary file, not a pipe: a daemon the command starts may keep a pipe
        # open forever, and it is the command's exit that counts.
        with tempfile.TemporaryFile() as log:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                    env=command_env(template, iid, url, self.env),
                )
            except OSError as exc:
                raise ApplicationError(
                    f"{command!r} could not start: {exc.strerror or exc}",
                    type=errors.RESTART_COMMAND_FAILED,
                    non_retryable=True,
                ) from None
            try:
                async with asyncio.timeout(template.timeout_s):
                    while proc.returncode is None:
                        try:
                            await asyncio.wait_for(proc.wait(), timeout=1.0)
                        except TimeoutError:
                            activity.heartbeat({"command_issued": True, "command": command})
            except TimeoutError:
                proc.kill()
                await proc.wait()
                raise ApplicationError(
                    f"{command!r} timed out after {template.timeout_s}s",
                    type=errors.RESTART_COMMAND_FAILED,
                    non_retryable=True,
                ) from None
            log.seek(max(0, log.seek(0, 2) - 500))
            out = log.read()
        if proc.returncode != 0:
            tail = (out or b"").decode(errors="replace")[-500:]
            raise ApplicationError(
                f"{command!r} exited {proc.returncode}: {tail}",
                type=errors.RESTART_COMMAND_FAILED,
                non_retryable=True,
            )
        return command

    async def _restart_command(self, target: EngineTarget) -> RestartOutcome:
        sup = target.supervisor
        name, template = self.template(sup)
        url = await self.engine_url(target.iid, target.url, sup)
        details = activity.info().heartbeat_details
        issued = bool(details and isinstance(details[0], dict) and details[0].get("command_issued"))
        live = await self.live_process_start(url)
        if live is not None and not same_process(live, target.old_process_start):
            return RestartOutcome(iid=target.iid, restarted=False, note="engine already runs another process")
        if live is None and issued:
            raise errors.not_ready_yet(f"{target.iid}: restart command issued, engine not answering yet")
        command = f"{name}: {shlex.join(command_argv(template, target.iid, url))}"
        await self._report_launch(target, command)
        await self.run_template(name, template, target.iid, url)
        return RestartOutcome(iid=target.iid, restarted=True, note=f"ran {command}")

    @activity.defn(name="rollback_engine")
    async def rollback_engine(self, req: RollbackRequest) -> str:
        """Run the worker's rollback template (named by the plan; refused unless this worker has it)
        for an engine the canary analysis failed. Not guarded by a process start: the engine is held
        out of placement, and the workflow runs it with one attempt. Returns the command line."""
        checked(req.iid, req.url)
        name, template = self.template(SupervisorRef(backend="command", template=req.template))
        url = await self.engine_url(req.iid, req.url, req.supervisor)
        return await self.run_template(name, template, req.iid, url)

    # -- make an engine answer (identity capture after a 503 drain) ----------------------------

    @activity.defn(name="start_engine")
    async def start_engine(self, req: StartEngineRequest) -> str:
        checked(req.iid, "")
        sup = req.supervisor
        if sup.backend != "local":
            return f"{sup.backend} backend: start {req.iid} so its identity can be captured"
        url = f"{sup.url}/engines/{req.iid}/start"
        try:
            r = await heartbeating(self.http.post(url, json={}, timeout=60.0))
        except httpx.HTTPError as exc:
            raise ApplicationError(
                f"{url}: {type(exc).__name__}", type=errors.SUPERVISOR_UNAVAILABLE
            ) from exc
        if r.status_code >= 500:
            raise ApplicationError(f"{url}: HTTP {r.status_code}", type=errors.SUPERVISOR_UNAVAILABLE)
        return f"supervisor start {req.iid}: HTTP {r.status_code}"
