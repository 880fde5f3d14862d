"""deploy/: the systemd unit, the Containerfile and the DaemonSet agree with the code.

Nothing here builds an image or talks to a cluster: the files are read as text (the YAML
through a small reader for the subset the DaemonSet uses; PyYAML is not a dependency) and
checked against the real CLI parser, the app's real routes and the default settings.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
from starlette.routing import Match

from agentpark import cli
from agentpark.app import create_app
from agentpark.cli.serve import run_serve
from agentpark.cli.tokens import token_import
from agentpark.cli.vllm import run_vllm_serve
from agentpark.config import load_settings

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
UNIT = DEPLOY / "agentpark.service"
CONTAINERFILE = DEPLOY / "Containerfile"
CONTAINERFILE_VLLM = DEPLOY / "Containerfile.vllm"
DAEMONSET = DEPLOY / "kubernetes" / "daemonset.yaml"


@pytest.fixture(autouse=True)
def _no_agentpark_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("AGENTPARK_"):
            monkeypatch.delenv(name)


@pytest.fixture
def default_port() -> int:
    return load_settings().server.port


@pytest.fixture
def serves(tmp_path: Path) -> Callable[[str], bool]:
    """Whether the app has a GET route for a path (built, not started: no lifespan runs).

    Recent FastAPI (0.165 here) keeps included routers as lazy entries in ``app.routes``,
    so their paths are not listed there; each route's ``matches`` (starlette's API) works.
    """
    app = create_app(load_settings(state_dir=tmp_path))

    def serves(path: str) -> bool:
        scope = {"type": "http", "method": "GET", "path": path, "root_path": "", "headers": []}
        return any(route.matches(scope)[0] is Match.FULL for route in app.routes)

    assert not serves("/no-such-path")
    return serves


def _cli(argv: list[str]) -> Any:
    """Parse a deployed command line with the real CLI parser (argv[0] is the program)."""
    assert PurePosixPath(argv[0]).name == "agentpark", argv
    return cli.parse_args(cli.build_parser(), argv[1:])


# --- systemd -------------------------------------------------------------------------------


def _unit() -> dict[str, dict[str, list[str]]]:
    """Section -> key -> every value (keys such as Environment= repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        assert current is not None, f"{line!r} outside a section"
        key, sep, value = line.partition("=")
        assert sep, f"not key=value: {line!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def _one(section: dict[str, list[str]], key: str) -> str:
    values = section.get(key, [])
    assert len(values) == 1, f"{key}= set {len(values)} times"
    return values[0]


def _seconds(text: str) -> float:
    units = {"": 1, "s": 1, "sec": 1, "min": 60, "m": 60}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(s|sec|min|m)?", text)
    assert match, f"cannot read a duration from {text!r}"
    return float(match[1]) * units[match[2] or ""]


def test_unit_runs_serve_with_the_etc_config() -> None:
    service = _unit()["Service"]
    assert _one(service, "Type") == "simple"
    argv = shlex.split(_one(service, "ExecStart"))
    assert argv[0].startswith("/"), "systemd wants an absolute program path"
    args = _cli(argv)
    assert args.run is run_serve
    assert args.config == Path("/etc/agentpark/agentpark.toml")
    assert args.port is None, "the port comes from the config, like everywhere else"


def test_unit_imports_the_tokens_credential_before_serving(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    service = _unit()["Service"]
    credential_id, _, source = _one(service, "LoadCredential").partition(":")
    assert PurePosixPath(source).is_absolute()
    # A default makes a missing file non-fatal: a comment line, nothing is imported then.
    default_id, _, default = _one(service, "SetCredential").partition(":")
    assert default_id == credential_id
    argv = shlex.split(_one(service, "ExecStartPre"))
    assert argv[0] == shlex.split(_one(service, "ExecStart"))[0]
    args = _cli(argv)
    assert args.run is token_import
    assert args.config == _cli(shlex.split(_one(service, "ExecStart"))).config
    assert str(args.file) == f"%d/{credential_id}", "%d: the unit's credentials directory"
    # What the import does with an empty credential, and with an export in it.
    settings = load_settings(state_dir=tmp_path / "state")
    monkeypatch.setenv("AGENTPARK_STATE_DIR", str(settings.state_dir))
    for text in ("", default):
        (tmp_path / credential_id).write_text(text)
        args.file = tmp_path / credential_id
        args.config = None
        assert args.run(args) == 0
        assert "imported 0 token(s)" in capsys.readouterr().out


def test_unit_state_dir_is_the_systemd_state_directory() -> None:
    service = _unit()["Service"]
    state = _one(service, "StateDirectory")
    assert state == "agentpark"
    env = dict(
        item.split("=", 1) for value in service["Environment"] for item in shlex.split(value)
    )
    assert env["AGENTPARK_STATE_DIR"] == f"/var/lib/{state}"


def test_unit_restarts_and_stops_gracefully() -> None:
    service = _unit()["Service"]
    assert _one(service, "Restart") == "on-failure"
    assert _one(service, "KillSignal") == "SIGTERM"
    assert _seconds(_one(service, "TimeoutStopSec")) >= 10
    assert _unit()["Install"]["WantedBy"] == ["multi-user.target"]


def test_unit_hardening_keeps_shm_and_accelerators_reachable() -> None:
    service = _unit()["Service"]
    yes = {"yes", "true", "on", "1"}
    # Hardened at all.
    assert _one(service, "NoNewPrivileges") in yes
    assert _one(service, "ProtectSystem") == "strict"  # /dev (and /dev/shm) stay writable
    assert _one(service, "CapabilityBoundingSet") == ""
    # Accelerator device nodes stay visible: no private /dev, no device allow-list.
    # (ProtectClock implies DeviceAllow=char-rtc, which closes the others on older systemd.)
    for key in ("PrivateDevices", "ProtectClock", "DynamicUser", "MemoryDenyWriteExecute"):
        assert not (set(service.get(key, [])) & yes), f"{key}=yes breaks the daemon"
    assert "DeviceAllow" not in service
    assert service.get("DevicePolicy", ["auto"]) == ["auto"]
    # shm-parked sessions survive a restart: nothing removes or hides /dev/shm.
    assert _one(service, "RemoveIPC") == "no"
    assert "PrivateIPC" not in service
    for key in ("InaccessiblePaths", "TemporaryFileSystem", "ReadOnlyPaths"):
        assert not any("/dev" in value for value in service.get(key, [])), key


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    # The program is not installed here; point ExecStart at `true` so verify checks the rest.
    true = shutil.which("true")
    assert true
    text = re.sub(r"(?m)^ExecStart=\S+", f"ExecStart={true}", UNIT.read_text())
    copy = tmp_path / UNIT.name
    copy.write_text(text)
    done = subprocess.run(
        ["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=60
    )
    complaints = [
        line
        for line in done.stderr.splitlines()
        if re.search(r"Unknown (key|section)|Failed to parse|Invalid|not valid", line)
    ]
    assert complaints == []


# --- Containerfile -------------------------------------------------------------------------


def _instructions(path: Path = CONTAINERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    result: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        result.append((word.upper(), rest.strip()))
    assert not pending, "a continuation line runs off the end"
    return result


def _all(instruction: str, path: Path = CONTAINERFILE) -> list[str]:
    return [rest for word, rest in _instructions(path) if word == instruction]


def test_containerfile_base_install_and_user() -> None:
    assert _all("FROM") == ["python:3.12-slim"]
    assert any(re.search(r"\bpip install \.(\s|$)", run) for run in _all("RUN"))
    user = _all("USER")[-1].split(":")[0]
    assert user not in {"root", "0"}


@pytest.mark.parametrize("path", [CONTAINERFILE, CONTAINERFILE_VLLM], ids=lambda p: p.name)
def test_containerfile_copies_what_the_build_needs(path: Path) -> None:
    copied = set()
    for args in _all("COPY", path):
        *sources, _dest = args.split()
        assert not any(s.startswith("--") for s in sources), "no --from/--chown expected"
        copied |= set(sources)
    for source in copied:
        assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = {"pyproject.toml", project["project"]["readme"]}
    setuptools = project["tool"]["setuptools"]
    needed |= {name.split(".")[0] for name in setuptools["packages"]}
    needed -= set(setuptools.get("package-dir", {}))
    needed |= {d.split("/")[0] for d in setuptools.get("package-dir", {}).values()}
    assert needed <= copied, f"the build needs {sorted(needed - copied)}"


def test_pip_install_ships_every_package() -> None:
    # The image (and a systemd venv) get what `pip install .` builds: setuptools'
    # explicit package list, not the source tree.
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "agentpark").rglob("__init__.py")
    }
    listed = {name for name in setuptools["packages"] if name in on_disk}
    assert on_disk - listed == set(), "packages missing from pyproject's packages list"


def test_containerfile_port_and_healthcheck(
    default_port: int, serves: Callable[[str], bool]
) -> None:
    assert _all("EXPOSE") == [str(default_port)]
    (healthcheck,) = _all("HEALTHCHECK")
    options, _, command = healthcheck.partition(" CMD ")
    argv = json.loads(command)
    assert argv[:2] == ["python", "-c"], "the slim image has no curl"
    compile(argv[2], "<healthcheck>", "exec")
    (url,) = re.findall(r"https?://[^'\"\s]+", argv[2])
    parts = urlsplit(url)
    assert parts.port == default_port
    assert parts.path == "/healthz"
    assert serves(parts.path)
    assert "--timeout=" in options


def test_containerfile_entrypoint_serves_on_all_interfaces(default_port: int) -> None:
    (entrypoint,) = _all("ENTRYPOINT")
    argv = json.loads(entrypoint)
    assert argv[:2] == ["agentpark", "serve"]
    args = _cli(argv)
    assert args.run is run_serve
    assert args.host == "0.0.0.0"
    assert args.port in (None, default_port)
    assert _all("STOPSIGNAL") in ([], ["SIGTERM"])


# --- Kubernetes ----------------------------------------------------------------------------


class _Yaml:
    """Block-style maps and lists, `|` block scalars, JSON flow values, `#` comment lines."""

    _KEY = re.compile(r"^[\w.\-/]+:(\s|$)")

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()
        self.i = 0

    @classmethod
    def documents(cls, text: str) -> list[Any]:
        docs = re.split(r"(?m)^---\s*$", text)
        return [cls(doc).node() for doc in docs if cls(doc)._next() is not None]

    def _next(self) -> tuple[int, str] | None:
        while self.i < len(self.lines):
            line = self.lines[self.i]
            if line.strip() and not line.strip().startswith("#"):
                assert "\t" not in line, "tabs in YAML"
                return len(line) - len(line.lstrip(" ")), line.strip()
            self.i += 1
        return None

    def node(self) -> Any:
        head = self._next()
        assert head is not None
        indent, content = head
        return self._list(indent) if content.startswith("- ") else self._map(indent)

    def _map(self, indent: int) -> dict[str, Any]:
        result: dict[str, Any] = {}
        while (head := self._next()) is not None and head[0] >= indent:
            at, content = head
            assert at == indent, f"line {self.i + 1}: unexpected indentation"
            if content.startswith("- "):
                break
            key, sep, rest = content.partition(":")
            assert sep, f"line {self.i + 1}: not `key: value`"
            assert key not in result, f"line {self.i + 1}: {key} twice"
            rest = rest.strip()
            self.i += 1
            if rest == "|":
                result[key] = self._block(indent)
            elif rest:
                result[key] = self._scalar(rest)
            else:
                child = self._next()
                nested = child is not None and (
                    child[0] > indent or (child[0] == indent and child[1].startswith("- "))
                )
                result[key] = self.node() if nested else None
        return result

    def _list(self, indent: int) -> list[Any]:
        items: list[Any] = []
        while (head := self._next()) is not None and head[0] == indent:
            content = head[1]
            if not content.startswith("- "):
                break
            rest = content[2:].strip()
            if self._KEY.match(rest):  # `- key: value` opens a map two columns in
                self.lines[self.i] = " " * (indent + 2) + rest
                items.append(self._map(indent + 2))
            else:
                self.i += 1
                items.append(self._scalar(rest))
        return items

    def _block(self, indent: int) -> str:
        body: list[str] = []
        while self.i < len(self.lines):
            line = self.lines[self.i]
            if line.strip() and len(line) - len(line.lstrip(" ")) <= indent:
                break
            body.append(line)
            self.i += 1
        while body and not body[-1].strip():
            body.pop()
        width = min(len(x) - len(x.lstrip(" ")) for x in body if x.strip())
        return "\n".join(x[width:] for x in body) + "\n"

    @staticmethod
    def _scalar(text: str) -> Any:
        assert " #" not in text, f"trailing comment not supported: {text!r}"
        if text[0] in '[{"':
            return json.loads(text)
        if text[0] == "'":
            return text.strip("'")
        if text in ("true", "false"):
            return text == "true"
        if re.fullmatch(r"-?\d+", text):
            return int(text)
        return text


def _documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = _Yaml.documents(DAEMONSET.read_text())
    return docs


def _manifests() -> dict[str, dict[str, Any]]:
    """One document per kind (Secrets, of which there are two, are in ``_secrets``)."""
    docs = [doc for doc in _documents() if doc["kind"] != "Secret"]
    kinds = [doc["kind"] for doc in docs]
    assert len(kinds) == len(set(kinds)), kinds
    return {doc["kind"]: doc for doc in docs}


def _secrets() -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in _documents() if doc["kind"] == "Secret"}


def _pod() -> dict[str, Any]:
    daemonset = _manifests()["DaemonSet"]
    assert daemonset["apiVersion"] == "apps/v1"
    pod: dict[str, Any] = daemonset["spec"]["template"]["spec"]
    return pod


def _daemon() -> dict[str, Any]:
    (container,) = [c for c in _pod()["containers"] if c["name"] == "agentpark"]
    return container


def _mounts(container: dict[str, Any]) -> dict[str, str]:
    return {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}


def _volumes() -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in _pod()["volumes"]}


def test_yaml_reader_reads_the_subset() -> None:
    text = (
        'a:\n  b: 1\n  c: ["x", "y"]\n  d:\n  - name: n\n    v: \'q\'\n  - plain\n'
        "  e: |\n    line 1\n\n    line 2\n  f: {}\n# comment\ng: true\n"
    )
    assert _Yaml(text).node() == {
        "a": {
            "b": 1,
            "c": ["x", "y"],
            "d": [{"name": "n", "v": "q"}, "plain"],
            "e": "line 1\n\nline 2\n",
            "f": {},
        },
        "g": True,
    }


def test_daemonset_runs_one_daemon_per_host_with_the_configmap() -> None:
    manifests = _manifests()
    daemonset = manifests["DaemonSet"]
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert daemonset["spec"]["selector"]["matchLabels"].items() <= labels.items()
    container = _daemon()
    args = _cli(container["command"] + container.get("args", []))
    assert args.run is run_serve
    assert args.host == "0.0.0.0"
    # --config names the file the ConfigMap volume puts there.
    config_volume = next(
        name for name, v in _volumes().items() if "configMap" in v and name in _mounts(container)
    )
    assert args.config.parent == Path(_mounts(container)[config_volume])
    configmap = manifests["ConfigMap"]
    assert _volumes()[config_volume]["configMap"]["name"] == configmap["metadata"]["name"]
    assert args.config.name in configmap["data"]


def test_daemonset_configmap_is_a_valid_config(tmp_path: Path, default_port: int) -> None:
    (name, text), *_ = _manifests()["ConfigMap"]["data"].items()
    path = tmp_path / name
    path.write_text(text)
    settings = load_settings(path)  # refuses unknown keys and bad values
    assert settings.server.port == default_port


def test_daemonset_probes_are_real_routes(serves: Callable[[str], bool], default_port: int) -> None:
    container = _daemon()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert list(ports.values()) == [default_port]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
        if kind not in container:
            continue
        probe = container[kind]["httpGet"]
        assert serves(probe["path"]), f"{kind} probes {probe['path']}, which is not served"
        assert ports.get(probe["port"], probe["port"]) == default_port


def test_daemonset_service_port(default_port: int) -> None:
    service = _manifests()["Service"]
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == "http"]
    assert port["port"] == default_port
    container_ports = {p["name"]: p["containerPort"] for p in _daemon()["ports"]}
    assert container_ports.get(port["targetPort"], port["targetPort"]) == default_port
    selector = service["spec"]["selector"].items()
    assert selector <= _manifests()["DaemonSet"]["spec"]["template"]["metadata"]["labels"].items()


def test_daemonset_state_dir_is_on_the_host() -> None:
    container = _daemon()
    env = {e["name"]: e["value"] for e in container["env"]}
    state_dir = env["AGENTPARK_STATE_DIR"]
    (volume,) = [name for name, path in _mounts(container).items() if path == state_dir]
    assert "hostPath" in _volumes()[volume], "sessions must survive a pod restart"


def test_daemonset_shm_is_shared_memory() -> None:
    pod = _pod()
    if pod.get("hostIPC") is True:
        return
    (volume,) = [name for name, path in _mounts(_daemon()).items() if path == "/dev/shm"]
    assert _volumes()[volume]["emptyDir"]["medium"] == "Memory"


def test_daemonset_imports_the_tokens_secret_before_the_daemon_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pod = _pod()
    (importer,) = [c for c in pod["initContainers"] if c["name"] == "token-import"]
    args = _cli(importer["command"] + importer.get("args", []))
    assert args.run is token_import
    daemon_args = _cli(_daemon()["command"] + _daemon().get("args", []))
    assert args.config == daemon_args.config
    # The same state dir as the daemon, on the same volume.
    env = {e["name"]: e["value"] for e in importer["env"]}
    daemon_env = {e["name"]: e["value"] for e in _daemon()["env"] if "value" in e}
    assert env["AGENTPARK_STATE_DIR"] == daemon_env["AGENTPARK_STATE_DIR"]
    state_volume = next(n for n, p in _mounts(_daemon()).items() if p == env["AGENTPARK_STATE_DIR"])
    assert _mounts(importer)[state_volume] == env["AGENTPARK_STATE_DIR"]
    # The file is a key of the agentpark-tokens Secret, mounted where the command reads it.
    (volume,) = [
        name
        for name, path in _mounts(importer).items()
        if PurePosixPath(args.file).parent == PurePosixPath(path)
    ]
    secret_name = _volumes()[volume]["secret"]["secretName"]
    secret = _secrets()[secret_name]
    assert secret["metadata"]["namespace"] == _manifests()["DaemonSet"]["metadata"]["namespace"]
    contents = secret["stringData"][PurePosixPath(args.file).name]
    # Runs as the daemon's user (the pod's), not as root like the chown step.
    assert importer["securityContext"].get("runAsUser") in (
        None,
        pod["securityContext"]["runAsUser"],
    )
    # As shipped the Secret imports cleanly and holds no token: the daemon, bound to
    # 0.0.0.0, then refuses to start (tests/test_tokens_cli.py) until one is put there.
    path = tmp_path / "tokens"
    path.write_text(contents)
    args.file, args.config = path, None
    monkeypatch.setenv("AGENTPARK_STATE_DIR", str(tmp_path / "state"))
    assert args.run(args) == 0
    assert "imported 0 token(s)" in capsys.readouterr().out


def test_daemonset_gives_clients_their_token_through_a_secret() -> None:
    client = _secrets()["agentpark-client-token"]
    assert "token" in client["stringData"]
    text = DAEMONSET.read_text()
    assert "name: AGENTPARK_TOKEN" in text and "secretKeyRef: {name: agentpark-client-token" in text


def test_daemonset_stops_gracefully_and_has_resources() -> None:
    assert _pod()["terminationGracePeriodSeconds"] >= 10
    resources = _daemon()["resources"]
    assert resources["requests"]["memory"]
    assert resources["limits"]["memory"]


# --- vLLM beside the daemon ----------------------------------------------------------------


def _vllm() -> dict[str, Any]:
    (container,) = [c for c in _pod()["containers"] if c["name"] == "vllm"]
    return container


def _ports(container: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container["ports"]}


def test_daemonset_vllm_runs_the_connector_against_the_daemon(default_port: int) -> None:
    from agentpark.vllm_tools.launch import vllm_command

    container = _vllm()
    args = _cli(container["command"] + container.get("args", []))
    assert args.run is run_vllm_serve
    assert not args.no_connector
    daemon = urlsplit(args.daemon)
    # Containers of a pod share the network: loopback reaches the daemon's port.
    assert daemon.hostname == "127.0.0.1"
    assert daemon.port == _ports(_daemon())["http"] == default_port
    # vLLM's own flags: on every interface, on the port the container and Service name.
    extra = args.extra_args
    assert extra[extra.index("--host") + 1] == "0.0.0.0"
    vllm_port = int(extra[extra.index("--port") + 1])
    assert vllm_port == _ports(container)["openai"]
    (service_port,) = [p for p in _manifests()["Service"]["spec"]["ports"] if p["name"] == "openai"]
    assert service_port["targetPort"] == "openai"
    argv = vllm_command(args.model, python="python", daemon_url=args.daemon, extra_args=extra)
    config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert config["kv_connector_extra_config"]["daemon_url"] == args.daemon
    # The model directory is on a mounted volume.
    assert any(
        PurePosixPath(args.model).is_relative_to(path) for path in _mounts(container).values()
    )


def test_daemonset_vllm_shares_shm_the_state_dir_and_the_user_with_the_daemon() -> None:
    pod = _pod()
    (daemon_shm,) = [n for n, path in _mounts(_daemon()).items() if path == "/dev/shm"]
    (vllm_shm,) = [n for n, path in _mounts(_vllm()).items() if path == "/dev/shm"]
    assert daemon_shm == vllm_shm, "the host pool must be one file both containers see"
    assert _volumes()[vllm_shm]["emptyDir"]["medium"] == "Memory"
    # The connector reaches the daemon's control socket in its state dir: same volume, same
    # path (the daemon tells the connector the socket's path).
    state_dir = {e["name"]: e["value"] for e in _daemon()["env"]}["AGENTPARK_STATE_DIR"]
    (daemon_state,) = [n for n, path in _mounts(_daemon()).items() if path == state_dir]
    assert _mounts(_vllm()).get(daemon_state) == state_dir
    # The pool file and the socket are 0600: the connector must run as the daemon's user.
    user = pod["securityContext"]["runAsUser"]
    for container in (_daemon(), _vllm()):
        assert container.get("securityContext", {}).get("runAsUser", user) == user


def test_daemonset_vllm_probes_its_health_route() -> None:
    container = _vllm()
    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        probe = container[kind]["httpGet"]
        assert probe["path"] == "/health"
        assert probe["port"] == "openai"
    assert container["resources"]["limits"]["memory"]


def test_containerfile_vllm_entrypoint_is_the_launcher() -> None:
    (entrypoint,) = _all("ENTRYPOINT", CONTAINERFILE_VLLM)
    argv = json.loads(entrypoint)
    args = _cli([*argv, "/models/model"])
    assert args.run is run_vllm_serve
    assert _all("USER", CONTAINERFILE_VLLM) == _all("USER"), "the daemon's user: shm is 0600"
    assert _all("EXPOSE", CONTAINERFILE_VLLM) == ["8000"]
    assert any(re.search(r"\bpip install \.(\s|$)", run) for run in _all("RUN", CONTAINERFILE_VLLM))
