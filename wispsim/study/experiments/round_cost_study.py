"""The ``round-cost`` study: what a verification round costs vLLM's engine, by its parts.

Reads the measurements of ``benchmarks/vllm/round_cost.py`` (the spec's ``measurements``, a CSV
beside its ``.json`` provenance, relative to ``experiments/``) and reports, per kind of work
(a re-submitted round, a session-resident round, a running sequence's step), prefix length and
batch size, the milliseconds per round of the API server's, the engine core's and the model
runner's CPU work and the recomputed prefix tail, then the linear host-CPU model fitted on them
(:mod:`wispsim.study.round_cost`). Nothing is simulated.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from wispsim.errors import ConfigError
from wispsim.paths import data_dir as package_data
from wispsim.study import round_cost
from wispsim.study.experiments.run import Context, Section, md_table
from wispsim.study.experiments.spec import STUDIES, experiments_dir
from wispsim.tabular import read_json


def _measured(prov: dict[str, Any]) -> str:
    """Where a table was measured, from its provenance file: "`command`, date, on cpu"."""
    return f"`{prov.get('command', '?')}`, {prov.get('date', '?')}, on {prov.get('host', {}).get('cpu', '?')}"


def _table(df: pd.DataFrame, whole: tuple[str, ...], fmt: str) -> list[str]:
    """``df`` as markdown, the ``whole`` columns as integers."""
    return md_table(df.astype(dict.fromkeys(whole, int)), fmt)


@STUDIES.register("round-cost")
def study_round_cost(ctx: Context) -> Section:
    spec = ctx.spec
    rel = spec.get("measurements")
    if not isinstance(rel, str) or not rel:
        raise ConfigError(f"experiments/{ctx.name}.yaml", "measurements", "must name the benchmark's CSV")
    path = experiments_dir() / rel
    table, fits = round_cost.summary(path, warm=int(spec.get("warm_rounds", 1)))
    table.to_csv(ctx.out / "per_round.csv", index=False, float_format="%.5g")
    fits.to_csv(ctx.out / "host_cpu_fit.csv", index=False, float_format="%.5g")
    prov = read_json(path.with_suffix(".json"))
    host, ver = prov.get("host", {}), prov.get("versions", {})
    sec = Section(spec.get("title", "What a verification round costs the serving host"))
    sec.body += [
        f"Measured by `{prov.get('command', '?')}` on {host.get('cpu', '?')} ({host.get('cores', '?')} "
        f"cores), vLLM {ver.get('vllm', '?')} (CPU backend, engine core in process), torch "
        f"{ver.get('torch', '?')}, {prov.get('date', '?')}; model {prov.get('model', '?')}; k = "
        f"{int(round_cost.load(path)['k'].iloc[0])} drafts a round. Data: `{rel}` and its `.json`.",
        "",
        "Milliseconds per round (per sequence for `running`), medians over the rounds after the "
        "first; `api` = input + output processing (the API server process in `vllm serve`), "
        "`engine` = the engine core's scheduler side, `runner` = the model runner's input "
        "preparation, `forward` = the tiny model's forward pass on this CPU (a GPU's work on a "
        "GPU host: not a host cost), `tail` = prefix tokens forwarded again per round:",
        "",
    ]
    sec.body += _table(table, ("batch", "prefix"), "{:.3f}")
    sec.body += [
        "",
        "The host-CPU model fitted on every row (non-negative least squares, ms; `step` per engine "
        "step, `request` per request in a step, `arrival` per new request, `session` per resident "
        "round, `token` per prompt token hashed):",
        "",
    ]
    sec.body += md_table(fits, "{:.4g}")
    api_rel = spec.get("api_measurements")
    if api_rel:
        serial, load = round_cost.api_summary(experiments_dir() / str(api_rel))
        serial.to_csv(ctx.out / "api_serial.csv", index=False, float_format="%.5g")
        aprov = read_json((experiments_dir() / str(api_rel)).with_suffix(".json"))
        sec.body += [
            "",
            f"In front of the engine: a re-submitted round through a real `vllm serve` (the API "
            f"server and engine-core processes; `{aprov.get('command', '?')}`, same host), one session "
            "at a time: median client latency, the server's own `vllm:e2e_request_latency_seconds` "
            "(API server receiving the request to its finishing) and their difference (HTTP and "
            "the client), ms:",
            "",
        ]
        sec.body += _table(serial, ("prefix",), "{:.2f}")
        sec.body += ["", "Under load (C sessions sending rounds back to back, prefix ~1,024):", ""]
        sec.body += _table(load, ("concurrency", "prefix", "rounds"), "{:.1f}")
        sec.facts["api"] = {
            "serial": serial.to_dict(orient="records"),
            "load": load.to_dict(orient="records"),
        }
        _host_cpu_terms(ctx, sec, fits, prov, [rel, str(api_rel)])
    sec.facts.update({"fit": fits.to_dict(orient="records"), "measurements": rel})
    return sec


def _host_cpu_terms(
    ctx: Context, sec: Section, fits: pd.DataFrame, prov: dict[str, Any], sources: list[str]
) -> None:
    """The API-server processes' CPU per round (``api_cost.py``'s CPU table) and the simulator's
    host-CPU terms derived from it, the fits and the tokenizer's cost; written to
    ``wispsim/data/host_cpu.yaml`` on a full run whose spec says ``write_host_cpu``."""
    api = experiments_dir() / sources[1]
    cpu_path = api.with_name(api.stem + "-cpu.csv")
    tok_rel = ctx.spec.get("tokenize_measurements")
    if not cpu_path.is_file() or not tok_rel:
        return
    cpu = round_cost.api_cpu(cpu_path)
    sec.body += [
        "",
        "What each process spends on a re-submitted round through `vllm serve` (CPU ms per round, "
        "the processes' user + system time over back-to-back rounds, less their idle spending; "
        "the engine core's includes the tiny model's forward):",
        "",
    ]
    sec.body += _table(
        cpu[["prefix", "rounds", "api_cpu_ms", "engine_cpu_ms"]], ("prefix", "rounds"), "{:.2f}"
    )
    tokenize = pd.read_csv(experiments_dir() / str(tok_rel))
    measuring = cpu.loc[cpu["prefix"] == cpu["prefix"].min(), "api_cpu_ms"]
    measuring_ms = float(measuring.iloc[0]) if len(measuring) else None
    stream = _stream(ctx, sec, measuring_ms)
    transport = _transport(ctx, sec, measuring_ms)
    merge = _merge(ctx, sec, stream, measuring_ms)
    terms = round_cost.host_cpu_terms(fits, cpu, tokenize, stream, transport, merge)
    sec.body += [
        "",
        "The simulator's host-CPU terms (ms; `wispsim/data/host_cpu.yaml`, "
        "`wispsim.model.host_cpu`): the engine core's are the engine and runner fits added, "
        "the API server's `request` and `ids` (per prompt token sent as ids) are fitted on its CPU "
        "per round above, `session` and `grpc_session` a resident round over HTTP and over gRPC "
        "(the table before; without it `session` is `request` less what a resident round saves "
        "in-process), "
        "`text` is tokenization per prompt token of a text prompt, `step`, `token`, `output`, "
        "`chunk` and `chat` a response's output and the chat endpoint's extra (the tables before: "
        "the per-chunk cost measured unmerged split into `output`, every output's, and `chunk`, "
        "which a merge saves):",
        "",
    ]
    sec.body += md_table(
        pd.DataFrame([{"process": k.removesuffix("_ms"), **v} for k, v in terms.items()]), "{:.4g}"
    )
    sec.facts["host_cpu"] = terms
    if ctx.spec.get("write_host_cpu") and not ctx.quick:
        extra = [
            str(ctx.spec[k])
            for k in ("stream_measurements", "transport_measurements", "merge_measurements")
            if ctx.spec.get(k)
        ]
        _write_host_cpu(terms, prov, [*sources, str(tok_rel), *extra])


def _stream(ctx: Context, sec: Section, measuring_round_ms: float | None) -> dict[str, float] | None:
    """A response's API-server CPU by its parts (``stream_cost.py``'s cells and their fit, scaled
    to the measuring host by the round both hosts measured), or None where the spec names no
    ``stream_measurements``."""
    rel = ctx.spec.get("stream_measurements")
    if not rel:
        return None
    path = experiments_dir() / str(rel)
    cells = round_cost.stream_cpu(path)
    fit = round_cost.stream_terms(cells, measuring_round_ms)
    sprov = read_json(path.with_suffix(".json"))
    shown = cells.assign(api_cpu_ms_per_request=1e3 * cells["api_cpu_s"] / cells["requests"])
    sec.body += [
        "",
        f"A response through the API server ({_measured(sprov)}; "
        f"{sprov.get('model', '?')}): waves of C concurrent requests, 64-token text prompts, M "
        "output tokens each (`max_tokens`, EOS ignored), to `/v1/completions` and "
        "`/v1/chat/completions`, streamed and not; the API-server process's CPU (idle rate off), "
        "the chunks the client received and the engine's steps (`vllm:iteration_tokens_total`'s "
        "count):",
        "",
    ]
    sec.body += _table(
        shown[["endpoint", "stream", "concurrency", "max_tokens", "requests", "output_tokens", "chunks",
               "steps", "api_cpu_ms_per_request"]],
        ("concurrency", "max_tokens", "requests", "output_tokens", "chunks", "steps"), "{:.2f}",
    )  # fmt: skip
    sec.body += [
        "",
        "Fitted (non-negative least squares) and scaled to the measuring host, ms: "
        + ", ".join(f"{t} {fit[t]:.4g}" for t in round_cost.STREAM_TERMS)
        + f"; median error {100 * fit['median_error']:.0f}% (largest {100 * fit['max_error']:.0f}%) "
        f"over the cells. The `reference` row is a verification round measured as above on that "
        f"host; the measuring host's round ({measuring_round_ms:.2f} ms above) over it, "
        f"{fit['host_scale']:.3g}, scales every part to the measuring host's speed.",
    ]
    sec.facts["stream"] = {"fit": fit, "measurements": str(rel)}
    return fit


def _merge(
    ctx: Context, sec: Section, stream: dict[str, float] | None, measuring_round_ms: float | None
) -> dict[str, float] | None:
    """What a merge of a response's outputs into one chunk saves (``merge_cost.py``'s cells and
    their fit, the step message's cost taken from ``stream``, scaled to that table's host by the
    round both measured: the share of the per-chunk cost that is the chunk's own), or None where
    the spec names no ``merge_measurements`` (or no stream and reference rounds to scale by)."""
    rel = ctx.spec.get("merge_measurements")
    if not rel:
        return None
    path = experiments_dir() / str(rel)
    cells = round_cost.merge_cpu(path)
    here = round_cost.reference_round_ms(cells)
    if stream is None or here is None or not measuring_round_ms:
        src = f"experiments/{ctx.name}.yaml"
        raise ConfigError(
            src, "merge_measurements", "needs stream_measurements and a reference row to scale by"
        )
    fit = round_cost.merge_terms(cells, stream["step"] * here / measuring_round_ms)
    mprov = read_json(path.with_suffix(".json"))
    rows = cells[cells["endpoint"] != "reference"]
    shown = rows.assign(chunks_per_token=rows["chunks"] / rows["output_tokens"],
                        api_cpu_ms_per_request=1e3 * rows["api_cpu_s"] / rows["requests"])  # fmt: skip
    sec.body += [
        "",
        f"When the API server falls behind ({_measured(mprov)}): the engine core alone on one CPU, the API "
        "server and the client on the other beside 0-3 busy loops, C concurrent streamed "
        "completions of M tokens; where the process is behind, a response's collector merges "
        "outputs and the client receives fewer chunks than tokens:",
        "",
    ]
    sec.body += _table(
        shown[["concurrency", "hogs", "max_tokens", "requests", "output_tokens", "chunks", "chunks_per_token",
               "steps", "api_cpu_ms_per_request"]],
        ("concurrency", "hogs", "max_tokens", "requests", "output_tokens", "chunks", "steps"), "{:.2f}",
    )  # fmt: skip
    sec.body += [
        "",
        "Fitted (non-negative least squares; `step` is the stream table's, scaled to that host by "
        "its `reference` round: these cells' steps rise and fall with their outputs), ms at that host: "
        + ", ".join(f"{t} {fit[t]:.4g}" for t in round_cost.MERGE_TERMS)
        + f"; median error {100 * fit['median_error']:.0f}% (largest {100 * fit['max_error']:.0f}%). "
        f"A chunk is {100 * fit['chunk_share']:.0f}% of what an output costs unmerged: that share "
        "of the per-chunk cost above is `chunk` (saved by a merge), the rest `output`.",
    ]
    sec.facts["merge"] = {"fit": fit, "measurements": str(rel)}
    return fit


def _transport(ctx: Context, sec: Section, measuring_round_ms: float | None) -> dict[str, float] | None:
    """A resident round's API-side CPU over HTTP and over gRPC (``transport_cost.py``, scaled to
    the measuring host by the re-submitted round both hosts measured), or None where the spec
    names no ``transport_measurements``."""
    rel = ctx.spec.get("transport_measurements")
    if not rel or measuring_round_ms is None:
        return None
    path = experiments_dir() / str(rel)
    cells = round_cost.transport_cpu(path)
    fit = round_cost.transport_terms(cells, measuring_round_ms)
    tprov = read_json(path.with_suffix(".json"))
    sec.body += [
        "",
        f"A round's API-side CPU by build ({_measured(tprov)}): `vllm-openai` re-submits each round's whole "
        "sequence to `vllm serve` over HTTP (its API-server process's CPU, `stock-vllm`); "
        "`wispsim-serve` keeps the session resident in vLLM's engine and a round sends its drafts, "
        "over HTTP (`vllm-sessions`) or gRPC (`wisp-grpc`), the process's CPU less the engine's in "
        "the batch thread; back-to-back rounds of one session, idle rate off, ms a round on that host "
        "(`run`: repeats, the transports in both orders; each term is the median over them):",
        "",
    ]
    shown = cells[["run", "server", "transport", "prefix", "rounds", "api_cpu_ms"]]
    sec.body += _table(shown, ("run", "prefix", "rounds"), "{:.2f}")
    sec.body += [
        "",
        f"At the measuring host's speed (its round {measuring_round_ms:.2f} ms over this host's, "
        f"{fit['host_scale']:.3g}): a resident round costs the API side {fit['session']:.2f} ms over "
        f"HTTP and {fit['grpc_session']:.2f} ms over gRPC.",
    ]
    sec.facts["transport"] = {"fit": fit, "measurements": str(rel)}
    return fit


def _write_host_cpu(terms: dict[str, dict[str, float]], prov: dict[str, Any], sources: list[str]) -> None:
    host = prov.get("host", {})
    table = {
        **{k: {t: round(v, 6) for t, v in d.items()} for k, d in terms.items()},
        "host": f"{host.get('cpu', '?')} ({host.get('cores', '?')} cores): host_cpu_speed 1.0",
        "engine": f"vLLM {prov.get('versions', {}).get('vllm', '?')}, CPU backend",
        "measurements": [f"experiments/{s}" for s in sources],
        "fit": {
            "study": "experiments/round-cost.yaml (experiments/REPORT.md)",
            "date": f"{_dt.date.today():%Y-%m-%d}",
        },
    }
    header = (
        "# The serving host's CPU per engine step and per request (wispsim.model.host_cpu), in ms on\n"
        "# the measuring host. Written by `wispsim experiment run round-cost`; do not edit by hand.\n"
    )
    path: Path = package_data() / "host_cpu.yaml"
    path.write_text(header + yaml.safe_dump(table, sort_keys=False))
