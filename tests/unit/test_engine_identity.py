"""One parser for ``process_start_time_seconds`` and one same-process rule (router, supervisor,
activities all use ``router.engines.identity``)."""

from __future__ import annotations

import pytest

from activities.supervisor import parse_process_start as activities_parse
from fleet.managed import parse_process_start as supervisor_parse
from router.engines.control import EngineAnswerError
from router.engines.control import parse_process_start as router_parse
from router.engines.identity import (
    SAME_PROCESS_TOLERANCE_S,
    ProcessStartError,
    newer_process,
    read_process_start,
    same_process,
)

VLLM_LIKE = (
    "# HELP python_gc_objects_collected_total Objects collected during gc\n"
    "# TYPE python_gc_objects_collected_total counter\n"
    'python_gc_objects_collected_total{generation="0"} 12.0\n'
    "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n"
    "# TYPE process_start_time_seconds gauge\n"
    "process_start_time_seconds 1.7959663399004564e+09\n"
    "# HELP vllm:num_requests_running Number of requests.\n# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{model_name="m"} 0.0\n'
)


def test_every_reader_gets_the_same_value() -> None:
    assert read_process_start(VLLM_LIKE) == 1795966339.9004564
    assert router_parse(VLLM_LIKE) == supervisor_parse(VLLM_LIKE) == activities_parse(VLLM_LIKE)
    assert read_process_start('process_start_time_seconds{pid="1"} 1.7e9\n') == 1.7e9


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("other 1\n", "no process_start_time_seconds in /metrics"),
        ("process_start_time_seconds NaN\n", "must be finite and positive"),
        ("process_start_time_seconds -1\n", "must be finite and positive"),
        ("process_start_time_seconds +Inf\n", "must be finite and positive"),
        ("nothing here", "/metrics is not Prometheus text"),
    ],
)
def test_unusable_metrics_are_refused_with_the_reason(text: str, why: str) -> None:
    with pytest.raises(ProcessStartError, match=why):
        read_process_start(text)
    with pytest.raises(EngineAnswerError, match=why):
        router_parse(text)
    assert supervisor_parse(text) is None and activities_parse(text) is None


def test_one_equality_rule() -> None:
    start = 1795966339.9004564
    assert same_process(start, start) and same_process(start, start + SAME_PROCESS_TOLERANCE_S / 2)
    assert not same_process(start, start + 1e-3) and not same_process(start, None)
    assert newer_process(start + 1.0, start) and not newer_process(start, start)
    assert not newer_process(start + SAME_PROCESS_TOLERANCE_S / 2, start)  # formatting, not a restart
    assert not newer_process(start - 1.0, start) and not newer_process(None, start)
