"""What a vLLM-mode daemon shows (/v1/host, /metrics, ``agentpark status``) and how a
conversation ends, through the real REST API, control socket and shm pool file.

The pool figures are vLLM's KV cache as its connector registered it (num_blocks, block
bytes), its used blocks the blocks ACTIVE sessions hold there; HBM reclaimed is a share of
sessions' KV, never above 100% however many copies are parked.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from agentpark.config import Settings
from agentpark.connectors.client import ControlClient
from agentpark.connectors.protocol import Layout
from agentpark.status import print_status
from tests.api.test_dashboard import (  # the reference engine's browser test's tools
    Chromium,
    chromium,  # noqa: F401  (the session fixture)
    lookup,
    parse_html,
    same_number,
)
from tests.connectors.conftest import TENANT, ControlDaemon
from tests.control.test_control import BLOCK, _park, _register
from tests.harness import Daemon

ENGINE_BLOCKS = 4  # vLLM's KV cache, as its connector registers it: smaller than what parks
SMALL = Layout(
    model_uid="vllm:tiny:torch.bfloat16:small",
    block_size=BLOCK,
    num_blocks=ENGINE_BLOCKS,
    arrays=(((2, BLOCK, 8), "uint16"), ((2, BLOCK, 8), "uint16")),
    kv_dtype="torch.bfloat16",
)
BLOCK_BYTES = 2 * (2 * BLOCK * 8 * 2)


def _vllm_daemon(
    make_settings: Callable[..., Settings],
    daemon_factory: Callable[[Settings], Daemon],
    shm_dir: Path,
) -> tuple[Daemon, ControlDaemon]:
    settings = make_settings(
        vllm={"enabled": True, "pool_capacity": 1 << 20, "pool_path": shm_dir / "pool"}
    )
    daemon = daemon_factory(settings)
    service = daemon.runtime.vllm
    assert service is not None
    client = ControlClient(None, socket_path=str(service.socket_path), timeout_s=10)
    return daemon, ControlDaemon(settings, daemon.runtime.store, service, client)


def _kept_turn(control: ControlDaemon, session_id: str, blocks: list[int]) -> None:
    """A turn that ends in a short pause: kept, its blocks stay in vLLM (ACTIVE)."""
    answer = control.call(
        "prepare_store",
        list(range(len(blocks) * BLOCK)),
        tenant=TENANT,
        session_id=session_id,
        block_ids=blocks,
        expected_resume_s=0.1,
    )
    assert answer["ok"] and answer["decision"] == "kept", answer


def _pinned_turn(control: ControlDaemon, session_id: str, start: int) -> None:
    """A turn that ends in a short tool pause, pinned in vLLM (one block)."""
    answer = control.call(
        "prepare_store",
        list(range(start, start + BLOCK)),
        session_id=session_id,
        block_ids=[start % ENGINE_BLOCKS],
        tool="grep",
        expected_resume_s=0.5,
        engine_total_blocks=ENGINE_BLOCKS,
        engine_free_blocks=2,
    )
    assert answer["ok"] and answer["decision"] == "pinned", answer


def test_the_views_show_vllms_pool_the_parked_share_and_the_avoided_prefill(
    make_settings: Callable[..., Settings],
    daemon_factory: Callable[[Settings], Daemon],
    shm_dir: Path,
) -> None:
    daemon, control = _vllm_daemon(make_settings, daemon_factory, shm_dir)
    try:
        _, worker = _register(control, SMALL)
        parked_tokens = [list(range(s, s + 3 * BLOCK)) for s in (1, 1000)]
        for n, tokens in enumerate(parked_tokens):  # 6 blocks parked: more than vLLM's 4
            _park(control, worker, f"p{n}", tokens, seed=n)
        _kept_turn(control, "live", [0])
        control.service.degraded.count("slow", 2)
        control.service.degraded.count("daemon_unreachable")

        host = daemon.client.get("/v1/host").json()
        pool = host["pool"]
        assert (pool["total_blocks"], pool["block_bytes"]) == (ENGINE_BLOCKS, BLOCK_BYTES)
        assert pool["used_blocks"] == 1  # the kept session's block, held in vLLM
        assert host["sessions"]["active"] == 1 and host["sessions"]["parked"] == 2
        assert host["reclaimed_bytes"] == 6 * BLOCK_BYTES
        assert host["oldest_parked_s"] is not None and host["oldest_parked_s"] >= 0
        assert host["degraded"] == {"daemon_unreachable": 1, "slow": 2}

        console = Console(record=True, width=160, force_terminal=False, color_system=None)
        assert print_status(daemon.url, console) == 0
        out = console.export_text()
        assert "(85.7% of sessions' KV)" in out  # 6 parked of 7 blocks: never 150% of 4
        assert "of the pool" not in out
        assert "2 sessions, oldest untouched" in out
        assert "2 slow, 1 other" in out
        assert "1 sessions, 16 tokens in the engine" in out and host["active_tokens"] == BLOCK
        assert "tokens generated" not in out  # vLLM's output: this daemon does not count it
        assert "0 sessions, 0 vLLM blocks" in out and "0 pinned, 2 parked, 0 dropped, 1 kept" in out

        turn2 = [*parked_tokens[0], 5]
        assert control.call("match", turn2, tenant=TENANT, session_id="p0", num_computed=0)[
            "tokens"
        ] == (3 * BLOCK)
        load = control.call(
            "begin_load", turn2, tenant=TENANT, session_id="p0", start_block=0, block_ids=[1, 2, 3]
        )
        assert load["ok"], load
        assert control.call("load_done", load_id=load["load_id"], ok=True)["restored_tokens"]
        metrics = daemon.client.get("/metrics").text
        avoided = [
            line
            for line in metrics.splitlines()
            if line.startswith("agentpark_prefill_tokens_avoided_total{")
        ]
        assert len(avoided) == 2  # by park and by pin
        (by_park,) = [line for line in avoided if 'by="park"' in line]
        assert by_park.endswith(f" {float(3 * BLOCK)}")
        host = daemon.client.get("/v1/host").json()
        assert host["counters"]["prefill_tokens_avoided"] == 3 * BLOCK
    finally:
        control.client.close()


def test_delete_ends_a_vllm_conversation_and_frees_its_parked_copy(
    make_settings: Callable[..., Settings],
    daemon_factory: Callable[[Settings], Daemon],
    shm_dir: Path,
) -> None:
    daemon, control = _vllm_daemon(make_settings, daemon_factory, shm_dir)
    try:
        _, worker = _register(control, SMALL)
        tokens = list(range(1, 1 + 3 * BLOCK))
        _park(control, worker, "done", tokens)
        _kept_turn(control, "live", [0, 1])
        tier = control.service.tier
        assert tier is not None and tier.used_blocks == 3

        for session_id in ("done", "live"):
            answer = daemon.client.delete(f"/v1/sessions/{session_id}")
            assert answer.status_code == 204, answer.text
            assert daemon.client.get(f"/v1/sessions/{session_id}").status_code == 404
        assert tier.used_blocks == 0  # no session holds the parked blocks any more
        host = daemon.client.get("/v1/host").json()
        assert host["pool"]["used_blocks"] == 0 and host["oldest_parked_s"] is None
        assert host["sessions"]["parked"] == 0 and host["sessions"]["active"] == 0
        # Nothing of the conversation is offered to a request under its name any more.
        turn2 = [*tokens, 5]
        assert (
            control.call("match", turn2, tenant=TENANT, session_id="done", num_computed=0)["tokens"]
            == 0
        )
        assert control.service.driver.core.registry.find((TENANT, "done")) is None
        # The deleted row stays as history and keeps its name: a turn under it is not parked
        # (as docs/vllm.md says), and nothing fails.
        again = control.call(
            "prepare_store",
            [*tokens, *range(7, 7 + BLOCK)],
            tenant=TENANT,
            session_id="done",
            block_ids=[0, 1, 2, 3],
            expected_resume_s=60.0,
        )
        assert not again["ok"] and again["cause"] == "session_exists", again
        assert tier.used_blocks == 0
        control.service.driver.core.check_invariants()
    finally:
        control.client.close()


@pytest.mark.timeout(1200)  # a fresh machine installs chromium first
def test_the_dashboard_in_chromium_shows_vllms_figures(
    chromium: Chromium,  # noqa: F811
    make_settings: Callable[..., Settings],
    daemon_factory: Callable[[Settings], Daemon],
    shm_dir: Path,
    tmp_path: Path,
) -> None:
    daemon, control = _vllm_daemon(make_settings, daemon_factory, shm_dir)
    try:
        _, worker = _register(control, SMALL)
        tokens = [list(range(s, s + 3 * BLOCK)) for s in (1, 1000)]
        for n, prompt in enumerate(tokens):
            _park(control, worker, f"p{n}", prompt, seed=n)
        _kept_turn(control, "live", [0])
        control.service.degraded.count("slow", 2)
        control.service.degraded.count("pool_full")
        turn2 = [*tokens[0], 5]
        control.call("match", turn2, tenant=TENANT, session_id="p0", num_computed=0)
        load = control.call(
            "begin_load", turn2, tenant=TENANT, session_id="p0", start_block=0, block_ids=[1, 2, 3]
        )
        assert load["ok"] and control.call("load_done", load_id=load["load_id"], ok=True)["ok"]
        _pinned_turn(control, "pin0", 2000)
        _pinned_turn(control, "pin1", 3000)  # back: vLLM served its block from the pin
        unpin = {"cause": "return", "blocks": 1, "reused_tokens": BLOCK}
        assert control.call("unpin", session_id="pin1", **unpin)["pinned"] is True
    finally:
        control.client.close()
    host = daemon.client.get("/v1/host").json()
    page = f"{daemon.url}/dashboard#range=900"
    nodes = list(parse_html(chromium.dump_dom(page)).walk())

    (body,) = [n for n in nodes if n.tag == "body"]
    assert body.attrs["data-state"] == "ready", "the page's script did not finish a refresh"
    shown = {
        n.attrs["data-figure"]: n.attrs["data-value"]
        for n in nodes
        if n.attrs.get("data-source") == "host" and "data-value" in n.attrs
    }
    for path in ("pool.total_blocks", "pool.used_blocks", "sessions.active", "active_tokens"):
        assert same_number(shown[path], lookup(host, path)), path
    assert shown["pool.total_blocks"] == str(ENGINE_BLOCKS) and shown["pool.used_blocks"] == "4"
    assert shown["counters.prefill_tokens_avoided"] == str(3 * BLOCK + BLOCK)  # parks + pins

    def text(node_id: str) -> str:
        return next(n for n in nodes if n.attrs.get("id") == node_id).all_text().strip()

    held = host["reclaimed_bytes"] + host["pool"]["used_bytes"]
    assert text("reclaimed-share") == f"{100 * host['reclaimed_bytes'] / held:.1f}%" == "42.9%"
    assert text("degraded-slow") == "2" and text("degraded-other") == "1"
    assert text("oldest-parked").endswith(" s")
    # The pins card: one pinned now, one ended by its session's return, and what each saved.
    (card,) = [n for n in nodes if n.attrs.get("id") == "pins-card"]
    assert "hidden" not in card.attrs
    assert (shown["pins.sessions"], shown["pins.blocks"]) == ("1", "1")
    assert shown["pins.tokens_saved"] == str(BLOCK)
    assert same_number(shown["pins.bytes_saved"], BLOCK_BYTES)
    assert text("pins-released") == "1 return"
    assert text("pins-parks") == f"{3 * BLOCK} tokens"
    assert text("pins-turn-ends") == "2 pinned, 2 parked, 0 dropped, 1 kept"
    chromium.screenshot(page, tmp_path / "dashboard-vllm.png", 1400, 1000)
    assert (tmp_path / "dashboard-vllm.png").stat().st_size > 10_000


def test_the_metrics_show_pins_by_cause_and_what_pins_and_parks_saved(
    make_settings: Callable[..., Settings],
    daemon_factory: Callable[[Settings], Daemon],
    shm_dir: Path,
) -> None:
    daemon, control = _vllm_daemon(make_settings, daemon_factory, shm_dir)
    try:
        _register(control, SMALL)
        _pinned_turn(control, "a", 2000)
        _pinned_turn(control, "b", 3000)
        unpin = {"cause": "return", "blocks": 1, "reused_tokens": BLOCK}
        assert control.call("unpin", session_id="b", **unpin)["pinned"] is True
        metrics = daemon.client.get("/metrics").text
    finally:
        control.client.close()
    samples = {
        (sample.name, tuple(sorted((k, v) for k, v in sample.labels.items() if k != "host"))): (
            sample.value
        )
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
    }

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    assert value("agentpark_pinned_sessions") == 1 and value("agentpark_pinned_blocks") == 1
    assert value("agentpark_pins_released_total", cause="return") == 1
    assert value("agentpark_pins_released_total", cause="pressure") == 0
    assert value("agentpark_prefill_tokens_avoided_total", by="pin") == BLOCK
    assert value("agentpark_prefill_tokens_avoided_total", by="park") == 0
    assert value("agentpark_kv_bytes_kept_total", by="pin") == BLOCK_BYTES
    host = daemon.client.get("/v1/host").json()
    assert host["pins"]["released"] == {"return": 1} and host["pins"]["tokens_saved"] == BLOCK
