"""A daemon's moves: its imports (as a target) and exports (as a source), and drain-to."""

from __future__ import annotations

import logging
import time

from agentpark.enums import State
from agentpark.errors import AgentparkError
from agentpark.moving.exports import Exporter
from agentpark.moving.imports import Importer
from agentpark.moving.record import MoveRecords
from agentpark.moving.wire import DrainToResult, MoveFailure
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
        self.core = core

    @classmethod
    def start(cls, runtime: Runtime) -> MoveService:
        service = cls(runtime)
        service.exporter.hold_in_doubt()
        return service

    def close(self) -> None:
        self.exporter.close()
        self.importer.close()
        self.records.close()

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
        moved = nbytes = not_parked = 0
        failed: list[MoveFailure] = []
        for live in lives:
            if live.row.state != State.PARKED:
                not_parked += 1
                continue
            try:
                result = self.exporter.move(live.row.tenant, live.row.session_id, to, token)
            except AgentparkError as exc:
                failed.append(
                    MoveFailure(
                        tenant=live.row.tenant, session_id=live.row.session_id, error=exc.message
                    )
                )
                continue
            moved += 1
            nbytes += result.bytes_sent
        log.info(
            "drained to %s: %d moved, %d failed, %d not parked", to, moved, len(failed), not_parked
        )
        return DrainToResult(
            moved=moved,
            bytes_sent=nbytes,
            not_parked=not_parked,
            failed=failed,
            ms=(time.perf_counter() - started) * 1e3,
        )
