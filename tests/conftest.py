"""Fixtures shared by the test modules (helpers live in ``support.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from support import deterministic_overrides, write_profile

from wispsim.config import Scenario
from wispsim.sim.inputs import load_scenario


@pytest.fixture(scope="session")
def tiny_profile(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Path of a profile with support.py's round coefficients and effectively unlimited memory."""
    return str(write_profile(tmp_path_factory.mktemp("profiles") / "tiny.yaml"))


@pytest.fixture
def det_scenario(tiny_profile: str):
    """Builder: ``det_scenario(server={"max_batch_requests": 1})`` -> Scenario."""

    def make(**sections: dict[str, Any]) -> Scenario:
        return load_scenario(overrides=deterministic_overrides(tiny_profile, **sections))

    return make
