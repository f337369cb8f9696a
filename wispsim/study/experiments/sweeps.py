"""The sweeps a study runs and the cells it reads off them: capacity searches through the study's
runner (several at once, so that each phase fills the cores), written as ``wispsim sweep`` writes
them; a capacity as ``N [low, high]``; the curve at an N the search did not evaluate; what a
committed token costs at capacity.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from wispsim.analysis.tables import is_saturated, saturated_mask
from wispsim.config import Scenario
from wispsim.results import Results
from wispsim.study.capacity import SweepResult, capacity_sweep, groups_for
from wispsim.study.experiments.run import Context
from wispsim.study.experiments.spec import seeds
from wispsim.study.stopping import Stopping


def sweep(
    ctx: Context,
    folder: Path,
    base: dict[str, Scenario],
    classes: list[float],
    mix: str,
    grid: tuple[int, ...] = (),
    also: tuple[int, ...] = (),
) -> SweepResult:
    """A capacity sweep of the policies in ``base`` through the study's runner (stored points),
    written to ``folder`` as ``wispsim sweep`` writes it."""
    return sweeps(ctx, {folder: base}, classes, mix, grid, also)[folder]


SEP = "|"  # joins a sweep's index to a policy name in a combined sweep (no policy name has one)


def sweeps(
    ctx: Context,
    sweeps: dict[Path, dict[str, Scenario]],
    classes: list[float],
    mix: str,
    grid: tuple[int, ...] = (),
    also: tuple[int, ...] = (),
) -> dict[Path, SweepResult]:
    """Several capacity sweeps (a results folder -> its policies' scenarios) searched together,
    so that every phase fills the runner with the points of all of them (sweeps run one after
    the other leave cores idle in their last phases, when few searches are left); each written
    to its folder as ``wispsim sweep`` writes it, its points stored in the study's folder (the
    sweep's own when there is one)."""
    spec = ctx.spec
    folders = list(sweeps)
    for f in folders:
        f.mkdir(parents=True, exist_ok=True)
    joined = {f"{i}{SEP}{pol}": sc for i, f in enumerate(folders) for pol, sc in sweeps[f].items()}
    eps = float(spec.get("epsilon", 0.05))
    where = ctx.rel(folders[0]) if len(folders) == 1 else f"{len(folders)} sweeps"
    with ctx.make_runner(folders[0] if len(folders) == 1 else ctx.out) as runner:
        res = capacity_sweep(
            joined,
            groups_for(classes, mix),
            seeds(spec),
            eps,
            runner,
            grid=grid,
            start=int(spec.get("start", 8)),
            max_devices=int(spec.get("max_devices", 4096)),
            progress=lambda done, planned, phase: ctx.progress(f"{where}: {phase} {done}/{planned} N values"),
            stopping=None if spec.get("stop") == "horizon" else Stopping(eps),
            exact=spec.get("search") == "exact",
            also=also,
        )
    out: dict[Path, SweepResult] = {}
    for i, folder in enumerate(folders):
        part = SweepResult(*(rows_of(df, i) for df in (res.capacity, res.curve, res.pooled)))
        results = Results(folder, f"experiment {ctx.name}")
        with results.writing():
            part.write(results)
            results.text("scenario.yaml", next(iter(sweeps[folder].values())).to_yaml())
            results.finish({"seeds": seeds(spec), "epsilon": eps, "policies": list(sweeps[folder])})
        out[folder] = part
    return out


def rows_of(df: pd.DataFrame, i: int) -> pd.DataFrame:
    """The rows of sweep ``i`` of a combined sweep's table, its policy names as they were."""
    if df.empty:
        return df
    prefix = f"{i}{SEP}"
    mine = df[df.policy.astype(str).str.startswith(prefix)].copy()
    mine["policy"] = mine.policy.str.slice(len(prefix))
    return mine.reset_index(drop=True)


def cap_cell(r: Any) -> str:
    """``capacity [low, high]``, or ``>= capacity`` when the search hit its ceiling (a lower bound)."""
    d = r if isinstance(r, dict) else r._asdict()
    if is_saturated(d):
        return f">= {int(d['capacity'])} (search ceiling)"
    return f"{int(d['capacity'])} [{int(d['ci_low'])}, {int(d['ci_high'])}]"


def measured_only(cap: pd.DataFrame) -> pd.DataFrame:
    """``cap`` with saturated capacities (lower bounds) set to NaN, so ratios leave them out."""
    return cap.assign(capacity=cap["capacity"].astype(float).mask(saturated_mask(cap)))


def rows_at(curve: pd.DataFrame, n: int) -> pd.DataFrame:
    """The curve's rows (one per seed) at N = ``n``; where ``n`` was not evaluated (a search that
    ends at the knee places the capacity between two evaluated N), the seed means at the evaluated
    N on either side, interpolated linearly to ``n`` (one row); none when ``n`` is off the curve."""
    if curve.empty or n in set(curve.devices):
        return curve[curve.devices == n]
    ns = sorted(set(curve.devices))
    below = [x for x in ns if x < n]
    above = [x for x in ns if x > n]
    if not below or not above:
        return curve.iloc[0:0]
    a, b = below[-1], above[0]
    num = curve.select_dtypes("number").columns
    ma = curve[curve.devices == a][num].mean()
    mb = curve[curve.devices == b][num].mean()
    return pd.DataFrame([ma + (mb - ma) * (n - a) / (b - a)])


def group_curve(curve: pd.DataFrame, policy: str, group: str) -> pd.DataFrame:
    """The curve's rows of ``policy``'s capacity question ``group`` for the group as a whole: its
    class's rows (one class alone), else the ``all`` rows of a shared mix (a mix of one class has
    only its class's)."""
    mine = curve[(curve.policy == policy) & (curve.group.astype(str) == group)]
    cls = mine["class"].astype(str)
    for want in (group, "all"):
        if (cls == want).any():
            return mine[cls == want]
    return mine


def capacity_rows(res: SweepResult) -> list[dict[str, Any]]:
    """One row per (policy, group) of a sweep: the capacity, its interval and cell (``N [low,
    high]``), whether it is a search-ceiling lower bound, what binds there and the goodput at it."""
    out = []
    for r in res.capacity.to_dict("records"):
        pol, label = str(r["policy"]), str(r["class"])
        at = rows_at(group_curve(res.curve, pol, label), int(r["capacity"]))
        out.append(
            {
                "policy": pol,
                "class": label,
                "capacity": int(r["capacity"]),
                "ci_low": int(r["ci_low"]),
                "ci_high": int(r["ci_high"]),
                "saturated": bool(r["saturated"]),
                "cell": cap_cell(r),
                "binds": r.get("binds", ""),
                "headroom": r.get("headroom", math.nan),
                "goodput_tps": float(at.goodput_tps.mean()) if len(at) else math.nan,
            }
        )
    return out


def numeric_class(col: pd.Series) -> pd.Series:
    """Sort key: SLO classes by value (2 before 12), other columns as they are."""
    return pd.to_numeric(col, errors="coerce") if col.name == "class" else col


AT_CAPACITY = (
    "goodput_tps",
    "gpu_ms_per_token",
    "mean_batch_size",
    "tokens_per_chunk",
    "kv_tokens",
    "speed_p50",
)


def at_capacity(at: pd.DataFrame, sc: Scenario) -> dict[str, float]:
    """What a committed token costs at capacity (``at``: the curve's rows at N = capacity)."""
    from wispsim.model.memory import kv_capacity
    from wispsim.model.profiles import load_profile

    nan = math.nan
    good = float(at.goodput_tps.mean()) if len(at) else nan
    util = float(at.gpu_utilization.mean()) if len(at) else nan
    return {
        "gpu_ms_per_token": util * sc.server.replicas * 1000 / good if good and good > 0 else nan,
        "mean_batch_size": float(at.mean_batch_size.mean()) if len(at) else nan,
        "tokens_per_chunk": float((at.itl_mean_ms / at.tpot_mean_ms).mean()) if len(at) else nan,
        "kv_tokens": kv_capacity(sc.server, load_profile(sc.server.profile)),
        "speed_p50": float(at.speed_p50.mean()) if len(at) else nan,
    }
