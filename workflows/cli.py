"""``narwhal-restart``: start and steer restart workflows.

    narwhal-restart start --router URL [--router URL2] [--engines e0,e1] [--mode rolling|wave]
        [--max-unavailable N] [--deadline-s S] [--deadline-policy wait|fail|approve]
        [--supervisor local|command|manual] [--supervisor-url URL | --restart-command 'TEMPLATE']
        [--engine-url IID=URL ...] [--control-token-env NAME] [--fleet NAME] [--restart-timeout-s S]
        [--follow] [--wait]
    narwhal-restart status|pause|resume --fleet NAME | --workflow-id ID
    narwhal-restart list [--fleet NAME]
    narwhal-restart approve|retry|abort --fleet NAME | --workflow-id ID [--engine IID] [--reason TEXT]

One restart per fleet: the workflow id is ``narwhal-restart-<fleet>`` (``start`` derives it; there is
no ``--workflow-id`` there); a second start is refused. Exit codes: 0 ok, 1 the restart ended without
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
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import httpx
from opentelemetry import trace
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDConflictPolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from router import telemetry
from workflows.client import (
    DEFAULT_TASK_QUEUE,
    TemporalUnavailable,
    connect,
    console_main,
    default_address,
    default_namespace,
    ensure_search_attributes,
)
from workflows.models import (
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
from workflows.preflight import PreflightError, StartRequest, preflight
from workflows.steps import FLEET_KEY, STATE_KEY

RPC_TIMEOUT = timedelta(seconds=5)
SERVICE_NAME = "narwhal-restart"


def _workflow_id(args: argparse.Namespace) -> str:
    if getattr(args, "workflow_id", ""):
        return str(args.workflow_id)
    if not getattr(args, "fleet", ""):
        raise PreflightError("give --fleet NAME (or --workflow-id)")
    return fleet_workflow_id(args.fleet)


def _ui_link(args: argparse.Namespace, wid: str) -> str:
    return f"{args.ui_url.rstrip('/')}/namespaces/{args.namespace}/workflows/{wid}"


def _engine_line(e: Any) -> str:
    extra = e.error or e.note
    wait = f"  [waiting for operator: {e.waiting_for}]" if e.waiting_for else ""
    return f"  {e.iid:<8} {e.step:<24} router={e.router_state or '-':<18} {extra}{wait}".rstrip()


def _print_result(res: RestartResult) -> None:
    print(f"{res.fleet}: {res.state} ({res.mode}) — {res.message}")
    for e in res.engines.values():
        print(f"  {e.iid:<8} {e.outcome:<10} old={e.old_process_start} new={e.new_process_start} {e.error}")


def _all_restarted(res: RestartResult) -> bool:
    return res.ok and all(
        e.outcome == "restarted"
        and e.old_process_start is not None
        and e.new_process_start is not None
        and e.new_process_start > e.old_process_start
        for e in res.engines.values()
    )


async def _follow(handle: WorkflowHandle[Any, Any]) -> None:
    shown: dict[str, str] = {}
    state = ""
    while True:
        try:
            p = await handle.query("progress", result_type=RestartProgress, rpc_timeout=RPC_TIMEOUT)
            if p.state != state:
                state = p.state
                print(f"[{p.fleet}] {p.state}: {p.message}", flush=True)
            for e in p.engines.values():
                line = _engine_line(e)
                if shown.get(e.iid) != line:
                    shown[e.iid] = line
                    print(line, flush=True)
        except RPCError as exc:
            print(f"  (progress unavailable: {exc.message})", flush=True)
        desc = await handle.describe(rpc_timeout=RPC_TIMEOUT)
        if desc.status != WorkflowExecutionStatus.RUNNING:
            return
        await asyncio.sleep(1.0)


async def cmd_start(args: argparse.Namespace) -> int:
    """Validate and start; with tracing configured the whole command is one span, parent of the
    workflow's trace (StartWorkflow → RunWorkflow → activities → router → engines)."""
    tracer = trace.get_tracer(SERVICE_NAME) if telemetry.tracing_installed() else None
    if tracer is None:
        return await _start(args)
    with tracer.start_as_current_span("narwhal-restart start") as span:
        span.set_attribute("narwhal.routers", list(args.router))
        code = await _start(args)
        span.set_attribute("narwhal.exit_code", code)
        return code


async def _start(args: argparse.Namespace) -> int:
    client = await connect(args.address, args.namespace)  # first: Temporal down → one line, exit 2
    engine_urls = dict(kv.split("=", 1) for kv in args.engine_url)
    req = StartRequest(
        routers=args.router, engines=args.engines.split(",") if args.engines is not None else None,
        mode=args.mode, fleet=args.fleet or "", supervisor=args.supervisor, supervisor_url=args.supervisor_url,
        restart_command=args.restart_command, engine_urls=engine_urls, fleet_file=args.fleet_file,
        token_env=args.control_token_env,
    )  # fmt: skip
    async with httpx.AsyncClient() as http:
        if telemetry.tracing_installed():
            telemetry.instrument_httpx(http)
        pre = await preflight(http, req)
    for note in pre.notes:
        print(f"note: {note}", file=sys.stderr)
    plan = RestartPlan(
        fleet=pre.fleet, mode=pre.mode,
        router=RouterRef(routers=args.router, token_env=args.control_token_env),
        supervisor=SupervisorRef(backend=args.supervisor, url=args.supervisor_url, command=args.restart_command),
        engines=pre.engines, engine_urls=pre.engine_urls, max_unavailable=args.max_unavailable,
        deadline_s=args.deadline_s, deadline_policy=args.deadline_policy,
        timing=Timing(poll_interval_s=args.poll_interval, new_process_timeout_s=args.restart_timeout_s),
        requested_by=args.requested_by,
    )  # fmt: skip
    await ensure_search_attributes(client, args.namespace)
    wid = fleet_workflow_id(plan.fleet)  # one restart per fleet: the id is derived, never chosen
    details = (
        f"**Fleet** `{plan.fleet}` — {plan.mode} restart of {', '.join(plan.engines)}\n\n"
        f"- routers: {', '.join(args.router)}\n- supervisor: `{plan.supervisor.backend}` "
        f"{plan.supervisor.url or plan.supervisor.command}\n- drain deadline {plan.deadline_s}s, "
        f"policy `{plan.deadline_policy}`, max unavailable {plan.max_unavailable}\n"
        f"- requested by {plan.requested_by or 'unknown'}"
    )
    try:
        handle = await client.start_workflow(
            "WaveRestart" if plan.mode == "wave" else "RollingRestart",
            plan,
            id=wid,
            task_queue=args.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            result_type=RestartResult,
            search_attributes=TypedSearchAttributes(
                [SearchAttributePair(FLEET_KEY, plan.fleet), SearchAttributePair(STATE_KEY, "starting")]
            ),
            static_summary=f"{plan.mode} restart of {plan.fleet} ({len(plan.engines)} engines)",
            static_details=details,
        )
    except WorkflowAlreadyStartedError:
        print(f"refused: a restart of fleet {plan.fleet} is already running ({wid}); "
              f"see `narwhal-restart status --fleet {plan.fleet}`", file=sys.stderr)  # fmt: skip
        return 2
    print(f"started {wid} ({plan.mode}, {len(plan.engines)} engines: {', '.join(plan.engines)})")
    print(f"UI: {_ui_link(args, wid)}", flush=True)
    if args.follow:
        await _follow(handle)
    if args.wait or args.follow:
        res = await handle.result()
        _print_result(res)
        return 0 if _all_restarted(res) else 1
    return 0


async def _handle(args: argparse.Namespace) -> tuple[Client, WorkflowHandle[Any, Any]]:
    client = await connect(args.address, args.namespace)
    return client, client.get_workflow_handle(_workflow_id(args))


async def cmd_status(args: argparse.Namespace) -> int:
    _, handle = await _handle(args)
    desc = await handle.describe(rpc_timeout=RPC_TIMEOUT)
    try:
        p = await handle.query("progress", result_type=RestartProgress, rpc_timeout=RPC_TIMEOUT)
    except RPCError as exc:
        sa = {k.name: v for k, v in desc.typed_search_attributes}
        print(f"{handle.id}: {desc.status.name if desc.status else '?'} {sa} (no progress: {exc.message})")
        return 0
    if args.json:
        print(json.dumps(p.model_dump(mode="json", by_alias=True), indent=2))
        return 0
    print(f"{handle.id}: {desc.status.name if desc.status else '?'} — {p.state}: {p.message}")
    for e in p.engines.values():
        print(_engine_line(e))
    return 0


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
        print(f"{args.command} refused: {exc.cause}", file=sys.stderr)
        return 2
    print(ans.message)
    return 0


async def cmd_list(args: argparse.Namespace) -> int:
    client = await connect(args.address, args.namespace)
    query = "WorkflowType IN ('RollingRestart', 'WaveRestart')"
    if args.fleet:
        query += f" AND NarwhalFleet = '{args.fleet}'"
    async for wf in client.list_workflows(query, limit=args.limit):
        sa = {k.name: v for k, v in wf.typed_search_attributes}
        print(f"{wf.id:<48} {wf.workflow_type:<15} {wf.status.name if wf.status else '?':<11} "
              f"state={sa.get('NarwhalState', '-')} started={wf.start_time:%Y-%m-%d %H:%M:%S}")  # fmt: skip
    return 0


def _positive(value: str) -> float:
    try:
        v = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {value}")
    return v


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="narwhal-restart", description=__doc__.split("\n\n")[0])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--address", default=default_address(), help="Temporal frontend (env TEMPORAL_ADDRESS)"
    )
    common.add_argument("--namespace", default=default_namespace(), help="(env TEMPORAL_NAMESPACE)")
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
    steer.add_argument("--workflow-id", default="", help="instead of --fleet: narwhal-restart-<fleet>")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("start", parents=[common], help="validate, then start a restart workflow")
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
        "--restart-command",
        default="",
        help="command: shell template, e.g. 'systemctl restart vllm@{iid}' ({iid} and {url} substituted)",
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
        help="environment variable holding the router's control bearer token",
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
    s.add_argument("--follow", action="store_true", help="print live per-engine progress and the UI link")
    s.add_argument(
        "--wait",
        action="store_true",
        help="block until the workflow ends; exit 0 only if every engine was restarted and readmitted",
    )
    st = sub.add_parser("status", parents=[steer])
    st.add_argument("--json", action="store_true")
    for name in ("pause", "resume"):
        sub.add_parser(name, parents=[steer])
    for name in ("approve", "retry", "abort"):
        u = sub.add_parser(name, parents=[steer])
        u.add_argument("--engine", default="")
        u.add_argument("--reason", default="")
    ls = sub.add_parser("list", parents=[common])
    ls.add_argument("--limit", type=int, default=50)
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
