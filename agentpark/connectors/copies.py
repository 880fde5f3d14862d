"""A worker's copies between its KV caches and the parked slots, each reported to the daemon.

The torch worker (agentpark.connectors.torch_copies) and the TPU worker
(agentpark.connectors.tpu) differ only in how one copy runs; what they share is here, so
the rules hold once for both:

* a store is copied once, whichever of vLLM's hooks reaches it first (``start_load_kv``,
  ``wait_for_save``, ``get_finished``, and ``wait_for_save`` again after ``get_finished``
  when vLLM defers its finalize): a store is in exactly one step's plan, so the store ids
  copied are kept for that step and forgotten when the next step's plan arrives;
* every store is reported (``complete_store``, failed ones too) and its request is handed
  back for vLLM to free its blocks (a pin's copy, ``hold``, is not: its pin frees them);
  every load is reported (``load_done``) and a load that did not run names its blocks
  for vLLM to recompute;
* :class:`OffCopies` is the worker with agentpark off (an unsupported setup, no KV caches
  registered yet): it reports every planned copy failed, so vLLM still frees and recomputes.

Light (no torch, JAX or vLLM): the worker's bookkeeping is tested without them.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable

from agentpark.connectors.client import ControlClient
from agentpark.connectors.steps import LoadMeta, StoreMeta

__all__ = ["Copies", "CopyRefused", "OffCopies"]

log = logging.getLogger("vllm.agentpark")


class CopyRefused(Exception):
    """A copy the worker does not run; ``cause`` names it in the daemon's and the counters."""

    def __init__(self, detail: str, cause: str = "refused") -> None:
        super().__init__(detail)
        self.detail = detail
        self.cause = cause


class Copies(ABC):
    """One worker's copies: :meth:`store` and :meth:`load` one plan entry, the rest shared."""

    stores_at_start = False
    """Whether ``start_load_kv`` runs the step's stores too (TPU: ``wait_for_save`` is not
    called in every step)."""

    def __init__(self, client: ControlClient) -> None:
        self.client = client
        self._step: object | None = None
        self._copied: set[int] = set()

    @abstractmethod
    def store(self, store: StoreMeta) -> list[str] | None:
        """Copy the blocks into the slots; each one's digest when the daemon asked for them.

        CopyRefused for a copy that must not run; any other exception is a failed copy.
        """

    @abstractmethod
    def load(self, load: LoadMeta) -> None:
        """Copy the slots into the blocks. CopyRefused (with its cause) when it must not run."""

    def maybe_register(self) -> bool:
        """Register with the daemon again if it has not taken this worker yet (each step)."""
        return True

    def close(self) -> None:  # noqa: B027  # most copies hold nothing to let go of
        """Let go of what the copies hold (a mapped pool)."""

    @property
    def copied_this_step(self) -> int:
        """Store ids remembered for this step (none once the next step's plan arrived)."""
        return len(self._copied)

    def begin_step(self, plan: object) -> None:
        """The step whose plan is ``plan`` runs: the last step's stores are all reported."""
        if plan is not self._step:
            self._step = plan
            self._copied.clear()

    def run_stores(self, stores: Iterable[StoreMeta]) -> set[str]:
        """Copy each store not copied yet in this step; the request ids to hand back (all
        but a pin's copy: its pin holds the blocks until the step plan lets it go)."""
        done: set[str] = set()
        for store in stores:
            if store.store_id in self._copied:
                continue
            self._copied.add(store.store_id)
            ok, digests, detail = False, None, None
            try:
                digests = self.store(store)
                ok = True
            except CopyRefused as exc:
                detail = exc.detail
            except Exception as exc:
                detail = f"copy failed: {exc}"
                log.exception("agentpark worker: store %d failed", store.store_id)
            if not store.hold:
                done.add(store.req_id)
            self.client.call(
                "complete_store", store_id=store.store_id, ok=ok, digests=digests, detail=detail
            )
        return done

    def run_loads(self, loads: Iterable[LoadMeta]) -> set[int]:
        """Run each load into its blocks; the blocks vLLM must recompute."""
        invalid: set[int] = set()
        for load in loads:
            ok, cause = False, "copy_error"
            try:
                self.load(load)
                ok = True
            except CopyRefused as exc:
                cause = exc.cause
            except Exception as exc:
                log.exception("agentpark worker: load %d failed: %s", load.load_id, exc)
            if not ok:
                invalid.update(load.block_ids)
                self.client.degraded(f"load_{cause}", f"a parked copy was not loaded ({cause})")
            self.client.call("load_done", load_id=load.load_id, ok=ok, cause=None if ok else cause)
        return invalid


class OffCopies(Copies):
    """The worker while agentpark is off for it: every planned copy is reported failed."""

    def __init__(self, client: ControlClient, why: str) -> None:
        super().__init__(client)
        self.why = why

    def store(self, store: StoreMeta) -> list[str] | None:
        raise CopyRefused(f"agentpark is off in this worker: {self.why}")

    def load(self, load: LoadMeta) -> None:
        raise CopyRefused(self.why, "pool_unmapped")
