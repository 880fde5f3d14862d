"""A ZMQ subscriber of a daemon's KV events, as a router runs one: SUB on the endpoint,
frames ``(topic, seq, payload)``, each payload decoded by the decoder it is given (vLLM's
own in tests/vllm_real, agentpark's msgspec twin here). A gap in the sequence (what was
sent before the SUB joined, or dropped) is filled from the replay socket, so every batch
is applied once and in order. It keeps the advertised state per medium, as a router's
index does."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgspec
import zmq

from agentpark.kvevents.publisher import END_SEQ
from agentpark.kvevents.wire import KVEventBatch

__all__ = ["Subscriber"]


class Subscriber:
    def __init__(
        self,
        endpoint: str,
        replay: str,
        decode: Callable[[bytes], Any] | None = None,
        topic: str = "",
    ) -> None:
        self._ctx = zmq.Context()
        self.sock = self._ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self.sock.connect(endpoint)
        self._replay = self._ctx.socket(zmq.DEALER)
        self._replay.connect(replay)
        self.decode = decode or msgspec.msgpack.Decoder(KVEventBatch).decode
        self.seqs: list[int] = []
        self.batches: list[Any] = []
        self.payloads: list[bytes] = []
        self.held: dict[str | None, set[Any]] = {}

    def poll(self, timeout: float) -> bool:
        """Read every batch that arrives within ``timeout`` s; True if any did."""
        got = False
        deadline = time.monotonic() + timeout
        while True:
            left = int(max(0.0, deadline - time.monotonic()) * 1000)
            if not self.sock.poll(left):
                return got
            _topic, seq, payload = self.sock.recv_multipart()
            got |= self._ingest(int.from_bytes(seq, "big"), payload)

    def join(self) -> None:
        """Catch up, then wait for the re-sync the daemon sends each new subscriber (an
        ``AllBlocksCleared`` after its start's): from then on the stream is this one's."""
        self.catch_up()
        self.wait_for(lambda: self._cleared_since_start())

    def _cleared_since_start(self) -> bool:
        return any(
            seq > 0 and any(type(e).__name__ == "AllBlocksCleared" for e in b.events)
            for seq, b in zip(self.seqs, self.batches, strict=True)
        )

    def catch_up(self) -> None:
        """Everything published since the last batch seen, from the replay socket."""
        start = self.seqs[-1] + 1 if self.seqs else 0
        self._replay.send_multipart((b"", start.to_bytes(8, "big")))
        while True:
            assert self._replay.poll(30_000), "the replay socket did not answer"
            _, _topic, seq, payload = self._replay.recv_multipart()
            if seq == END_SEQ:
                return
            self._ingest(int.from_bytes(seq, "big"), payload, replaying=True)

    def _ingest(self, seq: int, payload: bytes, *, replaying: bool = False) -> bool:
        expected = self.seqs[-1] + 1 if self.seqs else 0
        if seq < expected:
            return False  # seen (replayed already)
        if seq > expected:
            assert not replaying, f"replay skipped from {expected} to {seq}"
            self.catch_up()  # includes this one
            return True
        self.seqs.append(seq)
        self.payloads.append(payload)
        batch = self.decode(payload)
        self.batches.append(batch)
        self._apply(batch)
        return True

    def wait_for(self, check: Callable[[], bool], timeout: float = 30) -> None:
        """Read batches until ``check()`` holds (AssertionError after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while not check():
            left = deadline - time.monotonic()
            assert left > 0, f"not seen in {timeout} s; held: {self.held}"
            self.poll(min(left, 0.5))

    def _apply(self, batch: Any) -> None:
        for event in batch.events:
            kind = type(event).__name__
            if kind == "BlockStored":
                self.held.setdefault(event.medium, set()).update(event.block_hashes)
            elif kind == "BlockRemoved":
                self.held.setdefault(event.medium, set()).difference_update(event.block_hashes)
            elif kind == "AllBlocksCleared":
                self.held.clear()

    def all_held(self) -> set[Any]:
        return set().union(*self.held.values()) if self.held else set()

    def events(self, kind: str) -> list[Any]:
        return [e for b in self.batches for e in b.events if type(e).__name__ == kind]

    def close(self) -> None:
        self._replay.close(linger=0)
        self.sock.close(linger=0)
        self._ctx.term()
