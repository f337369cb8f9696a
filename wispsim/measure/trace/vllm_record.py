"""Record greedy acceptance traces with vLLM (``wispsim trace record --engine vllm``).

The same recording as :mod:`wispsim.measure.trace.record` (same columns, metadata, resumable
``OUT.parts/``), with vLLM engines instead of a transformers forward pass, at temperature 0 only.
Per batch of prompts (tokenized with the model folder's tokenizer, as the HF recorder does): the
target generates every response greedily in one ``generate`` call; the target is teacher-forced
over prompt + response with ``prompt_logprobs=1`` (its top-1 token and probability at every
response position); then the draft with ``prompt_logprobs=K`` (its top K and the logprob of the
committed token). vLLM returns no more than the top K of the draft's distribution q, so:

- **exact** (up to floating-point differences between the engines): ``top1_prob``,
  ``top2_prob``, ``margin``, ``committed_q`` (vLLM returns the committed token's logprob besides
  the top K), ``greedy_agree`` (argmax q == the target's teacher-forced argmax), ``beta`` and
  ``accept`` (the greedy verdict), ``target_top1_prob``, ``committed_is_target_top1``;
- **approximated** from the top K and the mass R = 1 - sum of their probabilities, spread evenly
  over the other V - K tokens (each gets logprob t = log(R / (V - K)); the largest-entropy
  completion of what is known): ``entropy`` = -sum_topK p log p - R log(R / (V - K)), an upper
  bound on the true entropy (any other split of R has less); ``logit_std`` = the std (ddof 1,
  as the HF recorder) over the V values {top-K logprobs, t repeated V - K times} -- logprobs are
  the logits minus one constant, so their std is the logits' std, but a flat tail has no spread,
  so this is biased *low*, by a lot for a large vocabulary, whose bulk sets the std.

``top_k = -1`` (or >= the vocabulary) asks vLLM for the whole distribution: every column is then
exact, at the cost of V logprobs per position crossing from the engine process (about 1 GB of
Python lists per 1,000 positions for a 150k vocabulary). The metadata names the exact and the
approximated columns and the K.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wispsim.errors import WispsimError
from wispsim.measure.trace.record import (
    base_meta,
    encode_prompt,
    load_tokenizer,
    parts_folder,
    read_prompts,
    resolve_model,
    stop_ids,
    write_sample,
    write_trace,
)
from wispsim.provenance import module_versions

BATCH = 16  # prompts per generate call (and per resumable step)
EXACT = (
    "top1_prob,top2_prob,margin,committed_q,greedy_agree,beta,accept,target_top1_prob,"
    "committed_is_target_top1"
)
APPROXIMATED = "entropy,logit_std"
DTYPES = ("float32", "bfloat16", "float16")


def topk_columns(
    q: Any, target_top1: np.ndarray, target_top1_logprob: np.ndarray, response: np.ndarray
) -> dict[str, np.ndarray]:
    """Per-position trace columns from the draft's top K (``q``, a ``TopLogprobs``) and the
    target's teacher-forced top-1 token and logprob (module docs: what is exact)."""
    lq = q.logprobs
    n, k = lq.shape
    pq = np.exp(lq)
    rest = q.vocab - k
    if rest > 0:
        mass = np.clip(1.0 - pq.sum(-1), 1e-300, 1.0)
        # the tail's even share, never above the K-th token (rounding can push R / (V-K) there)
        tail = np.minimum(np.log(mass) - np.log(rest), lq[:, -1])
        tail_mass = np.exp(tail) * rest
        entropy = -(pq * lq).sum(-1) - tail_mass * tail
        mean = (lq.sum(-1) + rest * tail) / q.vocab
        ss = ((lq - mean[:, None]) ** 2).sum(-1) + rest * (tail - mean) ** 2
    else:
        entropy = -(pq * lq).sum(-1)
        ss = ((lq - lq.mean(-1, keepdims=True)) ** 2).sum(-1)
    greedy = q.ids[:, 0] == target_top1
    second = pq[:, 1] if k > 1 else np.zeros(n)
    return {
        "top1_prob": pq[:, 0],
        "entropy": np.maximum(entropy, 0.0),
        "margin": pq[:, 0] - second,
        "logit_std": np.sqrt(ss / (q.vocab - 1)),
        "top2_prob": second,
        "committed_q": np.exp(q.token_logprob),
        "beta": greedy.astype(np.float64),
        "greedy_agree": greedy,
        "accept": greedy,
        "target_top1_prob": np.exp(target_top1_logprob),
    }


def generation_eos(folder: str) -> Any:
    """The model's generation EOS id(s): ``generation_config.json``, else ``config.json`` (what
    transformers' ``generation_config`` holds)."""
    for name in ("generation_config.json", "config.json"):
        f = Path(folder, name)
        if f.is_file():
            eos = json.loads(f.read_text()).get("eos_token_id")
            if eos is not None:
                return eos
    return None


def max_positions(folder: str) -> int:
    return int(json.loads(Path(folder, "config.json").read_text()).get("max_position_embeddings") or 2048)


def record_trace_vllm(
    draft_path: str,
    target_path: str,
    prompts_path: Path,
    out: Path,
    *,
    temperature: float = 0.0,
    max_new_tokens: int = 128,
    seed: int = 0,
    limit: int | None = None,
    command: str = "",
    notes: str = "",
    progress: Callable[[int, int], None] | None = None,
    top_k: int = 20,
    dtype: str = "float32",
) -> int:
    """Record a greedy trace with vLLM; returns the positions in ``out``. Resumes from
    ``OUT.parts``."""
    from wispsim.engines.vllm import import_vllm, open_llm
    from wispsim.engines.vllm_scoring import greedy_continuations, prompt_top_logprobs

    if temperature != 0:
        raise WispsimError(
            f"--temperature: the vllm recorder is greedy only (temperature 0), got {temperature}; "
            "use --engine hf to sample"
        )
    if top_k != -1 and top_k < 2:
        raise WispsimError(f"--top-k: must be >= 2 (or -1: the whole vocabulary), got {top_k}")
    if dtype not in DTYPES:
        raise WispsimError(f"--vllm-dtype: got {dtype!r}; allowed: {', '.join(DTYPES)}")
    vllm = import_vllm()
    draft_path, target_path = resolve_model(draft_path), resolve_model(target_path)  # or hub ids
    for flag, path in (("--draft", draft_path), ("--target", target_path)):
        if not Path(path, "config.json").is_file():
            raise WispsimError(f"{flag}: {path}: --engine vllm needs a model folder in HF format")
    prompts = read_prompts(prompts_path)[: limit or None]
    tok, dtok = load_tokenizer(target_path), load_tokenizer(draft_path)
    if dtok.get_vocab() != tok.get_vocab():
        raise WispsimError("--draft and --target must share a tokenizer (their vocabularies differ)")
    eos_ids = stop_ids(tok, generation_eos(target_path))
    encoded = []
    for pr in prompts:
        ids = encode_prompt(tok, pr.text)
        if not ids:
            raise WispsimError(f"{prompts_path}: prompt {pr.id!r} encodes to no tokens")
        encoded.append(ids)
    room = min(max_positions(draft_path), max_positions(target_path))
    need = max(len(ids) for ids in encoded) + max_new_tokens
    if need > room:
        raise WispsimError(
            f"--max-new-tokens: the longest prompt ({need - max_new_tokens} tokens) plus "
            f"{max_new_tokens} new tokens exceeds the models' {room} positions"
        )
    # one size for every call, so that the engines this process started are reused
    max_len = min(room, max(2048, need))
    parts = parts_folder(out)
    meta = {
        **base_meta(draft_path, target_path, prompts_path, prompts, command, notes),
        "engine": "vllm",
        "vllm_version": str(vllm.__version__),
        "top_k": "all" if top_k == -1 else str(top_k),
        "exact_columns": EXACT + (f",{APPROXIMATED}" if top_k == -1 else ""),
        "approximated_columns": "" if top_k == -1 else APPROXIMATED,
        "approximation": "" if top_k == -1 else "top-K plus the rest of the mass spread evenly",
        "dtype": f"{dtype} (vLLM engines: generation and scoring)",
        "generate_dtype": dtype,
        "device": "cpu",
        "temperature": "0.0",
        "max_new_tokens": str(max_new_tokens),
        "seed": str(seed),
        "versions": json.dumps(module_versions(("vllm", "torch", "transformers", "numpy"))),
    }
    from wispsim.engines.vllm import on_cpu

    meta["device"] = "cpu" if on_cpu() else "cuda"
    todo = [i for i in range(len(prompts)) if not (parts / f"sample-{i:05d}.parquet").exists()]
    done = len(prompts) - len(todo)
    for b in range(0, len(todo), BATCH):
        batch = todo[b : b + BATCH]
        pids = [encoded[i] for i in batch]
        target = open_llm(target_path, dtype=dtype, max_len=max_len, max_seqs=BATCH)
        responses = greedy_continuations(target, pids, max_new_tokens, eos_ids)
        seqs = [p + r for p, r in zip(pids, responses, strict=True)]
        starts = [len(p) for p in pids]
        p_top = prompt_top_logprobs(target, seqs, 1, starts)
        q_top = prompt_top_logprobs(
            open_llm(draft_path, dtype=dtype, max_len=max_len, max_seqs=BATCH), seqs, top_k, starts
        )
        for i, p, q, resp in zip(batch, p_top, q_top, responses, strict=True):
            response = np.asarray(resp, dtype=np.int64)
            n_prompt = len(encoded[i])
            r = len(response)
            df = pd.DataFrame(
                {
                    "position": np.arange(r),
                    "context_length": n_prompt + np.arange(r),
                    **topk_columns(q, p.ids[:, 0], p.logprobs[:, 0], response),
                    "token_id": response,
                    "committed_is_target_top1": p.ids[:, 0] == response,
                }
            )
            write_sample(parts, i, prompts[i], df)
        write_trace(parts, out, meta)
        done += len(batch)
        if progress:
            progress(done, len(prompts))
    if progress and not todo:
        progress(len(prompts), len(prompts))
    return write_trace(parts, out, meta)
