"""``narwhal-up``: the whole Narwhal stack on this machine, a steady client load and a restart.

Starts (each a child process in its own process group, logs in ``<state-dir>/logs``): a Temporal
dev server (persistent, UI), the local supervisor with N simulated engines (half prefill, half
decode), a primary and a warm-standby router on one lease file (``--etcd``: on a local etcd
member), and the restart worker. Then it
sends completions (streamed and buffered) to whichever router is ready, runs a rolling (or wave)
restart through ``narwhal-restart start``, follows it, and prints a summary. With ``--failover`` it
also SIGKILLs the primary router (by PID) once the restart's second engine has begun, so the standby
takes the lease over (epoch +1) while the workflow and the load follow the new holder; afterwards
the old primary is started again as a standby of the new holder.

Exit codes: 0 every engine restarted and no client request failed (with ``--failover``, requests
cut by the injected router kill are reported but not counted as failures); 1 otherwise; 2 bad flags, busy
ports or a state directory in use; 3 a component failed to start; 130/143 interrupted before the
summary. SIGINT/SIGTERM stop everything narwhal-up started, by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlparse

import httpx

from fleet.procs import ChildExited
from fleet.up.load import LoadGenerator, LoadStats
from fleet.up.ports import OFFSETS, plan_ports, port_problems
from fleet.up.stack import MODEL, Stack, StartupError, Timings, roles, rolling_problem, together
from fleet.up.summary import EngineChange, Failover, Summary, Takeover
from fleet.up.watch import RPC_TIMEOUT, HAWatcher, failover_trigger, progress_lines

STOP_ORDER = ("restart-cli", "worker", "router-standby", "router-primary", "supervisor", "temporal", "etcd")


def say(msg: str) -> None:
    print(f"narwhal-up: {msg}", flush=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="narwhal-up", description=__doc__.split("\n\n")[0])
    p.add_argument("--engines", type=int, default=4, help="simulated engines (half prefill, half decode)")
    p.add_argument("--prefill", type=int, default=None, help="prefill engines (default: half); rest decode")
    p.add_argument("--restart", choices=["rolling", "wave", "none"], default="rolling")
    p.add_argument("--state-dir", default="runs/up", help="persistence, configs, logs, pids.json")
    p.add_argument("--keep-running", action="store_true", help="stay up after the summary until Ctrl-C")
    p.add_argument("--fast", action="store_true", help="tiny engine latencies and short HA/poll timings")
    p.add_argument("--load-concurrency", type=int, default=4, help="concurrent client requests")
    p.add_argument("--fleet-name", default="narwhal-up", help="fleet name (workflow narwhal-restart-<name>)")
    p.add_argument(
        "--failover",
        action="store_true",
        help="during the restart (once the second engine's step has begun) SIGKILL the primary router "
        "so the standby takes over; requests in flight on it that the kill cuts are reported as "
        "'cut by the injected router kill' and are NOT counted as failures for the exit code",
    )
    p.add_argument(
        "--etcd",
        action="store_true",
        help="start a local etcd member (Debian: etcd-server) and run the router pair on the etcd "
        "lease backend instead of a lease file",
    )
    p.add_argument(
        "--replicas",
        type=int,
        default=0,
        metavar="N",
        help="with --etcd: N active-active router replicas (all serve, the lease holder controls) "
        "instead of the primary/standby pair; the load is spread over them",
    )
    p.add_argument(
        "--bad-build",
        choices=["failing", "slow"],
        default=None,
        help="roll a bad engine build (rolling restart with canary analysis, docs/canary-analysis.md): "
        "'failing' fails a fifth of its requests, 'slow' triples its time to first token; the analysis "
        "halts the rollout at the first engine, holds it, and the fleet keeps serving",
    )
    p.add_argument("--restart-timeout", type=float, default=600.0, help="seconds to wait for the restart")
    p.add_argument("--traces-url", default=os.environ.get("NARWHAL_TRACES_URL", ""), help="trace UI link")
    g = p.add_argument_group("ports (default: well-known ports, or --base-port + offset)")
    g.add_argument("--base-port", type=int, default=None, help="derive every port from this one")
    for name, (default, offset, flag) in OFFSETS.items():
        g.add_argument(flag, dest=name, type=int, default=None, help=f"default {default} (base+{offset})")
    t = p.add_argument_group("timings (defaults; --fast shortens them)")
    for flag in (
        "lease-ttl",
        "lease-renew-interval",
        "lease-safety-margin",
        "standby-probe-interval",
        "poll-interval",
    ):
        t.add_argument("--" + flag, type=float, default=None)
    return p


def timings_from(args: argparse.Namespace) -> Timings:
    base = Timings.fast() if args.fast else Timings()
    changes = {
        k: getattr(args, k)
        for k in (
            "lease_ttl",
            "lease_renew_interval",
            "lease_safety_margin",
            "standby_probe_interval",
            "poll_interval",
        )
        if getattr(args, k) is not None
    }
    return replace(base, **changes)


def _lock_state_dir(state_dir: Path) -> IO[str] | None:
    state_dir.mkdir(parents=True, exist_ok=True)
    f = (state_dir / "narwhal-up.lock").open("a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "?"
        f.close()
        print(f"narwhal-up: state dir {state_dir} is in use by another narwhal-up (pid {holder}); "
              "pass --state-dir DIR", file=sys.stderr)  # fmt: skip
        return None
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()))
    f.flush()
    return f


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.engines < 1:
        print("narwhal-up: --engines must be >= 1", file=sys.stderr)
        return 2
    if args.prefill is not None and not 0 <= args.prefill <= args.engines:
        print("narwhal-up: --prefill must be between 0 and --engines", file=sys.stderr)
        return 2
    if args.restart != "none" and args.engines < 2:
        print("narwhal-up: a restart under load needs --engines >= 2", file=sys.stderr)
        return 2
    why = rolling_problem(roles(args.engines, args.prefill)) if args.restart == "rolling" else ""
    if why:
        print(f"narwhal-up: {why}", file=sys.stderr)
        return 2
    if args.bad_build and args.restart != "rolling":
        print("narwhal-up: --bad-build is judged by the canary analysis of a rolling restart "
              "(--restart rolling)", file=sys.stderr)  # fmt: skip
        return 2
    if args.failover and args.restart == "none":
        print("narwhal-up: --failover kills the primary during the restart; it needs --restart "
              "rolling or wave", file=sys.stderr)  # fmt: skip
        return 2
    if args.load_concurrency < 0:
        print("narwhal-up: --load-concurrency must be >= 0", file=sys.stderr)
        return 2
    try:
        timings = timings_from(args)
        from router.config import check_lease_timing

        check_lease_timing(timings.lease_ttl, timings.lease_renew_interval, timings.lease_safety_margin)
    except ValueError as exc:
        print(f"narwhal-up: {exc}", file=sys.stderr)
        return 2
    if args.etcd and shutil.which("etcd") is None:
        print("narwhal-up: --etcd needs the etcd binary on PATH (Debian: apt-get install etcd-server)",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.replicas and (args.replicas < 2 or not args.etcd):
        print("narwhal-up: --replicas N needs N >= 2 and --etcd (active-active runs on the etcd backend)",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.replicas and args.failover:
        print("narwhal-up: --failover kills the primary of the router pair; it does not combine with "
              "--replicas", file=sys.stderr)  # fmt: skip
        return 2
    overrides = {name: getattr(args, name) for name in OFFSETS}
    ports = plan_ports(args.base_port, args.engines, overrides, with_etcd=args.etcd, replicas=args.replicas)
    problems = port_problems(ports)
    if problems:
        for line in problems:
            print(f"narwhal-up: {line}", file=sys.stderr)
        return 2
    state_dir = Path(args.state_dir).resolve()
    lock = _lock_state_dir(state_dir)
    if lock is None:
        return 2
    try:
        stack = Stack(
            state_dir, ports, timings, args.fleet_name, args.prefill, etcd=args.etcd, replicas=args.replicas
        )
        return asyncio.run(supervise(stack, args))
    finally:
        lock.close()


async def supervise(stack: Stack, args: argparse.Namespace) -> int:
    """Run ``up`` as a task that SIGINT/SIGTERM cancel; always stop every child afterwards."""
    loop = asyncio.get_running_loop()
    body = asyncio.create_task(up(stack, args))
    got: list[int] = []

    def on_signal(sig: int) -> None:
        if not got:
            got.append(sig)
            say(f"{signal.Signals(sig).name}: stopping everything narwhal-up started ...")
            body.cancel()
        else:
            say("still stopping (children get their grace period); please wait")

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    rc = 3
    try:
        rc = await body
    except asyncio.CancelledError:
        rc = 128 + got[0] if got else 130
        if stack.summary is not None:  # stopped after the summary (--keep-running): its verdict stands
            failed_later = stack.load is not None and stack.load.stats.failed > stack.summary.total.failed
            if stack.load is not None:
                s = stack.load.stats
                say(f"load until Ctrl-C: {s.served} served, {s.failed} failed")
            rc = 0 if stack.summary.ok and not failed_later else 1
    except (StartupError, ChildExited) as exc:
        print(f"narwhal-up: {exc}", file=sys.stderr, flush=True)
        rc = 3
    finally:
        await shutdown(stack)
    return rc


async def shutdown(stack: Stack) -> None:
    if stack.load is not None:
        await stack.load.stop()
    if stack.watcher is not None:
        await stack.watcher.stop()
    replicas = tuple(f"router-{name}" for name in stack.routers) if stack.replicas else ()
    await stack.procs.stop_all((*STOP_ORDER[:2], *replicas, *STOP_ORDER[2:]))
    left = [f"{n} (pid {c.pid})" for n, c in stack.procs.children.items() if c.alive()]
    if left:
        say("could not stop: " + ", ".join(left))
    else:
        say(f"stopped {len(stack.procs.children)} processes; logs in {stack.log_dir}")


async def up(stack: Stack, args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    say(f"state dir {stack.state_dir} (logs in {stack.log_dir})")
    stack.write_configs()
    # Temporal, the supervisor (with its engines) and etcd need nothing of each other: they start
    # side by side; the routers need the engines (and etcd), the worker needs Temporal.
    say(f"starting Temporal dev server on {stack.temporal_address} (UI {stack.ui_url}) ...")
    say(f"starting supervisor {stack.supervisor_url} with {len(stack.iids)} engines ...")
    first = [stack.start_temporal(), stack.start_supervisor()]
    if stack.etcd:
        say(f"starting etcd {stack.etcd_url} (the router pair's lease backend) ...")
        first.append(stack.start_etcd())
    await together(*first)
    wait = stack.stale_lease_wait()
    if wait > 0:
        say(f"a previous run's lease in {stack.lease_path} expires in {wait:.1f}s; waiting")
        await asyncio.sleep(wait + 0.1)
    watcher = HAWatcher(stack.routers, on_takeover=_announce_takeover)

    async def routers_watched() -> None:  # the watcher sees the first claim, not a takeover
        if stack.replicas:
            urls = ", ".join(stack.routers.values())
            say(f"starting {stack.replicas} active-active router replicas: {urls} ...")
            await stack.start_replicas()
        else:
            say(f"starting routers: primary {stack.primary_url}, standby {stack.standby_url} ...")
            await stack.start_routers()
        stack.watcher = watcher
        async with httpx.AsyncClient() as http:
            await watcher.poll_once(http)
        watcher.start()

    say(f"starting worker on {stack.temporal_address} ...")
    await together(routers_watched(), stack.start_worker())
    if args.load_concurrency > 0:
        load = LoadGenerator(
            list(stack.routers.values()), MODEL, concurrency=args.load_concurrency,
            max_tokens=stack.t.max_tokens, think_s=stack.t.think_s, spread=bool(stack.replicas),
        )  # fmt: skip
        stack.load = load
        await load.start()
        await _warm_up(load, args.load_concurrency)
    _print_ready(stack, args, time.monotonic() - t0)

    summary = Summary(mode=args.restart, traces=_traces(args), expect_halt=bool(args.bad_build))
    if args.failover:
        summary.failover = Failover(router="primary", standby="standby")
    if args.restart != "none":
        await run_restart(stack, args, summary)
    if summary.failover is not None:
        await _after_failover(stack, summary, summary.failover)
    summary.total = stack.load.stats.copy() if stack.load is not None else LoadStats()
    summary.takeovers = list(watcher.takeovers)
    stack.procs.check_alive()
    stack.summary = summary
    print(summary.render(), end="", flush=True)
    (stack.state_dir / "summary.json").write_text(json.dumps(summary.to_json(), indent=2) + "\n")
    say(f"summary written to {stack.state_dir / 'summary.json'}")
    if args.keep_running:
        say("still running (--keep-running); press Ctrl-C to stop")
        while True:
            await asyncio.sleep(30.0)
            stack.procs.check_alive()
            if stack.load is not None:
                s = stack.load.stats
                say(f"load: {s.served} served, {s.failed} failed")
    return 0 if summary.ok else 1


def _announce_takeover(t: Takeover) -> None:
    say(f"takeover: {t.router} now holds the lease (epoch {t.epoch_before} → {t.epoch_after})")


async def _warm_up(load: LoadGenerator, concurrency: int) -> None:
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        if load.stats.served >= 2 * concurrency:
            break
        await asyncio.sleep(0.05)
    if load.stats.served == 0:
        raise StartupError(f"no client request was served during warm-up (last failure: {load.last_failure})")


def _traces(args: argparse.Namespace) -> str:
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if not endpoint:
        return ""
    url = args.traces_url or f"http://{urlparse(endpoint).hostname or '127.0.0.1'}:16686/search"
    return f"{url} (spans exported over OTLP to {endpoint})"


def _print_ready(stack: Stack, args: argparse.Namespace, took: float) -> None:
    urls = stack.engine_urls()
    engines = ", ".join(f"{i} {stack.roles[i]} {urls[i]}" for i in stack.iids)
    w = stack.watcher
    epoch = w.epoch if w is not None else None
    lines = [
        f"stack is up in {took:.1f}s",
        f"  Temporal    {stack.temporal_address}   UI {stack.ui_url}",
        f"  supervisor  {stack.supervisor_url}   engines: {engines}",
        *(
            [
                f"  replicas    {', '.join(stack.routers.values())}   active-active, every one serves "
                f"(epoch {epoch}); the load is spread over them"
            ]
            if stack.replicas
            else [
                f"  router      {stack.primary_url}   primary (lease {stack.lease_path.name}, epoch {epoch})",
                f"  standby     {stack.standby_url}   warm standby of the primary",
            ]
        ),
        "  worker      task queue narwhal-restart",
        f"  load        {args.load_concurrency} concurrent clients, streamed + buffered completions",
        *(
            ["  failover    the primary router gets SIGKILLed once the restart's second engine began"]
            if args.failover
            else []
        ),
        f"  pids        {stack.procs.pids_path}",
        "  logs        " + "\n              ".join(str(c.log_path) for c in stack.procs.children.values()),
    ]
    for line in lines:
        say(line)
    say("ready")


async def run_restart(stack: Stack, args: argparse.Namespace, summary: Summary) -> None:
    """Start (or attach to) the restart workflow, follow it, and fill ``summary``."""
    from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
    from temporalio.service import RPCError

    from narwhal_models.restart import RestartProgress, RestartResult, fleet_workflow_id
    from workflows.client import connect
    from workflows.outcome import failure_line, failure_result

    wid = fleet_workflow_id(stack.fleet_name)
    summary.workflow_id, summary.workflow_url = wid, stack.workflow_url(wid)
    client = await connect(stack.temporal_address, "default")
    handle = client.get_workflow_handle(wid, result_type=RestartResult)
    before = await stack.engines()
    load_before = stack.load.stats.copy() if stack.load is not None else LoadStats()
    started = time.monotonic()

    running = False
    with contextlib.suppress(RPCError):
        desc = await handle.describe(rpc_timeout=RPC_TIMEOUT)
        running = desc.status == WorkflowExecutionStatus.RUNNING
    if running:
        say(f"a restart from an earlier run is still in progress: following {wid}")
    else:
        say(
            f"starting a {args.restart} restart: narwhal-restart start ... (log {stack.log_dir / 'restart-cli.log'})"
        )
        argv = stack.restart_args(args.restart)
        if args.bad_build:
            await stack.stage_build(args.bad_build)
            argv += ["--analysis", str(stack.write_analysis())]
            say(f"bad build {args.bad_build!r} staged on every engine; the restart runs with canary analysis")
        cli = stack.procs.start("restart-cli", argv, grace_s=5.0, oneshot=True)
        rc = await cli.wait(120.0)
        out = cli.tail(4000).split("=== narwhal-up starts:")[-1].split("\n", 1)[-1]
        for line in out.strip().splitlines():
            print(f"  [narwhal-restart] {line}", flush=True)
        if rc != 0:
            summary.problems.append(f"narwhal-restart start exited with {rc}: {out.strip()[-300:]}")
            summary.workflow_state = "not started"
            summary.engines = [EngineChange(i, stack.roles[i], "not started") for i in stack.iids]
            return
        handle = client.get_workflow_handle(wid, result_type=RestartResult)
    say(f"workflow in the Temporal UI: {stack.workflow_url(wid)}")

    shown: dict[str, str] = {}
    fo = summary.failover
    ready_task: asyncio.Task[None] | None = None
    last_load = 0.0
    deadline = time.monotonic() + args.restart_timeout
    while True:
        stack.procs.check_alive("temporal", "worker", "supervisor")
        try:
            p = await handle.query("progress", result_type=RestartProgress, rpc_timeout=RPC_TIMEOUT)
            for line in progress_lines(p, shown):
                print(f"  [restart] {line}", flush=True)
            trigger = failover_trigger(p) if fo is not None and not fo.injected else ""
            if fo is not None and trigger:
                await kill_primary(stack, fo, trigger)
                ready_task = asyncio.create_task(_standby_ready(stack, fo), name="narwhal-up-failover")
        except RPCError:
            pass
        if stack.load is not None and time.monotonic() - last_load > 5.0:
            last_load = time.monotonic()
            d = stack.load.stats.minus(load_before)
            print(f"  [load]    during restart so far: {d.served} served, {d.failed} failed", flush=True)
        desc = await handle.describe(rpc_timeout=RPC_TIMEOUT)
        if desc.status != WorkflowExecutionStatus.RUNNING:
            break
        if time.monotonic() > deadline:
            summary.problems.append(
                f"restart still running after --restart-timeout {args.restart_timeout:.0f}s"
            )
            break
        await asyncio.sleep(0.5)
    summary.restart_seconds = time.monotonic() - started
    if ready_task is not None:
        await ready_task
    if stack.load is not None:
        summary.during = stack.load.stats.minus(load_before)
    after = await stack.record_engine_pids()
    result: RestartResult | None = None
    if not summary.problems:
        try:
            result = await handle.result(rpc_timeout=RPC_TIMEOUT)
        except WorkflowFailureError as exc:
            result = failure_result(exc)  # a failed or aborted run carries its result
            summary.problems.append(f"workflow failed: {failure_line(exc)}")
        except RPCError as exc:
            summary.problems.append(f"workflow result unavailable: {exc.message}")
    summary.workflow_state = (
        result.state if result is not None else (desc.status.name if desc.status else "?")
    )
    summary.workflow_message = result.message if result is not None else ""
    for iid in stack.iids:
        e = result.engines.get(iid) if result is not None else None
        summary.engines.append(
            EngineChange(
                iid,
                stack.roles[iid],
                e.outcome if e else "unknown",
                e.old_process_start if e else before.get(iid, {}).get("process_start"),
                e.new_process_start if e else None,
                before.get(iid, {}).get("pid"),
                after.get(iid, {}).get("pid"),
                e.error if e else "",
            )
        )


async def kill_primary(stack: Stack, fo: Failover, trigger: str) -> None:
    """The injected failure of ``--failover``: SIGKILL the primary router by its PID."""
    child = stack.procs.children["router-primary"]
    fo.pid, fo.trigger = child.pid, trigger
    fo.epoch_before = stack.watcher.epoch if stack.watcher is not None else None
    say(f"--failover: {trigger}; SIGKILL router-primary (pid {child.pid})")
    if stack.load is not None:  # before the kill: its in-flight requests fail while we wait for it
        stack.load.router_killed(stack.primary_url)
    fo.killed_at = time.time()
    await stack.procs.kill("router-primary", at=fo.killed_at)
    fo.dead_at = time.time()
    stack.procs.note_pids("killed", {"router-primary": child.pid})  # stays in pids.json after a rejoin
    if stack.load is not None:  # requests sent to it from now on meet a dead port: not "cut"
        stack.load.router_killed(stack.primary_url, fo.dead_at)


async def _standby_ready(stack: Stack, fo: Failover, within_s: float = 60.0) -> None:
    """Record when the standby first answers ``/ready`` 200 after the kill, and its lease epoch."""
    deadline = time.monotonic() + within_s
    async with httpx.AsyncClient() as http:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                r = await http.get(stack.standby_url + "/ready", timeout=1.0)
                if r.status_code == 200:
                    fo.standby_ready_at = time.time()
                    doc: Any = None
                    with contextlib.suppress(ValueError):
                        doc = r.json()
                    epoch = doc.get("epoch") if isinstance(doc, dict) else None
                    fo.epoch_after = int(epoch) if epoch else None
                    took = fo.took_s or 0.0
                    say(f"--failover: standby /ready 200 after {took:.2f}s (epoch {fo.epoch_after})")
                    return
            await asyncio.sleep(0.05)


async def _after_failover(stack: Stack, summary: Summary, fo: Failover) -> None:
    """Check the injected failover happened and took; start the old primary as a standby again."""
    if not fo.injected:
        summary.problems.append("--failover: the primary router was never killed (no second engine began)")
        return
    if fo.standby_ready_at is None:
        summary.problems.append("--failover: the standby never answered /ready 200 after the kill")
        return
    w = stack.watcher
    if fo.epoch_after is None and w is not None:
        fo.epoch_after = w.epoch
    if w is not None and not any(t.router == fo.standby for t in w.takeovers):
        with contextlib.suppress(Exception):  # one more look before calling it missing
            async with httpx.AsyncClient() as http:
                await w.poll_once(http)
        if not any(t.router == fo.standby for t in w.takeovers):
            summary.problems.append("--failover: no takeover by the standby was observed")
            return
    say(f"--failover: restarting the old primary as a standby of {stack.standby_url} ...")
    try:
        child = await stack.start_rejoined_primary()
        fo.rejoined = (
            f"old primary restarted as a standby of the new holder {stack.standby_url} (pid {child.pid})"
        )
    except StartupError as exc:  # nice to have: say so, but the demo's verdict does not depend on it
        fo.rejoined = f"could not restart the old primary as a standby: {str(exc).splitlines()[0]}"
    say(fo.rejoined)
