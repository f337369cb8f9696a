"""Result-folder tables: reading and checking the CSVs and Parquet files that sweeps, compares
and runs write, so figures and notebooks can be redrawn from any results folder.

The column sets name what each kind of table must hold (capacity.csv, curve_pooled.csv,
timeseries.csv, rounds and batches); :func:`read_csv` and :func:`read_parquet` read a file of a
folder, and the ``check_*`` functions check a table however it was obtained.

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
import yaml

from wispsim.errors import WispsimError
from wispsim.tabular import read_json, reading

CAPACITY_COLUMNS = ("policy", "class", "capacity", "ci_low", "ci_high")
POOLED_COLUMNS = ("policy", "group", "class", "devices", "violation_rate", "decision_violation")
# every column sweep/compare write; any other one (e.g. "acceptance") marks a table of several sweeps
# (check_unique names such columns when rows repeat)
CAPACITY_KNOWN = (*CAPACITY_COLUMNS, "saturated", "evaluated")
POOLED_KNOWN = (*POOLED_COLUMNS, "seeds", "responses", "decision_ci_low", "decision_ci_high")
TIMESERIES_COLUMNS = ("t", "class", "compliance")
ROUND_COLUMNS = ("response", "slo", "batch", "arrival", "dispatch", "verify_time", "measured")
BATCH_COLUMNS = ("batch", "replica", "t_dispatch", "latency")
_LABEL_COLUMNS = {"policy": str, "class": str, "group": str}


def results_folder(folder: Path | str) -> Path:
    """``folder`` as a Path, or a WispsimError if it is not an existing folder."""
    p = Path(folder)
    if not p.is_dir():
        raise WispsimError(f"{p}: no such results folder")
    return p


def check_columns(df: pd.DataFrame, columns: Iterable[str], what: str) -> pd.DataFrame:
    """``df`` itself, or a WispsimError naming ``what`` and the columns it lacks."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise WispsimError(f"{what}: missing column(s) {', '.join(missing)}")
    return df


def read_csv(folder: Path | str, name: str, columns: Iterable[str] = ()) -> pd.DataFrame:
    """``folder/name`` as a DataFrame with at least ``columns``; one-line errors naming the file.

    Label columns (policy, class, group) are read as strings: a class is "4" or "mix:4,8".
    """
    path = results_folder(folder) / name
    if not path.is_file():
        raise WispsimError(f"{path}: not found (is {path.parent} the right results folder?)")
    with reading(str(path), "CSV", WispsimError):
        df = pd.read_csv(path, dtype=_LABEL_COLUMNS, encoding="utf-8")
    columns = list(columns)
    check_columns(df, columns, str(path))
    if columns and df.empty:
        raise WispsimError(f"{path}: no rows (was the command that writes it interrupted?)")
    for c in columns:  # the numbers a figure reads must be numbers (empty cells are fine)
        if c in _LABEL_COLUMNS or df[c].dtype != object:
            continue
        as_num = pd.to_numeric(df[c], errors="coerce")
        bad = df[c].notna() & as_num.isna() & ~df[c].astype(str).str.lower().isin(("true", "false"))
        if bad.any():
            row = int(bad.to_numpy().argmax())
            raise WispsimError(f"{path}: {c}: row {row + 1}: not a number, got {str(df[c].iloc[row])[:40]!r}")
    return df


def read_parquet(folder: Path | str, name: str, columns: Iterable[str] = ()) -> pd.DataFrame:
    """``folder/name`` (Parquet records) with at least ``columns``."""
    path = results_folder(folder) / name
    if not path.is_file():
        raise WispsimError(f"{path}: not found (is {path.parent} a run folder?)")
    with reading(str(path), "Parquet", WispsimError):  # pyarrow raises several kinds
        df = pd.read_parquet(path)
    return check_columns(df, columns, str(path))


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
    base = Path(root)
    found = (
        [p for p in base.iterdir() if all((p / f).is_file() for f in CURVE_FILES)] if base.is_dir() else []
    )
    if not found:
        raise WispsimError(
            f"{base}: no folder with {' and '.join(CURVE_FILES)} (run `wispsim sweep` or `wispsim compare`, "
            "or name a folder)"
        )
    return max(found, key=lambda p: (p / CURVE_FILES[0]).stat().st_mtime)


def folder_meta(folder: Path | str) -> dict[str, Any]:
    """What was run: manifest.json merged over the scenario's policy, seed, epsilon, profile, trace.

    Missing files give an empty dict; a damaged one is an error naming it.
    """
    p = Path(folder)
    meta: dict[str, Any] = {}
    scen = [p / "scenario.yaml", *sorted(p.glob("scenario-*.yaml"))]
    for s in scen:
        if not s.is_file():
            continue
        with reading(str(s), "YAML", WispsimError):
            doc = yaml.safe_load(s.read_bytes().decode("utf-8"))
        if isinstance(doc, dict):
            server, arrivals = doc.get("server"), doc.get("arrivals")
            found = {
                "policy": doc.get("policy"),
                "seed": doc.get("seed"),
                "epsilon": doc.get("epsilon"),
                "profile": server.get("profile") if isinstance(server, dict) else None,
                "trace": arrivals.get("trace") if isinstance(arrivals, dict) else None,
            }
            _check_meta(found, s)
            for k, v in found.items():
                meta.setdefault(k, v)
        break
    m = p / "manifest.json"
    if m.is_file():
        man = read_json(m, error=WispsimError)
        if isinstance(man, dict):
            _check_meta(man, m)
            meta.update({k: v for k, v in man.items() if v is not None})
    return {k: v for k, v in meta.items() if v is not None}


def _check_meta(meta: Mapping[str, Any], path: Path) -> None:
    """The run facts figures use: ``epsilon`` a number in [0, 1), ``seed`` a whole number >= 0,
    ``policy``, ``profile`` and ``trace`` text."""
    eps = meta.get("epsilon")
    if eps is not None and not (isinstance(eps, int | float) and not isinstance(eps, bool) and 0 <= eps < 1):
        raise WispsimError(f"{path}: epsilon: must be a number in [0, 1), got {str(eps)[:40]!r}")
    seed = meta.get("seed")
    if seed is not None and not (isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0):
        raise WispsimError(f"{path}: seed: must be a whole number >= 0, got {str(seed)[:40]!r}")
    for key in ("policy", "profile", "trace"):
        v = meta.get(key)
        if v is not None and not isinstance(v, str):
            raise WispsimError(f"{path}: {key}: must be text, got {str(v)[:40]!r}")


def run_label(folder: Path | str) -> str:
    """A run's name in legends: its policy (scenario.yaml or manifest.json), else the folder name."""
    return str(folder_meta(folder).get("policy") or Path(folder).name)


def is_saturated(row: Mapping[str, Any]) -> bool:
    """One capacity row (a dict, a Series): did its search stop at the ceiling?"""
    return bool(saturated_mask(pd.DataFrame([dict(row)])).iloc[0])


def saturated_mask(cap: pd.DataFrame) -> pd.Series:
    """Per row of a capacity table: did the search stop at its ceiling (capacity a lower bound)?

    Accepts the column as bools (a table in memory) or as text (read back from any CSV)."""
    if "saturated" not in cap:
        return pd.Series(False, index=cap.index)
    return cap["saturated"].astype(str).str.strip().str.lower().eq("true")
