"""Two real daemons (``agentpark serve``) on loopback as Dynamo workers, their KV events
subscribed, and one ``dynamo.llm.RadixTree`` fed with them (``Router``); the ``router``
fixture (conftest) makes them."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynamo.llm import RadixTree, compute_block_hash_for_seq

from agentpark.config import Settings
from tests.harness import DaemonProcess, free_port, write_config
from tests.kvevents.subscriber import Subscriber

BS = 16  # the TINY pool's block size


def dynamo_event(event_id: int, event: Any) -> dict[str, Any]:
    """What Dynamo's vLLM relay makes of one vLLM event."""
    kind = type(event).__name__
    if kind == "BlockStored":
        local = compute_block_hash_for_seq(event.token_ids, event.block_size, None, event.lora_name)
        blocks = [
            {"block_hash": h, "tokens_hash": t}
            for h, t in zip(event.block_hashes, local, strict=True)
        ]
        data: Any = {"stored": {"parent_hash": event.parent_block_hash, "blocks": blocks}}
    elif kind == "BlockRemoved":
        data = {"removed": {"block_hashes": event.block_hashes}}
    else:
        data = "cleared"
    return {"event_id": event_id, "data": data}


@dataclass
class Host:
    """One daemon process, its events' subscriber and its worker id in the tree."""

    worker: int
    daemon: DaemonProcess
    sub: Subscriber
    daemon_endpoint: str
    applied: int = 0
    events: int = 0
    log: list[str] = field(default_factory=list)


class Router:
    """One RadixTree fed by every host's events, in each host's order."""

    def __init__(self) -> None:
        self.tree = RadixTree()
        self.hosts: list[Host] = []

    def pump(self, host: Host, timeout: float = 0.2) -> None:
        host.sub.poll(timeout)
        for batch in host.sub.batches[host.applied :]:
            for event in batch.events:
                host.events += 1
                raw = json.dumps(dynamo_event(host.events, event)).encode()
                host.log.append(raw.decode())
                self.tree.apply_event(host.worker, raw)
        host.applied = len(host.sub.batches)

    def matches(self, tokens: list[int]) -> dict[int, int]:
        """Worker -> matched blocks, for a request with these tokens."""
        scores = self.tree.find_matches(compute_block_hash_for_seq(tokens, BS)).scores
        return {worker: n for (worker, _rank), n in scores.items()}

    def wait(self, check: Callable[[], bool], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            assert time.monotonic() < deadline, [h.log[-5:] for h in self.hosts]
            for host in self.hosts:
                self.pump(host, 0.05)


def make_router(
    make_settings: Callable[..., Settings],
    daemon_process: Callable[[Path, int], DaemonProcess],
    tmp_path: Path,
) -> Iterator[tuple[Router, Callable[..., Host]]]:
    made = Router()

    def host(worker: int, **policy: Any) -> Host:
        base = tmp_path / f"w{worker}"
        shm = Path(str(make_settings().tiers.shm.path) + f"-w{worker}")
        settings = make_settings(state_dir=base / "state", tiers={"shm": {"path": shm}})
        if policy:
            settings = make_settings(
                state_dir=base / "state", tiers={"shm": {"path": shm}}, policy=policy
            )
        endpoint = f"tcp://127.0.0.1:{free_port()}"
        replay = f"tcp://127.0.0.1:{free_port()}"
        base.mkdir()
        config = write_config(base / "agentpark.toml", settings)
        with config.open("a") as f:
            f.write(f'[kv_events]\nendpoint = "{endpoint}"\nreplay_endpoint = "{replay}"\n')
        daemon = daemon_process(config, free_port())
        sub = Subscriber(endpoint, replay)
        sub.join()
        made.hosts.append(Host(worker, daemon, sub, endpoint))
        return made.hosts[-1]

    yield made, host
    for h in made.hosts:
        h.sub.close()
        if h.daemon.proc.poll() is None:
            h.daemon.stop(signal.SIGTERM)


def park(host: Host, sid: str, prompt: list[int]) -> list[int]:
    """Park a session whose first turn is ``prompt``; its next turn's tokens."""
    c = host.daemon.client
    assert c.post("/v1/sessions", json={"session_id": sid}).status_code in (200, 201)
    out = c.post(
        f"/v1/sessions/{sid}/generate", json={"prompt_tokens": prompt, "max_new_tokens": 1}
    )
    assert out.status_code == 200, out.text
    parked = c.post(f"/v1/sessions/{sid}/pause").json()
    assert parked["state"] == "parked", parked
    return prompt + out.json()["tokens"] + [7, 8, 9]  # the agent's next turn


def prompt(seed: int, blocks: int) -> list[int]:
    return [(seed * 131 + i * 7) % 250 + 3 for i in range(blocks * BS)]
