"""``sweep``, ``compare`` and ``ablate predictor``: many runs per answer, one folder each.

``sweep`` finds the capacity per SLO class of one policy (the largest N whose violation rate
stays within epsilon), ``compare`` does so for several policies on common random numbers and
adds the speed-up ratios, and ``ablate predictor`` runs wisp with and without its rejection
predictor at fixed N. Finished points are stored in the folder, so an interrupted sweep resumes
where it stopped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from wispsim.config import Scenario, parse_set
from wispsim.errors import ConfigError
from wispsim.results import Results
from wispsim.runs.resolve import (
    Options,
    applying,
    blaming,
    check,
    check_backend,
    check_seeds,
    check_start,
    check_twice,
    load,
    resolve,
)
from wispsim.sim.scenarios import dotted_fields
from wispsim.study.capacity import SweepResult

# progress of a long command: (done, total or None while unknown[, what it is doing])
Report = Callable[..., None]


def _none(done: int, total: int | None, text: str | None = None) -> None:
    return None


@dataclass(frozen=True)
class SweepRequest:
    """What ``sweep`` and ``compare`` take: the scenario, the policies, the grid and the search."""

    scenario: Path | None
    sets: list[str] | None
    policies: list[str]  # empty: the scenario's own
    classes: tuple[float, ...] | None = None
    grid: tuple[int, ...] = ()
    seeds: int = 3
    seed: int | None = None
    epsilon: float | None = None
    jobs: int = 2
    mix: str = "separate"
    start: int = 8
    max_devices: int = 4096
    records: str = "responses"
    backend: str = "local"
    address: str | None = None
    stop: str = "sequential"  # STOPS: when a point ends (wispsim.study.stopping)
    search: str = "knee"  # SEARCHES: where the capacity search ends (study.capacity_search)


STOPS = ("sequential", "horizon")
SEARCHES = ("knee", "exact")


@dataclass
class SweepOutcome:
    folder: Path
    result: SweepResult
    speedups: pd.DataFrame | None  # compare's ratios
    servers: dict[str, str]  # per policy: what a capacity is per (study.capacity.server_text)
    facts: dict[str, Any]  # what the search ran with (the manifest's)


def sweep(req: SweepRequest, command: str, out: Path | None = None, report: Report = _none) -> SweepOutcome:
    """Run the capacity sweep of ``req.policies`` and write its folder; ``command`` compare also
    writes the speed-up ratios (compare.csv)."""
    from wispsim.study.capacity import groups_for, server_text, speedups
    from wispsim.study.points import RECORD_MODES

    folder = Results.planned(out, command)  # checked before any work
    if req.mix not in ("separate", "shared"):
        raise ConfigError("--mix", "", f"got {req.mix!r}; allowed: separate, shared")
    if req.records not in RECORD_MODES:
        raise ConfigError("--records", "", f"got {req.records!r}; allowed: {', '.join(RECORD_MODES)}")
    check_start(req.start, req.max_devices)
    check_backend(req.backend, req.address)
    check_stop(req.stop, req.search)
    given = Options(policy=",".join(req.policies) or None, seed=req.seed, classes=req.classes)
    named = {"--policy": "--policies"} if command == "compare" else None
    check_twice(given, dotted_fields(parse_set(req.sets or [])), named)
    sc = load(req.scenario, req.sets)
    if sc.devices.groups:  # a point at N devices takes one class (or --mix shared's) on the defaults
        raise ConfigError(
            str(req.scenario) if req.scenario is not None else "--set",
            "devices.groups",
            f"{len(sc.devices.groups)} device groups: {command} sizes each SLO class on the scenario's "
            "default device and link (--classes, --mix), which would drop the groups' own; size a "
            "fleet of groups with `wispsim plan`, or remove devices.groups",
        )
    policies = req.policies or [sc.policy]  # no --policy: the scenario's own
    cls = req.classes or sc.devices.classes
    eps = sc.epsilon if req.epsilon is None else req.epsilon
    seed_list = check_seeds(sc.seed if req.seed is None else req.seed, req.seeds)
    base: dict[str, Scenario] = {}
    for p in policies:
        with blaming({"policy": "--policy", "devices": "--classes"}), applying("--classes"):
            # under another policy, --set is checked against that policy's preset (as run does)
            s = sc if p == sc.policy else load(req.scenario, req.sets, policy=p)
            s = s.with_devices(sc.devices.count, cls)
        base[p] = check(s, Options(policy=p if p != sc.policy else None, classes=req.classes)).scenario
    with folder.writing():  # the folder is incomplete until the manifest
        for p, s in base.items():
            folder.text(f"scenario-{p}.yaml" if len(base) > 1 else "scenario.yaml", s.to_yaml())
    name = f"{command} {','.join(policies)}"
    result = _search(
        req, folder, base, groups_for(cls, req.mix), seed_list, eps, req.records,
        lambda done, total, text: report(done, total, f"{name}, {text}, N values simulated"),
    )  # fmt: skip
    wide = speedups(result.capacity, policies) if command == "compare" else None
    facts = _facts(req, cls, seed_list, eps)
    servers = {p: server_text(s) for p, s in base.items()}
    with folder.writing():
        result.write(folder)
        if wide is not None:
            folder.table("compare.csv", wide)
        # the code that computed each point (a point stored in --out by earlier code is reused)
        facts["point_commits"] = result.commits
        folder.finish({"policies": policies, "mix": req.mix, "servers": servers, **facts})
    return SweepOutcome(folder.path, result, wide, servers, facts)


def _search(
    req: SweepRequest,
    folder: Results,
    base: dict[str, Scenario],
    groups: list,  # study.capacity's Group list
    seeds: list[int],
    epsilon: float,
    records: str,
    report: Report,
) -> SweepResult:
    """The capacity search of ``base`` (policies or latency models) with ``req``'s grid, bracket
    and runner, its points stored in ``folder``."""
    from wispsim.study.capacity import capacity_sweep
    from wispsim.study.runners import make_runner
    from wispsim.study.stopping import Stopping

    with (
        folder.writing(),  # a full disk while storing points: one line; finished points stay
        make_runner(req.backend, req.jobs, folder.path, records, req.address) as runner,
    ):
        result = capacity_sweep(
            base, groups, seeds, epsilon, runner,
            grid=req.grid, start=req.start, max_devices=req.max_devices, progress=report,
            stopping=Stopping(epsilon) if req.stop == "sequential" else None,
            exact=req.search == "exact",
        )  # fmt: skip
    result.commits = dict(runner.commits)
    return result


def _facts(req: SweepRequest, classes: tuple[float, ...], seeds: list[int], epsilon: float) -> dict:
    """What a capacity search ran with, for its manifest."""
    return {
        "classes": list(classes),
        "seeds": seeds,
        "epsilon": epsilon,
        "grid": list(req.grid),
        "start": req.start,
        "max_devices": req.max_devices,
        "jobs": req.jobs,
        "backend": req.backend,
        "address": req.address,
        "stop": req.stop,
        "search": req.search,
    }


def check_stop(stop: str, search: str = "knee") -> None:
    if stop not in STOPS:
        raise ConfigError("--stop", "", f"got {stop!r}; allowed: {', '.join(STOPS)}")
    if search not in SEARCHES:
        raise ConfigError("--search", "", f"got {search!r}; allowed: {', '.join(SEARCHES)}")


@dataclass
class AblationOutcome:
    folder: Path
    scenario: Scenario
    result: pd.DataFrame


def ablate_predictor(
    file: Path | None,
    sets: list[str] | None,
    classes: tuple[float, ...] | None,
    devices: list[int],
    seeds: int,
    seed: int | None,
    jobs: int,
    backend: str,
    address: str | None,
    out: Path | None = None,
    report: Report = _none,
) -> AblationOutcome:
    """Predictor on (wisp) vs off (wisp-fixed) at each N: acceptance ratio, wasted drafting,
    goodput."""
    from wispsim.study.ablation import ablate_predictor as ablate
    from wispsim.study.runners import make_runner

    folder = Results.planned(out, "ablate")  # checked before any work
    check_backend(backend, address)
    sc = resolve(file, sets, Options(classes=classes)).scenario
    first = sc.seed if seed is None else seed
    seed_list = check_seeds(first, seeds)
    with folder.writing():  # the folder is incomplete until the manifest
        folder.text("scenario.yaml", sc.to_yaml())
    with folder.writing(), make_runner(backend, jobs, folder.path, "responses", address) as runner:
        per_seed, result = ablate(sc, devices, seed_list, runner, progress=report)
    with folder.writing():
        folder.table("ablation_per_seed.csv", per_seed)
        folder.table("ablation.csv", result)
        folder.finish(
            {
                "devices": devices,
                "seeds": seeds,
                "first_seed": first,
                "acceptance": sc.acceptance.model,
                "trace": sc.acceptance.trace,
                "predictor": sc.drafting.predictor.name,
            }
        )
    return AblationOutcome(folder.path, sc, result)


@dataclass
class EstimatorOutcome:
    folder: Path
    profile: str
    capacity: pd.DataFrame
    compare: pd.DataFrame


def estimator_compare(
    req: SweepRequest, profile: str | None, measured: str, out: Path | None = None, report: Report = _none
) -> EstimatorOutcome:
    """Capacity per SLO class of ``req.policies[0]`` with the linear estimator fitted to a
    measured profile and with its measurements replayed (``measured``: measured or
    measured-nearest); writes capacity.csv and compare.csv."""
    from wispsim.model.profiles import load_profile
    from wispsim.study.capacity import groups_for
    from wispsim.study.estimator_compare import MEASURED_MODELS, compare_capacities, latency_scenarios

    folder = Results.planned(out, "estimator-compare")  # checked before any work
    if measured not in MEASURED_MODELS:
        raise ConfigError("--measured", "", f"got {measured!r}; allowed: {', '.join(MEASURED_MODELS)}")
    check_start(req.start, req.max_devices)
    check_backend(req.backend, req.address)
    check_stop(req.stop, req.search)
    policy = req.policies[0]
    with blaming({"policy": "--policy"}):
        sc = load(req.scenario, req.sets).with_policy(policy)
    prof_name = profile or sc.server.profile
    prof = load_profile(prof_name)
    if prof.kind != "measured":
        raise ConfigError(
            f"profile '{prof.name}'", "provenance.kind", f"is {prof.kind}; compare needs a measured one"
        )
    cls = req.classes or sc.devices.classes
    eps = sc.epsilon if req.epsilon is None else req.epsilon
    with applying("--classes"):
        base = latency_scenarios(sc, prof_name, measured, cls)
    opts = Options(classes=req.classes, profile=profile)
    base = {model: check(s, opts).scenario for model, s in base.items()}
    first = sc.seed if req.seed is None else req.seed
    seed_list = check_seeds(first, req.seeds)
    with folder.writing():  # the folder is incomplete until the manifest
        for model, s in base.items():
            folder.text(f"scenario-{model}.yaml", s.to_yaml())
    result = _search(req, folder, base, groups_for(cls, "separate"), seed_list, eps, "none", report)
    cap, wide = compare_capacities(result, base, measured, first, prof.data_path)
    with folder.writing():
        folder.table("capacity.csv", cap)
        folder.table("compare.csv", wide)
        facts = _facts(req, cls, seed_list, eps)
        folder.finish({"profile": prof.name, "policy": policy, "measured": measured, **facts})
    return EstimatorOutcome(folder.path, prof.name, cap, wide)
