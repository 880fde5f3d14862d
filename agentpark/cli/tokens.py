"""``agentpark token create | list | revoke | export | import``: the state dir's bearer
tokens, worked on in its database directly, whether a daemon runs on it or not."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from agentpark.cli.common import Commands, Subparsers, settings_of
from agentpark.config import Settings

if TYPE_CHECKING:
    from agentpark.auth import TokenStore

__all__ = [
    "add_token_commands",
    "token_create",
    "token_export",
    "token_import",
    "token_list",
    "token_revoke",
    "token_store",
]


def add_token_commands(commands: Commands, sub: Subparsers[argparse.ArgumentParser]) -> None:
    token_sub = commands.group(
        sub,
        "token",
        "token commands",
        help="bearer tokens: create, list, revoke, export, import",
    )
    create = commands.add(
        token_sub, "create", help="make a token for a tenant; prints it once (stored hashed)"
    )
    create.add_argument("--tenant", required=True, help="the tenant the token acts as")
    create.add_argument(
        "--scope",
        required=True,
        help="comma-separated: sessions (its tenant's sessions), operator (read-only host "
        "views of every tenant), admin (drain, reload)",
    )
    create.set_defaults(run=token_create)
    listing = commands.add(
        token_sub, "list", help="every token: id, tenant, scopes, created, last used"
    )
    listing.set_defaults(run=token_list)
    revoke = commands.add(
        token_sub, "revoke", help="revoke a token; a running daemon refuses it at once"
    )
    revoke.add_argument("id", help="the token's id (apk_<id>_...), as `token list` shows it")
    revoke.set_defaults(run=token_revoke)
    export = commands.add(
        token_sub,
        "export",
        help="print the active tokens as hashed lines (no secrets) for `token import`",
    )
    export.set_defaults(run=token_export)
    load = commands.add(
        token_sub,
        "import",
        help="add the tokens of a `token export` file (a Kubernetes Secret, a systemd credential)",
    )
    load.add_argument("file", type=Path, help="the file of hashed tokens; '-' reads stdin")
    load.set_defaults(run=token_import)


@contextmanager
def token_store(settings: Settings) -> Iterator[TokenStore]:
    """The state dir's token table (migrated first: a new state dir works too)."""
    from agentpark.auth import TokenStore
    from agentpark.statedir import private_dir
    from agentpark.store.migrate import upgrade

    private_dir(settings.state_dir)
    upgrade(settings.database_url)
    store = TokenStore.open(settings.database_url)
    try:
        yield store
    finally:
        store.close()


def token_create(args: argparse.Namespace) -> int:
    from agentpark.auth import parse_scopes, valid_tenant

    settings = settings_of(args)
    try:
        scopes = parse_scopes(args.scope)
    except ValueError as exc:
        print(f"agentpark: --scope: {exc}", file=sys.stderr)
        return 2
    if not valid_tenant(args.tenant):
        print(
            f"agentpark: --tenant {args.tenant!r}: 1-128 letters, digits or ._-, "
            "starting with a letter or digit",
            file=sys.stderr,
        )
        return 2
    with token_store(settings) as store:
        token, info = store.create(args.tenant, scopes)
    print(token)
    print(
        f"token {info.id}: tenant {info.tenant}, scopes {','.join(info.scopes)}. "
        "It is shown once; the database keeps only its hash.",
        file=sys.stderr,
    )
    return 0


def _when(at: float | None) -> str:
    return "-" if at is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def token_list(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    with token_store(settings) as store:
        tokens = store.entries()
    rows = [("ID", "TENANT", "SCOPES", "CREATED", "LAST USED", "REVOKED")]
    rows += [
        (
            t.id,
            t.tenant,
            ",".join(t.scopes),
            _when(t.created_at),
            _when(t.last_used_at),
            _when(t.revoked_at),
        )
        for t in tokens
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


def token_revoke(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    with token_store(settings) as store:
        info = store.revoke(args.id)
    if info is None:
        print(f"agentpark: no token {args.id!r} (agentpark token list)", file=sys.stderr)
        return 1
    print(f"token {info.id} (tenant {info.tenant}) revoked at {_when(info.revoked_at)}")
    return 0


def token_export(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    with token_store(settings) as store:
        lines = store.export_lines()
    print("# agentpark tokens: <id> <tenant> <scopes> sha256:<hash>; no secrets")
    for line in lines:
        print(line)
    return 0


def token_import(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    try:
        text = sys.stdin.read() if str(args.file) == "-" else args.file.read_text()
    except OSError as exc:
        print(f"agentpark: cannot read {args.file}: {exc}", file=sys.stderr)
        return 2
    with token_store(settings) as store:
        try:
            added, same = store.import_lines(text.splitlines())
        except ValueError as exc:
            print(f"agentpark: {args.file}: {exc}; nothing imported", file=sys.stderr)
            return 2
    print(f"imported {added} token(s) from {args.file}; {same} already there")
    return 0
