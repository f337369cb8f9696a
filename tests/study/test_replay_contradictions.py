"""A replay log and sidecar that contradict themselves are refused by name, where each had been
accepted and misread (a column in ms beside seconds, a typo'd sidecar key, an unfinished response
that has rounds, a response whose recording stopped although its device went on)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from tests.support import run_wispsim as wispsim
from wispsim.errors import ConfigError
from wispsim.study.replay.read import read_log


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("log")
    p = d / "real.csv"
    r = wispsim("run", "--policy", "wisp", "--devices", "20", "--seed", "1", "--set", "workload.warmup_s=2",
                "--set", "workload.duration_s=30", "--log", str(p), "--out", str(d / "run"))  # fmt: skip
    assert r.returncode == 0, r.stderr[-600:]
    return p


def _copy(log: Path, tmp: Path, rows=None, meta=None):  # type: ignore[no-untyped-def]
    p = tmp / "x.csv"
    df = pd.read_csv(log)
    if rows is not None:
        df = rows(df)
    df.to_csv(p, index=False)
    m = json.loads(Path(f"{log}.meta.json").read_text())
    if meta is not None:
        m = meta(m)
    Path(f"{p}.meta.json").write_text(json.dumps(m))
    return p


def test_the_log_reads(log: Path, tmp_path: Path) -> None:
    read_log(_copy(log, tmp_path))
    shutil.rmtree(tmp_path)


@pytest.mark.parametrize(
    ("rows", "meta", "field"),
    [
        (lambda d: d.assign(draft_s=d.draft_s * 1000), None, "draft_s"),
        (lambda d: d.assign(down_s=d.down_s * 1000), None, "down_s"),
        (
            lambda d: d.assign(response_start=d.response_start + 0.5 * (d["round"] >= 0)),
            None,
            "response_start",
        ),
        (None, lambda m: {**{k: v for k, v in m.items() if k != "unfinished"}, "unfinshed": []}, "unfinshed"),
    ],
)
def test_a_contradiction_is_refused(log: Path, tmp_path: Path, rows, meta, field) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as e:
        read_log(_copy(log, tmp_path, rows, meta))
    assert e.value.field == field


def test_an_unfinished_response_with_rounds_or_listed_twice_is_refused(log: Path, tmp_path: Path) -> None:
    df = pd.read_csv(log)
    row = df[df.measured].iloc[0]
    keys = ("device", "slo", "response", "response_start", "prompt_tokens", "output_tokens", "measured")
    entry = {k: bool(row[k]) if k == "measured" else float(row[k]) if k in ("slo", "response_start")
             else int(row[k]) for k in keys}  # fmt: skip
    with pytest.raises(ConfigError, match="has rounds in the log"):
        read_log(_copy(log, tmp_path, meta=lambda m: {**m, "unfinished": [entry]}))
    ghost = {**entry, "response": 10**6}
    with pytest.raises(ConfigError, match="listed twice"):
        read_log(_copy(log, tmp_path, meta=lambda m: {**m, "unfinished": [ghost, ghost]}))
    with pytest.raises(ConfigError, match="measured"):
        read_log(_copy(log, tmp_path, meta=lambda m: {**m, "unfinished": [{**ghost, "measured": False}]}))


def test_a_stopped_response_whose_device_went_on_is_refused(log: Path, tmp_path: Path) -> None:
    df = pd.read_csv(log)
    counts = df.groupby("device").response.nunique()
    dev = int(counts[counts > 1].index[0])
    first = int(df[df.device == dev].response.min())

    def emptied(d: pd.DataFrame) -> pd.DataFrame:
        d = d.copy()
        d.loc[d.response == first, "output_tokens"] = None
        return d

    with pytest.raises(ConfigError, match="went on to a later response"):
        read_log(_copy(log, tmp_path, rows=emptied))


def test_replay_refuses_a_set_of_what_the_log_fixes(log: Path, tmp_path: Path) -> None:
    for key in ("devices.count=3", "workload.duration_s=5", "drafting.k_max=2"):
        r = wispsim("replay", str(log), "--set", key, "--out", str(tmp_path / "o"))
        assert r.returncode == 2 and r.stderr.startswith(f"error: --set: {key.split('=')[0]}: the log fixes")
