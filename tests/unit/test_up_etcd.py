"""narwhal-up --etcd: the etcd ports join the plan only when asked, and the routers lease through etcd."""

from __future__ import annotations

from pathlib import Path

from fleet.up.main import build_parser, timings_from
from fleet.up.ports import plan_ports
from fleet.up.stack import Stack


def test_etcd_ports_are_planned_only_with_etcd() -> None:
    plain = {what for what, _, _ in plan_ports(30000, 2, {}).named()}
    assert "etcd_client" not in plain and "etcd_peer" not in plain
    ports = plan_ports(30000, 2, {"etcd_client": 31999}, with_etcd=True)
    named = {what: port for what, port, _ in ports.named()}
    assert named["etcd_client"] == 31999 and named["etcd_peer"] == 30008


def test_router_pair_leases_through_etcd(tmp_path: Path) -> None:
    args = build_parser().parse_args(["--etcd", "--fast", "--base-port", "30000", "--fleet-name", "demo"])
    ports = plan_ports(args.base_port, 2, {}, with_etcd=args.etcd)
    stack = Stack(tmp_path, ports, timings_from(args), args.fleet_name, etcd=True)
    router = stack._router_args("primary", ports.router)
    assert router[router.index("--etcd-endpoints") + 1] == "http://127.0.0.1:30007"
    assert router[router.index("--etcd-prefix") + 1] == "/narwhal/demo/"
    assert "--lease-path" not in router
    assert stack.stale_lease_wait() == 0.0
    file_stack = Stack(tmp_path, plan_ports(30000, 2, {}), timings_from(args), "demo")
    assert "--lease-path" in file_stack._router_args("primary", ports.router)
