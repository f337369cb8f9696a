"""The README's examples run: Python blocks execute, YAML blocks and shipped scenarios load."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import ROOT
from wispsim.sim.scenarios import load_scenario

README = (ROOT / "README.md").read_text()


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


@pytest.mark.parametrize("code", blocks("python"), ids=lambda c: c.splitlines()[0][:40])
def test_readme_python_blocks_run(code: str, tmp_path: Path) -> None:
    check = ""
    if "@SCHEDULERS.register" in code:
        # the plug-in example must really work as a scheduler
        check = (
            "\nfrom wispsim import check, load_scenario, simulate\n"
            "sc = load_scenario(overrides={'policy': 'custom', 'server': {'scheduler': 'shortest'},"
            " 'workload': {'warmup_s': 2, 'duration_s': 5}}).with_devices(6)\n"
            "assert len(simulate(check(sc)).rounds) > 0\n"
        )
    p = subprocess.run(
        [sys.executable, "-c", code + check], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("text", blocks("yaml"), ids=lambda t: t.splitlines()[0][:40])
def test_readme_yaml_blocks_load(text: str, tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    assert isinstance(yaml.safe_load(text), dict)
    load_scenario(path)


@pytest.mark.parametrize("path", sorted((ROOT / "scenarios").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_scenarios_load(path: Path) -> None:
    load_scenario(path)


def test_readme_mentions_every_command() -> None:
    """Every command the CLI registers (groups and their subcommands) appears in the README."""
    import typer.main

    from wispsim.cli.main import app

    def walk(cmd: Any, prefix: str) -> list[str]:  # typer vendors its own click: duck-type groups
        if hasattr(cmd, "commands"):
            return [n for name, sub in cmd.commands.items() for n in walk(sub, f"{prefix} {name}")]
        return [prefix]

    names = walk(typer.main.get_command(app), "wispsim")
    assert len(names) > 20
    missing = [n for n in names if n not in README]
    assert not missing, f"README does not mention: {missing}"


@pytest.mark.slow
def test_wheel_carries_profiles_traces_and_default_scenario(tmp_path: Path) -> None:
    """A plain `pip install .` must find profiles and the default scenario (package data)."""
    import zipfile

    p = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr
    (wheel,) = tmp_path.glob("wispsim-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "wispsim/data/scenarios/default.yaml" in names
    assert "wispsim/py.typed" in names
    for prof in (ROOT / "profiles").glob("*.yaml"):
        assert f"wispsim/_profiles/{prof.name}" in names
    for trace in (ROOT / "traces").glob("*.parquet"):
        assert f"wispsim/_traces/{trace.name}" in names
    for pred in (ROOT / "predictors").glob("*.npz"):
        assert f"wispsim/_predictors/{pred.name}" in names
