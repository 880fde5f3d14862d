"""Storage faults: a full database volume answers 503, changes nothing, and recovers by itself.

Reproducer of issue 10 item 4: with the SQLite volume full, writes answered 500, then GET,
/v1/host and /metrics answered 500 for good even after space was freed; the policy loop
failed every tick; /readyz still said 200.

The full volume is real. As root (CI containers, this machine) the database lives on a
small tmpfs the test mounts, and a filler file takes every byte left: every write
needs the WAL to grow and gets ENOSPC (SQLITE_FULL). Otherwise ``PRAGMA max_page_count``
pinned at the database's size makes SQLite itself refuse any write that needs a page
more (SQLITE_FULL too); the test then makes only writes that need new pages.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import event

from agentpark.config import Settings
from tests.harness import Daemon, start_daemon, wait_until

BIG_METADATA = {"blob": "m" * 60_000}  # needs new pages whatever the volume


class FullVolume:
    """Fills (and frees) the volume a daemon's database is on."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.mounted = os.geteuid() == 0
        self.filler = root / "filler"
        self.daemon: Daemon | None = None
        self._limit: int | None = None
        if self.mounted:
            root.mkdir(parents=True)
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(root)], check=True
            )

    @property
    def every_write_fails(self) -> bool:
        return self.mounted

    def attach(self, daemon: Daemon) -> None:
        self.daemon = daemon
        if not self.mounted:
            engine = daemon.runtime.store._engine

            @event.listens_for(engine, "connect")
            def _pin(dbapi_conn: Any, _record: Any) -> None:
                if self._limit is not None:
                    dbapi_conn.execute(f"PRAGMA max_page_count = {self._limit}")

    def fill(self) -> None:
        assert self.daemon is not None
        engine = self.daemon.runtime.store._engine
        with engine.connect() as conn:  # an empty WAL: the next write must grow it
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            pages = conn.exec_driver_sql("PRAGMA page_count").scalar_one()
        if self.mounted:
            with self.filler.open("wb", buffering=0) as f:  # no residue left to flush
                chunk = b"\0" * 65536
                with contextlib.suppress(OSError):
                    while True:
                        f.write(chunk)
                        f.flush()
                # The last bytes, a page at a time, until the volume is full.
                with contextlib.suppress(OSError):
                    while True:
                        os.write(f.fileno(), b"\0" * 4096)
            probe = self.root / "probe"
            with pytest.raises(OSError) as full:
                probe.write_bytes(b"\0" * 4096)
            assert full.value.errno == errno.ENOSPC
            probe.unlink(missing_ok=True)
        else:
            self._limit = int(pages)
            engine.dispose()  # new connections, each pinned

    def free(self) -> None:
        assert self.daemon is not None
        if self.mounted:
            self.filler.unlink()
        else:
            self._limit = 1 << 30
            self.daemon.runtime.store._engine.dispose()

    def close(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.root)], check=False)


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[FullVolume]:
    vol = FullVolume(tmp_path / "dbvol")
    try:
        yield vol
    finally:
        vol.close()


def _code(answer: httpx.Response) -> str:
    code: str = answer.json()["error"]["code"]
    return code


def test_a_full_volume_answers_503_changes_nothing_and_recovers(
    make_settings: Callable[..., Settings],
    volume: FullVolume,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="agentpark")
    (volume.root).mkdir(exist_ok=True)
    settings = make_settings(
        db_url=f"sqlite:///{volume.root / 'agentpark.db'}",
        reliability={"storage_probe_s": 0.05},
        dashboard={"sample_interval_s": 3600, "downsample": []},
        policy={"idle_pause_after_s": 0},
    )
    daemon = start_daemon(settings)
    try:
        volume.attach(daemon)
        c = daemon.client
        for sid in ("parked", "active"):
            assert c.post("/v1/sessions", json={"session_id": sid}).status_code == 201
            body = {"prompt": "tell me about storage", "max_new_tokens": 8}
            assert c.post(f"/v1/sessions/{sid}/generate", json=body).status_code == 200
        assert c.post("/v1/sessions/parked/pause", json={"force": True}).status_code == 200
        before = {sid: c.get(f"/v1/sessions/{sid}").json() for sid in ("parked", "active")}
        host_before = c.get("/v1/host").json()

        volume.fill()
        refused = c.post("/v1/sessions", json={"session_id": "new", "metadata": BIG_METADATA})
        assert refused.status_code == 503 and _code(refused) == "storage_unavailable"
        assert "Retry-After" in refused.headers
        ready = c.get("/readyz")
        assert ready.status_code == 503 and _code(ready) == "storage_unavailable"
        if volume.every_write_fails:
            calls = [
                ("POST", "/v1/sessions/active/generate", {"max_new_tokens": 4}),
                ("POST", "/v1/sessions/active/pause", {"force": True}),
                ("POST", "/v1/sessions/parked/resume", None),
                ("POST", "/v1/sessions/parked/generate", {"max_new_tokens": 4}),
                ("DELETE", "/v1/sessions/active", None),
                ("DELETE", "/v1/sessions/parked", None),
            ]
            for method, path, body in calls:
                answer = c.request(method, path, json=body)
                assert answer.status_code == 503, (path, answer.text)
                assert _code(answer) == "storage_unavailable"
        # Reads still answer, and what they show is what was there before.
        assert c.get("/v1/sessions/new").status_code == 404
        for sid, row in before.items():
            assert c.get(f"/v1/sessions/{sid}").json() == row
        assert c.get("/v1/sessions").status_code == 200
        host = c.get("/v1/host").json()
        assert host["pool"] == host_before["pool"] and host["tiers"] == host_before["tiers"]
        assert host["sessions"] == host_before["sessions"]
        assert c.get("/metrics").status_code == 200
        daemon.runtime.driver.check_invariants()

        volume.free()
        wait_until(lambda: c.get("/readyz").status_code == 200)  # the probe found it back
        created = c.post("/v1/sessions", json={"session_id": "new", "metadata": BIG_METADATA})
        assert created.status_code == 201
        out = c.post("/v1/sessions/parked/generate", json={"max_new_tokens": 4})
        assert out.status_code == 200 and out.json()["resumed"] is True
        assert c.post("/v1/sessions/active/pause", json={"force": True}).status_code == 200
        daemon.runtime.driver.check_invariants()
        after = {sid: c.get(f"/v1/sessions/{sid}").json() for sid in ("parked", "active", "new")}
    finally:
        daemon.stop()
    # One line for the outage, one for the recovery, however many writes failed.
    messages = [r.getMessage() for r in caplog.records]
    assert sum("storage unavailable (writes fail" in m for m in messages) == 1
    assert sum("storage available again" in m for m in messages) == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR and "policy" in r.name]

    # Nothing lost: a new daemon on the same database sees every session as it was left.
    daemon = start_daemon(settings)
    try:
        for sid, row in after.items():
            again = daemon.client.get(f"/v1/sessions/{sid}").json()
            assert again["num_tokens"] == row["num_tokens"], sid
            assert again["metadata"] == row["metadata"], sid
        assert after["parked"]["num_tokens"] == before["parked"]["num_tokens"] + 4
    finally:
        daemon.stop()


def test_drain_with_a_full_volume_parks_what_it_can_and_stops(
    make_settings: Callable[..., Settings], volume: FullVolume
) -> None:
    volume.root.mkdir(exist_ok=True)
    settings = make_settings(
        db_url=f"sqlite:///{volume.root / 'agentpark.db'}",
        dashboard={"sample_interval_s": 3600, "downsample": []},
    )
    daemon = start_daemon(settings)
    volume.attach(daemon)
    c = daemon.client
    assert c.post("/v1/sessions", json={"session_id": "s"}).status_code == 201
    body = {"prompt": "remember this", "max_new_tokens": 8}
    tokens = c.post("/v1/sessions/s/generate", json=body).json()["num_tokens"]
    volume.fill()
    daemon.stop()  # the drain cannot record anything; the daemon still stops cleanly
    assert daemon.runtime.drained
    volume.free()
    again = start_daemon(settings)
    try:
        row = again.client.get("/v1/sessions/s").json()
        # The database still says what it last recorded; the KV is rebuilt from the tokens.
        assert row["num_tokens"] == tokens and row["state"] in ("lost", "parked")
        out = again.client.post("/v1/sessions/s/generate", json={"max_new_tokens": 2})
        assert out.status_code == 200 and out.json()["num_tokens"] == tokens + 2
    finally:
        again.stop()
