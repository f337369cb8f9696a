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

from wispsim.cli.common import (
    SUMMARY_COLUMNS,
    checked,
    console,
    describe_load,
    err_console,
    out_dir,
    out_path,
    output,
    resolve_scenario,
    say_host_note,
    table,
)
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
    applying,
    check_poisson_rate,
    check_series_step,
    parse_classes,
)
from wispsim.config import POLICY_NAMES, parse_set
from wispsim.paths import check_output_file, writing
from wispsim.provenance import write_manifest


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
            "measurement window), NAME:FILE with NAME concurrency or rate, or poisson:RATE.",
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
    from wispsim.analysis.metrics import replica_summary, summarize
    from wispsim.analysis.timeseries import write_timeseries
    from wispsim.plots import compliance_figure
    from wispsim.sim.engine import simulate
    from wispsim.sim.inputs import apply_arrivals_option, apply_server_options

    folder = out_path(out, "run")  # every output checked before any work
    if log is not None:
        check_output_file(log, "--log", (".parquet", ".csv"))
    cls = parse_classes(classes)
    check_poisson_rate(arrivals)
    sc = resolve_scenario(scenario, set_)
    if policy is not None:
        sc = sc.with_policy(policy)
    with applying("--arrivals", {"tail": "--tail"}):
        sc = apply_arrivals_option(sc, arrivals, tail)
    with applying("--replicas", {"router": "--router"}):
        sc = apply_server_options(sc, replicas, router)
    with applying("--devices", {"class": "--classes", "slo": "--classes"}):
        sc = sc.with_devices(devices or sc.devices.count, cls)
    if seed is not None:
        with applying("--seed"):
            sc = sc.replace(seed=seed)
    checked(
        sc,
        classes=classes,
        devices=devices,
        arrivals=arrivals,
        replicas=replicas,
        router=router,
        policy=policy,
    )
    wl = sc.workload
    check_series_step(step, wl.warmup_s + wl.duration_s + sc.drain_limit_s())
    folder = out_dir(folder, "run")
    who = describe_load(sc)
    with err_console.status(f"simulating {who} under {sc.policy} ..."):
        res = simulate(sc)
    summary = summarize(res)
    per_replica = replica_summary(res)
    with output(folder) as o:  # manifest.json last: a folder without it is incomplete
        (o / "scenario.yaml").write_text(sc.to_yaml())
        res.round_records.to_parquet(o / "rounds.parquet")
        res.batches.to_parquet(o / "batches.parquet", index=False)
        res.responses.to_parquet(o / "responses.parquet", index=False)
        summary.to_csv(o / "summary.csv", index=False)
        per_replica.to_csv(o / "replicas.csv", index=False)
        o.current = None  # several files: an error names the one it has, if any
        comp, server, bursts = write_timeseries(res, folder, step, window)
        if sc.arrivals.process != "closed":
            compliance_figure(res, comp, server, window, o / "compliance.png")
        if log is not None:
            from wispsim.study.replay import write_log

            with writing("--log", log):
                write_log(res, log)
        write_manifest(
            o.path,
            {
                "seed": sc.seed,
                "devices": sc.devices.count,
                "policy": sc.policy,
                "sim_end_s": res.sim_end,
                "wall_s": res.wall_s,
                **res.info,
            },
        )
    title = f"{sc.policy}, {describe_load(sc, res.devices)}, seed={sc.seed}"
    console.print(table(summary, title, SUMMARY_COLUMNS))
    if sc.server.replicas > 1:
        console.print(table(per_replica, f"per replica ({sc.server.router} router)"))
    if bursts is not None and not bursts.empty:
        console.print(table(bursts, f"bursts (threshold {1 - sc.epsilon:g}, trailing {window:g} s window)"))
    n_rounds = len(res.round_records)
    console.print(f"records and summary: {folder}  ({res.wall_s:.1f} s wall, {n_rounds} rounds)")
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
    from wispsim.study.replay import compare as compare_replay
    from wispsim.study.replay import describe, log_scenario, meta_path, read_log, replay

    folder = out_path(out, "replay")  # checked before any work
    frame, meta = read_log(log)
    if scenario is not None:
        sc = resolve_scenario(scenario, set_)
    else:
        sc = log_scenario(meta, str(meta_path(log)), parse_set(set_ or []))
    if policy is not None:
        sc = sc.with_policy(policy)
    if scenario is None and not any(s.startswith("server.profile=") for s in set_ or []):
        # the recorded server's profile: it must be one measured in that server's engine layout
        from wispsim.model.profiles import load_profile

        served = (meta.get("server") or {}).get("engine_in_process")
        load_profile(sc.server.profile).check_layout(served, str(meta_path(log)))
    server_host = (meta.get("server") or {}).get("host")
    if isinstance(server_host, dict) and server_host:  # the host the recorded timings come from
        say_host_note(sc.server.profile, server_host)
    folder = out_dir(folder, "replay")
    devices = frame.device.nunique()
    err_console.print(f"replay: {describe(sc, meta)}", highlight=False)
    with err_console.status(f"replaying {devices} devices, {len(frame)} rounds under {sc.policy} ..."):
        res = replay(sc, frame, meta, seed)
    comparison = compare_replay(frame, res, meta)
    with output(folder) as o:  # manifest.json last
        (o / "scenario.yaml").write_text(res.scenario.to_yaml())
        res.round_records.to_parquet(o / "rounds.parquet")
        res.batches.to_parquet(o / "batches.parquet", index=False)
        res.responses.to_parquet(o / "responses.parquet", index=False)
        comparison.to_csv(o / "comparison.csv", index=False)
        write_manifest(
            o.path,
            {
                "log": str(log),
                "recorded_policy": meta.get("policy"),
                "policy": sc.policy,
                "seed": res.seed,
                "devices": res.devices,
                "sim_end_s": res.sim_end,
                "wall_s": res.wall_s,
            },
        )
    violations, times = _replay_tables(comparison)
    title = (
        f"violation rate: recorded ({meta.get('policy', '?')}) vs simulated ({sc.policy}), seed={res.seed}"
    )
    console.print(table(violations, title))
    console.print(table(times, "queue and verify time (ms), recorded/simulated; KS statistic"))
    n_rounds = len(res.round_records)
    console.print(f"records and comparison: {folder}  ({res.wall_s:.1f} s wall, {n_rounds} rounds)")


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
