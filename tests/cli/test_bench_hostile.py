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


DETAILED = {
    **REAL,
    "completed": 3,
    "failed": 1,
    "num_prompts": 4,
    "total_input_tokens": 300,
    "total_output_tokens": 60,
    "input_lens": [100, 100, 50, 100],
    "output_lens": [20, 20, 0, 20],
    "start_times": [10.0, 10.5, 11.0, 11.5],
    "mean_ttft_ms": 50.0,
    "p90_ttft_ms": 70.0,
    "request_goodput": 1.5,
}


def test_a_real_detailed_file_is_checked_and_its_failed_requests_left_out() -> None:
    """vLLM lists every request sent in a --save-detailed file (a failed one with output 0) and
    totals the completed ones: those are re-created, at their start times, and said; lists or
    totals that disagree, a missing request_rate or a figure that is not a number are refused."""
    from wispsim.errors import ConfigError
    from wispsim.runs.bench import Client
    from wispsim.runs.bench_compare import RealRun

    client, notes = RealRun("real.json", DETAILED).client(Client())
    assert client.lengths == ((100, 100, 100), (20, 20, 20)) and client.arrivals == (0.0, 0.5, 1.5)
    assert any("1 of 4 requests failed" in n for n in notes)
    assert "p90_ttft_ms" in RealRun("real.json", DETAILED).figures()
    for change, field in (
        ({"input_lens": [100, 100, 50]}, "input_lens"),
        ({"total_input_tokens": 350}, "total_input_tokens"),
        ({"output_lens": None}, "output_lens"),
        ({"mean_ttft_ms": "50"}, "mean_ttft_ms"),
        ({"start_times": [1, 2]}, "start_times"),
    ):
        with pytest.raises(ConfigError) as err:
            RealRun("real.json", {**DETAILED, **change}).client(Client())
        assert err.value.field == field, err.value
    with pytest.raises(ConfigError, match="request_rate: is missing"):
        RealRun("real.json", {k: v for k, v in REAL.items() if k != "request_rate"}).client(Client())
    _, notes = RealRun("real.json", REAL).client(Client())
    assert any("at the file's mean lengths" in n for n in notes)
    assert any("burstiness not in the file" in n for n in notes)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--request-rate", "8"], "error: --request-rate: compare: --compare takes the workload"),
        (["--input-len", "100"], "error: --input-len: compare:"),
    ],
)
def test_compare_refuses_a_workload_flag_beside_the_file(tmp_path: Path, args: list[str], says: str) -> None:
    f = tmp_path / "real.json"
    f.write_text(json.dumps(REAL))
    p = wispsim("bench", *SERVER, "--compare", str(f), *args)
    assert p.returncode == 2 and p.stderr.startswith(says) and len(p.stderr.strip().splitlines()) == 1


def test_a_shared_prefix_a_result_file_does_not_record_is_the_commands() -> None:
    """``--random-prefix-len`` beside ``--compare``: the tokens every prompt shares (a result file
    does not say), the head of each recorded input; longer than the shortest prompt, refused."""
    from dataclasses import replace

    from wispsim.errors import ConfigError
    from wispsim.runs.bench import Client, workload
    from wispsim.runs.bench_compare import RealRun

    client, _ = RealRun("real.json", DETAILED).client(replace(Client(), random_prefix_len=40))
    ins, _, times, prefix, _, n = workload(client, None)  # type: ignore[arg-type]
    assert (prefix, n, list(ins), times) == (40, 3, [100, 100, 100], [0.0, 0.5, 1.5])
    mean, _ = RealRun("real.json", {**REAL, "total_output_tokens": 610}).client(
        replace(Client(), random_prefix_len=40)
    )
    ins, outs, _, prefix, _, n = workload(mean, None)  # type: ignore[arg-type]
    assert (prefix, n, set(ins)) == (40, 20, {200})  # 4,000 tokens over 20 requests, the prefix shared
    assert sum(outs) == 610 and set(outs) == {30, 31}  # the file's total to the token, each at the mean
    with pytest.raises(ConfigError, match="not shorter than the file's shortest prompt"):
        RealRun("real.json", DETAILED).client(replace(Client(), random_prefix_len=150))
