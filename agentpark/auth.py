"""Bearer tokens: how they are made, stored (hashed) and checked, and who a request is.

A token is ``apk_<id>_<secret>``: ``id`` is 12 hex digits, public (``agentpark token list``
shows it, logs may name it); ``secret`` is 32 random bytes (256 bits) in URL-safe base64.
The database keeps the SHA-256 of the whole token, never the token. A slow KDF (bcrypt,
scrypt, argon2) exists to slow down guessing of low-entropy passwords once their hashes
leak; nobody can enumerate 2**256 random secrets, so one SHA-256 is as strong here and
costs a microsecond per request. A check looks the row up by its id (the primary key) and
compares the hashes with :func:`hmac.compare_digest` (constant time).

Each token is bound to one tenant and to scopes (:class:`Scope`): ``sessions`` (its own
tenant's sessions and events), ``operator`` (read-only host views across tenants) and
``admin`` (drain, policy reload, /v1/admin/tokens). No scope implies another.

Every request reads its token's row: a revocation (``agentpark token revoke``, another
process writing the same SQLite file) is refused from the next request on, with no cache
to invalidate. Revoked rows are kept, so an import never brings one back.

Without a token, a request is refused (401), except on a daemon whose gate allows the
loopback default (:class:`Gate`): bound to a loopback address and with no token in the
database at all (revoked ones count: once tokens are set up, they stay required), it runs
as tenant ``default`` with ``sessions`` and ``operator``; ``admin`` always needs a token.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import Engine, Table, func, insert, select, update

from agentpark.errors import UnauthenticatedError
from agentpark.store.models import ApiTokenRow

__all__ = [
    "ANONYMOUS",
    "DEFAULT_TENANT",
    "TOKEN_ENV",
    "Gate",
    "Identity",
    "Scope",
    "TokenInfo",
    "TokenStore",
    "hash_token",
    "is_loopback",
    "parse_scopes",
    "valid_tenant",
]

TOKEN_ENV = "AGENTPARK_TOKEN"  # what `agentpark status`/`drain` and the clients read
TOKEN_PREFIX = "apk_"
DEFAULT_TENANT = "default"
_ID_RE = re.compile(r"^[0-9a-f]{12}$")
_SECRET_RE = re.compile(r"^[A-Za-z0-9_-]{43}$")
_HASH_RE = re.compile(r"^[0-9a-f]{64}$")
_TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_TOKENS: Table = ApiTokenRow.__table__  # type: ignore[assignment]
_ANY = "SELECT 1 FROM api_tokens LIMIT 1"
_LOOKUP = "SELECT tenant, scopes, token_hash, revoked_at FROM api_tokens WHERE id = ?"
# last_used_at is written at most this often per token (a write per request would cost
# more than the request).
TOUCH_EVERY_S = 60.0


class Scope(StrEnum):
    SESSIONS = "sessions"  # its own tenant's sessions and events
    OPERATOR = "operator"  # read-only host views across tenants
    ADMIN = "admin"  # drain, policy reload, tokens over HTTP


@dataclass(frozen=True)
class Identity:
    """Who a request acts as: the token's tenant and scopes (``token_id`` None: anonymous)."""

    tenant: str
    scopes: frozenset[Scope]
    token_id: str | None


ANONYMOUS = Identity(DEFAULT_TENANT, frozenset({Scope.SESSIONS, Scope.OPERATOR}), None)


@dataclass(frozen=True)
class TokenInfo:
    """A token as ``agentpark token list`` shows it: everything but the secret."""

    id: str
    tenant: str
    scopes: tuple[Scope, ...]
    created_at: float
    last_used_at: float | None
    revoked_at: float | None


def hash_token(token: str) -> str:
    """SHA-256 (hex) of the whole token string: what the database keeps."""
    return hashlib.sha256(token.encode()).hexdigest()


def parse_scopes(text: str | Iterable[str]) -> tuple[Scope, ...]:
    """``sessions,operator`` (or a list of names) as sorted scopes; ValueError naming a bad one."""
    names = text.split(",") if isinstance(text, str) else list(text)
    scopes: set[Scope] = set()
    for name in (n.strip() for n in names):
        if not name:
            continue
        try:
            scopes.add(Scope(name))
        except ValueError:
            allowed = ", ".join(s.value for s in Scope)
            raise ValueError(f"unknown scope {name!r} (allowed: {allowed})") from None
    if not scopes:
        raise ValueError("at least one scope is needed (sessions, operator, admin)")
    return tuple(sorted(scopes))


def valid_tenant(name: str) -> bool:
    return bool(_TENANT_RE.match(name))


def is_loopback(host: str) -> bool:
    """Whether a bind address only accepts connections from this machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve to anything


def _split(token: str) -> tuple[str, str] | None:
    """(id, secret) of a well-formed token; None otherwise."""
    if not token.startswith(TOKEN_PREFIX):
        return None
    token_id, sep, secret = token[len(TOKEN_PREFIX) :].partition("_")
    if not sep or not _ID_RE.match(token_id) or not _SECRET_RE.match(secret):
        return None
    return token_id, secret


def _info(row: ApiTokenRow) -> TokenInfo:
    return TokenInfo(
        row.id,
        row.tenant,
        parse_scopes(row.scopes),
        row.created_at,
        row.last_used_at,
        row.revoked_at,
    )


class TokenStore:
    """The ``api_tokens`` table: create, list, revoke, export/import, and the check."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # The request path's reads (a token's row, whether any exists) go through one DBAPI
        # connection kept out of the pool: ~12 us a read instead of ~100 us for a pool
        # checkout, a statement and the rollback on return. Outside a transaction (pysqlite
        # begins one only before a write), each read sees the latest commit of any process.
        self._reader: Any = None
        self._reader_lock = threading.Lock()

    @classmethod
    def open(cls, database_url: str) -> TokenStore:
        """A store on its own engine (the daemon's gate, the CLI); the schema must be there."""
        from agentpark.store.db import open_database

        engine, _ = open_database(database_url)
        return cls(engine)

    def close(self) -> None:
        with self._reader_lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None
        self.engine.dispose()

    def _read(self, sql: str, *params: str) -> list[tuple[Any, ...]]:
        """All rows of one read (fetched to the end: no read transaction stays open)."""
        with self._reader_lock:
            if self._reader is None:
                self._reader = self.engine.raw_connection()
            cursor = self._reader.cursor()
            try:
                rows: list[tuple[Any, ...]] = cursor.execute(sql, params).fetchall()
            finally:
                cursor.close()
            return rows

    # ---- administration (the CLI) ----------------------------------------------------------

    def create(self, tenant: str, scopes: Iterable[Scope]) -> tuple[str, TokenInfo]:
        """A new token for ``tenant``: (the token, shown once; what is stored of it)."""
        if not valid_tenant(tenant):
            raise ValueError(f"tenant {tenant!r}: 1-128 letters, digits or ._-, not ._- first")
        names = ",".join(parse_scopes([s.value for s in scopes]))
        token_id = secrets.token_hex(6)
        token = f"{TOKEN_PREFIX}{token_id}_{secrets.token_urlsafe(32)}"
        now = time.time()
        with self.engine.begin() as conn:
            conn.execute(
                insert(_TOKENS).values(
                    id=token_id,
                    tenant=tenant,
                    scopes=names,
                    token_hash=hash_token(token),
                    created_at=now,
                )
            )
        return token, TokenInfo(token_id, tenant, parse_scopes(names), now, None, None)

    def entries(self) -> list[TokenInfo]:
        """Every token, revoked ones too, oldest first."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(_TOKENS).order_by(_TOKENS.c.created_at, _TOKENS.c.id))
            return [_info(ApiTokenRow(**row._mapping)) for row in rows]

    def revoke(self, token_id: str) -> TokenInfo | None:
        """Revoke a token (idempotent: the first revocation's time stays); None if unknown."""
        token_id = token_id.removeprefix(TOKEN_PREFIX)
        with self.engine.begin() as conn:
            conn.execute(
                update(_TOKENS)
                .where(_TOKENS.c.id == token_id, _TOKENS.c.revoked_at.is_(None))
                .values(revoked_at=time.time())
            )
            row = conn.execute(select(_TOKENS).where(_TOKENS.c.id == token_id)).first()
        return None if row is None else _info(ApiTokenRow(**row._mapping))

    def export_lines(self) -> list[str]:
        """The active tokens as ``<id> <tenant> <scopes> sha256:<hash>`` lines (no secrets)."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(_TOKENS).where(_TOKENS.c.revoked_at.is_(None)).order_by(_TOKENS.c.id)
            )
            return [f"{r.id} {r.tenant} {r.scopes} sha256:{r.token_hash}" for r in rows]

    def import_lines(self, lines: Iterable[str]) -> tuple[int, int]:
        """Add the tokens of an export (``#`` comments and blank lines skipped).

        Returns (added, already there). A token already known with the same hash is left
        as it is (a revoked one stays revoked); the same id with another hash, tenant or
        scopes is refused, and so is a malformed line: ValueError naming the line, and
        nothing is imported.
        """
        wanted: list[tuple[str, str, str, str]] = []
        for number, raw in enumerate(lines, start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            if len(parts) != 4 or not parts[3].startswith("sha256:"):
                raise ValueError(f"line {number}: expected '<id> <tenant> <scopes> sha256:<hex>'")
            token_id, tenant, scope_text, digest = parts
            digest = digest.removeprefix("sha256:")
            if not _ID_RE.match(token_id):
                raise ValueError(f"line {number}: token id {token_id!r} is not 12 hex digits")
            if not valid_tenant(tenant):
                raise ValueError(f"line {number}: tenant {tenant!r} is not a valid name")
            if not _HASH_RE.match(digest):
                raise ValueError(f"line {number}: the hash is not 64 hex digits")
            try:
                scopes = ",".join(parse_scopes(scope_text))
            except ValueError as exc:
                raise ValueError(f"line {number}: {exc}") from None
            wanted.append((token_id, tenant, scopes, digest))
        added = same = 0
        with self.engine.begin() as conn:
            for token_id, tenant, scopes, digest in wanted:
                row = conn.execute(select(_TOKENS).where(_TOKENS.c.id == token_id)).first()
                if row is None:
                    conn.execute(
                        insert(_TOKENS).values(
                            id=token_id,
                            tenant=tenant,
                            scopes=scopes,
                            token_hash=digest,
                            created_at=time.time(),
                        )
                    )
                    added += 1
                elif (row.token_hash, row.tenant, row.scopes) == (digest, tenant, scopes):
                    same += 1
                else:
                    raise ValueError(
                        f"token {token_id} exists with another hash, tenant or scopes; "
                        "revoke it and import a new one"
                    )
        return added, same

    # ---- the check (the daemon, on every request) ----------------------------------------

    def any_token(self) -> bool:
        """Whether the table has a row at all (revoked ones count)."""
        return bool(self._read(_ANY))

    def active_count(self) -> int:
        with self.engine.connect() as conn:
            stmt = select(func.count()).select_from(_TOKENS).where(_TOKENS.c.revoked_at.is_(None))
            return int(conn.execute(stmt).scalar_one())

    def authenticate(self, token: str) -> Identity:
        """The identity of a token; UnauthenticatedError (401) when it is not a valid one."""
        parts = _split(token)
        if parts is None:
            raise UnauthenticatedError(
                "the bearer token is not an agentpark token (apk_<id>_<secret>)",
                invalid_token=True,
            )
        token_id = parts[0]
        rows = self._read(_LOOKUP, token_id)
        tenant, scopes, stored, revoked_at = rows[0] if rows else ("", "", "0" * 64, None)
        # Compare even when the id is unknown, so the time taken does not tell.
        matches = hmac.compare_digest(str(stored), hash_token(token))
        if not rows or not matches:
            raise UnauthenticatedError("unknown bearer token", invalid_token=True)
        if revoked_at is not None:
            raise UnauthenticatedError(
                f"token {token_id} was revoked", invalid_token=True, token_id=token_id
            )
        return Identity(tenant, frozenset(parse_scopes(scopes)), token_id)

    def touch(self, token_id: str, at: float) -> None:
        with self.engine.begin() as conn:
            conn.execute(update(_TOKENS).where(_TOKENS.c.id == token_id).values(last_used_at=at))


class Gate:
    """How one app authenticates requests (see the module doc).

    ``anonymous``: the loopback default may apply (the daemon binds a loopback address);
    it applies while the database holds no token. Once a row is seen it is remembered:
    rows are never deleted.
    """

    def __init__(self, store: TokenStore, *, anonymous: bool) -> None:
        self.store = store
        self.anonymous = anonymous
        self._tokens_seen = False
        self._touched: dict[str, float] = {}
        self._lock = threading.Lock()

    def open_default(self) -> bool:
        """Whether a request without a token runs as :data:`ANONYMOUS` now."""
        if not self.anonymous or self._tokens_seen:
            return False
        if self.store.any_token():
            self._tokens_seen = True
            return False
        return True

    def identify(self, authorization: str | None) -> Identity:
        """The identity of a request from its ``Authorization`` header (None: absent)."""
        if authorization is None:
            if self.open_default():
                return ANONYMOUS
            raise UnauthenticatedError(
                "this route needs 'Authorization: Bearer <token>' "
                "(make one with: agentpark token create --tenant NAME --scope SCOPE)"
            )
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise UnauthenticatedError(
                "the Authorization header must be 'Bearer <token>'", invalid_token=True
            )
        return self.store.authenticate(token.strip())

    def due_for_touch(self, token_id: str) -> float | None:
        """The time to write as last_used_at, at most once per TOUCH_EVERY_S; else None."""
        now = time.monotonic()
        with self._lock:
            last = self._touched.get(token_id)
            if last is not None and now - last < TOUCH_EVERY_S:
                return None
            self._touched[token_id] = now
        return time.time()
