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

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, Protocol, TypeVar

import numpy as np

from wispsim.config import ServerConfig
from wispsim.errors import ConfigError
from wispsim.model.batch import Shape
from wispsim.model.cost import CostModel
from wispsim.model.noise import MeanOneLogNormal
from wispsim.model.profiles import Profile
from wispsim.registry import Registry

if TYPE_CHECKING:
    from wispsim.model.host_cpu import HostCPU


class LatencyModel(Protocol):
    """How long a priced pass really takes. ``cost`` is the profile's cost model, the estimate
    the server's profile gives (``T_hat``)."""

    cost: CostModel

    def time(self, shape: Shape, t_hat: float) -> float:
        """The simulated true latency of a pass of ``shape``, given ``t_hat = cost.price(shape)``
        (computed once by the caller: the scheduler's estimate, when it plans with this profile)."""
        ...


LATENCY: Registry[type] = Registry("latency model")


@LATENCY.register("linear")
class LinearLatency:
    """The estimate times a mean-one log-normal noise factor (module docstring)."""

    def __init__(self, profile: Profile, cfg: ServerConfig, rng: np.random.Generator) -> None:
        self.cost: CostModel = profile.estimator
        self.noise = MeanOneLogNormal(profile.noise_sigma if cfg.noise else 0.0, rng)

    def time(self, shape: Shape, t_hat: float) -> float:
        return t_hat * self.noise.next()


class _MeasuredBase:
    correct = True

    def __init__(self, profile: Profile, cfg: ServerConfig, rng: np.random.Generator) -> None:
        from wispsim.model.measured import MeasuredCost, load_table

        path = profile.data_path
        if profile.kind != "measured" or path is None:
            raise ConfigError(
                f"profile '{profile.name}' ({profile.source})",
                "provenance.data",
                f"server.latency_model {cfg.latency_model!r} needs a measured profile with its raw data; "
                f"this one is {profile.kind}",
            )
        self.cost: CostModel = profile.estimator
        self.measured = MeasuredCost(profile.estimator, load_table(path), self.correct)  # type: ignore[arg-type]
        self.noise = cfg.noise
        self.rng = rng

    def time(self, shape: Shape, t_hat: float) -> float:
        m = self.measured
        i, factor = m.neighbour(shape.n_linear, shape.n_interactions, shape.n_cached, shape.n_requests, t_hat)
        if self.noise:
            runs = m.table.runs[i]
            base = float(runs[self.rng.integers(len(runs))])
        else:
            base = float(m.table.latency[i])
        return base * factor


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


class StepTime(NamedTuple):
    """What a step (a verification batch, an engine step) took, by its parts: the GPU's pass
    (noise applied), the engine core's CPU, and the step's wall time from the two (their sum, or
    under async scheduling the larger: :meth:`wispsim.model.host_cpu.HostCPU.step_time`)."""

    gpu: float
    cpu: float
    total: float


W = TypeVar("W")


class Pricing:
    """A replica's price of a step, at one point: the latency model's GPU time for the pass
    (:meth:`gpu`), then the engine core's CPU beside it where the host is modelled (:meth:`step`).
    A request's price at the front (the front end's latency, the API server's CPU) is the front's
    (:mod:`wispsim.sim.front`), from the same host."""

    __slots__ = ("cost", "gpu", "host", "latency")

    def __init__(self, latency: LatencyModel, host: HostCPU | None) -> None:
        self.latency = latency
        self.cost: CostModel = latency.cost
        self.host = host
        # the GPU's time for a pass of ``shape`` priced ``t_hat`` by the cost form: the latency
        # model's own (bound here, not wrapped: it is asked once a batch)
        self.gpu: Callable[[Shape, float], float] = latency.time

    def step(self, gpu: float, of: W, work: Callable[[W], tuple[int, int, int, int]]) -> StepTime:
        """The step's time by its parts, the GPU's taking ``gpu`` seconds; ``work(of)`` says what
        the engine core does for it (asked only where the host is modelled)."""
        host = self.host
        if host is None:
            return StepTime(gpu, 0.0, gpu)
        cpu = host.engine(*work(of))
        return StepTime(gpu, cpu, host.step_time(gpu, cpu))
