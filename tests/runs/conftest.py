"""A scenario file for the commands of wispsim.runs: support.py's deterministic scenario (two
devices, fixed k=2 drafting at 50 tokens/s, every token accepted, the tiny profile) measured for
one simulated second, written as YAML the way a user hands a command a file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import deterministic_overrides


@pytest.fixture
def scenario_file(tmp_path: Path, tiny_profile: str) -> Callable[..., Path]:
    """Builder: ``scenario_file(devices={"classes": [1, 55]})`` -> the path of a scenario YAML."""

    def make(name: str = "scenario.yaml", **sections: dict[str, Any]) -> Path:
        sections["workload"] = {"duration_s": 1.0, **sections.get("workload", {})}
        path = tmp_path / name
        path.write_text(yaml.safe_dump(deterministic_overrides(tiny_profile, **sections)))
        return path

    return make
