"""Hostile input to ``wispsim bench``: a malformed real result file for ``--compare`` and odd
``config.json`` values are one-line errors with exit code 2, never tracebacks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.test_cli import wispsim

pytestmark = pytest.mark.slow  # 14 subprocesses; the quick lane keeps test_bench.py's bad-flag checks

SERVER = ["--model", "llama-2-7b", "--gpu", "h100-80gb"]
REAL = {"completed": 20, "total_input_tokens": 4000, "total_output_tokens": 600, "request_rate": 4.0}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"burstiness": "abc"}, "burstiness"),
        ({"burstiness": 0}, "burstiness"),
        ({"max_concurrency": "8"}, "max_concurrency"),
        ({"max_concurrency": 1.5}, "max_concurrency"),
        ({"request_rate": -2}, "request_rate"),
        ({"ramp_up_strategy": "linear"}, "ramp_up_start_rps"),
        ({"ramp_up_strategy": "sideways", "ramp_up_start_rps": 1, "ramp_up_end_rps": 2}, "ramp_up_strategy"),
        (
            {"ramp_up_strategy": "exponential", "ramp_up_start_rps": 0, "ramp_up_end_rps": 2},
            "ramp_up_start_rps",
        ),
        ({"ramp_up_strategy": "linear", "ramp_up_start_rps": 5, "ramp_up_end_rps": 1}, "ramp_up_start_rps"),
    ],
)
def test_a_malformed_real_result_is_one_line(tmp_path: Path, change: dict, field: str) -> None:
    f = tmp_path / "real.json"
    f.write_text(json.dumps({**REAL, **change}))
    p = wispsim("bench", *SERVER, "--compare", str(f))
    assert p.returncode == 2, p.stderr
    assert field in p.stderr and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


BASE = {
    "model_type": "llama",
    "hidden_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "intermediate_size": 1024,
    "vocab_size": 1000,
}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (
            {"quantization_config": {"quant_method": "fp8", "weight_block_size": [0, 128]}},
            "weight_block_size",
        ),
        (
            {"quantization_config": {"quant_method": "fp8", "weight_block_size": ["a", 128]}},
            "weight_block_size",
        ),
        ({"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": "128"}}, "group_size"),
        (
            {
                "quantization_config": {
                    "quant_method": "compressed-tensors",
                    "config_groups": {"g": {"weights": [1]}},
                }
            },
            "config_groups",
        ),
        ({"sliding_window": 64, "max_position_embeddings": "abc"}, "max_position_embeddings"),
    ],
)
def test_odd_config_json_values_are_one_line(tmp_path: Path, change: dict, field: str) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**BASE, **change}))
    p = wispsim("bench", "--model", str(folder), "--gpu", "h100-80gb", "--num-prompts", "5")
    assert p.returncode == 2, p.stderr
    assert field in p.stderr and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
