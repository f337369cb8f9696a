"""Cluster sizing: the fewest verifier replicas that keep every class of a fleet within epsilon.

:func:`plan_cluster` is the entry (``wispsim plan``). It picks the method
(:func:`choose_method`): *decomposed* (:mod:`wispsim.study.decompose`: size the fleet from one
replica carrying its share, then confirm behind the real router) where replicas are separate
queues, else the *full-cluster search* (:mod:`wispsim.study.replicas`: the whole fleet against R
replicas at every R tried); :func:`decomposition_blocker` says why decomposition does not hold.
"""

from __future__ import annotations

from wispsim.config import Scenario
from wispsim.errors import ConfigError
from wispsim.study.decompose import CONFIRM_DEVICES, Progress, plan_decomposed
from wispsim.study.replicas import PlanResult, plan_replicas
from wispsim.study.runners import Runner

METHODS = ("auto", "decomposed", "full")
DECOMPOSABLE_ARRIVALS = ("closed", "poisson")


def decomposition_blocker(scenario: Scenario) -> str | None:
    """Why one replica's share does not stand for the cluster here (None: it does)."""
    srv, arr = scenario.server, scenario.arrivals
    if srv.router != "affinity":
        return (
            f"server.router is {srv.router!r}: it moves a response's rounds between replicas, "
            "so they are not separate queues (decomposition needs affinity)"
        )
    if arr.process not in DECOMPOSABLE_ARRIVALS:
        return (
            f"arrivals.process is {arr.process!r}: its load varies in time and every replica "
            "sees the bursts at once (decomposition needs closed or poisson)"
        )
    if srv.replica_profiles:
        return (
            "server.replica_profiles gives the replicas their own profiles, so no one replica stands for all"
        )
    return None


def choose_method(scenario: Scenario, method: str, option: str = "--method") -> tuple[str, str | None]:
    """(``decomposed`` or ``full``, why it fell back) for ``method`` (one of :data:`METHODS`).

    ``auto`` decomposes where :func:`decomposition_blocker` finds nothing against it. Asking for
    ``decomposed`` where it does not hold is a one-line error.
    """
    if method not in METHODS:
        raise ConfigError(option, "", f"got {method!r}; allowed: {', '.join(METHODS)}")
    if method == "full":
        return "full", None
    why = decomposition_blocker(scenario)
    if why is None:
        return "decomposed", None
    if method == "decomposed":
        raise ConfigError(option, "", f"decomposed does not hold: {why}; use --method full or auto")
    return "full", why


def plan_cluster(
    scenario: Scenario,
    runner: Runner,
    seeds: list[int],
    epsilon: float,
    method: str = "auto",
    start: int | None = None,
    max_replicas: int = 512,
    confirm_devices: int = CONFIRM_DEVICES,
    progress: Progress | None = None,
) -> PlanResult:
    """The fewest replicas for the fleet: decomposed where it holds (``auto``), else (or with
    ``method="full"``) the full-cluster search; the result says which ran and why."""
    used, why = choose_method(scenario, method)
    if used == "full":
        res = plan_replicas(scenario, runner, seeds, epsilon, start, max_replicas, progress)
        res.fallback = why
        return res
    return plan_decomposed(scenario, runner, seeds, epsilon, start, max_replicas, confirm_devices, progress)
