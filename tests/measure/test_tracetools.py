"""`wispsim trace inspect` figures on a hand-made trace, and the predictor ablation command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from wispsim.measure.trace.inspect import inspect_trace, window_lengths
from wispsim.model.acceptance import load_trace


def write_trace(path: Path, samples: list[list[int]], top1: list[list[float]] | None = None) -> Path:
    rows = []
    for sid, acc in enumerate(samples):
        for pos, a in enumerate(acc):
            t1 = top1[sid][pos] if top1 else (0.9 if a else 0.2)
            rows.append(
                {
                    "sample_id": sid,
                    "position": pos,
                    "context_length": 10 + pos,
                    "top1_prob": t1,
                    "entropy": 1 - t1,
                    "margin": t1 / 2,
                    "logit_std": 3 * t1,
                    "beta": 0.8 if a else 0.3,
                    "greedy_agree": bool(a),
                    "accept": bool(a),
                    "target_top1_prob": 0.9,
                }
            )
    pd.DataFrame(rows).to_parquet(path, index=False)
    return path


def test_window_lengths_walk_like_verification(tmp_path: Path) -> None:
    # K = 3 over 1 1 0 | 1 1 1 | (bonus) 0 | 1 -> windows at 0 (L=2), 3 (L=3), 7 (L=0), 8 (L=1)
    tr = load_trace(str(write_trace(tmp_path / "t.parquet", [[1, 1, 0, 1, 1, 1, 1, 0, 1]])))
    assert window_lengths(tr, tr.flag, 3).tolist() == [2, 3, 0, 1]


def test_inspect_figures_by_hand(tmp_path: Path) -> None:
    samples = [[1, 1, 0, 1, 1, 1, 1, 0, 1], [0, 1, 1, 1, 1, 1, 0]]
    tr = load_trace(str(write_trace(tmp_path / "t.parquet", samples)))
    r = inspect_trace(tr, k=3)
    flat = [a for s in samples for a in s]
    assert r["positions"] == 16 and r["samples"] == 2
    assert r["mean_accept"] == pytest.approx(np.mean(flat))
    assert r["mean_beta"] == pytest.approx(np.mean([0.8 if a else 0.3 for a in flat]))
    # sample 2 with K=3: window at 0 (L=0), 1 (L=3), 5 (L=1, then the sample ends)
    lengths = [2, 3, 0, 1, 0, 3, 1]
    assert r["accepted_length_hist"] == {0: 2, 1: 2, 2: 1, 3: 2}
    assert r["mean_accepted_length"] == pytest.approx(np.mean(lengths))
    # acceptance at window position j given reached: reached j <=> L >= j
    lens = np.array(lengths)
    expect = [(lens >= j + 1).sum() / (lens >= j).sum() for j in range(3)]
    assert r["accept_by_window_position"] == pytest.approx(expect)
    # features were built monotone in the verdict: strong positive correlation with accept
    assert r["pearson"]["top1_prob"]["accept"] == pytest.approx(1.0)
    assert r["pearson"]["entropy"]["accept"] == pytest.approx(-1.0)
    bins = {b["top1_low"]: b for b in r["accept_by_top1_bin"]}
    assert bins[0.9]["accept_rate"] == 1.0 and bins[0.2]["accept_rate"] == 0.0


@pytest.mark.slow
def test_trace_inspect_cli_prints_and_plots(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t.parquet", [[1, 0, 1, 1, 1, 0, 1, 1]])
    png = tmp_path / "fig.png"
    p = subprocess.run(
        [sys.executable, "-m", "wispsim.cli", "trace", "inspect", str(path), "--plot", str(png)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert "accepted length histogram" in p.stdout and png.stat().st_size > 10_000
    q = subprocess.run(
        [sys.executable, "-m", "wispsim.cli", "trace", "inspect", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert json.loads(q.stdout)["positions"] == 8
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet")
    e = subprocess.run(
        [sys.executable, "-m", "wispsim.cli", "trace", "inspect", str(bad)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert e.returncode == 2 and "not a readable Parquet trace" in e.stderr and "Traceback" not in e.stderr


def test_predictor_ablation_on_a_trace(tmp_path: Path) -> None:
    from wispsim.sim.scenarios import load_scenario
    from wispsim.study.ablation import ablate_predictor
    from wispsim.study.runners import LocalRunner

    sc = load_scenario(
        overrides={
            "acceptance": {"model": "trace", "trace": "fixture-synthetic", "lengths": "workload"},
            "devices": {"classes": [8]},
            "workload": {"warmup_s": 2, "duration_s": 10},
        }
    )
    with LocalRunner(1, tmp_path) as runner:
        per_seed, table = ablate_predictor(sc, [2, 8], [0], runner)
    assert len(per_seed) == 4 and set(per_seed.predictor) == {"on", "off"}
    assert table.devices.tolist() == [2, 8]
    # fixed K = 5 drafts exactly 5 (less only at the end of a response); the predictor stops early
    assert (table.mean_k_off <= 5).all() and (table.mean_k_off > 4.5).all()
    # the predictor stops before predicted rejections: fewer wasted tokens per round
    assert (table.wasted_tokens_on < table.wasted_tokens_off).all()
    assert (table.acceptance_ratio_on > table.acceptance_ratio_off).all()
