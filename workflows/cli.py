"""``narwhal-restart``: start and steer restart workflows.

    narwhal-restart start --router URL [--router URL2] [--engines e0,e1] [--mode rolling|wave]
        [--max-unavailable N] [--deadline-s S] [--deadline-policy wait|fail|approve]
        [--supervisor local|command|manual] [--supervisor-url URL | --restart-template NAME]
        [--worker-router NAME] [--fleet-file PATH] [--engine-url IID=URL ...] [--control-token-env NAME]
        [--fleet NAME]
        [--restart-timeout-s S] [--pause-after N] [--analysis FILE [--rollback-template NAME]]
        [--follow] [--wait]
    narwhal-restart status|pause|resume [--fleet NAME | --workflow-id ID]
    narwhal-restart list [--fleet NAME]
    narwhal-restart approve|retry|abort [--fleet NAME | --workflow-id ID] [--engine IID] [--reason TEXT]
    narwhal-restart schedule create (--cron EXPR | --every 6h) [--name NAME] START-FLAGS
    narwhal-restart schedule list | pause|unpause|delete --name NAME

One restart per fleet: the workflow id is ``narwhal-restart-<fleet>`` (``start`` derives it; there is
no ``--workflow-id`` there); a second start is refused. Without ``--fleet``/``--workflow-id`` the
steering commands address the only running restart. Exit codes: 0 ok, 1 the restart ended without
restarting every engine, 2 refused / invalid / Temporal unreachable (one line naming the address).
With ``OTEL_EXPORTER_OTLP_ENDPOINT`` set, ``start`` is one span, parent of the workflow's trace.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from temporalio.client import (
    Client,
    WorkflowExecution,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDConflictPolicy
from temporalio.exceptions import FailureError, WorkflowAlreadyStartedError
from temporalio.service import RPCError

from narwhal_models.restart import (
    EngineProgress,
    OperatorAnswer,
    OperatorRequest,
    RestartPlan,
    RestartProgress,
    RestartResult,
    RouterRef,
    SupervisorRef,
    Timing,
    fleet_workflow_id,
)
from router import telemetry
from workflows.analysis_file import policy_summary, read_policy
from workflows.analysis_text import verdict_line
from workflows.client import (
    DEFAULT_TASK_QUEUE,
    TemporalUnavailable,
    add_connection_flags,
    connect,
    console_main,
    default_address,
    default_namespace,
    ensure_search_attributes,
    security,
)
from workflows.details import (
    duration,
    engine_line,
    event_line,
    outcome_words,
    phase_durations,
    progress_line,
    utc_datetime,
    utc_time,
)
from workflows.outcome import failure_line, failure_result
from workflows.preflight import PreflightError, StartRequest, preflight
from workflows.schedules import add_schedule_parser, cmd_schedule
from workflows.steps import FLEET_KEY, STATE_KEY

RPC_TIMEOUT = timedelta(seconds=5)
SERVICE_NAME = "narwhal-restart"


def _ui_link(args: argparse.Namespace, wid: str) -> str:
    return f"{args.ui_url.rstrip('/')}/namespaces/{args.namespace}/workflows/{wid}"


def _engine_line(e: EngineProgress, now: float | None = None) -> str:
    """The UI's engine line as plain text: ``  e0 done · router active · drained in 3.2 s …``."""
    return "  " + engine_line(e, now).removeprefix("- ").replace("**", "")


def _print_result(res: RestartResult) -> None:
    took = f" in {duration(res.finished_at - res.started_at)}" if res.started_at and res.finished_at else ""
    print(f"{res.fleet}: {res.state} ({res.mode}){took} — {res.message}")
    for e in res.engines.values():
        print(
            f"  {e.iid:<8} {outcome_words(e):<14} process started {utc_time(e.old_process_start)} → "
            f"{utc_time(e.new_process_start)}  {', '.join(phase_durations(e))}  {e.error}".rstrip()
        )


def _all_restarted(res: RestartResult) -> bool:
    return res.ok and all(
        e.outcome == "restarted"
        and e.old_process_start is not None
        and e.new_process_start is not None
        and e.new_process_start > e.old_process_start
        for e in res.engines.values()
    )


async def _follow(handle: WorkflowHandle[Any, Any]) -> None:
    """Live progress: the header line on change, each engine's line on change, every operator
    event (paused, resumed, approved, retried, aborted, waiting for operator) once."""
    shown: dict[str, str] = {}
    header = ""
    events_seen: set[tuple[float, str, str, str]] = set()
    while True:
        try:
            p = await handle.query("progress", result_type=RestartProgress, rpc_timeout=RPC_TIMEOUT)
            line = f"[{p.fleet}] {p.state.replace('_', ' ')}: {p.message}"
            if line != header:
                header = line
                print(line, flush=True)
            for ev in p.events:
                key = (ev.at, ev.kind, ev.iid, ev.by)
                if key not in events_seen:
                    events_seen.add(key)
                    print(f"  ** {event_line(ev)}", flush=True)
            for e in p.engines.values():
                text = _engine_line(e)
                if shown.get(e.iid) != text:
                    shown[e.iid] = text
                    print(text, flush=True)
        except RPCError as exc:
            print(f"  (progress unavailable: {exc.message})", flush=True)
        desc = await handle.describe(rpc_timeout=RPC_TIMEOUT)
        if desc.status != WorkflowExecutionStatus.RUNNING:
            return
        await asyncio.sleep(1.0)


async def cmd_start(args: argparse.Namespace) -> int:
    """Validate and start; with tracing configured the whole command is one span, parent of the
    workflow's trace (StartWorkflow → RunWorkflow → activities → router → engines)."""
    if not telemetry.tracing_installed():
        return await _start(args)
    from opentelemetry import trace  # loaded only when spans are exported

    tracer = trace.get_tracer(SERVICE_NAME)
    with tracer.start_as_current_span("narwhal-restart start") as span:
        span.set_attribute("narwhal.routers", list(args.router))
        code = await _start(args)
        span.set_attribute("narwhal.exit_code", code)
        return code


async def build_plan(args: argparse.Namespace) -> tuple[RestartPlan, str]:
    """Preflight (nothing is drained on refusal) → the plan and the UI's static details; shared by
    ``start`` and ``schedule create``."""
    if args.restart_command:
        raise PreflightError(
            "--restart-command is not accepted: commands are the worker's configuration (narwhal-worker "
            "--config / --template NAME=COMMAND); name one with --restart-template NAME"
        )
    engine_urls = dict(kv.split("=", 1) for kv in args.engine_url)
    req = StartRequest(
        routers=args.router, engines=args.engines.split(",") if args.engines is not None else None,
        mode=args.mode, fleet=args.fleet or "", supervisor=args.supervisor, supervisor_url=args.supervisor_url,
        restart_template=args.restart_template, engine_urls=engine_urls, fleet_file=args.fleet_file,
        token_env=args.control_token_env,
    )  # fmt: skip
    async with httpx.AsyncClient() as http:
        if telemetry.tracing_installed():
            telemetry.instrument_httpx(http)
        pre = await preflight(http, req)
    for note in pre.notes:
        print(f"note: {note}", file=sys.stderr)
    if args.pause_after and pre.mode == "wave":
        raise PreflightError("--pause-after is a canary gate between engines: a whole-wave restart has none")
    analysis = read_policy(args.analysis) if args.analysis else None
    if analysis is not None and pre.mode == "wave":
        raise PreflightError(
            "--analysis judges restarted engines against the rest: a whole-wave restart has no baseline"
        )
    if args.rollback_template and analysis is None:
        raise PreflightError(
            "--rollback-template rolls back an engine the canary analysis failed: give --analysis"
        )
    if args.pause_after >= len(pre.engines):
        raise PreflightError(
            f"--pause-after {args.pause_after} leaves no engine after the gate ({len(pre.engines)} engines)"
        )
    plan = RestartPlan(
        fleet=pre.fleet, mode=pre.mode,
        router=RouterRef(name=args.worker_router, routers=args.router),  # the worker owns the token
        supervisor=SupervisorRef(
            backend=args.supervisor, url=args.supervisor_url,
            template=args.restart_template if args.supervisor == "command" else "",
        ),
        engines=pre.engines, engine_urls=pre.engine_urls, max_unavailable=args.max_unavailable,
        deadline_s=args.deadline_s, deadline_policy=args.deadline_policy,
        timing=Timing(poll_interval_s=args.poll_interval, new_process_timeout_s=args.restart_timeout_s),
        requested_by=args.requested_by, pause_after=args.pause_after, analysis=analysis,
        rollback_template=args.rollback_template,
    )  # fmt: skip
    gate = (
        f"\n- canary gate: waits for the operator after {plan.pause_after} engine(s)"
        if plan.pause_after
        else ""
    )
    details = (
        f"**Fleet** `{plan.fleet}` — {plan.mode} restart of {', '.join(plan.engines)}\n\n"
        f"- routers: {', '.join(args.router)}\n- supervisor: `{plan.supervisor.backend}` "
        f"{plan.supervisor.url or plan.supervisor.template}\n- drain deadline {plan.deadline_s:g} s, "
        f"policy `{plan.deadline_policy}`, max unavailable {plan.max_unavailable}{gate}\n"
        f"- requested by {plan.requested_by or 'unknown'}"
        + (f"\n- canary analysis: {policy_summary(analysis)}" if analysis is not None else "")
        + (f"\n- rollback template: `{plan.rollback_template}`" if plan.rollback_template else "")
    )
    return plan, details


def workflow_type(plan: RestartPlan) -> str:
    return "WaveRestart" if plan.mode == "wave" else "RollingRestart"


def summary(plan: RestartPlan) -> str:
    return f"{plan.mode} restart of {plan.fleet} ({len(plan.engines)} engines)"


async def _start(args: argparse.Namespace) -> int:
    client = await connect(
        args.address, args.namespace, security(args)
    )  # first: Temporal down → one line, exit 2
    plan, details = await build_plan(args)
    await ensure_search_attributes(client, args.namespace)
    wid = fleet_workflow_id(plan.fleet)  # one restart per fleet: the id is derived, never chosen
    try:
        handle = await client.start_workflow(
            workflow_type(plan),
            plan,
            id=wid,
            task_queue=args.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            result_type=RestartResult,
            search_attributes=TypedSearchAttributes(
                [SearchAttributePair(FLEET_KEY, plan.fleet), SearchAttributePair(STATE_KEY, "starting")]
            ),
            static_summary=summary(plan),
            static_details=details,
        )
    except WorkflowAlreadyStartedError:
        print(f"refused: a restart of fleet {plan.fleet} is already running ({wid}); "
              f"see `narwhal-restart status --fleet {plan.fleet}`", file=sys.stderr)  # fmt: skip
        return 2
    desc = await handle.describe(rpc_timeout=RPC_TIMEOUT)
    print(
        f"started {wid} run {desc.run_id} ({plan.mode}, {len(plan.engines)} engines: {', '.join(plan.engines)})"
    )
    print(f"UI: {_ui_link(args, wid)}", flush=True)
    refused = await _until_owner(handle)
    if refused:
        print(refused, file=sys.stderr)
        return 2
    if args.follow:
        await _follow(handle)
    if args.wait or args.follow:
        return await _report_end(handle)
    return 0


async def _until_owner(handle: WorkflowHandle[Any, Any], within: float = 60.0) -> str:
    """Wait until the run passed its preflight and holds the fleet lock; "" then (or when no worker
    answers in time: the run waits for one), else the run's one-line refusal / failure."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while loop.time() < deadline:
        desc = await handle.describe(rpc_timeout=RPC_TIMEOUT)
        if desc.status != WorkflowExecutionStatus.RUNNING:
            try:
                await handle.result()
            except WorkflowFailureError as exc:
                return failure_line(exc)
            return ""
        try:
            p = await handle.query("progress", result_type=RestartProgress, rpc_timeout=RPC_TIMEOUT)
        except RPCError:
            p = None
        if p is not None and p.fleet_lock:
            return ""  # preflight passed, the fleet is this run's (a refused run goes on to close)
        await asyncio.sleep(0.2)
    print(
        f"note: no worker has taken {handle.id} yet; it starts when one polls the task queue", file=sys.stderr
    )
    return ""


async def _report_end(handle: WorkflowHandle[Any, Any]) -> int:
    """The outcome in a few plain lines; exit 0 only when every engine was restarted."""
    try:
        res = await handle.result()
    except WorkflowFailureError as exc:
        carried = failure_result(exc)
        if carried is None:
            print(f"{handle.id}: {failure_line(exc)}", file=sys.stderr)
            return 1
        _print_result(carried)
        return 2 if carried.message.startswith("refused:") else 1
    _print_result(res)
    return 0 if _all_restarted(res) else 1


RESTART_TYPES = "WorkflowType IN ('RollingRestart', 'WaveRestart')"


async def resolve_workflow_id(client: Client, args: argparse.Namespace) -> str:
    """``--workflow-id``, else the running restart of ``--fleet``, else the only running restart.
    Several running (or none) without ``--fleet``: refuse and name the candidates."""
    if getattr(args, "workflow_id", ""):
        return str(args.workflow_id)
    fleet = getattr(args, "fleet", "")
    query = f"{RESTART_TYPES} AND ExecutionStatus = 'Running'"
    if fleet:
        query += f" AND NarwhalFleet = '{fleet}'"
    running = [wf async for wf in client.list_workflows(query, limit=20)]
    if len(running) == 1:
        return running[0].id
    if fleet and not running:
        return fleet_workflow_id(fleet)  # the last (closed) restart started by `start`
    if running:
        names = ", ".join(f"{wf.id} (fleet {_fleet_of(wf)})" for wf in running)
        raise PreflightError(
            f"{len(running)} restarts are running: {names}; pass --fleet NAME or --workflow-id ID"
        )
    recent = [wf async for wf in client.list_workflows(RESTART_TYPES, limit=5)]
    hint = ("; recent: " + ", ".join(f"{_fleet_of(wf)} ({_status(wf)})" for wf in recent)) if recent else ""
    raise PreflightError(f"no restart is running{hint}; pass --fleet NAME to see a finished one")


def _fleet_of(wf: WorkflowExecution) -> str:
    return str({k.name: v for k, v in wf.typed_search_attributes}.get("NarwhalFleet", "?"))


def _status(wf: WorkflowExecution) -> str:
    return wf.status.name.lower() if wf.status else "?"


async def _handle(args: argparse.Namespace) -> tuple[Client, WorkflowHandle[Any, Any]]:
    client = await connect(args.address, args.namespace, security(args))
    return client, client.get_workflow_handle(await resolve_workflow_id(client, args))


async def cmd_status(args: argparse.Namespace) -> int:
    _, handle = await _handle(args)
    desc = await handle.describe(rpc_timeout=RPC_TIMEOUT)
    try:
        p = await handle.query("progress", result_type=RestartProgress, rpc_timeout=RPC_TIMEOUT)
    except RPCError as exc:
        sa = {k.name: v for k, v in desc.typed_search_attributes}
        status = desc.status.name.lower() if desc.status else "?"
        print(f"{handle.id} (run {desc.run_id}): {status} — {sa.get('NarwhalState', '?')} "
              f"(progress unavailable: {exc.message})")  # fmt: skip
        return 1 if desc.status in ENDED_BADLY else 0
    if args.json:
        print(json.dumps(p.model_dump(mode="json", by_alias=True), indent=2))
        return 0
    now = (p.updated_at or 0.0) if desc.status != WorkflowExecutionStatus.RUNNING else time.time()
    print(f"{handle.id} (run {desc.run_id}): {desc.status.name.lower() if desc.status else '?'} — "
          f"{p.state.replace('_', ' ')}: {p.message or '(no message)'}")  # fmt: skip
    if p.fleet_lock:
        print(f"  holds the fleet lock {p.fleet_lock}")
    print(f"  {progress_line(p.engines.values(), p.started_at, now)} (started {utc_datetime(p.started_at)})")
    for e in p.engines.values():
        print(_engine_line(e, now))
    for ev in p.events[-5:]:
        print(f"  ** {event_line(ev)}")
    for s in p.analysis[-6:]:
        print(f"  analysis {verdict_line(s)}")
    return 1 if desc.status in ENDED_BADLY else 0


ENDED_BADLY = (
    WorkflowExecutionStatus.FAILED,
    WorkflowExecutionStatus.CANCELED,
    WorkflowExecutionStatus.TERMINATED,
    WorkflowExecutionStatus.TIMED_OUT,
)


async def cmd_signal(args: argparse.Namespace) -> int:
    _, handle = await _handle(args)
    await handle.signal(args.command, rpc_timeout=RPC_TIMEOUT)
    print(f"{args.command} sent to {handle.id}")
    return 0


async def cmd_update(args: argparse.Namespace) -> int:
    _, handle = await _handle(args)
    req = OperatorRequest(iid=args.engine or "", by=args.requested_by, reason=args.reason)
    try:
        ans = await handle.execute_update(
            args.command, req, result_type=OperatorAnswer, rpc_timeout=timedelta(seconds=90)
        )
    except WorkflowUpdateFailedError as exc:
        cause = exc.cause
        why = cause.message if isinstance(cause, FailureError) and cause.message else str(cause)
        print(f"{args.command} refused: {why}", file=sys.stderr)
        return 2
    print(ans.message)
    return 0


async def cmd_list(args: argparse.Namespace) -> int:
    client = await connect(args.address, args.namespace, security(args))
    query = RESTART_TYPES
    if args.fleet:
        query += f" AND NarwhalFleet = '{args.fleet}'"
    rows = [
        (wf.id, wf.run_id, wf.workflow_type.removesuffix("Restart").lower(), _status(wf),
         str({k.name: v for k, v in wf.typed_search_attributes}.get("NarwhalState", "-")),
         _when(wf.start_time), _when(wf.close_time))
        async for wf in client.list_workflows(query, limit=args.limit)
    ]  # fmt: skip
    if not rows:
        print("no restart workflows" + (f" for fleet {args.fleet}" if args.fleet else ""))
        return 0
    head = ("WORKFLOW ID", "RUN ID", "MODE", "STATUS", "STATE", "STARTED (UTC)", "ENDED (UTC)")
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return 0


def _when(t: datetime | None) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if t is not None else "-"


def _positive(value: str) -> float:
    try:
        v = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {value}")
    return v


def add_start_flags(s: argparse.ArgumentParser) -> None:
    """The flags of ``start``, shared with ``schedule create``."""
    s.add_argument("--router", action="append", required=True, help="router URL (repeat for the HA pair)")
    s.add_argument("--engines", default=None, help="comma-separated engine ids (default: all)")
    s.add_argument(
        "--mode",
        choices=["rolling", "wave"],
        default=None,
        help="default from the router's engine_restart_policy (whole_wave -> wave)",
    )
    s.add_argument(
        "--max-unavailable",
        type=int,
        default=1,
        help="rolling: engines restarted at once; never the last eligible engine of a role (default 1)",
    )
    s.add_argument("--deadline-s", type=float, default=300.0, help="drain deadline in seconds (default 300)")
    s.add_argument(
        "--deadline-policy",
        choices=["wait", "fail", "approve"],
        default="wait",
        help="past the drain deadline: keep waiting, fail, or proceed only on `approve` (default wait)",
    )
    s.add_argument(
        "--supervisor",
        choices=["local", "command", "manual"],
        default="local",
        help="restart backend: narwhal-supervisor API, a shell template, or the operator (default local)",
    )
    s.add_argument("--supervisor-url", default="", help="local: the narwhal-supervisor URL")
    s.add_argument(
        "--restart-template",
        default="restart",
        metavar="NAME",
        help="command: the name of a command template in the worker's configuration (default restart)",
    )
    s.add_argument("--restart-command", default="", help=argparse.SUPPRESS)  # refused with a pointer
    s.add_argument(
        "--worker-router",
        default="",
        metavar="NAME",
        help="the worker's name for these routers (its configuration); default: the worker matches the "
        "--router URLs against the routers it knows",
    )
    s.add_argument(
        "--engine-url",
        action="append",
        default=[],
        metavar="IID=URL",
        help="engine URL used to watch its process start and for {url}; overrides every other source "
        "(repeatable)",
    )
    s.add_argument(
        "--fleet-file",
        default="",
        metavar="PATH",
        help="take engine URLs from this fleet file's engines list instead of the router's "
        "GET /narwhal/targets (default: ask the router)",
    )
    s.add_argument(
        "--control-token-env",
        default="",
        metavar="NAME",
        help="environment variable holding the router's control bearer token (used by this command's "
        "checks only; the worker sends the token of its own configuration)",
    )
    s.add_argument("--task-queue", default=DEFAULT_TASK_QUEUE, help="worker task queue (default %(default)s)")
    s.add_argument(
        "--poll-interval",
        type=float,
        default=1.0,
        help="seconds between router polls while waiting (default 1)",
    )
    s.add_argument(
        "--restart-timeout-s",
        type=_positive,
        default=600.0,
        help="how long to wait for an engine to serve a newer process after its restart; past it the "
        "engine is blocked and the restart waits for `retry` (after repair) or `abort` (default 600)",
    )
    s.add_argument(
        "--analysis",
        default="",
        metavar="FILE",
        help="canary analysis (rolling): after each readmission judge the restarted engine's live traffic "
        "against the engines not restarted yet, with the policy in FILE (JSON or YAML; workflows/analysis.py); "
        "a failing engine is held and the rollout stops",
    )
    s.add_argument(
        "--rollback-template",
        default="",
        metavar="NAME",
        help="with --analysis: the name of a command template in the worker's configuration that puts an "
        "engine the analysis failed back on its previous build; the worker runs it (refused before anything "
        "is drained when it lacks it), waits for a newer process and readmits the engine through the normal "
        "checks. The run still fails (analysis_failed) with the evidence (default: the engine stays held)",
    )
    s.add_argument(
        "--pause-after",
        type=int,
        default=0,
        metavar="N",
        help="canary gate (rolling): after the first N engines are back in service, wait for the operator's "
        "`resume` or `approve` before the rest (default 0: no gate)",
    )


DESCRIPTIONS = {
    "start": "Validate the fleet (routers, engines, roles, engine addresses), then start one restart "
    "workflow for it. Engine addresses come from the router's GET /narwhal/targets (or --fleet-file), "
    "--engine-url overrides.",
    "status": "Progress of a restart: without --fleet/--workflow-id, the only running restart (or the "
    "candidates when several run).",
    "pause": "Stop starting engines (takes effect between engines; a whole wave only before its drain).",
    "resume": "Continue a paused restart; also opens a canary gate (--pause-after).",
    "approve": "Approve what waits: an engine past its drain deadline (policy approve) or the canary gate.",
    "retry": "Retry a blocked engine (refused readmission, no newer process within the restart timeout).",
    "abort": "Stop the rollout; engines waiting for an operator end held out of placement.",
    "list": "Restart workflows with run id, status, state, start and end times (UTC).",
    "schedule": "Restart waves on a Temporal Schedule (cron or interval, overlapping runs skipped).",
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="narwhal-restart",
        description=__doc__.split("\n\n")[0],
        epilog="`narwhal-restart COMMAND --help` describes each command.",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--address", default=default_address(), help="Temporal frontend (env TEMPORAL_ADDRESS)"
    )
    common.add_argument("--namespace", default=default_namespace(), help="(env TEMPORAL_NAMESPACE)")
    add_connection_flags(common)
    common.add_argument(
        "--fleet",
        default="",
        help="fleet name (default for start: derived from the router's model and engines)",
    )
    common.add_argument(
        "--requested-by", default=os.environ.get("USER") or getpass.getuser(), help="who asked (memo, UI)"
    )
    common.add_argument(
        "--ui-url",
        default=os.environ.get("TEMPORAL_UI_URL", "http://localhost:8233"),
        help="Temporal UI base URL for printed links (env TEMPORAL_UI_URL)",
    )
    # --workflow-id only where an existing workflow is addressed; `start` derives it from the fleet.
    steer = argparse.ArgumentParser(add_help=False, parents=[common])
    steer.add_argument("--workflow-id", default="", help="instead of --fleet: the workflow id")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, parents: list[argparse.ArgumentParser], short: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=parents, help=short, description=DESCRIPTIONS[name])

    s = command("start", [common], "validate, then start a restart workflow")
    add_start_flags(s)
    s.add_argument("--follow", action="store_true", help="print live per-engine progress and operator events")
    s.add_argument(
        "--wait",
        action="store_true",
        help="block until the workflow ends; exit 0 only if every engine was restarted and readmitted",
    )
    st = command("status", [steer], "show a restart's progress")
    st.add_argument("--json", action="store_true", help="the narwhal.restart-progress document")
    command("pause", [steer], "pause between engines")
    command("resume", [steer], "resume (also opens the canary gate)")
    for name, short in (("approve", "approve a waiting engine or the canary gate"),
                        ("retry", "retry a blocked engine"), ("abort", "abort the rollout")):  # fmt: skip
        u = command(name, [steer], short)
        u.add_argument("--engine", default="", help="the engine (default: the one that waits)")
        u.add_argument("--reason", default="", help="recorded with the decision")
    ls = command("list", [common], "list restart workflows")
    ls.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    add_schedule_parser(command("schedule", [], "manage scheduled restart waves"), common, add_start_flags)
    return p


async def run(args: argparse.Namespace) -> int:
    if args.command == "start":
        return await cmd_start(args)
    if args.command == "status":
        return await cmd_status(args)
    if args.command in ("pause", "resume"):
        return await cmd_signal(args)
    if args.command in ("approve", "retry", "abort"):
        return await cmd_update(args)
    if args.command == "schedule":
        return await cmd_schedule(args, build_plan)
    return await cmd_list(args)


def _main(argv: Sequence[str] | None) -> int:
    args = parser().parse_args(argv)
    telemetry.setup_tracing(SERVICE_NAME)  # no-op unless OTEL_EXPORTER_OTLP_ENDPOINT is set
    try:
        return asyncio.run(run(args))
    except PreflightError as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 2
    except TemporalUnavailable as exc:
        print(f"narwhal-restart: {exc}", file=sys.stderr)
        return 2
    except RPCError as exc:
        print(f"temporal: {exc.message}", file=sys.stderr)
        return 2
    finally:
        telemetry.shutdown_telemetry()  # flush the CLI span before os._exit


def main(argv: Sequence[str] | None = None) -> int:
    return console_main(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
