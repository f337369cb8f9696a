"""``vllm bench serve``'s datasets from local files (wispsim.runs.bench_datasets): the requests
vLLM's own samplers draw, and vLLM's ITL (every gap between a request's chunks) from the
simulated engine."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.cli.test_cli import wispsim
from wispsim.errors import ConfigError
from wispsim.runs.bench_datasets import burstgpt, dataset_rows, prefix_repetition

WORDS = [f"w{i}" for i in range(200)]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A word-level tokenizer built here (no hub): one token per word."""
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="w1"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="w1", eos_token="w0", pad_token="w0")
    path = tmp_path_factory.mktemp("tok")
    fast.save_pretrained(path)
    return path


def _sharegpt(path: Path, n: int) -> Path:
    rng = np.random.default_rng(3)
    data = []
    for i in range(n):
        turns = [
            {"from": "human", "value": " ".join(rng.choice(WORDS, int(rng.integers(1, 60))))},
            {"from": "gpt", "value": " ".join(rng.choice(WORDS, int(rng.integers(1, 200))))},
        ]
        data.append({"id": str(i), "conversations": turns if i % 7 else turns[:1]})  # some single-turn
    path.write_text(json.dumps(data))
    return path


@pytest.mark.slow  # 4-8 s on a slow host: the full suite runs it, the quick lane keeps its kin
def test_sharegpt_draws_the_requests_vllm_draws(tmp_path: Path, tokenizer_dir: Path) -> None:
    path = _sharegpt(tmp_path / "sg.json", 120)
    ours = dataset_rows("sharegpt", path, str(tokenizer_dir), 50, 7, None, True, False)
    assert len(ours) == 50 and all(p >= 4 and o >= 4 for p, o in ours)  # vLLM's bounds
    datasets = pytest.importorskip("vllm.benchmarks.datasets")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    theirs = datasets.ShareGPTDataset(dataset_path=str(path), random_seed=7).sample(
        tokenizer=tok, num_requests=50
    )
    assert ours == [(r.prompt_len, r.expected_output_len) for r in theirs]


def test_oversampling_and_a_fixed_output(tmp_path: Path, tokenizer_dir: Path) -> None:
    path = _sharegpt(tmp_path / "sg.json", 20)
    few = dataset_rows("sharegpt", path, str(tokenizer_dir), 100, 0, 9, True, True)
    many = dataset_rows("sharegpt", path, str(tokenizer_dir), 100, 0, 9, True, False)
    assert len(few) < 20 and len(many) == 100 and {o for _, o in many} == {9}


def test_custom_jsonl_and_its_errors(tmp_path: Path, tokenizer_dir: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": "w3 w4 w5", "output_tokens": 12}) for _ in range(5)))
    assert dataset_rows("custom", path, str(tokenizer_dir), 5, 0, None, True, False) == [(3, 12)] * 5
    assert dataset_rows("custom", path, str(tokenizer_dir), 5, 0, 40, True, False) == [(3, 40)] * 5
    path.write_text(json.dumps({"prompt": "w3"}))
    with pytest.raises(ConfigError, match="output_tokens"):
        dataset_rows("custom", path, str(tokenizer_dir), 5, 0, None, True, False)
    with pytest.raises(ConfigError, match="--tokenizer"):
        dataset_rows("custom", path, None, 5, 0, 3, True, False)


@pytest.mark.slow  # a subprocess importing vLLM or transformers
def test_custom_defaults_to_vllms_output_length(tmp_path: Path, tokenizer_dir: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": "w3 w4 w5", "output_tokens": 12}) for _ in range(5)))
    out = tmp_path / "r.json"
    common = ["bench", "--model", "llama-2-7b", "--gpu", "h100-80gb", "--dataset-name", "custom"]
    common += ["--dataset-path", str(path), "--tokenizer", str(tokenizer_dir), "--num-prompts", "5"]
    p = wispsim(*common, "--save-result", "--result-filename", str(out))
    assert p.returncode == 0, p.stderr
    assert json.loads(out.read_text())["total_output_tokens"] == 5 * 256  # vLLM's --custom-output-len
    p = wispsim(*common, "--custom-output-len", "-1", "--save-result", "--result-filename", str(out))
    assert json.loads(out.read_text())["total_output_tokens"] == 5 * 12  # each record's own
    p = wispsim(*common, "--custom-output-len", "abc")
    assert p.returncode == 2 and "--custom-output-len" in p.stderr


def test_burstgpt_samples_as_pandas_does_for_vllm(tmp_path: Path) -> None:
    path = tmp_path / "b.csv"
    rng = np.random.default_rng(0)
    df = pd.DataFrame(
        {
            "Timestamp": np.arange(40),
            "Model": ["GPT-4", "ChatGPT"] * 20,
            "Request tokens": rng.integers(10, 900, 40),
            "Response tokens": rng.integers(0, 300, 40),
            "Total tokens": 0,
            "Log Type": "Conversation log",
        }
    )
    df.to_csv(path, index=False)
    rows = burstgpt(path, 10, 5)
    kept = df[(df.Model == "GPT-4") & (df["Response tokens"] > 0)].sample(n=10, random_state=5)
    assert rows == list(zip(kept["Request tokens"], kept["Response tokens"], strict=True))
    df["Response tokens"] = df["Response tokens"].astype(object)
    df.loc[0, "Response tokens"] = "many"
    df.to_csv(path, index=False)
    with pytest.raises(ConfigError, match="must be numbers"):
        burstgpt(path, 10, 5)


def test_prefix_repetition_groups_its_prompts() -> None:
    import random

    from wispsim.runs.bench_datasets import shuffled

    order = shuffled(24, 3)
    requests = list(range(24))
    random.seed(3)  # vLLM: random.seed(seed) at construction, random.shuffle(requests) at the end
    random.shuffle(requests)
    assert order == requests and sorted(order) == list(range(24)) and order != list(range(24))
    rows, per = prefix_repetition(25, 100, 20, 4, 8)
    assert per == 6 and rows == [(120, 8)] * 24
    with pytest.raises(ConfigError, match="num_prefixes"):
        prefix_repetition(3, 100, 20, 4, 8)


def test_prefix_repetition_runs_with_the_cache(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    common = ["bench", "--model", "llama-2-7b", "--gpu", "h100-80gb", "--dataset-name", "prefix_repetition"]
    args = ["--prefix-repetition-prefix-len", "900", "--num-prompts", "40", "--request-rate", "5"]
    p = wispsim(*common, *args, "--save-result", "--result-filename", str(out))
    assert p.returncode == 0, p.stderr
    cached = json.loads(out.read_text())
    p = wispsim(*common, *args, "--no-enable-prefix-caching", "--save-result", "--result-filename", str(out))
    cold = json.loads(out.read_text())
    assert cached["total_input_tokens"] == 40 * (900 + 256)
    assert cached["mean_ttft_ms"] < cold["mean_ttft_ms"]  # a group's prefix is read from cache


def test_itl_is_every_gap_and_its_p99_shows_prefill_stalls() -> None:
    """Long prompts arriving among decoding requests: the decode steps that carry a prefill chunk
    are the slow gaps, which a per-request mean hides."""
    from wispsim.model.profiles import load_profile
    from wispsim.study.bench import BenchRun, bench
    from wispsim.study.bench_metrics import vllm_result

    prof = load_profile("a100-qwen3-32b")
    run = BenchRun(60, [3000] + [50] * 9, [2] + [150] * 9, request_rate=3.0, max_num_batched_tokens=1024)
    res = bench(prof, run)
    r = res.responses
    gaps = res.itls()
    assert [len(g) for g in gaps] == (r.rounds - 1).tolist()  # one gap between consecutive chunks
    spans = np.array([g.sum() for g in gaps])
    np.testing.assert_allclose(spans, (r.t_end - r.t_first).to_numpy(), atol=1e-9)
    f = res.figures()
    assert f["itl_p99_ms"] > 2 * f["itl_median_ms"]
    # a per-request mean gap would smooth the stalls away
    mean_gaps = np.concatenate([np.full(len(g), g.mean()) for g in gaps if len(g)])
    assert np.percentile(mean_gaps, 99) * 1e3 < f["itl_p99_ms"]
    v = vllm_result(res, run, 3.0, None)
    assert v["p99_itl_ms"] == pytest.approx(f["itl_p99_ms"]) and v["mean_itl_ms"] == pytest.approx(
        f["itl_mean_ms"]
    )
