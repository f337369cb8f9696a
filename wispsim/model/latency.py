"""Latency models: how long a batch really takes on the GPU (SPEC 2.3, 4 and 5).

``linear`` is the profile's estimator (any form: the additive one, or the physical
``roofline``) times a mean-one log-normal noise factor whose sigma comes
from the profile's residuals, so the scheduler's estimate and the simulated time differ the way
they do on a real system. With ``server.noise: false`` the batch time equals the estimate.

``measured`` and ``measured-nearest`` replay a measured profile's raw data (the CSV that
``provenance.data`` names) instead of the formula: the batch's nearest measured configuration
in (N_linear, N_interactions, N_cached) space, each as log(1 + x) divided by its range over the
data (:class:`wispsim.model.measured.MeasuredTable`). ``measured-nearest`` answers that
configuration's measured time as is (piecewise constant: exact on the plan, blind between and
beyond its points). ``measured`` (nearest-neighbour with estimator correction) scales it by
T_hat(batch) / T_hat(neighbour), so it is the measured time at a measured configuration and
follows the fitted shape from there: simulated batches are often far outside a plan's range
(a hundred requests of 5 tokens). With noise on, the time is one of the neighbour's recorded
runs, drawn at random, instead of their mean. The scheduler's estimate is always T_hat.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from wispsim.config import ServerConfig
from wispsim.errors import ConfigError
from wispsim.model.noise import MeanOneLogNormal
from wispsim.model.profiles import Profile
from wispsim.registry import Registry


class LatencyModel(Protocol):
    def batch_time(
        self, n_linear: int, n_interactions: int, n_cached: int, n_requests: int = 0, n_arrivals: int = 0
    ) -> tuple[float, float]:
        """(estimate, simulated true latency) in seconds; ``n_arrivals`` of the ``n_requests``
        arrive anew (every verification round; a sequence's first prefill chunk)."""
        ...


LATENCY: Registry[type] = Registry("latency model")


@LATENCY.register("linear")
class LinearLatency:
    def __init__(self, profile: Profile, cfg: ServerConfig, rng: np.random.Generator) -> None:
        self.est = profile.estimator
        self.noise = MeanOneLogNormal(profile.noise_sigma if cfg.noise else 0.0, rng)

    def batch_time(
        self, n_linear: int, n_interactions: int, n_cached: int, n_requests: int = 0, n_arrivals: int = 0
    ) -> tuple[float, float]:
        t_hat = self.est.batch(n_linear, n_interactions, n_cached, n_requests, n_arrivals)
        return t_hat, t_hat * self.noise.next()


class _MeasuredBase:
    correct = True

    def __init__(self, profile: Profile, cfg: ServerConfig, rng: np.random.Generator) -> None:
        from wispsim.model.measured import load_table

        path = profile.data_path
        if profile.kind != "measured" or path is None:
            raise ConfigError(
                f"profile '{profile.name}' ({profile.source})",
                "provenance.data",
                f"server.latency_model {cfg.latency_model!r} needs a measured profile with its raw data; "
                f"this one is {profile.kind}",
            )
        self.est = profile.estimator
        self.table = load_table(path)
        self.noise = cfg.noise
        self.rng = rng
        self._near: dict[tuple[int, int, int, int], tuple[int, float]] = {}

    def batch_time(
        self, n_linear: int, n_interactions: int, n_cached: int, n_requests: int = 0, n_arrivals: int = 0
    ) -> tuple[float, float]:
        t_hat = self.est.batch(n_linear, n_interactions, n_cached, n_requests, n_arrivals)
        key = (n_linear, n_interactions, n_cached, n_requests)
        hit = self._near.get(key)
        if hit is None:
            if len(self._near) > 200_000:  # bound the memo on long runs
                self._near.clear()
            i = self.table.nearest(n_linear, n_interactions, n_cached)
            lin, inter, cac = self.table.points[i]
            there = self.est.batch(lin, inter, cac, self.table.sizes[i])
            factor = t_hat / there if self.correct else 1.0
            hit = self._near[key] = (i, factor)
        i, factor = hit
        if self.noise:
            runs = self.table.runs[i]
            base = float(runs[self.rng.integers(len(runs))])
        else:
            base = float(self.table.latency[i])
        return t_hat, base * factor


@LATENCY.register("measured")
class MeasuredLatency(_MeasuredBase):
    """Nearest measured configuration, scaled by the estimator's ratio (see the module docs)."""

    correct = True


@LATENCY.register("measured-nearest")
class NearestMeasuredLatency(_MeasuredBase):
    """Nearest measured configuration's time as is (piecewise constant)."""

    correct = False


def make_latency(profile: Profile, cfg: ServerConfig, rng: np.random.Generator) -> LatencyModel:
    model: LatencyModel = LATENCY.get(cfg.latency_model, field="server.latency_model")(profile, cfg, rng)
    return model
