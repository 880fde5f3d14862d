"""A daemon's moves: its imports (as a target) and exports (as a source), and drain-to."""

from __future__ import annotations

import logging
import time

from agentpark.auth import is_loopback
from agentpark.config import Settings
from agentpark.enums import State
from agentpark.errors import AgentparkError
from agentpark.moving.batch import BatchExporter
from agentpark.moving.batchin import BatchImports
from agentpark.moving.dataport import DataPort
from agentpark.moving.exports import Exporter
from agentpark.moving.imports import Importer
from agentpark.moving.record import MoveRecords
from agentpark.moving.ticket import Tickets
from agentpark.moving.wire import DrainToResult, MoveFailure, MoveOutResult
from agentpark.runtime import Runtime

__all__ = ["MoveService"]

log = logging.getLogger(__name__)


class MoveService:
    """Built at start (the lifespan), after the runtime re-attached its sessions."""

    def __init__(self, runtime: Runtime) -> None:
        settings = runtime.settings
        core = runtime.parking
        self.records = MoveRecords.open(settings.database_url)
        source = f"http://{settings.server.host}:{settings.server.port}"
        self.importer = Importer(core, settings.limits.max_body_bytes)
        self.exporter = Exporter(core, self.records, source)
        self.batches = BatchExporter(self.exporter)
        self.batch_sessions = settings.moves.batch_sessions
        self.data = _data_port(settings, self.importer)
        self.imports = BatchImports(self.importer, self.data)
        self.core = core

    @classmethod
    def start(cls, runtime: Runtime) -> MoveService:
        service = cls(runtime)
        service.exporter.hold_in_doubt()
        return service

    def close(self) -> None:
        if self.data is not None:
            self.data.close()
        self.exporter.close()
        self.importer.close()
        self.records.close()

    def move(self, tenant: str, session_id: str, to: str, token: str) -> MoveOutResult:
        """Hand one parked session to ``to``; the session is gone from here on success."""
        outcome = self.batches.move_many([(tenant, session_id)], to, token)[0]
        if isinstance(outcome, AgentparkError):
            raise outcome
        return outcome

    def drain_to(self, to: str, token: str, tenant: str | None) -> DrainToResult:
        """Move every parked session (of ``tenant``) to ``to``, oldest activity first."""
        started = time.perf_counter()
        lives = sorted(
            (
                live
                for live in self.core.registry.all()
                if tenant is None or live.row.tenant == tenant
            ),
            key=lambda lv: lv.row.last_active_at,
        )
        parked = [live.key for live in lives if live.row.state == State.PARKED]
        not_parked = len(lives) - len(parked)
        moved = nbytes = via_data = 0
        failed: list[MoveFailure] = []
        for at in range(0, len(parked), self.batch_sessions):
            keys = parked[at : at + self.batch_sessions]
            for key, outcome in zip(keys, self.batches.move_many(keys, to, token), strict=True):
                if isinstance(outcome, AgentparkError):
                    failed.append(
                        MoveFailure(tenant=key[0], session_id=key[1], error=outcome.message)
                    )
                    continue
                moved += 1
                nbytes += outcome.bytes_sent
                via_data += outcome.data_port
        log.info(
            "drained to %s: %d moved, %d failed, %d not parked", to, moved, len(failed), not_parked
        )
        return DrainToResult(
            moved=moved,
            bytes_sent=nbytes,
            not_parked=not_parked,
            data_port=via_data,
            failed=failed,
            ms=(time.perf_counter() - started) * 1e3,
        )


def _data_port(settings: Settings, importer: Importer) -> DataPort | None:
    """The data port, where it is served (``[moves] data``; auto: a loopback API only, see
    agentpark.config.sections.MoveSettings), on the REST API's host."""
    cfg = settings.moves
    host = settings.server.host
    if cfg.data == "off" or (cfg.data == "auto" and not is_loopback(host)):
        return None
    port = DataPort(
        host,
        cfg.data_port,
        Tickets(cfg.ticket_ttl_s),
        importer.landing,
        cfg.data_connections,
        cfg.data_idle_s,
    )
    log.info("moves: data port on %s:%d", host, port.port)
    return port
