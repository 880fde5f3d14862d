"""Settings: embedded defaults < TOML file < AGENTPARK_* environment < command-line flags.

The daemon validates everything at start and refuses to run on a bad value, naming the
key, the value and the allowed range. deploy/agentpark.example.toml documents every key;
tests/test_config.py checks that file against this package.

The modules behind this face: ``sections`` (one model per TOML table), ``settings`` (the
whole, and its sources in order) and ``loading`` (load_settings and its error messages).
"""

from agentpark.config.loading import CONFIG_ENV, load_settings
from agentpark.config.sections import (
    DashboardSettings,
    DmaSettings,
    ModelSettings,
    PolicySettings,
    RetentionSettings,
)
from agentpark.config.settings import Settings

__all__ = [
    "CONFIG_ENV",
    "DashboardSettings",
    "DmaSettings",
    "ModelSettings",
    "PolicySettings",
    "RetentionSettings",
    "Settings",
    "load_settings",
]
