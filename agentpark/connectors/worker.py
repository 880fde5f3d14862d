"""The connector's worker side (the process that owns the KV caches): runs each step's copies.

The worker's copies are its state: :class:`~agentpark.connectors.copies.OffCopies` until
KV caches are registered (and for good when they cannot be copied), then torch's
(``register_kv_caches``: agentpark.connectors.torch_copies) or TPU Sync's
(``register_runner``: agentpark.connectors.tpu). Both engine paths are imported only when
taken, so this module loads without torch or JAX.

A store is planned only for a request vLLM has finished, so its copy being done (or
failed) is its send being done: ``get_finished`` hands it back at once and vLLM frees its
blocks; nothing is kept past that step. A pinned request (agentpark.connectors.pins) is
reported in the step whose plan lets it go (``release``), also when a copy was taken
behind the pin (its store ``hold``: copied, then still held).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agentpark.connectors.client import ControlClient
from agentpark.connectors.copies import Copies, OffCopies
from agentpark.connectors.steps import StepPlan

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

    from agentpark.connectors.tpu import RunnerLike

__all__ = ["OffWorker", "WorkerSide", "model_uid"]

log = logging.getLogger("vllm.agentpark")


def model_uid(vllm_config: VllmConfig, kv_dtype: str) -> str:
    """The engine's model identity: its name, KV dtype and a hash of the model config."""
    model = vllm_config.model_config
    hf = model.hf_config.to_json_string() if hasattr(model.hf_config, "to_json_string") else ""
    digest = hashlib.sha256(f"{hf}|{model.revision}|{model.dtype}".encode()).hexdigest()[:16]
    return f"vllm:{model.model}:{kv_dtype}:{digest}"[:500]


class WorkerSide:
    """vLLM's worker: registers the KV caches, runs each step's plan through its copies."""

    def __init__(
        self,
        client: ControlClient,
        vllm_config: VllmConfig,
        kv_cache_config: KVCacheConfig | None,
        extra: Mapping[str, Any],
    ) -> None:
        self.client = client
        self.vllm_config = vllm_config
        self.kv_cache_config = kv_cache_config
        self.extra = extra
        self.block_size = int(vllm_config.cache_config.block_size)
        self.copies: Copies = OffCopies(client, "no KV caches registered yet")
        self._invalid: set[int] = set()
        self._sending: set[str] = set()

    @property
    def requests_sending(self) -> int:
        """Requests whose store ran and which vLLM has not been told of yet."""
        return len(self._sending)

    def off(self, why: str) -> None:
        """Turn agentpark off for this worker: every copy from now on is reported failed."""
        log.warning("agentpark connector off: %s", why)
        self.copies.close()
        self.copies = OffCopies(self.client, why)

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        if not isinstance(kv_caches, dict):  # JAX arrays (TPU): see register_runner
            log.info("agentpark worker: KV caches are not torch tensors; waiting for the runner")
            return
        from agentpark.connectors.torch_copies import TorchCopies, read_layout  # torch

        try:
            if self.kv_cache_config is None:
                raise ValueError("no KV cache config")
            sources, layout = read_layout(
                kv_caches,
                int(self.kv_cache_config.num_blocks),
                self.block_size,
                lambda dtype: model_uid(self.vllm_config, dtype),
            )
        except ValueError as exc:
            self.off(f"unsupported KV layout: {exc}")
            return
        copies = TorchCopies(self.client, sources, layout)
        self.copies = copies
        copies.ensure_pool(None)

    def register_runner(self, runner: RunnerLike) -> None:
        """vLLM on TPU (tpu-inference) calls this instead of ``register_kv_caches``.

        The runner, not its arrays, is kept: ``runner.kv_caches`` is reassigned by every
        forward (donated buffers). Copies then go through TPU Sync
        (agentpark.connectors.tpu), which holds the parked bytes in this process; extra
        config ``tpu_sync_host_bytes`` (default 1 GiB) sizes them and ``tpu_sync_shm_dir``
        keeps them over a vLLM restart (TPU Sync's shm segments).

        UNVERIFIED (no TPU here): the call from tpu-inference and everything on a TPU; the
        worker class itself is tested on CPU against TPU Sync's real wheel.
        """
        try:
            from agentpark.connectors.tpu import TpuWorker, host_config  # JAX: only here

            host_bytes, shm_dir = host_config(dict(self.extra))
            dtype = str(runner.kv_caches[0].dtype) if runner.kv_caches else "none"
            num_blocks = self.kv_cache_config.num_blocks if self.kv_cache_config else None
            tpu = TpuWorker(
                self.client,
                runner,
                block_size=self.block_size,
                model_uid=model_uid(self.vllm_config, f"jax.{dtype}"),
                host_bytes=host_bytes,
                shm_dir=shm_dir,
                num_blocks=None if num_blocks is None else int(num_blocks),
            )
        except Exception as exc:  # ImportError, a layout or TPU Sync refusing: stay out
            self.off(f"the TPU path cannot start: {exc}")
            return
        self.copies = tpu
        tpu.register()

    def start_load_kv(self, plan: StepPlan | None) -> None:
        """Before the forward: this step's loads (and on TPU its stores)."""
        if plan is None:
            return
        self.copies.begin_step(plan)
        self._invalid.update(plan.invalid)
        if self.copies.stores_at_start:
            self._sending |= self.copies.run_stores(plan.stores)
        self._invalid |= self.copies.run_loads(plan.loads)

    def run_stores(self, plan: StepPlan | None) -> None:
        """This step's parks into the pool (``wait_for_save``; ``get_finished`` too, since
        ``wait_for_save`` is not called on every path)."""
        if plan is None:
            return
        self.copies.begin_step(plan)
        self._sending |= self.copies.run_stores(plan.stores)

    def get_finished(self, plan: StepPlan | None) -> tuple[set[str] | None, set[str] | None]:
        """The requests whose store is done, and the pins let go: vLLM frees their
        blocks now (each id was in a finished_req_ids: vLLM finished it before it planned)."""
        self.run_stores(plan)
        self.copies.maybe_register()
        done, self._sending = self._sending, set()
        if plan is not None:
            done.update(plan.release)
        return (done or None), None

    def get_block_ids_with_load_errors(self) -> set[int]:
        bad, self._invalid = self._invalid, set()
        return bad

    def shutdown(self) -> None:
        self.copies.close()


class OffWorker(WorkerSide):
    """The worker side with agentpark off from the start: registers nothing, ever."""

    def __init__(
        self,
        client: ControlClient,
        vllm_config: VllmConfig,
        kv_cache_config: KVCacheConfig | None,
        why: str,
    ) -> None:
        super().__init__(client, vllm_config, kv_cache_config, {})
        self.copies = OffCopies(client, why)

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        return

    def register_runner(self, runner: RunnerLike) -> None:
        return
