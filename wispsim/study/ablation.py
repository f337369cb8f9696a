"""Predictor ablation: the same scenario, trace and seeds with the rejection predictor on and off.

"On" is the ``wisp`` preset (predictor drafting up to K_max, SLO-aware scheduling); "off" is
``wisp-fixed`` (fixed K drafting, same scheduler), so the difference is the predictor alone
(SPEC 7: acceptance ratio, wasted drafting and goodput at N = 2, 4, 8, 16).
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from wispsim.config import Scenario
from wispsim.study.points import Point
from wispsim.study.runners import Runner

ARMS = {"on": "wisp", "off": "wisp-fixed"}
COLUMNS = [
    "acceptance_ratio",
    "mean_k",
    "wasted_tokens",
    "wdt_ms",
    "goodput_tps",
    "violation_rate",
    "speed_p50",
    "verify_p95_ms",
]


def ablate_predictor(
    base: Scenario,
    devices: list[int],
    seeds: list[int],
    runner: Runner,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per seed rows, table averaged over seeds with on/off side by side)."""
    specs = [(arm, n, seed) for arm in ARMS for n in devices for seed in seeds]
    points = [Point(base.with_policy(ARMS[arm]).with_devices(n), n, seed) for arm, n, seed in specs]
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        if progress:
            progress(done, len(points))

    results = runner.map(points, tick)
    rows = []
    for (arm, n, seed), res in zip(specs, results, strict=True):
        s = res.summary
        row = s[s["class"] == "all"] if (s["class"] == "all").any() else s
        rows.append(
            {"predictor": arm, "devices": n, "seed": seed, **row[COLUMNS].iloc[0].to_dict(), "point": res.key}
        )
    per_seed = pd.DataFrame(rows)
    mean = pd.DataFrame(
        per_seed.groupby(["devices", "predictor"], sort=True)[COLUMNS].mean().unstack("predictor")
    )
    mean.columns = [f"{col[0]}_{col[1]}" for col in mean.columns.to_flat_index()]
    table = mean.reset_index()
    table["devices"] = table["devices"].astype(int)
    table["goodput_gain"] = table.goodput_tps_on / table.goodput_tps_off
    return per_seed, table
