"""Profiling the verification-time estimator (SPEC 4): plans, fitting, profiles, derived profiles,
measured-latency replay and the CLI commands. The recorder itself is in test_profile_record.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import typer
import yaml
from typer.testing import CliRunner

from tests.support import ROOT, deterministic_overrides, profile_dict
from wispsim.errors import ConfigError, WispsimError
from wispsim.measure.profile.derive import SHIPPED, derive_named
from wispsim.measure.profile.fit import fit, metrics
from wispsim.measure.profile.fit_report import fit_command
from wispsim.measure.profile.plan import (
    CATEGORIES,
    DEFAULT_COUNTS,
    PlanOptions,
    fit_to_hardware,
    make_plan,
    plan_frame,
    read_plan,
    write_plan,
)
from wispsim.model.archs import load_arch
from wispsim.model.batch import Shape
from wispsim.model.estimator import Estimator
from wispsim.model.latency import LATENCY
from wispsim.model.measured import MeasuredTable, read_measurements
from wispsim.model.profiles import load_profile, parse_profile
from wispsim.sim.scenarios import load_scenario, resolve_server

# the published A100 / Qwen3-32B coefficients (SPEC 4) as the synthetic truth
TRUE = {"a": 3.314e-5, "b_compute": 3.450e-8, "b_read": 4.620e-6, "c": 1.486e-2}
FACTS = {
    "name": "toy",
    "parameters": 1e6,
    "layers": 2,
    "kv_heads": 2,
    "head_dim": 16,
    "kv_dtype_bytes": 2,
    "weight_bytes": 2e6,
    "vocab_size": 512,
}


def synthetic_data(
    folder: Path,
    coef: dict[str, float] = TRUE,
    sigma: float = 0.05,
    seed: int = 1,
    opts: PlanOptions | None = None,
) -> Path:
    """A recorder-style CSV (and meta file) for the default plan, with log-normal noise."""
    df = plan_frame(make_plan(opts))
    est = Estimator(**coef)  # with a "d", the truth has a per-request term
    rng = np.random.default_rng(seed)
    cols = ["n_linear", "n_interactions", "n_cached", "batch_size"]
    mean = np.array([est.batch(*r) for r in df[cols].to_numpy()])
    runs = mean[:, None] * np.exp(sigma * rng.standard_normal((len(df), 3)))
    df["status"] = "ok"
    df["latency_s"] = runs.mean(axis=1)
    df["cv"] = runs.std(axis=1, ddof=1) / runs.mean(axis=1)
    df["runs_s"] = [";".join(f"{t:.9g}" for t in r) for r in runs]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "data.csv"
    df.to_csv(path, index=False)
    meta = {
        "engine": "hf",
        "device": "cpu",
        "dtype": "bfloat16",
        "attention": "loop",
        "command": "synthetic",
        "date": "2026-01-01",
        "model_facts": FACTS,
        "host": {"cpu": "test CPU", "cpu_count": 2, "isa": "avx2", "memory_gib": 16.0, "torch_threads": 1},
    }
    Path(str(path) + ".meta.json").write_text(json.dumps(meta))
    return path


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(data CSV, fitted profile YAML) from synthetic measurements (100 bootstrap resamples)."""
    root = tmp_path_factory.mktemp("measured")
    data = synthetic_data(root / "data")
    out = root / "profiles" / "toy-measured.yaml"
    fit_command(data, out, bootstrap=100, command="wispsim profile fit (test)")
    return data, out


# ---------------------------------------------------------------------------------------------
# plan
# ---------------------------------------------------------------------------------------------


def test_default_plan_has_the_papers_category_counts() -> None:
    df = plan_frame(make_plan())
    counts = df.groupby(["split", "category"]).size()
    for cat, n in zip(CATEGORIES, DEFAULT_COUNTS, strict=True):
        assert counts["train", cat] == n
        assert counts["test", cat] == 10
    assert (df.split == "train").sum() == 123 and (df.split == "test").sum() == 50
    assert df.config_id.is_unique


def test_train_and_test_come_from_different_seeds_and_never_overlap() -> None:
    df = plan_frame(make_plan())
    train, test = df[df.split == "train"], df[df.split == "test"]
    assert train.seed.nunique() == 1 and test.seed.nunique() == 1
    assert train.seed.iloc[0] != test.seed.iloc[0]
    key = lambda d: set(zip(d.l_new, d.l_cached, strict=True))  # noqa: E731
    assert not key(train) & key(test)
    # the same plan seed gives the same plan; another gives another
    assert plan_frame(make_plan()).equals(df)
    assert not plan_frame(make_plan(PlanOptions(seed=1))).equals(df)


def test_memory_bound_grid_is_the_papers_grid() -> None:
    df = plan_frame(make_plan())
    mb = df[(df.split == "train") & (df.category == "memory-bound")]
    seen = set()
    for new, cached in zip(mb.l_new, mb.l_cached, strict=True):
        ns = [int(x) for x in new.split(";")]
        cs = [int(x) for x in cached.split(";")]
        assert len(set(ns)) == 1 and len(set(cs)) == 1
        seen.add((ns[0], ns[0] + cs[0], len(ns)))
    assert seen == {
        (n, t, b) for n in (1, 5, 10, 20, 50, 100) for t in (500, 1000, 1500, 2000) for b in (1, 4)
    }
    cb = df[(df.split == "train") & (df.category == "compute-bound")]
    assert set(cb.n_linear) == {1200, 1400, 1600, 1800, 2000} and (cb.n_cached == 0).all()


def test_scaling_options_fit_the_plan_to_small_hardware() -> None:
    opts = PlanOptions(scale=0.25, max_context=256, max_batch=2)
    df = plan_frame(make_plan(opts))
    assert df.max_l_total.max() <= 256
    assert df.batch_size.max() <= 2
    assert df.n_linear.min() >= 1
    # by hand: (1000 new, 1000 cached) x 0.25 = (250, 250); 500 > 256 shrinks by 256/500 to (128, 128)
    assert fit_to_hardware([(1000, 1000), (5, 0), (7, 7)], opts) == ((128, 128), (1, 0))


def test_plan_round_trips_through_csv(tmp_path: Path) -> None:
    opts = PlanOptions(counts=(2, 3, 1, 1, 1), test=5)
    configs = make_plan(opts)
    write_plan(configs, tmp_path / "plan.csv", opts, "wispsim profile plan ...")
    assert read_plan(tmp_path / "plan.csv") == configs
    meta = json.loads((tmp_path / "plan.csv.meta.json").read_text())
    assert meta["counts"] == [2, 3, 1, 1, 1] and meta["seeds"]["train"] == configs[0].seed


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"counts": (1, 2, 3)}, "--counts"),
        ({"scale": 0}, "--scale"),
        ({"max_context": 1}, "--max-context"),
        ({"max_batch": 0}, "--max-batch"),
        ({"test": -1}, "--test"),
    ],
)
def test_bad_plan_options_name_the_option(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(WispsimError, match=match):
        PlanOptions(**kwargs)


def test_bad_plan_file_is_reported(tmp_path: Path) -> None:
    p = tmp_path / "plan.csv"
    write_plan(make_plan(PlanOptions(counts=(1, 1, 1, 1, 1), test=0)), p)
    df = pd.read_csv(p, dtype=str)
    df.loc[0, "l_cached"] = "1;2;3"
    df.to_csv(p, index=False)
    with pytest.raises(WispsimError, match="row 2: l_new and l_cached"):
        read_plan(p)


# ---------------------------------------------------------------------------------------------
# fitting
# ---------------------------------------------------------------------------------------------


def test_metrics_by_hand() -> None:
    # errors 0, 0, +1 s on y = 1, 2, 3: SS_res 1, SS_tot 2 -> R^2 0.5;
    # adjusted with 1 predictor: 1 - 0.5 * 2 / 1 = 0; MAE 1/3 s; MAPE (1/3)/3 = 11.1%
    m = metrics(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 4.0]), predictors=1)
    assert m["r2"] == pytest.approx(0.5)
    assert m["adj_r2"] == pytest.approx(0.0)
    assert m["mae_ms"] == pytest.approx(1000 / 3)
    assert m["rmse_ms"] == pytest.approx(1000 * np.sqrt(1 / 3))
    assert m["mape_pct"] == pytest.approx(100 / 9)
    assert m["max_error_ms"] == pytest.approx(1000)


def test_fit_without_noise_recovers_coefficients_exactly(tmp_path: Path) -> None:
    df = read_measurements(synthetic_data(tmp_path, sigma=0.0))
    res = fit(df, bootstrap=0)
    for k, v in TRUE.items():
        assert res.coef[k] == pytest.approx(v, rel=1e-6)
    assert res.train["r2"] == pytest.approx(1.0) and res.test["r2"] == pytest.approx(1.0)


def test_fit_with_noise_recovers_coefficients_within_their_intervals(tmp_path: Path) -> None:
    df = read_measurements(synthetic_data(tmp_path, sigma=0.05, seed=3))
    res = fit(df, bootstrap=1000, seed=0)
    assert res.method == "ols" and not res.note
    for k, v in TRUE.items():
        lo, hi = res.ci95[k]
        assert lo <= v <= hi, k
        assert res.coef[k] == pytest.approx(v, rel=0.15), k
    # 5% log-normal run noise averaged over 3 runs: sigma of the mean ~ 0.05 / sqrt(3) = 0.029
    assert res.sigma == pytest.approx(0.05 / np.sqrt(3), rel=0.3)
    assert res.train["r2"] > 0.97 and res.test["r2"] > 0.97
    assert res.cv["folds"] == 5 and res.cv["r2_mean"] > 0.95
    assert res.train["n"] == 123 and res.test["n"] == 50
    assert set(res.by_category.category) == set(CATEGORIES)


def test_fit_uses_only_the_train_rows(tmp_path: Path) -> None:
    df = read_measurements(synthetic_data(tmp_path, sigma=0.0))
    spoiled = df.copy()
    spoiled.loc[spoiled.split == "test", "latency_s"] *= 10  # the test set must not move the fit
    assert fit(spoiled, bootstrap=0).coef == pytest.approx(fit(df, bootstrap=0).coef)


def test_negative_coefficient_is_refitted_nonnegative_or_refused(tmp_path: Path) -> None:
    # no cost for reading the cache at all (b_read = 0): noise pushes the OLS estimate below 0
    # for some seed; auto refits by NNLS and says so, ols refuses
    for seed in range(20):
        df = read_measurements(synthetic_data(tmp_path, {**TRUE, "b_read": 0.0}, sigma=0.05, seed=seed))
        res = fit(df, bootstrap=0)
        if res.method == "nnls":
            break
    else:
        pytest.fail("no seed gave a negative OLS b_read")
    assert "b_read" in res.note and min(res.coef.values()) >= 0
    with pytest.raises(WispsimError, match=r"negative b_read.*--method nnls"):
        fit(df, method="ols", bootstrap=0)


def test_per_request_form_recovers_its_term_and_beats_the_additive_one(tmp_path: Path) -> None:
    """Data with a per-request cost (d = 4 ms, what a serving engine spends per request): the
    per-request form recovers d and the paper's coefficients; the additive form cannot say it
    and is worse on the held-out rows."""
    truth = {**TRUE, "d": 4e-3}
    df = read_measurements(synthetic_data(tmp_path, truth, sigma=0.0))
    per = fit(df, bootstrap=0, form="per-request")
    assert per.form == "per-request" and list(per.coef) == ["a", "b_compute", "b_read", "c", "d"]
    for k, v in truth.items():
        assert per.coef[k] == pytest.approx(v, rel=1e-6), k
    additive = fit(df, bootstrap=0)
    assert list(additive.coef) == ["a", "b_compute", "b_read", "c"]
    assert per.test["mape_pct"] < 1e-6 < additive.test["mape_pct"]
    with pytest.raises(ConfigError, match="--form"):
        fit(df, bootstrap=0, form="quadratic")


def test_profile_carries_every_form_and_a_scenario_picks_one(measured: tuple[Path, Path]) -> None:
    _, out = measured
    p = load_profile(str(out))
    assert set(p.forms) == {"additive", "per-request"} and p.estimator.form == "additive"
    assert p.forms["additive"] == p.estimator
    per = p.with_form("per-request")
    assert per.estimator.form == "per-request" and per.estimator.d >= 0
    assert per.estimator.batch(10, 100, 50, 3) == pytest.approx(
        p.forms["per-request"].batch(10, 100, 50) + 3 * per.estimator.d
    )
    assert "test MAPE" in (out.parent / "toy-measured.report.md").read_text()
    assert (out.parent / "toy-measured.fit" / "predictions-per-request.csv").is_file()
    from wispsim.sim.simulation import simulate

    over = deterministic_overrides(str(out), server={"estimator_form": "per-request"})
    res = simulate(resolve_server(load_scenario(overrides=over)))
    assert len(res.batches) > 0
    for b in res.batches.itertuples():  # no noise: each batch takes the per-request estimate
        want = per.estimator.batch(b.n_linear, b.n_interactions, b.n_cached, b.size)
        assert b.latency == pytest.approx(want)
    with pytest.raises(ConfigError, match=r"server.estimator_form.*carries no 'per-request'"):
        load_scenario(overrides={"server": {"estimator_form": "per-request"}})  # published profile
    with pytest.raises(ConfigError, match=r"server.estimator_form.*known: additive, per-request"):
        load_scenario(overrides={"server": {"estimator_form": "cubic"}})


def test_fitted_profile_loads_with_report_and_plots(measured: tuple[Path, Path]) -> None:
    data, out = measured
    p = load_profile(str(out))
    assert p.kind == "measured"
    assert p.data_path is not None and p.data_path.resolve() == data.resolve()
    assert p.provenance["command"] and p.provenance["date"]
    # the host that measured it, so a run on another CPU can say so (wispsim.host)
    assert p.provenance["host"] == {"cpu": "test CPU", "cpu_count": 2, "isa": "avx2"}
    assert p.fit["configurations"] == {"train": 123, "test": 50}
    assert p.model.kv_bytes_per_token == 2 * 2 * 2 * 16 * 2
    assert p.gpu.startswith("CPU: test CPU") and p.gpu_memory_gib == 16
    for k in TRUE:
        assert k in p.ci95
    folder = out.parent / "toy-measured.fit"
    for f in ("actual_vs_predicted.png", "residuals.png", "predictions.csv", "by_category.csv"):
        assert (folder / f).is_file(), f
    report = (out.parent / "toy-measured.report.md").read_text()
    assert "| b_read |" in report and "random-memory-bound" in report
    for link in ("toy-measured.fit/actual_vs_predicted.png", "toy-measured.fit/residuals.png"):
        assert f"]({link})" in report and (out.parent / link).is_file()


def test_fit_without_model_facts_says_what_is_missing(tmp_path: Path) -> None:
    data = synthetic_data(tmp_path)
    Path(str(data) + ".meta.json").unlink()
    with pytest.raises(WispsimError, match="no model facts"):
        fit_command(data, tmp_path / "p.yaml", bootstrap=0, plots=False)


# ---------------------------------------------------------------------------------------------
# profile validation
# ---------------------------------------------------------------------------------------------


def _bad(mutate: Any) -> dict[str, Any]:
    d = profile_dict()
    mutate(d)
    return d


@pytest.mark.parametrize(
    ("mutate", "field", "words"),
    [
        (lambda d: d.update(coefficent={}), "coefficent", "unknown field"),
        (lambda d: d["coefficients"].update(d=1.0), "coefficients.d", "unknown coefficient"),
        (
            lambda d: d["coefficients"].update(a={"value": 1e-4, "ci95": [2e-4, 3e-4]}),
            "coefficients.a.ci95",
            "must contain",
        ),
        (lambda d: d["coefficients"].update(c="fast"), "coefficients.c.value", "must be a number"),
        (lambda d: d["model"].update(layers=1.5), "model.layers", "whole number"),
        (lambda d: d["model"].pop("kv_dtype_bytes"), "model.kv_dtype_bytes", "is missing"),
        (lambda d: d["model"].update(kv_dtype="bfloat16"), "model.kv_dtype", "disagrees"),
        (lambda d: d["model"].update(weight_bytes=2 * 1024**3), "model.weight_bytes", "do not fit"),
        (lambda d: d["hardware"].update(count=0), "hardware.count", ">= 1"),
        (lambda d: d.update(noise={"model": "gamma", "sigma": 0.1}), "noise.model", "lognormal"),
        (lambda d: d.update(fit={"r2": {"train": 1.5}}), "fit.r2.train", "<= 1"),
        (lambda d: d["provenance"].update(kind="guessed"), "provenance.kind", "published, measured, derived"),
        (lambda d: d["provenance"].pop("inputs"), "provenance.inputs", "required for a derived"),
        (
            lambda d: d.update(provenance={"kind": "measured", "data": "x.csv", "command": "c"}),
            "provenance.date",
            "required for a measured",
        ),
        (
            lambda d: d.update(
                provenance={"kind": "measured", "data": "nope.csv", "command": "c", "date": "d"}
            ),
            "provenance.data",
            "not found",
        ),
        (lambda d: d.update(provenance={"kind": "published"}), "provenance.citation", "required"),
    ],
)
def test_bad_profiles_get_one_line_errors_naming_the_field(mutate: Any, field: str, words: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_profile(_bad(mutate), "bad.yaml")
    msg = str(e.value)
    assert "\n" not in msg
    assert "profile 'test-tiny' (bad.yaml)" in msg and field in msg and words in msg, msg


def test_kv_dtype_name_is_an_alternative_to_bytes() -> None:
    d = profile_dict()
    d["model"].pop("kv_dtype_bytes")
    d["model"]["kv_dtype"] = "int8"
    assert parse_profile(d, "x.yaml").model.kv_dtype_bytes == 1


def test_kv_capacity_counts_every_gpu() -> None:
    d = profile_dict()
    d["model"]["weight_bytes"] = 1024**3  # exactly one GPU's memory: no room on one GPU
    with pytest.raises(ConfigError, match="do not fit"):
        parse_profile(d, "x.yaml")
    d["hardware"]["count"] = 2
    # 2 GiB - 1 GiB of weights = 1 GiB of KV at 2 bytes per token
    assert parse_profile(d, "x.yaml").kv_capacity_tokens(1.0, 0.0) == 1024**3 // 2


# ---------------------------------------------------------------------------------------------
# architectures and derived profiles
# ---------------------------------------------------------------------------------------------


def test_arch_configs_hold_the_real_config_values() -> None:
    expect = {
        "qwen3-32b": (5120, 64, 64, 8, 128, 25600, 151936),
        "qwen3-14b": (5120, 40, 40, 8, 128, 17408, 151936),
        "llama-3.1-70b": (8192, 80, 64, 8, 128, 28672, 128256),
        "qwen2.5-0.5b": (896, 24, 14, 2, 64, 4864, 151936),
    }
    for name, shape in expect.items():
        a = load_arch(name)
        got = (a.hidden_size, a.layers, a.heads, a.kv_heads, a.head_dim, a.intermediate_size, a.vocab_size)
        assert got == shape, name
    # parameter counts as the model cards round them
    assert round(load_arch("qwen3-32b").parameters / 1e9, 1) == 32.8
    assert round(load_arch("qwen3-14b").parameters / 1e9, 1) == 14.8
    assert round(load_arch("llama-3.1-70b").parameters / 1e9, 1) == 70.6
    assert round(load_arch("qwen2.5-0.5b").parameters / 1e9, 2) == 0.49


def test_shipped_derived_profiles_validate_and_are_up_to_date() -> None:
    for name in SHIPPED:
        p = load_profile(name)
        assert p.kind == "derived" and p.provenance["inputs"] and p.provenance["rule"]
        assert p.provenance["source"] == "a100-qwen3-32b-paper"
    p = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "derive_profiles.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.parametrize("path", sorted((ROOT / "profiles").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_profile_validates_and_states_provenance(path: Path) -> None:
    p = load_profile(str(path))
    assert p.kind in ("published", "measured", "derived")
    if p.kind == "published":
        assert p.provenance["citation"]
    elif p.kind == "derived":
        assert p.provenance["rule"] and p.provenance["inputs"]
    else:
        assert p.data_path is not None and p.data_path.is_file()
        assert p.provenance["command"] and p.provenance["date"]
        meta = json.loads(Path(str(p.data_path) + ".meta.json").read_text())
        assert meta["host"] and meta["versions"]
        if "deployment" in meta:  # fitted from a deployment's batch log, shipped beside it
            assert meta["command"].startswith("wispsim profile fit")
            assert all((ROOT / f).is_dir() for f in meta["deployment"]["batch_logs"])
        else:
            assert meta["command"].startswith("wispsim profile record")
        assert path.with_name(path.stem + ".report.md").is_file()


def test_shipped_cpu_profile_is_reproduced_by_refitting(tmp_path: Path) -> None:
    shipped = load_profile("cpu-qwen2.5-0.5b")
    assert shipped.data_path is not None
    res, _ = fit_command(shipped.data_path, tmp_path / "cpu.yaml", plots=False)
    for k in ("a", "b_compute", "b_read", "c"):
        assert res.coef[k] == pytest.approx(getattr(shipped.estimator, k), rel=1e-4, abs=1e-12)
    assert res.test["n"] == 50 and res.test["r2"] == pytest.approx(shipped.fit["r2"]["test"], abs=1e-4)


def test_derived_factors_by_hand() -> None:
    src = load_profile("a100-qwen3-32b-paper")
    q14 = load_profile("a100-qwen3-14b-paper").estimator
    # same GPU; attention FLOPs per interaction 4*40*40*128 vs 4*64*64*128 -> 1600/4096
    assert q14.b_compute == pytest.approx(src.estimator.b_compute * 1600 / 4096, rel=1e-5)
    # KV bytes per token 2*40*8*128*2 = 163840 vs 262144 -> 0.625
    assert q14.b_read == pytest.approx(src.estimator.b_read * 0.625, rel=1e-5)
    # H100 from A100, same model: compute 312/989, bandwidth 2039/3350
    h100 = load_profile("h100-qwen3-32b-paper").estimator
    assert h100.a == pytest.approx(src.estimator.a * 312 / 989, rel=1e-5)
    assert h100.b_read == pytest.approx(src.estimator.b_read * 2039 / 3350, rel=1e-5)
    # 70B on two A100s: KV bytes 327680/262144 = 1.25, over twice the bandwidth -> 0.625
    l70 = load_profile("2xa100-llama-3.1-70b-paper")
    assert l70.gpu_count == 2
    assert l70.estimator.b_read == pytest.approx(src.estimator.b_read * 0.625, rel=1e-5)


def test_70b_needs_both_gpus() -> None:
    p = load_profile("2xa100-llama-3.1-70b-paper")
    weights = 70_553_706_496 * 2
    assert p.model.weight_bytes == weights and p.model.kv_bytes_per_token == 327_680
    # 2 x 79.15 GiB (torch's A100 80GB) x 0.9 - 141.1 GB weights - 2 x 1.5 GiB reserve, over 327680 B/token
    free = 2 * 79.15 * 1024**3 * 0.9 - weights - 2 * 1.5 * 1024**3
    assert p.kv_capacity_tokens(0.9, 1.5) == int(free // 327_680)
    one = yaml.safe_load(Path(p.source).read_text())
    one["hardware"]["count"] = 1
    with pytest.raises(ConfigError, match="do not fit"):
        parse_profile(one, "one-gpu.yaml")


def test_derive_keep_rule_keeps_c_and_says_so() -> None:
    d = derive_named("a100-qwen3-32b-paper", "qwen3-14b", name="x", c_rule="keep")
    assert d["coefficients"]["c"]["value"] == pytest.approx(1.486e-2)
    assert "kept" in d["provenance"]["rule"] and d["provenance"]["c_rule"] == "keep"
    with pytest.raises(WispsimError, match="--c-rule"):
        derive_named("a100-qwen3-32b-paper", "qwen3-14b", name="x", c_rule="guess")
    with pytest.raises(ConfigError, match="unknown GPU"):
        derive_named("a100-qwen3-32b-paper", "qwen3-14b", name="x", gpu="tpu")


# ---------------------------------------------------------------------------------------------
# measured-latency replay
# ---------------------------------------------------------------------------------------------


def _server(profile: str, model: str, noise: bool = False) -> Any:
    return load_scenario(
        overrides=deterministic_overrides(profile, server={"latency_model": model, "noise": noise})
    ).server


def batch_time(lat: Any, *sums: int) -> tuple[float, float]:
    """(estimate, simulated latency) of a pass of these shape sums, as the servers ask them."""
    shape = Shape(*(int(x) for x in sums))  # counts (a measurement row reads them as floats)
    t_hat = lat.cost.price(shape)
    return t_hat, lat.time(shape, t_hat)


def test_measured_latency_returns_the_measurement_at_a_measured_configuration(
    measured: tuple[Path, Path],
) -> None:
    data, out = measured
    prof = load_profile(str(out))
    df = read_measurements(data)
    for model in ("measured", "measured-nearest"):
        lat = LATENCY.get(model)(prof, _server(str(out), model), np.random.default_rng(0))
        for row in df.sample(20, random_state=0).itertuples():
            t_hat, t = batch_time(lat, row.n_linear, row.n_interactions, row.n_cached)
            assert t == pytest.approx(row.latency_s, rel=1e-12)
            assert t_hat == pytest.approx(
                prof.estimator.batch(row.n_linear, row.n_interactions, row.n_cached)
            )


def test_measured_latency_with_noise_replays_one_of_the_runs(measured: tuple[Path, Path]) -> None:
    data, out = measured
    prof = load_profile(str(out))
    row = read_measurements(data).iloc[7]
    runs = {float(x) for x in row.runs_s.split(";")}
    lat = LATENCY.get("measured")(prof, _server(str(out), "measured", True), np.random.default_rng(0))
    seen = {batch_time(lat, row.n_linear, row.n_interactions, row.n_cached)[1] for _ in range(50)}
    assert seen == runs  # exactly the recorded runs (factor 1 at a measured configuration)


def test_measured_latency_between_points_follows_the_estimator(measured: tuple[Path, Path]) -> None:
    data, out = measured
    prof = load_profile(str(out))
    table = MeasuredTable(read_measurements(data))
    query = (40, 40 * 1040, 4000)  # 40 requests of 1 new token on 1000 cached: far outside the plan
    i = table.nearest(*query)
    near = load_profile(str(out)).estimator.batch(*table.points[i])
    lat = LATENCY.get("measured")(prof, _server(str(out), "measured"), np.random.default_rng(0))
    nearest = LATENCY.get("measured-nearest")(
        prof, _server(str(out), "measured-nearest"), np.random.default_rng(0)
    )
    t_hat, t = batch_time(lat, *query)
    assert t == pytest.approx(table.latency[i] * t_hat / near)
    assert batch_time(nearest, *query)[1] == pytest.approx(table.latency[i])
    far = (10**5, 10**7, 10**7)
    assert table.inside(np.array([far, table.points[i]])).tolist() == [False, True]


def test_measured_latency_needs_a_measured_profile(tiny_profile: str) -> None:
    prof = load_profile(tiny_profile)
    with pytest.raises(ConfigError, match="needs a measured profile"):
        LATENCY.get("measured")(prof, _server(tiny_profile, "measured"), np.random.default_rng(0))


def test_simulation_replays_measured_latencies(measured: tuple[Path, Path]) -> None:
    from wispsim.sim.simulation import simulate

    _, out = measured
    over = deterministic_overrides(str(out), server={"latency_model": "measured"})
    res = simulate(resolve_server(load_scenario(overrides=over)))
    prof = load_profile(str(out))
    lat = LATENCY.get("measured")(prof, _server(str(out), "measured"), np.random.default_rng(0))
    assert len(res.batches) > 0
    for b in res.batches.itertuples():
        assert b.latency == pytest.approx(batch_time(lat, b.n_linear, b.n_interactions, b.n_cached)[1])


# ---------------------------------------------------------------------------------------------
# the commands
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cli() -> typer.Typer:
    from wispsim.cli.estimator import estimator_app
    from wispsim.cli.profile import profile_app

    app = typer.Typer()
    app.add_typer(profile_app, name="profile")
    app.add_typer(estimator_app, name="estimator")
    return app


def test_cli_plan_fit_and_derive(cli: typer.Typer, tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["profile", "plan", "--out", str(tmp_path / "plan.csv"), "--scale", "0.5"])
    assert r.exit_code == 0, r.output
    df = pd.read_csv(tmp_path / "plan.csv")
    assert len(df) == 173 and df.max_l_total.max() <= 1030
    data = synthetic_data(tmp_path / "d")
    out = tmp_path / "p" / "fitted.yaml"
    args = ["profile", "fit", str(data), "--out", str(out), "--bootstrap", "50", "--no-plots"]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    assert (
        load_profile(str(out)).name == "fitted" and not (out.parent / "fitted.fit" / "residuals.png").exists()
    )
    out2 = tmp_path / "h100-qwen3-14b.yaml"
    args = ["profile", "derive", "--arch", "qwen3-14b", "--gpu", "h100-80gb", "--out", str(out2)]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    assert load_profile(str(out2)).kind == "derived"
    r = CliRunner().invoke(cli, ["profile", "archs"])
    assert r.exit_code == 0 and "llama-3.1-70b" in r.output


def test_cli_estimator_compare(cli: typer.Typer, measured: tuple[Path, Path], tmp_path: Path) -> None:
    _, prof = measured
    sets = ["workload.warmup_s=2", "workload.duration_s=6"]
    args = ["estimator", "compare", "--profile", str(prof), "--classes", "8", "--start", "4"]
    args += ["--max-devices", "16", "-j", "1", "--out", str(tmp_path / "cmp")]
    args += [x for s in sets for x in ("--set", s)]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    cmp = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    assert {"linear", "measured", "measured/linear", "in_range"} <= set(cmp.columns)
    assert ((cmp.in_range >= 0) & (cmp.in_range <= 1)).all()
