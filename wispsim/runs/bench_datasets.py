"""``vllm bench serve``'s datasets, read from local files as vLLM 0.32 reads them
(``vllm/benchmarks/datasets/datasets.py``), giving each request's prompt and output lengths.

- ``sharegpt``: a JSON list of conversations; entries with two turns or more, shuffled with
  Python's ``random`` seeded by ``--seed`` (unless ``--disable-shuffle``); the first turn is the
  prompt, the second the completion, both counted by the tokenizer (``--sharegpt-output-len``
  fixes the output); pairs outside vLLM's bounds (prompt or output under 4 tokens, prompt over
  1,024, both over 2,048) skipped; then oversampled to ``--num-prompts`` (unless
  ``--no-oversample``). The same seed draws the same requests vLLM draws.
- ``custom``: JSONL records with a ``prompt``; outputs of ``--custom-output-len`` tokens (vLLM's
  default 256), or each record's ``output_tokens`` with ``--custom-output-len -1``; the prompt is
  counted through the tokenizer's chat template where it has one (unless ``--skip-chat-template``).
- ``burstgpt``: the BurstGPT CSV; its GPT-4 rows with a response, sampled by pandas with
  ``random_state=--seed`` (with replacement past the file's rows); lengths from its
  ``Request tokens`` and ``Response tokens`` columns (no tokenizer needed).
- ``prefix_repetition``: ``--prefix-repetition-num-prefixes`` prefixes of ``-prefix-len``
  tokens, each followed by ``--num-prompts // num_prefixes`` prompts of a ``-suffix-len`` suffix
  (the prefix cache sees a group's prefix once); sent in vLLM's shuffled order (Python's
  ``random.shuffle`` seeded by ``--seed``) unless ``--disable-shuffle``.

The tokenizer is a local folder (``--tokenizer``, or ``--model`` when it is a folder with one),
loaded with transformers; nothing reaches the hub.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pandas as pd

from wispsim.engines.tokenizer import load_tokenizer
from wispsim.errors import ConfigError

DATASETS = ("random", "sharegpt", "custom", "burstgpt", "prefix_repetition")
NOT_MODELLED = (
    "random-mm",
    "random-rerank",
    "hf",
    "custom_audio",
    "custom_image",
    "spec_bench",
    "speed_bench",
)


def _valid(prompt: int, output: int, fixed_output: bool) -> bool:
    """vLLM's ``is_valid_sequence`` with its defaults."""
    return not (prompt < 4 or (not fixed_output and output < 4) or prompt > 1024 or prompt + output > 2048)


def _oversample(rows: list[tuple[int, int]], n: int, seed: int, no_oversample: bool) -> list[tuple[int, int]]:
    if no_oversample or len(rows) >= n or not rows:
        return rows
    random.seed(seed)
    return rows + [random.choice(rows) for _ in range(n - len(rows))]


def _read_json(path: Path, lines: bool) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
        return [json.loads(x) for x in text.splitlines() if x.strip()] if lines else json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(str(path), "", f"not readable as {'JSONL' if lines else 'JSON'} ({e})") from None


def sharegpt(path: Path, tok: Any, n: int, seed: int, output_len: int | None,
             shuffle: bool, no_oversample: bool) -> list[tuple[int, int]]:  # fmt: skip
    data = _read_json(path, lines=False)
    if not isinstance(data, list):
        raise ConfigError(str(path), "", "a ShareGPT file is a JSON list of {conversations: [...]}")
    data = [e for e in data if isinstance(e, dict) and len(e.get("conversations") or ()) >= 2]
    random.seed(seed)
    if shuffle:
        random.shuffle(data)
    rows: list[tuple[int, int]] = []
    for e in data:
        if len(rows) >= n:
            break
        try:
            prompt, completion = (str(t["value"]) for t in e["conversations"][:2])
        except (KeyError, TypeError):
            raise ConfigError(str(path), "conversations", "each turn needs a 'value'") from None
        p = len(tok(prompt).input_ids)
        o = len(tok(completion).input_ids) if output_len is None else output_len
        if _valid(p, o, output_len is not None):
            rows.append((p, o))
    return _oversample(rows, n, seed, no_oversample)


def custom(path: Path, tok: Any, n: int, seed: int, output_len: int | None,
           shuffle: bool, no_oversample: bool, chat_template: bool = True,
           ) -> list[tuple[int, int]]:  # fmt: skip
    if path.suffix != ".jsonl":
        raise ConfigError(str(path), "", "the custom dataset is a .jsonl file (as vLLM's)")
    data = _read_json(path, lines=True)
    random.seed(seed)
    if shuffle:
        random.shuffle(data)
    rows: list[tuple[int, int]] = []
    for i, item in enumerate(data[:n]):
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str) or not item["prompt"]:
            raise ConfigError(str(path), f"line {i + 1}.prompt", "needs a non-empty string 'prompt'")
        o: Any = output_len if output_len is not None else item.get("output_tokens")
        if isinstance(o, bool) or not isinstance(o, int) or o < 1:
            raise ConfigError(
                str(path),
                f"line {i + 1}.output_tokens",
                f"got {o!r}; allowed: an integer >= 1 (or --custom-output-len)",
            )
        prompt = str(item["prompt"])
        if chat_template and getattr(tok, "chat_template", None):  # as vLLM, unless --skip-chat-template
            prompt = tok.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
            )
        rows.append((len(tok(prompt).input_ids), o))
    return _oversample(rows, n, seed, no_oversample)


def burstgpt(path: Path, n: int, seed: int) -> list[tuple[int, int]]:
    try:
        df = pd.read_csv(path)
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise ConfigError(str(path), "", f"not a readable CSV ({e})") from None
    for col in ("Model", "Request tokens", "Response tokens"):
        if col not in df:
            raise ConfigError(
                str(path), col, "missing (a BurstGPT CSV: Timestamp, Model, Request tokens, ...)"
            )
    for col in ("Request tokens", "Response tokens"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    gpt4 = df[df["Model"] == "GPT-4"]
    bad = gpt4[["Request tokens", "Response tokens"]].isna().any(axis=1)
    if bad.any():
        raise ConfigError(
            str(path), f"row {bad[bad].index[0] + 2}", "Request tokens and Response tokens must be numbers"
        )
    df = gpt4[gpt4["Response tokens"] > 0]
    if df.empty:
        raise ConfigError(str(path), "Model", "no GPT-4 rows with a response (what vLLM samples)")
    rows = df.sample(n=n, random_state=seed, replace=n > len(df))
    return [
        (max(int(a), 1), int(b)) for a, b in zip(rows["Request tokens"], rows["Response tokens"], strict=True)
    ]


def prefix_repetition(
    n: int, prefix: int, suffix: int, groups: int, output: int
) -> tuple[list[tuple[int, int]], int]:
    """The requests and how many share each prefix."""
    per = n // groups
    if per == 0:
        raise ConfigError(
            "--prefix-repetition-num-prefixes",
            "num_prefixes",
            f"got {groups}; allowed: <= --num-prompts ({n})",
        )
    return [(prefix + suffix, output)] * (per * groups), per


def shuffled(n: int, seed: int) -> list[int]:
    """The order vLLM's prefix_repetition dataset sends its ``n`` prompts in: built group by group,
    then ``random.shuffle``d with Python's generator seeded by ``--seed``."""
    random.seed(seed)
    order = list(range(n))
    random.shuffle(order)
    return order


def dataset_rows(name: str, path: Path | None, tokenizer: str | None, n: int, seed: int,
                 output_len: int | None, shuffle: bool, no_oversample: bool, chat_template: bool = True,
                 ) -> list[tuple[int, int]]:  # fmt: skip
    """(prompt, output) lengths of ``n`` requests of a file dataset (module text)."""
    if name in NOT_MODELLED:
        raise ConfigError(
            "--dataset-name",
            "dataset_name",
            f"{name} is not modelled (multimodal, reranking or hub datasets)",
        )
    if name not in ("sharegpt", "custom", "burstgpt"):
        raise ConfigError("--dataset-name", "dataset_name", f"got {name!r}; allowed: {', '.join(DATASETS)}")
    if path is None or not path.is_file():
        raise ConfigError("--dataset-path", "dataset_path", f"{name} needs a local file; got {path}")
    if name == "burstgpt":
        return burstgpt(path, n, seed)
    tok = load_tokenizer(tokenizer)
    if name == "sharegpt":
        return sharegpt(path, tok, n, seed, output_len, shuffle, no_oversample)
    return custom(path, tok, n, seed, output_len, shuffle, no_oversample, chat_template)
