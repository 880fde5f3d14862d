"""Two daemons on loopback (A the source, B the target), each with its own state dir and
shm tier, and the admin tokens a move needs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from agentpark.auth import Scope
from agentpark.config import Settings
from agentpark.moving.blockio import read_blocks
from tests.harness import Daemon
from tests.harness.settings import tiny_settings
from tests.moving.proxy import CuttingProxy

__all__ = ["Pair", "cut_then_resumed", "make_pair", "pair_settings", "park_session", "parked_bytes"]

ALL_SCOPES = ",".join(s.value for s in Scope)


def pair_settings(tmp_path: Path, shm_dir: Path, name: str, **overrides: Any) -> Settings:
    extra = overrides.pop("tiers", {})
    tiers = {**extra, "shm": {**extra.get("shm", {}), "path": shm_dir / f"tier-{name}"}}
    return tiny_settings(
        tmp_path / name,
        shm_dir,
        tiers=tiers,
        shutdown={"drain": False},
        **overrides,
    )


@dataclass
class Pair:
    a: Daemon
    b: Daemon
    a_admin: str
    b_admin: str

    def move(
        self, session_id: str, *, to: str | None = None, token: str | None = None
    ) -> httpx.Response:
        """A -> B (or ``to``, a proxy of B) asked of A's REST API with A's admin token."""
        body = {"session_id": session_id, "to": to or self.b.url, "to_token": token or self.b_admin}
        return self.a.client.post("/v1/moves", json=body)


def cut_then_resumed(
    pair: Pair, proxy: CuttingProxy, blocks: int, to: str | None = None
) -> tuple[int, dict[str, Any], int]:
    """A move of "long" cut mid-stream with the link left down (given up: A keeps the
    session, B has none of it), then the same move once the link is back; (blocks landed
    by the first try, the second try's result, bytes the proxy carried to B for it)."""
    importer = pair.b.app.state.moves.importer
    proxy.refuse_after_cut = True
    first = pair.move("long", to=to)
    assert first.status_code == 502, first.text
    assert proxy.cuts == 1
    details = first.json()["error"]["details"]
    move_id, landed = details["move_id"], importer.received(details["move_id"])
    assert details["in_doubt"] is False
    assert landed is not None and 0 < landed < blocks
    assert pair.a.client.get("/v1/sessions/long").json()["state"] == "parked"
    assert pair.b.client.get("/v1/sessions/long").status_code == 404
    # The link is back: the same move goes on with what B lacks, nothing twice.
    proxy.refuse = False
    before = proxy.upstream
    second = pair.move("long", to=to)
    assert second.status_code == 200, second.text
    result: dict[str, Any] = second.json()
    assert result["move_id"] == move_id and result["resumed"] is True
    return landed, result, proxy.upstream - before


def make_pair(
    tmp_path: Path,
    shm_dir: Path,
    daemon_factory: Callable[[Settings], Daemon],
    b_overrides: dict[str, Any] | None = None,
    a_overrides: dict[str, Any] | None = None,
) -> Pair:
    a = daemon_factory(pair_settings(tmp_path, shm_dir, "a", **(a_overrides or {})))
    b = daemon_factory(pair_settings(tmp_path, shm_dir, "b", **(b_overrides or {})))
    a_admin = admin(a)
    b_admin = admin(b)
    return Pair(a, b, a_admin, b_admin)


def admin(daemon: Daemon) -> str:
    """An admin token of ``daemon`` (tenant default, every scope), also sent by its client."""
    token = daemon.token("default", ALL_SCOPES)
    daemon.client.headers["Authorization"] = f"Bearer {token}"
    return token


def park_session(daemon: Daemon, session_id: str, prompt: str, tier: str = "shm") -> list[int]:
    """A session with ``prompt`` and 20 generated tokens, parked in ``tier``; its tokens."""
    c = daemon.client
    assert c.post("/v1/sessions", json={"session_id": session_id}).status_code == 201
    out = c.post(
        f"/v1/sessions/{session_id}/generate", json={"prompt": prompt, "max_new_tokens": 20}
    )
    assert out.status_code == 200, out.text
    paused = c.post(f"/v1/sessions/{session_id}/pause", json={"tool": "search", "tier": tier})
    assert paused.status_code == 200 and paused.json()["state"] == "parked", paused.text
    return list(prompt.encode()) + out.json()["tokens"]


def parked_bytes(daemon: Daemon, session_id: str, tenant: str = "default") -> bytes:
    """The parked copy's blocks, in wire form, as this daemon's tier holds them."""
    core = daemon.runtime.parking
    live = core.registry.find((tenant, session_id))
    assert live is not None and live.row.state == "parked"
    return bytes(read_blocks(core.tiers[live.row.tier or ""], live.slots))
