"""The ``requests`` study: production request traces on each policy, per replica count.

Each request trace (``time_s, prompt_tokens, output_tokens``; the shipped ones are Azure's LLM
inference traces of 2023) runs request by request (``arrivals.process: requests``) against R
replicas behind the scenario's router, for every policy and every R of the spec's grid. Requests
take their SLO class cyclically from the fleet (request i is device i). The section tabulates,
per trace, policy and class, the violation rate at each R and the fewest replicas of the grid
that keep the class within epsilon (or none), because on a real trace some classes cannot be
met at any R: a class whose violations do not fall with R is bound by the requests themselves.
Every simulation is a stored point, so a rerun costs nothing.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pandas as pd

from wispsim.config import Scenario
from wispsim.sim.arrivals import driven_by_trace, load_request_trace
from wispsim.study.capacity_search import pooled_stats
from wispsim.study.experiments.run import Context, Section, md_table
from wispsim.study.experiments.spec import STUDIES, seeds
from wispsim.study.points import Point
from wispsim.study.replicas import with_replicas


def trace_scenario(base: Scenario, trace: str, window_s: float | None) -> Scenario:
    """``base`` driven by the request trace ``trace`` (as ``--arrivals requests:TRACE``),
    measured over ``window_s`` seconds from its start (None: the whole trace)."""
    sc = driven_by_trace(base, "requests", trace, "concurrency", 0.0, "requests")
    if window_s is None or window_s >= sc.workload.duration_s:
        return sc
    return sc.replace(workload=dataclasses.replace(sc.workload, duration_s=float(window_s)))


@STUDIES.register("requests")
def study_requests(ctx: Context) -> Section:
    spec = ctx.spec
    traces = [str(t) for t in spec.get("traces", ["azure-llm-2023-code"])]
    policies = list(spec.get("policies", ["wisp", "centralized"]))
    grid = sorted({int(r) for r in spec.get("replicas", [1, 2, 4, 8, 16])})
    window = spec.get("window_s")
    eps = float(spec.get("epsilon", 0.05))
    # the GPUs (server profiles) to compare; none: the scenario's own
    profiles = [str(p) for p in spec.get("profiles", [])] or [None]
    rows: list[dict[str, Any]] = []
    facts: list[dict[str, Any]] = []
    for trace in traces:
        req = load_request_trace(trace)
        facts.append(
            {
                "trace": trace,
                "requests": len(req.times),
                "span s": req.end,
                "requests/s": len(req.times) / max(req.end, 1e-9),
                "prompt mean": float(req.prompts.mean()),
                "prompt p50": float(pd.Series(req.prompts).median()),
                "output mean": float(req.outputs.mean()),
                "output p50": float(pd.Series(req.outputs).median()),
            }
        )
        for profile, policy in ((pr, po) for pr in profiles for po in policies):
            folder = ctx.out / trace / profile if profile else ctx.out / trace
            folder.mkdir(parents=True, exist_ok=True)
            ctx.progress(f"{trace}: {policy}" + (f" on {profile}" if profile else ""))
            sc = ctx.scenario(**({"server.profile": profile} if profile else {}))
            base = trace_scenario(sc.with_policy(policy), trace, window)
            n = len(req.times)
            points = [Point(with_replicas(base, r), n, s) for r in grid for s in seeds(spec)]
            with ctx.make_runner(folder) as runner:
                results = runner.map(points)
            per = len(seeds(spec))
            for i, r in enumerate(grid):
                mine = results[i * per : (i + 1) * per]
                counts = pd.concat(
                    [res.counts.assign(seed=s) for res, s in zip(mine, seeds(spec), strict=True)],
                    ignore_index=True,
                )
                st = pooled_stats(n, counts)
                summ = pd.concat([res.summary for res in mine], ignore_index=True)
                alls = summ[summ["class"].astype(str) == "all"]
                for cls, v in st.per_class.items():
                    rows.append(
                        {
                            "trace": trace,
                            "profile": profile or sc.server.profile,
                            "policy": policy,
                            "replicas": r,
                            "class": cls,
                            "violation_rate": v,
                            "goodput_tps": float(alls.goodput_tps.mean()) if len(alls) else math.nan,
                            "gpu_utilization": float(alls.gpu_utilization.mean()) if len(alls) else math.nan,
                        }
                    )
    table = pd.DataFrame(rows)
    table.to_csv(ctx.out / "violation.csv", index=False)
    need = []
    for (trace, profile, policy, cls), g in table.groupby(
        ["trace", "profile", "policy", "class"], sort=False
    ):
        ok = g[g.violation_rate <= eps].replicas
        need.append(
            {
                "trace": trace,
                "profile": profile,
                "policy": policy,
                "class": cls,
                "replicas needed": f"{int(ok.min())}" if len(ok) else f"> {max(grid)}",
                "violation at most R": float(g.sort_values("replicas").violation_rate.iloc[-1]),
            }
        )
    needed = pd.DataFrame(need)
    needed.to_csv(ctx.out / "replicas_needed.csv", index=False)
    sec = Section(spec.get("title", "Production request traces"))
    sec.body += ["The traces (request-level, `time_s, prompt_tokens, output_tokens`):", ""]
    sec.body += [*md_table(pd.DataFrame(facts), "{:.1f}"), ""]
    wide = needed.pivot(index=["trace", "profile", "class"], columns="policy", values="replicas needed")
    wide = wide.reindex(columns=policies).reset_index()
    sec.body += [
        f"Fewest replicas of the grid ({', '.join(map(str, grid))}) keeping each class within "
        f"epsilon = {eps:g}, {len(seeds(spec))} seed(s) (`> {max(grid)}`: none of the grid does):",
        "",
        *md_table(wide),
        "",
    ]
    keys = ["trace", "profile", "policy", "replicas"]
    vio = table.pivot_table(index=keys, columns="class", values="violation_rate", sort=False).reset_index()
    vio.columns = [c if c in keys else f"class {c}" for c in vio.columns]
    gp = table.groupby(keys, sort=False)[["goodput_tps", "gpu_utilization"]].first()
    vio = vio.merge(gp.reset_index(), on=keys)
    sec.body += ["Violation rate per class, system goodput and mean GPU utilization at each R:", ""]
    sec.body += md_table(vio, "{:.3f}")
    return sec
