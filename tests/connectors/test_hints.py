"""A request's session and its agentpark kv_hints actions (agentpark.connectors.hints).

vLLM is not in this venv: its ``Request`` and ``KvHintsEnvelope`` / ``KvHintAction`` are
STAND-INS with the very attributes vLLM 0.32 gives them (the real ones run in
tests/vllm_real/test_session_names.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from agentpark.connectors.hints import MAX_ACTIONS, read_hints, resolve
from agentpark.connectors.protocol import SessionParams


@dataclass(frozen=True)
class KvHintAction:
    """STAND-IN for vllm.v1.kv_hints.KvHintAction (a msgspec Struct of these fields)."""

    action_id: str
    action_type: str
    action_version: str
    payload: dict[str, Any]


@dataclass(frozen=True)
class KvHintsEnvelope:
    """STAND-IN for vllm.v1.kv_hints.KvHintsEnvelope."""

    protocol_version: str
    message_id: str
    actions: list[Any]


@dataclass
class Request:
    """What the connector reads of vLLM's ``Request``."""

    kv_transfer_params: dict[str, Any] | None = None
    session_id: str | None = None
    kv_hints: KvHintsEnvelope | None = None
    request_id: str = "r"
    all_token_ids: list[int] = field(default_factory=list)


def envelope(*actions: KvHintAction) -> KvHintsEnvelope:
    return KvHintsEnvelope("1", "m", list(actions))


def action(kind: str, payload: Any, version: str = "1") -> KvHintAction:
    return KvHintAction("a", kind, version, payload)


def pause(**payload: Any) -> KvHintAction:
    return action("agentpark.pause", payload)


def ours(session_id: str, **more: Any) -> dict[str, Any]:
    return {"agentpark": {"session_id": session_id, **more}}


def test_kv_transfer_params_name_the_session_before_vllms_own() -> None:
    resolved = resolve(Request(ours("mine"), session_id="vllms"), "t")
    assert resolved.params == SessionParams("mine") and resolved.source == "kv_transfer_params"


@pytest.mark.parametrize("named", ["conv-1", "a.b:c_d-9", "x" * 128])
def test_vllms_session_id_names_the_session_when_kv_transfer_params_do_not(named: str) -> None:
    for params in (None, {"other_connector": {"x": 1}}):
        resolved = resolve(Request(params, session_id=named), "t")
        assert resolved.params == SessionParams(named) and resolved.source == "session_id"
        assert resolved.refused is None and resolved.notes == ()


def test_no_session_anywhere_is_none_and_counts_nothing() -> None:
    resolved = resolve(Request(), "t")
    assert resolved.params is None and resolved.refused is None and resolved.notes == ()


@pytest.mark.parametrize("named", ["", "bad id", "x" * 129, "a\n", "ünï", "-lead", 5])
def test_an_invalid_vllm_session_id_is_no_session_and_is_counted(named: Any) -> None:
    resolved = resolve(Request(session_id=named), "t")
    assert resolved.params is None and resolved.refused is None
    assert [cause for cause, _ in resolved.notes] == ["session_id_invalid"]
    assert all(len(why) < 300 for _, why in resolved.notes)


def test_bad_kv_transfer_params_are_refused_even_with_a_good_vllm_session_id() -> None:
    resolved = resolve(Request({"agentpark": {"session_id": 5}}, session_id="ok"), "t")
    assert resolved.params is None and resolved.cause == "bad_params"
    assert resolved.refused is not None and "session_id" in resolved.refused


def test_kv_transfer_params_own_tool_and_resume_come_before_the_pause_hint() -> None:
    hint = envelope(pause(tool="hinted_tool", expected_resume_s=5))
    both = resolve(Request(ours("s", tool="own", expected_resume_s=60), kv_hints=hint), "t")
    assert both.params == SessionParams("s", "own", 60.0)
    only_tool = resolve(Request(ours("s", tool="own"), kv_hints=hint), "t")
    assert only_tool.params == SessionParams("s", "own", 5.0)
    hinted = resolve(Request(session_id="s", kv_hints=hint), "t")
    assert hinted.params == SessionParams("s", "hinted_tool", 5.0)
    assert hinted.hints.taken == ("agentpark.pause/1",)


def test_each_agentpark_action_reads_its_payload() -> None:
    hints = read_hints(
        envelope(
            pause(tool="web_search", expected_resume_s=8),
            action("agentpark.prefetch", {"expected_resume_s": 2.5}),
        )
    )
    assert hints.invalid is None and not hints.release
    assert hints.pause is not None and hints.pause.tool == "web_search"
    assert hints.prefetch is not None and hints.prefetch.expected_resume_s == 2.5
    assert hints.taken == ("agentpark.pause/1", "agentpark.prefetch/1")
    released = read_hints(envelope(action("agentpark.release", {})))
    assert released.release and released.taken == ("agentpark.release/1",)
    assert read_hints(None) == read_hints(envelope())


def test_foreign_actions_are_ignored_and_counted_without_refusing_the_request() -> None:
    hint = envelope(action("vendor.retain", {"anything": [1, 2]}), action("lmcache.pin", {}))
    resolved = resolve(Request(session_id="s", kv_hints=hint), "t")
    assert resolved.params == SessionParams("s") and resolved.refused is None
    assert [cause for cause, _ in resolved.notes] == ["hint_ignored"]
    assert resolved.hints.ignored == ("vendor.retain", "lmcache.pin")


@pytest.mark.parametrize(
    ("actions", "reason"),
    [
        ([pause(expected_resume_s="60")], "expected_resume_s"),
        ([pause(expected_resume_s=True)], "expected_resume_s"),
        ([pause(expected_resume_s=float("nan"))], "expected_resume_s"),
        ([pause(expected_resume_s=float("inf"))], "expected_resume_s"),
        ([pause(expected_resume_s=-1)], "expected_resume_s"),
        ([pause(expected_resume_s=86_401)], "expected_resume_s"),
        ([pause(tool="bad tool!")], "tool"),
        ([pause(tool="x" * 129)], "tool"),
        ([pause(tool="t\ud800")], "tool"),
        ([pause(tool=5)], "tool"),
        ([pause(tol="typo")], "tol"),
        ([action("agentpark.pause", "not an object")], "payload must be an object"),
        ([action("agentpark.pause", {}, version="2")], "version '2'"),
        ([action("agentpark.pause", {}, version=1)], "version int"),  # type: ignore[arg-type]
        ([action("agentpark.retain", {})], "unknown agentpark action type"),
        ([action("agentpark.release", {"why": "done"})], "why"),
        ([pause(), pause()], "given twice"),
        ([pause(), action("agentpark.release", {})], "contradict"),
        ([action("vendor.x", {})] * (MAX_ACTIONS + 1), "at most"),
    ],
)
def test_a_malformed_agentpark_action_refuses_agentpark_for_the_request(
    actions: list[KvHintAction], reason: str
) -> None:
    resolved = resolve(Request(ours("s"), kv_hints=envelope(*actions)), "t")
    assert resolved.params is None and resolved.cause == "hint_invalid"
    assert resolved.refused is not None and reason in resolved.refused
    assert len(resolved.refused) < 400


def test_an_envelope_without_a_list_of_actions_is_malformed() -> None:
    hints = read_hints(KvHintsEnvelope("1", "m", "pause"))  # type: ignore[arg-type]
    assert hints.invalid is not None and "list of actions" in hints.invalid


def test_a_pause_or_release_hint_with_no_session_is_counted_as_ignored() -> None:
    for hint in (pause(tool="x"), action("agentpark.release", {})):
        resolved = resolve(Request(kv_hints=envelope(hint)), "t")
        assert resolved.params is None and resolved.refused is None
        assert [cause for cause, _ in resolved.notes] == ["hint_ignored"]
