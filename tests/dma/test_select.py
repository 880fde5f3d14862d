"""select_transfer turns dma.backend into a backend, or refuses at start naming key and reason."""

from __future__ import annotations

import importlib.util
import sys
import typing

import jax
import pytest

import agentpark.dma as dma
from agentpark.config import DmaSettings
from agentpark.dma import (
    BACKENDS,
    HostCopyTransfer,
    JaxMemkindTransfer,
    TpuSyncTransfer,
    bytes_in_tier,
    select,
    select_transfer,
)
from agentpark.engine.reference import ModelSpec, PoolSpec, ReferenceEngine
from agentpark.errors import ConfigError

INSTALL_HINT = "install agentpark[tpu] (Python >= 3.12, TPU hosts)"


def test_this_machine_is_the_cpu_platform_without_tpu_sync() -> None:
    """The facts the tests below rely on; if this fails they need a second look."""
    assert jax.default_backend() == "cpu"
    assert importlib.util.find_spec("tpu_sync") is None


def test_the_setting_accepts_exactly_the_backends() -> None:
    annotation = DmaSettings.model_fields["backend"].annotation
    assert typing.get_args(annotation) == BACKENDS
    assert DmaSettings().backend == "auto"


def test_auto_picks_host_copy_on_cpu() -> None:
    transfer = select_transfer("auto")
    assert isinstance(transfer, HostCopyTransfer)
    assert transfer.name == "host_copy"
    assert bytes_in_tier(transfer)


def test_host_copy_and_jax_memkind_are_selectable_on_cpu() -> None:
    assert isinstance(select_transfer("host_copy"), HostCopyTransfer)
    memkind = select_transfer("jax_memkind")
    assert isinstance(memkind, JaxMemkindTransfer)
    assert memkind.name == "jax_memkind"
    assert bytes_in_tier(memkind)


def test_tpu_sync_is_refused_with_the_install_hint() -> None:
    with pytest.raises(ConfigError) as info:
        select_transfer("tpu_sync")
    message = info.value.message
    assert message.startswith("dma.backend = 'tpu_sync' cannot be used here: ")
    assert "the tpu_sync package is not installed" in message
    assert INSTALL_HINT in message
    if sys.version_info < (3, 12):  # the extra cannot even be installed here
        assert f"this is Python {sys.version_info[0]}.{sys.version_info[1]}" in message
    assert "JAX's platform is 'cpu', and TPU Sync needs a TPU" in message
    assert "set dma.tpu_sync_on_cpu = true" in message


def test_an_unknown_backend_names_the_choices() -> None:
    with pytest.raises(ConfigError) as info:
        select_transfer("cuda")
    assert info.value.message == (
        "dma.backend = 'cuda' is not supported (allowed: auto, host_copy, jax_memkind, tpu_sync)"
    )


# --- other platforms, simulated -------------------------------------------------------------


@pytest.fixture
def gpu_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")


@pytest.mark.usefixtures("gpu_platform")
def test_auto_picks_jax_memkind_on_an_accelerator() -> None:
    assert isinstance(select_transfer("auto"), JaxMemkindTransfer)


@pytest.mark.usefixtures("gpu_platform")
def test_host_copy_is_refused_on_an_accelerator() -> None:
    with pytest.raises(ConfigError) as info:
        select_transfer("host_copy")
    message = info.value.message
    assert message.startswith("dma.backend = 'host_copy' cannot be used here: ")
    assert "JAX's platform is 'gpu'" in message
    assert "'jax_memkind'" in message


@pytest.mark.usefixtures("gpu_platform")
def test_jax_memkind_without_pinned_host_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(select, "_memory_kinds", lambda: {"device"})
    with pytest.raises(ConfigError) as info:
        select_transfer("auto")
    message = info.value.message
    assert message.startswith(
        "dma.backend = 'auto' (which picks 'jax_memkind' on JAX platform 'gpu') cannot be used"
    )
    assert "no 'pinned_host' memory kind (it has ['device'])" in message


def test_tpu_sync_with_the_package_still_needs_a_tpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(select, "_tpu_sync_install_problem", lambda: None)
    with pytest.raises(ConfigError) as info:
        select_transfer("tpu_sync")
    message = info.value.message
    assert "not installed" not in message
    assert "JAX's platform is 'cpu', and TPU Sync needs a TPU" in message
    assert "set dma.tpu_sync_on_cpu = true" in message


def test_tpu_sync_on_cpu_is_an_explicit_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(select, "_tpu_sync_install_problem", lambda: None)
    assert select._tpu_sync_problems("cpu", on_cpu=True) == []
    assert select._tpu_sync_problems("tpu") == []
    (gpu,) = select._tpu_sync_problems("gpu", on_cpu=True)  # the opt-in is for the CPU only
    assert gpu == "JAX's platform is 'gpu', and TPU Sync needs a TPU"


def test_tpu_sync_refuses_raiden_shm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAIDEN_SHM_KEY", "raiden_cache")
    with pytest.raises(ConfigError, match=r"RAIDEN_SHM_KEY is set: .*world-readable under 022"):
        select_transfer("tpu_sync")


class _Future:
    def wait(self) -> None:
        pass


class _Manager:
    def d2h(self, src: list[int], dst: list[int], sizes: list[int] | None = None) -> _Future:
        return _Future()

    h2d = d2h


def _pretend_tpu_sync_runs_here(monkeypatch: pytest.MonkeyPatch, factory: object) -> None:
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    monkeypatch.setattr(select, "_tpu_sync_problems", lambda platform, **_: [])
    monkeypatch.setattr(dma.tpu_sync, "default_manager_factory", lambda *a, **k: factory)


def test_tpu_sync_is_built_and_started_at_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[tuple[int, int]] = []

    def factory(kv_caches: list[jax.Array], host_blocks: int) -> _Manager:
        built.append((len(kv_caches), host_blocks))
        return _Manager()

    _pretend_tpu_sync_runs_here(monkeypatch, factory)
    engine = ReferenceEngine(ModelSpec(max_seq_len=64), PoolSpec(block_size=16, num_blocks=8))
    with pytest.raises(ValueError, match="needs engine= and host_blocks="):
        select_transfer("tpu_sync")
    transfer = select_transfer("tpu_sync", engine=engine, host_blocks=12)
    assert isinstance(transfer, TpuSyncTransfer)
    assert transfer.bound
    assert built == [(1, 12)]
    assert not bytes_in_tier(transfer)


def test_tpu_sync_that_cannot_start_stops_the_daemon(monkeypatch: pytest.MonkeyPatch) -> None:
    def factory(kv_caches: list[jax.Array], host_blocks: int) -> _Manager:
        raise RuntimeError("cannot pin 12 host blocks")

    _pretend_tpu_sync_runs_here(monkeypatch, factory)
    engine = ReferenceEngine(ModelSpec(max_seq_len=64), PoolSpec(block_size=16, num_blocks=8))
    with pytest.raises(ConfigError) as info:
        select_transfer("tpu_sync", engine=engine, host_blocks=12)
    assert info.value.message == (
        "dma.backend = 'tpu_sync' cannot be used here: cannot start TPU Sync's "
        "KVCacheManager: cannot pin 12 host blocks"
    )
