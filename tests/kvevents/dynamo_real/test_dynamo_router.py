"""Dynamo's KV router index (``dynamo.llm.RadixTree``) fed with real daemons' KV events.

Two ``agentpark serve`` processes on loopback, A (worker 1) and B (worker 2), publish
their parked blocks on ZMQ; each batch is decoded and handed to ``RadixTree.apply_event``
as the ``KvCacheEvent`` JSON Dynamo's own vLLM relay makes of a vLLM event:
``{"event_id", "data": {"stored": {"parent_hash", "blocks": [{"block_hash",
"tokens_hash"}]}}}``, ``{"removed": {"block_hashes"}}`` or ``"cleared"``, where
``block_hash`` is the engine's hash (ours, vLLM's chain) and ``tokens_hash`` Dynamo's own
hash of the block's ``token_ids`` (``compute_block_hash_for_seq``). ``find_matches`` takes
Dynamo's hashes of the request's tokens: those are what a router computes, and match;
agentpark's (vLLM's) hashes are only the blocks' names, for removals and parents.
"""

from __future__ import annotations

from collections.abc import Callable

from tests.kvevents.dynamo_real.hosts import Host, Router, park, prompt


def test_each_prefix_is_matched_to_the_host_that_parked_it_and_not_after_delete(
    router: tuple[Router, Callable[..., Host]],
) -> None:
    r, host = router
    a, b = host(1), host(2)
    next_a = park(a, "agent-a", prompt(1, 4))
    next_b = park(b, "agent-b", prompt(2, 3))
    r.wait(lambda: r.matches(next_a) == {1: 4} and r.matches(next_b) == {2: 3})
    print("dynamo find_matches after parking:", {"A": r.matches(next_a), "B": r.matches(next_b)})
    # Our (vLLM) hashes name blocks; a router matches on its own hashes of the tokens.
    ours = [e.block_hashes for e in a.sub.events("BlockStored")]
    assert r.tree.find_matches([h for hs in ours for h in hs]).scores == {}

    assert a.daemon.client.delete("/v1/sessions/agent-a").status_code in (200, 204)
    r.wait(lambda: r.matches(next_a) == {})
    assert r.matches(next_b) == {2: 3}
    print(
        "dynamo find_matches after deleting A's:", {"A": r.matches(next_a), "B": r.matches(next_b)}
    )
    print("tree:", r.tree.dump_tree_as_events())


def test_a_parked_copy_past_its_ttl_is_no_longer_matched(
    router: tuple[Router, Callable[..., Host]],
) -> None:
    r, host = router
    a = host(1, parked_ttl_s=3)
    next_a = park(a, "agent-a", prompt(3, 2))
    seen: list[dict[int, int]] = []

    def expired() -> bool:
        seen.append(r.matches(next_a))
        return {1: 2} in seen and seen[-1] == {}

    r.wait(expired)  # matched while parked, then not once the TTL dropped it
    assert a.daemon.client.get("/v1/sessions/agent-a").json()["state"] == "lost"
    print("dynamo find_matches around the TTL:", {1: 2}, "->", seen[-1])
