"""``wispsim run`` and ``wispsim replay``: one simulation, or one replay of a recorded log.

``run`` simulates one scenario and writes its records (Parquet), per-class and per-replica
summaries, time series and, for open arrivals, the compliance figure. ``replay`` drives the
simulator with the device side of a recorded deployment (its per-round log) under a policy and
compares recorded and simulated violation rates and time quantiles. Both write the resolved
scenario and a manifest beside the results, so every number traces back to its config and seed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import pandas as pd
import typer

from wispsim.cli.common import SUMMARY_COLUMNS, console, err_console, status, table
from wispsim.cli.options import (
    DEVICES,
    REPLICAS,
    SECONDS,
    SEED,
    TAIL_SECONDS,
    OutOpt,
    PolicyOpt,
    RouterOpt,
    ScenarioArg,
    SetOpt,
    parse_classes,
)
from wispsim.config import POLICY_NAMES
from wispsim.config.builds import effective_build
from wispsim.runs.resolve import Options
from wispsim.runs.run import describe_load


def run(
    scenario: ScenarioArg = None,
    policy: PolicyOpt = None,
    devices: Annotated[int | None, typer.Option(help="Number of devices N.", parser=DEVICES)] = None,
    classes: Annotated[str | None, typer.Option(help="SLO classes in tokens/s, e.g. 2,4,6,8.")] = None,
    seed: Annotated[int | None, typer.Option(help="Run seed.", parser=SEED)] = None,
    arrivals: Annotated[
        str | None,
        typer.Option(
            help="Arrival process: a time_s,value CSV (concurrency trace; its span becomes the "
            "measurement window), NAME:FILE with NAME concurrency, rate or requests (a request "
            "trace: time_s,prompt_tokens,output_tokens), or poisson:RATE.",
        ),
    ] = None,
    replicas: Annotated[
        int | None, typer.Option(help="Verifier replicas behind the router.", parser=REPLICAS)
    ] = None,
    router: RouterOpt = None,
    tail: Annotated[
        float,
        typer.Option(
            help="With a trace: seconds measured after it ends (last value holds).", parser=TAIL_SECONDS
        ),
    ] = 300.0,
    step: Annotated[float, typer.Option(help="Time step of the time series (s).", parser=SECONDS)] = 10.0,
    window: Annotated[
        float, typer.Option(help="Trailing window of compliance over time (s).", parser=SECONDS)
    ] = 60.0,
    log: Annotated[
        Path | None, typer.Option(help="Also write the per-round log (.parquet or .csv) that `replay` reads.")
    ] = None,
    out: OutOpt = None,
    set_: SetOpt = None,
) -> None:
    """Run one simulation; write its records (Parquet), per-class summary and time series."""
    from wispsim.analysis.binding import describe as describe_binding
    from wispsim.runs.run import run as run_one

    opts = Options(policy, devices, parse_classes(classes), seed, arrivals, tail, replicas, router)
    o = run_one(scenario, set_, opts, out, log, step, window, status=status)
    sc, res = o.scenario, o.result
    title = f"{sc.policy}, {describe_load(sc, res.devices)}, seed={sc.seed}"
    if sc.server.mode == "speculative":
        title += f", verifier build {effective_build(sc.server, sc.policy)}"
    console.print(table(o.summary, title, SUMMARY_COLUMNS))
    console.print(describe_binding(o.summary.iloc[-1]))
    if sc.server.replicas > 1:
        console.print(table(o.per_replica, f"per replica ({sc.server.router} router)"))
    if o.bursts is not None and not o.bursts.empty:
        title = f"bursts (threshold {1 - sc.epsilon:g}, trailing {window:g} s window)"
        console.print(table(o.bursts, title))
    console.print(
        f"records and summary: {o.folder}  ({res.wall_s:.1f} s wall; {_rounds_said(res, o.summary)})"
    )
    if not res.responses.measured.any():
        err_console.print(
            "[yellow]warning:[/yellow] no response started inside the measurement window "
            f"[{res.window[0]:g}, {res.window[1]:g}) s, so the violation rate is undefined; "
            "lengthen workload.duration_s"
        )


def replay_cmd(
    log: Annotated[
        Path, typer.Argument(help="Per-round log (.parquet or .csv) with its LOG.meta.json sidecar.")
    ],
    scenario: ScenarioArg = None,
    policy: Annotated[
        str | None,
        typer.Option(help=f"Policy preset: {', '.join(POLICY_NAMES)} (default: the recorded one)."),
    ] = None,
    seed: Annotated[
        int | None, typer.Option(help="Seed of the server's noise (default: the log's).", parser=SEED)
    ] = None,
    out: OutOpt = None,
    set_: SetOpt = None,
) -> None:
    """Replay a recorded deployment's device side under a policy; compare recorded and simulated.

    The scenario is the one in the log's sidecar; a SCENARIO file replaces it, --set overrides.
    """
    from wispsim.runs.run import replay

    o = replay(log, scenario, set_, policy, seed, out, status=status)
    for note in o.notes:
        err_console.print(note, markup=False, highlight=False)
    err_console.print(f"replay: {o.about}", highlight=False)
    violations, times = _replay_tables(o.comparison)
    recorded = o.meta.get("policy", "?")
    title = f"violation rate: recorded ({recorded}) vs simulated ({o.scenario.policy}), seed={o.result.seed}"
    console.print(table(violations, title))
    console.print(table(times, "queue and verify time (ms), recorded/simulated; KS statistic"))
    console.print(
        f"records and comparison: {o.folder}  ({o.result.wall_s:.1f} s wall; {_rounds_said(o.result)})"
    )


def _rounds_said(res: Any, summary: pd.DataFrame | None = None) -> str:
    """The rounds a run simulated, and -- with its summary -- how many of them ``summary.csv``
    counts (the rounds of the responses measured in the window; warm-up and drain are not)."""
    total = f"{len(res.round_records):,} rounds simulated"
    if summary is None or "rounds" not in summary or summary.empty:
        return total
    per_class = summary[summary["class"].astype(str) != "all"]
    measured = int(per_class["rounds"].sum())
    w0, w1 = res.window
    window = f"[{w0:g}, {w1:g}) s"
    return f"{total}, {measured:,} of them by responses started in the window {window} (summary.csv's)"


def _replay_tables(comparison: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The comparison in two narrow tables: violation rates, and time quantiles as rec/sim."""
    c = comparison
    violations = pd.DataFrame(
        {
            "class": c["class"],
            "responses": [
                f"{a} / {b}" for a, b in zip(c.responses_recorded, c.responses_simulated, strict=True)
            ],
            "recorded": c.violation_recorded,
            "95% CI": [
                f"[{lo:.3f}, {hi:.3f}]"
                for lo, hi in zip(c.violation_recorded_lo, c.violation_recorded_hi, strict=True)
            ],
            "simulated": c.violation_simulated,
            "difference": c.violation_diff,
        }
    )
    if c.truncated_simulated.any():  # measured in the replay, but the log ended inside them
        violations["log ended"] = c.truncated_simulated
    times: dict[str, Any] = {"class": c["class"]}
    for kind in ("queue", "verify"):
        for q in (50, 90, 99):
            rec, sim = c[f"{kind}_p{q}_ms_recorded"], c[f"{kind}_p{q}_ms_simulated"]
            times[f"{kind} p{q}"] = [
                f"{_ms(float(a))}/{_ms(float(b))}" for a, b in zip(rec, sim, strict=True)
            ]
        times[f"{kind} KS"] = c[f"{kind}_ks"]
    return violations, pd.DataFrame(times)


def _ms(x: float) -> str:
    """Milliseconds in a rec/sim pair: one decimal (whole from 100 on), NaN as ``-``."""
    return "-" if x != x else f"{x:.1f}" if abs(x) < 100 else f"{x:.0f}"


def register(app: typer.Typer) -> None:
    """Mount ``run`` and ``replay`` on the root app."""
    app.command("run")(run)
    app.command("replay")(replay_cmd)
