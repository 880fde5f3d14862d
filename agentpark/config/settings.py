"""The whole configuration of one daemon and where it is read from, in order of precedence.

Sources, strongest first: keyword overrides (the command-line flags), AGENTPARK_* environment
variables (nested keys with ``__``), the TOML file, the embedded defaults.
"""

from __future__ import annotations

from contextvars import ContextVar
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from agentpark.config.sections import (
    AuthSettings,
    DashboardSettings,
    DmaSettings,
    IntegritySettings,
    LimitSettings,
    ModelSettings,
    MoveSettings,
    PolicySettings,
    PoolSettings,
    ReliabilitySettings,
    RetentionSettings,
    ServerSettings,
    ShutdownSettings,
    TierSettings,
)
from agentpark.config.serving import KvEventsSettings, VllmSettings

# The file the Settings() being built reads; sources are made per class, so the path
# travels in a context variable rather than through a subclass per file.
TOML_FILE: ContextVar[Path | None] = ContextVar("agentpark_toml_file", default=None)


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
    auth: AuthSettings = AuthSettings()
    integrity: IntegritySettings = IntegritySettings()
    shutdown: ShutdownSettings = ShutdownSettings()
    reliability: ReliabilitySettings = ReliabilitySettings()
    policy: PolicySettings = PolicySettings()
    dashboard: DashboardSettings = DashboardSettings()
    vllm: VllmSettings = VllmSettings()
    kv_events: KvEventsSettings = KvEventsSettings()
    moves: MoveSettings = MoveSettings()
    retention: RetentionSettings = RetentionSettings()

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
        toml_file = TOML_FILE.get()
        if toml_file is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml_file))
        return tuple(sources)
