"""load_settings: find the TOML file, build Settings, and name each bad key with its range."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import annotated_types
from pydantic import ValidationError

from agentpark.config.settings import TOML_FILE, Settings
from agentpark.errors import ConfigError

CONFIG_ENV = "AGENTPARK_CONFIG"


def load_settings(config_path: Path | None = None, **overrides: Any) -> Settings:
    """Build validated settings; raise ConfigError naming each bad key and its range."""
    path = config_path
    if path is None and os.environ.get(CONFIG_ENV):
        path = Path(os.environ[CONFIG_ENV])
    if path is not None and not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    if path is not None and not path.is_file():
        raise ConfigError(f"config file {path} is not a regular file")
    token = TOML_FILE.set(path)
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path)) from None
    except (ValueError, OSError) as exc:  # TOML syntax errors surface as ValueError
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    finally:
        TOML_FILE.reset(token)


def _describe(exc: ValidationError, path: Path | None) -> str:
    where = f" (config file {path}, environment AGENTPARK_*)" if path else " (AGENTPARK_*)"
    lines = [f"invalid configuration{where}:"]
    for err in exc.errors():
        loc = tuple(str(p) for p in err["loc"])
        key = ".".join(loc) or "<root>"
        allowed = _allowed_range(loc)
        value = err.get("input")
        shown = "" if isinstance(value, dict) else f" = {value!r}"
        lines.append(f"  {key}{shown}: {err['msg']}{allowed}")
    return "\n".join(lines)


def _allowed_range(loc: tuple[str, ...]) -> str:
    """Find the field's ge/le bounds so the message names the whole allowed range."""
    model: Any = Settings
    field = None
    for part in loc:
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            return ""
        field = fields[part]
        model = field.annotation
    if field is None:
        return ""
    low = high = None
    for meta in field.metadata:
        if isinstance(meta, annotated_types.Ge):
            low = meta.ge
        elif isinstance(meta, annotated_types.Le):
            high = meta.le
    if low is None and high is None:
        return ""
    return f" (allowed: {'' if low is None else low}..{'' if high is None else high})"
