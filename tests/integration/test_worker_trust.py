"""The worker as a trust boundary (issue 23): restart commands run without a shell, engine ids are
validated at every entry point, and workflow input names routers and templates of the worker's
own configuration — never a command, a token or a token destination.

Real processes and files: every command is a real process (a recorder script that writes the argv
it received), a marker file that an injected ``touch`` would create is checked never to appear;
the refusals run on a real ``narwhal-worker`` against a real router stack with a control token.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.commands import Values, render_exec, render_shell
from activities.supervisor import SupervisorActivities, command_argv
from activities.worker_config import (
    CommandTemplate,
    Refused,
    RouterEntry,
    WorkerConfig,
    WorkerSettings,
    resolve_template,
)
from narwhal_models.restart import (
    EngineProgress,
    EngineRestartInput,
    EngineTarget,
    RestartPlan,
    RestartResult,
    RouterRef,
    SupervisorRef,
    engine_workflow_id,
    fleet_workflow_id,
)
from tests.integration.conftest import Temporal, start_worker, wait_ready_line
from tests.integration.restart_support import (
    FAST,
    cli,
    new_fleet,
    supervisor_restarts,
)
from tests.support.lifecycle import start_stack
from tests.support.procs import proc_group
from workflows.outcome import final_result
from workflows.steps import cause_message

pytestmark = pytest.mark.integration

PEER = Path(__file__).resolve().parents[1] / "fixtures" / "peer_examples"
RECORDER = """
import json, sys
with open(sys.argv[1], "a") as f:
    f.write(json.dumps(sys.argv[2:]) + "\\n")
"""
# ssh as far as quoting goes: options, `--`, the destination, then the remote command joined by
# spaces and parsed by the remote user's shell (here: the local sh).
FAKE_SSH = """#!/bin/sh
while [ $# -gt 0 ]; do
  case "$1" in
    -o) shift 2 ;;
    --) shift; break ;;
    -*) shift ;;
    *) break ;;
  esac
done
shift  # the destination
exec /bin/sh -c "$*"
"""


class Lab:
    """A recorder command, its log and the marker an injection would create."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.marker = tmp / "INJECTED"
        self.log = tmp / "argv.jsonl"
        self.recorder = tmp / "record.py"
        self.recorder.write_text(RECORDER)
        self.rec = f"{sys.executable} {self.recorder} {self.log}"
        self.bin = tmp / "bin"
        self.bin.mkdir()
        ssh = self.bin / "ssh"
        ssh.write_text(FAKE_SSH)
        ssh.chmod(0o755)

    def calls(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def run(self, argv: list[str]) -> None:
        env = {"PATH": f"{self.bin}:{os.environ['PATH']}"}
        subprocess.run(argv, env=env, check=False, timeout=30, capture_output=True)


def supervisor(lab: Lab, **templates: CommandTemplate) -> SupervisorActivities:
    """The worker's restart activities; the engine never answers /metrics (the command runs)."""
    http = httpx.AsyncClient(transport=httpx.MockTransport(lambda req: httpx.Response(503)))
    settings = WorkerSettings.of(WorkerConfig(templates=templates))
    return SupervisorActivities(http, settings, env={"PATH": f"{lab.bin}:{os.environ['PATH']}"})


def target(iid: str, url: str, template: str = "restart") -> EngineTarget:
    sup = SupervisorRef(backend="command", template=template)
    return EngineTarget(iid=iid, url=url, old_process_start=100.0, supervisor=sup)


async def test_an_id_holding_url_and_a_url_holding_a_semicolon_run_nothing(tmp_path: Path) -> None:
    lab = Lab(tmp_path)
    touch = f"http://h:1/;touch {lab.marker}"
    acts = supervisor(lab, restart=CommandTemplate(command=f"{lab.rec} {{iid}} {{url}}"))
    with pytest.raises(ApplicationError, match=re.escape("engine id 'x{url}' refused")) as err:
        await ActivityEnvironment().run(acts.restart_engine, target("x{url}", touch))
    assert err.value.type == "WorkerRefused" and err.value.non_retryable
    with pytest.raises(ApplicationError, match=re.escape(f"URL of e0 {touch!r} refused")):
        await ActivityEnvironment().run(acts.restart_engine, target("e0", touch))
    assert lab.calls() == []  # refused before anything ran
    # below the validation: one pass, one argument per placeholder — the values stay literal
    argv = render_exec(CommandTemplate(command=f"{lab.rec} {{iid}} {{url}}").argv(), Values("x{url}", touch))
    lab.run(argv)
    assert lab.calls() == [["x{url}", touch]]
    assert not lab.marker.exists()
    # and a good engine runs the template
    out = await ActivityEnvironment().run(acts.restart_engine, target("e0", "http://h:1"))
    assert out.restarted and lab.calls()[-1] == ["e0", "http://h:1"]


async def test_a_quoted_placeholder_in_a_shell_template_is_refused_and_values_stay_literal(
    tmp_path: Path,
) -> None:
    lab = Lab(tmp_path)
    with pytest.raises(ValidationError, match=re.escape("{iid} inside quotes in 'echo \"{iid}\"'")):
        CommandTemplate(command='echo "{iid}"', shell=True)
    payload = f"$(touch {lab.marker})"
    with pytest.raises(ApplicationError, match=re.escape(f"engine id {payload!r} refused")):
        acts = supervisor(lab, restart=CommandTemplate(command=f'{lab.rec} "{{iid}}"'))
        await ActivityEnvironment().run(acts.restart_engine, target(payload, "http://h:1"))
    # exec mode: the quotes are the template's own, the value is one literal argument
    lab.run(render_exec(CommandTemplate(command=f'{lab.rec} "{{iid}}"').argv(), Values(payload, "")))
    # shell mode (worker configuration only): every value substituted quoted
    shell = CommandTemplate(command=f"{lab.rec} {{iid}} {{url}}", shell=True)
    lab.run(command_argv(shell, payload, "http://h:1"))
    lab.run(["/bin/sh", "-c", render_shell(shell.command, Values(payload, ""))])
    assert lab.calls() == [[payload], [payload, "http://h:1"], [payload, ""]]
    assert not lab.marker.exists()


async def test_the_documented_ssh_template_cannot_be_reparsed_on_the_remote_side(tmp_path: Path) -> None:
    lab = Lab(tmp_path)
    documented = f"ssh -o BatchMode=yes -- {{host}} {lab.rec} restart vllm@{{iid!q}}"  # docs/deployment.md
    acts = supervisor(lab, restart=CommandTemplate(command=documented))
    out = await ActivityEnvironment().run(acts.restart_engine, target("e0", "http://gpu-0:8000"))
    assert out.restarted and lab.calls() == [["restart", "vllm@e0"]]
    hostile = Values(f"e0;touch {lab.marker}", "http://gpu-0:8000")
    lab.run(render_exec(CommandTemplate(command=documented).argv(), hostile))
    assert lab.calls()[-1] == ["restart", f"vllm@e0;touch {lab.marker}"]  # one literal word remotely
    assert not lab.marker.exists()
    # the same shape without !q is what the remote shell re-parses: the fake ssh is faithful
    unquoted = CommandTemplate(command=f"ssh -- {{host}} {lab.rec} restart vllm@{{iid}}")
    lab.run(render_exec(unquoted.argv(), hostile))
    assert lab.marker.exists(), "control: an unquoted value through ssh is re-parsed"


class HostileRouter:
    """A lifecycle API whose documents name engines by hostile ids (targets, or lifecycle)."""

    def __init__(self, targets: list[dict[str, Any]], lifecycle_doc: dict[str, Any]) -> None:
        handoff = json.loads((PEER / "handoff_initial.json").read_text())
        docs = {
            "/narwhal/targets": targets,
            "/narwhal/lifecycle": lifecycle_doc,
            "/narwhal/handoff": handoff.get("body", handoff),
        }

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = json.dumps(docs.get(self.path, {})).encode()
                self.send_response(200 if self.path in docs else 404)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    @contextmanager
    def running(self) -> Iterator[HostileRouter]:
        thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.server.shutdown()
            self.server.server_close()


def peer_lifecycle(rename: dict[str, str] | None = None) -> dict[str, Any]:
    doc = json.loads((PEER / "lifecycle_initial.json").read_text())
    doc = doc.get("body", doc)
    doc["router"]["controls_fleet"] = True
    for old, new in (rename or {}).items():
        doc["engines"][new] = doc["engines"].pop(old)
    return dict(doc)


async def test_an_engine_id_served_by_a_router_is_refused_by_name(temporal: Temporal, tmp_path: Path) -> None:
    lab = Lab(tmp_path)
    groups = [{"targets": ["127.0.0.1:9"], "labels": {"iid": i}} for i in ("e0", "e1")]
    groups.append({"targets": [f"127.0.0.1:9;touch {lab.marker}"], "labels": {"iid": "x{url}"}})
    with HostileRouter(groups, peer_lifecycle()).running() as router:
        r = cli(temporal, "start", "--router", router.url, "--supervisor", "command", "--engines", "e0")
        assert r.returncode == 2, r.stdout + r.stderr
        assert "engine id 'x{url}' refused" in r.stderr, r.stderr
    hostile_id = f"e0;touch {lab.marker}"
    with HostileRouter([], peer_lifecycle({"e0": hostile_id})).running() as router:
        r = cli(temporal, "start", "--router", router.url, "--supervisor", "command", "--engines", "e1")
        assert r.returncode == 2 and f"engine id {hostile_id!r} refused" in r.stderr, r.stderr
    assert not lab.marker.exists()


# -- a real worker against a real router with a control token ------------------------------------

TOKEN_ENV = "NARWHAL_TRUST_TOKEN"
ENV_DUMP = """
import json, os, sys
import httpx
out, sup = sys.argv[1:3]
with open(out, "w") as f:
    json.dump(dict(os.environ), f)
httpx.post(f"{sup}/engines/{os.environ['NARWHAL_ENGINE_ID']}/restart", json={}, timeout=60).raise_for_status()
"""


class Listener:
    """An HTTP listener a hostile workflow names as its router: counts what reaches it."""

    def __init__(self) -> None:
        self.requests: list[dict[str, str]] = []
        seen = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append(dict(self.headers))
                self.send_response(404)
                self.send_header("content-length", "0")
                self.end_headers()

            do_POST = do_GET

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def test_workflow_input_cannot_name_a_command_a_router_or_a_token_and_the_command_sees_no_token(
    temporal: Temporal, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = uuid.uuid4().hex
    monkeypatch.setenv(TOKEN_ENV, token)  # the router's process reads it
    lab = Lab(tmp_path)
    dump = tmp_path / "env.json"
    helper = tmp_path / "env_dump.py"
    helper.write_text(ENV_DUMP)
    queue = f"trust-{uuid.uuid4().hex[:8]}"
    listener = Listener()
    with proc_group(tmp_path) as group:
        s = start_stack(
            group, tmp_path, n=3, extra={"control": {"token_env": TOKEN_ENV, "protect_reads": True}}
        )
        config = tmp_path / "worker.json"
        cfg = WorkerConfig(
            routers={"stack": RouterEntry(urls=[s.router.url], token_env=TOKEN_ENV)},
            templates={
                "restart": CommandTemplate(command=f"{sys.executable} {helper} {dump} {s.supervisor}")
            },
        )
        config.write_text(cfg.model_dump_json(by_alias=True))
        worker = start_worker(group, temporal, queue, config=config, env={TOKEN_ENV: token})
        wait_ready_line(worker)

        def rolling(router: RouterRef, sup: SupervisorRef) -> RestartPlan:
            return RestartPlan(
                fleet=new_fleet("trust"), router=router, supervisor=sup, engines=["e1"],
                engine_urls={"e1": s.url("e1")}, timing=FAST,
            )  # fmt: skip

        async def start(p: RestartPlan) -> WorkflowHandle[Any, RestartResult]:
            return await temporal.client.start_workflow(
                "RollingRestart",
                p,
                id=fleet_workflow_id(p.fleet),
                task_queue=queue,
                result_type=RestartResult,
            )

        async def run(p: RestartPlan) -> RestartResult:
            """The run's result: a run that did not restart every engine fails, carrying it."""
            return await final_result(await start(p))

        named = RouterRef(name="stack")
        command = SupervisorRef(backend="command")
        # a command in the input: refused by the worker before the drain
        res = await run(rolling(named, SupervisorRef(backend="command", command=f"touch {lab.marker}")))
        assert not res.ok and "workflow input carries a command" in res.engines["e1"].error, res
        # a template the worker does not have
        res = await run(rolling(named, SupervisorRef(backend="command", template="nope")))
        assert not res.ok and "command template 'nope' is not in this worker's" in res.engines["e1"].error
        # routers the worker does not know (by name, by URL), and a token variable in the input
        for ref, why in (
            (RouterRef(name="nope"), "router 'nope' is not in this worker's configuration"),
            (RouterRef(routers=[listener.url]), "are not in this worker's configuration"),
            (RouterRef(name="stack", routers=[listener.url]), "not configured for router stack"),
            (RouterRef(name="stack", token_env="HOME"), "names a token variable"),
        ):
            with pytest.raises(WorkflowFailureError) as err:
                await (await start(rolling(ref, command))).result()
            assert why in cause_message(err.value.cause), err.value.cause
        # an engine restart started directly on the task queue with a hostile id
        iid = f"x{{url}};touch {lab.marker}"
        direct = EngineRestartInput(fleet="trust", iid=iid, router=named, supervisor=command, timing=FAST)
        one: EngineProgress = await temporal.client.execute_workflow(
            "EngineRestart", direct, id=engine_workflow_id("trust", uuid.uuid4().hex[:6]), task_queue=queue,
            result_type=EngineProgress,
        )  # fmt: skip
        assert one.step == "failed" and f"engine id {iid!r} refused" in one.error, one
        # nothing was drained, restarted or run; the listener never heard from the worker
        assert all(
            e["state"] == "active" for e in lifecycle_with_token(s.router.url, token)["engines"].values()
        )
        assert supervisor_restarts(s.supervisor)["e1"] == 0
        assert listener.requests == [] and not lab.marker.exists() and not dump.exists()

        # the configured router and template: restarted; the command's environment holds no token
        res = await run(rolling(named, command))
        assert res.ok and res.engines["e1"].outcome == "restarted", res.message
        env = json.loads(dump.read_text())
        assert token not in json.dumps(env) and TOKEN_ENV not in env
        assert set(env) == {"PATH", "NARWHAL_ENGINE_ID", "NARWHAL_ENGINE_URL"} | _python_added(env)
        assert env["NARWHAL_ENGINE_ID"] == "e1" and env["NARWHAL_ENGINE_URL"] == s.url("e1")
        assert supervisor_restarts(s.supervisor)["e1"] == 1
    listener.close()


def _python_added(env: dict[str, str]) -> set[str]:
    """Variables the interpreter itself may set at start (locale coercion)."""
    return {k for k in env if k in ("LC_CTYPE",)}


def lifecycle_with_token(url: str, token: str) -> dict[str, Any]:
    r = httpx.get(f"{url}/narwhal/lifecycle", headers={"Authorization": f"Bearer {token}"}, timeout=5)
    r.raise_for_status()
    doc: dict[str, Any] = r.json()
    return doc


async def test_other_named_templates_such_as_rollback_run_the_same_way(tmp_path: Path) -> None:
    lab = Lab(tmp_path)
    acts = supervisor(lab, rollback=CommandTemplate(command=f"{lab.rec} rollback {{iid}} {{port}}"))
    cfg = acts.settings.current()
    name, template = resolve_template(cfg, SupervisorRef(backend="command"), name="rollback")
    ran = await ActivityEnvironment().run(acts.run_template, name, template, "e1", "http://gpu-1:8001")
    assert ran.startswith("rollback: ") and lab.calls() == [["rollback", "e1", "8001"]]
    with pytest.raises(ApplicationError, match=re.escape("engine id 'e1;x' refused")):
        await ActivityEnvironment().run(acts.run_template, name, template, "e1;x", "")
    with pytest.raises(Refused, match="command template 'restart' is not in this worker's"):
        resolve_template(cfg, SupervisorRef(backend="command"))
