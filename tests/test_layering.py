"""Dependencies point one way: down the floors below, and the rooms below the core load
without JAX.

Each module of ``agentpark`` sits on one floor; a module may import from its own floor and
those below, never from one above. The walk reads every import of every module with
``ast`` (those inside functions and under ``TYPE_CHECKING`` too: an arrow is an arrow).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import agentpark

PACKAGE = Path(agentpark.__file__).resolve().parent

# Bottom first. An entry names a module or a package (and everything in it); the entry
# "agentpark" is the package's own __init__ only. A new module must be placed here.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    # Names and errors everything may use; no web framework, no wire model.
    (
        "foundation",
        (
            "agentpark",
            "agentpark.enums",
            "agentpark.errors",
            "agentpark.blocks",
            "agentpark.kvkeys",
        ),
    ),
    # Settings, the state dir, snapshots, counters, and the connector's wire protocol.
    (
        "values",
        (
            "agentpark.config",
            "agentpark.statedir",
            "agentpark.snapshot",
            "agentpark.tally",
            "agentpark.connectors.protocol",
        ),
    ),
    # The REST bodies, shared by the API (above) and the client (next floor).
    ("wire", ("agentpark.schemas",)),
    # What talks to a daemon or a vLLM from outside it.
    (
        "client",
        ("agentpark.client", "agentpark.client_calls", "agentpark.status", "agentpark.vllm_tools"),
    ),
    # Rows, tier files, the KV pool.
    ("storage", ("agentpark.store", "agentpark.migrations", "agentpark.tiers", "agentpark.engine")),
    # What the session core and the policy rules both read of a session (issue 18, item 7).
    ("views", ("agentpark.views",)),
    # Copies between pool and tiers, their checksums, and the connector inside vLLM.
    ("data path", ("agentpark.integrity", "agentpark.dma", "agentpark.connectors")),
    ("parking", ("agentpark.parking",)),
    ("policy", ("agentpark.policy",)),
    # Beside the core: tokens, history, metrics, clean-up, the control socket.
    (
        "services",
        (
            "agentpark.auth",
            "agentpark.history",
            "agentpark.metrics",
            "agentpark.cleanup",
            "agentpark.control",
            "agentpark.turns",
            "agentpark.eventstream",
            "agentpark.kvevents",
        ),
    ),
    # The part factories (one composition root), then the daemon they make.
    ("parts", ("agentpark.parts",)),
    ("runtime", ("agentpark.runtime",)),
    # Sessions handed between daemons: the core's sessions, a client of the other daemon.
    ("moving", ("agentpark.moving",)),
    ("api", ("agentpark.api", "agentpark.dashboard")),
    ("app", ("agentpark.app",)),
    ("bench", ("agentpark.bench",)),
    ("cli", ("agentpark.cli", "agentpark.__main__")),
]

# Arrows that point up today, each being removed by the change named beside it. The test
# fails when one is gone, so the list only shrinks: delete the line then.
KNOWN_UPWARD: set[tuple[str, str]] = set()

# The connector runs inside vLLM's processes: it may import the shared wire protocol and
# the pool file's format (tier file header, blocks, checksums), nothing else of the daemon.
CONNECTOR_MAY_IMPORT = (
    "agentpark",
    "agentpark.connectors",
    "agentpark.blocks",
    "agentpark.enums",
    "agentpark.errors",
    "agentpark.integrity",
    "agentpark.tiers.base",
    "agentpark.tiers.filetier",
    "agentpark.tiers.header",
    "agentpark.tiers.filecheck",
    "agentpark.tiers.aside",
)
KNOWN_CONNECTOR_IMPORTS: set[tuple[str, str]] = set()

# The bottom floor stays importable anywhere: none of these in it.
FRAMEWORKS = ("pydantic", "fastapi", "starlette", "httpx", "sqlalchemy", "uvicorn", "jax")


def _name(path: Path, root: Path = PACKAGE.parent) -> str:
    """The dotted module name of ``path`` under ``root`` (a package by its __init__)."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports_of(module: str, source: str) -> set[str]:
    """Every module ``source`` imports, as dotted names (``from p import m`` gives ``p.m``
    when ``m`` is a module of the package, else ``p``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package
                here = module.split(".")
                if MODULES.get(module, Path()).name != "__init__.py":
                    here = here[:-1]
                here = here[: len(here) - (node.level - 1)]
                base = ".".join([*here, base] if base else here)
            for alias in node.names:
                child = f"{base}.{alias.name}"
                found.add(child if child in MODULES else base)
    return found


def _within(module: str, entry: str) -> bool:
    """``module`` is ``entry`` or inside it (the entry "agentpark" is the __init__ only)."""
    return module == entry or (entry != "agentpark" and module.startswith(entry + "."))


def floor_of(module: str) -> int:
    """The floor of ``module``: that of the longest entry naming it or a package above it."""
    placed = [
        (len(entry), index)
        for index, (_, entries) in enumerate(FLOORS)
        for entry in entries
        if _within(module, entry)
    ]
    return max(placed)[1] if placed else -1


def _arrows() -> set[tuple[str, str]]:
    return {
        (module, target)
        for module, path in MODULES.items()
        for target in imports_of(module, path.read_text(encoding="utf-8"))
        if target.split(".")[0] == "agentpark"
    }


ARROWS = _arrows()


def upward(arrows: set[tuple[str, str]]) -> set[tuple[str, str]]:
    return {(a, b) for a, b in arrows if floor_of(b) > floor_of(a)}


def test_every_module_sits_on_a_floor() -> None:
    assert len(MODULES) > 50  # the walk sees the package
    unplaced = sorted(m for m in MODULES if floor_of(m) < 0)
    assert not unplaced, f"place these on a floor in FLOORS: {unplaced}"


def test_no_module_imports_from_a_floor_above_it() -> None:
    found = upward(ARROWS)
    new = sorted(found - KNOWN_UPWARD)
    lines = [
        f"{a} ({FLOORS[floor_of(a)][0]}) imports {b} ({FLOORS[floor_of(b)][0]})" for a, b in new
    ]
    assert not new, "arrows pointing up:\n" + "\n".join(lines)
    assert found >= KNOWN_UPWARD, f"fixed, delete from KNOWN_UPWARD: {KNOWN_UPWARD - found}"


def test_the_walk_sees_an_arrow_pointing_up() -> None:
    # errors (the bottom floor) building an HTTP answer is what the floors forbid.
    arrows = {("agentpark.errors", t) for t in imports_of("agentpark.errors", _UPWARD_SOURCE)}
    assert upward(arrows) == {
        ("agentpark.errors", "agentpark.api.errors_wire"),
        ("agentpark.errors", "agentpark.parking"),
    }
    assert ("agentpark.api.sessions", "agentpark.parking") in ARROWS  # a real one, downward


_UPWARD_SOURCE = """
from agentpark.api import errors_wire
from agentpark.enums import State
def late() -> None:
    from agentpark.parking import ParkingCore
"""


def test_the_connector_imports_only_protocol_level_modules() -> None:
    def allowed(target: str) -> bool:
        return any(
            target == entry or (entry != "agentpark" and target.startswith(entry + "."))
            for entry in CONNECTOR_MAY_IMPORT
        )

    found = {(a, b) for a, b in ARROWS if a.startswith("agentpark.connectors.") and not allowed(b)}
    assert found - KNOWN_CONNECTOR_IMPORTS == set(), sorted(found - KNOWN_CONNECTOR_IMPORTS)
    gone = KNOWN_CONNECTOR_IMPORTS - found
    assert not gone, f"fixed, delete from KNOWN_CONNECTOR_IMPORTS: {gone}"


@pytest.mark.parametrize("module", FLOORS[0][1])
def test_the_bottom_floor_imports_no_framework(module: str) -> None:
    source = MODULES[module].read_text(encoding="utf-8")
    heavy = sorted(n for n in imports_of(module, source) if n.split(".")[0] in FRAMEWORKS)
    assert heavy == [], f"{module} imports {heavy}"


def test_tests_import_helpers_from_the_harness_not_the_conftest() -> None:
    # tests/conftest.py holds fixtures only; a helper a test needs is in tests.harness.
    tests = Path(__file__).resolve().parent
    importers = sorted(
        str(path.relative_to(tests))
        for path in tests.rglob("*.py")
        if "tests.conftest" in imports_of(_name(path, tests.parent), path.read_text("utf-8"))
    )
    assert importers == [], importers


NO_JAX = [
    "agentpark.blocks",
    "agentpark.enums",
    "agentpark.snapshot",
    "agentpark.tiers.base",
    "agentpark.tiers.shm",
    "agentpark.tiers.disk",
    "agentpark.tiers.dram",
    "agentpark.integrity",
    "agentpark.store.repository",
    "agentpark.policy.rules",
    "agentpark.schemas.sessions",
    "agentpark.auth",
]


@pytest.mark.parametrize("module", NO_JAX)
def test_module_imports_without_jax(module: str) -> None:
    probe = (
        f"import sys, {module}; print(sorted(m for m in sys.modules if m.split('.')[0] == 'jax'))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", f"{module} pulls in JAX: {done.stdout[:200]}"


def test_the_probe_sees_jax_where_it_is_imported() -> None:
    probe = "import sys, agentpark.engine.reference; print('jax' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "True"
