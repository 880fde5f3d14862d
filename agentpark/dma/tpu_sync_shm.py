"""TPU Sync's /dev/shm warm boot: its home is agentpark.connectors.tpu_sync_shm.

The connector's TPU worker (inside vLLM) uses it too and must not load the daemon's dma
package, so it lives on the connector side; the daemon's backend and bench import it here.
"""

from __future__ import annotations

from agentpark.connectors.tpu_sync_shm import (
    SHM_ENV,
    SHM_RECORD,
    SHM_ROOT,
    TpuSyncShm,
    tpu_sync_version,
)

__all__ = ["SHM_ENV", "SHM_RECORD", "SHM_ROOT", "TpuSyncShm", "tpu_sync_version"]
