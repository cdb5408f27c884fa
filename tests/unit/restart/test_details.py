"""What an operator reads: Current Details lines (UI), ISO 8601 twins of epoch fields, CLI help."""

from __future__ import annotations

import argparse
import json

import pytest

from narwhal_models.restart import EngineProgress, OperatorEvent, RestartResult
from workflows.cli import parser
from workflows.details import duration, engine_line, progress_line, render
from workflows.schedules import parse_every

T0 = 1796108761.0  # 2026-12-01 ...


def engine(iid: str, **kw: object) -> EngineProgress:
    return EngineProgress.model_validate({"iid": iid, **kw})


def test_durations_read_like_a_person_writes_them() -> None:
    assert [duration(s) for s in (3.21, 59.94, 72, 3600 + 300)] == ["3.2 s", "59.9 s", "1 m 12 s", "1 h 5 m"]


def test_header_progress_line() -> None:
    es = [engine("e0", outcome="restarted", step="done"), engine("e1", outcome="restarted", step="done"),
          engine("e3", outcome="running", step="draining")] + [engine(f"e{i}") for i in (4, 5, 6, 7, 8)]  # fmt: skip
    assert progress_line(es, T0, T0 + 72) == "2/8 restarted, e3 draining, 1 m 12 s elapsed"


def test_one_line_per_engine_with_human_times_durations_and_checks() -> None:
    done = engine(
        "e0", step="done", outcome="restarted", router_state="active", started_at=T0, finished_at=T0 + 12.5,
        timings={"draining": 0.2, "waiting_to_stop": 3.0, "restarting": 4.0, "waiting_for_new_process": 1.1,
                 "readmitting": 2.0, "confirming": 0.1},
        checks=["health", "model", "new process identity", "final health"],
    )  # fmt: skip
    line = engine_line(done)
    assert line.startswith(
        "- **e0** done · router active · drained in 3.2 s, restarted in 5.1 s, readmitted in 2.1 s"
    )
    assert "4 checks passed" in line and "–" in line and "UTC" in line
    assert "\n" not in line and "|" not in line
    blocked = engine(
        "e1", step="blocked", outcome="running", router_state="blocked", started_at=T0, step_started_at=T0 + 20,
        checks=["health"], error="serves [x], expected y", waiting_for="retry (after repair) or abort",
    )  # fmt: skip
    line = engine_line(blocked, now=T0 + 30)
    assert "1 checks passed, then one failed" in line and "**waiting for operator: retry" in line
    assert line.endswith("— serves [x], expected y")


def test_final_details_never_say_running() -> None:
    es = [engine("e0", step="done", outcome="restarted")]
    text = render("f: rolling restart", "done", es, T0, T0 + 5, "every engine restarted and readmitted",
                  [OperatorEvent(at=T0 + 1, kind="paused"), OperatorEvent(at=T0 + 2, kind="resumed", by="ann")])  # fmt: skip
    assert text.splitlines()[0] == "### f: rolling restart — done"
    assert "running" not in text and "1/1 restarted, 5.0 s elapsed" in text
    assert "resumed by ann" in text


def test_result_documents_carry_iso_8601_next_to_epochs() -> None:
    res = RestartResult(
        fleet="f", mode="rolling", ok=True, state="done", started_at=T0, finished_at=T0 + 60,
        engines={"e0": engine("e0", old_process_start=1796108783.091, new_process_start=None)},
    )  # fmt: skip
    doc = json.loads(res.model_dump_json(by_alias=True))
    assert doc["started_at_iso"].endswith("Z") and doc["started_at_iso"].startswith("2026-")
    assert doc["engines"]["e0"]["old_process_start_iso"].endswith(":23.091Z")
    assert doc["engines"]["e0"]["new_process_start_iso"] == ""
    assert RestartResult.model_validate(doc).model_dump() == res.model_dump()  # round trip: twins accepted
    # the twin follows the epoch after a change
    res.engines["e0"].new_process_start = T0
    assert res.model_dump(mode="json")["engines"]["e0"]["new_process_start_iso"] == doc["started_at_iso"]


@pytest.mark.parametrize(
    "argv",
    [["start"], ["status"], ["pause"], ["resume"], ["approve"], ["retry"], ["abort"], ["list"],
     ["schedule", "create"], ["schedule", "list"], ["schedule", "pause"], ["schedule", "delete"]],
)  # fmt: skip
def test_every_subcommand_has_its_own_help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parser().parse_args([*argv, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert f"usage: narwhal-restart {' '.join(argv)}" in out
    assert "--address" in out or argv == ["schedule"]


def test_start_help_names_the_new_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["start", "--help"])
    out = capsys.readouterr().out
    for flag in ("--fleet-file", "--pause-after", "--engine-url", "/narwhal/targets"):
        assert flag in out


def test_schedule_intervals() -> None:
    assert parse_every("6h").total_seconds() == 21600 and parse_every("90s").total_seconds() == 90
    for bad in ("soon", "0s", "5 weeks"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_every(bad)
    args = parser().parse_args(["schedule", "create", "--router", "http://r", "--cron", "0 3 * * SUN"])
    assert args.cron == "0 3 * * SUN" and args.every is None


def test_an_engines_final_line_says_what_really_happened() -> None:
    """The abort that once said ``restarted in 59.7 s`` for an engine never restarted."""
    drained = {"draining": 0.2, "waiting_to_stop": 3.0}
    in_restart = {**drained, "restarting": 0.1, "waiting_for_new_process": 59.6}
    steps = {
        "draining": T0,
        "waiting_to_stop": T0 + 1,
        "restarting": T0 + 4,
        "waiting_for_new_process": T0 + 5,
    }
    aborted = engine("e1", step="aborted", outcome="aborted", timings=in_restart, step_times=steps)
    line = engine_line(aborted)
    assert "e1** aborted: restart aborted (held out of placement)" in line
    assert "drained in 3.2 s, restart aborted after 59.7 s" in line and "restarted in" not in line
    held = engine("e2", step="aborted", outcome="aborted", timings=drained,
                  step_times={"draining": T0, "waiting_to_stop": T0 + 1})  # fmt: skip
    assert "aborted: not restarted (held out of placement)" in engine_line(held)
    assert "drain aborted after 3.2 s" in engine_line(held)
    back = engine("e3", step="failed", outcome="failed", new_process_start=T0 + 5,
                  timings={**in_restart, "readmitting": 1.0},
                  step_times={**steps, "readmitting": T0 + 64})  # fmt: skip
    line = engine_line(back)
    assert "failed: restarted, readmission failed" in line and "restarted in 59.7 s" in line
    assert "readmission failed after 1.0 s" in line
