"""Reading a replay log: every problem is a one-line error naming the file and the column.

:func:`read_log` reads a log in the format of :mod:`wispsim.study.replay.log` and its sidecar,
checks each row (types, signs, tokens and times that can happen), each response (its rounds
agree on the device, class, start and lengths, are numbered 0, 1, ... and their positions add
up) and the sidecar (the measurement window, the unfinished responses), and checks that the
``measured`` flags agree with the window. A problem is a :class:`~wispsim.errors.ConfigError`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wispsim.config import POLICY_NAMES
from wispsim.config.limits import MAX_DEVICES, MAX_INT, MAX_SEED, MAX_SIM_SECONDS, MAX_TOKENS
from wispsim.errors import ConfigError
from wispsim.study.replay.log import (
    COLUMN_NAMES,
    COLUMNS,
    REQUIRED,
    SERVER_SIDE,
    SUFFIXES,
    UNFINISHED_KEYS,
    meta_path,
)
from wispsim.tabular import check_file, read_json, reading


def _read_table(p: Path, src: str) -> pd.DataFrame:
    if p.suffix.lower() not in SUFFIXES:
        raise ConfigError(src, "", f"unknown log format {p.suffix!r}; a replay log is .parquet or .csv")
    check_file(p, src)
    kind = "CSV" if p.suffix.lower() == ".csv" else "Parquet"
    with reading(src, kind):  # pyarrow, parser, decoding and OS errors all mean the same to the user
        if p.suffix.lower() == ".csv":
            # exact floats (pandas 3 parses them exactly by default and deprecates the option)
            exact = {"float_precision": "round_trip"} if pd.__version__.startswith(("1.", "2.")) else {}
            return pd.read_csv(p, low_memory=False, encoding="utf-8", **exact)  # type: ignore[call-overload]
        return pd.read_parquet(p)
    raise AssertionError("unreachable")  # pragma: no cover


def _fail(src: str, column: str, bad: np.ndarray, problem: str) -> None:
    """Raise for the first row where ``bad`` holds (rows counted from 1, header excluded)."""
    rows = np.flatnonzero(bad)
    if rows.size:
        raise ConfigError(src, column, f"row {int(rows[0]) + 1}: {problem}")


def _numeric_columns(df: pd.DataFrame, src: str) -> dict[str, np.ndarray]:
    """Every non-bool column as floats, checked against its kind (NaN where it may be empty)."""
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
            hi = MAX_TOKENS if c.unit == "tokens" else MAX_INT
            top = float(hi)  # MAX_INT rounds up to 2**63 as a float
            _fail(src, c.name, ok & ((x >= top) if top > hi else (x > top)), f"must be <= {hi:,}")
        if c.kind == "time":
            _fail(
                src,
                c.name,
                ok & (x > MAX_SIM_SECONDS),
                f"must be <= {MAX_SIM_SECONDS:,.0f} s (times count from the start of the recording)",
            )
        cols[c.name] = x
    return cols


def _measured_flags(df: pd.DataFrame, src: str) -> np.ndarray:
    """The ``measured`` column as bools (CSV may spell them true/false or 1/0)."""
    raw = df["measured"]
    if raw.dtype == bool:
        return raw.to_numpy()
    text = raw.astype(str).str.strip().str.lower()
    truth = {"true": True, "1": True, "1.0": True, "false": False, "0": False, "0.0": False}
    bad = ~text.isin(truth).to_numpy()
    _fail(src, "measured", bad, "must be true or false")
    return text.map(truth).to_numpy(dtype=bool)


def _check_rows(x: dict[str, np.ndarray], src: str) -> None:
    """Row by row: a round's tokens and times are possible."""
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
    # the device's parts fit its clock (a column in ms beside the others' seconds does not)
    tol = 1e-6
    device = x["draft_s"] + x["up_s"] > x["t_arrival"] - x["t_start"] + tol
    _fail(src, "draft_s", device, "draft_s + up_s exceed t_arrival - t_start (every time is in seconds)")
    _fail(src, "down_s", x["down_s"] > x["t_end"] - x["t_arrival"] + tol,
          "down_s exceeds t_end - t_arrival (every time is in seconds)")  # fmt: skip


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
    first = g.t_start.transform("min").to_numpy()
    rid = df.response.to_numpy()
    for col, bad, why in (
        ("response_start", df.response_start.to_numpy() > first + 1e-6, "it starts after its first round"),
        # a device drafts a round once the last verdict is back
        (
            "t_start",
            df.t_start.to_numpy() < g.t_end.shift().to_numpy() - 1e-6,
            "a round starts before the last ended",
        ),
    ):
        if bad.any():
            raise ConfigError(src, col, f"response {rid[bad][0]}: {why}")
    open_ = df[df.output_tokens.isna()]  # the recording stopped inside it: its device went no further
    if len(open_):
        later = df.groupby("device").response_start.max()
        bad = open_.response_start.to_numpy() < later.reindex(open_.device).to_numpy()
        if bad.any():
            row = open_.iloc[int(np.flatnonzero(bad)[0])]
            raise ConfigError(
                src,
                "output_tokens",
                f"response {int(row.response)}: empty (the recording stopped inside it), but device "
                f"{int(row.device)} went on to a later response; give its output length",
            )
    before = (g.committed.cumsum() - df.committed).to_numpy()
    bad = df.position.to_numpy() != before
    if bad.any():
        rid = df.response.to_numpy()[bad][0]
        raise ConfigError(
            src, "position", f"response {rid}: position must be the tokens committed by earlier rounds"
        )


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _read_meta(p: Path) -> dict[str, Any]:
    """Read and check the sidecar of log ``p`` (``unfinished`` defaults to an empty list).

    Every field the replay uses is checked: ``window`` [start, end) with 0 <= start < end <=
    MAX_SIM_SECONDS; ``seed`` an integer in [0, MAX_SEED]; ``devices`` an integer in [0,
    MAX_DEVICES]; ``sim_end`` a finite number >= 0; ``policy`` and the other labels strings;
    ``scenario`` a mapping; ``unfinished`` a list of responses with integer ids and token counts
    and a true/false ``measured``.
    """
    mp = meta_path(p)
    src = str(mp)
    if not mp.is_file():
        raise ConfigError(
            src, "", 'sidecar not found; it must hold at least {"window": [start_s, end_s]} (docs/replay.md)'
        )
    try:
        meta = read_json(mp)
    except ConfigError as e:
        why = e.problem.removeprefix("not valid JSON: ")
        raise ConfigError(src, "", f"not readable JSON: {why}") from None
    if not isinstance(meta, dict):
        raise ConfigError(src, "", f"must be a JSON object, got {type(meta).__name__}")
    extra = sorted(set(meta) - set(SIDECAR_KEYS))
    if extra:  # a typo ("unfinshed") would have been read as absent
        raise ConfigError(src, extra[0], f"unknown key; allowed: {', '.join(SIDECAR_KEYS)}")
    w = meta.get("window")
    ok = (
        isinstance(w, list)
        and len(w) == 2
        and all(_is_num(v) for v in w)
        and 0 <= w[0] < w[1] <= MAX_SIM_SECONDS
    )
    if not ok:
        raise ConfigError(
            src,
            "window",
            f"must be [start_s, end_s] with 0 <= start < end <= {MAX_SIM_SECONDS:,.0f}, got {_short(w)}",
        )
    if "seed" in meta and not (_is_int(meta["seed"]) and 0 <= meta["seed"] <= MAX_SEED):
        raise ConfigError(src, "seed", f"must be an integer in [0, {MAX_SEED}], got {_short(meta['seed'])}")
    if "devices" in meta and not (_is_int(meta["devices"]) and 0 <= meta["devices"] <= MAX_DEVICES):
        raise ConfigError(
            src, "devices", f"must be an integer in [0, {MAX_DEVICES:,}], got {_short(meta['devices'])}"
        )
    if "sim_end" in meta and not (_is_num(meta["sim_end"]) and meta["sim_end"] >= 0):
        raise ConfigError(src, "sim_end", f"must be a finite number >= 0, got {_short(meta['sim_end'])}")
    for key in ("format", "source", "policy", "scenario_name", "date", "wispsim_version"):
        if meta.get(key) is not None and not isinstance(meta[key], str):
            raise ConfigError(src, key, f"must be a string, got {_short(meta[key])}")
    if meta.get("policy") is not None and meta["policy"] not in POLICY_NAMES:
        raise ConfigError(
            src, "policy", f"unknown policy {_short(meta['policy'])}; allowed: {', '.join(POLICY_NAMES)}"
        )
    unf = meta.setdefault("unfinished", [])
    if not isinstance(unf, list) or not all(
        isinstance(u, dict) and set(UNFINISHED_KEYS) <= set(u) for u in unf
    ):
        raise ConfigError(
            src, "unfinished", f"must be a list of objects with keys {', '.join(UNFINISHED_KEYS)}"
        )
    seen: set[Any] = set()
    for i, u in enumerate(unf):
        if set(u) - set(UNFINISHED_KEYS):
            key = sorted(set(u) - set(UNFINISHED_KEYS))[0]
            allowed = ", ".join(UNFINISHED_KEYS)
            raise ConfigError(src, f"unfinished[{i}].{key}", f"unknown key; allowed: {allowed}")
        if u["response"] in seen:
            raise ConfigError(src, f"unfinished[{i}].response", f"response {u['response']} is listed twice")
        seen.add(u["response"])
        for k in UNFINISHED_KEYS:
            v = u[k]
            if k == "measured":
                good = isinstance(v, bool)
                rule = "true or false"
            elif k in ("slo", "response_start"):
                good = _is_num(v) and (v > 0 if k == "slo" else 0 <= v <= MAX_SIM_SECONDS)
                rule = "a finite number > 0" if k == "slo" else f"a time in [0, {MAX_SIM_SECONDS:,.0f}] s"
            else:
                hi = MAX_TOKENS if k.endswith("_tokens") else MAX_INT
                good = _is_int(v) and 0 <= v <= hi and not (k == "output_tokens" and v < 1)
                rule = f"an integer in [{1 if k == 'output_tokens' else 0}, {hi:,}]"
            if not good:
                raise ConfigError(src, f"unfinished[{i}].{k}", f"must be {rule}, got {_short(v)}")
    if "scenario" in meta and not isinstance(meta["scenario"], dict):
        raise ConfigError(src, "scenario", "must be a mapping (the resolved scenario)")
    return meta


# the sidecar's keys (docs/replay.md; ``server``: the real server a swarm drove)
SIDECAR_KEYS = (
    "window", "unfinished", "source", "date", "policy", "seed", "scenario_name", "scenario",
    "wispsim_version", "format", "devices", "sim_end", "models", "hardware", "server",
)  # fmt: skip


def _check_unfinished(out: pd.DataFrame, meta: dict[str, Any], src: str) -> None:
    """A response the sidecar lists as unfinished completed no round (so has no rows in the log),
    and is measured exactly when it starts inside the window."""
    w0, w1 = meta["window"]
    logged = set(out.response.tolist())
    for i, u in enumerate(meta["unfinished"]):
        if u["response"] in logged:
            raise ConfigError(
                src,
                f"unfinished[{i}].response",
                f"response {u['response']} has rounds in the log; unfinished lists only responses that "
                "completed no round (a response the recording stopped inside has an empty output_tokens)",
            )
        inside = w0 <= u["response_start"] < w1
        if u["measured"] != inside:
            raise ConfigError(
                src,
                f"unfinished[{i}].measured",
                f"is {str(u['measured']).lower()} but response {u['response']} starts at "
                f"{u['response_start']:g} s, {'inside' if inside else 'outside'} the window [{w0:g}, {w1:g})",
            )


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def read_log(path: str | Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Read and check a replay log and its sidecar: (rows sorted by response and round, meta).

    Optional server-side columns that are absent come back empty (NaN); the columns that may be
    empty (output_tokens, batch, replica) are floats, the other integers int64."""
    p = Path(path)
    src = str(p)
    df = _read_table(p, src)
    missing = [c for c in REQUIRED if c not in df.columns]
    if len(missing) == len(REQUIRED):  # nothing of a log: another table (a summary, records)
        raise ConfigError(
            src,
            "",
            "not a replay log (none of its columns); write one with `wispsim run --log` or "
            "`wispsim swarm --log`",
        )
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
    x = _numeric_columns(df, src)
    measured = _measured_flags(df, src)
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
    _check_unfinished(out, meta, str(meta_path(p)))
    return out, meta
