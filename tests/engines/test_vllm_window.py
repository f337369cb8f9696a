"""Sliding-window KV against vLLM's own engine (wispsim.measure.window_kv): a real engine on its CPU
backend runs more long prompts together than counting every layer in full allows, as many as the
simulator's engine runs with the window kept."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm")

from wispsim.measure.window_kv import Case, compare

pytestmark = pytest.mark.slow  # starts a real vLLM engine


def test_vllm_runs_long_prompts_together_as_the_window_allows(tmp_path: Path) -> None:
    result = compare(Case(step_tokens=2048), tmp_path)
    assert result["engine"]["groups"] == 2  # vLLM's hybrid manager: a full and a sliding group
    s = result["summary"]
    assert s["full"]["peak_running"] < s["vllm"]["peak_running"]
    assert abs(s["simulated"]["peak_running"] - s["vllm"]["peak_running"]) <= 1
    # steps to serve them all: the same with the window kept (memory counted in vLLM's pages), far
    # off counted in full
    assert abs(s["simulated"]["steps"] - s["vllm"]["steps"]) <= 1
    assert s["full"]["steps"] > 1.25 * s["vllm"]["steps"]
