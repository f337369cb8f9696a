"""What a verification round costs the serving host's CPU, from ``benchmarks/vllm/round_cost.py``.

The benchmark times vLLM's V1 engine by its parts (one row per round; its docstring names the
parts) for three kinds of work: a re-submitted verification round (``resubmit``), a round of a
session-resident verifier (``resident``) and a running sequence's decode step (``running``). This
module reads that CSV, groups the parts by the process that does them in ``vllm serve``:

- ``api``: ``input`` + ``output`` (the API server process: checking the prompt, building the
  request; turning engine outputs into responses);
- ``engine``: ``request`` + ``hash`` + ``enqueue`` + ``lookup`` + ``allocate`` + ``schedule`` +
  ``update`` + ``rollback`` (the engine core's scheduler side);
- ``runner``: ``prepare`` (the model runner's CPU work before a forward pass);
- ``forward``: the forward pass and sampling (the GPU's work on a GPU host; on the CPU backend,
  CPU time of a tiny model, reported and never used as a GPU cost),

and fits each CPU group with one linear model over every kind, prefix length and batch size::

    ms = step * steps + request * R + arrival * new_requests + session * resumed + token * hashed

where a step schedules R requests, ``new_requests`` is how many arrived as new requests (every
re-submitted round), ``resumed`` how many resident sessions took a round, and ``hashed`` the
prompt tokens the engine core hashed (a new request: its whole prompt, ``context`` plus its
drafts; a resident or running one: only its new tokens). Those are the terms a host-CPU model
of the simulator would charge.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from wispsim.errors import ConfigError
from wispsim.tabular import numeric_column, read_table

GROUPS: dict[str, tuple[str, ...]] = {
    "api": ("input", "output"),
    "engine": ("request", "hash", "enqueue", "lookup", "allocate", "schedule", "update", "rollback"),
    "runner": ("prepare",),
    "forward": ("forward",),
}
PARTS = tuple(p for parts in GROUPS.values() for p in parts)
KINDS = ("resubmit", "resident", "running")
TERMS = ("step", "request", "arrival", "session", "token")
COLUMNS = ("kind", "prefix", "batch", "round", "k", "wall", *PARTS, "tokens", "steps", "new", "context")


def load(path: Path) -> pd.DataFrame:
    """The benchmark's rows, checked: the columns it writes and its three kinds."""
    src = str(path)
    df = read_table(path, kind="csv", columns=COLUMNS)
    bad = sorted(set(df["kind"].astype(str)) - set(KINDS))
    if bad:
        raise ConfigError(src, "kind", f"{bad[0]!r} is not one of {', '.join(KINDS)}")
    for c in ("prefix", "batch", "round", "k", "tokens", "steps", "new"):
        df[c] = numeric_column(df, c, src, integer=True, lo=0)
    for c in ("wall", "context", *PARTS):
        df[c] = numeric_column(df, c, src, lo=-1e-3)  # exclusive times: clock jitter may dip below 0
    if (df["batch"] < 1).any():
        raise ConfigError(src, "batch", "must be >= 1")
    return df


def features(df: pd.DataFrame) -> pd.DataFrame:
    """The fit's regressors per row (module docs)."""
    resub, resident = df["kind"] == "resubmit", df["kind"] == "resident"
    per = df["new"] / df["batch"]  # the tokens a round brings
    return pd.DataFrame(
        {
            "step": df["steps"].astype(float),
            "request": df["batch"].astype(float) * df["steps"],
            "arrival": df["batch"].where(resub, 0).astype(float),
            "session": df["batch"].where(resident, 0).astype(float),
            "token": np.where(resub, df["batch"] * (df["context"] + per), df["new"]).astype(float),
        },
        index=df.index,
    )


def grouped(df: pd.DataFrame) -> pd.DataFrame:
    """Milliseconds per group (``api``, ``engine``, ``runner``, ``forward``) and the round's wall."""
    out = pd.DataFrame({g: df[list(parts)].sum(axis=1) * 1e3 for g, parts in GROUPS.items()}, index=df.index)
    out["wall"] = df["wall"] * 1e3
    return out


def fit(df: pd.DataFrame, group: str) -> tuple[dict[str, float], dict[str, float]]:
    """Non-negative least squares of one group's ms on :func:`features`; returns the coefficients
    (ms per unit) and the fit's R^2 and median absolute percentage error over the rows."""
    from scipy.optimize import nnls

    x = features(df)
    y = grouped(df)[group].to_numpy()
    cols = [c for c in TERMS if x[c].abs().sum() > 0]
    coef, _ = nnls(x[cols].to_numpy(), y)
    pred = x[cols].to_numpy() @ coef
    r2 = 1 - float(np.sum((y - pred) ** 2) / np.sum((y - y.mean()) ** 2))
    ape = float(np.median(np.abs(pred - y) / np.maximum(y, 1e-9)) * 100)
    return {c: float(coef[cols.index(c)]) if c in cols else 0.0 for c in TERMS}, {"r2": r2, "mape_pct": ape}


def per_round(df: pd.DataFrame) -> pd.DataFrame:
    """Median milliseconds per round (per sequence for ``running``) by kind, batch and prefix:
    every group, the recomputed tail (tokens forwarded beyond the round's new ones)."""
    g = grouped(df).div(df["batch"], axis=0)
    g["tail"] = (df["tokens"] - df["new"]) / df["batch"]
    g[["kind", "batch", "prefix"]] = df[["kind", "batch", "prefix"]]
    return g.groupby(["kind", "batch", "prefix"], sort=False).median().reset_index()


def summary(path: Path, warm: int = 1) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The per-round table and the fitted coefficients of every CPU group (rows: group; columns:
    the terms in ms, R^2, MAPE), over rounds past the first ``warm`` of each configuration."""
    df = load(path)
    df = df[df["round"] >= warm]
    fits = []
    for group in ("api", "engine", "runner"):
        coef, score = fit(df, group)
        fits.append({"group": group, **coef, **score})
    return per_round(df), pd.DataFrame(fits)


API_COLUMNS = ("prefix", "round", "k", "tokens", "client", "e2e")
LOAD_COLUMNS = ("concurrency", "prefix", "rounds", "wall_s", "rounds_per_s", "mean_ms", "p50_ms", "p90_ms")


def api_summary(path: Path, warm: int = 1) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``benchmarks/vllm/api_cost.py``'s two tables: per prefix, the median client latency of a
    re-submitted round through ``vllm serve`` and the server's own end-to-end latency (ms), and
    the load table (rounds per second and latency at each concurrency) as measured."""
    src = str(path)
    df = read_table(path, kind="csv", columns=API_COLUMNS)
    for c in ("prefix", "round", "k", "tokens"):
        df[c] = numeric_column(df, c, src, integer=True, lo=0)
    df["client"] = numeric_column(df, "client", src, lo=0)
    df["e2e"] = numeric_column(df, "e2e", src, lo=0, allow_empty=True)
    df = df[df["round"] >= warm]
    serial = (
        df.assign(client=df["client"] * 1e3, e2e=df["e2e"] * 1e3, http=(df["client"] - df["e2e"]) * 1e3)
        .groupby("prefix")[["client", "e2e", "http"]]
        .median()
        .reset_index()
    )
    lpath = path.with_name(path.stem + "-load.csv")
    load = read_table(lpath, kind="csv", columns=LOAD_COLUMNS)
    for c in LOAD_COLUMNS:
        load[c] = numeric_column(load, c, str(lpath), lo=0)
    return serial, load


CPU_COLUMNS = ("prefix", "rounds", "wall_s", "api_cpu_ms", "engine_cpu_ms")
TOKENIZE_COLUMNS = ("kind", "target_tokens", "tokens", "encode_ms", "us_per_token")


def api_cpu(path: Path) -> pd.DataFrame:
    """``api_cost.py``'s CPU table: per prefix, the API-server and engine-core processes' CPU
    milliseconds per re-submitted round (their idle spending taken off)."""
    df = read_table(path, kind="csv", columns=CPU_COLUMNS)
    for c in CPU_COLUMNS:
        df[c] = numeric_column(df, c, str(path), lo=None if c.endswith("cpu_ms") else 0)
    return df


STREAM_COLUMNS = ("endpoint", "stream", "concurrency", "max_tokens", "requests", "output_tokens", "chunks",
                  "steps", "wall_s", "api_cpu_s")  # fmt: skip
STREAM_TERMS = ("request", "chat", "token", "chunk", "step")


def stream_cpu(path: Path) -> pd.DataFrame:
    """``stream_cost.py``'s table: per cell (endpoint, streamed or not, concurrency, ``max_tokens``),
    the API-server process's CPU seconds for its requests, output tokens, chunks received and engine steps."""
    df = read_table(path, kind="csv", columns=STREAM_COLUMNS)
    src = str(path)
    bad = sorted(set(df["endpoint"]) - {"completions", "chat", "reference"})
    if bad:
        raise ConfigError(src, "endpoint", f"got {bad[0]!r}; allowed: completions, chat, reference")
    for c in STREAM_COLUMNS[2:]:
        df[c] = numeric_column(df, c, src, lo=0)
    if (df["api_cpu_s"] <= 0).any():
        raise ConfigError(src, "api_cpu_s", "must be > 0 in every cell (CPU seconds less the idle rate)")
    return df


def stream_terms(df: pd.DataFrame, measuring_round_ms: float | None = None) -> dict[str, float]:
    """The API server's CPU for a response by its parts, ms (non-negative least squares over the
    cells, each cell's relative error weighted equally)::

        cpu = request x N + chat x N_chat + token x N_tokens + chunk x N_chunks + step x N_steps

    ``step``: the engine's steps (each one message to the API server, walked once), ``token``:
    output tokens (detokenized), ``chunk``: streamed chunks (a server-sent event each). Also the
    fit's median and largest absolute relative error over the cells, and ``host_scale``: where the
    table has its ``reference`` row (a verification round as ``api_cost.py`` measures it) and the
    measuring host's round is given (``measuring_round_ms``), the parts are scaled by the measuring
    host's round over this host's, so that every term is the measuring host's (1 otherwise)."""
    from scipy.optimize import nnls

    here = reference_round_ms(df)
    df = df[df["endpoint"] != "reference"]
    scale = 1.0
    if measuring_round_ms is not None and here:
        scale = measuring_round_ms / here

    n = df["requests"].to_numpy(float)
    x = np.column_stack([n, n * (df["endpoint"] == "chat"), df["output_tokens"], df["chunks"], df["steps"]])
    y = df["api_cpu_s"].to_numpy(float) * 1e3
    w = 1.0 / np.maximum(y, 1e-9)
    coef, _ = nnls(x * w[:, None], y * w)
    err = np.abs(x @ coef / y - 1.0)
    return {**{t: float(c) * scale for t, c in zip(STREAM_TERMS, coef, strict=True)},
            "median_error": float(np.median(err)), "max_error": float(err.max()),
            "host_scale": scale}  # fmt: skip


MERGE_COLUMNS = ("concurrency", "hogs", "requests", "output_tokens", "chunks", "steps", "api_cpu_s")
MERGE_TERMS = ("request", "step", "output", "chunk")


def merge_cpu(path: Path) -> pd.DataFrame:
    """``merge_cost.py``'s table: per cell (busy loops beside the API server, ``max_tokens``) the
    API-server process's CPU seconds for its streamed requests, tokens, chunks received and steps."""
    df = read_table(path, kind="csv", columns=("endpoint", *MERGE_COLUMNS))
    src = str(path)
    for c in MERGE_COLUMNS:
        df[c] = numeric_column(df, c, src, lo=0)
    cells = df[df["endpoint"] != "reference"]
    if cells.empty or (cells["api_cpu_s"] <= 0).any():
        raise ConfigError(src, "api_cpu_s", "needs cells, each > 0 (CPU seconds of the API server)")
    if not (cells["chunks"] < 0.9 * cells["output_tokens"]).any():
        raise ConfigError(
            src, "chunks", "no cell merged (chunks < 0.9 x tokens): the split is not identified"
        )
    return df


def merge_terms(df: pd.DataFrame, step_ms: float) -> dict[str, float]:
    """What a merge saves, at the measuring table's host (non-negative least squares over its
    cells, each cell's relative error weighted equally)::

        cpu = request x N + step x N_steps + output x N_tokens + chunk x N_chunks

    with ``step`` given (``step_ms``: the step message's cost, which ``stream_cost.py``'s cells
    identify and these do not -- their steps rise and fall with their outputs -- scaled to this
    host by the verification round both measured). ``output``: the output handler's work per
    request and step (one token each in these cells), which every step's output costs; ``chunk``:
    a request's task taking what its collector holds and writing one server-sent event, which a
    merge saves. ``chunk_share`` = chunk / (output + chunk): the share of ``stream_cost.py``'s
    per-chunk cost (measured unmerged, one chunk an output) that a merge saves. Also the fit's
    median and largest absolute relative error."""
    from scipy.optimize import nnls

    df = df[df["endpoint"] != "reference"]
    x = df[["requests", "output_tokens", "chunks"]].to_numpy(float)
    y = df["api_cpu_s"].to_numpy(float) * 1e3
    w = 1.0 / np.maximum(y, 1e-9)
    steps = step_ms * df["steps"].to_numpy(float)
    coef, _ = nnls(x * w[:, None], (y - steps) * w)
    err = np.abs((x @ coef + steps) / y - 1.0)
    terms = {"request": float(coef[0]), "step": step_ms, "output": float(coef[1]), "chunk": float(coef[2])}
    per_output = terms["output"] + terms["chunk"]
    return {**terms, "chunk_share": terms["chunk"] / per_output if per_output > 0 else 0.0,
            "median_error": float(np.median(err)), "max_error": float(err.max())}  # fmt: skip


def reference_round_ms(df: pd.DataFrame) -> float | None:
    """The table's ``reference`` row (a verification round as ``api_cost.py`` measures it), ms
    of API CPU a round; None where it has none."""
    ref = df[df["endpoint"] == "reference"]
    return float((ref["api_cpu_s"] / ref["requests"]).median()) * 1e3 if len(ref) else None


TRANSPORT_COLUMNS = ("run", "server", "kind", "transport", "prefix", "rounds", "wall_s", "api_cpu_ms")


def transport_cpu(path: Path) -> pd.DataFrame:
    """``transport_cost.py``'s table: per (server, transport, prefix) the API side's CPU per round:
    vLLM's OpenAI server re-submitting over HTTP, ``wispsim serve``'s resident sessions over HTTP
    and over gRPC (the engine's own CPU taken out)."""
    df = read_table(path, kind="csv", columns=TRANSPORT_COLUMNS)
    src = str(path)
    for col, allowed in (("server", {"vllm-openai", "wispsim-serve"}), ("transport", {"http", "grpc"})):
        bad = sorted(set(df[col]) - allowed)
        if bad:
            raise ConfigError(src, col, f"got {bad[0]!r}; allowed: {', '.join(sorted(allowed))}")
    for c in ("run", *TRANSPORT_COLUMNS[4:]):
        df[c] = numeric_column(df, c, src, lo=0)
    for server, transport in (("vllm-openai", "http"), ("wispsim-serve", "http"), ("wispsim-serve", "grpc")):
        if not ((df["server"] == server) & (df["transport"] == transport)).any():
            raise ConfigError(src, "server", f"has no {server} row over {transport}; rerun transport_cost.py")
    return df


def transport_terms(df: pd.DataFrame, measuring_round_ms: float) -> dict[str, float]:
    """A resident round's API-side CPU, ms at the measuring host's speed: ``session`` over HTTP and
    ``grpc_session`` over gRPC (the median over prefixes and repeats: a resident round sends its
    drafts only), each scaled by the measuring host's re-submitted round over this host's
    (``vllm-openai`` at its smallest prefix, median over repeats, the round ``api_cost.py``
    measured there); ``host_scale`` that ratio."""
    ref = df[df["server"] == "vllm-openai"]
    here = float(ref.loc[ref["prefix"] == ref["prefix"].min(), "api_cpu_ms"].median())
    scale = measuring_round_ms / here if here > 0 else 1.0
    by = df[df["server"] == "wispsim-serve"].groupby("transport")["api_cpu_ms"].median()
    return {
        "session": float(by["http"]) * scale,
        "grpc_session": float(by["grpc"]) * scale,
        "host_scale": scale,
    }


def host_cpu_terms(
    fits: pd.DataFrame,
    cpu: pd.DataFrame,
    tokenize: pd.DataFrame,
    stream: dict[str, float] | None = None,
    transport: dict[str, float] | None = None,
    merge: dict[str, float] | None = None,
) -> dict[str, dict[str, float]]:
    """The simulator's host-CPU terms in ms (:mod:`wispsim.model.host_cpu`):

    - the engine core: the ``engine`` and ``runner`` groups' fits added (the model runner's input
      preparation runs in the engine-core process of a one-GPU replica);
    - the API server: the API-server process's whole CPU per re-submitted round through HTTP,
      fitted as ``request + ids * tokens`` over the prefixes (the ids are parsed and validated,
      not tokenized); ``session`` is ``request`` less what the in-process timers measured a
      resident round to save (the ``api`` fit's arrival - session); ``text`` is tokenization per
      prompt token of a text prompt (median of the random-dataset prompts, ``tokenize_cost.py``);
      ``step``, ``token``, ``chunk`` and ``chat``: a response's output through the process and the
      chat endpoint's extra (``stream``: :func:`stream_terms`; 0 without it), the chunk's cost
      (one chunk an output where it was measured) split by ``merge`` (:func:`merge_terms`) into
      ``output``, which every output pays, and ``chunk``, which a merge saves (``chunk_share`` of
      it; without ``merge`` all of it is ``chunk``); ``session`` and
      ``grpc_session``, a resident round over HTTP and over gRPC, measured (``transport``:
      :func:`transport_terms`; without it ``session`` as above and ``grpc_session`` unmeasured,
      left out).
    """
    from scipy.optimize import nnls

    by = fits.set_index("group")
    engine = {t: float(by.loc["engine", t] + by.loc["runner", t]) for t in TERMS}
    tokens = cpu["prefix"].to_numpy(float)
    x = np.column_stack([np.ones_like(tokens), tokens])
    (request, ids), _ = nnls(x, cpu["api_cpu_ms"].to_numpy(float))
    saved = max(float(by.loc["api", "arrival"] - by.loc["api", "session"]), 0.0)
    text = tokenize[tokenize["kind"] == "random-dataset"]
    session = transport["session"] if transport else max(float(request) - saved, 0.0)
    grpc = {"grpc_session": transport["grpc_session"]} if transport else {}
    per_output = float((stream or {}).get("chunk", 0.0))
    share = float(merge["chunk_share"]) if merge else 1.0
    return {
        "engine_core_ms": engine,
        "api_server_ms": {
            "request": float(request),
            "session": session,
            **grpc,
            "ids": float(ids),
            "text": float(text["us_per_token"].median()) / 1e3,
            **{t: float((stream or {}).get(t, 0.0)) for t in ("step", "token", "chat")},
            "output": per_output * (1.0 - share),
            "chunk": per_output * share,
        },
    }
