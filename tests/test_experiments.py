"""`wispsim experiment run --all --quick`: every study runs, writes its data, figures and section,
and the report links only figures that exist."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from wispsim.cli import app
from wispsim.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("exp")
    skip = shutil.ignore_patterns("data", "quick", "*.md")
    shutil.copytree(ROOT / "experiments", work / "experiments", ignore=skip)
    mp = pytest.MonkeyPatch()
    mp.chdir(work)
    try:
        r = CliRunner().invoke(app, ["experiment", "run", "--all", "--quick"])
        assert r.exit_code == 0, r.output + repr(r.exception)
    finally:
        mp.undo()
    return work / "experiments" / "quick"


def test_every_study_writes_its_section_and_figures(quick_run: Path) -> None:
    names = sorted(p.stem for p in (ROOT / "experiments").glob("*.yaml"))
    assert len(names) == 7
    for name in names:
        sec = (quick_run / name / "section.md").read_text()
        assert (
            sec.startswith("## ") and "quick size" in sec and f"wispsim experiment run {name} --quick" in sec
        )
        assert (quick_run / name / "run.json").is_file()
    report = (quick_run / "REPORT.md").read_text()
    figures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report)
    assert len(figures) >= 8
    for fig in figures:
        assert (quick_run / fig).is_file() and (quick_run / fig).stat().st_size > 1000, fig
    assert "Not run yet" not in report


def test_quick_capacity_and_mix_tables_have_numbers(quick_run: Path) -> None:
    cap = pd.read_csv(quick_run / "capacity" / "a100-qwen3-32b" / "capacity.csv")
    assert set(cap.policy) == {"wisp", "sled"} and (cap.capacity > 0).all()
    mix = pd.read_csv(quick_run / "mix" / "curve_pooled.csv")
    assert set(mix.policy) == {"wisp", "fcfs"}
    acc = pd.read_csv(quick_run / "acceptance" / "capacity.csv")
    assert set(acc.acceptance) == {"trace", "bernoulli"}


def test_unknown_experiment_lists_the_known_ones() -> None:
    from wispsim.experiments import load_spec

    with pytest.raises(ConfigError, match=r"known: .*capacity"):
        load_spec("nope")
