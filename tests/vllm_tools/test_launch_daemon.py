"""``agentpark vllm serve`` with no ``--daemon``, no config and no daemon in vLLM mode: it starts
one itself (a real ``agentpark serve`` child process), points vLLM's connector at it, and
stops it when vLLM ends, however it ends, leaving no process and no /dev/shm folder.

vLLM itself is a stand-in here: a package named ``vllm`` on PYTHONPATH whose
``vllm.entrypoints.openai.api_server`` (what the launcher execs) asks the daemon named in
its ``--kv-transfer-config`` for ``GET /v1/vllm``, writes what it got, and waits for a
signal. Everything else is real: the launcher's CLI, its exec, the daemon process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentpark import cli
from agentpark.config import Settings
from agentpark.statedir import StateLock
from agentpark.vllm_tools import launch as launcher
from tests.harness import Daemon, free_port, wait_until

STAND_IN = """
import json, os, signal, sys, urllib.request
args = sys.argv[1:]
config = json.loads(args[args.index("--kv-transfer-config") + 1])
url = config["kv_connector_extra_config"]["daemon_url"]
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
with urllib.request.urlopen(url + "/v1/vllm", timeout=30) as answer:
    status = answer.status
report = {"pid": os.getpid(), "daemon_url": url, "status": status, "argv": args}
tmp = os.environ["STAND_IN_REPORT"] + ".tmp"
with open(tmp, "w") as out:
    json.dump(report, out)
os.replace(tmp, os.environ["STAND_IN_REPORT"])
if os.environ.get("STAND_IN_EXIT"):
    sys.exit(int(os.environ["STAND_IN_EXIT"]))
signal.sigwait({signal.SIGINT, signal.SIGTERM})
"""


@pytest.fixture
def stand_in(tmp_path: Path) -> Path:
    """A directory holding the stand-in ``vllm`` package (put on PYTHONPATH)."""
    root = tmp_path / "stand-in"
    package = root / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for folder in (root / "vllm", root / "vllm" / "entrypoints", package):
        (folder / "__init__.py").write_text("")
    (package / "api_server.py").write_text(STAND_IN)
    return root


class Launch:
    """``agentpark vllm serve ./m`` run as a user runs it, from ``cwd``, no config file."""

    def __init__(self, cwd: Path, stand_in: Path, port: int, **env: str) -> None:
        self.report = cwd / "report.json"
        self.state_dir = cwd / ".agentpark" / "vllm"  # the default state dir's vllm
        environ = {k: v for k, v in os.environ.items() if not k.startswith("AGENTPARK_")}
        environ.update(
            PYTHONPATH=os.pathsep.join([str(stand_in), *sys.path]),
            AGENTPARK_SERVER__PORT=str(port),
            STAND_IN_REPORT=str(self.report),
            **env,
        )
        argv = [sys.executable, "-m", "agentpark", "vllm", "serve", "./m", "--", "--port", "1"]
        self.process = subprocess.Popen(
            argv, cwd=cwd, env=environ, stderr=subprocess.PIPE, text=True
        )

    def reported(self) -> dict[str, Any]:
        wait_until(lambda: self.report.exists() or self.process.poll() is not None, 120)
        assert self.report.exists(), f"vLLM never ran: {self.stderr()}"
        report: dict[str, Any] = json.loads(self.report.read_text())
        return report

    def daemon(self) -> int:
        """The daemon the launcher started: vLLM's (the launcher's pid) only child."""
        (child,) = [pid for pid, info in _processes().items() if info[0] == self.process.pid]
        assert "agentpark.cli.vllm_daemon" in _processes()[child][1]
        return child

    def stderr(self) -> str:
        assert self.process.stderr is not None
        return self.process.stderr.read()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=60)
        if self.process.stderr is not None:
            self.process.stderr.close()


@pytest.fixture
def launch(tmp_path: Path, stand_in: Path) -> Iterator[Callable[..., Launch]]:
    started: list[Launch] = []

    def start(port: int, **env: str) -> Launch:
        started.append(Launch(tmp_path, stand_in, port, **env))
        return started[-1]

    yield start
    for one in started:
        one.close()


def _processes() -> dict[int, tuple[int, list[str], str]]:
    """Live (not zombie) processes of this uid: pid -> (parent pid, argv, cwd), from /proc."""
    found: dict[int, tuple[int, list[str], str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")[:-1]
            cwd = os.readlink(entry / "cwd")
        except OSError:  # gone meanwhile, or not ours
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if state != "Z":
            found[int(entry.name)] = (int(ppid), [a.decode() for a in argv], cwd)
    return found


def _daemons_in(cwd: Path) -> list[int]:
    """Launcher-started daemons still running from ``cwd`` (the test's own)."""
    return [
        pid
        for pid, (_, argv, where) in _processes().items()
        if "agentpark.cli.vllm_daemon" in argv and where == str(cwd)
    ]


def _shm_folder(state_dir: Path) -> Path:
    folder = Path((state_dir / "shm-dir").read_text().strip())
    assert folder.is_dir() and folder.parent == Path("/dev/shm")
    return folder


def _ended_cleanly(run: Launch, daemon: int, folder: Path) -> None:
    """The daemon stopped with vLLM, by itself; its shm folder and lock went with it."""
    wait_until(lambda: daemon not in _processes(), 60)  # "the daemon outlived vLLM"
    assert not folder.exists(), "the daemon's /dev/shm folder was left behind"
    StateLock.acquire(run.state_dir).release()  # free: nobody holds the state dir
    log = (run.state_dir / "daemon.log").read_text()
    assert "Application shutdown complete" in log, log  # a clean stop, not a kill


@pytest.mark.parametrize("end", ["ctrl-c", "sigkill", "exit 3"])
def test_no_daemon_at_all_the_launcher_starts_one_in_vllm_mode_and_stops_it_with_vllm(
    launch: Callable[..., Launch], end: str
) -> None:
    port = free_port()  # nothing answers here
    run = launch(port, **({"STAND_IN_EXIT": "3"} if end == "exit 3" else {}))
    if end == "exit 3":
        report = run.reported()
        assert run.process.wait(timeout=120) == 3  # vLLM's own status
    else:
        report = run.reported()
        daemon = run.daemon()
        folder = _shm_folder(run.state_dir)
        run.process.send_signal(signal.SIGINT if end == "ctrl-c" else signal.SIGKILL)
        run.process.wait(timeout=60)
        _ended_cleanly(run, daemon, folder)
    # vLLM got the daemon on the configured port (free), in vLLM mode, and said so once.
    assert report["pid"] == run.process.pid  # the launcher exec'd into vLLM
    assert report == {**report, "daemon_url": f"http://127.0.0.1:{port}", "status": 200}
    assert report["argv"][-2:] == ["--port", "1"]
    (line,) = run.stderr().strip().splitlines()
    assert f"the daemon at http://127.0.0.1:{port}: nothing answers there" in line
    assert f"agentpark status --url http://127.0.0.1:{port}" in line
    if end == "exit 3":  # it ended before the test could see it: look for what is left
        wait_until(lambda: _daemons_in(run.state_dir.parent.parent) == [], 60)
        assert not (run.state_dir / "shm-dir").exists()
        StateLock.acquire(run.state_dir).release()


def test_beside_a_reference_daemon_it_starts_its_own_and_leaves_that_one_alone(
    launch: Callable[..., Launch],
    make_settings: Callable[..., Settings],
    daemon_factory: Callable[[Settings], Daemon],
) -> None:
    reference = daemon_factory(make_settings())  # `agentpark serve`: the reference engine
    port = int(reference.url.rsplit(":", 1)[1])
    run = launch(port)
    report = run.reported()
    ours = report["daemon_url"]
    assert report["status"] == 200 and ours != reference.url
    assert reference.client.get("/v1/vllm").status_code == 409  # still the reference engine
    daemon = run.daemon()
    folder = _shm_folder(run.state_dir)
    run.process.send_signal(signal.SIGTERM)
    assert run.process.wait(timeout=60) == 0
    _ended_cleanly(run, daemon, folder)
    (line,) = run.stderr().strip().splitlines()
    assert f"the daemon at {reference.url}: not in vLLM mode; started one" in line
    assert f"at {ours} (dashboard {ours}/dashboard" in line
    assert reference.client.get("/healthz").status_code == 200


def test_a_daemon_that_cannot_start_is_said_in_one_line_and_vllm_never_starts(
    launch: Callable[..., Launch], tmp_path: Path
) -> None:
    held = StateLock.acquire(tmp_path / ".agentpark" / "vllm")  # another daemon has it
    try:
        run = launch(free_port())
        assert run.process.wait(timeout=120) == 2
        (line,) = run.stderr().strip().splitlines()
        assert line.startswith("agentpark: the vLLM-mode daemon it started exited with 2")
        assert "in use by another agentpark daemon" in line and "--daemon URL" in line
        assert not run.report.exists(), "vLLM started"
        assert _daemons_in(tmp_path) == []
    finally:
        held.release()


def test_a_daemon_named_with_daemon_is_used_as_it_is_or_refused(
    make_settings: Callable[..., Settings],
    daemon_factory: Callable[[Settings], Daemon],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """``--daemon URL``: the explicit path; the launcher starts nothing in its place."""
    reference = daemon_factory(make_settings())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(launcher, "vllm_installed", lambda: True)  # STAND-IN: no vLLM here

    def no_exec(*args: object) -> None:
        raise AssertionError("vLLM must not start")

    monkeypatch.setattr(os, "execve", no_exec)
    assert cli.main(["vllm", "serve", "./m", "--daemon", reference.url]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"agentpark: the daemon at {reference.url} does not serve vLLM")
    assert "leave out --daemon and the launcher starts one" in line
    assert not (tmp_path / ".agentpark").exists()  # no daemon of its own was started
