"""Reading user-supplied table and JSON files, and checking their columns, with one-line errors.

Every reader of an input file (acceptance traces, arrival traces, measurement CSVs, replay logs
and their sidecars, results folders, exported predictors) goes through these helpers, so a file
that is missing, empty, truncated, binary, not UTF-8, or of the wrong format, and a column whose
cells are not what the reader needs (text in a number column, NaN or infinity, a fraction where a
count belongs, a value out of range, "yes" in a boolean column) is a
:class:`~wispsim.errors.WispsimError` whose message is one line naming the file, the column, the
row, the value and what is allowed. Library messages (pandas, pyarrow, json) can span several
lines; :func:`one_line` collapses them.

``error`` selects the class raised: :class:`~wispsim.errors.ConfigError` (the default; built from
source, field and problem) or any other :class:`~wispsim.errors.WispsimError` such as
:class:`~wispsim.errors.TraceError` (given the assembled ``source: field: problem`` line).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wispsim.errors import ConfigError, WispsimError

ErrorType = type[WispsimError]
#: longest excerpt of a library message or a cell quoted in an error
_EXCERPT = 160


def collapse_whitespace(text: object) -> str:
    """``text`` with every run of whitespace (newlines included) collapsed to one space."""
    return " ".join(str(text).split())


def _short(text: str) -> str:
    return text if len(text) <= _EXCERPT else text[: _EXCERPT - 3] + "..."


def describe(e: BaseException) -> str:
    """A library exception as a short single line (its type when it has no message)."""
    return _short(collapse_whitespace(e)) or type(e).__name__


def problem(source: str, field: str, text: str, error: ErrorType = ConfigError) -> WispsimError:
    """The error to raise: ``source: field: text`` on one line, as ``error``."""
    text = collapse_whitespace(text)
    if issubclass(error, ConfigError):
        return error(str(source), field, text)
    where = f"{source}: {field}" if field else str(source)
    return error(f"{where}: {text}")


@contextmanager
def reading(
    source: str, what: str, error: ErrorType = ConfigError, failed: str = "cannot read as {what}"
) -> Iterator[None]:
    """Turn any failure of the reading code inside into one line: ``source: cannot read as WHAT:
    the library's message`` (``failed`` words the start).

    WispsimErrors pass through; a decoding failure says the file is not UTF-8 text.
    """
    try:
        yield
    except WispsimError:
        raise
    except UnicodeDecodeError as e:
        raise problem(source, "", f"not UTF-8 text ({_bad_byte(e)}); {what} must be UTF-8", error) from None
    except MemoryError:
        raise problem(source, "", f"too large to read as {what}", error) from None
    except Exception as e:  # pandas, pyarrow, numpy, zipfile and OS errors all mean "cannot read"
        raise problem(source, "", f"{failed.format(what=what)}: {describe(e)}", error) from None


def _bad_byte(e: UnicodeDecodeError) -> str:
    try:
        return f"byte {e.object[e.start]:#04x} at offset {e.start}"
    except (IndexError, TypeError):
        return describe(e)


def check_file(path: Path | str, source: str | None = None, error: ErrorType = ConfigError) -> Path:
    """``path`` as a Path if it is an existing file; else an error saying what is there instead."""
    p = Path(path)
    src = str(source if source is not None else p)
    if p.is_dir():
        raise problem(src, "", "is a folder, not a file", error)
    if not p.is_file():
        raise problem(src, "", "file not found", error)
    return p


def read_table(
    path: Path | str,
    source: str | None = None,
    *,
    kind: str | None = None,
    columns: Iterable[str] = (),
    error: ErrorType = ConfigError,
    **read_kwargs: Any,
) -> pd.DataFrame:
    """A CSV or Parquet file (``kind``, default from the suffix: ``.csv`` or else Parquet) as a
    DataFrame with at least ``columns``; any failure is one line naming the file.

    CSV text must be UTF-8; ``read_kwargs`` go to :func:`pandas.read_csv` or
    :func:`pandas.read_parquet`.
    """
    p = check_file(path, source, error)
    src = str(source if source is not None else p)
    kind = kind or ("csv" if p.suffix.lower() == ".csv" else "parquet")
    what = "CSV" if kind == "csv" else "Parquet"
    with reading(src, what, error):
        if kind == "csv":
            df = pd.read_csv(p, encoding="utf-8", encoding_errors="strict", **read_kwargs)
        else:
            df = pd.read_parquet(p, **read_kwargs)
    need = list(columns)
    missing = [c for c in need if c not in df.columns]
    if missing:
        got = (
            ", ".join(str(c) if len(str(c)) <= 40 else str(c)[:37] + "..." for c in df.columns[:20]) or "none"
        )
        raise problem(
            src,
            missing[0],
            f"missing column(s) {', '.join(missing)}; needs {', '.join(need)} (got {got})",
            error,
        )
    return df


def read_json(
    path: Path | str, source: str | None = None, error: ErrorType = ConfigError, allow_nan: bool = False
) -> Any:
    """A UTF-8 JSON file's document; NaN and Infinity (not JSON) are refused unless ``allow_nan``
    (files Python's json writes, such as vLLM's benchmark results, use them for "not measured")."""
    p = check_file(path, source, error)
    src = str(source if source is not None else p)
    with reading(src, "JSON", error):
        text = p.read_bytes().decode("utf-8")
    try:
        return json.loads(text) if allow_nan else json.loads(text, parse_constant=_no_constant)
    except (json.JSONDecodeError, ValueError, RecursionError) as e:
        raise problem(src, "", f"not valid JSON: {describe(e)}", error) from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _cell(raw: pd.Series, i: int) -> str:
    v = raw.iloc[i]
    if v is None or v is pd.NA:
        return "an empty cell"
    if isinstance(v, float | np.floating):
        return "NaN or an empty cell" if np.isnan(v) else f"{v:g}"
    if isinstance(v, int | np.integer | bool | np.bool_):
        return str(v)
    return repr(_short(str(v)))


def _bound(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


def numeric_column(
    df: pd.DataFrame,
    column: str,
    source: str,
    *,
    integer: bool = False,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    allow_empty: bool = False,
    text_numbers: bool = True,
    rows: Iterable[int] | None = None,
    error: ErrorType = ConfigError,
) -> np.ndarray:
    """Column ``column`` of ``df`` as float64, every cell checked: a number (not text, not a bool),
    finite, an integer if ``integer``, ``>= lo`` (``> lo`` if ``lo_open``) and ``<= hi``.

    Empty cells are NaN in the result where ``allow_empty``, else an error. Without
    ``text_numbers`` (typed files such as Parquet) a column stored as text is refused even where
    its text reads as numbers. Rows are counted from 1, the header excluded (``rows``: the file's
    row number of each row of ``df``, for a filtered frame). The error names the file, the column,
    the row and the value.
    """
    raw = df[column]
    numbers = None if rows is None else list(rows)

    def fail(mask: np.ndarray, what: str) -> None:
        hits = np.flatnonzero(mask)
        if hits.size:
            i = int(hits[0])
            row = i + 1 if numbers is None else numbers[i]
            raise problem(source, column, f"row {row}: {what}, got {_cell(raw, i)}", error)

    n = len(raw)
    if pd.api.types.is_bool_dtype(raw.dtype):
        fail(np.ones(n, bool), "not a number (the column holds true/false)")
    if not text_numbers and not pd.api.types.is_numeric_dtype(raw.dtype):
        fail(~np.asarray(raw.isna().to_numpy(bool)), "not a number (the column holds text)")
    num = pd.to_numeric(raw, errors="coerce")
    x = np.asarray(num.to_numpy(dtype=float, na_value=np.nan), dtype=float)
    empty = np.asarray(raw.isna().to_numpy(bool))
    is_bool = np.zeros(n, bool)
    if raw.dtype == object:  # a column mixing numbers with true/false
        is_bool = np.asarray(raw.map(lambda v: isinstance(v, bool | np.bool_)).to_numpy(bool))
    fail(is_bool | (np.isnan(x) & ~empty), "not a finite number")
    if not allow_empty:
        fail(empty, "not a finite number")
    fail(~empty & ~np.isfinite(x), "not a finite number")
    fin = ~empty
    if integer:
        fail(fin & (x != np.round(x)), "must be an integer")
    if lo is not None:
        fail(fin & ((x <= lo) if lo_open else (x < lo)), f"must be {'>' if lo_open else '>='} {_bound(lo)}")
    if hi is not None:
        top = float(hi)
        fail(fin & ((x >= top) if top > hi else (x > top)), f"must be <= {_bound(hi)}")
    return x


_TRUTH = {"true": True, "false": False, "1": True, "0": False, "1.0": True, "0.0": False}


def bool_column(
    df: pd.DataFrame, column: str, source: str, *, text: bool = False, error: ErrorType = ConfigError
) -> np.ndarray:
    """Column ``column`` as bools: a boolean column, or numbers that are all exactly 0 or 1; with
    ``text`` (a CSV) also the words true and false. Anything else ("yes", 2, an empty cell) is an
    error naming the row and the value, never silently truthy."""
    raw = df[column]
    allowed = "true/false or 0/1" if text else "booleans or the integers 0 and 1"
    empty = np.asarray(raw.isna().to_numpy(bool))
    if empty.any():
        i = int(np.flatnonzero(empty)[0])
        raise problem(source, column, f"row {i + 1}: expected {allowed}, got an empty cell", error)
    if pd.api.types.is_bool_dtype(raw.dtype):
        return np.asarray(raw.to_numpy(dtype=bool))
    if pd.api.types.is_numeric_dtype(raw.dtype):
        x = raw.to_numpy(dtype=float)
        bad = ~((x == 0) | (x == 1))
        out = x == 1
    elif text:
        words = raw.map(lambda v: str(v).strip().lower())
        bad = ~words.isin(list(_TRUTH)).to_numpy(bool)
        out = words.map(lambda w: _TRUTH.get(w, False)).to_numpy(dtype=bool)
    else:
        bad = ~raw.map(lambda v: isinstance(v, bool | np.bool_) or v in (0, 1)).to_numpy(bool)
        out = raw.map(lambda v: bool(v) if not isinstance(v, str) else False).to_numpy(dtype=bool)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise problem(source, column, f"row {i + 1}: expected {allowed}, got {_cell(raw, i)}", error)
    return np.asarray(out, dtype=bool)
