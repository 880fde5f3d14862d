"""The turn-end rule (agentpark.policy.turn_end), one case per branch: a table of facts."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from agentpark.parking.external.plans import TurnEndFacts, TurnEndRule
from agentpark.policy.turn_end import choose

MIB = 1 << 20
# A session of 1,024 tokens in 64 blocks of 64 KiB (4 MiB) on a 1 GB/s copy: the copy back
# costs 4.2 ms + half the 1 ms overhead; recomputing costs 1,024 x prefill_ms_per_token.
FACTS = TurnEndFacts(
    expected_s=0.5,
    expected_source="given by the caller",
    tokens=1024,
    blocks=64,
    block_bytes=64 * 1024,
    bandwidth_bps=1e9,
    overhead_s=0.001,
    prefill_ms_per_token=0.1,  # 102 ms to recompute
    engine_free_blocks=500,
    engine_total_blocks=1000,
    pinned_blocks=0,
    host_room=True,
)
RULE = TurnEndRule(mode="adaptive", pin_ttl_s=30.0, pin_margin=2.0, pin_share=0.5)


def test_a_short_pause_with_room_is_pinned_for_its_expected_length_times_the_margin() -> None:
    choice = choose(FACTS, RULE)
    assert choice.answer == "pinned" and choice.pin_ttl_s == 1.0
    assert "shorter than pin_ttl_s 30s" in choice.why


def test_the_pin_time_out_is_at_least_a_second_unless_pin_ttl_s_is_shorter() -> None:
    assert choose(replace(FACTS, expected_s=0.01), RULE).pin_ttl_s == 1.0
    short = replace(RULE, pin_ttl_s=0.5)
    assert choose(replace(FACTS, expected_s=0.01), short).pin_ttl_s == 0.5


def test_the_pin_time_out_is_capped_by_pin_ttl_s() -> None:
    choice = choose(replace(FACTS, expected_s=20.0), RULE)
    assert choice.answer == "pinned" and choice.pin_ttl_s == 30.0


def test_a_long_pause_with_host_room_parks_when_the_copy_back_beats_the_recompute() -> None:
    choice = choose(replace(FACTS, expected_s=120.0), RULE)
    assert choice.answer == "parked" and choice.pin_ttl_s is None
    assert "not shorter than pin_ttl_s" in choice.why and "costs less than" in choice.why


def test_a_long_pause_cheaper_to_recompute_is_dropped() -> None:
    choice = choose(replace(FACTS, expected_s=120.0, prefill_ms_per_token=0.001), RULE)
    assert choice.answer == "dropped" and "costs no more than the copy back" in choice.why


def test_a_long_pause_with_no_host_room_is_dropped() -> None:
    choice = choose(replace(FACTS, expected_s=120.0, host_room=False), RULE)
    assert choice.answer == "dropped" and "no room" in choice.why


def test_an_unmeasured_recompute_parks_as_before() -> None:
    choice = choose(replace(FACTS, expected_s=120.0, prefill_ms_per_token=None), RULE)
    assert choice.answer == "parked" and "not measured yet" in choice.why


def test_no_expected_pause_is_never_pinned() -> None:
    choice = choose(replace(FACTS, expected_s=None, expected_source="no pause measured yet"), RULE)
    assert choice.answer == "parked" and "no expected pause" in choice.why


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"pinned_blocks": 450}, "over pin_share 0.5"),
        ({"engine_free_blocks": 63}, "short of blocks"),
        ({"engine_total_blocks": None, "engine_free_blocks": None}, "pool size is unknown"),
    ],
)
def test_a_short_pause_without_room_to_pin_parks_or_drops(
    change: dict[str, Any], said: str
) -> None:
    facts = replace(FACTS, **change)
    choice = choose(facts, RULE)
    assert choice.answer == "parked" and said in choice.why
    dropped = choose(replace(facts, prefill_ms_per_token=0.001), RULE)
    assert dropped.answer == "dropped" and said in dropped.why


def test_pin_share_zero_never_pins() -> None:
    choice = choose(FACTS, replace(RULE, pin_share=0.0))
    assert choice.answer == "parked" and "pin_share is 0" in choice.why


def test_pressure_parks_or_drops_and_never_pins() -> None:
    facts = replace(FACTS, pressure=True)
    assert choose(facts, RULE).answer == "parked"
    assert choose(replace(facts, prefill_ms_per_token=0.001), RULE).answer == "dropped"
    assert choose(replace(facts, host_room=False), RULE).answer == "dropped"


def test_pin_mode_drops_a_pin_let_go_under_pressure_where_a_park_would_pay() -> None:
    facts = replace(FACTS, pressure=True)
    assert choose(facts, RULE).answer == "parked"  # adaptive parks it
    choice = choose(facts, replace(RULE, mode="pin"))
    assert choice.answer == "dropped" and "turn_end=pin parks nothing" in choice.why


def test_pin_mode_pins_any_pause_for_pin_ttl_s_while_there_is_room() -> None:
    rule = replace(RULE, mode="pin", pin_ttl_s=12.0)
    for expected in (0.1, 100.0, None):
        choice = choose(replace(FACTS, expected_s=expected), rule)
        assert choice.answer == "pinned" and choice.pin_ttl_s == 12.0
    full = choose(replace(FACTS, pinned_blocks=480), rule)
    assert full.answer == "dropped" and "no room to pin" in full.why
    assert "parks nothing" in full.why
    assert choose(replace(FACTS, pinned_blocks=480), RULE).answer == "parked"  # adaptive


def test_no_whole_block_is_dropped() -> None:
    assert choose(replace(FACTS, blocks=0), RULE).answer == "dropped"


def test_a_pin_gets_a_parked_copy_behind_it_when_a_park_would_pay_and_the_connector_can() -> None:
    backs = replace(FACTS, backs_pins=True)
    choice = choose(backs, RULE)
    assert choice.answer == "pinned" and choice.backed
    assert "a parked copy behind it (the copy back" in choice.why
    unmeasured = choose(replace(backs, prefill_ms_per_token=None), RULE)
    assert unmeasured.backed and "not measured yet" in unmeasured.why
    cheap = choose(replace(backs, prefill_ms_per_token=0.001), RULE)  # recompute is cheaper
    assert cheap.answer == "pinned" and not cheap.backed and "no copy" in cheap.why
    full = choose(replace(backs, host_room=False), RULE)
    assert full.answer == "pinned" and not full.backed and "no room" in full.why
    assert not choose(FACTS, RULE).backed  # a connector before protocol 5: never a copy


def test_pin_only_mode_never_copies_behind_its_pins() -> None:
    choice = choose(replace(FACTS, backs_pins=True), replace(RULE, mode="pin"))
    assert choice.answer == "pinned" and not choice.backed
