"""The decision study (issue 46): for each GPU and model a planner may buy, how many devices one
replica serves at each SLO class under each policy and verifier build, what binds it, how far the
answer moves with the assumptions it rests on, and what it costs.

``arms`` are (policy, build) pairs, each named in every table (``wisp@wisp-grpc``: WISP on the
paper's verifier); ``targets`` are profiles; ``bands`` are variants of the scenario (host CPU speed,
acceptance, context length) whose capacities bound each arm's answer; ``prices`` (USD per GPU-hour,
by ``wispsim/data/gpus.yaml`` key) replace the shipped public prices (``wispsim/model/prices.py``).
Capacities go through the study's stored points like the capacity study's.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from wispsim.config import Scenario
from wispsim.config.builds import effective_build
from wispsim.errors import ConfigError
from wispsim.model.prices import (
    Price,
    gpu_hours_per_device_hour,
    gpu_hours_per_million_tokens,
    price_for,
)
from wispsim.model.profiles import load_profile
from wispsim.study.experiments.checks import entries, mapping, numbers
from wispsim.study.experiments.run import Context, Section, md_table
from wispsim.study.experiments.spec import STUDIES, seeds
from wispsim.study.experiments.sweeps import capacity_rows, numeric_class, sweeps
from wispsim.study.experiments.targets import with_profile


@dataclass(frozen=True)
class Arm:
    """A policy on a verifier build (``auto``: the policy's own)."""

    name: str
    policy: str
    build: str = "auto"

    def scenario(self, ctx: Context, sets: dict[str, Any], profile: str) -> Scenario:
        extra = {} if self.build == "auto" else {"server.build": self.build}
        if extra and "server.build" in sets:
            raise ConfigError(
                self.source(ctx), "bands.variants.set", f"sets server.build, which arm {self.name!r} names"
            )
        return with_profile(ctx.scenario(**{**sets, **extra}), profile).with_policy(
            self.policy, self.source(ctx)
        )

    def source(self, ctx: Context) -> str:
        return f"experiments/{ctx.name}.yaml"


def arms_of(ctx: Context, entries: list[Any], where: str) -> list[Arm]:
    out = []
    for e in entries:
        if isinstance(e, str):
            e = {"policy": e}
        if not isinstance(e, dict) or "policy" not in e:
            raise ConfigError(
                f"experiments/{ctx.name}.yaml",
                where,
                f"an arm is a policy or {{name, policy, build}}, got {e!r}",
            )
        build = str(e.get("build", "auto"))
        name = str(e.get("name") or (e["policy"] if build == "auto" else f"{e['policy']}@{build}"))
        if name in {a.name for a in out}:
            raise ConfigError(f"experiments/{ctx.name}.yaml", where, f"two arms are named {name!r}")
        out.append(Arm(name, str(e["policy"]), build))
    return out


def arm_build(sc: Scenario) -> str:
    """The build an arm's scenario runs (centralized serving has none of the three)."""
    return effective_build(sc.server, sc.policy) if sc.server.mode == "speculative" else "-"


@STUDIES.register("decision")
def study_decision(ctx: Context) -> Section:
    """Capacity, what binds, sensitivity bands and price per target x class x arm."""
    spec = ctx.spec
    src = f"experiments/{ctx.name}.yaml"
    arms = arms_of(ctx, list(spec.get("arms", ["wisp", "centralized"])), "arms")
    classes = [float(c) for c in spec.get("classes", [2, 4, 6, 8])]  # checked with the spec (spec.py)
    targets = spec.get("targets", ["a100-qwen3-32b"])
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        raise ConfigError(src, "targets", f"must be a list of profile names, got {targets!r}")
    prices = _prices(targets, spec, src)
    sec = Section(spec.get("title", "Decision"))
    plan: dict[Path, dict[str, Scenario]] = {}
    for t in targets:
        plan[ctx.out / t] = {a.name: a.scenario(ctx, {}, t) for a in arms}
    band_plan, band_meta, band_classes = _band_plan(ctx, spec.get("bands") or {}, arms, targets)
    t0 = time.perf_counter()
    main = sweeps(ctx, plan, classes, "separate")
    sec.facts["wall_s_sweeps"] = time.perf_counter() - t0
    rows = []
    for t in targets:
        rows += _rows(t, "default", main[ctx.out / t], plan[ctx.out / t], prices[t])
    table = pd.DataFrame(rows)
    band_rows = []
    if band_plan:
        t0 = time.perf_counter()
        for folder, r in sweeps(ctx, band_plan, band_classes, "separate").items():
            t, name, band = band_meta[folder]
            band_rows += [{**row, "band": band} for row in _rows(t, name, r, band_plan[folder], prices[t])]
        sec.facts["wall_s_bands"] = time.perf_counter() - t0
    bands = pd.DataFrame(band_rows)
    table.to_csv(ctx.out / "decision.csv", index=False)
    if len(bands):
        bands.to_csv(ctx.out / "bands.csv", index=False)
    sec.facts["prices"] = {
        t: {"gpu": p.gpu, "usd_per_gpu_hour": p.usd_per_gpu_hour, "source": p.source}
        for t, (p, _) in prices.items()
    }
    sec.body += _render(table, bands, arms, targets, prices, spec)
    return sec


def _prices(targets: list[str], spec: dict[str, Any], src: str) -> dict[str, tuple[Price, int]]:
    """Each target's GPU price and GPU count (a replica of ``count`` GPUs)."""
    given = spec.get("prices")
    if given is not None and not isinstance(given, dict):
        raise ConfigError(
            src, "prices", f"must map a GPU (wispsim/data/gpus.yaml) to USD per GPU-hour, got {given!r}"
        )
    tier = spec.get("price_tier")
    out = {}
    for t in targets:
        prof = load_profile(t, src, "targets")
        if not prof.gpu_key:
            raise ConfigError(src, "targets", f"{t!r} names no GPU (hardware.gpu_key): it cannot be priced")
        out[t] = (price_for(prof.gpu_key, given, tier, src), int(prof.gpu_count))
    gpus = sorted({p.gpu for p, _ in out.values()})
    for key in given or {}:
        if key not in gpus:  # a misspelt GPU would leave its target on the shipped price
            raise ConfigError(
                src, f"prices.{key}", f"no target runs on it; the targets' GPUs: {', '.join(gpus)}"
            )
    return out


def _rows(
    target: str, variant: str, res: Any, base: dict[str, Scenario], price: tuple[Price, int]
) -> list[dict]:
    """One row per (arm, class): capacity and interval, what binds, goodput and cost at capacity."""
    p, per_replica = price
    out = []
    for r in capacity_rows(res):
        arm = r.pop("policy")
        gpus = per_replica * base[arm].server.replicas
        gh_dev = gpu_hours_per_device_hour(gpus, r["capacity"])
        gh_mtok = gpu_hours_per_million_tokens(gpus, r["goodput_tps"]) if r["capacity"] > 0 else math.nan
        out.append(
            {
                "target": target,
                "variant": variant,
                "arm": arm,
                "policy": base[arm].policy,
                "build": arm_build(base[arm]),
                **r,
                "gpus": gpus,
                "gpu_hours_per_device_hour": gh_dev,
                "gpu_hours_per_mtok": gh_mtok,
                "usd_per_device_hour": gh_dev * p.usd_per_gpu_hour,
                "usd_per_mtok": gh_mtok * p.usd_per_gpu_hour,
            }
        )
    return out


def _band_plan(
    ctx: Context, spec: Any, arms: list[Arm], targets: list[str]
) -> tuple[dict[Path, dict[str, Scenario]], dict[Path, tuple[str, str, str]], list[float]]:
    """The sensitivity variants' sweeps (each variant a scenario ``set`` and the arms it moves),
    checked before anything runs."""
    src = f"experiments/{ctx.name}.yaml"
    if not isinstance(spec, dict):
        raise ConfigError(src, "bands", f"must be a mapping of classes, targets and variants, got {spec!r}")
    by_name = {a.name: a for a in arms}
    if not spec.get("variants"):
        return {}, {}, []
    classes = numbers(src, "bands.classes", spec.get("classes", [4, 8]))
    band_targets = [str(t) for t in spec.get("targets", targets)]
    plan: dict[Path, dict[str, Scenario]] = {}
    meta: dict[Path, tuple[str, str, str]] = {}
    for i, v in enumerate(entries(src, "bands.variants", spec.get("variants"), {"band", "name", "set"})):
        mapping(src, f"bands.variants[{i}].set", v["set"])
        names = list(v.get("arms") or by_name)
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise ConfigError(
                src, f"bands.variants[{i}].arms", f"unknown arm(s) {unknown}; arms: {', '.join(by_name)}"
            )
        for t in band_targets:
            if t not in targets:
                raise ConfigError(src, "bands.targets", f"{t!r} is not among the study's targets")
            folder = ctx.out / "bands" / str(v["name"]) / t
            plan[folder] = {n: by_name[n].scenario(ctx, dict(v["set"]), t) for n in names}
            meta[folder] = (t, str(v["name"]), str(v["band"]))
    return plan, meta, classes


def _fmt(x: float, f: str = "{:.2f}") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f.format(x)


def _render(
    table: pd.DataFrame,
    bands: pd.DataFrame,
    arms: list[Arm],
    targets: list[str],
    prices: dict[str, tuple[Price, int]],
    spec: dict[str, Any],
) -> list[str]:
    body: list[str] = []
    names = [a.name for a in arms]
    n_seeds = len(seeds(spec))
    body += [
        "Each arm is a policy on a verifier build, named `policy@build` (`wisp@wisp-grpc`: the paper's "
        "verifier; `wisp@vllm-sessions`: sessions resident behind vLLM's HTTP server; `wisp@stock-vllm`: "
        "vLLM's OpenAI server as shipped, every round re-submitted; `sled` runs on `stock-vllm`; centralized "
        f"serving has no verifier build). {n_seeds} seed(s) per point; `binds` is what binds the simulated "
        "runs at capacity and its headroom.",
        "",
        "### The answer: edge drafting against the best centralized serving",
        "",
        "Per target and class, the most devices any WISP build serves against the most either centralized "
        "serving (plain or with server-side drafting) serves, and the cost of a device-hour at each "
        "(GPU-hours per 1,000 device-hours, and USD per 1,000 device-hours at the price below).",
        "",
    ]
    body += md_table(_answer(table))
    body += ["", "Prices used (USD per GPU-hour):", ""]
    body += md_table(
        pd.DataFrame(
            [
                {
                    "target": t,
                    "gpus": n,
                    "gpu": p.gpu,
                    "usd_per_gpu_hour": p.usd_per_gpu_hour,
                    "source": p.source,
                }
                for t, (p, n) in prices.items()
            ]
        ),
        "{:.2f}",
    )
    for t in targets:
        mine = table[table.target == t]
        if mine.empty:
            continue
        wide = mine.assign(cell=[f"{c} {b}" if b else c for c, b in zip(mine.cell, mine.binds, strict=True)])
        wide = wide.pivot(index="class", columns="arm", values="cell").reindex(columns=names).reset_index()
        wide = wide.sort_values("class", key=numeric_class, kind="stable")
        cost = mine.assign(
            c=[
                f"{_fmt(a, '{:.1f}')} / {_fmt(b, '{:.2f}')}"
                for a, b in zip(mine.gpu_hours_per_device_hour * 1000, mine.usd_per_mtok, strict=True)
            ]
        )
        cost = cost.pivot(index="class", columns="arm", values="c").reindex(columns=names).reset_index()
        cost = cost.sort_values("class", key=numeric_class, kind="stable")
        body += [
            "",
            f"### {t}",
            "",
            "Capacity in devices [95% interval] and what binds at it:",
            "",
            *md_table(wide),
            "",
            "GPU-hours per 1,000 device-hours / USD per million committed tokens:",
            "",
            *md_table(cost),
        ]
    if len(bands):
        body += ["", "### How far each answer moves: sensitivity bands", ""]
        body += [
            "Capacity at the default scenario and under each variant (one factor changed at a time); "
            "`-` where the variant does not move that arm and was not run.",
            "",
        ]
        body += md_table(_band_table(table, bands))
    return body


def _answer(table: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (t, c), g in table.groupby(["target", "class"], sort=False):
        edge = g[g.policy == "wisp"]
        cen = g[g.policy.isin(["centralized", "centralized-sd"])]
        if edge.empty or cen.empty:
            continue
        e = edge.loc[edge.capacity.idxmax()]
        k = cen.loc[cen.capacity.idxmax()]
        bound = bool(e.saturated or k.saturated)  # a capacity at the search's ceiling is a lower bound
        rows.append(
            {
                "target": t,
                "class": c,
                "best WISP build": f"{e.build} {int(e.capacity)}",
                "binds": e.binds,
                "best centralized": f"{k.arm} {int(k.capacity)}",
                "its binds": k.binds,
                "WISP/centralized": _fmt(e.capacity / k.capacity if k.capacity and not bound else math.nan),
                "GPU-h/1k dev-h": f"{_fmt(e.gpu_hours_per_device_hour * 1000, '{:.1f}')} vs "
                f"{_fmt(k.gpu_hours_per_device_hour * 1000, '{:.1f}')}",
                "USD/1k dev-h": f"{_fmt(e.usd_per_device_hour * 1000, '{:.0f}')} vs "
                f"{_fmt(k.usd_per_device_hour * 1000, '{:.0f}')}",
                "pays": "-"
                if bound
                else ("yes" if e.capacity > k.ci_high else ("no" if e.ci_high < k.capacity else "tie")),
            }
        )
    out = pd.DataFrame(rows)
    return out.sort_values(["target", "class"], key=numeric_class, kind="stable") if len(out) else out


def _band_table(table: pd.DataFrame, bands: pd.DataFrame) -> pd.DataFrame:
    rows = []
    order = list(dict.fromkeys(bands.variant))
    for (t, arm, c), g in bands.groupby(["target", "arm", "class"], sort=False):
        base = table[(table.target == t) & (table.arm == arm) & (table["class"] == c)]
        row: dict[str, Any] = {
            "target": t,
            "arm": arm,
            "class": c,
            "default": int(base.capacity.iloc[0]) if len(base) else "-",
        }
        for v in order:
            hit = g[g.variant == v]
            row[v] = (
                str(int(hit.capacity.iloc[0])) + ("+" if bool(hit.saturated.iloc[0]) else "")
                if len(hit)
                else "-"
            )
        rows.append(row)
    out = pd.DataFrame(rows)
    return out.sort_values(["target", "class", "arm"], key=numeric_class, kind="stable")
