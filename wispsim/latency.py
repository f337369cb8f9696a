"""Latency models: how long a batch really takes on the GPU (SPEC 2.3 and 4).

``linear`` is the additive estimator times a mean-one log-normal noise factor whose sigma comes
from the profile's residuals, so the scheduler's estimate and the simulated time differ the way
they do on a real system. With ``server.noise: false`` the batch time equals the estimate.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from wispsim.config import ServerConfig
from wispsim.profiles import Profile
from wispsim.registry import Registry


class LatencyModel(Protocol):
    def batch_time(self, n_linear: int, n_interactions: int, n_cached: int) -> tuple[float, float]:
        """(estimate, simulated true latency) in seconds."""
        ...


LATENCY: Registry[type] = Registry("latency model")


@LATENCY.register("linear")
class LinearLatency:
    def __init__(self, profile: Profile, cfg: ServerConfig, rng: np.random.Generator) -> None:
        self.est = profile.estimator
        self.sigma = profile.noise_sigma if cfg.noise else 0.0
        self.rng = rng
        self._pool: list[float] = []
        self._i = 0

    def _noise(self) -> float:
        if self.sigma == 0:
            return 1.0
        if self._i >= len(self._pool):
            s = self.sigma
            self._pool = np.exp(s * self.rng.standard_normal(512) - s * s / 2).tolist()
            self._i = 0
        x = self._pool[self._i]
        self._i += 1
        return x

    def batch_time(self, n_linear: int, n_interactions: int, n_cached: int) -> tuple[float, float]:
        t_hat = self.est.batch(n_linear, n_interactions, n_cached)
        return t_hat, t_hat * self._noise()


def make_latency(profile: Profile, cfg: ServerConfig, rng: np.random.Generator) -> LatencyModel:
    model: LatencyModel = LATENCY.get(cfg.latency_model, field="server.latency_model")(profile, cfg, rng)
    return model
