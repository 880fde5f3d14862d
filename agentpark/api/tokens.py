"""/v1/admin/tokens: the token CLI's create, list and revoke over HTTP (admin scope).

The same table as ``agentpark token ...`` (agentpark.auth.TokenStore); a token revoked
here is refused from the next request on, like one revoked by the CLI.
"""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter, Request, status

from agentpark.api.deps import ADMIN, AUTH_ERRORS
from agentpark.api.errors_wire import error_responses
from agentpark.auth import Gate, TokenInfo, parse_scopes
from agentpark.errors import (
    InvalidRequestError,
    PayloadTooLargeError,
    TokenNotFoundError,
)
from agentpark.schemas.auth import TokenCreate, TokenCreated, TokenOut, TokenPage

__all__ = ["router"]

router = APIRouter(
    prefix="/v1/admin/tokens",
    tags=["admin"],
    dependencies=[ADMIN],
    responses=error_responses(*AUTH_ERRORS),
)


def _gate(request: Request) -> Gate:
    gate: Gate = request.app.state.gate
    return gate


def _when(at: float | None) -> datetime | None:
    return None if at is None else datetime.fromtimestamp(at, UTC)


def _out(info: TokenInfo) -> TokenOut:
    return TokenOut(
        id=info.id,
        tenant=info.tenant,
        scopes=[s.value for s in info.scopes],
        created_at=datetime.fromtimestamp(info.created_at, UTC),
        last_used_at=_when(info.last_used_at),
        revoked_at=_when(info.revoked_at),
    )


@router.get("")
def list_tokens(request: Request) -> TokenPage:
    """Every token, revoked ones too, oldest first; never a secret."""
    return TokenPage(tokens=[_out(t) for t in _gate(request).store.entries()])


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    responses=error_responses(InvalidRequestError, PayloadTooLargeError),
)
def create_token(request: Request, body: TokenCreate) -> TokenCreated:
    """A new token of a tenant; the answer holds the token, the only time it is shown."""
    token, info = _gate(request).store.create(body.tenant, parse_scopes(body.scopes))
    return TokenCreated(**_out(info).model_dump(), token=token)


@router.delete("/{token_id}", responses=error_responses(TokenNotFoundError, InvalidRequestError))
def delete_token(request: Request, token_id: str) -> TokenOut:
    """Revoke a token (idempotent); it is refused from the next request on."""
    info = _gate(request).store.revoke(token_id)
    if info is None:
        raise TokenNotFoundError(token_id)
    return _out(info)
