"""``wispsim profile calibrate``: a physical profile's engine overheads fitted on public vLLM
benchmark runs written as ``vllm bench serve --save-result`` files, with leave-one-run-out errors."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.cli.test_cli import wispsim
from wispsim.study.public import data_dir

# the Qwen3-32B sweep on one H100 SXM5 94GB (tomasruizt/vllm-scripts): no prompt repeats or shared
# prefixes, which a vllm bench serve result file could not describe
RUNS = [
    "ruiz-qwen3-32b-nospec-c1",
    "ruiz-qwen3-32b-nospec-c4",
    "ruiz-qwen3-32b-nospec-c16",
    "ruiz-qwen3-32b-nospec-c64",
]


def _as_vllm_result(row: pd.Series, path: Path) -> None:
    """A public run (experiments/data/public/runs.csv) in vllm bench serve's result keys."""
    n = int(row.num_prompts)
    path.write_text(
        json.dumps(
            {
                "completed": n,
                "num_prompts": n,
                "request_rate": float(row.request_rate),
                "burstiness": 1.0,
                "max_concurrency": int(row.concurrency),
                "total_input_tokens": int(row.input_len_mean * n),
                "total_output_tokens": int(row.output_len_mean * n),
                "median_tpot_ms": row.tpot_median_ms,
                "median_ttft_ms": row.ttft_median_ms,
                "mean_e2el_ms": row.e2e_mean_ms,
                "output_throughput": row.output_throughput_tok_s,
            }
        )
    )


@pytest.mark.slow
def test_calibrate_on_public_runs_reports_held_out_errors(tmp_path: Path) -> None:
    runs = pd.read_csv(data_dir() / "runs.csv").set_index("run_id")
    files = []
    for r in RUNS:
        if r not in runs.index:
            pytest.skip(f"{r} not in the public data")
        files.append(tmp_path / f"{r}.json")
        _as_vllm_result(runs.loc[r], files[-1])
    out = tmp_path / "mine.yaml"
    p = wispsim(
        "profile",
        "calibrate",
        *map(str, files),
        "--model",
        "Qwen/Qwen3-32B",
        "--gpu",
        "h100-94gb-sxm",
        "--max-num-seqs",
        "1024",
        "--max-num-batched-tokens",
        "8192",
        "--no-enable-prefix-caching",
        "--max-prompts",
        "160",
        "--out",
        str(out),
    )
    assert p.returncode == 0, p.stderr
    prof = yaml.safe_load(out.read_text())
    loo = prof["roofline"]["fit"]["leave_one_run_out_ape_pct"]
    assert [r["run"] for r in loo] == [f"{r}.json" for r in RUNS]
    for r in loo:  # a run the fit never saw: per-token latency within the 10% target
        assert r["median_tpot_ms"] <= 10, r
    assert wispsim("bench", "--profile", str(out), "--num-prompts", "10").returncode == 0
    # it says it is calibrated, on the user's files (not "not measured" on the shipped runs)
    assert prof["provenance"]["kind"] == "calibrated"
    assert prof["provenance"]["inputs"]["calibrated_on"] == list(map(str, files))
    assert "not measured" not in prof["description"]


def test_calibrate_rejects_bad_result_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"

    def calibrate(text: str):  # type: ignore[no-untyped-def]
        bad.write_text(text)
        args = ["--model", "llama-2-7b", "--gpu", "h100-80gb", "--out", str(tmp_path / "o.yaml")]
        return wispsim("profile", "calibrate", str(bad), *args)

    p = calibrate("{not json")
    assert p.returncode == 2 and "bad.json" in p.stderr and "JSON" in p.stderr
    p = calibrate(json.dumps({"completed": 10}))
    assert p.returncode == 2 and "total_input_tokens" in p.stderr


def test_calibrate_refuses_figures_it_would_misread(tmp_path: Path) -> None:
    """A figure that is not a positive number, more completed requests than prompts, or fewer
    output tokens than completed requests: one line naming the key (they had been dropped or
    clamped, and the fit went on)."""
    from wispsim.errors import ConfigError
    from wispsim.study.calibrate import read_result

    base = {"completed": 50, "num_prompts": 50, "request_rate": 4.0, "max_concurrency": 4,
            "total_input_tokens": 7227, "total_output_tokens": 10000, "median_tpot_ms": 34.28,
            "median_ttft_ms": 106.0, "output_throughput": 110.49}  # fmt: skip
    server = {"max_num_seqs": 256, "max_num_batched_tokens": 8192}
    f = tmp_path / "r.json"
    f.write_text(json.dumps({**base, "mean_e2el_ms": float("nan")}))
    assert "mean_e2el_ms" not in read_result(f, server).real  # vLLM's NaN: not reported
    for change, key in (
        ({"median_tpot_ms": -34.0}, "median_tpot_ms"),
        ({"median_tpot_ms": "34.28"}, "median_tpot_ms"),
        ({"completed": 500}, "completed"),
        ({"total_output_tokens": 0}, "total_output_tokens"),
        ({"output_lens": [3, "x"]}, "output_lens"),
    ):
        f.write_text(json.dumps({**base, **change}))
        with pytest.raises(ConfigError) as e:
            read_result(f, server)
        assert e.value.field == key and str(f) in str(e.value)
