"""Result-folder tables: checking the CSVs and Parquet files that sweeps, compares and runs
write, so figures and notebooks can be redrawn from any results folder.

The column sets name what each kind of table must hold (capacity.csv, curve_pooled.csv,
timeseries.csv, rounds and batches); :class:`wispsim.results.Results` reads a file of a folder
(``Results.existing(folder).read_csv(name, columns)``), and the ``check_*`` functions check a
table however it was obtained.

A missing folder or file, a table without the columns a reader needs, a cell that is not a finite
number, or duplicate rows, is a :class:`~wispsim.errors.WispsimError` whose one-line message
names the file.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wispsim.errors import WispsimError
from wispsim.results import newest_with

CAPACITY_COLUMNS = ("policy", "class", "capacity", "ci_low", "ci_high")
POOLED_COLUMNS = ("policy", "group", "class", "devices", "violation_rate", "decision_violation")
# every column sweep/compare write; any other one (e.g. "acceptance") marks a table of several sweeps
# (check_unique names such columns when rows repeat)
CAPACITY_KNOWN = (*CAPACITY_COLUMNS, "saturated", "evaluated")
POOLED_KNOWN = (*POOLED_COLUMNS, "seeds", "responses", "decision_ci_low", "decision_ci_high")
TIMESERIES_COLUMNS = ("t", "class", "compliance")
ROUND_COLUMNS = ("response", "slo", "batch", "arrival", "dispatch", "verify_time", "measured")
BATCH_COLUMNS = ("batch", "replica", "t_dispatch", "latency")


def _row_name(df: pd.DataFrame, i: int) -> str:
    """'row 3 (policy wisp, class 4)': the i-th data row (from 1, the header not counted)."""
    labels = [f"{c} {df[c].iloc[i]}" for c in ("policy", "group", "class", "t", "peak") if c in df]
    return f"row {i + 1}" + (f" ({', '.join(labels)})" if labels else "")


def check_numeric(
    df: pd.DataFrame, columns: Iterable[str], what: str, gaps: Iterable[str] = ()
) -> pd.DataFrame:
    """``columns`` as numbers. A cell that is not a finite number (text, inf, or empty -- except in
    the ``gaps`` columns, where empty means "no value" and is drawn as a gap) is an error naming
    the file (``what``), the column and the row."""
    df = df.copy()
    may_be_empty = set(gaps)
    for c in columns:
        raw = df[c]
        num = pd.to_numeric(raw, errors="coerce")
        vals = num.to_numpy(dtype=float, na_value=np.nan)
        empty = raw.isna().to_numpy(bool)
        bad = np.isinf(vals) | (np.isnan(vals) & ~empty)  # inf, or text that is not a number
        if c not in may_be_empty:
            bad |= empty
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            got = "an empty cell" if empty[i] else repr(str(raw.iloc[i]).strip())
            raise WispsimError(f"{what}: column {c}, {_row_name(df, i)}: expected a finite number, got {got}")
        df[c] = num
    return df


def check_unique(df: pd.DataFrame, keys: Sequence[str], what: str, known: Iterable[str]) -> None:
    """One row per ``keys``; else an error naming the repeated key and the columns telling them apart."""
    dup = df.duplicated(list(keys), keep=False).to_numpy(bool)
    if not dup.any():
        return
    rows = df[dup]
    first = rows.iloc[0]
    same = rows[(rows[list(keys)] == first[list(keys)]).all(axis=1)]
    key = ", ".join(f"{k} {first[k]}" for k in keys)
    extra = [c for c in df.columns if c not in set(known)]
    differ = [c for c in extra if same[c].nunique(dropna=False) > 1] or extra
    hint = (
        f"; the extra column(s) {', '.join(differ)} tell them apart: this file holds several sweeps, "
        f"plot each from its own folder or table, with one row per ({', '.join(keys)})"
        if differ
        else f"; expected one row per ({', '.join(keys)})"
    )
    raise WispsimError(f"{what}: {key} appears in {len(same)} rows{hint}")


CURVE_FILES = ("capacity.csv", "curve_pooled.csv")  # what violation curves are drawn from


def newest_curves_folder(root: Path | str) -> Path:
    """The newest folder under ``root`` (a ``results/``) holding what violation curves are drawn
    from (:data:`CURVE_FILES`: a sweep or a compare; an ``estimator compare`` folder has a
    capacity.csv but no curves), or a one-line error saying what is needed."""
    return newest_with(root, CURVE_FILES, "run `wispsim sweep` or `wispsim compare`, or name a folder")


def is_saturated(row: Mapping[str, Any]) -> bool:
    """One capacity row (a dict, a Series): did its search stop at the ceiling?"""
    return bool(saturated_mask(pd.DataFrame([dict(row)])).iloc[0])


def saturated_mask(cap: pd.DataFrame) -> pd.Series:
    """Per row of a capacity table: did the search stop at its ceiling (capacity a lower bound)?

    Accepts the column as bools (a table in memory) or as text (read back from any CSV)."""
    if "saturated" not in cap:
        return pd.Series(False, index=cap.index)
    return cap["saturated"].astype(str).str.strip().str.lower().eq("true")
