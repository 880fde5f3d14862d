"""The daemon's side of vLLM: the host pool, the external-engine core and the control ops.

With ``[vllm] enabled = true`` a daemon serves vLLM's agentpark connector instead of
running its reference engine. It owns the host pool, one shm tier file (the same
:class:`~agentpark.tiers.shm.ShmTier` as the reference mode), whose geometry is the
engine's, as its worker read it from the KV tensors and registered it. The file survives
a restart of vLLM (the worker maps it again) and of the daemon (the header names the
layout, so the tier re-attaches at start and recovery keeps its parked sessions).

The pool file's life (made, re-attached, replaced by ``register`` with another layout,
or bookkeeping only when the worker's DMA backend holds the bytes: TPU Sync) is
:class:`~agentpark.control.pool.PoolManager`'s; this module handles the control ops.

With a disk tier configured (``tiers.disk.capacity`` > 0) the daemon also owns a disk
file in the same layout: the policy loop demotes copies parked in the pool longer than
``policy.demote_after_s.shm`` to it (a host-to-host copy by the core's mover), and a
session's next turn promotes its copy back into the pool inside ``match``, before the
answer offers it: the worker only ever maps the pool file.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from agentpark import __version__
from agentpark.config import Settings
from agentpark.connectors.protocol import (
    PROTOCOL,
    Held,
    Layout,
    PoolFile,
    ProtocolError,
    decode_tokens,
)
from agentpark.control.pool import PoolManager, held_pool_id
from agentpark.control.server import ControlServer, default_socket_path
from agentpark.enums import Decision, Tier
from agentpark.errors import AgentparkError, CapacityError, ConfigError, SessionBusyError
from agentpark.parking import CoreOptions, ExternalManager, external_core
from agentpark.parking.external import StorePlan
from agentpark.store.repository import SessionStore
from agentpark.tiers.base import BackendHeldTier
from agentpark.tiers.disk import DiskTier
from agentpark.tiers.factory import vllm_held_path, vllm_pool_path
from agentpark.tiers.filetier import FileTier

__all__ = ["VllmService", "held_pool_id", "vllm_held_path", "vllm_pool_path"]

log = logging.getLogger(__name__)

DegradedSink = Callable[[str, int], None]


class VllmService:
    """The external core for vLLM, its pool tier and the handlers of the control ops."""

    def __init__(self, settings: Settings, store: SessionStore, options: CoreOptions) -> None:
        self.settings = settings
        self.socket_path = settings.vllm.control_socket or default_socket_path(settings.state_dir)
        self.degraded: collections.Counter[str] = collections.Counter()
        self._sinks: list[DegradedSink] = []
        self.pool = PoolManager(settings)  # the pool file's life: control/pool.py
        self.driver: ExternalManager = external_core(
            store, self.pool.geometry, self.pool.model_uid, self.pool.tiers(), options=options
        )
        self.pool.bind(self.driver)
        self.driver.host.engine_blocks = 0
        self.server = ControlServer(self.socket_path, self.handle, self.undelivered)
        self._stop = threading.Event()
        self._reaper = threading.Thread(
            target=self._reap, name="agentpark-vllm-reaper", daemon=True
        )

    # What the op handlers and the API read of the pool (owned by :class:`PoolManager`).
    @property
    def pool_path(self) -> Path:
        return self.pool.pool_path

    @property
    def held_path(self) -> Path:
        return self.pool.held_path

    @property
    def tier(self) -> FileTier | BackendHeldTier | None:
        return self.pool.tier

    @property
    def disk(self) -> DiskTier | None:
        return self.pool.disk

    @property
    def pool_id(self) -> str | None:
        return self.pool.pool_id

    @property
    def held(self) -> Held | None:
        return self.pool.held

    # ---- life -----------------------------------------------------------------------------

    def start(self) -> None:
        self.server.start()
        self._reaper.start()

    def stop(self) -> None:
        self._stop.set()
        self.server.stop()
        if self._reaper.is_alive():
            self._reaper.join(timeout=5)

    def add_degraded_sink(self, sink: DegradedSink) -> None:
        self._sinks.append(sink)

    def count_degraded(self, cause: str, n: int = 1) -> None:
        cause = cause[:32] or "unknown"
        self.degraded[cause] += n
        for sink in self._sinks:
            sink(cause, n)

    def _reap(self) -> None:
        timeout = self.settings.vllm.plan_timeout_s
        while not self._stop.wait(min(1.0, timeout / 4)):
            try:
                expired = self.driver.expire(timeout)
            except Exception:
                log.exception("vllm: expiring plans failed")
                continue
            if expired:
                log.warning("vllm: %d copies the engine never reported were failed", expired)
                self.count_degraded("engine_never_reported", expired)

    # ---- registration (control/pool.py) ----------------------------------------------------

    def register(self, layout: Layout) -> PoolFile:
        """A worker's layout -> the pool file it maps (made or re-attached for it)."""
        return self.pool.register(layout)

    def register_held(self, layout: Layout, held: Held) -> dict[str, Any]:
        """A worker whose DMA backend holds the bytes: slot bookkeeping only, no file."""
        return self.pool.register_held(layout, held)

    def capacity_bytes(self) -> int:
        """The pool's size: ``vllm.pool_capacity``, or what the worker's backend holds."""
        return self.pool.capacity_bytes()

    # ---- the control ops ------------------------------------------------------------------

    def handle(self, message: dict[str, Any], blob: bytes) -> tuple[dict[str, Any], bytes]:
        """One control request -> its answer; an AgentparkError is an answer too."""
        op = message.get("op")
        handler = self._ops.get(op) if isinstance(op, str) else None
        if handler is None:
            return {"ok": False, "error": f"unknown op {op!r}", "cause": "bad_request"}, b""
        try:
            return {"ok": True, **handler(self, message, blob)}, b""
        except SessionBusyError as exc:
            self.count_degraded("session_busy")
            return {"ok": False, "error": exc.message, "cause": "session_busy"}, b""
        except CapacityError as exc:
            self.count_degraded("pool_full")
            return {"ok": False, "error": exc.message, "cause": "pool_full"}, b""
        except AgentparkError as exc:
            return {"ok": False, "error": exc.message, "cause": exc.code}, b""
        except (ProtocolError, KeyError, TypeError, ValueError) as exc:
            return {"ok": False, "error": f"bad request: {exc}"[:500], "cause": "bad_request"}, b""

    def undelivered(self, message: dict[str, Any], answer: dict[str, Any]) -> None:
        """A park or load the connector never heard of: undo it at once."""
        op = message.get("op")
        if op == "prepare_store" and "store_id" in answer:
            self.driver.complete_store(
                int(answer["store_id"]), False, None, "the connector gave up waiting"
            )
        elif op == "begin_load" and "load_id" in answer:
            self.driver.complete_load(
                int(answer["load_id"]), False, "the connector gave up waiting"
            )
        else:
            return
        self.count_degraded("timeout")

    def _hello(self, message: dict[str, Any], blob: bytes) -> dict[str, Any]:
        return {"protocol": PROTOCOL, "version": __version__}

    def _register(self, message: dict[str, Any], blob: bytes) -> dict[str, Any]:
        layout = Layout.from_wire(message["layout"])
        raw_held = message.get("held")
        if raw_held is not None:
            if not isinstance(raw_held, dict):
                raise ProtocolError("held must be an object")
            return {"held": self.register_held(layout, Held.from_wire(raw_held))}
        try:
            pool = self.register(layout)
        except ConfigError as exc:
            self.count_degraded("layout_refused")
            raise ProtocolError(f"layout refused: {exc.message}") from None
        return {"pool": pool.to_wire()}

    def _match(self, message: dict[str, Any], blob: bytes) -> dict[str, Any]:
        tokens = decode_tokens(blob)
        n = self.driver.promote_and_lookup(
            str(message["tenant"]),
            str(message["session_id"]),
            tokens,
            int(message["num_computed"]),
            Tier.SHM,
        )
        return {"tokens": n}

    def _begin_load(self, message: dict[str, Any], blob: bytes) -> dict[str, Any]:
        plan = self.driver.prepare_load(
            str(message["tenant"]),
            str(message["session_id"]),
            decode_tokens(blob).tolist(),
            int(message["start_block"]),
            [int(b) for b in message["block_ids"]],
            only_tier=Tier.SHM,  # the worker maps the pool file only
        )
        return {
            "load_id": plan.load_id,
            "tier": plan.tier,
            "slots": plan.slots,
            "parked_slots": plan.parked_slots,
            "checksum": plan.checksum,
            "pool_id": self.pool_id,
        }

    def _load_done(self, message: dict[str, Any], blob: bytes) -> dict[str, Any]:
        cause = message.get("cause")
        restored = self.driver.complete_load(
            int(message["load_id"]), bool(message["ok"]), None if cause is None else str(cause)
        )
        if not message["ok"]:
            self.count_degraded(f"load_{cause or 'failed'}")
        return {
            "restored_tokens": restored.tokens,
            "restored_from": restored.restored_from,
            "why": restored.why,
        }

    def _prepare_store(self, message: dict[str, Any], blob: bytes) -> dict[str, Any]:
        expected = message.get("expected_resume_s")
        tool = message.get("tool")
        result = self.driver.prepare_store(
            str(message["tenant"]),
            str(message["session_id"]),
            decode_tokens(blob).tolist(),
            [int(b) for b in message["block_ids"]],
            tool=None if tool is None else str(tool),
            expected_resume_s=None if expected is None else float(expected),
            tier=Tier.SHM,
        )
        if not isinstance(result, StorePlan):
            return {"decision": result.decision, "why": result.why}
        return {
            "decision": Decision.PARKED,
            "why": result.why,
            "store_id": result.store_id,
            "slots": result.slots,
            "checksum": result.checksum,
            "pool_id": self.pool_id,
        }

    def _complete_store(self, message: dict[str, Any], blob: bytes) -> dict[str, Any]:
        checksum = message.get("checksum")
        result = self.driver.complete_store(
            int(message["store_id"]),
            bool(message["ok"]),
            None if checksum is None else str(checksum),
            None if message.get("detail") is None else str(message["detail"])[:500],
        )
        if result is None:
            return {"decision": Decision.NOT_PARKED, "why": "unknown store (expired or done)"}
        return {"decision": result.decision, "why": result.why}

    def _degraded(self, message: dict[str, Any], blob: bytes) -> dict[str, Any]:
        counts = message["counts"]
        if not isinstance(counts, dict):
            raise ValueError("counts must be an object")
        for cause, n in list(counts.items())[:64]:
            if isinstance(n, int) and not isinstance(n, bool) and 0 < n <= 1_000_000_000:
                self.count_degraded(str(cause), n)
        return {}

    _ops: ClassVar[dict[str, Callable[[VllmService, dict[str, Any], bytes], dict[str, Any]]]] = {
        "hello": _hello,
        "register": _register,
        "match": _match,
        "begin_load": _begin_load,
        "load_done": _load_done,
        "prepare_store": _prepare_store,
        "complete_store": _complete_store,
        "degraded": _degraded,
    }
