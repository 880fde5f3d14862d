"""README.md's vLLM quick start, run as written: the commands of its "### Serve" block
(``agentpark serve &``, then ``agentpark vllm serve ./tiny -- ...``), no config file, then
its OpenAI SDK examples, against a real daemon and a real vLLM.

Substituted, and only: the model path (the session's ``tiny_model``, made by the same
``agentpark make-model`` as the README's second line), the ports and the state dir, through
what the README documents (``AGENTPARK_SERVER__PORT``, ``$AGENTPARK_STATE_DIR``, vLLM's
``--port``). One addition: the connector's scheduler-side budget is raised, as in every
parking test here (tests/vllm_real/test_agentpark_vllm.py's PATIENT), so a loaded machine
does not turn parks into misses.

The daemon the README starts runs the reference engine, so ``agentpark vllm serve``
starts its own in vLLM mode and stops it with vLLM: the last test checks that nothing of
it is left (process, /dev/shm folder). One vLLM start for the module.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.vllm_real.agents import Turn, run_turns, wait_for
from tests.vllm_real.conftest import DEFAULT_ENV, VllmServer
from tests.vllm_real.test_agentpark_vllm import PATIENT, _park, _restored

README = Path(__file__).resolve().parents[2] / "README.md"
STARTED = re.compile(r"started one in vLLM mode for this vLLM at (http://127\.0\.0\.1:\d+) ")


def _section(text: str, heading: str) -> str:
    """The text under ``heading`` up to the next heading of its level or above."""
    level = heading.split(" ", 1)[0]
    body = text.split(f"\n{heading}\n", 1)[1]
    ends = [body.find(f"\n{'#' * n} ") for n in range(2, len(level) + 1)]
    return body[: min([e for e in ends if e >= 0], default=len(body))]


def _blocks(section: str, lang: str) -> list[str]:
    return [part.split("```", 1)[0] for part in section.split(f"```{lang}\n")[1:]]


def serve_commands() -> list[tuple[dict[str, str], list[str]]]:
    """The "### Serve" block's commands: (leading VAR=value assignments, argv)."""
    quick = _section(README.read_text(), "## vLLM quick start")
    (block,) = _blocks(_section(quick, "### Serve"), "sh")
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        env = {}
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
            name, value = words.pop(0).split("=", 1)
            env[name] = value
        if words:
            commands.append((env, words))
    return commands


@dataclass
class ReadmeVllm(VllmServer):
    """The README's ``agentpark vllm serve`` line, run through the fixtures' server."""

    readme_argv: list[str] = field(default_factory=list)

    def argv(self) -> list[str]:
        return list(self.readme_argv)


@dataclass
class QuickStart:
    reference_url: str
    vllm: ReadmeVllm
    daemon_url: str
    state_dir: Path
    start_s: float


def _agentpark(words: list[str]) -> list[str]:
    assert words[0] == "agentpark"
    return [sys.executable, "-m", "agentpark", *words[1:]]


def _free_port() -> int:
    from agentpark.vllm_tools.process import free_port

    return free_port()


@pytest.fixture(scope="module")
def quick(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[QuickStart]:
    serve, make_model, vllm_serve = serve_commands()
    assert serve == ({}, ["agentpark", "serve", "&"])
    assert make_model == ({}, ["agentpark", "make-model", "./tiny"])  # what tiny_model ran
    readme_env, words = vllm_serve
    assert words[:5] == ["agentpark", "vllm", "serve", "./tiny", "--"]
    work = tmp_path_factory.mktemp("quickstart")
    port, vllm_port = _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTPARK_")}
    env.update(AGENTPARK_SERVER__PORT=str(port), AGENTPARK_STATE_DIR=str(work / "state"))
    with (work / "serve.log").open("wb") as serve_log:
        reference = subprocess.Popen(
            _agentpark(serve[1][:-1]),  # `&`: in the background
            env=env,
            stdout=serve_log,
            stderr=subprocess.STDOUT,
        )
    reference_url = f"http://127.0.0.1:{port}"
    argv = _agentpark(words)
    argv[argv.index("./tiny")] = str(tiny_model)
    argv[argv.index("--port", argv.index("--")) + 1] = str(vllm_port)
    vllm = ReadmeVllm(
        python=Path(sys.executable),
        model=tiny_model,
        port=vllm_port,
        log_path=work / "vllm.log",
        env={**DEFAULT_ENV, **env, **readme_env, **PATIENT},
        readme_argv=argv,
    )
    try:
        wait_for(lambda: _answers(f"{reference_url}/readyz"), 300, "`agentpark serve` ready")
        began = time.monotonic()
        try:
            vllm.start()
        except RuntimeError as exc:
            pytest.fail(str(exc), pytrace=False)
        start_s = time.monotonic() - began
        (daemon_url,) = STARTED.findall(vllm.log_path.read_text())
        yield QuickStart(reference_url, vllm, daemon_url, work / "state" / "vllm", start_s)
    finally:
        vllm.stop()
        reference.terminate()
        reference.wait(timeout=60)
        record = work / "state" / "shm-dir"  # the reference daemon's tier folder (kept by design)
        if record.exists():
            shutil.rmtree(record.read_text().strip(), ignore_errors=True)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def test_the_two_commands_park_and_restore_sessions_vllm_evicted_exactly(
    quick: QuickStart, plain_vllm: VllmServer
) -> None:
    print(f"\nagentpark vllm serve to vLLM answering: {quick.start_s:.1f} s")
    log = quick.vllm.log_path.read_text()
    assert log.count("agentpark: the daemon at") == 1, "one line says what it started"
    assert httpx.get(f"{quick.reference_url}/v1/vllm").status_code == 409  # left as it was
    names = [f"quick-{i}" for i in range(5)]
    histories: dict[str, list[dict[str, Any]]] = {}
    ours: dict[str, list[Turn]] = {n: [] for n in names}
    for _ in range(3):  # every session's turn, then every session's next: more than fits
        for name in names:
            turns, histories[name] = run_turns(
                quick.vllm.base_url, name, 1, params=_park(name), history=histories.get(name)
            )
            ours[name].extend(turns)
    assert all(t.agentpark and t.agentpark["decision"] == "parked" for n in names for t in ours[n])
    restored = [(n, i) for n in names for i, t in enumerate(ours[n]) if _restored(t) > 0]
    assert len(restored) >= len(names), "sessions whose blocks vLLM evicted are restored"
    for name in names:  # the very tokens a roomy prefix cache gives
        reference, _ = run_turns(plain_vllm.base_url, name, 3)
        for i, turn in enumerate(ours[name]):
            if _restored(turn) > 0:
                assert turn.tokens == reference[i].tokens, f"{name} turn {i + 1}"
                # Exact: both eager (the README's --enforce-eager; compiled, the logprobs
                # differed from the eager reference's in the third decimal).
                assert turn.logprobs == reference[i].logprobs, f"{name} turn {i + 1}"
    host = httpx.get(f"{quick.daemon_url}/v1/host").json()
    assert host["counters"]["prefill_tokens_avoided"] >= sum(
        _restored(ours[n][i]) for n, i in restored
    )


def test_the_readme_sdk_examples_run_against_them(
    quick: QuickStart, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    quick_start = _section(README.read_text(), "## vLLM quick start")
    blocks = _blocks(_section(quick_start, "### Talking to it: the OpenAI SDK"), "python")
    assert len(blocks) == 2  # a turn and its next, then the same streamed
    code = "\n".join(blocks)
    assert code.count('"./tiny"') >= 2 and "http://127.0.0.1:8000/v1" in code
    code = code.replace('"http://127.0.0.1:8000/v1"', repr(quick.vllm.base_url))
    code = code.replace('"./tiny"', repr(str(tiny_model)))
    code = code.replace("http://127.0.0.1:8470", quick.daemon_url)
    code = code.replace("http://127.0.0.1:8471", quick.daemon_url)  # the launcher's daemon
    exec(compile(code, "README.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert any("'agentpark'" in line and "'decision'" in line for line in printed)
    assert "cached_tokens" in "\n".join(printed)


def test_stopping_vllm_stops_the_daemon_it_started_and_leaves_nothing(quick: QuickStart) -> None:
    server = quick.vllm
    children = psutil.Process(server.pid).children()
    (daemon,) = [c for c in children if "agentpark.cli.vllm_daemon" in c.cmdline()]
    folder = Path((quick.state_dir / "shm-dir").read_text().strip())
    assert (folder / "vllm-pool").exists()  # the pool sessions were parked in
    server.stop()  # SIGTERM, as a service manager stops it
    assert server.killed == [], "vLLM or the daemon had to be killed"
    assert not daemon.is_running(), "the daemon outlived vLLM"  # stop() waited for it
    assert not folder.exists(), "its /dev/shm folder was left behind"
    assert "Application shutdown complete" in (quick.state_dir / "daemon.log").read_text()
