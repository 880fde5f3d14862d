"""Dynamo's standalone KV indexer (``python -m dynamo.indexer``) subscribed to two real
daemons' ZMQ endpoints: Dynamo's own vLLM-event decoder and relay, no conversion of ours.

It is what a Dynamo deployment runs beside its router (``--workers id=zmq_endpoint``);
``POST /query`` answers, per worker, how many tokens of a request it holds and in which
of Dynamo's tiers ("cpu" is vLLM's medium "CPU": agentpark's dram and shm).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness import free_port, wait_until
from tests.kvevents.dynamo_real.hosts import BS, Host, Router, park, prompt


@pytest.fixture
def indexer(tmp_path: Path) -> Iterator[Callable[[list[Host]], httpx.Client]]:
    procs: list[subprocess.Popen[bytes]] = []
    clients: list[httpx.Client] = []

    def start(hosts: list[Host]) -> httpx.Client:
        port = free_port()
        workers = ",".join(f"{h.worker}={h.daemon_endpoint}" for h in hosts)
        cmd = [sys.executable, "-m", "dynamo.indexer", "--workers", workers]
        cmd += ["--block-size", str(BS), "--port", str(port), "--threads", "1"]
        with (tmp_path / "indexer.log").open("wb") as log:  # the child keeps its own handle
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
        clients.append(client)

        def up() -> bool:
            try:
                return client.get("/health").status_code == 200
            except httpx.TransportError:
                return False

        wait_until(up, timeout=60)
        return client

    yield start
    for client in clients:
        client.close()
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def held(client: httpx.Client, tokens: list[int]) -> dict[str, Any]:
    """Per worker id: Dynamo's answer for a request with these tokens."""
    out = client.post("/query", json={"token_ids": tokens, "model_name": "default"})
    assert out.status_code == 200, out.text
    instances: dict[str, Any] = out.json()["instances"]
    return {w: i for w, i in instances.items() if i["longest_matched"] > 0}


def test_dynamos_indexer_matches_each_prefix_to_its_host(
    router: tuple[Router, Callable[..., Host]],
    indexer: Callable[[list[Host]], httpx.Client],
) -> None:
    _r, host = router
    a, b = host(1), host(2)
    next_a = park(a, "agent-a", prompt(4, 4))  # parked before the indexer starts: the
    client = indexer([a, b])  # daemon re-sends its state when the indexer subscribes
    next_b = park(b, "agent-b", prompt(5, 3))  # parked after: a live event

    wait_until(lambda: set(held(client, next_a)) == {"1"} and set(held(client, next_b)) == {"2"})
    seen = {"A": held(client, next_a), "B": held(client, next_b)}
    print("dynamo.indexer /query:", seen)
    assert seen["A"]["1"]["longest_matched"] == 4 * BS and seen["A"]["1"]["cpu"] == 4 * BS
    assert seen["B"]["2"]["longest_matched"] == 3 * BS and seen["B"]["2"]["gpu"] == 0

    assert a.daemon.client.delete("/v1/sessions/agent-a").status_code in (200, 204)
    wait_until(lambda: held(client, next_a) == {})
    assert set(held(client, next_b)) == {"2"}
