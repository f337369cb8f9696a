"""``server.engine.attention_backend`` (wispsim.model.attention): vLLM's MLA backends differ in which
members of a batch they run as prefills, and so in what a batch costs; the setting is honoured on
run and bench, refused where vLLM would not run it or nothing here could price it, and refused by
serve (its real engine picks its own)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.support import run_wispsim as wispsim
from wispsim.config.server import ATTENTION_BACKENDS
from wispsim.errors import ConfigError
from wispsim.model.archs import load_arch, load_gpu
from wispsim.model.attention import MLA_BACKENDS, MLA_DEFAULT, decode_threshold, with_attention_backend
from wispsim.model.physical import physical_profile
from wispsim.model.profiles import load_profile, parse_profile


@pytest.fixture(scope="module")
def h200_deepseek(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mla") / "h200-ds.yaml"
    data = physical_profile(load_arch("deepseek-v3"), load_gpu("h200"), count=8, name="h200-ds")
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_the_backends_the_config_allows_are_the_ones_priced() -> None:
    assert set(ATTENTION_BACKENDS) == set(MLA_BACKENDS)
    assert set(MLA_DEFAULT.values()) <= set(MLA_BACKENDS)
    ds, dense = load_arch("deepseek-v3"), load_arch("qwen3-32b")
    assert decode_threshold(ds, "hopper") == 512 and decode_threshold(ds, "hopper", "FLASHMLA") == 1
    assert decode_threshold(ds, "blackwell") == 1 and decode_threshold(ds, None) == 1
    assert decode_threshold(dense, "hopper") == 1


def test_a_backend_is_refused_where_vllm_would_not_run_it(h200_deepseek: Path) -> None:
    prof = load_profile(str(h200_deepseek))
    assert with_attention_backend(prof, None, "s") is prof
    flashmla = with_attention_backend(prof, "FLASHMLA", "s")
    assert flashmla.estimator.prefill_above == 1 and prof.estimator.prefill_above == 512
    with pytest.raises(ConfigError, match=r"FLASHINFER_MLA runs on blackwell GPUs.*hopper; allowed: null,"):
        with_attention_backend(prof, "FLASHINFER_MLA", "s")
    dense = parse_profile(physical_profile(load_arch("qwen3-32b"), load_gpu("h100-80gb")), "d")
    with pytest.raises(ConfigError, match="qwen3-32b has none; allowed: null"):
        with_attention_backend(dense, "FLASHMLA", "s")
    additive = load_profile("a100-qwen3-32b-paper")
    with pytest.raises(ConfigError, match="additive form; allowed: null"):
        with_attention_backend(additive, "FLASHMLA", "s")


@pytest.mark.slow  # subprocess simulations; the refusals beside it stay quick
def test_run_honours_it(h200_deepseek: Path, tmp_path: Path) -> None:
    """The same seed and load, FlashMLA's threshold (vLLM 0.10-0.11 on Hopper) against today's
    FlashAttention MLA: every verification round's cached prefix is projected up again, so the
    GPU's passes take longer."""
    means = {}
    for backend in ("", "FLASHMLA"):
        args = ["run", "--policy", "wisp", "--devices", "60", "--classes", "8", "--seed", "3"]
        args += ["--set", f"server.profile={h200_deepseek}", "--set", "workload.duration_s=8"]
        args += ["--set", "workload.warmup_s=4", "--out", str(tmp_path / (backend or "default"))]
        args += ["--set", "workload.prompt_tokens={dist: constant, value: 3000}"]
        if backend:
            args += ["--set", f"server.engine.attention_backend={backend}"]
        r = wispsim(*args)
        assert r.returncode == 0, r.stderr[-800:]
        b = pd.read_parquet(tmp_path / (backend or "default") / "batches.parquet")
        means[backend] = float((b["gpu_s"] / b["size"]).mean())  # GPU seconds a round
    assert means["FLASHMLA"] > means[""] * 1.05  # +10% at this seed
    bad = wispsim("run", "--devices", "5", "--set", "server.engine.attention_backend=FLASH_ATTN")
    assert bad.returncode == 2 and "allowed: FLASH_ATTN_MLA, FLASHMLA" in bad.stderr


@pytest.mark.slow  # subprocess simulations; the refusals beside it stay quick
def test_bench_takes_vllm_serves_flag_and_serve_refuses_it(h200_deepseek: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    args = ["bench", "--profile", str(h200_deepseek), "--num-prompts", "20", "--random-input-len", "600"]
    args += ["--random-output-len", "8", "--result-filename", str(out), "--save-result"]
    r = wispsim(*args, "--attention-backend", "FLASHMLA")
    assert r.returncode == 0, r.stderr[-800:]
    assert json.loads(out.read_text())["server"]["attention_backend"] == "FLASHMLA"
    bad = wispsim(*args, "--attention-backend", "FLASHINFER")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--attention-backend" in bad.stderr
    wrong_gpu = wispsim(*args, "--attention-backend", "CUTLASS_MLA")
    assert wrong_gpu.returncode == 2 and "runs on blackwell GPUs" in wrong_gpu.stderr
    s = wispsim(
        "serve", "--arch", "llama-2-7b", "--set", f"server.profile={h200_deepseek}",
        "--set", "server.engine.attention_backend=FLASHMLA",
    )  # fmt: skip
    assert s.returncode == 2 and "simulated only" in s.stderr


@pytest.mark.slow  # subprocess simulations; the refusals beside it stay quick
def test_replay_honours_it(h200_deepseek: Path, tmp_path: Path) -> None:
    """A recorded log replayed on the MLA profile: FlashMLA's threshold re-projects every round's
    cached prefix, so the same rounds take more GPU time than under today's Hopper backend."""
    log = tmp_path / "lg.parquet"
    prompts = "workload.prompt_tokens={dist: constant, value: 3000}"
    r = wispsim("run", "--devices", "30", "--seed", "1", "--set", "workload.warmup_s=2",
                "--set", "workload.duration_s=10", "--set", prompts,
                "--log", str(log), "--out", str(tmp_path / "run"))  # fmt: skip
    assert r.returncode == 0, r.stderr[-600:]
    per_round = {}
    for backend in ("", "FLASHMLA"):
        out = tmp_path / (backend or "default")
        extra = ["--set", f"server.engine.attention_backend={backend}"] if backend else []
        r = wispsim("replay", str(log), "--set", f"server.profile={h200_deepseek}", *extra, "--out", str(out))
        assert r.returncode == 0, r.stderr[-600:]
        b = pd.read_parquet(out / "batches.parquet")
        per_round[backend] = float((b["gpu_s"] / b["size"]).mean())
        assert f"attention_backend: {backend or 'null'}" in (out / "scenario.yaml").read_text()
    assert per_round["FLASHMLA"] > per_round[""]
