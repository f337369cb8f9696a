"""Errors on public runs read by regime (issue 45): the regime a run belongs to, the per-regime
medians, and the kernels a layer launches (dense layers as before; MLA and MoE add theirs)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from wispsim.model.archs import load_arch
from wispsim.study.public_regimes import engine_generation, load_of, regime_table, regime_wide


def test_engine_generation_and_load() -> None:
    assert engine_generation("0.6.0") == "V0" and engine_generation("0.11.0") == "V1"
    assert engine_generation("0.1.dev13107+ge1a34c3a5") == "V1"  # a 2025 source build
    assert engine_generation(math.nan) == "V1?"
    assert load_of(pd.Series({"concurrency": 4.0, "request_rate": math.nan})) == "light"
    assert load_of(pd.Series({"concurrency": math.nan, "request_rate": 5.0})) == "open loop"
    assert load_of(pd.Series({"concurrency": 64.0, "request_rate": math.nan})) == "closed loop"
    assert load_of(pd.Series({"concurrency": math.nan, "request_rate": math.nan})) == "all at once"


def test_regime_table_gives_absolute_and_signed_medians() -> None:
    runs = pd.DataFrame(
        [
            {"run_id": "a", "arch": "qwen3-32b", "gpu": "a100-80gb", "tp": 1, "concurrency": 4.0,
             "request_rate": math.nan, "engine_version": "0.11.0"},
            {"run_id": "b", "arch": "gpt-oss-20b", "gpu": "h100-80gb", "tp": 1, "concurrency": math.nan,
             "request_rate": math.nan, "engine_version": "0.11.0"},
        ]
    )  # fmt: skip
    errors = pd.DataFrame(
        [
            {"run_id": "a", "metric": "tpot_median_ms", "real": 10.0, "simulated": 9.0, "ape_pct": 10.0},
            {"run_id": "a", "metric": "tpot_mean_ms", "real": 10.0, "simulated": 11.0, "ape_pct": 10.0},
            {"run_id": "b", "metric": "output_throughput_tok_s", "real": 100.0, "simulated": 200.0,
             "ape_pct": 100.0},
        ]
    )  # fmt: skip
    t = regime_table(errors, runs).set_index(["gpu", "family"])
    assert t.loc[("a100-80gb", "TPOT/ITL"), "median_ape"] == 10.0
    assert t.loc[("a100-80gb", "TPOT/ITL"), "median_signed"] == pytest.approx(0.0)
    assert t.loc[("h100-80gb", "throughput"), "model"] == "MoE"
    assert t.loc[("h100-80gb", "throughput"), "load"] == "all at once"
    wide = regime_wide(regime_table(errors, runs))
    assert wide.loc[wide.gpu == "h100-80gb", "throughput"].item() == "100 (+100)"


def test_kernels_a_layer_launches() -> None:
    dense = load_arch("qwen3-32b")
    assert dense.kernel_latency(5e-6, 18e-6) == pytest.approx(dense.layers * (4 * 5e-6 + 18e-6))
    moe = load_arch("gpt-oss-20b")  # a router GEMM and a routing group per MoE layer, no shared expert
    assert moe.kernel_latency(5e-6, 18e-6) == pytest.approx(moe.layers * (5 * 5e-6 + 2 * 18e-6))
    ds = load_arch("deepseek-v3")  # latent attention everywhere; routing and shared experts on MoE layers
    expected = ds.layers * (7 * 5e-6 + 2 * 18e-6) + ds.moe_layers * (3 * 5e-6 + 18e-6)
    assert ds.kernel_latency(5e-6, 18e-6) == pytest.approx(expected)


def test_spread_keeps_the_means_and_what_the_client_fixed() -> None:
    from wispsim.study.bench import BenchRun
    from wispsim.study.public_regimes import spread

    run = BenchRun(2000, [256], [100])
    s = spread(run, "random 256/128", seed=1)
    assert s.input_lens == [256] and len(s.output_lens) == 2000  # synthetic prompts stay
    assert abs(sum(s.output_lens) / 2000 - 100) < 8 and max(s.output_lens) <= 400
    g = spread(run, "sharegpt", seed=1, outputs=False)
    assert g.output_lens == [100] and len(set(g.input_lens)) > 10 and max(g.input_lens) <= 1024


def test_an_unchanged_calibration_keeps_the_file_its_profiles_embed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rerunning the public study with the same parameters on the same runs leaves roofline.yaml
    (whose fit record every shipped physical profile embeds) as it was; new parameters rewrite it."""
    import pandas as pd
    import yaml

    from wispsim.paths import data_dir
    from wispsim.study.experiments import public_study

    shipped_text = (data_dir() / "roofline.yaml").read_text()
    (tmp_path / "roofline.yaml").write_text(shipped_text)
    monkeypatch.setattr(public_study, "package_data", lambda: tmp_path)
    entry = yaml.safe_load(shipped_text)["vllm"]
    params = {"overhead_ms": dict(entry["overhead_ms"]), "host_cpu_speed": entry["host_cpu_speed"]}
    cal_ids = [x.strip() for x in entry["calibrated_on"].split(",")]
    summary = pd.DataFrame({"set": ["held-out"], "family": ["TTFT"], "median": [99.0]})
    spec = {"engine": "vllm"}
    public_study._write_calibration(spec, entry, params, summary, cal_ids)
    assert (tmp_path / "roofline.yaml").read_text() == shipped_text
    params["host_cpu_speed"] = 2.0
    public_study._write_calibration(spec, entry, params, summary, cal_ids)
    assert yaml.safe_load((tmp_path / "roofline.yaml").read_text())["vllm"]["host_cpu_speed"] == 2.0
