"""Figures from results folders (``wispsim plot ...``, :mod:`wispsim.plots`).

The result folders are made once per session by the real CLI on tiny configs: a compare of two
policies on two classes, and two runs (wisp, fcfs) on a generated two-minute bursty trace.
tests/test_notebooks.py executes the notebooks on the same folders.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from wispsim.cli import app
from wispsim.errors import WispsimError
from wispsim.plots import (
    COMPUTE,
    QUEUE,
    attribute_rounds,
    attribution,
    capacity_bars,
    violated_rounds,
    violation_curves,
)

QUICK = ["--set", "workload.warmup_s=2", "--set", "workload.duration_s=8"]
_BUILT: dict[str, object] = {}  # one set of folders per session, shared with test_notebooks.py


def wispsim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wispsim.cli", *args], capture_output=True, text=True, timeout=600
    )


TRACE = "--duration 120 --low 10 --high 30 --period 120 --peaks 40:140 --hold 10 --decay 30"
RUN = "run --tail 30 --arrivals"
COMPARE = "compare --policies wisp,fcfs --classes 4,8 --seeds 1 --devices 40,80,120 --jobs 1"


def build_results(factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    """(compare folder, {policy: bursty run folder}), built on first use."""
    if "results" not in _BUILT:
        root = factory.mktemp("plot-results")
        trace = root / "mini.csv"
        gen = wispsim("arrivals", "generate", "--out", str(trace), *TRACE.split())
        assert gen.returncode == 0, gen.stderr
        runs = {p: root / f"bursty-{p}" for p in ("wisp", "fcfs")}
        # the two runs go in the background while the compare uses the other core
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "wispsim.cli",
                    *RUN.split(),
                    str(trace),
                    "--policy",
                    p,
                    "--out",
                    str(f),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for p, f in runs.items()
        ]
        cmp = root / "compare"
        c = wispsim(*COMPARE.split(), "--out", str(cmp), *QUICK)
        assert c.returncode == 0, c.stderr
        for proc in procs:
            _, err = proc.communicate(timeout=600)
            assert proc.returncode == 0, err
        _BUILT["results"] = (cmp, runs)
    return _BUILT["results"]  # type: ignore[return-value]


@pytest.fixture(scope="session")
def compare_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_results(tmp_path_factory)[0]


@pytest.fixture(scope="session")
def bursty_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_results(tmp_path_factory)[1]


def is_png(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 1000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def invoke(*args: str) -> str:
    r = CliRunner().invoke(app, ["plot", *args])
    assert r.exit_code == 0, (r.output, r.exception)
    return r.output


# ------------------------------------------------------------------------------------------
# every command writes a PNG
# ------------------------------------------------------------------------------------------


def test_curves_and_capacity_write_pngs_inside_the_folder(compare_dir: Path) -> None:
    invoke("curves", str(compare_dir))
    assert is_png(compare_dir / "violation_curves.png")
    invoke("capacity", str(compare_dir))
    assert is_png(compare_dir / "capacity.png")


def test_bursty_writes_one_figure_for_several_runs(bursty_runs: dict[str, Path], tmp_path: Path) -> None:
    folders = [str(f) for f in bursty_runs.values()]
    invoke("bursty", *folders)
    assert is_png(bursty_runs["wisp"] / "bursty_compare.png")
    out = tmp_path / "two-classes.png"
    invoke("bursty", *folders, "--label", "A", "--label", "B", "--classes", "2,all", "--out", str(out))
    assert is_png(out)


def test_attribution_writes_the_figure_and_prints_the_shares(bursty_runs: dict[str, Path]) -> None:
    text = invoke("attribution", str(bursty_runs["fcfs"]))
    assert is_png(bursty_runs["fcfs"] / "attribution.png")
    assert "compute-dominant" in text and "queue-dominant" in text


def test_violation_curves_reads_epsilon_and_draws_a_shared_mix(tmp_path: Path) -> None:
    """From frames: a mix panel per class, the worst class's interval, a knee per policy."""
    cap = pd.DataFrame(
        {
            "policy": ["wisp", "fcfs"],
            "class": ["mix:4,8", "mix:4,8"],
            "capacity": [60, 40],
            "ci_low": [55, 40],
            "ci_high": [64, 45],
            "saturated": [False, False],
        }
    )
    rows = []
    for pol, knee in (("wisp", 60), ("fcfs", 40)):
        for n in (20, 40, 60, 80):
            for cls, worse in (("4", 0.0), ("8", 0.1)):
                v = min(1.0, max(0.0, (n - knee) / 40 + worse))
                rows.append((pol, "mix:4,8", cls, n, v, v + 0.1, max(v - 0.05, 0), min(v + 0.1, 1)))
    pooled = pd.DataFrame(
        rows,
        columns=[
            "policy", "group", "class", "devices", "violation_rate",
            "decision_violation", "decision_ci_low", "decision_ci_high",
        ],
    )  # fmt: skip
    out = violation_curves((cap, pooled), tmp_path / "mix.png", epsilon=0.05)
    assert is_png(out)
    assert is_png(capacity_bars(cap, tmp_path / "bars.png"))


def test_frames_without_the_needed_columns_are_refused(tmp_path: Path) -> None:
    cap = pd.DataFrame({"policy": ["wisp"], "class": ["4"], "capacity": [10]})
    with pytest.raises(WispsimError, match="capacity table: missing column"):
        capacity_bars(cap, tmp_path / "x.png")


# ------------------------------------------------------------------------------------------
# attribution (SPEC 7)
# ------------------------------------------------------------------------------------------


def _batches_and_rounds() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Replica 0: six 10 ms batches, a 30 ms one, a 10 ms one; replica 1: one 50 ms batch."""
    lat0 = [0.01] * 6 + [0.03, 0.01]
    batches = pd.DataFrame(
        {
            "batch": [*range(8), 8],
            "replica": [0] * 8 + [1],
            "t_dispatch": [*map(float, range(8)), 6.5],
            "latency": [*lat0, 0.05],
        }
    ).sample(frac=1.0, random_state=1)  # order must come from t_dispatch, not from the rows
    rounds = pd.DataFrame(
        {
            "response": np.arange(9),
            "slo": 4.0,
            "batch": np.arange(9),
            "arrival": np.arange(9) - 0.5,
            "dispatch": np.arange(9, dtype=float),
            "verify_time": [*lat0, 0.05],
            "measured": True,
        }
    )
    return batches, rounds


def test_a_batch_slower_than_factor_times_the_recent_ones_is_compute_dominant() -> None:
    batches, rounds = _batches_and_rounds()
    out = attribute_rounds(rounds, batches, window=3, factor=1.5)
    labels = dict(zip(out.batch, out.label, strict=True))
    assert labels[6] == COMPUTE  # 30 ms > 1.5 x 10 ms
    assert [labels[b] for b in (0, 1, 2, 3, 4, 5, 7)] == [QUEUE] * 7
    assert labels[8] == QUEUE  # replica 1's first batch: no history, not compared with replica 0
    ma = dict(zip(out.batch, out.batch_ma, strict=True))
    assert np.isnan(ma[0]) and np.isnan(ma[8])
    assert ma[7] == pytest.approx((0.01 + 0.01 + 0.03) / 3)  # the last 3 batches before it
    assert ma[2] == pytest.approx(0.01)  # fewer than `window` batches so far: their mean
    assert out.queue_time.tolist() == pytest.approx([0.5] * 9)
    # a larger factor makes it queue-dominant
    assert (attribute_rounds(rounds, batches, window=3, factor=3.5).label == QUEUE).all()


def test_only_the_rounds_of_measured_violated_responses_are_attributed(tmp_path: Path) -> None:
    batches, rounds = _batches_and_rounds()
    rounds.loc[rounds.response == 5, "measured"] = False
    responses = pd.DataFrame(
        {"response": [5, 6, 7], "violated": [True, True, False], "measured": [False, True, True]}
    )
    assert violated_rounds(rounds, responses).response.tolist() == [6]
    path, counts = attribution(rounds, batches, tmp_path / "a.png", window=3, responses=responses)
    assert counts == {COMPUTE: 1, QUEUE: 0}
    assert is_png(path)


def test_without_responses_a_response_is_violated_when_its_rounds_are_too_slow() -> None:
    # response 1: 4 tokens over 2 s = 2 tok/s < 4 (violated); response 2: 8 tokens in 1 s
    rounds = pd.DataFrame(
        {
            "response": [1, 1, 2, 2],
            "slo": 4.0,
            "t_start": [0.0, 1.0, 0.0, 0.5],
            "t_end": [1.0, 2.0, 0.5, 1.0],
            "committed": [2, 2, 4, 4],
            "measured": True,
        }
    )
    assert violated_rounds(rounds).response.tolist() == [1, 1]


def test_attribution_of_a_real_run_counts_every_violated_round(bursty_runs: dict[str, Path]) -> None:
    f = bursty_runs["wisp"]
    rounds, batches = pd.read_parquet(f / "rounds.parquet"), pd.read_parquet(f / "batches.parquet")
    responses = pd.read_parquet(f / "responses.parquet")
    path, counts = attribution(rounds, batches, f / "attr.png", responses=responses)
    assert is_png(path)
    n = len(violated_rounds(rounds, responses))
    assert n > 0 and sum(counts.values()) == n


# ------------------------------------------------------------------------------------------
# bad input: one line, exit code 2, the file named
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["curves", "{tmp}/nowhere"], "nowhere: no such results folder"),
        (["capacity", "{run}"], "capacity.csv: not found"),
        (["curves", "{tmp}/corrupt"], "corrupt/capacity.csv: missing column(s)"),
        (["capacity", "{tmp}/ragged"], "ragged/capacity.csv: cannot read as CSV"),
        (["attribution", "{cmp}"], "rounds.parquet: not found"),
        (["bursty", "{run}", "--label", "a", "--label", "b"], "--label: got 2 label(s) for 1 folder(s)"),
    ],
)
def test_bad_input_is_one_line_naming_the_file(
    args: list[str], expected: str, tmp_path: Path, compare_dir: Path, bursty_runs: dict[str, Path]
) -> None:
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "capacity.csv").write_bytes(b"\x00\x01garbage;;;\nnot,a,sweep\n")
    (tmp_path / "ragged").mkdir()
    (tmp_path / "ragged" / "capacity.csv").write_text("policy,class\nwisp,4\nwisp,8,90,80,99\n")
    subs = {"tmp": str(tmp_path), "run": str(bursty_runs["wisp"]), "cmp": str(compare_dir)}
    p = wispsim("plot", *[a.format(**subs) for a in args])
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert expected in p.stderr, p.stderr
