"""What the tests share besides fixtures (those are in tests/conftest.py).

- :mod:`tests.harness.settings`: TINY settings, a config file, a session row
- :mod:`tests.harness.run`: the run's /dev/shm folders and JAX cache, the leak check
- :mod:`tests.harness.inprocess`: the app in this process, clients with a tenant's token
- :mod:`tests.harness.daemon`: a real uvicorn daemon in a thread, or a child process
- :mod:`tests.harness.wait`: waiting for a condition without sleeping blind

Tests import these names from ``tests.harness``, never from tests/conftest.py.
"""

from tests.harness.daemon import Daemon, DaemonProcess, free_port, settled, start_daemon
from tests.harness.inprocess import (
    SESSIONS_AND_OPERATOR,
    InProcessApp,
    TenantClient,
    bearer,
    make_token,
    run_in_process,
)
from tests.harness.run import SHM_ROOT, private_shm_dir, shm_test_prefix
from tests.harness.settings import (
    TINY,
    session_row,
    tiny_settings,
    unset_agentpark_env,
    write_config,
)
from tests.harness.wait import wait_until

__all__ = [
    "SESSIONS_AND_OPERATOR",
    "SHM_ROOT",
    "TINY",
    "Daemon",
    "DaemonProcess",
    "InProcessApp",
    "TenantClient",
    "bearer",
    "free_port",
    "make_token",
    "private_shm_dir",
    "run_in_process",
    "session_row",
    "settled",
    "shm_test_prefix",
    "start_daemon",
    "tiny_settings",
    "unset_agentpark_env",
    "wait_until",
    "write_config",
]
