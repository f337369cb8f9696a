"""The trace recorder, on tiny random-weight models the test builds (no download)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from wispsim.measure.trace import record as rec  # noqa: E402
from wispsim.model.acceptance import FEATURES, load_trace  # noqa: E402

VOCAB = 48


def _tiny_pair(root: Path) -> tuple[Path, Path]:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    vocab = {f"w{i}": i for i in range(VOCAB)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="w1"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="w1", eos_token="w0", pad_token="w0")
    paths = []
    for name, seed in (("draft", 1), ("target", 2)):
        torch.manual_seed(seed)
        cfg = Qwen2Config(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            eos_token_id=0,
            pad_token_id=0,
        )
        model = Qwen2ForCausalLM(cfg)
        # sharpen the output layer so distributions are peaked like a real LM's
        with torch.no_grad():
            model.lm_head.weight.mul_(40.0)
        (root / name).mkdir()
        model.save_pretrained(root / name)
        fast.save_pretrained(root / name)
        # keep AutoTokenizer from swapping in Qwen2's BPE class because of config.json
        tc = root / name / "tokenizer_config.json"
        tc.write_text(
            json.dumps({**json.loads(tc.read_text()), "tokenizer_class": "PreTrainedTokenizerFast"})
        )
        paths.append(root / name)
    return paths[0], paths[1]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("models")
    draft, target = _tiny_pair(root)
    prompts = root / "prompts.jsonl"
    # single-digit words: the Whitespace pre-tokenizer splits "w10" into "w" and "10"
    rows = [
        {"id": f"p{i}", "family": "toy", "prompt": " ".join(f"w{(i + j) % 8 + 2}" for j in range(6))}
        for i in range(3)
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return draft, target, prompts


def _hand(model_dir: Path, ids: list[int]) -> np.ndarray:
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        return m(torch.tensor([ids])).logits[0].double().numpy()


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("temperature", [0.0, 1.0, 0.7])
def test_recorded_beta_and_features_match_a_hand_computation(
    pair, tmp_path: Path, temperature: float
) -> None:
    draft, target, prompts = pair
    out = tmp_path / "t.parquet"
    n = rec.record_trace(
        str(draft), str(target), prompts, out, temperature=temperature, max_new_tokens=10, seed=5
    )
    df = __import__("pandas").read_parquet(out)
    assert n == len(df) > 0
    assert sorted(df.sample_id.unique()) == [0, 1, 2]
    tok_ids = {0: [int(t[1:]) for t in ["w2", "w3", "w4", "w5", "w6", "w7"]]}
    for sid, g in df.groupby("sample_id"):
        prompt = [(sid + j) % 8 + 2 for j in range(6)]
        if sid == 0:
            assert prompt == tok_ids[0]
        resp = g.token_id.tolist()
        full = prompt + resp
        lp = _hand(target, full)[len(prompt) - 1 : -1]
        lq = _hand(draft, full)[len(prompt) - 1 : -1]
        p, q = _softmax(lp), _softmax(lq)
        qs = np.sort(q, -1)
        assert np.allclose(g.top1_prob, qs[:, -1], atol=1e-6)
        assert np.allclose(g.margin, qs[:, -1] - qs[:, -2], atol=1e-6)
        assert np.allclose(g.entropy, -(q * np.log(q)).sum(-1), atol=1e-5)
        assert np.allclose(g.logit_std, lq.std(-1, ddof=1), atol=1e-5)
        assert np.allclose(g.target_top1_prob, p.max(-1), atol=1e-6)
        greedy = lp.argmax(-1) == lq.argmax(-1)
        assert (g.greedy_agree.to_numpy() == greedy).all()
        if temperature == 0:
            assert (g.beta.to_numpy() == greedy.astype(float)).all()
            assert (g.accept.to_numpy() == greedy).all()
            assert (np.array(resp) == lp.argmax(-1)).all()  # greedy target response
        else:
            beta = np.minimum(_softmax(lp / temperature), _softmax(lq / temperature)).sum(-1)
            assert np.allclose(g.beta, beta, atol=1e-6)
        assert (g.context_length.to_numpy() == len(prompt) + np.arange(len(g))).all()
    tr = load_trace(str(out))  # the simulator can replay it
    assert tr.features.shape == (len(df), len(FEATURES))
    meta = tr.metadata
    assert meta["wispsim.trace.temperature"] == str(temperature)
    assert meta["wispsim.trace.synthetic"] == "false"
    for key in ("draft_sha256", "target_sha256", "versions", "command", "date", "prompts_sha256", "device"):
        assert meta[f"wispsim.trace.{key}"], key


def test_realized_verdicts_follow_beta_at_temperature_one(pair, tmp_path: Path) -> None:
    draft, target, prompts = pair
    out = tmp_path / "t.parquet"
    rec.record_trace(str(draft), str(target), prompts, out, temperature=1.0, max_new_tokens=40, seed=1)
    df = __import__("pandas").read_parquet(out)
    # the realized accept flag is a Bernoulli(beta) draw: means agree within sampling error
    se = np.sqrt((df.beta * (1 - df.beta)).sum()) / len(df)
    assert abs(df.accept.mean() - df.beta.mean()) < 5 * se + 1e-9


def test_recording_resumes_without_redoing_finished_samples(pair, tmp_path: Path, monkeypatch) -> None:
    draft, target, prompts = pair
    out = tmp_path / "t.parquet"
    rec.record_trace(str(draft), str(target), prompts, out, max_new_tokens=6, limit=2)
    first = __import__("pandas").read_parquet(out)
    assert sorted(first.sample_id.unique()) == [0, 1]  # an "interrupted" recording is usable
    calls = []
    real = rec.record_sample
    monkeypatch.setattr(rec, "record_sample", lambda *a, **k: calls.append(1) or real(*a, **k))
    rec.record_trace(str(draft), str(target), prompts, out, max_new_tokens=6)
    assert len(calls) == 1  # only the third prompt was recorded
    full = __import__("pandas").read_parquet(out)
    assert sorted(full.sample_id.unique()) == [0, 1, 2]
    import pandas as pd

    pd.testing.assert_frame_equal(full[full.sample_id < 2].reset_index(drop=True), first)


def test_bad_inputs_are_reported(pair, tmp_path: Path) -> None:
    from wispsim.errors import WispsimError

    _draft, target, prompts = pair
    with pytest.raises(WispsimError, match="model not found"):
        rec.record_trace(str(tmp_path / "nope"), str(target), prompts, tmp_path / "o.parquet")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(WispsimError, match="line 1"):
        rec.read_prompts(bad)


def test_a_bf16_generator_still_scores_in_fp32(pair, tmp_path: Path) -> None:
    draft, target, prompts = pair
    out = tmp_path / "t.parquet"
    rec.record_trace(
        str(draft), str(target), prompts, out, max_new_tokens=8, limit=1, generate_dtype="bfloat16"
    )
    df = __import__("pandas").read_parquet(out)
    assert "committed_is_target_top1" in df.columns and df.committed_is_target_top1.mean() > 0.5
    meta = load_trace(str(out)).metadata
    assert meta["wispsim.trace.generate_dtype"] == "bfloat16"
    assert meta["wispsim.trace.dtype"].startswith("float32")
