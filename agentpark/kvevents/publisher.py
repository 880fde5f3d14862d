"""vLLM's ZMQ transport for KV event batches: PUB frames and the replay ROUTER.

As vLLM's ``ZmqEventPublisher``: each batch goes out as three frames, ``topic``, the
batch's sequence number (8 bytes, big-endian) and the msgpack payload. The last
``buffer_steps`` payloads are kept; a client that sends ``(identity, b"", start_seq)`` (a
DEALER/REQ with the 8-byte start sequence) to the replay socket gets every kept batch from
``start_seq`` on as ``(identity, b"", topic, seq, payload)``, then the end marker
``(identity, b"", b"", seq -1, b"")``.

The PUB is bound to its endpoint (the daemon is the server a Dynamo indexer connects to),
or connected with ``connect`` (llm-d's indexer binds a SUB that engines connect to; vLLM
picks by the address: it binds only wildcard and ipc ones). The PUB is an XPUB: it hears each
subscription (:meth:`ZmqPublisher.subscribed`), so the advertiser re-sends its whole
state to a router that (re)connects, also one without a replay client (Dynamo's
standalone indexer has none). Subscribers see a plain PUB. Sockets are used by one
thread only (:class:`agentpark.kvevents.advertiser.Advertiser`'s).
"""

from __future__ import annotations

from collections import deque

import zmq

__all__ = ["END_SEQ", "ZmqPublisher"]

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class ZmqPublisher:
    """The PUB socket, the replay socket and the numbered buffer; one thread uses it."""

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str,
        topic: str,
        buffer_steps: int,
        hwm: int,
        *,
        connect: bool = False,
    ) -> None:
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.XPUB)
        self._pub.set_hwm(hwm)
        self._pub.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscription, not only new topics
        self._replay: zmq.Socket[bytes] | None = None
        try:
            if connect:
                self._pub.connect(endpoint)  # to a router's bound SUB (llm-d's indexer)
            else:
                self._pub.bind(endpoint)
            if replay_endpoint:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.bind(replay_endpoint)
        except zmq.ZMQError:
            self.close()
            raise
        self.endpoint = endpoint if connect else self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.replay_endpoint = (
            self._replay.getsockopt_string(zmq.LAST_ENDPOINT) if self._replay else ""
        )
        self._topic = topic.encode()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._seq = 0

    def send(self, payload: bytes) -> int:
        """Publish one batch; returns its sequence number."""
        seq = self._seq
        self._seq += 1
        self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
        self._buffer.append((seq, payload))
        return seq

    def subscribed(self) -> bool:
        """Whether a subscriber joined since the last call (reads the XPUB's messages)."""
        joined = False
        while self._pub.poll(0):
            joined |= self._pub.recv().startswith(b"\x01")
        return joined

    def serve_replay(self, timeout_ms: int) -> None:
        """Answer the replay requests waiting (waits up to ``timeout_ms`` for one)."""
        if self._replay is None or not self._replay.poll(timeout_ms):
            return
        while self._replay.poll(0):
            frames = self._replay.recv_multipart()
            if len(frames) != 3:
                continue  # not vLLM's request shape: ignored, as vLLM does
            client, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):
                if seq >= first:
                    self._replay.send_multipart(
                        (client, b"", self._topic, seq.to_bytes(8, "big"), payload)
                    )
            self._replay.send_multipart((client, b"", b"", END_SEQ, b""))

    @property
    def has_replay(self) -> bool:
        return self._replay is not None

    def close(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
        self._ctx.term()
