"""agentpark's KV events, read by vLLM's own decoder (no vLLM server: only its code).

A real daemon (reference engine) publishes on ZMQ; every batch is decoded with
``msgspec.msgpack.Decoder(vllm.distributed.kv_events.KVEventBatch)``, and re-encoding the
decoded batch with vLLM's encoder gives back the very bytes the daemon sent: the wire is
vLLM's, field for field. Park, delete, TTL and a restart of the daemon.
"""

from __future__ import annotations

import signal
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest

with warnings.catch_warnings():  # vLLM's imports warn of torch APIs it still uses
    warnings.simplefilter("ignore", DeprecationWarning)
    from vllm.distributed.kv_events import (
        AllBlocksCleared,
        BlockRemoved,
        BlockStored,
        KVEventBatch,
    )

from agentpark.config import Settings
from tests.harness import Daemon, DaemonProcess, free_port, write_config
from tests.kvevents.subscriber import Subscriber
from tests.kvevents.test_kv_events import chain, findable, kv_events, park

DECODE = msgspec.msgpack.Decoder(KVEventBatch).decode
ENCODE = msgspec.msgpack.Encoder().encode


@pytest.fixture
def subscribers() -> Iterator[list[Subscriber]]:
    subs: list[Subscriber] = []
    yield subs
    for sub in subs:
        sub.close()


def vllm_subscriber(endpoint: str, replay: str, subs: list[Subscriber]) -> Subscriber:
    sub = Subscriber(endpoint, replay, decode=DECODE)
    subs.append(sub)
    sub.join()
    return sub


def assert_vllm_wire(sub: Subscriber) -> None:
    for payload, batch in zip(sub.payloads, sub.batches, strict=True):
        assert isinstance(batch, KVEventBatch)
        assert all(
            isinstance(e, BlockStored | BlockRemoved | AllBlocksCleared) for e in batch.events
        )
        assert ENCODE(batch) == payload


def test_vllm_decodes_park_delete_and_ttl(
    make_settings: Callable[..., Settings],
    daemon_factory: Callable[[Settings], Daemon],
    subscribers: list[Subscriber],
) -> None:
    daemon = daemon_factory(make_settings(kv_events=kv_events(block_hashes="bytes")))
    cfg = daemon.settings.kv_events
    sub = vllm_subscriber(cfg.endpoint, cfg.replay_endpoint, subscribers)
    c = daemon.client
    park(c, "a")
    park(c, "b", "shm", "Another agent with a prompt of its own.")
    keys_a, keys_b = chain(daemon, "a"), chain(daemon, "b")
    sub.wait_for(lambda: sub.held.get("CPU") == set(keys_a) | set(keys_b))
    stored = sub.events("BlockStored")
    assert stored[0].parent_block_hash is None
    assert stored[0].block_size == daemon.settings.pool.block_size
    assert all(findable(daemon, "dram", h) for h in keys_a)

    assert c.delete("/v1/sessions/a").status_code in (200, 204)
    sub.wait_for(lambda: sub.held.get("CPU") == set(keys_b))
    assert not any(findable(daemon, "dram", h) for h in keys_a)
    daemon.runtime.policy.tick(time.time() + daemon.settings.policy.parked_ttl_s + 1)
    sub.wait_for(lambda: not sub.all_held())
    assert not any(findable(daemon, "shm", h) for h in keys_b)
    assert_vllm_wire(sub)


def test_vllm_decodes_a_restart_clear_then_the_surviving_shm_blocks(
    make_settings: Callable[..., Settings],
    daemon_process: Callable[[Path, int], DaemonProcess],
    tmp_path: Path,
    subscribers: list[Subscriber],
) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    replay = f"tcp://127.0.0.1:{free_port()}"
    config = write_config(tmp_path / "agentpark.toml", make_settings())
    with config.open("a") as f:
        f.write(f'[kv_events]\nendpoint = "{endpoint}"\nreplay_endpoint = "{replay}"\n')
    port = free_port()
    first = daemon_process(config, port)
    sub = vllm_subscriber(endpoint, replay, subscribers)
    park(first.client, "a", "shm")
    sub.wait_for(lambda: len(sub.held.get("CPU", ())) >= 3)
    before = set(sub.held["CPU"])
    assert first.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
    sub.wait_for(lambda: not sub.all_held())  # the last word of a stopping daemon
    assert isinstance(sub.batches[-1].events[-1], AllBlocksCleared)
    assert_vllm_wire(sub)

    second = daemon_process(config, port)
    again = vllm_subscriber(endpoint, replay, subscribers)
    again.wait_for(lambda: again.held.get("CPU") == before)
    assert isinstance(again.batches[0].events[0], AllBlocksCleared)
    assert second.client.get("/v1/sessions/a").json()["state"] == "parked"
    assert_vllm_wire(again)
    second.stop(signal.SIGTERM)
