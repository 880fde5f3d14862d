"""Settings: the example file, validation messages, precedence, and the CLI's refusal."""

from __future__ import annotations

import os
import re
import tomllib
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import annotated_types
import pytest
from pydantic import BaseModel

from agentpark import cli
from agentpark.config import Settings, load_settings
from agentpark.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[1] / "deploy" / "agentpark.example.toml"

# `key = value` or `# key = value` (a commented-out assignment), and `[table]` headers.
_ASSIGNMENT = re.compile(r"^(?P<commented>#\s*)?(?P<key>[A-Za-z_][A-Za-z0-9_]*)\s*=")
_TABLE = re.compile(r"^\[(?P<name>[A-Za-z0-9_.]+)\]\s*$")


@pytest.fixture(autouse=True)
def _no_agentpark_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("AGENTPARK_"):
            monkeypatch.delenv(name)


def _fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, FieldInfo) for every leaf of a settings model, sections walked."""
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from _fields(ann, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", field


LEAVES = dict(_fields(Settings))


def _env_var(key: str) -> str:
    return "AGENTPARK_" + key.replace(".", "__").upper()


def _toml_keys(table: dict[str, Any], prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for name, value in table.items():
        if isinstance(value, dict) and f"{prefix}{name}" not in LEAVES:  # a dict value is a leaf
            keys |= _toml_keys(value, f"{prefix}{name}.")
        else:
            keys.add(f"{prefix}{name}")
    return keys


def _documented_keys(text: str) -> dict[str, tuple[bool, str]]:
    """Dotted key -> (commented out?, the comment block right above its line)."""
    found: dict[str, tuple[bool, str]] = {}
    table = ""
    comments: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        header = _TABLE.match(stripped)
        assignment = _ASSIGNMENT.match(stripped)
        if header:
            table = header["name"] + "."
            comments = []
        elif assignment and (not assignment["commented"] or _is_toml(stripped.lstrip("#").strip())):
            key = table + assignment["key"]
            assert key not in found, f"{key} appears twice in {EXAMPLE.name}"
            found[key] = (bool(assignment["commented"]), "\n".join(comments))
            comments = []
        elif stripped.startswith("#"):
            comments.append(stripped)
        else:
            comments = []  # a blank line ends a comment block
    return found


def _is_toml(text: str) -> bool:
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return False
    return True


def _bounds(field: Any) -> tuple[Any, Any]:
    low = high = None
    for meta in field.metadata:
        if isinstance(meta, annotated_types.Ge):
            low = meta.ge
        elif isinstance(meta, annotated_types.Le):
            high = meta.le
    return low, high


def _write(tmp_path: Path, text: str, name: str = "agentpark.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- the example file ------------------------------------------------------------------


def test_example_file_gives_the_defaults() -> None:
    from_file = load_settings(EXAMPLE)
    defaults = load_settings()
    assert from_file.model_dump() == defaults.model_dump()
    assert from_file.database_url == defaults.database_url


def test_settings_from_a_file_are_plain_settings() -> None:
    from_file = load_settings(EXAMPLE)
    assert type(from_file) is Settings
    assert from_file == load_settings()


def test_example_file_has_every_key_and_no_other() -> None:
    text = EXAMPLE.read_text()
    set_keys = _toml_keys(tomllib.loads(text))
    documented = _documented_keys(text)
    commented = {key for key, (is_comment, _) in documented.items() if is_comment}

    assert set_keys == {key for key, (is_comment, _) in documented.items() if not is_comment}
    assert set_keys - LEAVES.keys() == set(), "keys Settings does not know"
    assert commented - LEAVES.keys() == set(), "commented keys Settings does not know"
    assert LEAVES.keys() - set_keys - commented == set(), "keys the file does not document"
    # Only a key whose default is "unset" may be left commented out.
    assert {key for key in commented if LEAVES[key].default is not None} == set()
    assert set_keys & commented == set()


@pytest.mark.parametrize("key", sorted(LEAVES))
def test_example_comment_gives_default_range_and_env_var(key: str) -> None:
    documented = _documented_keys(EXAMPLE.read_text())
    assert key in documented
    _, comment = documented[key]
    field = LEAVES[key]
    assert _env_var(key) in comment
    assert "Default:" in comment
    low, high = _bounds(field)
    if low is not None or high is not None:
        assert f"{'' if low is None else low}..{'' if high is None else high}" in comment
    if typing.get_origin(field.annotation) is typing.Literal:
        for allowed in typing.get_args(field.annotation):
            assert f'"{allowed}"' in comment


def test_every_documented_env_var_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    # The env var names the file gives are the ones pydantic-settings really reads.
    changed = {
        "state_dir": "/srv/agentpark",
        "db_url": "sqlite:////srv/agentpark/other.db",
        "log_level": "debug",
        "server.host": "0.0.0.0",
        "server.port": "9001",
        "server.keep_alive_s": "120",
        "model.d_model": "32",
        "model.n_layers": "3",
        "model.n_heads": "8",
        "model.n_kv_heads": "4",
        "model.head_dim": "8",
        "model.ffn_dim": "64",
        "model.max_seq_len": "2048",
        "model.seed": "7",
        "pool.block_size": "32",
        "pool.num_blocks": "128",
        "tiers.dram.capacity": "1GiB",
        "dma.backend": "host_copy",
        "dma.tpu_sync_on_cpu": "true",
        "dma.tpu_sync_shm": "true",
        "dma.copy_threads": "2",
        "dma.hash_thread": "true",
        "dma.native_copy": "false",
        "limits.max_new_tokens": "64",
        "limits.max_body_bytes": "4096",
        "limits.max_metadata_bytes": "1024",
        "limits.admission_timeout_s": "5",
        "limits.background_yield_s": "5",
        "limits.max_streams": "4",
        "limits.max_streams_per_tenant": "2",
        "limits.stream_queue_events": "16",
        "limits.stream_keepalive_s": "1",
        "auth.failure_burst": "10",
        "auth.failure_rate_per_s": "1",
        "auth.max_peers": "100",
        "reliability.tier_files": "adopt",
        "reliability.storage_probe_s": "2",
        "dashboard.host_label": "gpu-7",
        "dashboard.sample_interval_s": "5",
        "dashboard.retention_h": "72",
        "dashboard.downsample": '[{"after_h": 2, "step_s": 120}]',
        "dashboard.refresh_s": "10",
        "dashboard.peers": '["http://gpu-8:8470"]',
        "dashboard.peer_timeout_s": "2",
        "tiers.shm.capacity": "64MiB",
        "tiers.shm.path": "/dev/shm/agentpark-elsewhere",
        "tiers.disk.capacity": "1GiB",
        "tiers.disk.path": "/srv/agentpark/disk.bin",
        "integrity.checksum": "none",
        "integrity.tiers": '["dram"]',
        "shutdown.drain": "false",
        "shutdown.deadline_s": "5",
        "policy.enabled": "false",
        "policy.tick_s": "2",
        "policy.idle_pause_after_s": "60",
        "policy.min_pause_s": "1",
        "policy.overhead_s": "0.01",
        "policy.demote_after_s": '{"dram": 60}',
        "policy.hbm_high_watermark": "0.8",
        "policy.prefetch_lead_s": "1",
        "policy.tool_quantile": "0.9",
        "policy.tool_window": "8",
        "policy.parked_ttl_s": "7200",
        "policy.tools": '{"web_search": {"expected_pause_s": 8}}',
        "vllm.enabled": "true",
        "vllm.pool_capacity": "64MiB",
        "vllm.pool_path": "/dev/shm/agentpark-vllm-elsewhere",
        "vllm.control_socket": "/srv/agentpark/control.sock",
        "vllm.plan_timeout_s": "30",
        "vllm.anonymous_share": "0.5",
        "vllm.anonymous_ttl_s": "60",
        "vllm.block_hash": "sha256_cbor",
        "vllm.none_hash_seed": "42",
        "vllm.turn_end": "pin",
        "vllm.pin_ttl_s": "12.5",
        "vllm.pin_margin": "3",
        "vllm.pin_share": "0.4",
        "kv_events.endpoint": "tcp://127.0.0.1:5557",
        "kv_events.connect": "true",
        "kv_events.replay_endpoint": "tcp://127.0.0.1:5558",
        "kv_events.topic": "kv",
        "kv_events.buffer_steps": "10",
        "kv_events.hwm": "10",
        "kv_events.max_queue_size": "10",
        "kv_events.tenant": "router",
        "kv_events.block_hashes": "bytes",
        "retention.events_h": "24",
        "retention.tool_returns_h": "720",
        "retention.deleted_h": "1",
        "retention.batch_rows": "100",
        "moves.data": "on",
        "moves.data_port": "8479",
        "moves.data_connections": "2",
        "moves.data_idle_s": "5",
        "moves.ticket_ttl_s": "10",
        "moves.batch_sessions": "8",
    }
    assert changed.keys() == LEAVES.keys(), "a new key needs a line here"
    defaults = load_settings(EXAMPLE).model_dump()
    for key, value in changed.items():
        monkeypatch.setenv(_env_var(key), value)
    settings = load_settings(EXAMPLE).model_dump()
    for key in changed:
        *sections, leaf = key.split(".")
        got, default = settings, defaults
        for section in sections:
            got, default = got[section], default[section]
        assert got[leaf] != default[leaf], f"{_env_var(key)} was not read"


# --- refusals ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "key", "value", "allowed"),
    [
        ("pool", "block_size", "0", "1..4096"),
        ("pool", "num_blocks", "16777217", "1..16777216"),
        ("server", "port", "70000", "0..65535"),
        ("server", "keep_alive_s", "0", "1..3600"),
        ("server", "keep_alive_s", "3601", "1..3600"),
        ("model", "max_seq_len", "8", "16..1048576"),
        ("limits", "max_new_tokens", "0", "1..1048576"),
        ("dma", "copy_threads", "0", "1..64"),
        ("dma", "copy_threads", "65", "1..64"),
        ("tiers.dram", "capacity", '"2PiB"', "0..1125899906842624"),
    ],
)
def test_bad_value_names_key_value_and_range(
    tmp_path: Path, section: str, key: str, value: str, allowed: str
) -> None:
    path = _write(tmp_path, f"[{section}]\n{key} = {value}\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    message = info.value.message
    assert f"{section}.{key} = " in message
    assert f"(allowed: {allowed})" in message
    assert str(path) in message


def test_bad_choice_names_the_choices(tmp_path: Path) -> None:
    path = _write(tmp_path, '[dma]\nbackend = "cuda"\n')
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert "dma.backend = 'cuda'" in info.value.message
    assert "'auto'" in info.value.message
    assert "'host_copy'" in info.value.message


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("bogus = 1\n", "bogus"),
        ("[pool]\nnum_blocks = 8\nblok_size = 16\n", "pool.blok_size"),
        ("[tiers.dram]\ncapacity = 0\nsize = 1\n", "tiers.dram.size"),
        ("[policies]\nidle_pause_after_s = 30\n", "policies"),
        ("[policy]\nidle_after_s = 30\n", "policy.idle_after_s"),
    ],
)
def test_unknown_key_is_refused_by_name(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(_write(tmp_path, text))
    assert re.search(rf"^  {re.escape(key)}\b", info.value.message, re.MULTILINE)
    assert "not permitted" in info.value.message


def test_toml_syntax_error_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, "[pool\nnum_blocks = 8\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert f"cannot read config file {path}" in info.value.message
    assert "line 1" in info.value.message


def test_missing_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match="does not exist") as info:
        load_settings(missing)
    assert str(missing) in info.value.message
    monkeypatch.setenv("AGENTPARK_CONFIG", str(missing))
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings()


def test_unreadable_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, "[pool]\nnum_blocks = 8\n")

    def denied(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(tomllib, "load", denied)  # chmod 000 does not stop root
    with pytest.raises(ConfigError, match="Permission denied"):
        load_settings(path)


def test_heads_not_a_multiple_of_kv_heads_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, "[model]\nn_heads = 6\nn_kv_heads = 4\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert "n_heads (6)" in info.value.message
    assert "n_kv_heads (4)" in info.value.message
    assert re.search(r"^  model\b", info.value.message, re.MULTILINE)


def test_odd_head_dim_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"head_dim \(15\) must be even"):
        load_settings(_write(tmp_path, "[model]\nhead_dim = 15\n"))


# --- precedence --------------------------------------------------------------------------


def test_env_wins_over_file_key_by_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, "[pool]\nnum_blocks = 5\nblock_size = 8\n")
    assert load_settings(path).pool.num_blocks == 5
    monkeypatch.setenv("AGENTPARK_POOL__NUM_BLOCKS", "7")
    settings = load_settings(path)
    assert settings.pool.num_blocks == 7
    assert settings.pool.block_size == 8  # the file's other keys in that section stay


def test_bad_env_value_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTPARK_POOL__NUM_BLOCKS", "0")
    with pytest.raises(ConfigError) as info:
        load_settings(_write(tmp_path, ""))
    assert "pool.num_blocks = " in info.value.message
    assert "(allowed: 1..16777216)" in info.value.message


def test_config_env_var_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTPARK_CONFIG", str(_write(tmp_path, "[pool]\nnum_blocks = 9\n")))
    assert load_settings().pool.num_blocks == 9
    # An explicit path wins over AGENTPARK_CONFIG.
    assert load_settings(_write(tmp_path, "", "other.toml")).pool.num_blocks == 256


def test_overrides_win_over_env_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTPARK_STATE_DIR", str(tmp_path / "from-env"))
    path = _write(tmp_path, f'state_dir = "{(tmp_path / "from-file").as_posix()}"\n')
    assert load_settings(path).state_dir == tmp_path / "from-env"
    assert load_settings(path, state_dir=tmp_path / "kw").state_dir == tmp_path / "kw"


# --- the command line --------------------------------------------------------------------


def test_cli_refuses_bad_config_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    path = _write(tmp_path, f'state_dir = "{state.as_posix()}"\n[pool]\nblock_size = 0\n')
    assert cli.main(["--config", str(path), "db", "upgrade"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("agentpark: invalid configuration")
    assert "pool.block_size = 0" in err
    assert "(allowed: 1..4096)" in err
    assert not state.exists()  # refused before anything was written


def test_cli_refuses_missing_config_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["--config", str(tmp_path / "nope.toml"), "db", "upgrade"]) == 2
    assert "nope.toml does not exist" in capsys.readouterr().err


def test_cli_db_upgrade_with_good_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    path = _write(tmp_path, f'state_dir = "{state.as_posix()}"\n')
    assert cli.main(["--config", str(path), "db", "upgrade"]) == 0
    database = state / "agentpark.db"
    assert database.is_file()
    assert database.read_bytes().startswith(b"SQLite format 3\x00")
    assert str(database) in capsys.readouterr().out


# --- the uvicorn config `agentpark serve` builds --------------------------------------------


def test_keep_alive_defaults_above_client_pool_idle_times() -> None:
    config = cli.uvicorn_config(object(), load_settings(EXAMPLE))
    assert config.timeout_keep_alive == 75  # uvicorn's own default is 5 s
    assert config.timeout_graceful_shutdown == 10
    assert (config.host, config.port) == ("127.0.0.1", 8470)


def test_keep_alive_from_the_file_reaches_uvicorn(tmp_path: Path) -> None:
    path = _write(tmp_path, '[server]\nkeep_alive_s = 300\nhost = "0.0.0.0"\nport = 9001\n')
    settings = load_settings(path)
    assert settings.server.keep_alive_s == 300
    config = cli.uvicorn_config(object(), settings)
    assert config.timeout_keep_alive == 300
    assert (config.host, config.port) == ("0.0.0.0", 9001)
