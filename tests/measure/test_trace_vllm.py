"""``trace record --engine vllm`` on two tiny random-weight Qwen2 models the test builds.

vLLM's CPU attention needs a head dim of 64 or more, so the models are ``tiny-vllm``-shaped
(hidden 128, 2 heads, 1 KV head, vocab 512); the tokenizer is the tiny word-level one of
``test_trace_record.py``. Every call goes through the CLI in-process, so the two vLLM engines start
once for the module (``open_llm``'s cache) and are stopped at its end.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

vllm = pytest.importorskip("vllm")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.support import cli  # noqa: E402
from wispsim.model.acceptance import FEATURES, load_trace  # noqa: E402

pytestmark = pytest.mark.slow  # records traces with real vLLM engines

WORDS = 48  # the tokenizer's vocabulary (w0 = EOS); the models' logits are wider
VOCAB = 512
NOISE = 0.1  # the draft: the target plus this much noise (in each weight's std)
EXACT = ("top1_prob", "top2_prob", "margin", "committed_q", "target_top1_prob")


def tiny_vllm_pair(root: Path) -> tuple[Path, Path]:
    """A draft and a target (float32, random weights, sharpened output layer) sharing the tiny
    word-level tokenizer of ``test_trace_record.py``; the draft is the target with noise on every
    weight, so that they agree at some positions and not at others."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tk = Tokenizer(models.WordLevel({f"w{i}": i for i in range(WORDS)}, unk_token="w1"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="w1", eos_token="w0", pad_token="w0")
    paths = []
    for name, noise in (("draft", NOISE), ("target", 0.0)):
        torch.manual_seed(2)
        cfg = Qwen2Config(
            vocab_size=VOCAB,
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=64,
            max_position_embeddings=256,
            tie_word_embeddings=False,
            eos_token_id=0,
            pad_token_id=0,
            torch_dtype="float32",
        )
        model = Qwen2ForCausalLM(cfg)
        with torch.no_grad():
            gen = torch.Generator().manual_seed(1)
            for w in model.parameters():
                w.add_(noise * w.std().nan_to_num(0.0) * torch.randn(w.shape, generator=gen))
            model.lm_head.weight.mul_(20.0)  # peaked distributions, like a real LM's
        (root / name).mkdir()
        model.save_pretrained(root / name)
        fast.save_pretrained(root / name)
        tc = root / name / "tokenizer_config.json"  # keep AutoTokenizer off Qwen2's BPE class
        tc.write_text(
            json.dumps({**json.loads(tc.read_text()), "tokenizer_class": "PreTrainedTokenizerFast"})
        )
        paths.append(root / name)
    return paths[0], paths[1]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("vllm-models")
    draft, target = tiny_vllm_pair(root)
    prompts = root / "prompts.jsonl"
    rows = [
        {"id": f"p{i}", "family": "toy", "prompt": " ".join(f"w{(3 * i + j) % 8 + 2}" for j in range(5 + i))}
        for i in range(3)
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    yield draft, target, prompts
    from wispsim.engines import vllm as engines

    for key, (llm, _) in list(engines._OPEN.items()):
        if key[0].startswith(str(root.resolve())):
            engines.close_llm(llm)


def record(monkeypatch, capsys, pair, out: Path, *extra: str) -> pd.DataFrame:
    draft, target, prompts = pair
    code, _, err = cli(
        capsys, monkeypatch, "trace", "record", "--draft", str(draft), "--target", str(target),
        "--prompts", str(prompts), "--out", str(out), "--max-new-tokens", "12", *extra,
    )  # fmt: skip
    assert code == 0, err
    return pd.read_parquet(out)


@pytest.fixture(scope="module")
def traces(pair, tmp_path_factory):
    """The same prompts recorded by both engines (and by vLLM with the whole vocabulary)."""
    mp = pytest.MonkeyPatch()
    cap = _NoCapture()
    root = tmp_path_factory.mktemp("traces")
    try:
        hf = record(mp, cap, pair, root / "hf.parquet")
        vl = record(mp, cap, pair, root / "vllm.parquet", "--engine", "vllm")
        full = record(mp, cap, pair, root / "full.parquet", "--engine", "vllm", "--top-k", "-1")
    finally:
        mp.undo()
    return root, hf, vl, full


class _NoCapture:
    """capsys stand-in for the module fixture (the recorder's output is not checked there)."""

    def readouterr(self) -> tuple[str, str]:
        return "", ""


def test_vllm_trace_has_every_column_and_inspects(traces, monkeypatch, capsys) -> None:
    root, hf, vl, _ = traces
    assert list(vl.columns) == list(hf.columns)
    assert sorted(vl.sample_id.unique()) == [0, 1, 2]
    assert vl.notna().all().all()
    tr = load_trace(str(root / "vllm.parquet"))
    assert tr.features.shape == (len(vl), len(FEATURES))
    meta = tr.metadata
    assert meta["wispsim.trace.engine"] == "vllm"
    assert meta["wispsim.trace.vllm_version"] == vllm.__version__
    assert meta["wispsim.trace.top_k"] == "20"
    assert meta["wispsim.trace.approximated_columns"] == "entropy,logit_std"
    assert meta["wispsim.trace.dtype"].startswith("float32")
    code, out, err = cli(capsys, monkeypatch, "trace", "inspect", str(root / "vllm.parquet"), "--json")
    assert code == 0, err
    assert json.loads(out)


def test_vllm_agrees_with_hf_on_the_same_models(traces) -> None:
    _, hf, vl, full = traces
    key = ["sample_id", "position"]
    both = hf.merge(vl, on=key, suffixes=("_hf", "_vl"))
    assert len(both) >= 0.99 * len(hf)
    same_text = both.token_id_hf == both.token_id_vl
    assert same_text.mean() >= 0.99  # the same greedy responses
    both = both[same_text]
    assert 0.1 < both.greedy_agree_hf.mean() < 0.9  # the draft agrees with the target, not always
    assert (both.greedy_agree_hf == both.greedy_agree_vl).mean() >= 0.99
    assert (both.accept_hf == both.accept_vl).mean() >= 0.99
    for col in EXACT:
        assert np.allclose(both[f"{col}_hf"], both[f"{col}_vl"], atol=1e-4), col
    assert both.committed_is_target_top1_vl.all()  # greedy responses are the target's argmax
    # the estimators: the flat tail is the largest-entropy completion of the top K ...
    assert (both.entropy_vl >= both.entropy_hf - 1e-4).all()
    # ... and with the whole vocabulary every column is exact
    wide = hf.merge(full, on=key, suffixes=("_hf", "_vl"))
    wide = wide[wide.token_id_hf == wide.token_id_vl]
    for col in (*EXACT, "entropy", "logit_std"):
        assert np.allclose(wide[f"{col}_hf"], wide[f"{col}_vl"], atol=1e-4), col


def test_vllm_recorder_is_greedy_only(pair, tmp_path: Path, monkeypatch, capsys) -> None:
    draft, target, prompts = pair
    code, _, err = cli(
        capsys, monkeypatch, "trace", "record", "--draft", str(draft), "--target", str(target),
        "--prompts", str(prompts), "--out", str(tmp_path / "t.parquet"), "--engine", "vllm",
        "--temperature", "0.5",
    )  # fmt: skip
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1, err
    assert "--temperature" in lines[0] and "greedy only" in lines[0]
    assert not (tmp_path / "t.parquet").exists()


def test_vllm_recording_resumes(pair, tmp_path: Path, monkeypatch, capsys) -> None:
    from wispsim.engines import vllm_scoring

    out = tmp_path / "t.parquet"
    first = record(monkeypatch, capsys, pair, out, "--engine", "vllm", "--limit", "2")
    assert sorted(first.sample_id.unique()) == [0, 1]
    asked: list[int] = []
    real = vllm_scoring.greedy_continuations

    def counting(llm, prompts, *a):
        asked.append(len(prompts))
        return real(llm, prompts, *a)

    monkeypatch.setattr(vllm_scoring, "greedy_continuations", counting)
    full = record(monkeypatch, capsys, pair, out, "--engine", "vllm")
    assert asked == [1]  # only the third prompt was recorded
    assert sorted(full.sample_id.unique()) == [0, 1, 2]
    pd.testing.assert_frame_equal(full[full.sample_id < 2].reset_index(drop=True), first)
