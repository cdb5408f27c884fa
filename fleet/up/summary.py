"""The end-of-run summary of ``narwhal-up``: engines restarted, client requests, takeovers, links.

Pure data + formatting (no I/O), so it is unit-tested directly. ``ok`` is the exit-code verdict:
every engine restarted (when a restart ran) and zero failed client requests. With ``--failover``,
requests that were in flight on the primary when narwhal-up SIGKILLed it are reported on their own
line ("cut by the injected router kill") and are not failures for the verdict.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from fleet.up.load import LoadStats


@dataclass
class EngineChange:
    iid: str
    role: str = ""
    outcome: str = "pending"
    old_process_start: float | None = None
    new_process_start: float | None = None
    old_pid: int | None = None
    new_pid: int | None = None
    error: str = ""

    @property
    def restarted(self) -> bool:
        return (
            self.outcome == "restarted"
            and self.old_process_start is not None
            and self.new_process_start is not None
            and self.new_process_start > self.old_process_start
        )


@dataclass
class Takeover:
    at: float
    router: str
    epoch_before: int
    epoch_after: int
    holder: str = ""


@dataclass
class Failover:
    """The injected failure of ``--failover``: the primary router SIGKILLed during the restart."""

    requested: bool = True
    router: str = ""  # the killed router (its name in narwhal-up)
    pid: int | None = None
    killed_at: float | None = None  # SIGKILL sent
    dead_at: float | None = None  # its death confirmed (requests sent to it until then: "cut")
    trigger: str = ""  # why then, e.g. "e1 began draining"
    standby: str = ""
    standby_ready_at: float | None = None  # first /ready 200 of the standby after the kill
    epoch_before: int | None = None
    epoch_after: int | None = None
    rejoined: str = ""  # the killed router restarted as a standby of the new holder

    @property
    def injected(self) -> bool:
        return self.killed_at is not None

    @property
    def took_s(self) -> float | None:
        if self.killed_at is None or self.standby_ready_at is None:
            return None
        return self.standby_ready_at - self.killed_at


@dataclass
class Summary:
    mode: str  # rolling | wave | none
    workflow_id: str = ""
    workflow_url: str = ""
    workflow_state: str = ""
    workflow_message: str = ""
    engines: list[EngineChange] = field(default_factory=list)
    during: LoadStats = field(default_factory=LoadStats)
    total: LoadStats = field(default_factory=LoadStats)
    takeovers: list[Takeover] = field(default_factory=list)
    restart_seconds: float | None = None
    traces: str = ""
    problems: list[str] = field(default_factory=list)
    expect_halt: bool = False  # --bad-build: success is the canary analysis stopping the rollout
    failover: Failover | None = None

    @property
    def all_restarted(self) -> bool:
        return bool(self.engines) and all(e.restarted for e in self.engines)

    @property
    def ok(self) -> bool:
        restarted = self.mode == "none" or self.all_restarted
        if self.expect_halt:
            restarted = self.workflow_state == "analysis_failed"
        # total.failed never includes requests cut by the injected router kill (total.cut)
        return restarted and self.total.failed == 0 and not self.problems

    def render(self) -> str:
        lines = ["", "=" * 78, "narwhal-up summary", "=" * 78]
        if self.mode == "none":
            lines.append("restart: none requested (--restart none)")
        else:
            took = f" in {self.restart_seconds:.1f}s" if self.restart_seconds is not None else ""
            done = sum(e.restarted for e in self.engines)
            lines.append(
                f"{self.mode} restart: {self.workflow_state or 'unknown'}{took} — "
                f"{done}/{len(self.engines)} engines restarted"
            )
            if self.workflow_message:
                lines.append(f"  {self.workflow_message}")
            for e in self.engines:
                mark = "ok " if e.restarted else "NO "
                pids = f"  pid {_v(e.old_pid)} → {_v(e.new_pid)}" if e.old_pid or e.new_pid else ""
                lines.append(
                    f"  [{mark}] {e.iid:<5} {e.role:<8} {e.outcome:<10} process start "
                    f"{_ts(e.old_process_start)} → {_ts(e.new_process_start)}{pids}"
                    + (f"  ({e.error})" if e.error else "")
                )
        lines.append(
            _load_line("client requests during the restart", self.during) if self.mode != "none" else ""
        )
        lines.append(_load_line("client requests in total", self.total))
        for reason, n in self.total.failures.most_common():
            lines.append(f"    failed {n:>5} × {reason}")
        if self.takeovers:
            for t in self.takeovers:
                lines.append(
                    f"takeover at {_ts(t.at)}: {t.router} took the lease, epoch {t.epoch_before} → "
                    f"{t.epoch_after} ({t.holder})"
                )
        else:
            lines.append("takeovers: none (the primary kept the lease)")
        lines += self._failover_lines()
        if self.workflow_url:
            lines.append(f"workflow: {self.workflow_url}")
        if self.traces:
            lines.append(f"traces:   {self.traces}")
        for p in self.problems:
            lines.append(f"problem:  {p}")
        lines.append(f"result:   {'OK' if self.ok else 'FAILED'} — {self.verdict()}")
        return "\n".join(line for line in lines if line != "") + "\n"

    def _failover_lines(self) -> list[str]:
        f = self.failover
        if f is None:
            return []
        if not f.injected:
            return ["failover (--failover): the primary router was not killed"]
        gone = ""
        if f.killed_at is not None and f.dead_at is not None:
            gone = f", gone {1000 * (f.dead_at - f.killed_at):.0f}ms later"
        lines = [f"failover (--failover): {f.router} router (pid {_v(f.pid)}) SIGKILLed at {_ts(f.killed_at)}"
                 + (f" when {f.trigger}" if f.trigger else "") + gone]  # fmt: skip
        if f.took_s is not None:
            lines.append(
                f"  {f.standby} /ready 200 at {_ts(f.standby_ready_at)} (+{f.took_s:.2f}s), "
                f"lease epoch {_v(f.epoch_before)} → {_v(f.epoch_after)}"
            )
        else:
            lines.append(f"  {f.standby} never answered /ready 200 after the kill")
        if f.rejoined:
            lines.append(f"  {f.rejoined}")
        lines.append(
            f"cut by the injected router kill: {self.total.cut} requests in flight on the killed "
            "router (client-visible, but not counted as failures with --failover)"
        )
        for reason, n in self.total.cut_reasons.most_common():
            lines.append(f"    cut    {n:>5} × {reason}")
        return lines

    def verdict(self) -> str:
        parts = []
        if self.mode != "none":
            done = sum(e.restarted for e in self.engines)
            parts.append(f"{done}/{len(self.engines)} engines restarted")
        if self.expect_halt:
            halted = self.workflow_state == "analysis_failed"
            parts.append(
                "the bad build was halted by the canary analysis"
                if halted
                else "the bad build was NOT halted"
            )
        parts.append(f"{self.total.failed} failed requests")
        if self.failover is not None:
            parts.append(f"{self.total.cut} cut by the injected router kill (not failures)")
        if self.problems:
            parts.append(f"{len(self.problems)} problems")
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        def load(s: LoadStats) -> dict[str, Any]:
            d = asdict(s)
            d["failures"] = dict(s.failures)
            d["by_router"] = dict(s.by_router)
            d["cut_reasons"] = dict(s.cut_reasons)
            return d

        return {
            "ok": self.ok,
            "mode": self.mode,
            "workflow_id": self.workflow_id,
            "workflow_url": self.workflow_url,
            "workflow_state": self.workflow_state,
            "workflow_message": self.workflow_message,
            "all_restarted": self.all_restarted,
            "engines": [{**asdict(e), "restarted": e.restarted} for e in self.engines],
            "during_restart": load(self.during),
            "total": load(self.total),
            "takeovers": [asdict(t) for t in self.takeovers],
            "restart_seconds": self.restart_seconds,
            "traces": self.traces,
            "problems": list(self.problems),
            "failover": (
                {**asdict(self.failover), "injected": self.failover.injected, "took_s": self.failover.took_s}
                if self.failover is not None
                else None
            ),
        }


def _v(x: object) -> str:
    return "-" if x is None else str(x)


def _ts(t: float | None) -> str:
    if t is None:
        return "-"
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int((t % 1) * 1000):03d}"


def _load_line(title: str, s: LoadStats) -> str:
    retried = f", {s.retried} re-sent to the ready router" if s.retried else ""
    return (
        f"{title}: {s.served} served ({s.streamed} streamed, {s.buffered} buffered), "
        f"{s.failed} failed{retried}"
    )
