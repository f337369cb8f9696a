"""The vLLM engine: batches through vLLM's ``LLM`` with its automatic prefix cache (optional).

Needs the ``vllm`` extra on a CUDA machine; vLLM is imported only when the engine is built. The
prefixes are cached by vLLM's automatic prefix cache (one untimed request per prefix), then the
batch (prefix + new tokens, one output token each) is timed end to end through ``LLM.generate``.
vLLM caches whole blocks only, so up to block_size - 1 tokens of each prefix are recomputed. A
random-weight model (an architecture's ``config.json`` values, no checkpoint) is loaded with
``load_format="dummy"``.
"""

from __future__ import annotations

import tempfile
import time
from typing import Any

from wispsim.engines.base import ENGINES, Batch, BatchTiming, Engine, EngineSpec
from wispsim.errors import WispsimError


@ENGINES.register("vllm")
class VLLMEngine(Engine):
    """Times batches through vLLM with its automatic prefix cache (see the module docs)."""

    name = "vllm"

    def __init__(
        self,
        arch_config: dict[str, Any] | None,
        model_path: str | None,
        dtype: str,
        max_tokens: int,
        max_len: int,
        seed: int,
    ) -> None:
        try:
            from vllm import LLM, SamplingParams
        except ImportError:
            raise WispsimError(
                "--engine vllm needs vLLM on a CUDA machine (wispsim's vllm extra: pip install vllm); "
                "or use --engine hf"
            ) from None
        self._tmp = None
        if arch_config is not None:
            from transformers import AutoConfig

            self._tmp = tempfile.TemporaryDirectory(prefix="wispsim-arch-")
            AutoConfig.for_model(**arch_config).save_pretrained(self._tmp.name)
            path, load_format = self._tmp.name, "dummy"
        else:
            assert model_path is not None
            path, load_format = model_path, "auto"
        self.llm = LLM(
            model=path,
            dtype=dtype,
            load_format=load_format,
            enable_prefix_caching=True,
            skip_tokenizer_init=True,
            max_model_len=max_len,
            max_num_batched_tokens=max(max_tokens, max_len),
            seed=seed,
        )
        self.params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
        hf = self.llm.llm_engine.model_config.hf_config
        self.hf_config = hf
        self.vocab = int(hf.vocab_size)
        self.device = "cuda"

    @classmethod
    def build(cls, spec: EngineSpec) -> VLLMEngine:
        return cls(
            spec.arch_config, spec.model_path, spec.dtype, spec.max_batch_tokens, spec.max_len, spec.seed
        )

    def _generate(self, seqs: list[list[int]]) -> list[Any]:
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=s) for s in seqs]
        return list(self.llm.generate(prompts, self.params, use_tqdm=False))

    def run(self, batch: Batch) -> BatchTiming:
        t0 = time.perf_counter()
        pre = [p for p in batch.prefixes if p]
        if pre:
            self._generate(pre)
        t1 = time.perf_counter()
        outs = self._generate([p + n for p, n in zip(batch.prefixes, batch.news, strict=True)])
        t2 = time.perf_counter()
        return BatchTiming(t1 - t0, t2 - t1, _cached_tokens(outs))

    def _cache_config(self) -> Any:
        engine = self.llm.llm_engine
        config = getattr(engine, "cache_config", None)
        return (
            config
            if config is not None
            else getattr(getattr(engine, "vllm_config", None), "cache_config", None)
        )

    @property
    def block_size(self) -> int | None:
        size = getattr(self._cache_config(), "block_size", None)
        return int(size) if size else None

    @property
    def kv_capacity_tokens(self) -> int | None:
        blocks = getattr(self._cache_config(), "num_gpu_blocks", None)
        size = self.block_size
        return int(blocks) * size if blocks and size else None

    def is_oom(self, e: BaseException) -> bool:
        return "out of memory" in str(e).lower()


def _cached_tokens(outputs: list[Any]) -> int | None:
    """Prompt tokens vLLM served from its prefix cache (``RequestOutput.num_cached_tokens``),
    or ``None`` where this vLLM does not report them."""
    total = 0
    for o in outputs:
        n = getattr(o, "num_cached_tokens", None)
        if n is None:
            return None
        total += int(n)
    return total
