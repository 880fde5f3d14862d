"""Deterministic token sampling.

The random stream is keyed by (seed, position), not by a generator carried across calls, so a
session that was paused, resumed or recomputed samples the same token at the same position.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["sample"]


def sample(logits: np.ndarray, temperature: float, seed: int, position: int) -> int:
    """Pick a token from 1-D ``logits``.

    temperature 0 is greedy (the first maximum); > 0 samples softmax(logits / temperature) with
    ``np.random.default_rng([seed, position])``.
    """
    if not temperature >= 0 or math.isinf(temperature):  # also rejects NaN
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
    if seed < 0 or position < 0:
        raise ValueError(f"seed and position must be >= 0, got seed={seed}, position={position}")
    x = np.asarray(logits)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"logits must be a non-empty 1-D array, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("logits contain NaN or infinity")
    if temperature == 0:
        return int(np.argmax(x))
    z = x.astype(np.float64) / temperature
    p = np.exp(z - z.max())
    cdf = np.cumsum(p)
    u = np.random.default_rng([seed, position]).random() * cdf[-1]
    # side="right" never picks a zero-probability token at u == 0.
    idx = int(np.searchsorted(cdf, u, side="right"))
    return min(idx, x.size - 1)
