"""The policy loop: looks at every session each tick and acts through parking.

Rules (agentpark.policy.rules) decide; this module only gathers the snapshot, carries out
the actions with a reason (idle, pressure, prefetch, demote), and owns the current policy
so SIGHUP or POST /v1/admin/reload can swap it without a restart. Every action shows up
as an event with its reason, written by parking.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from agentpark.config import PolicySettings
from agentpark.errors import AgentparkError
from agentpark.parking import Parking
from agentpark.policy.rules import (
    Demote,
    HostView,
    Park,
    PauseDecision,
    Prefetch,
    SessionView,
    demote_rule,
    idle_rule,
    pause_decision,
    prefetch_rule,
    pressure_rule,
)
from agentpark.policy.tools import ToolStats

__all__ = ["PauseAdvice", "PolicyService"]

log = logging.getLogger(__name__)

Action = Park | Prefetch | Demote


@dataclass(frozen=True)
class PauseAdvice:
    decision: PauseDecision
    expected_s: float | None
    source: str


class PolicyService:
    def __init__(self, parking: Parking, config: PolicySettings) -> None:
        self.parking = parking
        self.config = config
        self.tools = ToolStats(config.tool_window)
        self.tools.load(parking.store.tool_returns(config.tool_window))
        parking.add_listener(self.tools.on_event)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- decisions asked by the API -------------------------------------------------

    def advise_pause(
        self, kv_bytes: int, tool: str | None, expected_resume_s: float | None
    ) -> PauseAdvice:
        """Park or keep: the orchestrator's estimate, else the tool's learned pause."""
        cfg = self.config
        expected: float | None
        if expected_resume_s is not None:
            expected, source = expected_resume_s, "given by the caller"
        else:
            expected, source = self.tools.expected(tool, cfg)
        decision = pause_decision(expected, source, kv_bytes, self.host_view(), cfg)
        return PauseAdvice(decision, expected, source)

    def host_view(self) -> HostView:
        alloc = self.parking.engine.allocator
        return HostView(
            total_blocks=alloc.total,
            used_blocks=alloc.num_used,
            block_bytes=self.parking.engine.geometry.block_nbytes,
            bandwidth_bps=self.parking.bandwidth_bps,
            tiers=tuple(self.parking.tiers),
        )

    # ---- the loop -------------------------------------------------------------------

    def plan(self, now: float) -> list[Action]:
        """What the rules want done now (pure given the snapshot)."""
        cfg = self.config
        host = self.host_view()
        views = [
            SessionView(
                key=(row.tenant, row.session_id),
                state=row.state,
                tier=row.tier,
                kv_blocks=row.kv_blocks,
                kv_bytes=row.kv_bytes,
                last_active_at=row.last_active_at,
                busy=busy,
                tier_since=row.tier_since,
                expected_resume_at=row.expected_resume_at,
            )
            for row, busy in self.parking.snapshot()
        ]
        actions: list[Action] = list(pressure_rule(views, host, cfg))
        chosen = {a.key for a in actions}
        for view in views:
            if view.key in chosen:
                continue
            action: Action | None = (
                idle_rule(now, view, cfg)
                or demote_rule(now, view, host, cfg)
                or prefetch_rule(now, view, host, cfg)
            )
            if action is not None:
                actions.append(action)
        return actions

    def tick(self, now: float | None = None) -> list[Action]:
        """Plan and carry out; an action that fails (busy, full) is retried next tick."""
        done: list[Action] = []
        for action in self.plan(time.time() if now is None else now):
            tenant, session_id = action.key
            try:
                if isinstance(action, Park):
                    self.parking.pause(tenant, session_id, reason=action.reason)
                elif isinstance(action, Demote):
                    self.parking.move(tenant, session_id, action.to_tier, reason="demote")
                else:
                    self.parking.resume(tenant, session_id, reason="prefetch")
                done.append(action)
            except AgentparkError as exc:
                log.info("policy: %s of %s/%s not done: %s", action, tenant, session_id, exc)
        return done

    def start(self) -> None:
        """Run the loop in a thread (a disabled policy starts it on reload instead)."""
        if not self.config.enabled or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="agentpark-policy", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.config.tick_s):
            if self.parking.draining:
                return
            if not self.config.enabled:
                continue
            try:
                self.tick()
            except Exception:
                log.exception("policy tick failed")

    # ---- reload ---------------------------------------------------------------------

    def reload(self, config: PolicySettings) -> None:
        """Swap in a validated policy; the loop picks it up on its next tick."""
        self.config = config
        if config.enabled and not self._stop.is_set():
            self.start()
        log.info("policy reloaded: %s", config)
