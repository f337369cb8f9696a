"""``wispsim serve``, ``wispsim swarm`` and ``wispsim validate``: a real deployment on vLLM.

``serve`` runs the verification server (or, for ``centralized``, the engine's own continuous
batching) over HTTP on a real vLLM engine; ``swarm`` runs N devices against it and writes their
records and the replay log; ``validate`` runs both for every policy, N and regime and puts the
real figures beside the simulated ones (docs/serve.md).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from wispsim.cli.common import SUMMARY_COLUMNS, console, err_console, progress, table
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
    real,
    whole,
)
from wispsim.errors import ConfigError
from wispsim.runs.serve import DEFAULT_URL, DTYPES, Tick
from wispsim.serve import require_serve
from wispsim.serve.limits import ADMIN_TOKEN_ENV, Limits

PORT = whole(1, 65535, "a TCP port")
VOCAB = whole(2, 10**8)
COUNT = whole(1, 10**9)
BODY = whole(1024, 10**9)
IDLE = real(1, 604800)

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


def serve(
    scenario: ScenarioArg = None,
    policy: PolicyOpt = None,
    arch: ArchOpt = None,
    model: ModelOpt = None,
    dtype: DtypeOpt = "float32",
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.", parser=PORT)] = 8011,
    grpc_port: Annotated[
        int | None,
        typer.Option(
            help="Also serve the verification API over gRPC on this port (default: PORT + 1 where the "
            "scenario's devices speak gRPC, server.build wisp-grpc; else none).",
            parser=PORT,
            show_default=False,
        ),
    ] = None,
    admin_token: Annotated[
        str | None,
        typer.Option(
            help=f"Token /reset and /log need (Authorization: Bearer ...); default ${ADMIN_TOKEN_ENV}, "
            "else a random one, printed at start.",
            show_default=False,
        ),
    ] = None,
    max_sessions: Annotated[
        int, typer.Option(help="Most open sessions (centralized: live responses); 503 beyond.", parser=COUNT)
    ] = Limits.max_sessions,
    session_idle_s: Annotated[
        float, typer.Option(help="Close a session with no round for this many seconds.", parser=IDLE)
    ] = Limits.session_idle_s,
    max_body_bytes: Annotated[
        int, typer.Option(help="Largest request body; 413 beyond, unread.", parser=BODY)
    ] = Limits.max_body_bytes,
    max_waiting: Annotated[
        int, typer.Option(help="Most rounds queued or waiting for admission; 503 beyond.", parser=COUNT)
    ] = Limits.max_waiting,
    log_rows: Annotated[
        int, typer.Option(help="Rows /log keeps of each table (the newest).", parser=COUNT)
    ] = Limits.log_rows,
    verbose: Annotated[
        bool, typer.Option("--verbose", help="Show all of vLLM's startup messages (docs/serve.md).")
    ] = False,
    set_: SetOpt = None,
) -> None:
    """Serve the scenario's policy on a real vLLM engine over HTTP, until interrupted.

    Speculative policies verify rounds with the same scheduler plug-in the simulator runs and the
    estimator of the scenario's profile; centralized hands whole responses to vLLM's continuous
    batching and streams the tokens. API, promises and limits: docs/serve.md.
    """
    require_serve("wispsim serve")
    from wispsim.runs.serve import model_source
    from wispsim.runs.serve import serve as run_server

    source = model_source(model, arch, dtype)
    token = admin_token if admin_token is not None else os.environ.get(ADMIN_TOKEN_ENV) or None
    limits = Limits(token, max_sessions, session_idle_s, max_body_bytes, max_waiting, log_rows)
    quiet = None
    if not verbose:
        from wispsim.engines.vllm_quiet import hide_known_harmless

        quiet = hide_known_harmless()

    def ready(sc: Any, facts: dict[str, Any], admin: str) -> None:
        if quiet is not None:
            err_console.print(quiet.note())
        rpc = f" and grpc://{host}:{facts['grpc_port']}" if facts.get("grpc_port") else ""
        err_console.print(
            f"serving {sc.policy} ({sc.server.mode}, build {sc.server.build}) on http://{host}:{port}{rpc}: "
            f"vLLM on {facts['device']}, "
            f"{source.describe()}, KV cache {facts['kv_capacity_tokens']} tokens in blocks of "
            f"{facts['block_size']}, prefix caching {'on' if facts['prefix_caching'] else 'off'}",
            markup=False,
        )
        if token is None:  # made here: say it, so a swarm can reset the server and read its log
            err_console.print(f"admin token (for /reset and /log): {admin}", markup=False, highlight=False)

    with contextlib.suppress(KeyboardInterrupt):
        run_server(
            scenario, set_, policy, source, host, port, ready, say=_say, limits=limits, grpc_port=grpc_port
        )


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
    admin_token: Annotated[
        str | None,
        typer.Option(
            help=f"wispsim serve's admin token, to reset it first and read its batch log (default "
            f"${ADMIN_TOKEN_ENV}).",
            show_default=False,
        ),
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
    from wispsim.runs.serve import SwarmRequest
    from wispsim.runs.serve import swarm as run_swarm

    token = admin_token if admin_token is not None else os.environ.get(ADMIN_TOKEN_ENV) or None
    req = SwarmRequest(
        scenario, set_, policy, url, openai_url, openai_model, openai_vocab, devices, seed, log, token
    )
    from wispsim.analysis.binding import describe as describe_binding

    o = run_swarm(req, out, meter=_progress_bar)
    sc = o.scenario
    console.print(
        table(o.summary, f"{sc.policy}, {sc.devices.count} devices on {o.url} (real)", SUMMARY_COLUMNS)
    )
    console.print(describe_binding(o.summary.iloc[-1]))
    console.print(f"records: {o.folder}")


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
    from wispsim.runs.serve import ValidateRequest
    from wispsim.runs.serve import validate as run_validation

    default = "centralized" if openai_url is not None else "wisp,fcfs,sled,centralized"
    pols = parse_policies(policies or default)
    grid = sorted(set(parse_devices(devices)))
    regimes = [_regime(r) for r in (regime or ["compute"])]
    req = ValidateRequest(
        scenario, set_ or [], pols, grid, regimes, model, arch, dtype, port,
        openai_url, openai_model, openai_vocab, epsilon, sim_set or [], real_from,
    )  # fmt: skip
    o = run_validation(req, out, say=_say, meter=_progress_bar)
    console.print(table(side_by_side(o.comparison), "real vs simulated", left=("regime", "policy")))
    title = f"capacity (largest N of the grid within epsilon {o.epsilon:g})"
    console.print(table(o.capacity, title, left=("regime", "policy")))
    console.print(f"results: {o.folder}")


def _say(line: str) -> None:
    """A note or a point's figures, on stderr (above a running progress bar)."""
    err_console.print(line, markup=False, highlight=False)


@contextlib.contextmanager
def _progress_bar(label: str) -> Iterator[Tick]:
    """A progress bar on stderr while the devices run (:data:`wispsim.runs.serve.Meter`)."""
    with progress() as bar:
        task = bar.add_task(label, total=None)

        def tick(what: str, now: float, end: float) -> None:
            bar.update(task, description=what, completed=min(now, end), total=end)

        yield tick


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
    """``--regime NAME`` or ``NAME:KEY=VALUE[;KEY=VALUE]``."""
    from wispsim.study.validate import Regime

    name, _, rest = text.partition(":")
    name = name.strip()
    if not name or not name.replace("-", "").replace("_", "").isalnum():
        raise ConfigError(
            "--regime", text, "expected NAME or NAME:KEY=VALUE[;KEY=VALUE], NAME of letters, digits, - and _"
        )
    sets = tuple(s.strip() for s in rest.split(";") if s.strip())
    return Regime(name, sets)


def register(app: typer.Typer) -> None:
    """Mount ``serve``, ``swarm`` and ``validate`` on the root app."""
    app.command("serve")(serve)
    app.command("swarm")(swarm)
    app.command("validate")(validate)
