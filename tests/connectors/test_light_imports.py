"""The connector's modules load inside vLLM's processes: nothing of the daemon comes with them.

Every module of agentpark.connectors is walked (a new one is covered without being listed).
What a module loads is read from the sources (the import statements that run when it is
imported, followed through agentpark's own modules): vLLM and torch are not installed in
this venv, so the modules that need them cannot be imported here. Where every library a
module needs is installed, a fresh interpreter imports it too and must agree.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import pkgutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

import agentpark
import agentpark.connectors

ROOT = Path(agentpark.__file__).parent
MODULES = sorted(
    f"agentpark.connectors.{info.name}"
    for info in pkgutil.iter_modules(agentpark.connectors.__path__)
)

HEAVY = ("fastapi", "starlette", "uvicorn", "sqlalchemy", "alembic")
"""Libraries of the daemon's HTTP side and store: never in vLLM's processes."""
SHARED = ("agentpark", "agentpark.connectors", "agentpark.blocks", "agentpark.errors")
"""What any connector module may load of agentpark besides its own package."""
POOL_FILE = (
    "agentpark.integrity",
    "agentpark.enums",
    "agentpark.tiers",
    "agentpark.tiers.base",
    "agentpark.tiers.slots",
)
FILE_FORMAT = (
    "agentpark.tiers.filetier",
    "agentpark.tiers.header",
    "agentpark.tiers.filecheck",
    "agentpark.tiers.aside",
)
ASIDE = ("agentpark.tiers", "agentpark.tiers.aside")
POOL_FILE_READERS = {
    "agentpark.connectors.pool": (*POOL_FILE, *FILE_FORMAT),
    "agentpark.connectors.torch_copies": (*POOL_FILE, *FILE_FORMAT),
    "agentpark.connectors.tpu": ASIDE,
    "agentpark.connectors.tpu_sync_manager": ASIDE,
    "agentpark.connectors.tpu_sync_shm": ASIDE,
}
"""The torch worker maps the pool file: its header's format, its checks and the checksum
are shared; TPU Sync's shm segments are moved aside the one way every file is."""
JAX_PATH = {"agentpark.connectors.tpu", "agentpark.connectors.tpu_sync_manager"}
"""The TPU worker (loaded only by ``register_runner``) and what it shares with the daemon."""


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _source(module: str) -> Path | None:
    """The file of an agentpark module or package, None for anything else."""
    if module != "agentpark" and not module.startswith("agentpark."):
        return None
    base = ROOT.joinpath(*module.split(".")[1:])
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


def _load_time_imports(module: str) -> set[str]:
    """Modules that importing ``module`` imports directly: not under TYPE_CHECKING, not
    inside a function (a lazy import is the point of one), parents of each included."""
    path = _source(module)
    assert path is not None, module
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    pending: list[ast.stmt] = list(ast.parse(path.read_text()).body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            names.add(base)
            names.update(
                f"{base}.{alias.name}"
                for alias in node.names
                if _source(f"{base}.{alias.name}") is not None
            )
        elif isinstance(node, ast.If):
            pending.extend(node.orelse if _is_type_checking(node) else [*node.body, *node.orelse])
        elif isinstance(node, ast.Try):
            pending.extend([*node.body, *node.orelse, *node.finalbody])
            for handler in node.handlers:
                pending.extend(handler.body)
        elif isinstance(node, ast.With | ast.ClassDef):
            pending.extend(node.body)  # run at import (a function's body is not)
    with_parents: set[str] = set()
    for name in names:
        parts = name.split(".")
        with_parents.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    return with_parents - {"__future__"}


@cache
def loads(module: str) -> frozenset[str]:
    """Every module importing ``module`` loads, followed through agentpark's sources."""
    seen: set[str] = set()
    parts = module.split(".")
    todo = [".".join(parts[: i + 1]) for i in range(len(parts))]  # its packages run first
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if _source(name) is not None:
            todo.extend(_load_time_imports(name))
    return frozenset(seen)


def _problems(module: str, loaded: frozenset[str] | set[str]) -> list[str]:
    allowed = (*SHARED, *POOL_FILE_READERS.get(module, ()))
    problems = [m for m in loaded if m.split(".")[0] in HEAVY]
    if module not in JAX_PATH:
        problems += [m for m in loaded if m.split(".")[0] == "jax"]
    problems += [
        m
        for m in loaded
        if m.startswith("agentpark.")
        and m not in allowed
        and not m.startswith("agentpark.connectors.")
    ]
    return sorted(problems)


def test_the_walk_finds_every_connector_module() -> None:
    files = {p.stem for p in Path(agentpark.connectors.__path__[0]).glob("*.py")} - {"__init__"}
    assert {m.rpartition(".")[2] for m in MODULES} == files
    for named in [*POOL_FILE_READERS, *JAX_PATH]:  # an exception must name a real module
        assert named in MODULES, named


@pytest.mark.parametrize("module", MODULES)
def test_a_connector_module_loads_nothing_of_the_daemon(module: str) -> None:
    assert _problems(module, loads(module)) == [], (
        f"{module} loads {_problems(module, loads(module))}"
    )


def _missing_here(module: str) -> list[str]:
    """The libraries ``module`` loads that this venv lacks."""
    libraries = {m.split(".")[0] for m in loads(module)} - {"agentpark"}
    return sorted(lib for lib in libraries if importlib.util.find_spec(lib) is None)


LOADABLE_HERE = [m for m in MODULES if not _missing_here(m)]


def test_only_vllm_and_torch_keep_a_module_from_loading_here() -> None:
    for module in MODULES:
        assert set(_missing_here(module)) <= {"vllm", "torch"}, module
    assert {"agentpark.connectors.tpu", "agentpark.connectors.scheduler"} <= set(LOADABLE_HERE)


@pytest.mark.parametrize("module", LOADABLE_HERE)
def test_a_fresh_interpreter_agrees_with_the_walk(module: str) -> None:
    probe = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    loaded = set(json.loads(done.stdout))
    assert _problems(module, loaded) == [], f"{module} pulls in {_problems(module, loaded)}"
    ours = {m for m in loaded if m == "agentpark" or m.startswith("agentpark.")}
    assert ours <= loads(module), f"the source walk missed {sorted(ours - loads(module))}"


def test_the_walk_and_the_probe_see_a_heavy_import() -> None:
    assert {"sqlalchemy", "agentpark.parking"} <= loads("agentpark.control.vllm")
    assert "jax" in loads("agentpark.dma.tpu_sync")
    probe = "import sys, agentpark.control.vllm; print('sqlalchemy' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "True"
