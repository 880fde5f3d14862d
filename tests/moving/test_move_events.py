"""KV events follow a move: a router subscribed to both daemons sees the session's blocks
removed at A and stored at B, and each side advertises only what a load there serves."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentpark.config import Settings
from tests.harness import Daemon, free_port
from tests.kvevents.subscriber import Subscriber
from tests.moving.pair import make_pair, park_session

PROMPT = "an agent's plan that fills a few whole blocks of sixteen tokens each, and more"


def kv_events() -> dict[str, Any]:
    return {
        "kv_events": {
            "endpoint": f"tcp://127.0.0.1:{free_port()}",
            "replay_endpoint": f"tcp://127.0.0.1:{free_port()}",
            "block_hashes": "bytes",
        }
    }


@pytest.fixture
def subscribers() -> Iterator[list[Subscriber]]:
    made: list[Subscriber] = []
    yield made
    for sub in made:
        sub.close()


def subscribe(daemon: Daemon, made: list[Subscriber]) -> Subscriber:
    cfg = daemon.settings.kv_events
    sub = Subscriber(cfg.endpoint, cfg.replay_endpoint)
    made.append(sub)
    sub.join()
    return sub


def chain(daemon: Daemon, session_id: str) -> list[bytes]:
    core = daemon.runtime.parking
    live = core.registry.find(("default", session_id))
    assert live is not None
    return core.mover.hasher.chain(live.tokens, cache_salt=live.cache_salt, lora=live.lora)


def findable(daemon: Daemon, key: bytes) -> bool:
    tiers = daemon.runtime.parking.tiers.values()
    return any(tier.find([("default", key)]) for tier in tiers)


def test_a_move_is_removed_at_a_and_stored_at_b_as_a_subscriber_sees_it(
    tmp_path: Path,
    shm_dir: Path,
    daemon_factory: Callable[[Settings], Daemon],
    subscribers: list[Subscriber],
) -> None:
    pair = make_pair(
        tmp_path, shm_dir, daemon_factory, a_overrides=kv_events(), b_overrides=kv_events()
    )
    at_a, at_b = subscribe(pair.a, subscribers), subscribe(pair.b, subscribers)

    park_session(pair.a, "mover", PROMPT)
    keys = chain(pair.a, "mover")
    assert len(keys) >= 3
    at_a.wait_for(lambda: at_a.all_held() == set(keys))
    assert at_b.all_held() == set()

    moved = pair.move("mover")
    assert moved.status_code == 200, moved.text
    at_b.wait_for(lambda: at_b.all_held() == set(keys))
    at_a.wait_for(lambda: at_a.all_held() == set())

    # B's chain for the moved session is the one A advertised; a load is served only at B.
    assert chain(pair.b, "mover") == keys
    assert all(findable(pair.b, k) for k in keys)
    assert not any(findable(pair.a, k) for k in keys)
    removed = [h for e in at_a.events("BlockRemoved") for h in e.block_hashes]
    assert sorted(removed) == sorted(keys)
    stored = [h for e in at_b.events("BlockStored") for h in e.block_hashes]
    assert stored == keys  # in chain order, once
    assert at_a.seqs == list(range(len(at_a.seqs)))
    assert at_b.seqs == list(range(len(at_b.seqs)))
