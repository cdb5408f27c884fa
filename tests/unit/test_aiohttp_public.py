"""The router uses aiohttp only through its public API (issue 25), so an aiohttp release inside the
pinned range cannot silently break the graceful stop, the connection bound or the hand-off.

A static check over ``router/``:

- no ``obj._x`` where ``_x`` is a private name found in aiohttp's source (``self._x`` stays ours);
- no ``getattr`` / ``hasattr`` / ``setattr`` with a private name at all;
- no connection protocol of ours defines what aiohttp's server modules read off the objects they
  are given (impersonating aiohttp's ``RequestHandler``: ``_task_handler``);
- no class subclasses an aiohttp class (its ``self._x`` would be aiohttp's: ``GuardedSite``);
- imports from aiohttp name public modules and the names they export.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from functools import cache
from pathlib import Path

import aiohttp
import pytest

ROOT = Path(__file__).resolve().parents[2]
ROUTER = ROOT / "router"


# aiohttp's server modules: what they read off the connections and sites they are given is what a
# class impersonating a connection or a site would have to define
SERVER_MODULES = ("web_server.py", "web_runner.py", "web_protocol.py")


@cache
def aiohttp_private_names() -> tuple[frozenset[str], frozenset[str]]:
    """(every ``_x`` in aiohttp's source, the ``_x`` its server modules read off other objects)."""
    every: set[str] = set()
    foreign: set[str] = set()
    for path in Path(aiohttp.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                every.add(node.attr)
                on_self = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
                if not on_self and path.name in SERVER_MODULES:
                    foreign.add(node.attr)
    return frozenset(every), frozenset(foreign)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def router_trees() -> list[tuple[str, ast.Module]]:
    return [
        (str(p.relative_to(ROOT)), ast.parse(p.read_text(encoding="utf-8")))
        for p in sorted(ROUTER.rglob("*.py"))
    ]


def aiohttp_aliases(tree: ast.Module) -> set[str]:
    """Local names bound to aiohttp modules or classes (``web``, ``aiohttp``, ``RequestHandler``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("aiohttp")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("aiohttp"):
            names |= {a.asname or a.name for a in node.names}
    return names


def private_uses(where: str, tree: ast.Module) -> list[str]:
    aiohttp_names, foreign = aiohttp_private_names()
    found: list[str] = []
    for node in ast.walk(tree):
        line = f"{where}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.ClassDef) and any(
            isinstance(f, ast.FunctionDef) and f.name == "connection_made" for f in node.body
        ):  # a connection protocol: it must not define what aiohttp's server reads off its own
            for sub in ast.walk(node):
                if (
                    isinstance(sub, ast.Attribute)
                    and isinstance(sub.ctx, ast.Store)
                    and isinstance(sub.value, ast.Name)
                    and sub.value.id == "self"
                    and sub.attr in foreign
                ):
                    found.append(
                        f"{where}:{sub.lineno}: defines self.{sub.attr}, which aiohttp's server reads"
                    )
        if isinstance(node, ast.Attribute) and _private(node.attr) and node.attr in aiohttp_names:
            target = node.value
            if not (isinstance(target, ast.Name) and target.id in ("self", "cls")):
                found.append(f"{line}: reads .{node.attr} off another object (aiohttp has that private name)")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
        ):
            found.append(f"{line}: {node.func.id}(…, {node.args[1].value!r})")
    return found


def aiohttp_subclasses(where: str, tree: ast.Module) -> list[str]:
    aliases = aiohttp_aliases(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                root = base
                while isinstance(root, ast.Attribute):
                    root = root.value
                if isinstance(root, ast.Name) and root.id in aliases:
                    found.append(f"{where}:{node.lineno}: class {node.name}({ast.unparse(base)})")
    return found


def import_problems(where: str, tree: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("aiohttp"):
            module = node.module or ""
            if any(_private(part) or part.startswith("_") for part in module.split(".")):
                found.append(f"{where}:{node.lineno}: from {module} (a private module)")
                continue
            exported = getattr(importlib.import_module(module), "__all__", None)
            for alias in node.names:
                package = hasattr(importlib.import_module(module), "__path__")
                submodule = package and importlib.util.find_spec(f"{module}.{alias.name}") is not None
                if alias.name.startswith("_") or (
                    exported is not None and alias.name not in exported and not submodule
                ):
                    found.append(f"{where}:{node.lineno}: {alias.name} is not exported by {module}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("aiohttp") and any(p.startswith("_") for p in alias.name.split(".")):
                    found.append(f"{where}:{node.lineno}: import {alias.name} (a private module)")
    return found


def test_the_router_reads_no_private_aiohttp_attribute_and_defines_none_for_aiohttp() -> None:
    problems = [p for where, tree in router_trees() for p in private_uses(where, tree)]
    assert problems == []


def test_no_router_class_subclasses_an_aiohttp_class() -> None:
    problems = [p for where, tree in router_trees() for p in aiohttp_subclasses(where, tree)]
    assert problems == []


def test_the_router_imports_only_exported_names_of_public_aiohttp_modules() -> None:
    problems = [p for where, tree in router_trees() for p in import_problems(where, tree)]
    assert problems == []


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("n = getattr(handler, '_request_count', 1)", "getattr(…, '_request_count')"),
        ("server = site._runner.server", "reads ._runner off another object"),
        (
            "class P:\n    def __init__(self):\n        self._task_handler = None\n"
            "    def connection_made(self, transport):\n        pass",
            "defines self._task_handler",
        ),
    ],
)
def test_the_check_finds_what_the_router_used_to_do(source: str, problem: str) -> None:
    found = private_uses("x.py", ast.parse(source))
    assert len(found) == 1 and problem in found[0]


def test_the_check_finds_a_subclass_and_a_private_import() -> None:
    tree = ast.parse(
        "from aiohttp import web\nfrom aiohttp.web_protocol import _RequestHandler\n"
        "class GuardedSite(web.TCPSite):\n    pass\n"
    )
    assert aiohttp_subclasses("x.py", tree) == ["x.py:3: class GuardedSite(web.TCPSite)"]
    assert import_problems("x.py", tree) == [
        "x.py:2: _RequestHandler is not exported by aiohttp.web_protocol"
    ]
