"""Issue 13: hostile command lines get one line on stderr and exit code 2 (never a traceback, a
hang or a silently wrong result); output paths are checked before any work, and a run that fails
while writing leaves no manifest.json (the mark of a complete results folder).

Most tests call ``wispsim.cli.main.main`` in-process (the one-line formatting lives there, which
typer's CliRunner bypasses); two run the real entry point in a subprocess.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import pandas as pd
import pytest

from tests.support import cli

TINY = ["--set", "workload.duration_s=5", "--set", "workload.warmup_s=0"]


def one_line_error(code: int, err: str, after_progress: bool = False) -> str:
    """The one stderr line of a refused command (``after_progress``: a command that failed mid-way
    may have drawn its progress bar first; the error is then the last line, and the only one)."""
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert code == 2, (code, err)
    assert "Traceback" not in err, err
    if after_progress:
        assert [ln for ln in lines if ln.startswith("error")] == lines[-1:], err
        lines = lines[-1:]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    return lines[0]


# ------------------------------------------------------------------------------------------
# usage errors from click/typer: one line
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["run", "--foo"], "error: wispsim run: no such option --foo"),
        (["run", "--devices", "abc"], "error: --devices: expected a whole number, got 'abc'"),
        (["arrivals", "generate"], "error: wispsim arrivals generate: missing option --out"),
        (["bogus"], "error: wispsim: no such command 'bogus'"),
        (["plot", "curves"], "error: wispsim plot curves: missing argument FOLDER"),
        (["run", "--devices"], "requires an argument"),
        (["run", "a.yaml", "b.yaml"], "unexpected extra argument"),
    ],
)
def test_usage_errors_are_one_line(capsys, monkeypatch, args, expected) -> None:
    line = one_line_error(*cli(capsys, monkeypatch, *args)[::2])
    assert expected in line


def test_usage_error_through_the_real_entry_point() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "wispsim.cli", "run", "--devices", "abc"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert one_line_error(p.returncode, p.stderr) == "error: --devices: expected a whole number, got 'abc'"
    assert p.stdout == ""


def test_help_and_version_unchanged(capsys, monkeypatch) -> None:
    code, out, _ = cli(capsys, monkeypatch, "--version")
    assert code == 0 and out.startswith("wispsim ")
    code, out, _ = cli(capsys, monkeypatch, "run", "--help")
    assert code == 0 and "Usage:" in out and "--devices" in out


# ------------------------------------------------------------------------------------------
# numeric and string options: type, finiteness, range, in one shared way
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["run", "--classes", "nan"], "--classes: token speeds must be finite numbers > 0, got 'nan'"),
        (["run", "--classes", "4,inf"], "--classes: token speeds must be finite numbers > 0, got 'inf'"),
        (["run", "--step", "nan"], "--step: must be a finite number, got 'nan'"),
        (["run", "--step", "1e-12"], "--step: 1e-12 s gives"),
        (["run", "--window", "-1"], "--window: must be > 0, got -1"),
        (["run", "--tail", "inf"], "--tail: must be a finite number"),
        (["run", "--devices", "1.5"], "--devices: must be a whole number, got '1.5'"),
        (["run", "--devices", "100000000000000000000"], "--devices: must be <= 1000000"),
        (["run", "--seed", "-1"], "--seed: must be >= 0, got -1"),
        (["run", "--seed", "1e30"], "--seed: must be <= 9223372036854775807"),
        (["run", "--replicas", "0"], "--replicas: must be >= 1, got 0"),
        (["run", "--arrivals", "poisson:inf"], "--arrivals: poisson:RATE needs a finite rate"),
        (["sweep", "--seed", "-1"], "--seed: must be >= 0, got -1"),
        (["sweep", "--policy", "bogus"], "--policy: unknown policy 'bogus'"),
        (["compare", "--policies", "wisp,bogus"], "--policies: unknown policy 'bogus'"),
        (["compare", "--policies", "wisp,sled,wisp"], "--policies: 'wisp' is named twice"),
        (["sweep", "--seeds", "0"], "--seeds: must be >= 1, got 0"),
        (["sweep", "--epsilon", "nan"], "--epsilon: must be a finite number, got 'nan'"),
        (["sweep", "--epsilon", "1"], "--epsilon: must be in [0, 1), got 1"),
        (["sweep", "--jobs", "0"], "--jobs: must be >= 1, got 0"),
        (["sweep", "--start", "64", "--max-devices", "8"], "--start: must be <= --max-devices (8), got 64"),
        (["sweep", "--devices", "1:1e9"], "--devices: N must be <= 1000000"),
        (["sweep", "--devices", "1:100000"], "--devices: a grid of at most 10000 values"),
        (["sweep", "--seed", "9223372036854775807", "--seeds", "2"], "goes past the largest seed"),
        (["sweep", "--backend", "nope"], "--backend: got 'nope'; allowed: local, ray"),
        (["ablate", "predictor", "--seeds", "-3"], "--seeds: must be >= 1, got -3"),
        (["estimator", "compare", "--epsilon", "-0.1"], "--epsilon: must be in [0, 1), got -0.1"),
        (["plan", "--fleet", "nan:3"], "--fleet: expected CLASS:COUNT pairs"),
        (["plan", "--fleet", "4:1e7"], "--fleet: expected CLASS:COUNT pairs"),
        (["plan", "--price-per-gpu-hour", "inf"], "--price-per-gpu-hour: must be a finite number"),
        (["plan", "--max-replicas", "0"], "--max-replicas: must be >= 1, got 0"),
        (["arrivals", "generate", "-o", "t.csv", "--duration", "inf"], "--duration: must be a finite number"),
        (
            ["arrivals", "generate", "-o", "t.csv", "--peaks", "1:nan"],
            "--peaks: times and values must be finite",
        ),
        (["arrivals", "generate", "-o", "t.csv", "--noise", "-1"], "--noise: must be >= 0, got -1"),
        (["profile", "plan", "-o", "p.csv", "--scale", "nan"], "--scale: must be a finite number"),
        (["profile", "plan", "-o", "p.csv", "--counts", "1,2,x,4,5"], "--counts: expected 5 whole numbers"),
        (["profile", "fit", "x.csv", "-o", "p.yaml", "--folds", "1"], "--folds: must be >= 2, got 1"),
        (
            ["profile", "derive", "--arch", "qwen3-14b", "-o", "d.yaml", "--count", "0"],
            "--count: must be >= 1",
        ),
        (
            ["profile", "record", "--plan", "p.csv", "-o", "r.csv", "--max-cv", "nan"],
            "--max-cv: must be a finite",
        ),
        (["trace", "inspect", "x", "--k", "0"], "--k: must be >= 1, got 0"),
        (
            ["predictor", "train", "-t", "x", "-o", "m.npz", "--max-fpr", "2"],
            "--max-fpr: must be in [0, 1], got 2",
        ),
        (["predictor", "bench", "--calls", "0"], "--calls: must be >= 1, got 0"),
        (["plot", "curves", ".", "--epsilon", "inf"], "--epsilon: must be a finite number"),
        (["plot", "attribution", ".", "--factor", "nan"], "--factor: must be a finite number"),
        (["plot", "attribution", ".", "--window", "1.5"], "--window: must be a whole number"),
        (["experiment", "run", "--jobs", "0", "x"], "--jobs: must be >= 1, got 0"),
    ],
)
def test_bad_option_values_are_one_line(capsys, monkeypatch, tmp_path, args, expected) -> None:
    monkeypatch.chdir(tmp_path)  # nothing is written, and nothing lands in the checkout if it were
    line = one_line_error(*cli(capsys, monkeypatch, *args)[::2])
    assert expected in line, line
    assert not (tmp_path / "results").exists()


def test_scientific_notation_is_a_number(capsys, monkeypatch, tmp_path) -> None:
    out = tmp_path / "run"
    code, _, err = cli(
        capsys, monkeypatch, "run", "--devices", "1e1", "--step", "2.5e0", "-o", str(out), *TINY
    )
    assert code == 0, err
    assert json.loads((out / "manifest.json").read_text())["devices"] == 10


# ------------------------------------------------------------------------------------------
# output paths: checked before any work
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["run", "-o", "FILE"], "--out: FILE exists and is a file; give a folder"),
        (["run", "-o", "FILE/sub"], "--out: FILE/sub: cannot create the folder: FILE is a file"),
        (["sweep", "-o", "FILE"], "--out: FILE exists and is a file"),
        (["plan", "-o", "FILE"], "--out: FILE exists and is a file"),
        (["replay", "log.csv", "-o", "FILE"], "--out: FILE exists and is a file"),
        (["run", "--log", "DIR"], "--log: DIR is an existing folder; give a file name"),
        (["run", "--log", "DIR/x.txt"], "--log: DIR/x.txt: the name must end in .parquet, .csv"),
        (["arrivals", "generate", "-o", "DIR"], "--out: DIR is an existing folder"),
        (["profile", "plan", "-o", "DIR"], "--out: DIR is an existing folder"),
        (["profile", "fit", "x.csv", "-o", "DIR/p.txt"], "--out: DIR/p.txt: the name must end in .yaml"),
        (["trace", "inspect", "x", "--plot", "DIR"], "--plot: DIR is an existing folder"),
        (["trace", "inspect", "x", "--plot", "FILE/x.png"], "--plot: FILE/x.png: cannot create the file"),
        (["predictor", "bench", "-o", "DIR"], "--out: DIR is an existing folder"),
        (["plot", "capacity", "DIR", "-o", "FILE/x.png"], "--out: FILE/x.png: cannot create the file"),
    ],
)
def test_output_paths_are_checked_first(capsys, monkeypatch, tmp_path, args, expected) -> None:
    (tmp_path / "FILE").write_text("not a folder")
    (tmp_path / "DIR").mkdir()
    monkeypatch.chdir(tmp_path)
    line = one_line_error(*cli(capsys, monkeypatch, *args)[::2])
    assert expected in line, line


def test_read_only_output_folder(capsys, monkeypatch, tmp_path) -> None:
    # chmod does not stop root, so the check (os.access) is told the folder is read-only
    ro = tmp_path / "ro"
    ro.mkdir()
    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda p, mode: False if Path(p) == ro and mode & os.W_OK else real_access(p, mode)
    )
    for args, opt in [
        (["run", "-o", str(ro / "x"), *TINY], "--out"),
        (["sweep", "-o", str(ro)], "--out"),
        (["arrivals", "generate", "-o", str(ro / "t.csv")], "--out"),
        (["profile", "plan", "-o", str(ro / "p.csv")], "--out"),
        (["run", "--log", str(ro / "log.csv"), "-o", str(tmp_path / "r")], "--log"),
    ]:
        line = one_line_error(*cli(capsys, monkeypatch, *args)[::2])
        assert line.startswith(f"error: {opt}: ") and "is not writable" in line, line
    assert list(ro.iterdir()) == []


def test_nearly_full_disk_is_refused_before_work(capsys, monkeypatch, tmp_path) -> None:
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10 << 30, (10 << 30) - (1 << 20), 1 << 20))
    line = one_line_error(*cli(capsys, monkeypatch, "run", "-o", str(tmp_path / "x"), *TINY)[::2])
    assert "--out" in line and "1.0 MiB free" in line and "at least 50 MiB" in line
    assert not (tmp_path / "x").exists()


def test_missing_parent_folders_are_created(capsys, monkeypatch, tmp_path) -> None:
    out = tmp_path / "a" / "b" / "trace.csv"
    code, _, err = cli(capsys, monkeypatch, "arrivals", "generate", "-o", str(out), "--duration", "60")
    assert code == 0 and out.is_file(), err


# ------------------------------------------------------------------------------------------
# failures while writing: one line, and nothing that looks complete
# ------------------------------------------------------------------------------------------


def _full_disk_on(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """DataFrame.to_csv raises ENOSPC (without a file name, like a failing write) for ``name``."""
    real = pd.DataFrame.to_csv

    def to_csv(self, path=None, *a, **k):
        if path is not None and Path(str(path)).name == name:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, path, *a, **k)

    monkeypatch.setattr(pd.DataFrame, "to_csv", to_csv)


def test_run_that_fails_writing_leaves_no_manifest(capsys, monkeypatch, tmp_path) -> None:
    out = tmp_path / "run"
    code, _, err = cli(capsys, monkeypatch, "run", "--devices", "4", "-o", str(out), *TINY)
    assert code == 0 and (out / "manifest.json").is_file(), err
    _full_disk_on(monkeypatch, "summary.csv")  # the same folder again, now the disk fills up
    line = one_line_error(*cli(capsys, monkeypatch, "run", "--devices", "4", "-o", str(out), *TINY)[::2])
    assert line == f"error: --out {out}: cannot write summary.csv: No space left on device"
    assert not (out / "manifest.json").exists()


def test_sweep_that_fails_writing_keeps_its_points(capsys, monkeypatch, tmp_path) -> None:
    out = tmp_path / "sweep"
    args = ["sweep", "--classes", "8", "--devices", "2,4", "--seeds", "1", "-j", "1"]
    args += ["--start", "2", "--max-devices", "4", "-o", str(out), *TINY]
    _full_disk_on(monkeypatch, "capacity.csv")
    line = one_line_error(*cli(capsys, monkeypatch, *args)[::2], after_progress=True)
    assert line == f"error: --out {out}: cannot write capacity.csv: No space left on device"
    assert not (out / "manifest.json").exists()
    points = [p for p in (out / "points").iterdir() if (p / "summary.csv").is_file()]
    assert points  # finished points are kept; the same command resumes from them
    monkeypatch.undo()
    code, _, err = cli(capsys, monkeypatch, *args)
    assert code == 0 and (out / "manifest.json").is_file(), err


def test_enospc_while_storing_a_point(capsys, monkeypatch, tmp_path) -> None:
    out = tmp_path / "sweep"
    _full_disk_on(monkeypatch, "devices.csv")  # inside the atomic point store
    args = ["sweep", "--classes", "8", "--devices", "2", "--seeds", "1", "-j", "1", "--start", "2"]
    code, _, err = cli(capsys, monkeypatch, *args, "--max-devices", "2", "-o", str(out), *TINY)
    line = one_line_error(code, err, after_progress=True)
    assert line.startswith(f"error: --out {out}: cannot write") and "No space left on device" in line
    assert not (out / "manifest.json").exists()
    assert not [p for p in (out / "points").iterdir() if p.name.startswith(".")]  # no half point
