"""Settings and rows for tests: TINY settings on a temporary state dir, a config file a
child process reads, and a session row as the core writes a new one."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from agentpark.config import Settings, load_settings
from agentpark.store.models import SessionRow

__all__ = ["TINY", "session_row", "tiny_settings", "unset_agentpark_env", "write_config"]

# Small and fast: 2-layer model, 64 blocks of 16 tokens, room for 32 parked blocks.
TINY = {
    "model": {"max_seq_len": 512},
    "pool": {"block_size": 16, "num_blocks": 64},
    "tiers": {"dram": {"capacity": 32 * 4096}},
    # No idle parking unless a test asks: a slow machine must not park sessions mid-test.
    "policy": {"idle_pause_after_s": 0, "tick_s": 0.05},
}


def unset_agentpark_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No AGENTPARK_* variable of the machine leaks into a test."""
    for name in list(os.environ):
        if name.startswith("AGENTPARK_"):
            monkeypatch.delenv(name)


def tiny_settings(state_dir: Path, shm_dir: Path, /, **overrides: Any) -> Settings:
    """TINY with ``overrides`` merged in, on this state dir (unless one overrides it) and shm."""
    tiers = {**TINY["tiers"], "shm": {"capacity": 32 * 4096, "path": shm_dir / "tier"}}
    merged: dict[str, Any] = {"state_dir": state_dir, **TINY, "tiers": tiers}
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return load_settings(None, **merged)


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def write_config(path: Path, settings: Settings) -> Path:
    """The settings as a TOML file a child process can read."""
    lines = [f'state_dir = "{settings.state_dir}"']
    for section in ("model", "pool", "limits", "integrity", "shutdown", "policy", "moves"):
        lines.append(f"[{section}]")
        for key, value in getattr(settings, section).model_dump().items():
            lines.append(f"{key} = {_toml(value)}")
    for tier in ("dram", "shm", "disk"):
        lines.append(f"[tiers.{tier}]")
        for key, value in getattr(settings.tiers, tier).model_dump().items():
            if value is not None:
                lines.append(f"{key} = {_toml(value)}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return f'"{value}"'


def session_row(**fields: Any) -> SessionRow:
    """A session row as the core writes a new one, with ``fields`` changed."""
    values: dict[str, Any] = {
        "session_id": "s",
        "tenant": "t",
        "state": "active",
        "tier": None,
        "num_tokens": 0,
        "kv_blocks": 0,
        "kv_bytes": 0,
        "created_at": 1_700_000_000.0,
        "last_active_at": 1_700_000_000.0,
        "pause_count": 0,
        "meta": {},
        "token_log": b"",
    }
    return SessionRow(**{**values, **fields})
