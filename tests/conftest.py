"""Fixtures shared by the test modules (helpers live in ``support.py``)."""

from __future__ import annotations

import os
from typing import Any

# the tests run the pure Python, whether or not the optional mypyc build is in place (a test of
# their own compiles a copy and checks it gives the same records: tests/sim/test_native.py);
# WISPSIM_PURE=0 runs them on the build
os.environ.setdefault("WISPSIM_PURE", "1")

import pytest

from tests.support import deterministic_overrides, write_profile
from wispsim.config import Scenario
from wispsim.sim.scenarios import load_scenario

# vLLM engines started by the tests run their engine core in this process: it starts in half the
# time (no engine process to spawn, which re-imports torch and vLLM); timing is not tested.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# Under pytest-xdist the workers already use every core: one OpenMP thread each for torch and vLLM
# (set before either is imported), so two workers' engines do not spin on each other's cores, and
# vLLM's CPU attention never plans a step for more threads than it runs with (a rare failure seen
# with two: "thread_num == thread_num (2 vs. 1)").
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")


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
