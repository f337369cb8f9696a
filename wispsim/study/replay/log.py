"""Per-round logs of speculative deployments, and replaying them (SPEC 5; docs/replay.md).

A **replay log** has one row per verification round, in Parquet or CSV (chosen by the file's
suffix), with a JSON sidecar ``LOG.meta.json``. :data:`COLUMNS` is the format: the device-side
columns (device, slo, response, round, response_start, prompt_tokens, output_tokens, position,
t_start, draft_s, up_s, t_arrival, down_s, t_end, drafted, accepted, committed, measured) are
required; the recorded server-side outcomes (queue_s, verify_s, t_dispatch, batch, replica) may be
missing or empty. Times are seconds from one common origin. The sidecar holds the measurement
``window`` [start, end) (required) and, optionally, where the log came from, the resolved
scenario, and the responses that started but completed no round before recording stopped
(``unfinished``).

- :func:`write_log` writes a log from a :class:`~wispsim.sim.engine.SimResult`
  (``wispsim run --log``); :func:`read_log` reads and checks one (any problem is a one-line
  :class:`~wispsim.errors.ConfigError` naming the file and the column).
- :func:`replay` drives the simulator with the recorded device-side behaviour: every recorded
  device walks its responses in order (each starts after the previous one ends plus the recorded
  gap), and each round waits its recorded draft and uplink time, asks the simulated server with
  the recorded k, accepted and committed tokens, and waits its recorded downlink time. Only the
  server side is simulated, so any scheduler, prefix cache, profile, replica count or router can
  be asked "what if". A per-round log has no draft features, so another drafting controller
  cannot be replayed (acceptance traces are the tool for that). Under ``centralized`` serving the
  recorded responses (start gaps, prompt and output lengths, first uplink and last downlink time)
  go to the centralized engine instead.
- :func:`compare` puts recorded and simulated outcomes side by side per class.

Responses still running when recording stopped count as violations on the recorded side, as
wispsim counts its censored responses. The replay leaves such a response open where it got no
further than the recording, so the simulator censors it the same way; where the replay got
further (a faster server), the outcome is unknown and the response is left out (``truncated``).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pandas as pd

from wispsim.errors import ConfigError

if TYPE_CHECKING:
    from wispsim.config import Scenario
    from wispsim.sim.context import RunContext
    from wispsim.sim.records import SimResult

FORMAT = "wispsim replay log 1"
SUFFIXES = (".parquet", ".csv")


@dataclass(frozen=True, slots=True)
class Column:
    """One column of the log: ``kind`` is int, float, time (seconds, >= 0) or bool."""

    name: str
    kind: str
    unit: str
    meaning: str
    required: bool = True
    may_be_empty: bool = False


COLUMNS: tuple[Column, ...] = (
    Column("device", "int", "-", "device id"),
    Column("slo", "float", "tokens/s", "the device's SLO class: target token speed"),
    Column("response", "int", "-", "response id, unique in the log"),
    Column("round", "int", "-", "index of the round within its response: 0, 1, 2, ..."),
    Column("response_start", "time", "s", "when the user asked (t0; the response's speed counts from here)"),
    Column("prompt_tokens", "int", "tokens", "prompt length"),
    Column(
        "output_tokens",
        "int",
        "tokens",
        "output length; empty if the response was unfinished when recording stopped and is unknown",
        may_be_empty=True,
    ),
    Column("position", "int", "tokens", "output tokens committed before this round"),
    Column("t_start", "time", "s", "drafting of this round starts"),
    Column("draft_s", "time", "s", "drafting time of the round (forward passes and predictor calls)"),
    Column("up_s", "time", "s", "uplink transfer time (the first round also carries the prompt)"),
    Column("t_arrival", "time", "s", "the round arrives at the server"),
    Column("queue_s", "time", "s", "waiting in the server's queue", required=False, may_be_empty=True),
    Column("verify_s", "time", "s", "GPU time of the round's batch", required=False, may_be_empty=True),
    Column("t_dispatch", "time", "s", "the round's batch starts", required=False, may_be_empty=True),
    Column("batch", "int", "-", "id of the round's batch", required=False, may_be_empty=True),
    Column("replica", "int", "-", "verifier replica that ran the batch", required=False, may_be_empty=True),
    Column("down_s", "time", "s", "downlink transfer time of the verdict"),
    Column("t_end", "time", "s", "the verdict is back at the device"),
    Column("drafted", "int", "tokens", "draft tokens sent for verification (k >= 1)"),
    Column("accepted", "int", "tokens", "accepted draft tokens (L <= k)"),
    Column("committed", "int", "tokens", "tokens committed (L + 1, less if the response ended)"),
    Column("measured", "bool", "-", "the response started inside the measurement window"),
)
COLUMN_NAMES = tuple(c.name for c in COLUMNS)
REQUIRED = tuple(c.name for c in COLUMNS if c.required)
SERVER_SIDE = ("queue_s", "verify_s", "t_dispatch", "batch", "replica")
UNFINISHED_KEYS = (
    "device",
    "slo",
    "response",
    "response_start",
    "prompt_tokens",
    "output_tokens",
    "measured",
)


def meta_path(path: str | Path) -> Path:
    """The sidecar of log ``path``: ``LOG.meta.json``."""
    p = Path(path)
    return p.with_name(p.name + ".meta.json")


# ------------------------------------------------------------------------------------------
# writing
# ------------------------------------------------------------------------------------------


def log_frame(result: SimResult) -> pd.DataFrame:
    """The log of a speculative run: one row per completed round (columns :data:`COLUMN_NAMES`)."""
    r = result.rounds
    resp = result.responses.set_index("response")
    # a response still running, unmeasured, when the run ended has no response record: its start
    # is its first round's start and its prompt follows from that round's tokens
    first = r[r["round"] == 0].set_index("response")
    ids = r.response
    start = ids.map(resp.t_start).fillna(ids.map(first.t_start))
    prompt = ids.map(resp.prompt_len).fillna(ids.map(first.l_new + first.l_cached - first.k - first.position))
    b = result.batches
    replica_of = pd.Series(b.replica.to_numpy(), index=b.batch.to_numpy(), dtype="int64")
    out = pd.DataFrame(
        {
            "device": r.device,
            "slo": r.slo,
            "response": ids,
            "round": r["round"],
            "response_start": start,
            "prompt_tokens": prompt.astype("int64"),
            "output_tokens": ids.map(resp.output_len).astype("Int64"),
            "position": r.position,
            "t_start": r.t_start,
            "draft_s": r.draft_time,
            "up_s": r.uplink_time,
            "t_arrival": r.arrival,
            "queue_s": r.dispatch - r.arrival,
            "verify_s": r.verify_time,
            "t_dispatch": r.dispatch,
            "batch": r.batch,
            "replica": r.batch.map(replica_of).astype("Int64"),
            "down_s": r.downlink_time,
            "t_end": r.t_end,
            "drafted": r.k,
            "accepted": r.accepted,
            "committed": r.committed,
            "measured": r.measured,
        }
    )
    return out.reset_index(drop=True)


def _unfinished(result: SimResult) -> list[dict[str, Any]]:
    """Responses recorded as censored that completed no round (so absent from the rounds)."""
    resp = result.responses
    gone = resp[~resp.response.isin(result.rounds.response)]
    return [
        {
            "device": int(x["device"]),
            "slo": float(x["slo"]),
            "response": int(x["response"]),
            "response_start": float(x["t_start"]),
            "prompt_tokens": int(x["prompt_len"]),
            "output_tokens": int(x["output_len"]),
            "measured": bool(x["measured"]),
        }
        for x in gone.to_dict("records")
    ]


def write_log(result: SimResult, path: str | Path) -> Path:
    """Write the per-round log of ``result`` to ``path`` (.parquet or .csv) and its sidecar."""
    from wispsim import __version__

    p = Path(path)
    if p.suffix.lower() not in SUFFIXES:
        raise ConfigError(str(p), "", f"unknown log format {p.suffix!r}; name it .parquet or .csv")
    sc = result.scenario
    if sc.server.mode == "centralized" or not len(result.rounds):
        raise ConfigError(
            str(p),
            "",
            f"a {sc.policy} run has no verification rounds; replay needs the log of a speculative "
            "run (wisp, sled, fcfs, wisp-fixed)",
        )
    df = log_frame(result)
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.suffix.lower() == ".csv":
        df.to_csv(p, index=False, float_format="%.17g")
    else:
        df.to_parquet(p, index=False)
    meta = {
        "format": FORMAT,
        "source": "wispsim run",
        "policy": sc.policy,
        "seed": result.seed,
        "scenario_name": sc.name,
        "window": list(result.window),
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "wispsim_version": __version__,
        "devices": result.devices,
        "sim_end": result.sim_end,
        "unfinished": _unfinished(result),
        "scenario": sc.to_dict(),
    }
    meta_path(p).write_text(json.dumps(meta, indent=1))
    return p


# ------------------------------------------------------------------------------------------
# reading and checking
# ------------------------------------------------------------------------------------------


def _read_table(p: Path, src: str) -> pd.DataFrame:
    if p.suffix.lower() not in SUFFIXES:
        raise ConfigError(src, "", f"unknown log format {p.suffix!r}; a replay log is .parquet or .csv")
    if not p.is_file():
        raise ConfigError(src, "", "file not found")
    try:
        if p.suffix.lower() == ".csv":
            # exact floats (pandas 3 parses them exactly by default and deprecates the option)
            exact = {"float_precision": "round_trip"} if pd.__version__.startswith(("1.", "2.")) else {}
            return pd.read_csv(p, low_memory=False, **exact)  # type: ignore[call-overload]
        return pd.read_parquet(p)
    except Exception as e:  # pyarrow, parser and OS errors all mean the same to the user
        kind = "CSV" if p.suffix.lower() == ".csv" else "Parquet"
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise ConfigError(src, "", f"cannot read as {kind}: {first}") from None


def _fail(src: str, column: str, bad: np.ndarray, problem: str) -> None:
    """Raise for the first row where ``bad`` holds (rows counted from 1, header excluded)."""
    rows = np.flatnonzero(bad)
    if rows.size:
        raise ConfigError(src, column, f"row {int(rows[0]) + 1}: {problem}")


def _numeric(df: pd.DataFrame, src: str) -> dict[str, np.ndarray]:
    cols: dict[str, np.ndarray] = {}
    for c in COLUMNS:
        if c.kind == "bool":
            continue
        raw = df[c.name]
        x = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
        _fail(src, c.name, raw.notna().to_numpy() & np.isnan(x), "not a number")
        missing = ~np.isfinite(x)
        if not c.may_be_empty:
            _fail(src, c.name, missing, "must be a finite number")
        ok = ~missing
        if c.kind in ("int", "time"):
            _fail(src, c.name, ok & (x < 0), "must be >= 0")
        if c.kind == "int":
            _fail(src, c.name, ok & (x != np.round(x)), "must be an integer")
        cols[c.name] = x
    return cols


def _bools(df: pd.DataFrame, src: str) -> np.ndarray:
    raw = df["measured"]
    if raw.dtype == bool:
        return raw.to_numpy()
    text = raw.astype(str).str.strip().str.lower()
    truth = {"true": True, "1": True, "1.0": True, "false": False, "0": False, "0.0": False}
    bad = ~text.isin(truth).to_numpy()
    _fail(src, "measured", bad, "must be true or false")
    return text.map(truth).to_numpy(dtype=bool)


def _check_rows(x: dict[str, np.ndarray], src: str) -> None:
    k, acc, com = x["drafted"], x["accepted"], x["committed"]
    _fail(src, "slo", x["slo"] <= 0, "a token speed must be > 0")
    _fail(src, "drafted", k < 1, "a round sends at least one draft token")
    _fail(src, "accepted", acc > k, "must be <= drafted")
    _fail(src, "committed", com < 1, "a round commits at least one token")
    _fail(src, "committed", com > acc + 1, "must be <= accepted + 1")
    _fail(src, "output_tokens", x["output_tokens"] < 1, "a response has >= 1 output token")
    over = x["position"] + com > x["output_tokens"]  # False where the length is unknown (NaN)
    _fail(src, "committed", over, "position + committed exceeds output_tokens")
    _fail(src, "t_arrival", x["t_arrival"] < x["t_start"], "the round arrives before it starts")
    _fail(src, "t_end", x["t_end"] < x["t_arrival"], "the verdict is back before the round arrived")


def _check_responses(df: pd.DataFrame, src: str) -> None:
    """Per response: the same device, class, start, lengths and flag; rounds 0, 1, ...; positions
    add up."""
    g = df.groupby("response", sort=False)
    for col in ("device", "slo", "response_start", "prompt_tokens", "output_tokens", "measured"):
        # NaN-aware: a column is constant in a response when it has one distinct value (or none)
        n = g[col].nunique(dropna=False)
        if (n > 1).any():
            raise ConfigError(src, col, f"response {n.index[n > 1][0]}: differs between its rounds")
    expect = g.cumcount().to_numpy()
    bad = df["round"].to_numpy() != expect
    if bad.any():
        rid = df.response.to_numpy()[bad][0]
        raise ConfigError(src, "round", f"response {rid}: rounds must be numbered 0, 1, 2, ... without gaps")
    before = (g.committed.cumsum() - df.committed).to_numpy()
    bad = df.position.to_numpy() != before
    if bad.any():
        rid = df.response.to_numpy()[bad][0]
        raise ConfigError(
            src, "position", f"response {rid}: position must be the tokens committed by earlier rounds"
        )


def _read_meta(p: Path) -> dict[str, Any]:
    mp = meta_path(p)
    src = str(mp)
    if not mp.is_file():
        raise ConfigError(
            src, "", 'sidecar not found; it must hold at least {"window": [start_s, end_s]} (docs/replay.md)'
        )
    try:
        meta = json.loads(mp.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(src, "", f"not readable JSON: {str(e).splitlines()[0]}") from None
    if not isinstance(meta, dict):
        raise ConfigError(src, "", "must be a JSON object")
    w = meta.get("window")
    ok = (
        isinstance(w, list)
        and len(w) == 2
        and all(isinstance(v, int | float) and math.isfinite(v) for v in w)
        and 0 <= w[0] < w[1]
    )
    if not ok:
        raise ConfigError(src, "window", f"must be [start_s, end_s] with 0 <= start < end, got {w!r}")
    unf = meta.setdefault("unfinished", [])
    if not isinstance(unf, list) or not all(
        isinstance(u, dict) and set(UNFINISHED_KEYS) <= set(u) for u in unf
    ):
        raise ConfigError(
            src, "unfinished", f"must be a list of objects with keys {', '.join(UNFINISHED_KEYS)}"
        )
    for i, u in enumerate(unf):
        nums = [u[k] for k in UNFINISHED_KEYS if k != "measured"]
        if not all(isinstance(v, int | float) and math.isfinite(v) and v >= 0 for v in nums) or u["slo"] <= 0:
            raise ConfigError(src, f"unfinished[{i}]", "needs finite numbers >= 0 and slo > 0")
    if "scenario" in meta and not isinstance(meta["scenario"], dict):
        raise ConfigError(src, "scenario", "must be a mapping (the resolved scenario)")
    return meta


def read_log(path: str | Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Read and check a replay log and its sidecar: (rows sorted by response and round, meta).

    Optional server-side columns that are absent come back empty (NaN); the columns that may be
    empty (output_tokens, batch, replica) are floats, the other integers int64."""
    p = Path(path)
    src = str(p)
    df = _read_table(p, src)
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise ConfigError(
            src,
            missing[0],
            f"missing column(s) {', '.join(missing)}; a replay log needs {', '.join(REQUIRED)}",
        )
    if df.empty:
        raise ConfigError(src, "", "no rows")
    df = df.reset_index(drop=True)
    for c in SERVER_SIDE:
        if c not in df.columns:
            df[c] = np.nan
    x = _numeric(df, src)
    measured = _bools(df, src)
    _check_rows(x, src)
    out = pd.DataFrame({c.name: x[c.name] for c in COLUMNS if c.kind != "bool"})
    for column in COLUMNS:
        if column.kind == "int" and not column.may_be_empty:
            out[column.name] = out[column.name].astype("int64")
    out["measured"] = measured
    out = out[list(COLUMN_NAMES)]
    dup = out.duplicated(["response", "round"]).to_numpy()
    _fail(src, "round", dup, "the same (response, round) appears twice")
    out = out.sort_values(["response", "round"], kind="stable").reset_index(drop=True)
    _check_responses(out, src)
    meta = _read_meta(p)
    w0, w1 = meta["window"]
    start = out.response_start.to_numpy()
    inside = (w0 <= start) & (start < w1)
    bad = inside != out.measured.to_numpy()
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        where = "inside" if inside[i] else "outside"
        raise ConfigError(
            src,
            "measured",
            f"response {out.response[i]}: measured is {bool(out.measured[i])} but it starts at "
            f"{start[i]:g} s, {where} the sidecar's window [{w0:g}, {w1:g})",
        )
    return out, meta


# ------------------------------------------------------------------------------------------
# replay
# ------------------------------------------------------------------------------------------


class _Round(NamedTuple):
    """One recorded round, as the replayed device needs it."""

    lead: float  # device-side time before drafting: since the previous verdict (or t0)
    draft: float
    up: float
    down: float
    k: int
    accepted: int
    committed: int
    position: int


LEAD_NOISE_S = 1e-9  # shorter device-side leads are float rounding of the recorder, not time


@dataclass(slots=True)
class _Response:
    log_id: int
    slo: float
    start: float
    prompt: int
    output: int  # a lower bound if unknown (unfinished when recording stopped)
    rounds: list[_Round]
    finished: bool
    known: bool  # output length known
    measured: bool  # in the recording
    elapsed: float  # recorded time from its start to its last verdict (0 if no round)
    gap: float = 0.0  # from the end of the device's previous response (from t=0 for its first)


def _plan(log: pd.DataFrame, meta: Mapping[str, Any]) -> dict[int, list[_Response]]:
    """Each device's recorded responses in start order, with the gap before each."""
    per_dev: dict[int, list[tuple[_Response, float]]] = {}
    log = log.sort_values(["response", "round"], kind="stable")
    rid = log.response.to_numpy()
    col = {
        c: log[c].to_numpy().tolist()
        for c in ("device", "slo", "response_start", "prompt_tokens", "t_end", "measured")
    }
    output = log.output_tokens.to_numpy(float)
    # the device's own time before each round's drafting starts: after the previous verdict, or
    # after response_start for a first round
    first = log["round"].to_numpy() == 0
    before = np.where(first, log.response_start.to_numpy(), np.r_[0.0, log.t_end.to_numpy()[:-1]])
    lead = log.t_start.to_numpy() - before
    lead[lead < LEAD_NOISE_S] = 0.0
    rounds: list[_Round] = list(
        map(
            _Round,
            lead.tolist(),
            log.draft_s.tolist(),
            log.up_s.tolist(),
            log.down_s.tolist(),
            log.drafted.tolist(),
            log.accepted.tolist(),
            log.committed.tolist(),
            log.position.tolist(),
        )
    )
    firsts = np.flatnonzero(np.r_[True, rid[1:] != rid[:-1]]).tolist()
    for a, b in zip(firsts, [*firsts[1:], len(rid)], strict=True):
        last = rounds[b - 1]
        done = last.position + last.committed
        known = bool(np.isfinite(output[a]))
        out = int(output[a]) if known else done + 1  # a lower bound: it was still running
        r = _Response(
            int(rid[a]),
            col["slo"][a],
            col["response_start"][a],
            col["prompt_tokens"][a],
            out,
            rounds[a:b],
            known and done >= out,
            known,
            col["measured"][a],
            col["t_end"][b - 1] - col["response_start"][a],
        )
        per_dev.setdefault(col["device"][a], []).append((r, col["t_end"][b - 1]))
    for u in meta.get("unfinished", []):
        r = _Response(
            int(u["response"]),
            float(u["slo"]),
            float(u["response_start"]),
            int(u["prompt_tokens"]),
            int(u["output_tokens"]),
            [],
            False,
            True,
            bool(u["measured"]),
            0.0,
        )
        per_dev.setdefault(int(u["device"]), []).append((r, r.start))
    plan: dict[int, list[_Response]] = {}
    for dev, items in per_dev.items():
        items.sort(key=lambda it: (it[0].start, it[0].log_id))
        prev_end = 0.0
        for r, end in items:
            r.gap = max(r.start - prev_end, 0.0)
            prev_end = end
        plan[dev] = [r for r, _ in items]
    return plan


@dataclass(slots=True)
class _Book:
    """What a replay notes besides the records: simulated -> log response ids, and the measured
    responses whose outcome the log cannot tell (id -> class)."""

    ids: dict[int, int]
    truncated: dict[int, float]


def _log_ends(ctx: RunContext, r: _Response, resp: int, elapsed: float, book: _Book) -> None:
    """The recording stopped inside response ``r``, ``elapsed`` seconds after it started here.

    If the recording measured it, it was counted there as violated (censored: late, or the run
    had to end); if the replay got no further ahead on it (``elapsed`` not below the recorded
    one), that verdict stands: the response stays open and the simulator censors it the same way.
    Otherwise the replay ran into the end of the recording and the outcome is unknown: if the
    replay measures the response and has not censored it yet, it leaves the measured set (noted in
    ``book.truncated``)."""
    if r.measured and elapsed >= r.elapsed - 1e-9:
        return
    if ctx.is_measured(resp) and ctx.close_response(resp):
        book.truncated[resp] = r.slo


def _finish(
    ctx: RunContext, dev: int, r: _Response, resp: int, t0: float, t_end: float, rounds: int, cold: int
) -> None:
    """Record a finished response the way :meth:`wispsim.sim.device.Device._finish` does."""
    if not ctx.close_response(resp):
        return  # already recorded as censored
    speed = r.output / (t_end - t0) if t_end > t0 else math.inf
    ctx.responses.append(
        (
            dev,
            r.slo,
            resp,
            t0,
            t_end,
            r.prompt,
            r.output,
            rounds,
            cold,
            speed,
            speed < r.slo,
            ctx.is_measured(resp),
            False,
        )
    )


def _speculative(
    ctx: RunContext, dev: int, responses: list[_Response], book: _Book
) -> Generator[Any, Any, None]:
    """One recorded device, round by round (mirrors :meth:`wispsim.sim.device.Device.run_speculative`)."""
    from wispsim.sim.verifier import Request

    env = ctx.env
    server = ctx.server
    w = ctx.alpha_ema
    alpha_hat = ctx.alpha_init
    out = ctx.rounds
    req_ids = ctx.request_ids
    timeout, event = env.timeout, env.event
    pending = 0.0  # time owed before the next thing the device does
    for r in responses:
        slo, prompt = r.slo, r.prompt
        pending += r.gap
        t0 = env.now + pending
        resp = ctx.open_response(t0, dev, slo, prompt, r.output)
        book.ids[resp] = r.log_id
        measured = ctx.is_measured(resp)
        t_end = t0
        cold = 0
        for rnd, (lead, draft, up, down, k, accepted, committed, pos) in enumerate(r.rounds):
            if lead:
                pending += lead
            t_start = env.now + pending
            yield timeout(pending + draft + up)
            arrival = env.now
            n_hat = alpha_hat * k + 1.0
            budget = n_hat / slo - draft - up
            prefix = prompt + pos
            req = Request(
                next(req_ids), resp, arrival, arrival + budget, n_hat, k, prefix, prefix + committed, event()
            )
            yield server.submit(req)
            t_end = env.now + down
            cold += req.cold
            # a RoundRecord as a plain tuple; tau_d is drafting time per sent token, and the log
            # does not say how many forward passes and predictor calls it took (-1)
            out.append(
                (
                    dev,
                    slo,
                    resp,
                    rnd,
                    pos,
                    t_start,
                    draft / k,
                    draft,
                    -1,
                    -1,
                    k,
                    accepted,
                    committed,
                    up,
                    arrival,
                    budget,
                    arrival + budget,
                    n_hat,
                    req.dispatch,
                    req.verify_time,
                    req.batch,
                    req.l_new,
                    req.l_cached,
                    req.cold,
                    down,
                    t_end,
                    measured,
                )
            )
            alpha_hat += w * (accepted / k - alpha_hat)
            pending = down
        if r.finished:
            server.drop(resp)
            _finish(ctx, dev, r, resp, t0, t_end, len(r.rounds), cold)
        else:
            _log_ends(ctx, r, resp, t_end - t0, book)


def _centralized(
    ctx: RunContext, dev: int, responses: list[_Response], book: _Book
) -> Generator[Any, Any, None]:
    """One recorded device under centralized serving (mirrors ``Device.run_centralized``): the
    prompt goes up in the first round's uplink time, the output comes back in the last round's
    downlink time."""
    env = ctx.env
    pending = 0.0
    for r in responses:
        pending += r.gap
        t0 = env.now + pending
        resp = ctx.open_response(t0, dev, r.slo, r.prompt, r.output)
        book.ids[resp] = r.log_id
        if not r.rounds or not r.known:
            _log_ends(ctx, r, resp, 0.0, book)  # no uplink time, or an unknown length
            continue
        yield env.timeout(pending + r.rounds[0].lead + r.rounds[0].up)
        done = env.event()
        ctx.central.submit(resp, r.prompt, r.output, done)
        yield done
        down = r.rounds[-1].down
        _finish(ctx, dev, r, resp, t0, env.now + down, r.output, 1)
        pending = down


def replay_scenario(scenario: Scenario, meta: Mapping[str, Any], devices: int) -> Scenario:
    """``scenario`` with the log's measurement window, closed arrivals and its device count (so
    ``measured`` means what it meant in the recording, and scenario.yaml says what ran)."""
    from wispsim.config import ArrivalsConfig

    w0, w1 = (float(v) for v in meta["window"])
    return scenario.replace(
        workload=dataclasses.replace(scenario.workload, warmup_s=w0, duration_s=w1 - w0),
        arrivals=ArrivalsConfig(),
        devices=dataclasses.replace(scenario.devices, count=max(devices, 1)),
    )


def _check_fits(sc: Scenario, log: pd.DataFrame) -> None:
    from wispsim.model.profiles import load_profile

    srv = sc.server
    longest = int((log.prompt_tokens + log.position + log.drafted + 1).max())
    for name in srv.replica_profiles or (srv.profile,):
        cap = load_profile(name).kv_capacity_tokens(srv.gpu_memory_utilization, srv.activation_reserve_gib)
        if longest > cap:
            raise ConfigError(
                name, "", f"a logged round needs {longest} tokens of KV cache, more than its {cap} tokens"
            )


def replay(
    scenario: Scenario, log: pd.DataFrame, meta: Mapping[str, Any], seed: int | None = None
) -> SimResult:
    """Simulate ``scenario``'s server side under the recorded device-side behaviour of ``log``.

    ``seed`` (default: the log's seed, else the scenario's) seeds the server's noise; with the
    policy and seed of a ``wispsim run`` log the run is reproduced. ``info["log_response"]`` maps
    each simulated response id to the log's response id; ``info["truncated"]`` holds the responses
    (id -> class) that the replay measures but whose outcome the log cannot tell, because the
    recording stopped inside them and the replay got further (see :func:`_log_ends`); they are
    left out of the simulated records.
    """
    from wispsim.sim.engine import simulate

    plan = _plan(log, meta)
    sc = replay_scenario(scenario, meta, len(plan))
    _check_fits(sc, log)
    book = _Book({}, {})
    process = _centralized if sc.server.mode == "centralized" else _speculative

    def drive(ctx: RunContext) -> int:
        for dev in sorted(plan):
            ctx.env.process(process(ctx, dev, plan[dev], book))
        return len(plan)

    if seed is None:
        seed = int(meta.get("seed", sc.seed))
    res = simulate(sc, seed=seed, drive=drive)
    res.info["log_response"] = book.ids
    res.info["truncated"] = book.truncated
    return res


def describe(scenario: Scenario, meta: Mapping[str, Any]) -> str:
    """What a replay under ``scenario`` keeps from the log and what it changes (one paragraph)."""
    srv = scenario.server
    recorded = meta.get("policy")
    if srv.mode == "centralized":
        return (
            "centralized: the recorded responses (start gaps, prompt and output lengths, first uplink "
            "and last downlink times) are served by the centralized engine; nothing is drafted"
        )
    what = (
        f"scheduler {srv.scheduler}, prefix cache {'on' if srv.prefix_cache else 'off'}, profile "
        f"{srv.profile}, {srv.replicas} replica(s)" + (f", {srv.router} router" if srv.replicas > 1 else "")
    )
    same = (
        " (the recorded policy)" if recorded == scenario.policy else f" (recorded: {recorded or 'unknown'})"
    )
    return (
        f"{scenario.policy}{same}: the device side (k, acceptance, draft and network times, response "
        f"gaps) is replayed as recorded; only the server side is simulated: {what}. A per-round log has "
        "no draft features, so another drafting controller cannot be replayed (use an acceptance "
        "trace for that)"
    )


def log_scenario(
    meta: Mapping[str, Any], source: str, overrides: Mapping[str, Any] | None = None
) -> Scenario:
    """The scenario stored in the log's sidecar (merged over the default), with ``overrides``."""
    from wispsim.config import Scenario, build, deep_merge, default_scenario_dict
    from wispsim.sim.inputs import check_references

    data = deep_merge(default_scenario_dict(), meta.get("scenario") or {})
    data.pop("arrivals", None)  # replay drives its own arrivals; a trace path may not resolve here
    if overrides:
        data = deep_merge(data, overrides)
    sc: Scenario = build(Scenario, data, source)
    if sc.policy != "custom":
        sc = sc.with_policy(sc.policy, source)
    check_references(sc, source)
    return sc


# ------------------------------------------------------------------------------------------
# recorded versus simulated
# ------------------------------------------------------------------------------------------


def recorded_responses(log: pd.DataFrame, meta: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """One row per logged response: device, class, measured, finished, speed, violated.

    A finished response (its rounds committed ``output_tokens``) is violated when output_tokens /
    (last t_end - response_start) < slo. An unfinished one (recording stopped inside it, or it
    completed no round: ``meta["unfinished"]``) counts as violated, as wispsim counts a censored
    response: it was still running when the run had to end."""
    g = log.groupby("response", sort=True)
    head = g.first()
    last = g.last()
    done = last.position + last.committed
    finished = np.isfinite(head.output_tokens) & (done >= head.output_tokens)
    wall = last.t_end - head.response_start
    speed = np.where(wall > 0, head.output_tokens / wall.where(wall > 0, 1.0), np.inf)
    df = pd.DataFrame(
        {
            "response": head.index.to_numpy(),
            "device": head.device.to_numpy(),
            "slo": head.slo.to_numpy(),
            "measured": head.measured.to_numpy(dtype=bool),
            "finished": finished.to_numpy(),
            "speed": np.where(finished, speed, np.nan),
        }
    )
    unf = pd.DataFrame(list((meta or {}).get("unfinished", [])), columns=list(UNFINISHED_KEYS))
    if len(unf):
        stub = pd.DataFrame(
            {
                "response": unf.response.astype("int64"),
                "device": unf.device.astype("int64"),
                "slo": unf.slo.astype(float),
                "measured": unf.measured.astype(bool),
                "finished": False,
                "speed": np.nan,
            }
        )
        df = pd.concat([df, stub], ignore_index=True)
    df["violated"] = ~df.finished | (df.speed < df.slo)
    return df


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval of a proportion k/n (95% by default)."""
    if n == 0:
        return math.nan, math.nan
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(c - h, 0.0), min(c + h, 1.0)


QUANTILES = (50, 90, 99)


def _times(rec: np.ndarray, sim: np.ndarray, name: str) -> dict[str, float]:
    from scipy.stats import ks_2samp

    rec = rec[np.isfinite(rec)]
    sim = sim[np.isfinite(sim)]
    row: dict[str, float] = {}
    for q in QUANTILES:
        a = float(np.quantile(rec, q / 100)) * 1000 if len(rec) else math.nan
        b = float(np.quantile(sim, q / 100)) * 1000 if len(sim) else math.nan
        row[f"{name}_p{q}_ms_recorded"] = a
        row[f"{name}_p{q}_ms_simulated"] = b
        row[f"{name}_p{q}_ms_diff"] = b - a
    row[f"{name}_ks"] = (
        float(ks_2samp(rec, sim, method="asymp").statistic) if len(rec) and len(sim) else math.nan
    )
    return row


def _compare_row(
    label: str,
    rec: pd.DataFrame,
    sim: pd.DataFrame,
    rec_rounds: pd.DataFrame,
    sim_rounds: pd.DataFrame,
    truncated: int,
) -> dict[str, Any]:
    n = len(rec)
    k = int(rec.violated.sum())
    lo, hi = wilson(k, n)
    v_rec = k / n if n else math.nan
    v_sim = float(sim.violated.mean()) if len(sim) else math.nan
    sim_queue = (sim_rounds.dispatch - sim_rounds.arrival).to_numpy(float)
    return {
        "class": label,
        "responses_recorded": n,
        "responses_simulated": len(sim),
        "unfinished_recorded": int((~rec.finished).sum()),
        "unfinished_simulated": int(sim.unfinished.sum()),
        "truncated_simulated": truncated,
        "violation_recorded": v_rec,
        "violation_recorded_lo": lo,
        "violation_recorded_hi": hi,
        "violation_simulated": v_sim,
        "violation_diff": v_sim - v_rec,
        **_times(rec_rounds.queue_s.to_numpy(float), sim_queue, "queue"),
        **_times(rec_rounds.verify_s.to_numpy(float), sim_rounds.verify_time.to_numpy(float), "verify"),
    }


def compare(log: pd.DataFrame, simulated: SimResult, meta: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Recorded versus simulated, per class and ``all``, over measured responses and their rounds.

    Violation rates (the recorded one with a 95% Wilson interval, which treats responses as
    independent), queue and verify time quantiles in ms with differences (simulated - recorded),
    and the two-sample Kolmogorov-Smirnov statistic of the queue and verify time distributions.
    Under centralized serving there are no simulated rounds, so those columns are empty."""
    from wispsim.analysis.metrics import class_label

    rec = recorded_responses(log, meta)
    rec = rec[rec.measured]
    rec_rounds = log[log.measured]
    sr = simulated.rounds
    sim_rounds = sr[sr.measured]
    sim = simulated.responses[simulated.responses.measured].copy()
    # a censored response may still have finished before the run ended (it was late anyway):
    # unfinished means its rounds never committed the whole output, as on the recorded side
    reached = (sim_rounds.position + sim_rounds.committed).groupby(sim_rounds.response).max()
    sim["unfinished"] = sim.censored & ~(sim.response.map(reached) >= sim.output_len)
    cut = pd.Series(simulated.info.get("truncated", {}), dtype=float)
    rows = []
    for slo in sorted(set(rec.slo) | set(sim.slo) | set(cut)):
        rows.append(
            _compare_row(
                class_label(slo),
                rec[rec.slo == slo],
                sim[sim.slo == slo],
                rec_rounds[rec_rounds.slo == slo],
                sim_rounds[sim_rounds.slo == slo],
                int((cut == slo).sum()),
            )
        )
    rows.append(_compare_row("all", rec, sim, rec_rounds, sim_rounds, len(cut)))
    return pd.DataFrame(rows)
