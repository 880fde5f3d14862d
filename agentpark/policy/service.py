"""The policy loop: looks at every session holding KV each tick and acts through the
session core.

Rules (agentpark.policy.rules) decide; this module only gathers the snapshot, carries out
the actions with a reason (idle, pressure, prefetch, demote, ttl), advises the core on
each explicit pause (keep or park, and why), and owns the current policy
so SIGHUP or POST /v1/admin/reload can swap it without a restart. Every action shows up
as an event with its reason, written by the core.

Which rules run depends on whether the core can reach the engine's pool
(``engine_rules``): idle, pressure and prefetch move KV between the engine's pool and a
tier, so they run only where the core copies those blocks itself (the reference engine).
For an engine that copies its own blocks (vLLM through the connector) only the rules on
parked copies run: demotion between tiers (a host-to-host copy the daemon does itself)
and the TTL; the advisor (break-even, learned tool pauses) decides at every turn end.
"""

from __future__ import annotations

import logging
import threading
import time

from agentpark.config import PolicySettings
from agentpark.enums import Reason, State
from agentpark.errors import AgentparkError, StorageUnavailableError
from agentpark.parking import PauseAdvice, PauseOrder, SessionCore
from agentpark.policy.rules import (
    Demote,
    Drop,
    HostView,
    Park,
    Prefetch,
    SessionView,
    demote_rule,
    idle_rule,
    pause_decision,
    prefetch_rule,
    pressure_rule,
    ttl_rule,
)
from agentpark.policy.tools import ToolStats
from agentpark.store.repository import SessionStore

__all__ = ["PolicyService"]

log = logging.getLogger(__name__)

Action = Park | Prefetch | Demote | Drop

# The loop reads every session holding KV each tick: ~7 us of Python (the GIL) a session,
# 3-5 ms a tick at 500 of them on this machine. A request thread that needs the GIL
# meanwhile waits up to the switch interval (5 ms) at each of its hand-offs (event loop,
# worker, back): about half of the slowest 1% of pauses and resumes in ``agentpark bench
# control`` overlapped a tick. So the loop steps aside (a real sleep: the GIL is released
# and taken) every YIELD_EVERY sessions. Measured with 1,000 sessions holding KV and plan()
# in a loop: a thread hand-off's p99 0.9 ms with the steps, 10 ms without; a plan takes
# 12-13 ms instead of 8.5 (requests come first).
YIELD_EVERY = 64
YIELD_S = 0.0001


class PolicyService:
    """Advises the core on every explicit pause and runs the rules' loop."""

    def __init__(
        self,
        core: SessionCore,
        store: SessionStore,
        config: PolicySettings,
        *,
        engine_rules: bool | None = None,
    ) -> None:
        self.core = core
        self.config = config
        # Idle, pressure and prefetch act on the engine's pool: only where the core can
        # reach it (default: it can when its host hands out an endpoint to copy with).
        self.engine_rules = (
            core.host.endpoint() is not None if engine_rules is None else engine_rules
        )
        self.tools = ToolStats(config.tool_window)
        self.tools.load(store.tool_returns(config.tool_window))
        core.add_listener(self.tools.on_event)
        core.advisor = self.advise_pause
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- the decision the core asks for ---------------------------------------------

    def advise_pause(
        self, kv_bytes: int, tool: str | None, expected_resume_s: float | None
    ) -> PauseAdvice:
        """Park or keep: the orchestrator's estimate, else the tool's learned pause.

        The learned or prior estimate stands in for the caller's: it drives prefetch too.
        """
        cfg = self.config
        expected: float | None
        if expected_resume_s is not None:
            expected, source = expected_resume_s, "given by the caller"
        else:
            expected, source = self.tools.expected(tool, cfg)
        if not cfg.enabled:
            return PauseAdvice(True, "policy disabled: every pause parks", expected)
        decision = pause_decision(expected, source, kv_bytes, self.host_view(), cfg)
        return PauseAdvice(decision.park, decision.why, expected)

    def host_view(self) -> HostView:
        pool = self.core.host.pool_figures()
        return HostView(
            total_blocks=pool.total_blocks,
            used_blocks=pool.used_blocks,
            block_bytes=pool.block_bytes,
            bandwidth_bps=self.core.bandwidth_bps,
            tiers=tuple(self.core.tiers),
        )

    # ---- the loop -------------------------------------------------------------------

    def plan(self, now: float) -> list[Action]:
        """What the rules want done now (pure given the snapshot)."""
        cfg = self.config
        host = self.host_view()
        views = []
        for n, (row, busy) in enumerate(self.core.sessions_with_kv()):  # no KV: no rule acts
            if n and n % YIELD_EVERY == 0:
                time.sleep(YIELD_S)
            views.append(SessionView.of(row, busy))
        engine = self.engine_rules
        actions: list[Action] = list(pressure_rule(views, host, cfg)) if engine else []
        chosen = {a.key for a in actions}
        for view in views:
            if view.key in chosen:
                continue
            action: Action | None = (
                ttl_rule(now, view, cfg)
                or (idle_rule(now, view, cfg) if engine else None)
                or demote_rule(now, view, host, cfg)
                or (prefetch_rule(now, view, host, cfg) if engine else None)
            )
            if action is not None:
                actions.append(action)
        return actions

    def tick(self, now: float | None = None) -> list[Action]:
        """Plan and carry out; an action that fails (busy, full) is retried next tick."""
        done: list[Action] = []
        self.core.check_tier_files()  # a file removed or replaced: its sessions are lost
        at = time.time() if now is None else now
        for action in self.plan(at):
            tenant, session_id = action.key
            try:
                if isinstance(action, Drop):
                    if not self.drop_expired(tenant, session_id, at):
                        continue
                elif isinstance(action, Park):
                    self.core.pause(tenant, session_id, PauseOrder(reason=action.reason))
                elif isinstance(action, Demote):
                    self.core.move(tenant, session_id, action.to_tier, reason=Reason.DEMOTE)
                else:
                    self.core.resume(tenant, session_id, reason=Reason.PREFETCH)
                done.append(action)
            except StorageUnavailableError:
                break  # the store logged it once; nothing more until writes work again
            except AgentparkError as exc:
                log.info("policy: %s of %s/%s not done: %s", action, tenant, session_id, exc)
        return done

    def drop_expired(self, tenant: str, session_id: str, now: float) -> bool:
        """Drop a parked copy older than ``parked_ttl_s``: its slots are freed, the session
        is LOST (its next turn recomputes from its tokens), a ``lost`` event with reason
        ``ttl``. False when the session changed meanwhile (it came back, or went)."""
        core, ttl = self.core, self.config.parked_ttl_s
        live = core.registry.find((tenant, session_id))
        if live is None or ttl <= 0:
            return False
        with core.registry.operation(live, "expire", background=True):
            row = live.row
            if row.state != State.PARKED or now - row.last_active_at < ttl:
                return False
            why = f"parked copy untouched for {ttl:g}s (policy.parked_ttl_s): dropped"
            core.transitions.lose(live, Reason.TTL, why)
        log.info("policy: %s/%s: %s", tenant, session_id, why)
        return True

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
            if self.core.draining:
                return
            if not self.config.enabled:
                continue
            if not self.core.store.health.ok:
                continue  # writes fail (logged once by the store): acting would fail too
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
