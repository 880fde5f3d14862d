"""agentpark's vLLM KV connector: parks an agent session's KV at its turn end, loads it back.

Configure vLLM with::

    --kv-transfer-config '{"kv_connector": "AgentparkConnector",
      "kv_connector_module_path": "agentpark.connectors.vllm", "kv_role": "kv_both",
      "kv_connector_extra_config": {"daemon_url": "http://127.0.0.1:8470"}}'

(optional extra keys: ``token``, ``timeout_ms`` (the scheduler's budget per control call,
default 50, or ``$AGENTPARK_CONNECTOR_TIMEOUT_MS``; a miss is counted ``slow`` and the turn
is not parked; the worker's calls wait 20 times that), ``tenant``
(default "default"), ``tool_call_format`` (the chat template's tool-call markers read from
a turn's output for its tool: agentpark.connectors.toolcalls, default "auto"); on TPU
``tpu_sync_host_bytes`` (default 1 GiB) and ``tpu_sync_shm_dir``, see ``register_runner``).
A request takes part when its body has
``kv_transfer_params: {"agentpark": {"session_id": ..., "tool": ...,
"expected_resume_s": ...}}``; the response's ``kv_transfer_params.agentpark`` says
``decision`` (``parked``: copied to the host pool, then freed; ``pinned``: the blocks stay
allocated in vLLM, its own prefix cache serves the next turn; ``dropped``: freed now;
``kept``, ``refused``, ``released``), ``why``, ``restored_tokens`` and ``restored_from``.
A pin is let go at the session's return, its time-out, under pressure (``has_pending_block_frees``
makes vLLM wait a step for it instead of preempting), or when the daemon is lost
(agentpark.connectors.pins).

The connector is a facade, like vLLM's own OffloadingConnector: vLLM builds it once per
process with a role, and it delegates to the scheduler side (agentpark.connectors.scheduler:
match, load, park) or the worker side (agentpark.connectors.worker: the copies, through
torch's or TPU Sync's). A setup it does not support makes that side an "off" object, so no
method checks a flag.

Worker side (the process that owns the KV tensors): ``register_kv_caches`` reads the
layout from the tensors (shape, dtype, the block axis) and registers it with the daemon,
which makes or re-attaches the pool file; copies run in ``start_load_kv`` (loads) and
``get_finished`` (stores, reported done in the same call); a load whose parked copy
fails its checksum is not used: its blocks go to ``get_block_ids_with_load_errors`` and
vLLM recomputes them (this connector sets ``kv_load_failure_policy`` to "recompute").

vLLM on TPU (tpu-inference): the runner registers itself (``register_runner``) and the
copies go through TPU Sync, which holds the parked bytes (agentpark.connectors.tpu;
UNVERIFIED: no TPU here).

Never fails vLLM: daemon down or slow, pool full, damaged copy, unknown session, bad
params all go on as without a connector, counted per cause and logged once.
Tensor parallel > 1, pipeline parallel and hybrid KV caches are not supported: the
connector then stays out of the way (logged once).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from agentpark.connectors.client import ControlClient
from agentpark.connectors.scheduler import OffScheduler, SchedulerSide
from agentpark.connectors.steps import StepPlan
from agentpark.connectors.toolcalls import reader_from_config
from agentpark.connectors.worker import OffWorker, WorkerSide

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

    from agentpark.connectors.tpu import RunnerLike

__all__ = ["TIMEOUT_ENV", "AgentparkConnector", "AgentparkMetadata"]

TIMEOUT_ENV = "AGENTPARK_CONNECTOR_TIMEOUT_MS"
"""The control calls' bound when kv_connector_extra_config has no ``timeout_ms``."""

# A child of vLLM's logger: its handler, format and level (INFO) apply in vLLM's processes.
log = logging.getLogger("vllm.agentpark")


@dataclass
class AgentparkMetadata(StepPlan, KVConnectorMetadata):  # type: ignore[misc]  # vLLM untyped
    """What the scheduler side tells the worker for one step (picklable): a StepPlan."""


def unsupported(vllm_config: VllmConfig) -> str | None:
    """Why agentpark cannot serve this vLLM setup, or None."""
    parallel = vllm_config.parallel_config
    if parallel.tensor_parallel_size != 1 or parallel.pipeline_parallel_size != 1:
        return "tensor or pipeline parallel > 1 is not supported yet"
    return None


def _timeout_ms(extra: dict[str, Any]) -> float:
    raw = extra.get("timeout_ms", os.environ.get(TIMEOUT_ENV, 50))
    try:
        return float(raw)
    except (TypeError, ValueError):
        return 50.0


class AgentparkConnector(KVConnectorBase_V1):  # type: ignore[misc]  # vLLM untyped here
    """vLLM's KV connector backed by the agentpark daemon: a facade over the role's side."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig | None = None,
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        cfg = self._kv_transfer_config
        extra: dict[str, Any] = dict(cfg.kv_connector_extra_config or {})
        scheduler = role == KVConnectorRole.SCHEDULER
        self.tenant = str(extra.get("tenant", "default"))
        self.client = ControlClient(
            extra.get("daemon_url"),
            token=extra.get("token"),
            # The worker's calls are not on the scheduler's path: it may wait longer.
            timeout_s=_timeout_ms(extra) / 1e3 * (1 if scheduler else 20),
            socket_path=extra.get("control_socket"),
            who="scheduler" if scheduler else "worker",
            logger=log,
            peer=cfg.engine_id,  # the scheduler prepares, the workers finish: one engine
        )
        why = unsupported(vllm_config)
        if why is not None:
            log.warning("agentpark connector off: %s", why)
        block_size = int(vllm_config.cache_config.block_size)
        self.scheduler: SchedulerSide | None = None
        self.worker: WorkerSide | None = None
        if scheduler:
            if cfg.kv_load_failure_policy != "recompute":
                # A damaged parked copy must make vLLM recompute, never fail the request.
                cfg.kv_load_failure_policy = "recompute"
                log.info("agentpark connector: kv_load_failure_policy set to 'recompute'")
            if why is None:
                self.scheduler = SchedulerSide(
                    self.client,
                    tenant=self.tenant,
                    block_size=block_size,
                    tools=reader_from_config(vllm_config, extra),
                )
            else:
                self.scheduler = OffScheduler(
                    self.client, tenant=self.tenant, block_size=block_size, why=why
                )
        elif why is None:
            self.worker = WorkerSide(self.client, vllm_config, kv_cache_config, extra)
        else:
            self.worker = OffWorker(self.client, vllm_config, kv_cache_config, why)

    @property
    def _scheduler(self) -> SchedulerSide:
        assert self.scheduler is not None, "a scheduler-side call in vLLM's worker"
        return self.scheduler

    @property
    def _worker(self) -> WorkerSide:
        assert self.worker is not None, "a worker-side call in vLLM's scheduler"
        return self.worker

    def _plan(self) -> StepPlan | None:
        if not self.has_connector_metadata():
            return None
        meta = self._get_connector_metadata()
        assert isinstance(meta, AgentparkMetadata)
        return meta

    # ==== scheduler side ======================================================================

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        self._scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def bind_gpu_block_pool(self, gpu_block_pool: BlockPool) -> None:
        """The scheduler's block pool: free and total blocks for pins and pressure."""
        if self.scheduler is not None:
            self.scheduler.engine.pool = gpu_block_pool

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        tokens = int(getattr(scheduler_output, "total_num_scheduled_tokens", 0) or 0)
        plan = self._scheduler.build_plan(tokens)
        return AgentparkMetadata(plan.stores, plan.loads, plan.invalid, plan.release)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        bad = connector_output.invalid_block_ids
        if bad:
            self._scheduler.loads_failed(set(bad))
        self._scheduler.finished_sending(set(connector_output.finished_sending or ()))

    def has_pending_block_frees(self) -> bool:
        return self._scheduler.has_pending_block_frees()

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self._scheduler.request_finished(request, block_ids)

    def take_events(self) -> Iterable[Any]:
        return ()

    # ==== worker side =========================================================================

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._worker.register_kv_caches(kv_caches)

    def register_runner(self, runner: RunnerLike) -> None:
        """vLLM on TPU (tpu-inference) calls this instead of register_kv_caches (see
        :meth:`agentpark.connectors.worker.WorkerSide.register_runner`)."""
        self._worker.register_runner(runner)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        self._worker.start_load_kv(self._plan())

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: torch.Tensor,
        attn_metadata: AttentionMetadata,
        **kwargs: Any,
    ) -> None:
        return

    def wait_for_save(self) -> None:
        self._worker.run_stores(self._plan())

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return self._worker.get_finished(self._plan())

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.get_block_ids_with_load_errors()

    def shutdown(self) -> None:
        if self.scheduler is not None:
            self.scheduler.shutdown()
        if self.worker is not None:
            self.worker.shutdown()
        self.client.close()
