"""The engine behind ``wispsim serve``: what it runs (:class:`ModelSource`), building it for a
scenario (:func:`build_engine`: vLLM sized by the scenario's engine and KV settings, or the HF
engine) and the backend that serves centralized responses from vLLM (:class:`VLLMBackend`).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

from wispsim.config import Scenario
from wispsim.errors import WispsimError
from wispsim.host import cpu_facts
from wispsim.model.batch import blocks as blocks_of
from wispsim.model.memory import block_size
from wispsim.model.profiles import load_profile
from wispsim.serve.central import CentralServer
from wispsim.serve.limits import Limits


@dataclass(frozen=True)
class ModelSource:
    """What the engine runs: a model folder, or an architecture with random weights."""

    model: str | None = None
    arch: str | None = None
    dtype: str = "float32"
    seed: int = 0

    def describe(self) -> str:
        return self.model or f"{self.arch} (random weights)"


def longest_sequence(sc: Scenario) -> int:
    """The most tokens one session can hold: longest prompt + output + a round's draft + 1."""
    wl, dr = sc.workload, sc.drafting
    return int(wl.prompt_tokens.support()[1] + wl.output_tokens.support()[1]) + dr.largest + 2


def build_engine(sc: Scenario, source: ModelSource) -> tuple[Any, dict[str, Any]]:
    """Start vLLM for ``sc``'s server: prefix caching as the policy says (off for SLED), the KV
    cache capped at ``server.engine.kv_capacity_tokens`` when the scenario sets it; returns the engine
    and its facts (block size, the KV capacity a request can really get, request slots).

    The KV block is the engine's (128 tokens on vLLM's CPU backend, 16 on a GPU): the server
    plans with it whatever the scenario's profile says. Only a scenario that caps the cache in
    tokens (``server.engine.kv_capacity_tokens``) must agree with it, since the cap is set in blocks."""
    from wispsim.engines.base import EngineSpec
    from wispsim.engines.vllm import VLLMEngine
    from wispsim.model.archs import load_arch

    srv = sc.server
    # vLLM's engine core runs in the server's process unless the environment says otherwise: on a
    # small host that is about 2x faster per batch than a separate busy-polling engine process
    # (REPORT.md, KV section), and every policy gets the same layout. Admission control needs it:
    # the server frees ended sessions' blocks in vLLM's block pool (release_prefixes).
    layout = os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if (
        srv.mode == "speculative"
        and srv.verifier.kv_policy == "admission"
        and srv.engine.enable_prefix_caching
        and layout != "0"
    ):
        what = (
            "server.verifier.kind resident keeps sessions"
            if srv.verifier.kind == "resident"
            else "server.verifier.kv_policy admission frees ended sessions' blocks"
        )
        raise WispsimError(
            f"VLLM_ENABLE_V1_MULTIPROCESSING={layout}: {what} in vLLM's engine core, which must run in "
            "the server's process; unset it or set 0"
        )
    profile = load_profile(srv.profile)
    profile.check_layout(layout == "0", "wispsim serve")  # its estimates must be this engine's
    bs = block_size(srv.engine.block_size, profile)
    max_len = longest_sequence(sc)
    # vLLM keeps one block of its cache for itself (the null block): cap it one block larger
    blocks = (
        None if srv.engine.kv_capacity_tokens is None else blocks_of(srv.engine.kv_capacity_tokens, bs) + 1
    )
    if blocks is not None and (blocks - 1) * bs < max_len:
        raise WispsimError(
            f"server.engine.kv_capacity_tokens: {srv.engine.kv_capacity_tokens} tokens cannot hold the "
            f"longest session ({max_len} tokens); raise it or shorten the workload"
        )
    spec = EngineSpec(
        model_path=source.model,
        arch_config=load_arch(source.arch).hf if source.arch else None,
        dtype=source.dtype,
        seed=source.seed,
        max_len=max_len,
        max_batch_tokens=max(srv.verifier.max_batch_tokens, max_len) * 2,
        max_seqs=srv.engine.max_num_seqs,
        prefix_caching=srv.engine.enable_prefix_caching or srv.mode == "centralized",
        kv_cache_gib=max(1.0, (blocks or 0) * bs * profile.model.kv_bytes_per_token / 2**30),
        kv_blocks=blocks,
    )
    eng = VLLMEngine.build(spec)
    real_bs = eng.block_size or bs
    if blocks is not None and real_bs != bs:
        raise WispsimError(
            f"server.engine.kv_capacity_tokens: the cap is set in the scenario's {bs}-token blocks, the "
            f"engine's KV block is {real_bs} tokens; set server.engine.block_size: {real_bs}"
        )
    facts = {
        "engine": "vllm",
        "device": eng.device,
        "block_size": real_bs,
        "kv_capacity_tokens": eng.kv_capacity_tokens,  # what requests can get (the null block left out)
        "max_num_seqs": eng.max_num_seqs,
        "vocab": eng.vocab,
        "max_len": max_len,
        "prefix_caching": spec.prefix_caching,
        "model": source.describe(),
        "dtype": source.dtype,
        "kv_policy": srv.verifier.kv_policy if srv.mode == "speculative" else "engine",
        "verifier": srv.verifier.kind if srv.mode == "speculative" else "engine",
        "engine_in_process": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0",
        "host": cpu_facts(),  # the CPU the real timings come from (wispsim.host)
    }
    return eng, facts


class VLLMBackend:
    """What the app needs of the engine: run a verification batch, empty the prefix cache, and
    (centralized) the engine whose continuous batching generates whole responses. ``stop`` is
    set when the server shuts down: a batch on the engine ends between two steps."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.stop = threading.Event()

    def run_batch(self, seqs: list[list[int]]) -> tuple[list[int], tuple[int, ...] | None]:
        """One output token per sequence, in one batch; the bonus tokens and vLLM's cached counts."""
        from wispsim.engines.vllm import cached_tokens

        outs = self.engine.generate_checked(seqs, self.stop)
        return [int(o.outputs[0].token_ids[0]) for o in outs], cached_tokens(outs)

    def release_prefixes(self, seqs: list[list[int]]) -> int | None:
        """Ended sessions' blocks are vLLM's first to reuse (None: it cannot, engine elsewhere)."""
        return self.engine.release_prefixes(seqs)

    def resident_sessions(self) -> Any:
        """Sessions kept in the engine (``server.verifier.kind: resident``)."""
        from wispsim.engines.vllm_sessions import ResidentSessions

        return ResidentSessions(self.engine.llm, self.engine.params, self.stop)

    def kv_usage(self) -> float | None:
        """The share of the engine's KV blocks in use (vLLM's ``kv_cache_usage_perc``)."""
        return self.engine.kv_usage()

    def reset_cache(self) -> bool:
        """Empty vLLM's prefix cache; False if it refused (requests still hold blocks)."""
        return bool(self.engine.llm.reset_prefix_cache())

    def central(self, vocab: int, max_len: int, limits: Limits) -> CentralServer:
        from wispsim.engines.vllm import fixed_length_params, tokens_prompt

        engine = self.engine.llm.llm_engine
        return CentralServer(engine, fixed_length_params, tokens_prompt, vocab, max_len, limits=limits)
