"""sample(): greedy is argmax; seeded sampling depends only on (seed, position)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agentpark.engine.sampling import sample


def _logits() -> np.ndarray:
    return np.random.default_rng(123).normal(size=256).astype(np.float32)


def test_greedy_is_argmax_first_max() -> None:
    logits = _logits()
    assert sample(logits, 0.0, seed=0, position=0) == int(np.argmax(logits))
    tied = np.array([0.0, 2.0, 1.0, 2.0], np.float32)
    assert sample(tied, 0.0, seed=5, position=9) == 1


def test_seeded_sampling_is_deterministic() -> None:
    logits = _logits()
    first = [sample(logits, 1.0, seed=7, position=p) for p in range(50)]
    again = [sample(logits, 1.0, seed=7, position=p) for p in range(50)]
    assert first == again


def test_sampling_depends_on_seed_and_position() -> None:
    logits = _logits()
    by_position = [sample(logits, 1.0, seed=7, position=p) for p in range(50)]
    other_seed = [sample(logits, 1.0, seed=8, position=p) for p in range(50)]
    assert len(set(by_position)) > 10
    assert by_position != other_seed


def test_sampling_follows_the_distribution() -> None:
    logits = np.log(np.array([0.2, 0.8, 0.0 + 1e-300], np.float64))
    draws = [sample(logits, 1.0, seed=1, position=p) for p in range(4000)]
    assert 2 not in draws  # ~zero probability is never drawn
    assert abs(np.mean(np.array(draws) == 1) - 0.8) < 0.03
    # temperature sharpens: a low temperature almost always picks the max
    cold = [sample(logits, 0.05, seed=1, position=p) for p in range(200)]
    assert cold.count(1) == 200


@pytest.mark.parametrize("temperature", [-0.1, math.nan, math.inf])
def test_bad_temperature_rejected(temperature: float) -> None:
    with pytest.raises(ValueError, match="temperature"):
        sample(_logits(), temperature, seed=0, position=0)


def test_bad_inputs_rejected() -> None:
    with pytest.raises(ValueError):
        sample(_logits(), 1.0, seed=-1, position=0)
    with pytest.raises(ValueError):
        sample(np.array([0.0, np.nan]), 0.0, seed=0, position=0)
    with pytest.raises(ValueError):
        sample(np.zeros((2, 2)), 0.0, seed=0, position=0)
