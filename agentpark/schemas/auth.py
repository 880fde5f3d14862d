"""Bodies of the token routes (``/v1/admin/tokens``): wire models only, like the others.

Scopes are spelled out here (not :class:`agentpark.auth.Scope`, whose module reads the
store); tests/api/test_auth.py checks that the two name the same scopes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

__all__ = ["ScopeName", "TokenCreate", "TokenCreated", "TokenOut", "TokenPage"]

ScopeName = Literal["sessions", "operator", "admin"]
TenantName = Annotated[
    str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", max_length=128)
]


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant: TenantName = Field(description="the tenant the token acts as")
    scopes: list[ScopeName] = Field(min_length=1, max_length=3)


class TokenOut(BaseModel):
    """A token as listed: everything but the secret, which is never stored."""

    id: str = Field(description="the public part of apk_<id>_<secret>")
    tenant: str
    scopes: list[ScopeName]
    created_at: datetime
    last_used_at: datetime | None = Field(description="to the minute; null: never used")
    revoked_at: datetime | None


class TokenCreated(TokenOut):
    token: str = Field(description="apk_<id>_<secret>: shown this once, stored only hashed")


class TokenPage(BaseModel):
    tokens: list[TokenOut]
