"""Learned tool pauses: a robust quantile of what was observed, priors until then."""

from __future__ import annotations

from agentpark.config import PolicySettings
from agentpark.policy.tools import ToolStats
from agentpark.store.models import EventRow


def test_a_tool_never_seen_uses_its_prior_or_nothing() -> None:
    cfg = PolicySettings(tools={"web_search": {"expected_pause_s": 8}})  # type: ignore[dict-item]
    stats = ToolStats(window=4)
    assert stats.expected("web_search", cfg) == (8.0, "configured prior for web_search")
    value, why = stats.expected("code_run", cfg)
    assert value is None and "never seen" in why
    assert stats.expected(None, cfg)[0] is None


def test_the_median_of_the_window_resists_an_outlier_and_old_values_age_out() -> None:
    cfg = PolicySettings(tool_quantile=0.5)
    stats = ToolStats(window=5)
    for seconds in (1.0, 1.2, 0.8, 1.1, 600.0):  # one call hung for ten minutes
        stats.observe("web_search", seconds)
    value, why = stats.expected("web_search", cfg)
    assert value == 1.1 and "learned" in why and "5" in why
    for seconds in (3.0, 3.0, 3.0):
        stats.observe("web_search", seconds)
    assert stats.expected("web_search", cfg)[0] == 3.0  # window of 5: the old ones left


def test_it_learns_from_tool_return_events_only() -> None:
    stats = ToolStats(window=10)
    stats.on_event(EventRow(kind="tool_return", detail="code_run", duration_ms=2500.0))
    stats.on_event(EventRow(kind="pause", detail="tool=code_run", duration_ms=1.0))
    assert stats.summary() == {"code_run": 1}
    assert stats.expected("code_run", PolicySettings())[0] == 2.5
