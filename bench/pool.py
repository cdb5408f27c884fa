"""Pool several ``bench/pd_routers.py`` runs (their ``.json``) into one Narwhal-vs-vllm-router table.

Medians over every repetition of every run given (the per-run tables with min–max stay in each
run's ``.md``); ratios are Narwhal ÷ vllm-router, and ÷ ``narwhal-base`` when the runs had one
(``--baseline-serve``).

    .venv/bin/python bench/pool.py bench/results/pd_routers-native.json bench/results/pd_routers-native-second-run.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

N, V, BASE = "narwhal", "vllm-router", "narwhal-base"


def pooled(paths: list[Path]) -> dict[tuple[str, int, str], dict[str, float]]:
    values: dict[tuple[str, int, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for path in paths:
        for row in json.loads(path.read_text(encoding="utf-8"))["rows"]:
            cell = values[(row["prompt"], int(row["concurrency"]), row["system"])]
            for k, v in row.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    cell[k].append(float(v))
    return {key: {k: statistics.median(vs) for k, vs in cell.items()} for key, cell in values.items()}


def table(cells: dict[tuple[str, int, str], dict[str, float]], runs: int) -> str:
    order: list[tuple[str, int]] = []
    for prompt, conc, _ in cells:
        if (prompt, conc) not in order:
            order.append((prompt, conc))
    has_base = any(system == BASE for _, _, system in cells)
    head = [
        "workload",
        "streams",
        "req/s N / V (ratio)",
        "router CPU ms/req N / V (ratio)",
        *(["N before (ratio N / before)"] if has_base else []),
        "µs/token N / V",
        "TTFT p99 ms N / V (ratio)",
        "engines CPU ms/req N / V",
        "kernel share N / V",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}" if b else "—"

    for prompt, conc in order:
        n, v = cells.get((prompt, conc, N)), cells.get((prompt, conc, V))
        if n is None or v is None:
            continue
        base = cells.get((prompt, conc, BASE))
        row: list[Any] = [
            prompt,
            conc,
            f"{n['rps']:.0f} / {v['rps']:.0f} ({ratio(n['rps'], v['rps'])})",
            f"{n['cpu_ms_per_req']:.2f} / {v['cpu_ms_per_req']:.2f} "
            f"({ratio(n['cpu_ms_per_req'], v['cpu_ms_per_req'])})",
        ]
        if has_base:
            row.append(
                f"{base['cpu_ms_per_req']:.2f} ({ratio(n['cpu_ms_per_req'], base['cpu_ms_per_req'])})"
                if base
                else "—"
            )
        row += [
            f"{n['cpu_us_per_token']:.1f} / {v['cpu_us_per_token']:.1f}",
            f"{n['ttft_p99_ms']:.0f} / {v['ttft_p99_ms']:.0f} ({ratio(n['ttft_p99_ms'], v['ttft_p99_ms'])})",
            f"{n['engine_cpu_ms_per_req']:.2f} / {v['engine_cpu_ms_per_req']:.2f}",
            f"{n['router_sys_share']:.0%} / {v['router_sys_share']:.0%}",
        ]
        lines.append("| " + " | ".join(str(x) for x in row) + " |")
    errors = sum(int(c.get("errors", 0)) for c in cells.values())
    lines.append("")
    lines.append(
        f"N = narwhal, V = vllm-router; medians of {runs} runs' repetitions pooled; errors: {errors}."
    )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="pd_routers.py result files (.json)")
    a = ap.parse_args()
    print(table(pooled(a.runs), len(a.runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
