"""The CLI and bench packages import downwards only: no import circle among their modules,
and no module imports the package it belongs to (the facade that imports it)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agentpark.cli", "agentpark.bench")


def _modules(root: Path, package: str) -> dict[str, Path]:
    """Every module under ``package`` (a dotted name below ``root``): name -> file."""
    base = root.joinpath(*package.split("."))
    found = {}
    for path in sorted(base.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The modules of ``known`` that the module ``name`` imports, at any depth of its code
    (an import inside a function is an arrow too)."""
    is_package = path.name == "__init__.py"
    here = name if is_package else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.add(sub if sub in known else base)
    return {t for t in targets if t in known and t != name}


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    modules: dict[str, Path] = {}
    for package in packages:
        modules.update(_modules(root, package))
    known = set(modules)
    return {name: _imports(path, name, known) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` as ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_the_cli_and_bench_packages_have_no_import_circle() -> None:
    graph = import_graph(ROOT, PACKAGES)
    assert "agentpark.cli.entry" in graph and "agentpark.bench.transfer.run" in graph
    assert "agentpark.bench.transfer.daemon_parts" in graph["agentpark.bench.transfer.measure"]
    assert find_cycle(graph) is None, find_cycle(graph)


def test_no_module_imports_its_own_package() -> None:
    graph = import_graph(ROOT, PACKAGES)
    upward = {
        name: sorted(t for t in targets if name.startswith(t + "."))
        for name, targets in graph.items()
    }
    assert {name: up for name, up in upward.items() if up} == {}


def test_the_walk_finds_a_circle_and_an_upward_arrow(tmp_path: Path) -> None:
    # The shape the agents bench had: agents imported agents_report in a function, and
    # agents_report imported agents at the top.
    bench = tmp_path / "agentpark" / "bench"
    bench.mkdir(parents=True)
    (bench / "__init__.py").write_text("")
    (bench / "agents.py").write_text(
        "def run():\n    from agentpark.bench.agents_report import report\n"
    )
    (bench / "agents_report.py").write_text("from agentpark.bench.agents import Setup\n")
    (bench / "pkg").mkdir()
    (bench / "pkg" / "__init__.py").write_text("from .part import x\n")
    (bench / "pkg" / "part.py").write_text("from agentpark.bench.pkg import y\n")
    graph = import_graph(tmp_path, ("agentpark.bench",))
    assert graph["agentpark.bench.pkg"] == {"agentpark.bench.pkg.part"}
    cycle = find_cycle({k: v for k, v in graph.items() if "pkg" not in k})
    assert cycle is not None and set(cycle) == {
        "agentpark.bench.agents",
        "agentpark.bench.agents_report",
    }
    assert find_cycle({k: v for k, v in graph.items() if "agents" not in k}) is not None
