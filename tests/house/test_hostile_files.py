"""Hostile input files (issue 13): every reader turns a bad file into one line naming the file,
the column or field, the value and what is allowed -- exit code 2, never a traceback, a hang or a
silently wrong answer."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from wispsim.cli.main import app
from wispsim.errors import WispsimError
from wispsim.model.acceptance import load_trace
from wispsim.model.measured import read_measurements
from wispsim.model.predictor import load_exported
from wispsim.paths import checkout_dir
from wispsim.results import Results
from wispsim.sim.arrivals import ArrivalTrace, check_values, load_arrival_trace
from wispsim.study.replay.read import _read_meta
from wispsim.tabular import bool_column, numeric_column, read_json, read_table

ROOT = checkout_dir()
TRACE = ROOT / "traces" / "fixture-synthetic.parquet"
MEASURED = ROOT / "profiles" / "data" / "cpu-qwen2.5-0.5b.csv"
PREDICTORS = ROOT / "predictors"


def one_line_error(args: list[str]) -> str:
    """Run the CLI; the command must fail with a WispsimError of one line (exit code 2)."""
    r = CliRunner().invoke(app, args)
    assert isinstance(r.exception, WispsimError), (r.output, r.exception)
    message = str(r.exception)
    assert r.exception.exit_code == 2 and "\n" not in message and "Traceback" not in message, message
    return message


# ------------------------------------------------------------------------------------------
# the shared helpers
# ------------------------------------------------------------------------------------------


def test_numeric_column_names_row_value_and_rule() -> None:
    df = pd.DataFrame({"x": ["1", "2.5", "abc"], "n": [1, 2, -3], "b": [True, False, True]})
    with pytest.raises(WispsimError, match=r"^f\.csv: x: row 3: not a finite number, got 'abc'$"):
        numeric_column(df, "x", "f.csv")
    with pytest.raises(WispsimError, match=r"x: row 2: must be an integer, got '2\.5'"):
        numeric_column(df.iloc[:2], "x", "f.csv", integer=True)
    with pytest.raises(WispsimError, match=r"n: row 3: must be >= 0, got -3"):
        numeric_column(df, "n", "f.csv", lo=0)
    with pytest.raises(WispsimError, match=r"n: row 2: must be <= 1, got 2"):
        numeric_column(df, "n", "f.csv", hi=1)
    with pytest.raises(WispsimError, match=r"b: row 1: not a number"):
        numeric_column(df, "b", "f.csv")
    with pytest.raises(WispsimError, match=r"x: row 1: not a number \(the column holds text\)"):
        numeric_column(df, "x", "f.parquet", text_numbers=False)
    inf = pd.DataFrame({"x": [1.0, np.inf]})
    with pytest.raises(WispsimError, match=r"x: row 2: not a finite number, got inf"):
        numeric_column(inf, "x", "f")
    assert numeric_column(pd.DataFrame({"x": [1.0, None]}), "x", "f", allow_empty=True)[0] == 1.0


@pytest.mark.parametrize("values", [["yes", "no"], [0, 2], [1.0, None], [0.5, 1.0]])
def test_bool_column_refuses_anything_but_booleans_and_0_1(values: list[object]) -> None:
    with pytest.raises(WispsimError, match=r"accept: row \d: expected booleans or the integers 0 and 1"):
        bool_column(pd.DataFrame({"accept": values}), "accept", "t.parquet")
    ok = bool_column(pd.DataFrame({"accept": [1, 0, 1]}), "accept", "t")
    assert ok.tolist() == [True, False, True]


def test_read_table_and_read_json_one_line(tmp_path: Path) -> None:
    cases = {
        "binary.csv": b"\x89PNG\r\n\x1a\n\xff\xfe",
        "empty.csv": b"",
        "junk.parquet": b"PAR1 not parquet",
        "bad.json": b'{"a": [1,\n',
        "latin1.json": '{"a": "\xe9"}'.encode("latin-1"),
        "nan.json": b'{"a": NaN}',
    }
    for name, data in cases.items():
        p = tmp_path / name
        p.write_bytes(data)
        with pytest.raises(WispsimError) as e:
            read_json(p) if name.endswith(".json") else read_table(p)
        assert str(e.value).startswith(str(p)) and "\n" not in str(e.value), str(e.value)
    with pytest.raises(WispsimError, match="file not found"):
        read_table(tmp_path / "nope.csv")
    with pytest.raises(WispsimError, match="is a folder"):
        read_json(tmp_path)


# ------------------------------------------------------------------------------------------
# acceptance traces
# ------------------------------------------------------------------------------------------


def _trace(tmp_path: Path, change: Callable[[pd.DataFrame], pd.DataFrame]) -> Path:
    df = change(pd.read_parquet(TRACE))
    p = tmp_path / "bad.parquet"
    df.to_parquet(p, index=False)
    return p


def _at(col: str, value: object, row: int = 2) -> Callable[[pd.DataFrame], pd.DataFrame]:
    def change(df: pd.DataFrame) -> pd.DataFrame:
        df = df.copy()
        df[col] = df[col].astype(str if isinstance(value, str) else float)
        df.loc[row, col] = value  # type: ignore[call-overload]
        return df

    return change


TRACE_CASES = {
    "beta text": (_at("beta", "high", 0), r"beta: row 1: not a number \(the column holds text\)"),
    "accept yes/no": (
        lambda df: df.assign(accept=np.where(df.accept, "yes", "no")),
        r"accept: row 1: expected booleans or the integers 0 and 1, got '(yes|no)'",
    ),
    "accept 2": (lambda df: df.assign(accept=df.accept.astype(int) * 2), r"accept: row \d+: .* got 2"),
    "nan feature": (_at("entropy", np.nan, 3), r"entropy: row 4: not a finite number, got NaN"),
    "top1 above 1": (_at("top1_prob", 1.5), r"top1_prob: row 3: must be <= 1, got 1.5"),
    "fractional position": (_at("position", 1.5), r"position: row 3: must be an integer, got 1.5"),
    "negative context": (_at("context_length", -5), r"context_length: row 3: must be >= 0, got -5"),
    "beta above 1": (_at("beta", 1.5), r"column beta must lie in \[0, 1\]; row 3 has 1.5"),
}


@pytest.mark.parametrize("case", TRACE_CASES)
def test_bad_trace_columns(case: str, tmp_path: Path) -> None:
    change, expected = TRACE_CASES[case]
    p = _trace(tmp_path, change)
    load_trace.cache_clear()
    message = one_line_error(["trace", "inspect", str(p)])
    assert message.startswith(str(p)) and __import__("re").search(expected, message), message


def test_trace_accept_as_0_1_integers_reads_the_same(tmp_path: Path) -> None:
    p = _trace(tmp_path, lambda df: df.assign(accept=df.accept.astype(int)))
    assert load_trace(str(p)).flag.mean() == pytest.approx(load_trace(str(TRACE)).flag.mean())


@pytest.mark.parametrize("data", [b"", b"PAR1 truncated", b"time_s,value\n0,1\n", bytes(range(256))])
def test_unreadable_trace_files(tmp_path: Path, data: bytes) -> None:
    p = tmp_path / "t.parquet"
    p.write_bytes(data)
    load_trace.cache_clear()
    assert "not a readable Parquet trace" in one_line_error(["trace", "inspect", str(p)])


# ------------------------------------------------------------------------------------------
# arrival traces
# ------------------------------------------------------------------------------------------

ARRIVAL_CASES = {
    "end at 1e300": ("time_s,value\n0,5\n1e300,5\n", r"time_s: row 2: must be <= 1,000,000, got 1e\+300"),
    "1e7 devices": ("time_s,value\n0,10000000\n", r"value: row 1: must be <= 1,000,000, got 10000000"),
    "text value": ("time_s,value\n0,abc\n", r"value: row 1: not a finite number, got 'abc'"),
    "nan time": ("time_s,value\n0,1\nnan,2\n", r"time_s: row 2: not a finite number"),
    "backwards": ("time_s,value\n0,1\n10,2\n5,3\n", r"time_s: row 3: times must increase strictly"),
    "not utf-8": (b"time_s,value\n0,\xff\n", r"not UTF-8 text"),
    "empty": ("", r"cannot read as CSV"),
    "missing column": ("t,value\n0,1\n", r"time_s: missing column"),
}


@pytest.mark.parametrize("case", ARRIVAL_CASES)
def test_bad_arrival_traces(case: str, tmp_path: Path) -> None:
    text, expected = ARRIVAL_CASES[case]
    p = tmp_path / f"{case.replace(' ', '-')}.csv"
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    message = one_line_error(["arrivals", "show", str(p)])
    assert __import__("re").search(expected, message), message


def test_concurrency_values_must_be_whole_devices_after_scale(tmp_path: Path) -> None:
    p = tmp_path / "frac.csv"
    p.write_text("time_s,value\n0,1.2\n10,1.2\n")
    message = one_line_error(["run", "--arrivals", str(p), "--tail", "5", "-o", str(tmp_path / "out")])
    assert "value: row 1: a concurrency trace gives whole devices, got 1.2" in message
    tr = ArrivalTrace(np.array([0.0, 1.0]), np.array([3.0, 4.0]), "t.csv")
    with pytest.raises(WispsimError, match=r"got 1.5 \(value 3 x arrivals.scale 0.5\)"):
        check_values(tr, "concurrency", 0.5)
    assert check_values(tr, "concurrency", 2.0).tolist() == [6.0, 8.0]
    assert check_values(tr, "rate", 0.5).tolist() == [1.5, 2.0]  # a rate may be fractional
    with pytest.raises(WispsimError, match="at most 100,000 responses/s"):
        check_values(tr, "rate", 1e5)
    ok = tmp_path / "ok.csv"
    ok.write_text("time_s,value\n0,3\n")
    assert load_arrival_trace(str(ok), kind="concurrency", scale=2).values.tolist() == [3.0]


# ------------------------------------------------------------------------------------------
# measurement CSVs (profile fit)
# ------------------------------------------------------------------------------------------


def _measured(tmp_path: Path, col: str, value: str, row: int = 0) -> Path:
    df = pd.read_csv(MEASURED, dtype=str)
    df.loc[row, col] = value
    p = tmp_path / "m.csv"
    df.to_csv(p, index=False)
    shutil.copy(str(MEASURED) + ".meta.json", str(p) + ".meta.json")
    return p


@pytest.mark.parametrize(
    ("col", "value", "expected"),
    [
        ("latency_s", "fast", r"latency_s: row 1: not a finite number, got 'fast'"),
        ("latency_s", "inf", r"latency_s: row 1: not a finite number, got inf"),
        ("latency_s", "0", r"latency_s: row 1: must be > 0, got 0"),
        ("n_linear", "-5", r"n_linear: row 1: must be >= 0, got -5"),
        ("n_cached", "2.5", r"n_cached: row 1: must be an integer, got 2.5"),
        ("split", "banana", r"split: row 1: must be train or test, got 'banana'"),
        ("runs_s", "0.5;x", r"runs_s: row 1: runs must be finite numbers > 0"),
    ],
)
def test_bad_measurements(tmp_path: Path, col: str, value: str, expected: str) -> None:
    p = _measured(tmp_path, col, value)
    with pytest.raises(WispsimError, match=expected):
        read_measurements(p)


def test_profile_fit_refuses_binary_data_and_sidecars(tmp_path: Path) -> None:
    p = tmp_path / "m.csv"
    p.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    assert "not UTF-8 text" in one_line_error(["profile", "fit", str(p), "-o", str(tmp_path / "x.yaml")])
    shutil.copy(MEASURED, p)
    Path(str(p) + ".meta.json").write_bytes(b"{\xff")
    args = ["profile", "fit", str(p), "-o", str(tmp_path / "x.yaml"), "--bootstrap", "0", "--no-plots"]
    assert "m.csv.meta.json: not UTF-8 text" in one_line_error(args)
    Path(str(p) + ".meta.json").write_text('{"model_facts": [1, 2]}')
    assert "model_facts: must be a JSON object" in one_line_error(args)


# ------------------------------------------------------------------------------------------
# replay sidecars
# ------------------------------------------------------------------------------------------

GOOD_META = {"window": [5.0, 35.0], "seed": 0, "devices": 2, "policy": "wisp", "unfinished": []}


@pytest.mark.parametrize(
    ("change", "field", "expected"),
    [
        ({"seed": -3}, "seed", "must be an integer in [0, 9223372036854775807], got -3"),
        ({"seed": 1.5}, "seed", "got 1.5"),
        ({"seed": "x"}, "seed", "got 'x'"),
        ({"seed": 2**70}, "seed", "must be an integer"),
        ({"seed": True}, "seed", "got True"),
        ({"devices": "ten"}, "devices", "got 'ten'"),
        ({"window": [0, 1e300]}, "window", "end <= 1,000,000"),
        ({"policy": 3}, "policy", "must be a string"),
        ({"sim_end": -1}, "sim_end", "must be a finite number >= 0"),
        (
            {
                "unfinished": [
                    dict.fromkeys(
                        ("device", "slo", "response", "response_start", "prompt_tokens", "output_tokens"), 1
                    )
                    | {"measured": "yes"}
                ]
            },
            "unfinished[0].measured",
            "must be true or false",
        ),
    ],
)
def test_bad_sidecars(tmp_path: Path, change: dict[str, object], field: str, expected: str) -> None:
    log = tmp_path / "log.csv"
    Path(str(log) + ".meta.json").write_text(json.dumps({**GOOD_META, **change}))
    with pytest.raises(WispsimError) as e:
        _read_meta(log)
    assert e.value.field == field and expected in str(e.value) and "\n" not in str(e.value)  # type: ignore[attr-defined]


@pytest.mark.parametrize("data", [b"\xff\xfe{", b'{"window": [0', b"[1, 2]", b'{"window": [0, NaN]}'])
def test_unreadable_sidecars(tmp_path: Path, data: bytes) -> None:
    log = tmp_path / "log.csv"
    Path(str(log) + ".meta.json").write_bytes(data)
    with pytest.raises(WispsimError) as e:
        _read_meta(log)
    assert str(e.value).startswith(str(log) + ".meta.json: ") and "\n" not in str(e.value)


# ------------------------------------------------------------------------------------------
# results folders
# ------------------------------------------------------------------------------------------


def test_results_folder_with_a_binary_manifest_or_corrupt_tables(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "manifest.json").write_bytes(b"\xff\xfe{")
    with pytest.raises(WispsimError, match=r"manifest\.json: not UTF-8 text \(byte 0xff at offset 0\)"):
        Results(folder).meta()
    (folder / "manifest.json").write_text("{")
    with pytest.raises(WispsimError, match=r"manifest\.json: not valid JSON"):
        Results(folder).meta()
    (folder / "manifest.json").write_text("{}")
    (folder / "scenario.yaml").write_bytes(b"policy: \xff")
    with pytest.raises(WispsimError, match=r"scenario\.yaml: not UTF-8 text"):
        Results(folder).meta()
    out = str(tmp_path / "x.png")
    assert "rounds.parquet: not found" in one_line_error(["plot", "attribution", str(folder), "-o", out])
    (folder / "rounds.parquet").write_bytes(b"PAR1 truncated")
    assert "rounds.parquet: cannot read as Parquet" in one_line_error(
        ["plot", "attribution", str(folder), "-o", out]
    )
    (folder / "capacity.csv").write_bytes(b"policy,class\n\xff\xfe\n")
    assert "capacity.csv: not UTF-8 text" in one_line_error(["plot", "capacity", str(folder), "-o", out])


# ------------------------------------------------------------------------------------------
# exported predictors
# ------------------------------------------------------------------------------------------


def _npz(tmp_path: Path, name: str, change: Callable[[dict[str, np.ndarray]], None]) -> str:
    with np.load(PREDICTORS / f"{name}.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    change(arrays)
    p = tmp_path / f"{name}-bad.npz"
    np.savez(p, **arrays)  # type: ignore[arg-type]
    return str(p)


def _nan_w0(a: dict[str, np.ndarray]) -> None:
    a["W0"] = a["W0"].copy()
    a["W0"][0, 0] = np.nan


def _loop(a: dict[str, np.ndarray]) -> None:
    a["node_left"] = a["node_left"].copy()
    a["node_left"][0] = 0  # the root is its own child


@pytest.mark.parametrize(
    ("name", "change", "expected"),
    [
        ("code-t0-mlp", _nan_w0, r"W0: holds NaN or infinite values"),
        ("code-t0-mlp", lambda a: a.pop("threshold"), r"threshold: missing array"),
        ("code-t0-mlp", lambda a: a.update(W0=a["W0"][:2]), r"W0: has 2 rows, expected 4"),
        ("code-t0-mlp", lambda a: a.update(threshold=np.array(7.0)), r"threshold: must be a probability"),
        ("code-t0-mlp", lambda a: a.update(activation=np.array("gelu")), r"unknown activation 'gelu'"),
        ("code-t0-mlp", lambda a: a.update(n_layers=np.array(10**18)), r"n_layers: must be an integer"),
        ("code-t0-xgboost", lambda a: a.update(kind=np.array("svm")), r"kind: got 'svm'"),
        ("code-t0-xgboost", lambda a: a.update(meta=np.array("{bad")), r"meta: not valid JSON"),
        ("code-t0-xgboost", _loop, r"not a readable predictor file: the trees' child indices form a loop"),
    ],
)
def test_bad_predictor_files(tmp_path: Path, name: str, change, expected: str) -> None:  # type: ignore[no-untyped-def]
    p = _npz(tmp_path, name, change)
    load_exported.cache_clear()
    with pytest.raises(WispsimError, match=expected) as e:
        load_exported(p)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("data", [b"", b"PK\x03\x04garbage", b"not an npz"])
def test_unreadable_predictor_files(tmp_path: Path, data: bytes) -> None:
    p = tmp_path / "p.npz"
    p.write_bytes(data)
    load_exported.cache_clear()
    with pytest.raises(WispsimError, match="not a readable predictor file"):
        load_exported(str(p))
