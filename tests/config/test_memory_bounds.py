"""Issue 26 item 7: every memory and hardware fact has an upper bound.

A profile's hardware and model facts (``PROFILE_MAXIMA``) and the scenario's server fields that
enter the KV-cache arithmetic are bounded, so a huge value (``1.0e+308``) is a one-line error
naming the file and the field, with exit code 2, instead of NaN arithmetic and a traceback.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import cli, profile_dict
from wispsim.config.limits import (
    MAX_BATCH_REQUESTS,
    MAX_BATCH_TOKENS,
    MAX_BLOCK_SIZE,
    MAX_KV_TOKENS,
    MAX_MEMORY_GIB,
)
from wispsim.errors import ConfigError
from wispsim.model.profiles import PROFILE_MAXIMA, load_profile, parse_profile

Cap = pytest.CaptureFixture[str]
HUGE = 1.0e308
PROFILE_FIELDS = sorted(PROFILE_MAXIMA)
# the scenario's server fields that feed the KV capacity or the block and batch arithmetic
SERVER_FIELDS = (
    "engine.activation_reserve_gib",
    "engine.gpu_memory_utilization",
    "verifier.kv_headroom",
    "engine.block_size",
    "engine.kv_capacity_tokens",
    "engine.max_num_seqs",
    "verifier.max_batch_tokens",
    "engine.max_num_batched_tokens",
    "verifier.delta_ms",
)


def _roomy_profile() -> dict[str, Any]:
    """The tiny test profile on the most memory allowed, so any one fact at its bound fits."""
    data = profile_dict()
    data["hardware"].update(count=int(PROFILE_MAXIMA["hardware.count"]), memory_gib=MAX_MEMORY_GIB)
    data["model"].update(sliding_window=128, windowed_layers=1)  # its partner for model.sliding_window
    return data


def _set(data: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    *sections, key = dotted.split(".")
    node = data
    for s in sections:
        node = node[s]
    node[key] = value
    return data


def _one_line_error(capsys: Cap, monkeypatch: pytest.MonkeyPatch, *args: str) -> str:
    code, out, err = cli(capsys, monkeypatch, *args)
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert code == 2, (code, out, err)
    assert len(lines) == 1 and "Traceback" not in err, err
    return " ".join(err.split())


@pytest.mark.parametrize("field", PROFILE_FIELDS)
def test_a_huge_profile_fact_is_a_one_line_error(
    field: str, tmp_path: Path, capsys: Cap, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "huge.yaml"
    path.write_text(yaml.safe_dump(_set(_roomy_profile(), field, HUGE)))
    err = _one_line_error(capsys, monkeypatch, "profile", "show", str(path))
    assert f"{path}): {field}: must be <= {PROFILE_MAXIMA[field]:g}, got 1e+308" in err, err


@pytest.mark.parametrize("field", PROFILE_FIELDS)
def test_a_profile_fact_at_its_bound_loads_and_just_past_it_does_not(field: str) -> None:
    top = PROFILE_MAXIMA[field]
    profile = parse_profile(_set(_roomy_profile(), field, top), "at-bound.yaml")
    assert profile.kv_capacity_tokens(0.9, 1.5) > 0
    over = top + 1 if top == int(top) and top < 2**53 else top * 1.01
    with pytest.raises(ConfigError, match=re.escape(f"{field}: must be <= ")):
        parse_profile(_set(_roomy_profile(), field, over), "over.yaml")


def test_a_scenario_naming_a_profile_with_a_huge_fact_names_the_profile_and_field(
    tmp_path: Path, capsys: Cap, monkeypatch: pytest.MonkeyPatch
) -> None:
    prof = tmp_path / "huge-memory.yaml"
    prof.write_text(yaml.safe_dump(_set(profile_dict(), "hardware.memory_gib", HUGE)))
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump({"server": {"profile": str(prof)}}))
    err = _one_line_error(capsys, monkeypatch, "scenario", "validate", str(scenario))
    assert "huge-memory.yaml): hardware.memory_gib: must be <= 4096, got 1e+308" in err, err


@pytest.mark.parametrize("field", SERVER_FIELDS)
def test_a_huge_server_field_is_a_one_line_error(
    field: str, tmp_path: Path, capsys: Cap, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "scenario.yaml"
    group, name = field.split(".")
    path.write_text(yaml.safe_dump({"server": {group: {name: HUGE}}}))
    err = _one_line_error(capsys, monkeypatch, "scenario", "validate", str(path))
    assert f"scenario.yaml: server.{field}: must be" in err, err


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("engine.activation_reserve_gib", MAX_MEMORY_GIB * 1.01, f"[0, {MAX_MEMORY_GIB:g}] GiB per GPU"),
        ("engine.block_size", MAX_BLOCK_SIZE + 1, f"[1, {MAX_BLOCK_SIZE}]"),
        ("engine.kv_capacity_tokens", MAX_KV_TOKENS + 1, f"[1, {MAX_KV_TOKENS:,}]"),
        ("engine.max_num_seqs", MAX_BATCH_REQUESTS + 1, f"[1, {MAX_BATCH_REQUESTS:,}]"),
        ("verifier.max_batch_tokens", MAX_BATCH_TOKENS + 1, f"[1, {MAX_BATCH_TOKENS:,}]"),
        ("engine.max_num_batched_tokens", MAX_BATCH_TOKENS + 1, f"[1, {MAX_BATCH_TOKENS:,}]"),
    ],
)
def test_a_server_field_just_past_its_bound_names_the_range(
    field: str, value: float, allowed: str, capsys: Cap, monkeypatch: pytest.MonkeyPatch
) -> None:
    err = _one_line_error(capsys, monkeypatch, "scenario", "validate", "--set", f"server.{field}={value}")
    assert f"server.{field}: must be in {allowed}" in err, err


def test_sane_values_still_load(tmp_path: Path, capsys: Cap, monkeypatch: pytest.MonkeyPatch) -> None:
    # written with the earlier flat names: a stored scenario keeps loading
    server = {
        "activation_reserve_gib": 2.0,
        "gpu_memory_utilization": 0.85,
        "kv_headroom": 0.1,
        "block_size": 32,
        "max_batch_requests": 512,
        "max_batch_tokens": 32768,
        "prefill_chunk_tokens": 4096,
    }
    path = tmp_path / "sane.yaml"
    path.write_text(yaml.safe_dump({"server": server}))
    code, out, err = cli(capsys, monkeypatch, "scenario", "validate", str(path))
    assert code == 0 and out.startswith("ok:"), (out, err)
    code, out, err = cli(capsys, monkeypatch, "profile", "show", "a100-qwen3-32b-paper")
    assert code == 0 and "KV cache" in out, (out, err)


def test_kv_capacity_never_raises_a_bare_error_on_finite_inputs() -> None:
    """The bounds keep it finite; a Profile built past them in code gets a ConfigError naming the
    fields, not ``ValueError: cannot convert float NaN to integer``."""
    profile = load_profile("a100-qwen3-32b-paper")
    assert profile.kv_capacity_tokens(0.9, 1.5) > 0
    huge_memory = dataclasses.replace(profile, gpu_memory_gib=HUGE)
    for p, reserve in ((huge_memory, 0.0), (huge_memory, HUGE), (profile, HUGE)):
        with pytest.raises(ConfigError, match=r"hardware\.memory_gib") as e:
            p.kv_capacity_tokens(1.0, reserve)
        assert "not a finite number" in str(e.value) and "model.weight_bytes" in str(e.value)
