"""Mean-one log-normal factors, drawn in blocks (network jitter, batch-latency noise).

A factor is exp(sigma * Z - sigma^2 / 2) with Z standard normal, so its mean is exactly 1 and the
model's expected times are unchanged by adding noise. Factors are drawn 512 at a time from the
owner's generator (the sequence is the same as drawing them one by one) to keep the per-event cost
low.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import chain, repeat

import numpy as np

BLOCK = 512  # factors drawn at a time


class MeanOneLogNormal:
    """A stream of mean-one log-normal factors; ``next()`` returns the next one.

    ``next`` is the ``__next__`` of a chain over blocks of 512 factors, each block drawn from the
    owner's generator when the previous one is used up: a call costs no Python frame (it runs
    once per transfer or batch), and the factors are those of drawing them one by one.
    """

    __slots__ = ("next", "rng", "sigma")

    def __init__(self, sigma: float, rng: np.random.Generator) -> None:
        self.sigma = sigma
        self.rng = rng
        blocks = map(_block, repeat(sigma), repeat(rng))  # (a function, not a method: no cycle)
        self.next: Callable[[], float] = chain.from_iterable(blocks).__next__


def _block(sigma: float, rng: np.random.Generator) -> list[float]:
    """The next BLOCK factors of ``rng``'s stream."""
    if sigma == 0:  # no noise: no draws from the generator
        return [1.0] * BLOCK
    factors: list[float] = np.exp(sigma * rng.standard_normal(BLOCK) - sigma * sigma / 2).tolist()
    return factors
