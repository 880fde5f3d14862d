"""Benches are never silent: off a terminal, progress comes as lines."""

from __future__ import annotations

import io

from rich.console import Console

from agentpark.bench.common import LineProgress, progress_bar


def test_off_a_terminal_each_phase_and_every_tenth_is_a_line() -> None:
    out = io.StringIO()
    progress = progress_bar(Console(file=out, force_terminal=False))
    assert isinstance(progress, LineProgress)
    with progress:
        task = progress.add_task("create", total=20)
        for _ in range(20):
            progress.advance(task)
        progress.update(task, description="pause")
    lines = out.getvalue().splitlines()
    assert lines[0].endswith("create: 0/20") and lines[-1].endswith("pause: 20/20")
    assert sum("create:" in line for line in lines) == 11  # the start and each tenth


def test_on_a_terminal_it_is_a_live_bar() -> None:
    progress = progress_bar(Console(file=io.StringIO(), force_terminal=True))
    assert not isinstance(progress, LineProgress)
