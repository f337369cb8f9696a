"""``wispsim serve``, ``wispsim swarm`` and ``wispsim validate``: a real deployment on vLLM.

``serve`` runs the verification server (or, for ``centralized``, the engine's own continuous
batching) over HTTP on a real vLLM engine; ``swarm`` runs N devices against it and writes their
records and the replay log; ``validate`` runs both for every policy, N and regime and puts the
real figures beside the simulated ones (docs/serve.md).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated, Any

import typer

from wispsim.cli.common import (
    SUMMARY_COLUMNS,
    checked,
    console,
    err_console,
    out_dir,
    out_path,
    output,
    progress,
    resolve_scenario,
    say_host_note,
    table,
)
from wispsim.cli.options import (
    DEVICES,
    FRACTION_OPEN,
    SEED,
    OutOpt,
    PolicyOpt,
    ScenarioArg,
    SetOpt,
    parse_devices,
    parse_policies,
    whole,
)
from wispsim.errors import ConfigError
from wispsim.paths import check_output_file, writing
from wispsim.provenance import write_manifest
from wispsim.serve import require_serve

PORT = whole(1, 65535, "a TCP port")
VOCAB = whole(2, 10**8)
DTYPES = ("float32", "bfloat16", "float16")
DEFAULT_URL = "http://127.0.0.1:8011"

ArchOpt = Annotated[
    str | None,
    typer.Option(help="Architecture to run with random weights (wispsim profile archs), e.g. smollm2-135m."),
]
ModelOpt = Annotated[
    str | None, typer.Option(help="A model folder in Hugging Face format (instead of --arch).")
]
DtypeOpt = Annotated[str, typer.Option(help=f"Weights' precision: {', '.join(DTYPES)}.")]
OpenAIUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--openai-url",
        help="Drive an OpenAI-compatible server instead (vllm serve: http://HOST:PORT/v1), for centralized "
        "policies; the simulated side uses the scenario's profile (docs/serve.md).",
    ),
]
OpenAIModelOpt = Annotated[
    str | None,
    typer.Option("--openai-model", help="With --openai-url: the model to ask for (default: the one served)."),
]
OpenAIVocabOpt = Annotated[
    int | None,
    typer.Option(
        "--openai-vocab",
        help="With --openai-url: token ids sent stay below this (default: the profile's model vocabulary).",
        parser=VOCAB,
    ),
]


def _source(model: str | None, arch: str | None, dtype: str, seed: int = 0) -> Any:
    from wispsim.serve.app import ModelSource

    if (model is None) == (arch is None):
        raise ConfigError("--model/--arch", "", "give exactly one: a model folder or an architecture")
    if dtype not in DTYPES:
        raise ConfigError("--dtype", dtype, f"must be one of {', '.join(DTYPES)}")
    if arch is not None:
        from wispsim.model.archs import available_archs

        if arch not in available_archs() and not Path(arch).is_file():
            raise ConfigError("--arch", arch, f"unknown architecture; known: {', '.join(available_archs())}")
    if model is not None and not Path(model, "config.json").is_file():
        raise ConfigError("--model", model, "no config.json there (a model folder in Hugging Face format)")
    return ModelSource(model=model, arch=arch, dtype=dtype, seed=seed)


def _openai(url: str | None, model: str | None, vocab: int | None) -> Any:
    """The OpenAI-compatible server of ``--openai-url`` (None without it)."""
    if url is None:
        if model is not None or vocab is not None:
            raise ConfigError("--openai-model/--openai-vocab", "", "only with --openai-url")
        return None
    from wispsim.serve.openai import OpenAIServer

    return OpenAIServer(url, model, vocab)


def _scenario(scenario: Path | None, policy: str | None, set_: list[str] | None) -> Any:
    sc = resolve_scenario(scenario, set_)
    if policy is not None:
        sc = sc.with_policy(policy)
    if sc.server.replicas != 1:
        raise ConfigError("server.replicas", str(sc.server.replicas), "wispsim serve runs one replica; set 1")
    return checked(sc, policy=policy)


def serve(
    scenario: ScenarioArg = None,
    policy: PolicyOpt = None,
    arch: ArchOpt = None,
    model: ModelOpt = None,
    dtype: DtypeOpt = "float32",
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.", parser=PORT)] = 8011,
    verbose: Annotated[
        bool, typer.Option("--verbose", help="Show all of vLLM's startup messages (docs/serve.md).")
    ] = False,
    set_: SetOpt = None,
) -> None:
    """Serve the scenario's policy on a real vLLM engine over HTTP, until interrupted.

    Speculative policies verify rounds with the same scheduler plug-in the simulator runs and the
    estimator of the scenario's profile; centralized hands whole responses to vLLM's continuous
    batching and streams the tokens. API: docs/serve.md.
    """
    require_serve("wispsim serve")
    from wispsim.serve.app import serve as run_server

    source = _source(model, arch, dtype)
    sc = _scenario(scenario, policy, set_)
    quiet = None
    if not verbose:
        from wispsim.engines.vllm_quiet import hide_known_harmless

        quiet = hide_known_harmless()

    def ready(facts: dict[str, Any]) -> None:
        if quiet is not None:
            err_console.print(quiet.note())
        err_console.print(
            f"serving {sc.policy} ({sc.server.mode}) on http://{host}:{port}: vLLM on {facts['device']}, "
            f"{source.describe()}, KV cache {facts['kv_capacity_tokens']} tokens in blocks of "
            f"{facts['block_size']}, prefix caching {'on' if facts['prefix_caching'] else 'off'}"
        )

    say_host_note(sc.server.profile)  # vLLM runs here: the profile should be this host's
    err_console.print(f"starting vLLM for {sc.policy} ({source.describe()}) ...")
    with contextlib.suppress(KeyboardInterrupt):
        run_server(sc, source, host, port, ready)


def swarm(
    scenario: ScenarioArg = None,
    policy: PolicyOpt = None,
    url: Annotated[str | None, typer.Option(help=f"wispsim serve's URL (default {DEFAULT_URL}).")] = None,
    openai_url: OpenAIUrlOpt = None,
    openai_model: OpenAIModelOpt = None,
    openai_vocab: OpenAIVocabOpt = None,
    devices: Annotated[int | None, typer.Option(help="Number of devices N.", parser=DEVICES)] = None,
    seed: Annotated[int | None, typer.Option(help="Run seed.", parser=SEED)] = None,
    log: Annotated[
        Path | None, typer.Option(help="Also write the per-round replay log here (.parquet or .csv).")
    ] = None,
    out: OutOpt = None,
    set_: SetOpt = None,
) -> None:
    """Run N devices against a real server for the scenario's window; write their records.

    The devices are the simulator's own on the wall clock (same acceptance trace, drafting,
    link delays); the server's queue and verify times, batches and cached tokens are its reports.
    With --openai-url the server is any OpenAI-compatible one (centralized serving only).
    """
    require_serve("wispsim swarm")
    from wispsim.analysis.metrics import summarize
    from wispsim.serve.swarm import probe, run_swarm

    if url is not None and openai_url is not None:
        raise ConfigError("--url/--openai-url", "", "give one: wispsim serve's or an OpenAI server's")
    url = url or DEFAULT_URL
    server = _openai(openai_url, openai_model, openai_vocab) or url
    folder = out_path(out, "swarm")
    if log is not None:
        check_output_file(log, "--log", (".parquet", ".csv"))
    sc = _scenario(scenario, policy, set_)
    if devices is not None:
        sc = checked(sc.with_devices(devices), devices=devices)
    if seed is not None:
        sc = sc.replace(seed=seed)
    if openai_url is not None:
        from wispsim.model.profiles import load_profile
        from wispsim.serve.openai import check_policy

        check_policy(sc)
        facts = probe(sc, server)  # reachable, an OpenAI API, the model there
        load_profile(sc.server.profile).check_layout(facts.get("engine_in_process"), "--openai-url")
    else:
        probe(sc, server)  # reachable, and serving this policy
    folder = out_dir(folder, "swarm")
    with progress() as bar:
        task = bar.add_task(f"{sc.devices.count} devices, {sc.policy}", total=None)

        def tick(now: float, end: float) -> None:
            bar.update(task, completed=min(now, end), total=end)

        run = run_swarm(sc, server, progress=tick)
    res = run.result
    summary = summarize(res)
    if openai_url is not None:  # an OpenAI server logs no batches: unknown, not zero
        summary[["gpu_utilization", "mean_batch_size"]] = float("nan")
    with output(folder) as o:
        (o / "scenario.yaml").write_text(sc.to_yaml())
        run.write_records(o.path)
        summary.to_csv(o / "summary.csv", index=False)
        if log is not None:
            with writing("--log", log):
                run.write_log(log)
        write_manifest(
            o.path,
            {"seed": sc.seed, "devices": sc.devices.count, "policy": sc.policy, "server": run.facts},
        )
    console.print(
        table(
            summary,
            f"{sc.policy}, {sc.devices.count} devices on {run.facts.get('url', url)} (real)",
            SUMMARY_COLUMNS,
        )
    )
    console.print(f"records: {folder}")


def validate(
    scenario: ScenarioArg = None,
    policies: Annotated[
        str | None,
        typer.Option(
            help="Policies to validate, comma-separated (default: wisp,fcfs,sled,centralized; "
            "with --openai-url: centralized)."
        ),
    ] = None,
    devices: Annotated[str, typer.Option(help="The grid of N, e.g. 2,4,6,8 or 2:8:2.")] = "2,4,6,8",
    regime: Annotated[
        list[str] | None,
        typer.Option(
            help="NAME or NAME:KEY=VALUE[;KEY=VALUE] (repeatable): a regime and its --set overrides, "
            "e.g. pressure:server.kv_capacity_tokens=1024. Default: one regime, compute-bound.",
        ),
    ] = None,
    arch: ArchOpt = None,
    model: ModelOpt = None,
    dtype: DtypeOpt = "float32",
    port: Annotated[int, typer.Option(help="TCP port for the servers it starts.", parser=PORT)] = 8011,
    openai_url: OpenAIUrlOpt = None,
    openai_model: OpenAIModelOpt = None,
    openai_vocab: OpenAIVocabOpt = None,
    epsilon: Annotated[
        float | None,
        typer.Option(help="Violation target for capacity (default: the scenario's).", parser=FRACTION_OPEN),
    ] = None,
    sim_set: Annotated[
        list[str] | None,
        typer.Option(
            help="Override a field on the simulated side only (repeatable), e.g. a profile fitted from "
            "the deployment's batch log: --sim-set server.profile=profiles/deployed.yaml; "
            "POLICY:KEY=VALUE for one policy only."
        ),
    ] = None,
    real_from: Annotated[
        Path | None,
        typer.Option(
            help="Take the real points from this validation folder (no server runs) and simulate them again."
        ),
    ] = None,
    out: OutOpt = None,
    set_: SetOpt = None,
) -> None:
    """Run the real deployment and the simulator side by side for every policy, N and regime.

    Starts `wispsim serve` per regime and policy (or, with --openai-url, drives that server, for
    centralized policies), runs the swarm for each N, simulates the same scenario, replays the real
    log; writes comparison.csv, capacity.csv and validation.png. Resumable: points already in
    --out are kept.
    """
    require_serve("wispsim validate")
    from wispsim.plots import validation_plot
    from wispsim.serve.validate import capacities, replays
    from wispsim.serve.validate import validate as run_validation

    folder = out_path(out, "validate")
    openai = _openai(openai_url, openai_model, openai_vocab)
    default = "centralized" if openai is not None else "wisp,fcfs,sled,centralized"
    pols = parse_policies(policies or default)
    grid = sorted(set(parse_devices(devices)))
    if openai is not None:
        if real_from is not None or model is not None or arch is not None:
            raise ConfigError(
                "--openai-url", openai_url or "", "drives a running server: no --arch, --model, --real-from"
            )
        source = None
    elif real_from is not None:
        if not (real_from / "points").is_dir():
            raise ConfigError(
                "--real-from", str(real_from), "not a wispsim validate folder (no points/ in it)"
            )
        if real_from.resolve() == folder.resolve():
            raise ConfigError(
                "--real-from", str(real_from), "must differ from --out (results folders are not rewritten)"
            )
        source = None
    else:
        source = _source(model, arch, dtype)
    regimes = [_regime(r) for r in (regime or ["compute"])]
    if len({r.name for r in regimes}) != len(regimes):
        raise ConfigError("--regime", "", "regime names must be unique")
    for r in regimes:  # every regime's scenario checked before any work
        for p in pols:
            _scenario_checked(r, scenario, set_ or [], p, sim_set or [])
            if openai is not None:
                from wispsim.serve.openai import check_policy

                check_policy(r.scenario(scenario, set_ or []).with_policy(p))
    base = resolve_scenario(scenario, set_)
    if real_from is None and openai is None:  # the servers run here: the profile should be this host's
        say_host_note(base.server.profile)
    eps = base.epsilon if epsilon is None else epsilon
    folder = out_dir(folder, "validate")
    with progress() as bar:
        task = bar.add_task("validate", total=None)

        def tick(label: str, now: float, end: float) -> None:
            bar.update(task, description=label, completed=min(now, end), total=end)

        table_ = run_validation(
            scenario, set_ or [], regimes, pols, grid, source, folder, port,
            say=lambda s: bar.console.print(s), progress=tick, sim_sets=sim_set or [], real_from=real_from,
            openai=openai,
        )  # fmt: skip
    cap = capacities(table_, eps)
    with output(folder) as o:
        table_.to_csv(o / "comparison.csv", index=False)
        cap.to_csv(o / "capacity.csv", index=False)
        replays(folder).to_csv(o / "replay.csv", index=False)
        if len(table_):
            validation_plot(table_, o / "validation.png")
        write_manifest(
            o.path,
            {
                "policies": pols,
                "devices": grid,
                "regimes": {r.name: list(r.sets) for r in regimes},
                "epsilon": eps,
                "model": source.describe()
                if source
                else openai.url
                if openai
                else f"real points of {real_from}",
                "dtype": dtype,
                "sim_set": sim_set or [],
            },
        )
    console.print(table(side_by_side(table_), "real vs simulated", left=("regime", "policy")))
    console.print(
        table(cap, f"capacity (largest N of the grid within epsilon {eps:g})", left=("regime", "policy"))
    )
    console.print(f"results: {folder}")


SHOWN = {"violation_rate": "viol", "goodput_tps": "goodput", "verify_p50_ms": "verify50"}


def side_by_side(long: Any) -> Any:
    """The printed summary: per regime, policy and N, real / simulated of a few figures."""
    import pandas as pd

    if not len(long):
        return pd.DataFrame(columns=["regime", "policy", "devices"])
    sel = long[long.metric.isin(list(SHOWN))]
    wide = sel.pivot_table(
        index=["regime", "policy", "devices"], columns="metric", values=["real", "sim"], sort=False
    )
    out = wide.index.to_frame(index=False)
    for m, short in SHOWN.items():
        for side in ("real", "sim"):
            out[f"{short} {side}"] = wide[(side, m)].to_numpy() if (side, m) in wide.columns else float("nan")
    return out


def _regime(text: str) -> Any:
    from wispsim.serve.validate import Regime

    name, _, rest = text.partition(":")
    name = name.strip()
    if not name or not name.replace("-", "").replace("_", "").isalnum():
        raise ConfigError(
            "--regime", text, "expected NAME or NAME:KEY=VALUE[;KEY=VALUE], NAME of letters, digits, - and _"
        )
    sets = tuple(s.strip() for s in rest.split(";") if s.strip())
    return Regime(name, sets)


def _scenario_checked(
    regime: Any, scenario: Path | None, sets: list[str], policy: str, sim_sets: list[str]
) -> None:
    from wispsim.config import parse_set
    from wispsim.sim.inputs import load_scenario

    sc = load_scenario(scenario, parse_set([*sets, *regime.sets]), source=f"--regime {regime.name}")
    checked(sc.with_policy(policy), policy=policy)
    from wispsim.serve.validate import sets_for

    mine = sets_for(sim_sets, policy)
    if mine:
        sim = load_scenario(None, parse_set(mine), base=sc.with_policy(policy).to_dict(), source="--sim-set")
        checked(sim, policy=policy)
    if sc.server.replicas != 1:
        raise ConfigError(
            f"--regime {regime.name}", "server.replicas", "wispsim serve runs one replica; set 1"
        )


def register(app: typer.Typer) -> None:
    """Mount ``serve``, ``swarm`` and ``validate`` on the root app."""
    app.command("serve")(serve)
    app.command("swarm")(swarm)
    app.command("validate")(validate)
