"""agentpark serve freezes its start-up heap out of the GC once warm; other apps do not."""

from __future__ import annotations

import pytest
from fastapi import FastAPI

from agentpark import app as app_module


class _Runtime:
    def __init__(self) -> None:
        self.warmed = False

    def warm_up(self) -> None:
        self.warmed = True


@pytest.mark.parametrize("asked", [True, False])
def test_the_heap_is_frozen_after_the_warm_up_only_when_asked(
    monkeypatch: pytest.MonkeyPatch, asked: bool
) -> None:
    calls: list[str] = []
    runtime = _Runtime()

    def freeze() -> None:
        assert runtime.warmed  # after the warm-up, so what it made is frozen too
        calls.append("freeze")

    monkeypatch.setattr(app_module.gc, "freeze", freeze)
    monkeypatch.setattr(app_module.gc, "collect", lambda: calls.append("collect") or 0)
    app = FastAPI()
    if asked:
        app.state.freeze_heap = True
    app_module._warm_up(app, runtime)  # type: ignore[arg-type]
    assert runtime.warmed
    assert calls == (["collect", "freeze"] if asked else [])
