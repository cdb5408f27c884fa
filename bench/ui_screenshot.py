"""Screenshot of a restart workflow's page in the Temporal UI (headless Chromium).

    python bench/ui_screenshot.py                       # own stack: narwhal-up mid-restart
    python bench/ui_screenshot.py --ui-url http://127.0.0.1:8233 --address 127.0.0.1:7233

Without ``--ui-url`` it starts ``narwhal-up --keep-running`` (8 engines, rolling restart, default
demo timings so the restart runs long enough to be caught in progress) on ports from ``--base-port``, waits until the
restart is under way, shoots the workflow page (summary, details and the live current details:
one line per engine), then stops narwhal-up with SIGINT (by PID) and waits for it to exit.

Needs the Debian package ``chromium`` (``apt-get install -y --no-install-recommends chromium``).
Output: ``bench/results/temporal-ui-workflow.png`` (the workflow's User Metadata tab: summary,
details, current details) and ``temporal-ui-workflow-overview.png`` (status, input, timeline);
``--out docs/images/temporal-ui-restart.png`` for the picture in the operator guide.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "results" / "temporal-ui-workflow.png"
WORKFLOW_ID = "narwhal-restart-narwhal-up"


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    sys.exit("chromium not found: apt-get install -y --no-install-recommends chromium")


def screenshot(url: str, out: Path, budget_ms: int = 2000, wait_text: str = "narwhal") -> None:
    """Render ``url`` at 1400×1000 into ``out`` through the DevTools protocol: headless Chromium
    with a debugging port on loopback; navigate, wait until the page shows ``wait_text``
    (bounded), let it settle ``budget_ms``, capture. (``--screenshot`` with a virtual time budget
    never finishes on the pages of running workflows, which keep polling.)"""
    import asyncio

    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="narwhal-chromium-") as profile:
        port = _free_port()
        cmd = [
            chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--no-first-run", "--disable-dev-shm-usage",
            f"--user-data-dir={profile}", "--remote-debugging-address=127.0.0.1",
            f"--remote-debugging-port={port}", "--window-size=1400,1000", "--hide-scrollbars", "about:blank",
        ]  # fmt: skip
        proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        try:
            png = asyncio.run(_capture(port, url, budget_ms / 1000, wait_text))
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    out.write_bytes(png)
    print(f"screenshot of {url} -> {out} ({out.stat().st_size} bytes)")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _capture(port: int, url: str, settle_s: float, wait_text: str, max_wait_s: float = 90.0) -> bytes:
    import asyncio
    import base64
    import itertools
    import json

    import aiohttp

    async with aiohttp.ClientSession() as http:
        ws_url = ""
        for _ in range(300):  # chromium starting (bounded: 30 s)
            try:
                async with http.get(f"http://127.0.0.1:{port}/json/list") as r:
                    pages = [t for t in await r.json() if t.get("type") == "page"]
                    if pages:
                        ws_url = pages[0]["webSocketDebuggerUrl"]
                        break
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
        if not ws_url:
            raise RuntimeError("chromium's DevTools endpoint never answered")
        async with http.ws_connect(ws_url, max_msg_size=0) as ws:
            calls = itertools.count(1)

            async def call(method: str, **params: object) -> dict[str, object]:
                n = next(calls)
                await ws.send_str(json.dumps({"id": n, "method": method, "params": params}))
                async for msg in ws:
                    data = json.loads(msg.data)
                    if data.get("id") == n:
                        if "error" in data:
                            raise RuntimeError(f"{method}: {data['error']}")
                        result: dict[str, object] = data.get("result", {})
                        return result
                raise RuntimeError(f"{method}: DevTools connection closed")

            await call(
                "Emulation.setDeviceMetricsOverride",
                width=1400,
                height=1000,
                deviceScaleFactor=1,
                mobile=False,
            )
            await call("Page.navigate", url=url)
            # wait (bounded) until the page shows the workflow's own text, then let it settle: the UI
            # fetches and renders asynchronously (this is a picture for people, not a test)
            probe = f"document.body && document.body.innerText.includes({json.dumps(wait_text)})"
            for _ in range(int(max_wait_s / 0.5)):
                res = await call("Runtime.evaluate", expression=probe, returnByValue=True)
                value = res.get("result")
                if isinstance(value, dict) and value.get("value") is True:
                    break
                await asyncio.sleep(0.5)
            await asyncio.sleep(settle_s)
            shot = await call("Page.captureScreenshot", format="png")
            return base64.b64decode(str(shot["data"]))


def run_id(address: str, workflow_id: str) -> str:
    """The current run of ``workflow_id`` (the UI's per-run tabs need it)."""
    import asyncio

    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from workflows.client import connect

    async def describe() -> str:
        client = await connect(address, "default")
        desc = await client.get_workflow_handle(workflow_id).describe()
        return desc.run_id

    return asyncio.run(describe())


def shoot_workflow(ui: str, address: str, workflow_id: str, out: Path, budget_ms: int) -> None:
    """The "User Metadata" tab (summary, details, live current details) to ``out``; the default
    workflow page (status, input/result, timeline) next to it as ``<out>-overview.png``."""
    base = f"{ui.rstrip('/')}/namespaces/default/workflows/{workflow_id}"
    screenshot(
        f"{base}/{run_id(address, workflow_id)}/user-metadata", out, budget_ms, wait_text="restarted, "
    )
    screenshot(base, out.with_name(out.stem + "-overview.png"), budget_ms)


def wait_for(log: Path, text: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"narwhal-up exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        time.sleep(0.1)
    raise TimeoutError(f"narwhal-up never printed {text!r}:\n{log.read_text()[-3000:]}")


def own_stack(args: argparse.Namespace) -> None:
    state = Path(args.state_dir)
    state.mkdir(parents=True, exist_ok=True)
    log = state / "narwhal-up.out"
    cmd = [
        str(Path(sys.executable).parent / "narwhal-up"), "--engines", str(args.engines), "--restart", "rolling",
        "--keep-running", "--base-port", str(args.base_port), "--state-dir", str(state),
    ]  # fmt: skip
    with log.open("wb") as out:
        up = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        ui = f"http://127.0.0.1:{args.base_port + 3}"  # fleet/up/ports.py: ui = base + 3
        address = f"127.0.0.1:{args.base_port}"
        wait_for(log, "narwhal-up: ready", up, 300)
        # mid-restart: the first engine is done, the next in progress → live "current details"
        wait_for(log, "[restart] running: restarting e1", up, 300)
        shoot_workflow(ui, address, WORKFLOW_ID, Path(args.out), args.budget_ms)
        wait_for(log, "narwhal-up summary", up, 300)
    finally:
        if up.poll() is None:
            os.kill(up.pid, signal.SIGINT)
            try:
                up.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(up.pid, signal.SIGKILL)
                up.wait(timeout=10)
    print(f"narwhal-up exited with {up.returncode}; its output: {log}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ui-url", default="", help="a running Temporal UI (skip starting narwhal-up)")
    ap.add_argument("--workflow-id", default=WORKFLOW_ID)
    ap.add_argument("--address", default="", help="Temporal frontend of --ui-url (default: UI port - 1000)")
    ap.add_argument("--engines", type=int, default=8, help="engines of the own stack (more = longer restart)")
    ap.add_argument("--base-port", type=int, default=27233, help="ports of the own narwhal-up stack")
    ap.add_argument("--state-dir", default=str(REPO / "runs" / "ui-screenshot"))
    ap.add_argument(
        "--budget-ms", type=int, default=2000, help="settle time once the page shows the workflow"
    )
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    if args.ui_url:
        port = int(args.ui_url.rstrip("/").rsplit(":", 1)[1])
        address = args.address or f"127.0.0.1:{port - 1000}"
        shoot_workflow(args.ui_url, address, args.workflow_id, Path(args.out), args.budget_ms)
    else:
        own_stack(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
