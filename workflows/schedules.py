"""``narwhal-restart schedule create|list|pause|unpause|delete``: restart waves on Temporal Schedules.

A schedule starts the same workflow ``narwhal-restart start`` would (the plan is validated by the
same preflight when the schedule is created, with the same flags), on a cron expression or an
interval, with overlap policy SKIP: a run that would start while the previous one is still running
is skipped. Temporal appends the scheduled time to the workflow id
(``narwhal-restart-<fleet>-<time>``); ``status``/``list`` find the runs by their ``NarwhalFleet``
search attribute. The schedule id is ``narwhal-schedule-<name>`` (default name: the fleet).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, timedelta

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleState,
)
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

from narwhal_models.restart import RestartPlan, fleet_slug, fleet_workflow_id
from workflows.client import connect, ensure_search_attributes, security
from workflows.preflight import PreflightError
from workflows.steps import FLEET_KEY, STATE_KEY

SCHEDULE_PREFIX = "narwhal-schedule-"
WHEN_MEMO = "narwhal_when"
_EVERY = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d)$")
PlanBuilder = Callable[[argparse.Namespace], Awaitable[tuple[RestartPlan, str]]]


def parse_every(text: str) -> timedelta:
    """``90s``, ``30m``, ``6h``, ``7d`` → timedelta (argparse type)."""
    m = _EVERY.match(text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"not an interval: {text!r} (use e.g. 30m, 6h, 7d)")
    value = float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    if value < 1:
        raise argparse.ArgumentTypeError(f"interval too short: {text!r}")
    return timedelta(seconds=value)


def schedule_id(name: str) -> str:
    return SCHEDULE_PREFIX + fleet_slug(name)


def add_schedule_parser(
    sp: argparse.ArgumentParser,
    common: argparse.ArgumentParser,
    add_start_flags: Callable[[argparse.ArgumentParser], None],
) -> None:
    sub = sp.add_subparsers(dest="schedule_command", required=True, metavar="ACTION")
    c = sub.add_parser(
        "create", parents=[common], help="validate like `start`, then create the schedule",
        description="Validate the fleet like `start` (same flags), then start that restart on a cron "
        "expression or an interval; overlapping runs are skipped.",
    )  # fmt: skip
    when = c.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", help="cron expression in UTC, e.g. '0 3 * * SUN' (Sundays 03:00)")
    when.add_argument("--every", type=parse_every, help="interval, e.g. 6h or 7d")
    c.add_argument("--name", default="", help="schedule name (default: the fleet)")
    c.add_argument("--note", default="", help="shown with the schedule in the UI")
    c.add_argument("--paused", action="store_true", help="create it paused")
    add_start_flags(c)
    sub.add_parser("list", parents=[common], help="list restart schedules", description="Restart schedules.")
    for action, text in (("pause", "pause a schedule"), ("unpause", "unpause a schedule"),
                         ("delete", "delete a schedule (runs already started go on)")):  # fmt: skip
        a = sub.add_parser(action, parents=[common], help=text, description=text[0].upper() + text[1:] + ".")
        a.add_argument(
            "--name", required=True, help="schedule name, as `schedule create` named it (required)"
        )
        if action != "delete":
            a.add_argument("--note", default="", help="why (shown in the UI)")


async def cmd_schedule(args: argparse.Namespace, build_plan: PlanBuilder) -> int:
    client = await connect(args.address, args.namespace, security(args))
    action = args.schedule_command
    if action == "create":
        return await _create(client, args, build_plan)
    if action == "list":
        return await _list(client)
    handle = client.get_schedule_handle(schedule_id(args.name))
    try:
        if action == "pause":
            await handle.pause(note=args.note or f"paused by {args.requested_by}")
        elif action == "unpause":
            await handle.unpause(note=args.note or f"unpaused by {args.requested_by}")
        else:
            await handle.delete()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            raise PreflightError(
                f"no schedule named {args.name} ({handle.id}); see `narwhal-restart schedule list`"
            ) from None
        raise
    print(f"{action}d {handle.id}" if action != "pause" else f"paused {handle.id}")
    return 0


async def _create(client: Client, args: argparse.Namespace, build_plan: PlanBuilder) -> int:
    plan, details = await build_plan(args)
    await ensure_search_attributes(client, args.namespace)
    sid = schedule_id(args.name or plan.fleet)
    spec = (
        ScheduleSpec(cron_expressions=[args.cron])
        if args.cron
        else ScheduleSpec(intervals=[ScheduleIntervalSpec(every=args.every)])
    )
    action = ScheduleActionStartWorkflow(
        "WaveRestart" if plan.mode == "wave" else "RollingRestart",
        plan,
        id=fleet_workflow_id(plan.fleet),
        task_queue=args.task_queue,
        typed_search_attributes=TypedSearchAttributes(
            [SearchAttributePair(FLEET_KEY, plan.fleet), SearchAttributePair(STATE_KEY, "starting")]
        ),
        static_summary=f"scheduled {plan.mode} restart of {plan.fleet} ({len(plan.engines)} engines)",
        static_details=details + f"\n- schedule `{sid}`",
    )
    note = args.note or f"created by {args.requested_by}"
    when = f"cron {args.cron}" if args.cron else f"every {args.every}"
    try:
        await client.create_schedule(
            sid,
            Schedule(
                action=action,
                spec=spec,
                policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
                state=ScheduleState(note=note, paused=args.paused),
            ),
            memo={WHEN_MEMO: when},
        )
    except ScheduleAlreadyRunningError:
        raise PreflightError(
            f"schedule {sid} already exists: delete it first or choose another --name"
        ) from None
    when = f"cron '{args.cron}' (UTC)" if args.cron else f"every {args.every}"
    print(f"created {sid}: {plan.mode} restart of {plan.fleet} ({len(plan.engines)} engines), {when}"
          f"{', paused' if args.paused else ''}; overlapping runs are skipped")  # fmt: skip
    return 0


async def _list(client: Client) -> int:
    rows = []
    async for entry in await client.list_schedules():
        if not entry.id.startswith(SCHEDULE_PREFIX):
            continue
        sched = entry.schedule
        spec = sched.spec if sched is not None else None
        # Temporal turns a cron expression into calendar specs: the text given to `create` is kept
        # in the schedule's memo
        when = str(await entry.memo_value(WHEN_MEMO, default=""))
        if not when and spec is not None:
            when = ", ".join(
                [f"cron {c}" for c in spec.cron_expressions] + [f"every {i.every}" for i in spec.intervals]
            )
        paused = sched is not None and sched.state.paused
        nxt = (
            entry.info.next_action_times[0].astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
            if entry.info and entry.info.next_action_times
            else "-"
        )
        last = (
            entry.info.recent_actions[-1].started_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
            if entry.info and entry.info.recent_actions
            else "-"
        )
        rows.append((entry.id, "paused" if paused else "active", when or "-", nxt, last))
    if not rows:
        print("no restart schedules")
        return 0
    head = ("SCHEDULE", "STATE", "WHEN", "NEXT RUN (UTC)", "LAST RUN (UTC)")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return 0
