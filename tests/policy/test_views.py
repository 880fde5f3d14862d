"""What parking and policy share lives below both (agentpark.views): arrows point down."""

from __future__ import annotations

import ast
from pathlib import Path

import agentpark
from agentpark.enums import State
from agentpark.views import SessionView, least_recently_used

ROOT = Path(agentpark.__file__).parent


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_no_parking_module_imports_the_policy() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}: {module}"
        for path in sorted((ROOT / "parking").rglob("*.py"))
        for module in _imports(path)
        if module.startswith("agentpark.policy")
    ]
    assert offenders == []


def test_views_import_nothing_above_the_enums() -> None:
    ours = {m for m in _imports(ROOT / "views.py") if m.startswith("agentpark")}
    assert ours <= {"agentpark.enums", "agentpark.store.models"}  # the latter for typing only


def _view(key: str, last: float, blocks: int, busy: bool = False) -> SessionView:
    return SessionView(("t", key), State.ACTIVE, None, blocks, blocks * 10, last, busy)


def test_least_recently_used_takes_idle_sessions_oldest_first_until_enough() -> None:
    views = [_view("new", 3.0, 4), _view("old", 1.0, 2), _view("busy", 0.0, 9, busy=True)]
    assert [v.key[1] for v in least_recently_used(views, 2)] == ["old"]
    assert [v.key[1] for v in least_recently_used(views, 3)] == ["old", "new"]
    assert [v.key[1] for v in least_recently_used(views, 50)] == ["old", "new"]
