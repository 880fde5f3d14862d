"""A daemon restarted on the same state dir: sessions come back from SQLite, none is lost."""

from __future__ import annotations

from collections.abc import Callable

from agentpark.config import Settings
from tests.harness import Daemon


def test_restart_marks_in_memory_kv_lost_and_recompute_matches_a_fresh_prefill(
    make_settings: Callable[..., Settings], daemon_factory: Callable[[Settings], Daemon]
) -> None:
    # No drain at stop: this is what a crash leaves (tests/test_tiers_e2e.py covers drain).
    settings = make_settings(shutdown={"drain": False})
    first = daemon_factory(settings)
    c = first.client
    history: dict[str, list[int]] = {}
    for sid, prompt in (("was-active", "first agent"), ("was-parked", "second agent, longer")):
        c.post("/v1/sessions", json={"session_id": sid, "metadata": {"team": "x"}})
        out = c.post(f"/v1/sessions/{sid}/generate", json={"prompt": prompt, "max_new_tokens": 20})
        history[sid] = list(prompt.encode()) + out.json()["tokens"]
    c.post("/v1/sessions/was-parked/pause", json={"tool": "approval"})
    c.post("/v1/sessions", json={"session_id": "never-ran"})
    c.post("/v1/sessions", json={"session_id": "gone"})
    c.delete("/v1/sessions/gone")
    before = {s["session_id"]: s for s in c.get("/v1/sessions").json()["sessions"]}
    first.stop()

    second = daemon_factory(settings)
    c = second.client
    after = {s["session_id"]: s for s in c.get("/v1/sessions").json()["sessions"]}
    assert list(after) == list(before) == ["was-active", "was-parked", "never-ran"]
    assert after["was-active"]["state"] == "lost"
    assert after["was-parked"]["state"] == "lost"
    assert "dram tier" in after["was-parked"]["lost_reason"]
    assert "pool" in after["was-active"]["lost_reason"]
    assert after["never-ran"]["state"] == "active"
    for sid in after:
        for field in ("num_tokens", "created_at", "metadata", "pause_count"):
            assert after[sid][field] == before[sid][field]
    assert c.get("/v1/sessions/gone").status_code == 404  # deleted
    host = c.get("/v1/host").json()
    assert host["pool"]["used_blocks"] == 0 and host["sessions"]["lost"] == 2

    resumed = c.post("/v1/sessions/was-active/resume").json()
    assert resumed["restored_from"] == "recompute" and resumed["state"] == "active"
    step = {"max_new_tokens": 12, "return_logits": True}
    continued = {
        "was-active": c.post("/v1/sessions/was-active/generate", json=step).json(),
        # generate on a lost session recomputes it transparently
        "was-parked": c.post("/v1/sessions/was-parked/generate", json=step).json(),
    }
    assert continued["was-parked"]["resumed"] is True
    assert continued["was-parked"]["restored_from"] == "recompute"
    for sid, out in continued.items():
        ref_id = f"ref-{sid}"
        c.post("/v1/sessions", json={"session_id": ref_id})
        ref = c.post(
            f"/v1/sessions/{ref_id}/generate", json={"prompt_tokens": history[sid], **step}
        ).json()
        assert out["tokens"] == ref["tokens"], sid
        assert out["logits"] == ref["logits"], sid
    kinds = [
        e["kind"] for e in c.get("/v1/events", params={"session_id": "was-active"}).json()["events"]
    ]
    assert kinds[:3] == ["generate", "recompute", "lost"]
