"""The ``round-cost`` study: what a verification round costs vLLM's engine, by its parts.

Reads the measurements of ``benchmarks/vllm/round_cost.py`` (the spec's ``measurements``, a CSV
beside its ``.json`` provenance, relative to ``experiments/``) and reports, per kind of work
(a re-submitted round, a session-resident round, a running sequence's step), prefix length and
batch size, the milliseconds per round of the API server's, the engine core's and the model
runner's CPU work and the recomputed prefix tail, then the linear host-CPU model fitted on them
(:mod:`wispsim.study.round_cost`). Nothing is simulated.
"""

from __future__ import annotations

import pandas as pd

from wispsim.errors import ConfigError
from wispsim.study import round_cost
from wispsim.study.experiments.run import Context, Section, md_table
from wispsim.study.experiments.spec import STUDIES, experiments_dir
from wispsim.tabular import read_json


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
    sec.facts.update({"fit": fits.to_dict(orient="records"), "measurements": rel})
    return sec
