"""Capacity with the fitted latency formula vs with the measurements it was fitted to.

``wispsim estimator compare`` sweeps one scenario twice, once with the ``linear`` latency model
(the profile's fitted coefficients) and once replaying the profile's measured table
(``measured`` or ``measured-nearest``), and asks how far apart the capacities are. A ratio far
from 1 says the formula misses something the measurements see. Replay outside the measured range
falls back to the formula, so each class also gets the share of batches that stayed inside it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd

from wispsim.config import Scenario
from wispsim.model.measured import load_table
from wispsim.sim.scenarios import resolve_server
from wispsim.sim.simulation import simulate
from wispsim.study.capacity import SweepResult

MEASURED_MODELS = ("measured", "measured-nearest")


def latency_scenarios(
    sc: Scenario, profile: str, measured: str, classes: tuple[float, ...]
) -> dict[str, Scenario]:
    """``linear`` and ``measured`` -> ``sc`` on ``profile`` with that latency model and ``classes``."""
    return {
        model: sc.replace(
            server=dataclasses.replace(sc.server, profile=profile, latency_model=model)
        ).with_devices(sc.devices.count, classes)
        for model in ("linear", measured)
    }


def compare_capacities(
    result: SweepResult, base: dict[str, Scenario], measured: str, seed: int, data: Path | None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The sweep's capacity per latency model, and per class: both capacities, their ratio
    ``measured/linear`` and ``in_range`` (see :func:`coverage`, at the measured capacity)."""
    cap = result.capacity.rename(columns={"policy": "latency_model"})
    wide = cap.pivot(index="class", columns="latency_model", values="capacity").reset_index()
    wide["measured/linear"] = wide[measured] / wide["linear"].where(wide["linear"] > 0)
    wide["in_range"] = [
        coverage(base[measured], c, int(n), seed, data)
        for c, n in zip(wide["class"], wide[measured], strict=True)
    ]
    return cap, wide


def coverage(sc: Scenario, cls: str | float, n: int, seed: int, data: Path | None) -> float:
    """Share of verify batches inside the measured range, in one run of class ``cls`` (a label
    like ``8`` or a number) at ``n`` devices."""
    if n <= 0 or data is None:
        return float("nan")
    res = simulate(resolve_server(sc.with_devices(n, (float(cls),))), seed=seed)
    b = res.batches
    b = b[b.kind == "verify"] if "kind" in b else b
    if b.empty:
        return float("nan")
    inside = load_table(data).inside(b[["n_linear", "n_interactions", "n_cached"]].to_numpy())
    return float(inside.mean())
