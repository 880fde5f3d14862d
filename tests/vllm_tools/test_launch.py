"""``agentpark vllm serve`` and ``make-model`` without vLLM: the argv and environment the
launcher builds, the CLI around them, and the refusals that need no torch."""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import agentpark
from agentpark import cli
from agentpark.config import Settings, load_settings
from agentpark.errors import ConfigError
from agentpark.vllm_tools import launch
from agentpark.vllm_tools.launch import (
    ENV_DEFAULTS,
    SERVER_MODULE,
    kv_transfer_config,
    local_daemon_url,
    vllm_command,
    vllm_env,
)
from agentpark.vllm_tools.model import ModelSpec
from tests.harness import Daemon, free_port, tiny_settings

ROOT = str(Path(agentpark.__file__).resolve().parent.parent)
# vLLM's own flags, some odd on purpose: they must arrive exactly as given.
EXTRA = ["--max-model-len", "2048", "--port", "9001", "--", "--served-model-name=a b", ""]


def _kv_config(argv: list[str]) -> dict[str, object]:
    at = argv.index("--kv-transfer-config")
    config: dict[str, object] = json.loads(argv[at + 1])
    return config


def test_command_configures_the_connector_for_the_daemon() -> None:
    argv = vllm_command(
        "/models/tiny", python="/py", daemon_url="http://127.0.0.1:8470", extra_args=EXTRA
    )
    assert argv[:5] == ["/py", "-m", SERVER_MODULE, "--model", "/models/tiny"]
    assert _kv_config(argv) == {
        "kv_connector": "AgentparkConnector",
        "kv_connector_module_path": "agentpark.connectors.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"daemon_url": "http://127.0.0.1:8470"},
    }
    assert argv[-len(EXTRA) :] == EXTRA
    assert len(argv) == 7 + len(EXTRA)


def test_command_carries_the_token_and_plain_has_no_connector() -> None:
    argv = vllm_command("m", python="/py", daemon_url="http://h:1", token="s3cret")
    assert _kv_config(argv)["kv_connector_extra_config"] == {
        "daemon_url": "http://h:1",
        "token": "s3cret",
    }
    assert kv_transfer_config("http://h:1") == {
        **_kv_config(argv),
        "kv_connector_extra_config": {"daemon_url": "http://h:1"},
    }
    plain = vllm_command("m", python="/py", daemon_url=None, extra_args=EXTRA)
    assert plain == ["/py", "-m", SERVER_MODULE, "--model", "m", *EXTRA]


@pytest.mark.parametrize("flag", ["--kv-transfer-config", "--kv-transfer-config={}"])
def test_a_second_kv_transfer_config_is_refused_unless_plain(flag: str) -> None:
    with pytest.raises(ConfigError, match="--no-connector"):
        vllm_command("m", python="/py", daemon_url="http://h:1", extra_args=[flag, "{}"])
    plain = vllm_command("m", python="/py", daemon_url=None, extra_args=[flag, "{}"])
    assert plain[-2:] == [flag, "{}"]


def test_env_sets_the_defaults_and_puts_agentpark_first_on_the_path() -> None:
    env = vllm_env({"PATH": "/bin", "PYTHONPATH": f"/a{os.pathsep}{ROOT}{os.pathsep}/b"})
    assert env["PATH"] == "/bin"
    for name, value in ENV_DEFAULTS.items():
        assert env[name] == value
    assert env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep) == [ROOT, "/a", "/b"]
    assert vllm_env({})["PYTHONPATH"] == ROOT


def test_env_keeps_values_already_set() -> None:
    env = vllm_env({"HF_HUB_OFFLINE": "0", "VLLM_CPU_NUM_OF_RESERVED_CPU": "2"})
    assert env["HF_HUB_OFFLINE"] == "0"
    assert env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "2"
    assert env["DO_NOT_TRACK"] == "1"


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("127.0.0.1", "http://127.0.0.1:8470"),
        ("0.0.0.0", "http://127.0.0.1:8470"),
        ("::", "http://[::1]:8470"),
        ("10.0.0.5", "http://10.0.0.5:8470"),
    ],
)
def test_local_daemon_url(host: str, url: str) -> None:
    assert local_daemon_url(host, 8470) == url


def _dry_run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[dict[str, str], list[str]]:
    assert cli.main(["vllm", "serve", *args]) == 0
    *env_lines, command = capsys.readouterr().out.strip().splitlines()
    env = dict(line.split("=", 1) for line in env_lines)
    return env, shlex.split(command)


def test_cli_defaults_to_the_local_daemon_and_passes_args_after_dashes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    env, argv = _dry_run(capsys, "/m", "--dry-run", "--", *EXTRA)
    port = load_settings().server.port
    assert _kv_config(argv)["kv_connector_extra_config"] == {
        "daemon_url": f"http://127.0.0.1:{port}"
    }
    assert argv[0] == sys.executable
    assert argv[-len(EXTRA) :] == EXTRA
    assert env["PYTHONPATH"].split(os.pathsep)[0] == ROOT
    assert env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"


def test_cli_takes_the_daemon_from_the_config_or_the_flag(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "agentpark.toml"
    config.write_text('[server]\nhost = "0.0.0.0"\nport = 9555\n')
    _, argv = _dry_run(capsys, "/m", "--config", str(config), "--dry-run")
    extra = _kv_config(argv)["kv_connector_extra_config"]
    assert extra == {"daemon_url": "http://127.0.0.1:9555"}
    _, argv = _dry_run(capsys, "/m", "--daemon", "http://d:1", "--token", "t", "--dry-run")
    assert _kv_config(argv)["kv_connector_extra_config"] == {
        "daemon_url": "http://d:1",
        "token": "t",
    }
    _, argv = _dry_run(capsys, "/m", "--no-connector", "--dry-run", "--", "--port", "1")
    assert argv[1:] == ["-m", SERVER_MODULE, "--model", "/m", "--port", "1"]


def test_dashes_are_refused_for_other_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["status", "--", "--port", "1"])
    assert exit_.value.code == 2
    assert "only for `agentpark vllm serve`" in capsys.readouterr().err


def test_serve_without_vllm_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(launch, "vllm_installed", lambda: False)
    assert cli.main(["vllm", "serve", "/m", "--no-connector"]) == 2
    assert "pip install 'agentpark[vllm]'" in capsys.readouterr().err


def test_make_model_without_torch_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    assert cli.main(["make-model", str(tmp_path / "m")]) == 2
    assert "pip install 'agentpark[vllm]'" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (ModelSpec(hidden=64, heads=4), "head_dim"),
        (ModelSpec(hidden=100, heads=3), "not a multiple"),
        (ModelSpec(heads=2, kv_heads=3), "must divide"),
        (ModelSpec(vocab=300), "below 512"),
        (ModelSpec(layers=0), ">= 1"),
    ],
)
def test_model_shapes_vllm_cannot_run_are_refused(spec: ModelSpec, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        spec.check()
    ModelSpec().check()  # the tests' tiny model is fine


def test_make_model_refuses_a_non_empty_dir_before_importing_torch(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    assert cli.main(["make-model", str(tmp_path)]) == 2
    assert "is not empty" in capsys.readouterr().err


def test_the_launcher_says_in_one_line_why_a_daemon_will_not_take_the_connector(
    make_settings: Callable[..., Settings],
    daemon_factory: Callable[[Settings], Daemon],
    tmp_path: Path,
    shm_dir: Path,
) -> None:
    """Before vLLM starts (not in its log minutes later): a daemon not serving vLLM, a token
    it refuses, no daemon at all; each names the fix. A vLLM daemon: nothing said."""
    reference = daemon_factory(make_settings())
    why = launch.daemon_refusal(reference.url, None)
    assert why is not None and "does not serve vLLM" in why
    assert "AGENTPARK_VLLM__ENABLED=true agentpark serve" in why and "\n" not in why
    vllm = {"enabled": True, "pool_path": shm_dir / "vllm-pool"}  # all in the test's shm dir
    serving = daemon_factory(tiny_settings(tmp_path / "vllm-state", shm_dir, vllm=vllm))
    assert launch.daemon_refusal(serving.url, None) is None
    why = launch.daemon_refusal(serving.url, "apk_bad_token")  # a token no daemon made
    assert why is not None and "--token" in why
    closed = f"http://127.0.0.1:{free_port()}"
    why = launch.daemon_refusal(closed, None, timeout_s=2.0)
    assert why is not None and why.startswith(f"no agentpark daemon answers at {closed}")


def test_serve_refuses_before_starting_vllm_when_the_daemon_will_not_take_it(
    make_settings: Callable[..., Settings],
    daemon_factory: Callable[[Settings], Daemon],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reference = daemon_factory(make_settings())
    monkeypatch.setattr(launch, "vllm_installed", lambda: True)  # STAND-IN: no vLLM here

    def no_exec(*args: object) -> None:
        raise AssertionError("vLLM must not start")

    monkeypatch.setattr(os, "execve", no_exec)
    assert launch.serve("./m", daemon_url=reference.url) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("agentpark: the daemon at ")
