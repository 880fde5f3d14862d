"""``agentpark session move ID --to URL --to-token TOKEN`` and the ``--to`` of ``drain``.

The CLI asks the source daemon (``--url``, its admin ``--token``); the source pushes the
session to the target itself, with ``--to-token`` (an admin token of the target).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from agentpark.cli.common import Commands, Subparsers, settings_of, token_of

__all__ = ["add_move_commands", "add_to_arguments", "run_drain_to", "run_move"]

MOVE_TIMEOUT_S = 3600.0


def add_to_arguments(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument("--to", required=required, help="the target daemon's URL")
    parser.add_argument("--to-token", help="an admin token of the target daemon")


def add_move_commands(commands: Commands, sub: Subparsers[argparse.ArgumentParser]) -> None:
    group = commands.group(sub, "session", "session commands", "act on one session")
    move = commands.add(
        group,
        "move",
        commands.client,
        help="hand a parked session to another daemon (gone from this one once it is there)",
    )
    move.add_argument("session_id")
    move.add_argument("--tenant", default="default", help="the session's tenant")
    add_to_arguments(move, required=True)
    move.set_defaults(run=run_move)


def _post(args: argparse.Namespace, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    import httpx

    settings = settings_of(args)
    url = args.url or f"http://{settings.server.host}:{settings.server.port}"
    token = token_of(args)
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    try:
        answer = httpx.post(
            f"{url.rstrip('/')}{path}", json=body, headers=headers, timeout=MOVE_TIMEOUT_S
        )
    except httpx.HTTPError as exc:
        print(f"agentpark: {url} could not be reached: {exc}", file=sys.stderr)
        return 0, None
    try:
        return answer.status_code, answer.json()
    except ValueError:
        return answer.status_code, {"error": {"message": answer.text[:200]}}


def _to_token(args: argparse.Namespace) -> str | None:
    if not args.to_token:
        print("agentpark: --to-token (an admin token of the target) is needed", file=sys.stderr)
    return str(args.to_token) if args.to_token else None


def run_move(args: argparse.Namespace) -> int:
    to_token = _to_token(args)
    if to_token is None:
        return 2
    body = {"tenant": args.tenant, "session_id": args.session_id, "to": args.to}
    status, out = _post(args, "/v1/moves", {**body, "to_token": to_token})
    if status != 200:
        return _failed(status, out)
    print(
        f"moved {out['tenant']}/{out['session_id']} to {out['to']} (move {out['move_id']}): "
        f"{out['blocks_sent']} blocks sent, {out['blocks_held']} held there already, "
        f"{out['bytes_sent']} bytes in {out['ms']:.0f} ms"
    )
    return 0


def run_drain_to(args: argparse.Namespace) -> int:
    to_token = _to_token(args)
    if to_token is None:
        return 2
    body = {"to": args.to, "to_token": to_token, "tenant": args.tenant}
    status, out = _post(args, "/v1/moves/drain", body)
    if status != 200:
        return _failed(status, out)
    print(
        f"drained to {args.to}: {out['moved']} moved ({out['bytes_sent']} bytes in "
        f"{out['ms']:.0f} ms), {out['not_parked']} not parked (left here), "
        f"{len(out['failed'])} failed"
    )
    for failure in out["failed"]:
        print(f"  {failure['tenant']}/{failure['session_id']}: {failure['error']}")
    return 0 if not out["failed"] else 1


def _failed(status: int, out: Any) -> int:
    if status:
        error = (out or {}).get("error", {})
        print(
            f"agentpark: {status} {error.get('code', '')}: {error.get('message')}", file=sys.stderr
        )
    return 1
