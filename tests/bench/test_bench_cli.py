"""The ``agentpark bench`` subcommands parse their flags and print tables on stdout."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentpark.bench import resume
from agentpark.cli import main
from agentpark.engine.reference import ModelSpec


def test_bench_transfer_shm_from_the_command_line(
    shm_parent: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", "transfer", "--tier", "shm", "--sizes", "1MiB", "--repeats", "1"]
    assert main([*argv, "--dir", str(shm_parent)]) == 0
    captured = capsys.readouterr()
    assert "--tier shm" in captured.out and "what the checksum costs" in captured.out
    assert "restore ratio" not in captured.err
    assert list(shm_parent.iterdir()) == []


def test_bench_transfer_rejects_an_unknown_tier(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "transfer", "--tier", "nvme"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_bench_transfer_tpu_sync_refuses_another_tier_than_dram(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Refused before anything is built: runs without TPU Sync's wheel too.
    argv = ["bench", "transfer", "--backend", "tpu_sync", "--tier", "shm", "--sizes", "1MiB"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "--backend tpu_sync" in captured.err and "--tier dram only" in captured.err
    assert captured.out == ""


def test_bench_transfer_tpu_sync_refuses_copy_threads(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "transfer", "--backend", "tpu_sync", "--copy-threads", "2", "--sizes", "1MiB"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "--copy-threads" in captured.err and "--backend tpu_sync" in captured.err
    assert "got 2" in captured.err
    assert captured.out == ""


def test_bench_transfer_rejects_an_unknown_backend(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "transfer", "--backend", "cuda_memcpy"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_bench_transfer_jax_memkind_from_the_command_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["bench", "transfer", "--backend", "jax_memkind", "--sizes", "1MiB", "--repeats", "1"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "--backend jax_memkind" in captured.out and "put d2h GB/s" in captured.out
    assert "restore ratio" not in captured.err


def test_bench_transfer_jax_memkind_refuses_another_tier_than_dram(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["bench", "transfer", "--backend", "jax_memkind", "--tier", "disk", "--sizes", "1MiB"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "--backend jax_memkind" in captured.err and "--tier dram only" in captured.err
    assert captured.out == ""


def test_bench_resume_from_the_command_line(
    shm_parent: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(resume, "RESUME_MODEL", ModelSpec())
    monkeypatch.setattr(resume, "SHM_ROOT", shm_parent)
    assert main(["bench", "resume", "--contexts", "64", "--repeats", "1"]) == 0
    captured = capsys.readouterr()
    assert "re-prefill s" in captured.out and "speed-up dram" in captured.out
    assert "d_model 64" in captured.out
    assert list(shm_parent.iterdir()) == []


def test_bench_resume_rejects_unreadable_contexts() -> None:
    with pytest.raises(SystemExit, match="cannot read --contexts"):
        main(["bench", "resume", "--contexts", "4k"])


def test_bench_control_times_every_operation_against_a_real_daemon(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench", "control", "--sessions", "40", "--samples", "8"]) == 0
    out = capsys.readouterr().out
    for row in ("create", "get", "list", "host", "pause", "resume"):
        (line,) = [line for line in out.splitlines() if line.startswith(f"│ {row} ")]
        cells = [cell.strip() for cell in line.strip("│").split("│")]
        wire_p50, wire_p99 = float(cells[2]), float(cells[3])
        client_p50, daemon_p50, daemon_p99 = (float(cells[i]) for i in (5, 7, 8))
        # The daemon's own share (its Server-Timing) of each timed request is part of what
        # the client waited for it, so each quantile is too (agentpark.client's own
        # requests are other samples: only timed).
        assert 0 < daemon_p50 < wire_p50 and daemon_p99 <= wire_p99, line
        assert daemon_p99 >= daemon_p50 and client_p50 > 0, line
    assert "client p50" in out and "daemon p50" in out and "daemon p99" in out
    assert "40 sessions" in out and "daemon RSS after creating the sessions" in out
    assert "p99 < 5 ms" in out and "p50 < 2 ms" in out
    assert "http.client" in out and "(create: 8 more sessions)" in out
