"""The round-cost analysis: the benchmark's CSV checked, grouped by process, and the host-CPU fit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from wispsim.errors import ConfigError
from wispsim.study import round_cost

# ms per unit of every term, for each CPU group: the fit must find them again
TRUE = {
    "api": {"step": 0.2, "request": 0.0, "arrival": 0.18, "session": 0.15, "token": 0.0},
    "engine": {"step": 0.45, "request": 0.02, "arrival": 0.15, "session": 0.09, "token": 1e-4},
    "runner": {"step": 1.2, "request": 0.01, "arrival": 0.05, "session": 0.1, "token": 5e-5},
}


def _rows(noise: float = 0.0, seed: int = 0) -> pd.DataFrame:
    """A benchmark CSV whose groups follow TRUE exactly (plus relative noise): each group's time
    is put in one of its parts, the other parts zero."""
    rng = np.random.default_rng(seed)
    rows = []
    for kind in round_cost.KINDS:
        for prefix in (128, 1024, 4096):
            for batch in (1, 8, 32):
                for r in range(3):
                    new = batch * (5 if kind == "resident" else 4 if kind == "resubmit" else 1)
                    tokens, context = new + batch * 7 * (kind == "resubmit"), prefix + 40
                    rows.append({"kind": kind, "prefix": prefix, "batch": batch, "round": r, "k": 4,
                                 "tokens": tokens, "steps": 1, "new": new, "context": context})  # fmt: skip
    df = pd.DataFrame(rows)
    x = round_cost.features(df)
    for p in round_cost.PARTS:
        df[p] = 0.0
    for group, first in (("api", "input"), ("engine", "hash"), ("runner", "prepare")):
        ms = sum(x[t] * v for t, v in TRUE[group].items())
        df[first] = ms * (1 + noise * rng.standard_normal(len(df))) / 1e3
    df["forward"] = 0.004
    df["wall"] = df[list(round_cost.PARTS)].sum(axis=1)
    return df[list(round_cost.COLUMNS)]


def test_the_fit_recovers_the_terms_it_was_built_from(tmp_path: Path) -> None:
    df = _rows()
    for group, want in TRUE.items():
        coef, score = round_cost.fit(df, group)
        for term, v in want.items():
            assert coef[term] == pytest.approx(v, rel=1e-6, abs=1e-9), (group, term)
        assert score["r2"] == pytest.approx(1.0)


def test_noisy_rows_give_the_terms_within_a_few_percent() -> None:
    coef, score = round_cost.fit(_rows(noise=0.03, seed=1), "engine")
    assert coef["arrival"] == pytest.approx(0.15, rel=0.1)
    assert coef["step"] == pytest.approx(0.45, rel=0.1)
    assert 0.9 < score["r2"] <= 1.0


def test_a_resubmitted_round_hashes_its_whole_prompt_a_resident_one_only_its_new_tokens() -> None:
    df = _rows()
    x = round_cost.features(df)
    one = df[(df.batch == 8) & (df.prefix == 1024) & (df["round"] == 0)].set_index("kind")
    xs = x.loc[df.index[(df.batch == 8) & (df.prefix == 1024) & (df["round"] == 0)]].set_index(one.index)
    assert xs.loc["resubmit", "token"] == 8 * (1024 + 40 + 4)  # its whole prompt: context and drafts
    assert xs.loc["resident", "token"] == 8 * 5
    assert xs.loc["running", "token"] == 8
    assert xs.loc["resubmit", "arrival"] == 8 and xs.loc["resident", "arrival"] == 0
    assert xs.loc["resident", "session"] == 8 and xs.loc["running", "session"] == 0


def test_summary_reads_the_csv_and_drops_the_warm_round(tmp_path: Path) -> None:
    p = tmp_path / "cpu.csv"
    _rows().to_csv(p, index=False)
    table, fits = round_cost.summary(p, warm=1)
    assert set(fits.group) == {"api", "engine", "runner"}
    assert len(table) == 3 * 3 * 3
    resub = table[(table.kind == "resubmit") & (table.batch == 8)]
    assert (resub["tail"] == 7).all()  # tokens forwarded beyond the round's new ones, per round


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d.drop(columns=["hash"]), "hash"),
        (lambda d: d.assign(kind="prefill"), "kind"),
        (lambda d: d.assign(batch=0), "batch"),
        (lambda d: d.assign(wall="fast"), "wall"),
    ],
)
def test_a_bad_csv_is_one_line_naming_the_field(tmp_path: Path, change, field: str) -> None:
    p = tmp_path / "cpu.csv"
    change(_rows()).to_csv(p, index=False)
    with pytest.raises(ConfigError) as e:
        round_cost.load(p)
    assert field in str(e.value) and "\n" not in str(e.value)


def test_api_summary_sets_the_server_latency_beside_the_clients(tmp_path: Path) -> None:
    p = tmp_path / "api.csv"
    rows = [
        {"prefix": pre, "round": r, "k": 4, "tokens": pre + 4, "client": 0.010 + pre * 1e-6, "e2e": 0.007}
        for pre in (128, 4096)
        for r in range(4)
    ]
    pd.DataFrame(rows).to_csv(p, index=False)
    pd.DataFrame(
        [
            {
                "concurrency": 4,
                "prefix": 1024,
                "rounds": 100,
                "wall_s": 5.0,
                "rounds_per_s": 20.0,
                "mean_ms": 200.0,
                "p50_ms": 190.0,
                "p90_ms": 260.0,
            }
        ]
    ).to_csv(tmp_path / "api-load.csv", index=False)
    serial, load = round_cost.api_summary(p)
    row = serial.set_index("prefix").loc[4096]
    assert row["client"] == pytest.approx(14.096) and row["e2e"] == pytest.approx(7.0)
    assert row["http"] == pytest.approx(7.096)
    assert load["rounds_per_s"].tolist() == [20.0]
    (tmp_path / "api-load.csv").unlink()
    with pytest.raises(ConfigError, match=r"api-load\.csv"):
        round_cost.api_summary(p)


@pytest.mark.slow  # starts a real vLLM engine (CPU backend)
def test_the_benchmark_measures_rounds_the_study_reads(tmp_path: Path) -> None:
    """benchmarks/vllm/round_cost.py at a tiny size: every kind's rows, resident rounds that agree
    with a fresh request over the same tokens, and a CSV the analysis accepts."""
    pytest.importorskip("vllm")
    import subprocess
    import sys

    from tests.support import ROOT

    out = tmp_path / "cpu.csv"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "vllm" / "round_cost.py"), "--out", str(out),
           "--prefixes", "128", "--batches", "1,2", "--rounds", "3"]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    df = round_cost.load(out)
    assert sorted(set(df["kind"])) == sorted(round_cost.KINDS)
    resident = df[df["kind"] == "resident"]
    assert (resident["agree"] == resident["batch"]).all()  # the rollback keeps the KV right
    resubmit = df[(df["kind"] == "resubmit") & (df["round"] > 0)]
    assert (resubmit["hash"] > 0).all() and (resubmit["tokens"] >= resubmit["new"]).all()
    table, fits = round_cost.summary(out)
    assert len(table) == 3 * 2 and set(fits.group) == {"api", "engine", "runner"}
    assert (out.with_suffix(".json")).is_file()
