"""agentpark's vLLM KV connector: parks an agent session's KV at its turn end, loads it back.

Configure vLLM with::

    --kv-transfer-config '{"kv_connector": "AgentparkConnector",
      "kv_connector_module_path": "agentpark.connectors.vllm", "kv_role": "kv_both",
      "kv_connector_extra_config": {"daemon_url": "http://127.0.0.1:8470"}}'

(optional extra keys: ``token``, ``timeout_ms`` (default 50, or
``$AGENTPARK_CONNECTOR_TIMEOUT_MS``; the worker's calls wait 20 times that), ``tenant``
(default "default"); on TPU ``tpu_sync_host_bytes`` (default 1 GiB) and
``tpu_sync_shm_dir``, see ``register_runner``). A request takes part when its body has
``kv_transfer_params: {"agentpark": {"session_id": ..., "tool": ...,
"expected_resume_s": ...}}``; the response's ``kv_transfer_params.agentpark`` says
``decision``, ``why``, ``restored_tokens`` and ``restored_from``.

Scheduler side (vLLM's engine-core process):

- ``request_finished``: the turn ended. The daemon decides park or keep; to park it
  reserves slots in the host pool and the connector keeps the request's blocks (delayed
  free) until the worker has copied them (the next step), then the daemon commits.
- ``get_num_new_matched_tokens``: a request of a parked session: the whole blocks of its
  token prefix beyond vLLM's own cache that the parked copy holds (matched on token ids,
  at least one token left to compute); ``update_state_after_alloc`` takes the parked
  copy for the load into the blocks vLLM allocated. Loads are synchronous (before the
  forward that needs them).

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

import hashlib
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from agentpark.connectors.client import ControlClient
from agentpark.connectors.pool import MappedPool
from agentpark.connectors.protocol import (
    Layout,
    PoolFile,
    SessionParams,
    encode_tokens,
    parse_params,
)
from agentpark.connectors.steps import LoadMeta, StoreMeta

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

    from agentpark.connectors.tpu import RunnerLike, TpuWorker

__all__ = ["TIMEOUT_ENV", "AgentparkConnector", "AgentparkMetadata"]

TIMEOUT_ENV = "AGENTPARK_CONNECTOR_TIMEOUT_MS"
"""The control calls' bound when kv_connector_extra_config has no ``timeout_ms``."""

# A child of vLLM's logger: its handler, format and level (INFO) apply in vLLM's processes.
log = logging.getLogger("vllm.agentpark")


@dataclass
class AgentparkMetadata(KVConnectorMetadata):  # type: ignore[misc]  # vLLM untyped here
    """What the scheduler side tells the worker for one step (picklable)."""

    stores: list[StoreMeta] = field(default_factory=list)
    loads: list[LoadMeta] = field(default_factory=list)
    invalid: list[int] = field(default_factory=list)  # blocks vLLM must recompute


@dataclass
class _Request:
    """The scheduler side's record of one request of a session."""

    params: SessionParams
    num_computed: int = 0
    restored_tokens: int = 0
    restored_from: str | None = None
    load_blocks: tuple[int, ...] = ()


def model_uid(vllm_config: VllmConfig, kv_dtype: str) -> str:
    """The engine's model identity: its name, KV dtype and a hash of the model config."""
    model = vllm_config.model_config
    hf = model.hf_config.to_json_string() if hasattr(model.hf_config, "to_json_string") else ""
    digest = hashlib.sha256(f"{hf}|{model.revision}|{model.dtype}".encode()).hexdigest()[:16]
    return f"vllm:{model.model}:{kv_dtype}:{digest}"[:500]


class AgentparkConnector(KVConnectorBase_V1):  # type: ignore[misc]  # vLLM untyped here
    """vLLM's KV connector backed by the agentpark daemon (both roles)."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig | None = None,
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        cfg = self._kv_transfer_config
        extra = cfg.kv_connector_extra_config or {}
        timeout_ms = extra.get("timeout_ms", os.environ.get(TIMEOUT_ENV, 50))
        try:
            timeout_ms = float(timeout_ms)
        except (TypeError, ValueError):
            timeout_ms = 50.0
        self.tenant = str(extra.get("tenant", "default"))
        self.block_size = vllm_config.cache_config.block_size
        self._kv_cache_config = kv_cache_config
        who = "scheduler" if role == KVConnectorRole.SCHEDULER else "worker"
        self.client = ControlClient(
            extra.get("daemon_url"),
            token=extra.get("token"),
            # The worker's calls are not on the scheduler's path: it may wait longer.
            timeout_s=timeout_ms / 1e3 * (1 if role == KVConnectorRole.SCHEDULER else 20),
            socket_path=extra.get("control_socket"),
            who=who,
            logger=log,
            peer=cfg.engine_id,  # the scheduler prepares, the workers finish: one engine
        )
        self._disabled: str | None = self._unsupported(vllm_config)
        if self._disabled is not None:
            log.warning("agentpark connector off: %s", self._disabled)
        # scheduler side
        self._requests: dict[str, _Request] = {}
        self._next = AgentparkMetadata()
        if role == KVConnectorRole.SCHEDULER and cfg.kv_load_failure_policy != "recompute":
            # A damaged parked copy must make vLLM recompute, never fail the request.
            cfg.kv_load_failure_policy = "recompute"
            log.info("agentpark connector: kv_load_failure_policy set to 'recompute'")
        # worker side
        self.vllm_config = vllm_config
        self._sources: list[torch.Tensor] = []
        self._layout: Layout | None = None
        self._pool: MappedPool | None = None
        self._invalid: set[int] = set()
        self._done_sending: set[str] = set()
        self._seen_finished: set[str] = set()
        self._stored: set[int] = set()
        self._tpu: TpuWorker | None = None  # vLLM on TPU: the worker side over JAX arrays

    @staticmethod
    def _unsupported(vllm_config: VllmConfig) -> str | None:
        parallel = vllm_config.parallel_config
        if parallel.tensor_parallel_size != 1 or parallel.pipeline_parallel_size != 1:
            return "tensor or pipeline parallel > 1 is not supported yet"
        return None

    # ==== scheduler side ======================================================================

    def _params(self, request: Request) -> SessionParams | None:
        parsed = parse_params(request.kv_transfer_params, self.tenant)
        if isinstance(parsed, str):
            return None
        return parsed

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        if self._disabled is not None:
            return 0, False
        params = self._params(request)
        if params is None:
            return 0, False
        record = self._requests.setdefault(request.request_id, _Request(params))
        record.num_computed = num_computed_tokens
        tokens = list(request.all_token_ids)
        answer = self.client.call(
            "match",
            encode_tokens(tokens),
            tenant=self.tenant,
            session_id=params.session_id,
            num_computed=num_computed_tokens,
        )
        if answer is None or not answer.get("ok"):
            return 0, False
        n = int(answer.get("tokens", 0))
        limit = len(tokens) - 1 - num_computed_tokens
        if n <= 0 or n % self.block_size or n > limit:
            return 0, False
        return n, False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        if num_external_tokens <= 0:
            return
        record = self._requests.get(request.request_id)
        (block_ids, *_rest) = blocks.get_block_ids()
        start = record.num_computed // self.block_size if record else 0
        end = start + num_external_tokens // self.block_size
        targets = list(block_ids[start:end])
        answer = None
        if record is not None:
            answer = self.client.call(
                "begin_load",
                encode_tokens(list(request.all_token_ids)),
                tenant=self.tenant,
                session_id=record.params.session_id,
                start_block=start,
                block_ids=list(block_ids[:end]),
            )
        if answer is None or not answer.get("ok"):
            # vLLM counted these tokens as loadable: say the blocks failed, it recomputes.
            why = "no record of the request" if answer is None else str(answer.get("error"))
            if answer is not None:
                self.client.degraded("load_refused", f"the daemon refused a load: {why}")
            self._next.invalid.extend(targets)
            return
        self._next.loads.append(
            LoadMeta(
                request.request_id,
                int(answer["load_id"]),
                targets,
                [int(s) for s in answer["slots"]],
                [int(s) for s in answer["parked_slots"]],
                answer.get("checksum"),
                answer.get("pool_id"),
            )
        )
        assert record is not None
        record.restored_tokens = num_external_tokens
        record.restored_from = str(answer.get("tier", "shm"))
        record.load_blocks = tuple(targets)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta, self._next = self._next, AgentparkMetadata()
        return meta

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        bad = connector_output.invalid_block_ids
        if not bad:
            return
        for record in self._requests.values():
            if record.load_blocks and bad.intersection(record.load_blocks):
                record.restored_tokens, record.restored_from = 0, None

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        record = self._requests.pop(request.request_id, None)
        parsed = parse_params(request.kv_transfer_params, self.tenant)
        if parsed is None:
            return False, None
        if isinstance(parsed, str):
            # The client's own mistake: said for every request (the counter once per cause).
            log.info("agentpark: request %s not parked: %s", request.request_id, parsed)
            self.client.degraded("bad_params", f"request {request.request_id}: {parsed}")
            return False, self._answer("refused", parsed, None)
        if self._disabled is not None:
            return False, self._answer("kept", self._disabled, record)
        full = min(request.num_computed_tokens // self.block_size, len(block_ids))
        if full == 0:
            return False, self._answer("kept", "no whole block of KV to park", record)
        tokens = list(request.all_token_ids)[: full * self.block_size]
        ids = [int(b) for b in block_ids[:full]]
        answer = self.client.call(
            "prepare_store",
            encode_tokens(tokens),
            tenant=self.tenant,
            session_id=parsed.session_id,
            block_ids=ids,
            tool=parsed.tool,
            expected_resume_s=parsed.expected_resume_s,
        )
        if answer is None:
            return False, self._answer("kept", "the agentpark daemon did not answer", record)
        if not answer.get("ok"):
            why = str(answer.get("error"))
            self.client.degraded(str(answer.get("cause", "refused")), f"park refused: {why}")
            return False, self._answer("kept", why, record)
        if answer.get("decision") != "parked":
            return False, self._answer("kept", str(answer.get("why")), record)
        self._next.stores.append(
            StoreMeta(
                request.request_id,
                int(answer["store_id"]),
                ids,
                [int(s) for s in answer["slots"]],
                bool(answer.get("checksum")),
                answer.get("pool_id"),
            )
        )
        return True, self._answer("parked", str(answer.get("why")), record)

    @staticmethod
    def _answer(decision: str, why: str, record: _Request | None) -> dict[str, Any]:
        return {
            "agentpark": {
                "decision": decision,
                "why": why,
                "restored_tokens": record.restored_tokens if record else 0,
                "restored_from": record.restored_from if record else None,
            }
        }

    # ==== worker side =========================================================================

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        if self._disabled is not None:
            return
        if not isinstance(kv_caches, dict):  # JAX arrays (TPU): see register_runner
            log.info("agentpark worker: KV caches are not torch tensors; waiting for the runner")
            return
        try:
            self._sources, self._layout = self._read_layout(kv_caches)
        except ValueError as exc:
            self._disabled = f"unsupported KV layout: {exc}"
            log.warning("agentpark connector off: %s", self._disabled)
            return
        self._ensure_pool(None)

    def register_runner(self, runner: RunnerLike) -> None:
        """vLLM on TPU (tpu-inference) calls this instead of register_kv_caches.

        The runner, not its arrays, is kept: ``runner.kv_caches`` is reassigned by every
        forward (donated buffers). Copies then go through TPU Sync
        (agentpark.connectors.tpu), which holds the parked bytes in this process; extra
        config ``tpu_sync_host_bytes`` (default 1 GiB) sizes them and ``tpu_sync_shm_dir``
        keeps them over a vLLM restart (TPU Sync's shm segments).

        UNVERIFIED (no TPU here): the call from tpu-inference and everything on a TPU; the
        worker class itself is tested on CPU against TPU Sync's real wheel.
        """
        if self._disabled is not None:
            return
        try:
            from agentpark.connectors.tpu import TpuWorker, host_config  # JAX: only here

            extra = self._kv_transfer_config.kv_connector_extra_config or {}
            host_bytes, shm_dir = host_config(extra)
            dtype = str(runner.kv_caches[0].dtype) if runner.kv_caches else "none"
            num_blocks = self._kv_cache_config.num_blocks if self._kv_cache_config else None
            self._tpu = TpuWorker(
                self.client,
                runner,
                block_size=self.block_size,
                model_uid=model_uid(self.vllm_config, f"jax.{dtype}"),
                host_bytes=host_bytes,
                shm_dir=shm_dir,
                num_blocks=None if num_blocks is None else int(num_blocks),
            )
        except Exception as exc:  # ImportError, a layout or TPU Sync refusing: stay out
            self._disabled = f"the TPU path cannot start: {exc}"
            log.warning("agentpark connector off: %s", self._disabled)
            return
        self._tpu.register()

    def _read_layout(self, kv_caches: dict[str, torch.Tensor]) -> tuple[list[torch.Tensor], Layout]:
        """One source view per copyable array, block axis first, from the real tensors."""
        if self._kv_cache_config is None:
            raise ValueError("no KV cache config")
        num_blocks = int(self._kv_cache_config.num_blocks)
        sources: list[torch.Tensor] = []
        dtype: torch.dtype | None = None
        for name, tensor in kv_caches.items():
            axes = [d for d, size in enumerate(tensor.shape) if size == num_blocks]
            if not axes:
                raise ValueError(f"{name}: no axis of {num_blocks} blocks in {tuple(tensor.shape)}")
            axis = axes[0]
            if dtype is not None and tensor.dtype != dtype:
                raise ValueError("layers of different dtypes")
            dtype = tensor.dtype
            views = [tensor]
            for _ in range(axis):  # split leading axes (e.g. CUDA's K/V) into arrays
                views = [v[i] for v in views for i in range(v.shape[0])]
            sources.extend(views)
        if dtype is None:
            raise ValueError("no KV tensors")
        itemsize = torch.empty((), dtype=dtype).element_size()
        np_dtype = f"uint{8 * itemsize}"
        np.dtype(np_dtype)
        arrays = tuple((tuple(int(d) for d in v.shape[1:]), np_dtype) for v in sources)
        layout = Layout(
            model_uid(self.vllm_config, str(dtype)),
            self.block_size,
            num_blocks,
            arrays,
            str(dtype),
        )
        return sources, layout

    def _ensure_pool(self, pool_id: str | None) -> MappedPool | None:
        """The mapped pool, registering (again) when there is none or it is not ``pool_id``."""
        pool = self._pool
        if pool is not None and (pool_id is None or pool.pool.pool_id == pool_id):
            return pool
        if self._layout is None or self._disabled is not None:
            return None
        answer = self.client.call("register", wait_s=30.0, layout=self._layout.to_wire())
        if answer is None:
            return None
        if not answer.get("ok"):
            self.client.degraded("layout_refused", str(answer.get("error")))
            return None
        try:
            mapped = MappedPool(
                PoolFile.from_wire(answer["pool"]), self._layout, self._sources[0].dtype
            )
            if self._sources[0].device.type == "cuda":
                mapped.pin_for_cuda()  # UNVERIFIED
        except (ValueError, OSError, RuntimeError) as exc:
            self.client.degraded("pool_unmapped", f"cannot map the host pool: {exc}")
            return None
        if pool is not None:
            pool.close()
        self._pool = mapped
        log.info(
            "agentpark worker: pool %s mapped (%d slots)",
            mapped.pool.path,
            mapped.pool.capacity_blocks,
        )
        return mapped

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        if not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, AgentparkMetadata)
        self._invalid.update(meta.invalid)
        if self._tpu is not None:
            # TPU: wait_for_save runs only when tokens are scheduled; stores run here too.
            self._done_sending |= self._tpu.run_stores(meta.stores)
            self._invalid |= self._tpu.run_loads(meta.loads)
            return
        for load in meta.loads:
            ok, cause = False, "copy_error"
            try:
                pool = self._ensure_pool(load.pool_id)
                if pool is None:
                    cause = "pool_unmapped"
                elif load.checksum is not None and not pool.intact(
                    load.parked_slots, load.checksum
                ):
                    cause = "checksum"
                else:
                    pool.load(self._sources, load.slots, load.block_ids)
                    ok = True
            except Exception as exc:
                log.exception("agentpark worker: load %d failed: %s", load.load_id, exc)
            if not ok:
                self._invalid.update(load.block_ids)
                self.client.degraded(f"load_{cause}", f"a parked copy was not loaded ({cause})")
            self.client.call("load_done", load_id=load.load_id, ok=ok, cause=None if ok else cause)

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
        self._run_stores()

    def _run_stores(self) -> None:
        """Copy this step's parks into the pool; every request is reported done, always."""
        if not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, AgentparkMetadata)
        if self._tpu is not None:
            self._done_sending |= self._tpu.run_stores(meta.stores)
            return
        for store in meta.stores:
            if store.store_id in self._stored:
                continue
            self._stored.add(store.store_id)
            ok, digest, detail = False, None, None
            try:
                pool = self._ensure_pool(store.pool_id)
                if pool is None:
                    detail = "the worker has no host pool mapped"
                else:
                    pool.store(self._sources, store.block_ids, store.slots)
                    digest = pool.checksum(store.slots) if store.checksum else None
                    ok = True
            except Exception as exc:
                detail = f"copy failed: {exc}"
                log.exception("agentpark worker: store %d failed", store.store_id)
            finally:
                self._done_sending.add(store.req_id)
            self.client.call(
                "complete_store", store_id=store.store_id, ok=ok, checksum=digest, detail=detail
            )

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        self._run_stores()  # wait_for_save is not called on every path (deferred finalize)
        if self._tpu is not None:
            self._tpu.maybe_register()
        self._seen_finished.update(finished_req_ids)
        ready = self._done_sending & self._seen_finished
        self._done_sending -= ready
        self._seen_finished -= ready
        if len(self._stored) > 4096:
            self._stored.clear()
        return (ready or None), None

    def get_block_ids_with_load_errors(self) -> set[int]:
        bad, self._invalid = self._invalid, set()
        return bad

    def shutdown(self) -> None:
        self.client.close()
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def take_events(self) -> Iterable[Any]:
        return ()
