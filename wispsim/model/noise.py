"""Mean-one log-normal factors, drawn in blocks (network jitter, batch-latency noise).

A factor is exp(sigma * Z - sigma^2 / 2) with Z standard normal, so its mean is exactly 1 and the
model's expected times are unchanged by adding noise. Factors are drawn 512 at a time from the
owner's generator (the sequence is the same as drawing them one by one) to keep the per-event cost
low.
"""

from __future__ import annotations

import numpy as np


class MeanOneLogNormal:
    __slots__ = ("_i", "_n", "_pool", "rng", "sigma")

    def __init__(self, sigma: float, rng: np.random.Generator) -> None:
        self.sigma = sigma
        self.rng = rng
        self._pool: list[float] = []
        self._i = self._n = 0

    def next(self) -> float:
        i = self._i
        if i < self._n:  # the common case, once per transfer or batch: no call, no len()
            self._i = i + 1
            return self._pool[i]
        return self._refill()

    def _refill(self) -> float:
        if self.sigma == 0:  # no noise: no draws from the generator
            self._pool, self._i, self._n = [1.0] * 512, 1, 512
            return 1.0
        s = self.sigma
        self._pool = np.exp(s * self.rng.standard_normal(512) - s * s / 2).tolist()
        self._i, self._n = 1, len(self._pool)
        return self._pool[0]
