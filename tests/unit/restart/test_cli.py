"""``narwhal-restart`` / ``narwhal-worker`` command lines: log levels in any case, Temporal down,
``--workflow-id`` only where a workflow is addressed, ``--restart-timeout-s``."""

from __future__ import annotations

import argparse
import subprocess

import pytest

from tests.support.procs import free_port, script
from workflows.cli import parser
from workflows.worker import log_level, positive_seconds


@pytest.mark.parametrize(
    ("given", "level"), [("warning", "WARNING"), ("WARN", "WARNING"), ("Debug", "DEBUG"), ("error", "ERROR")]
)
def test_worker_log_level_accepts_any_case(given: str, level: str) -> None:
    assert log_level(given) == level


def test_worker_log_level_rejects_unknown_names() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="unknown log level 'loud'"):
        log_level("loud")


def test_worker_sticky_timeout_takes_positive_seconds() -> None:
    assert positive_seconds("1") == 1.0 and positive_seconds("0.5") == 0.5
    for bad, why in (("0", "must be > 0 seconds"), ("-1", "must be > 0 seconds"), ("soon", "not a number")):
        with pytest.raises(argparse.ArgumentTypeError, match=why):
            positive_seconds(bad)


@pytest.mark.parametrize("attempt", range(3))  # the abort at interpreter exit was intermittent
def test_worker_cli_accepts_lower_case_log_level(attempt: int) -> None:
    # parses the level and then fails to reach Temporal on a closed port: exit 2, one line, no traceback
    address = f"127.0.0.1:{free_port()}"
    r = subprocess.run(
        [script("narwhal-worker"), "--log-level", "warning", "--address", address],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]
    assert f"cannot reach Temporal at {address}" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("attempt", range(3))  # "Fatal Python error" at exit was intermittent
def test_start_with_temporal_down_prints_one_line_and_exits_2(attempt: int) -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    r = subprocess.run(
        [script("narwhal-restart"), "start", "--address", address, "--router", "http://127.0.0.1:9",
         "--fleet", "f"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert f"cannot reach Temporal at {address} (connection refused)" in lines[0]
    assert "TEMPORAL_ADDRESS" in lines[0] and "temporal server start-dev" in lines[0]


def test_status_with_temporal_down_exits_2_too() -> None:
    address = f"127.0.0.1:{free_port()}"
    r = subprocess.run(
        [script("narwhal-restart"), "status", "--address", address, "--fleet", "f"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_workflow_id_is_derived_on_start_and_accepted_when_steering(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["start", "--router", "http://r", "--workflow-id", "x"])
    assert "unrecognized arguments: --workflow-id" in capsys.readouterr().err
    for command in ("status", "pause", "resume", "approve", "retry", "abort"):
        assert (
            parser().parse_args([command, "--workflow-id", "narwhal-restart-f"]).workflow_id
            == "narwhal-restart-f"
        )


def test_restart_timeout_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert parser().parse_args(["start", "--router", "http://r"]).restart_timeout_s == 600.0
    assert (
        parser().parse_args(["start", "--router", "http://r", "--restart-timeout-s", "30"]).restart_timeout_s
        == 30
    )
    for bad in ("0", "-1", "nan", "soon"):
        with pytest.raises(SystemExit):
            parser().parse_args(["start", "--router", "http://r", "--restart-timeout-s", bad])
    assert "--restart-timeout-s" in capsys.readouterr().err
