"""Scoring token sequences with vLLM: greedy continuations and per-position top-K logprobs.

What the trace recorder needs from vLLM, on engines built by ``wispsim.engines.vllm.open_llm``
(token ids in and out; no tokenizer in the engine).

``prompt_logprobs`` is vLLM's only way to see the distribution at every position of a sequence.
In vLLM 0.32 ``RequestOutput.prompt_logprobs`` holds one entry per prompt token: ``None`` for the
first (nothing predicts it), then for token j the distribution at position j - 1 as the logprob
of token j itself (with its 1-based rank) followed by the K best tokens, best first -- a
``list[dict[int, Logprob]]`` or, with ``flat_logprobs=True`` (used here: no Python object per
entry), a ``FlatLogprobs`` of flat ``token_ids``/``logprobs``/``ranks`` lists where position j
spans ``start_indices[j]:end_indices[j]`` (K + 1 entries, the actual token first even when it is
also among the K). The logprobs are log-softmax of the fp32 logits (``logprobs_mode`` =
``raw_logprobs``, the default). Such a request skips the prefix cache.

``K = -1`` asks for the whole vocabulary. vLLM refuses K above the engine's ``max_logprobs``
(20 unless set when the engine is built); that bound is checked only in the front end
(``SamplingParams.verify`` against the front end's model config, the worker takes any K), so
:func:`prompt_top_logprobs` raises it there for the K it is asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

FULL_VOCAB = -1


@dataclass(frozen=True)
class TopLogprobs:
    """One sequence's scored positions: row i is the distribution that predicts token
    ``start + i`` of the sequence."""

    ids: np.ndarray  # (n, k) int64: the k most likely tokens, best first
    logprobs: np.ndarray  # (n, k) float64: their logprobs
    token_logprob: np.ndarray  # (n,) float64: logprob of the sequence's actual token
    vocab: int  # size of the vocabulary the distribution is over


def vocab_size(llm: Any) -> int:
    """Width of the model's logits."""
    return int(llm.llm_engine.model_config.get_vocab_size())


def greedy_continuations(
    llm: Any, prompts: list[list[int]], max_new_tokens: int, stop_ids: list[int]
) -> list[list[int]]:
    """Greedy (temperature 0) continuation of every prompt, all in one ``generate`` call; a
    stop token ends a continuation and is kept in it (as ``transformers.generate`` does)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(
        temperature=0.0,
        max_tokens=max_new_tokens,
        stop_token_ids=list(stop_ids),
        detokenize=False,
    )
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    return [[int(t) for t in o.outputs[0].token_ids] for o in outs]


def prompt_top_logprobs(llm: Any, seqs: list[list[int]], k: int, starts: list[int]) -> list[TopLogprobs]:
    """Top-``k`` logprobs (``k`` = -1 or >= the vocabulary: all of it) at the positions that
    predict tokens ``starts[s]``.. of each sequence, teacher-forced, all in one ``generate``."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    vocab = vocab_size(llm)
    want = FULL_VOCAB if k == FULL_VOCAB or k >= vocab else k
    width = vocab if want == FULL_VOCAB else want
    config = llm.llm_engine.model_config
    if 0 <= config.max_logprobs < width:  # a front-end bound only (module docs)
        config.max_logprobs = width
    params = SamplingParams(
        temperature=0.0, max_tokens=1, prompt_logprobs=want, flat_logprobs=True, detokenize=False
    )
    outs = llm.generate([TokensPrompt(prompt_token_ids=s) for s in seqs], params, use_tqdm=False)
    return [
        _rows(o.prompt_logprobs, s, width, start, vocab)
        for o, s, start in zip(outs, seqs, starts, strict=True)
    ]


def _rows(plp: Any, seq: list[int], width: int, start: int, vocab: int) -> TopLogprobs:
    """Rows ``start``.. of one request's ``prompt_logprobs`` as arrays (either layout)."""
    n = len(seq) - start
    if hasattr(plp, "start_indices"):  # FlatLogprobs: K + 1 entries per position, actual first
        first = plp.start_indices[start]
        ids = np.asarray(plp.token_ids[first:], dtype=np.int64).reshape(n, width + 1)
        lps = np.asarray(plp.logprobs[first:], dtype=np.float64).reshape(n, width + 1)
        return TopLogprobs(ids[:, 1:], lps[:, 1:], lps[:, 0], vocab)
    ids = np.zeros((n, width), dtype=np.int64)
    lps = np.zeros((n, width))
    tok = np.zeros(n)
    for i in range(n):  # list of {token: Logprob}: the actual token may also be in the top K
        pos = plp[start + i]
        tok[i] = pos[seq[start + i]].logprob
        top = sorted(((lp.rank, t, lp.logprob) for t, lp in pos.items() if lp.rank <= width))
        ids[i] = [t for _, t, _ in top[:width]]
        lps[i] = [v for _, _, v in top[:width]]
    return TopLogprobs(ids, lps, tok, vocab)
