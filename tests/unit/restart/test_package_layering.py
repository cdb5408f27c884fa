"""The restart orchestration's import rule: the documents both sides share live in narwhal_models,
activities never import workflows, and narwhal_models imports only the standard library and
pydantic (workflow code imports it; docs/architecture.md, "Restart orchestration")."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _imports(package: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted((REPO / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
        found[str(path.relative_to(REPO))] = names
    return found


def _top(name: str) -> str:
    return name.split(".", 1)[0]


def test_activities_never_import_the_workflows_package() -> None:
    offenders = {
        path: sorted(n for n in names if _top(n) == "workflows")
        for path, names in _imports("activities").items()
        if any(_top(n) == "workflows" for n in names)
    }
    assert offenders == {}


def test_shared_models_import_only_the_standard_library_pydantic_and_themselves() -> None:
    allowed = set(sys.stdlib_module_names) | {"pydantic", "narwhal_models"}
    offenders = {
        path: sorted(n for n in names if _top(n) not in allowed)
        for path, names in _imports("narwhal_models").items()
        if any(_top(n) not in allowed for n in names)
    }
    assert offenders == {}
    assert len(_imports("narwhal_models")) >= 3  # __init__, restart, evidence: the walk saw them
