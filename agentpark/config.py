"""Settings: embedded defaults < TOML file < AGENTPARK_* environment < command-line flags.

The daemon validates everything at start and refuses to run on a bad value, naming the
key, the value and the allowed range. deploy/agentpark.example.toml documents every key;
tests/test_config.py checks that file against this module.
"""

from __future__ import annotations

import os
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel, ByteSize, ConfigDict, Field, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from agentpark.errors import ConfigError

__all__ = ["Settings", "load_settings"]

CONFIG_ENV = "AGENTPARK_CONFIG"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerSettings(_Section):
    host: str = "127.0.0.1"
    port: int = Field(8470, ge=0, le=65535, description="0 picks a free port")


class ModelSettings(_Section):
    """The reference engine's transformer; tiny by default so it runs anywhere."""

    d_model: int = Field(64, ge=8, le=16384)
    n_layers: int = Field(2, ge=1, le=256)
    n_heads: int = Field(4, ge=1, le=256)
    n_kv_heads: int = Field(2, ge=1, le=256)
    head_dim: int = Field(16, ge=2, le=1024)
    ffn_dim: int = Field(128, ge=1, le=65536)
    max_seq_len: int = Field(1024, ge=16, le=1_048_576)
    seed: int = Field(0, ge=0, le=2**31 - 1)

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelSettings:
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even (rotary embedding)")
        return self


class PoolSettings(_Section):
    """The paged KV pool in accelerator memory (host memory on the CPU backend)."""

    block_size: int = Field(16, ge=1, le=4096, description="tokens per KV block")
    num_blocks: int = Field(256, ge=1, le=16_777_216)


class DramTierSettings(_Section):
    capacity: ByteSize = Field(ByteSize(256 * 2**20), ge=0, le=2**50)


class TierSettings(_Section):
    dram: DramTierSettings = DramTierSettings()


class DmaSettings(_Section):
    backend: Literal["auto", "host_copy"] = "auto"


class LimitSettings(_Section):
    max_new_tokens: int = Field(512, ge=1, le=1_048_576)


class Settings(BaseSettings):
    """The whole configuration of one daemon."""

    model_config = SettingsConfigDict(
        env_prefix="AGENTPARK_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    state_dir: Path = Path(".agentpark")
    db_url: str | None = Field(None, description="default: sqlite file in state_dir")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    server: ServerSettings = ServerSettings()
    model: ModelSettings = ModelSettings()
    pool: PoolSettings = PoolSettings()
    tiers: TierSettings = TierSettings()
    dma: DmaSettings = DmaSettings()
    limits: LimitSettings = LimitSettings()

    @property
    def database_url(self) -> str:
        return self.db_url or f"sqlite:///{self.state_dir / 'agentpark.db'}"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        toml_file = _TOML_FILE.get()
        if toml_file is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml_file))
        return tuple(sources)


# The file the Settings() being built reads; sources are made per class, so the path
# travels in a context variable rather than through a subclass per file.
_TOML_FILE: ContextVar[Path | None] = ContextVar("agentpark_toml_file", default=None)


def load_settings(config_path: Path | None = None, **overrides: Any) -> Settings:
    """Build validated settings; raise ConfigError naming each bad key and its range."""
    path = config_path
    if path is None and os.environ.get(CONFIG_ENV):
        path = Path(os.environ[CONFIG_ENV])
    if path is not None and not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    if path is not None and not path.is_file():
        raise ConfigError(f"config file {path} is not a regular file")
    token = _TOML_FILE.set(path)
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path)) from None
    except (ValueError, OSError) as exc:  # TOML syntax errors surface as ValueError
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    finally:
        _TOML_FILE.reset(token)


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
