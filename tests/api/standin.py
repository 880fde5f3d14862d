"""STAND-IN for vLLM's connector as the daemon sees it: the control ops its scheduler and
worker send (each naming vLLM's request id), over the daemon's real control socket, with
the worker's copies written by numpy into the real /dev/shm pool file (tests/control's
``Worker``). The daemon side (ops, manager, core, events, SQLite) is the real one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentpark.connectors.client import ControlClient
from agentpark.connectors.protocol import PoolFile, encode_tokens
from tests.control.test_control import BLOCK, LAYOUT, Worker

__all__ = ["BLOCK", "StandInEngine", "vllm_mode"]


def vllm_mode(shm_dir: Path) -> dict[str, Any]:
    """The ``vllm`` settings of a daemon that serves connectors (a 1 MiB pool file)."""
    return {"enabled": True, "pool_capacity": 1 << 20, "pool_path": shm_dir / "pool"}


class StandInEngine:
    """One connector of a tenant (its token's): turn ends parked or kept, turn starts
    restored from the parked copy."""

    def __init__(self, socket_path: str, token: str | None = None) -> None:
        self.client = ControlClient(None, token=token, socket_path=socket_path, timeout_s=10.0)
        registered = self.call("register", layout=LAYOUT.to_wire())
        self.worker = Worker(PoolFile.from_wire(registered["pool"]), LAYOUT)

    def call(self, op: str, tokens: list[int] | None = None, **fields: Any) -> dict[str, Any]:
        blob = encode_tokens(tokens) if tokens is not None else b""
        answer = self.client.call(op, blob, wait_s=10.0, **fields)
        assert answer is not None and answer["ok"], (op, answer)
        return answer

    def end_turn(
        self,
        session_id: str,
        tokens: list[int],
        request_id: str,
        *,
        tool: str | None = "search",
        expected_resume_s: float | None = 60.0,
        copy: bool = True,
    ) -> dict[str, Any]:
        """The request finished: ``prepare_store``, and when parked the worker's copy and
        ``complete_store`` (unless not ``copy``: :meth:`copy` does it later). Returns the
        final answer (decision and why), or the plan."""
        blocks = list(range(100, 100 + len(tokens) // BLOCK))
        plan = self.call(
            "prepare_store",
            tokens,
            session_id=session_id,
            block_ids=blocks,
            tool=tool,
            expected_resume_s=expected_resume_s,
            request_id=request_id,
        )
        if plan["decision"] != "parked" or not copy:
            return plan
        return self.copy(plan, len(tokens))

    def copy(self, plan: dict[str, Any], n_tokens: int) -> dict[str, Any]:
        """The worker's copy of a planned park, reported: ``complete_store``'s answer."""
        fresh = [s for s, new in zip(plan["slots"], plan["fresh"], strict=True) if new]
        self.worker.write(fresh, seed=n_tokens)
        digests = self.worker.digests(fresh)
        return self.call("complete_store", store_id=plan["store_id"], ok=True, digests=digests)

    def start_turn(self, session_id: str, tokens: list[int], request_id: str) -> dict[str, Any]:
        """A new request of the session: ``match``, then the load of what matched into
        fresh blocks (``begin_load``, ``load_done``). Returns load_done's answer."""
        match = self.call(
            "match", tokens, session_id=session_id, num_computed=0, request_id=request_id
        )
        n = match["tokens"] // BLOCK
        assert n > 0, match
        load = self.call(
            "begin_load",
            tokens,
            session_id=session_id,
            start_block=0,
            block_ids=list(range(200, 200 + n)),
            request_id=request_id,
        )
        return self.call("load_done", load_id=load["load_id"], ok=True)

    def close(self) -> None:
        self.client.close()
