"""[kv_events]: a real daemon's parked blocks, seen by a ZMQ subscriber as a router sees them.

Every key advertised is findable in its tier (a load here would serve it) and every key
removed is not; the hashes are the keys' own chain (kvkeys), the tokens the blocks' own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import httpx
import msgspec
import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

from agentpark.config import Settings
from agentpark.kvevents.advertiser import Advertiser, _Removed
from agentpark.kvevents.wire import BlockStored, KVEventBatch, external_hash
from agentpark.kvkeys import BlockHasher
from agentpark.metrics import KV_EVENT_METRIC_NAMES
from tests.harness import Daemon, bearer, free_port, wait_until
from tests.kvevents.subscriber import Subscriber

PROMPT = "Plan a trip; call the flight search tool, then the hotel one."
FIRST = {"prompt": PROMPT, "max_new_tokens": 40}


def kv_events(**extra: object) -> dict[str, object]:
    return {
        "endpoint": f"tcp://127.0.0.1:{free_port()}",
        "replay_endpoint": f"tcp://127.0.0.1:{free_port()}",
        **extra,
    }


@pytest.fixture
def subscribe() -> Iterator[Callable[[Daemon], Subscriber]]:
    subs: list[Subscriber] = []

    def make(daemon: Daemon) -> Subscriber:
        cfg = daemon.settings.kv_events
        sub = Subscriber(cfg.endpoint, cfg.replay_endpoint)
        sub.join()
        subs.append(sub)
        return sub

    yield make
    for sub in subs:
        sub.close()


def park(c: httpx.Client, sid: str, tier: str = "dram", prompt: str = PROMPT) -> None:
    assert c.post("/v1/sessions", json={"session_id": sid}).status_code in (200, 201)
    first = {**FIRST, "prompt": prompt}
    assert c.post(f"/v1/sessions/{sid}/generate", json=first).status_code == 200
    parked = c.post(f"/v1/sessions/{sid}/pause", json={"tier": tier}).json()
    assert parked["state"] == "parked", parked


def chain(daemon: Daemon, sid: str) -> list[bytes]:
    core = daemon.runtime.parking
    live = core.registry.find(("default", sid))
    assert live is not None
    return core.mover.hasher.chain(live.tokens, cache_salt=live.cache_salt, lora=live.lora)


def findable(daemon: Daemon, tier: str, h: bytes) -> bool:
    return bool(daemon.runtime.parking.tiers[tier].find([("default", h)]))


def test_park_delete_and_ttl_store_and_remove_exactly_the_loadable_blocks(
    make_settings: Callable[..., Settings],
    daemon_factory: Callable[[Settings], Daemon],
    subscribe: Callable[[Daemon], Subscriber],
) -> None:
    daemon = daemon_factory(make_settings(kv_events=kv_events(block_hashes="bytes")))
    sub = subscribe(daemon)
    assert sub.events("AllBlocksCleared"), "a daemon starts by clearing what it said before"
    c = daemon.client

    park(c, "a")
    keys = chain(daemon, "a")
    assert len(keys) >= 3
    sub.wait_for(lambda: sub.held.get("CPU") == set(keys))
    stored = sub.events("BlockStored")
    live = daemon.runtime.parking.registry.find(("default", "a"))
    assert live is not None
    bs = daemon.settings.pool.block_size
    assert [h for e in stored for h in e.block_hashes] == keys  # in chain order, once
    first = stored[0]
    assert first.parent_block_hash is None and first.block_size == bs
    assert first.medium == "CPU" and first.lora_id is None
    assert [t for e in stored for t in e.token_ids] == live.tokens[: len(keys) * bs]
    assert all(findable(daemon, "dram", h) for h in sub.all_held())

    # The same blocks parked again in shm (a copy of its own): dram and shm are both
    # "CPU", so nothing new is said, and nothing is removed while either holds them.
    park(c, "b", "shm")
    assert chain(daemon, "b") == keys
    assert c.delete("/v1/sessions/a").status_code in (200, 204)
    assert not any(findable(daemon, "dram", h) for h in keys)
    park(
        c, "c", "dram", "Another agent, another prompt: it shares no block."
    )  # a marker: its events come after those of b and of a's delete
    keys_c = chain(daemon, "c")
    sub.wait_for(lambda: sub.held["CPU"] == set(keys) | set(keys_c))
    assert sub.events("BlockRemoved") == []
    assert all(findable(daemon, "shm", h) for h in keys)

    assert c.delete("/v1/sessions/c").status_code in (200, 204)
    ticked = daemon.runtime.policy.tick(time.time() + daemon.settings.policy.parked_ttl_s + 1)
    assert ticked != []
    assert c.get("/v1/sessions/b").json()["state"] == "lost"
    sub.wait_for(lambda: not sub.all_held())
    removed = [h for e in sub.events("BlockRemoved") for h in e.block_hashes]
    assert sorted(removed) == sorted(keys + keys_c)
    assert not any(findable(daemon, t, h) for t in ("dram", "shm") for h in removed)
    assert sub.seqs == list(range(len(sub.seqs)))  # every batch, once, in order


def kv_event_series(daemon: Daemon) -> dict[tuple[str, str], float]:
    """(sample name, medium label) -> value of the agentpark_kv_event_* samples."""
    text = daemon.client.get("/metrics").text
    return {
        (sample.name, sample.labels.get("medium", "")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("agentpark_kv_event_") and not sample.name.endswith("_created")
    }


@pytest.fixture
def published(
    make_settings: Callable[..., Settings],
    daemon_factory: Callable[[Settings], Daemon],
    subscribe: Callable[[Daemon], Subscriber],
) -> tuple[Daemon, Subscriber]:
    """A daemon publishing on the default settings, and a subscriber that joined it."""
    daemon = daemon_factory(make_settings(kv_events=kv_events()))
    return daemon, subscribe(daemon)


def test_the_metrics_say_what_is_advertised_sent_and_resynced(
    published: tuple[Daemon, Subscriber],
) -> None:
    daemon, sub = published
    advertised = ("agentpark_kv_event_advertised_blocks", "CPU")
    start = kv_event_series(daemon)
    names = {name for name, _ in start}
    assert names == set(KV_EVENT_METRIC_NAMES)  # every series, from the start
    assert start[advertised] == 0 and start[("agentpark_kv_event_changes_dropped_total", "")] == 0
    park(daemon.client, "a")
    keys = chain(daemon, "a")
    sub.wait_for(lambda: len(sub.held.get("CPU", ())) == len(keys))
    wait_until(lambda: kv_event_series(daemon)[advertised] == len(keys), timeout=10)
    assert daemon.client.delete("/v1/sessions/a").status_code in (200, 204)
    sub.wait_for(lambda: not sub.all_held())
    wait_until(lambda: kv_event_series(daemon)[advertised] == 0, timeout=10)
    now = kv_event_series(daemon)
    assert now[("agentpark_kv_event_batches_total", "")] >= len(sub.seqs) >= 3
    assert now[("agentpark_kv_event_resyncs_total", "")] >= 1  # the subscriber's join
    assert now[("agentpark_kv_event_changes_dropped_total", "")] == 0


def test_without_an_endpoint_no_kv_event_series_are_exported(
    make_settings: Callable[..., Settings], daemon_factory: Callable[[Settings], Daemon]
) -> None:
    daemon = daemon_factory(make_settings())
    assert daemon.runtime.kv_events is None
    assert kv_event_series(daemon) == {}


def test_int_hashes_are_the_low_64_bits_as_vllm_publishes_them(
    published: tuple[Daemon, Subscriber],
) -> None:
    daemon, sub = published
    park(daemon.client, "a")
    keys = chain(daemon, "a")
    want = [int.from_bytes(k[-8:], "big") for k in keys]
    assert want == [external_hash(k, "int") for k in keys]
    sub.wait_for(lambda: sub.held.get("CPU") == set(want))


def test_other_tenants_blocks_are_not_advertised(
    make_settings: Callable[..., Settings],
    daemon_factory: Callable[[Settings], Daemon],
    subscribe: Callable[[Daemon], Subscriber],
) -> None:
    daemon = daemon_factory(
        make_settings(kv_events=kv_events(tenant="router", block_hashes="bytes"))
    )
    sub = subscribe(daemon)
    other = httpx.Client(base_url=daemon.url, headers=bearer(daemon.token("router")), timeout=60)
    daemon.admin()
    park(daemon.client, "a")  # tenant default: not advertised
    assert daemon.client.delete("/v1/sessions/a").status_code in (200, 204)
    park(other, "b")  # tenant router: advertised, after what "a" went through
    core = daemon.runtime.parking
    live = core.registry.find(("router", "b"))
    assert live is not None
    keys = core.mover.hasher.chain(live.tokens)
    sub.wait_for(lambda: sub.held.get("CPU") == set(keys))
    assert [h for e in sub.events("BlockStored") for h in e.block_hashes] == keys
    assert sub.events("BlockRemoved") == []
    other.close()


def test_a_full_queue_drops_and_counts_without_blocking(
    make_settings: Callable[..., Settings],
) -> None:
    cfg = make_settings(kv_events=kv_events(max_queue_size=2)).kv_events
    # Not started: nothing takes from the queue, as when the thread falls behind.
    adv = Advertiser(cfg, dict, lambda: BlockHasher(16), lambda _o: None, list)
    try:
        started = time.monotonic()
        for _ in range(1000):
            adv.offer(_Removed("dram", [("default", b"x" * 32)]))
        assert time.monotonic() - started < 1.0
        assert adv.dropped == 998 and adv.figures().dropped == 998
    finally:
        adv.publisher.close()


def test_connect_mode_publishes_to_a_router_that_binds_its_sub(
    make_settings: Callable[..., Settings],
    daemon_factory: Callable[[Settings], Daemon],
) -> None:
    # llm-d's indexer binds a SUB and engines connect their PUB to it, with a topic
    # naming the pod and model ("kv@<pod>@<model>").
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
    port = sub.bind_to_random_port("tcp://127.0.0.1")
    topic = "kv@10.0.0.7@tiny"
    cfg = {"endpoint": f"tcp://127.0.0.1:{port}", "connect": True, "topic": topic}
    try:
        daemon = daemon_factory(make_settings(kv_events=cfg))
        park(daemon.client, "a")
        keys = {external_hash(k, "int") for k in chain(daemon, "a")}
        decode = msgspec.msgpack.Decoder(KVEventBatch).decode
        stored: set[int | bytes] = set()
        deadline = time.monotonic() + 30
        while stored != keys:  # the connect races the park: the join's re-sync covers it
            assert sub.poll(int(max(0.0, deadline - time.monotonic()) * 1000)), stored
            frame_topic, _seq, payload = sub.recv_multipart()
            assert frame_topic == topic.encode()
            for event in decode(payload).events:
                if isinstance(event, BlockStored):
                    stored.update(event.block_hashes)
    finally:
        sub.close(linger=0)
        ctx.term()


class _Heard:
    def __init__(self) -> None:
        self.log: list[tuple[str, object]] = []

    def sealed(self, owner: object, blocks: list[tuple[int, object]]) -> None:
        self.log.append(("sealed", blocks))

    def unkeyed(self, keys: list[object]) -> None:
        self.log.append(("unkeyed", keys))


def test_slot_store_tells_each_transition_once_at_its_place() -> None:
    from agentpark.tiers.slots import SlotStore

    store = SlotStore(3)
    heard = _Heard()
    store.listeners.append(heard)
    store.reserve("s1", ["k0", "k1", None])
    assert heard.log == []  # reserved is not loadable
    store.seal("s1", {})
    assert heard.log == [("sealed", [(0, "k0"), (1, "k1")])]
    store.release("s1", cache=True)  # cached: still findable, nothing said
    assert heard.log[1:] == []
    store.reserve("s2", ["k2", "k3"])  # one free slot, then the oldest cached: k0
    assert heard.log[1:] == [("unkeyed", ["k0"])]
    store.seal("s2", {})
    store.forget(store.find(["k2"]))  # failed checksum
    assert heard.log[2:] == [("sealed", [(0, "k2"), (1, "k3")]), ("unkeyed", ["k2"])]
    store.release("s2")
    assert heard.log[4:] == [("unkeyed", ["k3"])]
    restarted = SlotStore(3)
    restarted.listeners.append(heard)
    restarted.claim("s3", [0, 1], ["k4", None])  # a restart's re-attach
    assert heard.log[5:] == [("sealed", [(0, "k4")])]
