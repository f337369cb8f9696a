"""What a real inference engine is to wispsim: one interface over HF transformers, vLLM, ...

An engine is handed a :class:`Batch` -- each request's cached prefix and its new tokens, as token
ids -- and runs it the way a verifier does: the prefixes sit in the engine's KV cache (put there
untimed), then one pass over the new tokens reads them. It says what that took and what it reused
(:class:`BatchTiming`), and, where it knows them, its KV capacity and block size. Everything
torch- or vLLM-specific stays inside the adapters (:mod:`~wispsim.engines.hf`,
:mod:`~wispsim.engines.vllm`), imported only when an engine is built; :func:`require_torch` is
the one place that explains a missing torch.

Engines are chosen by name (:data:`ENGINES`) and built from one :class:`EngineSpec`, so a new
adapter (a vLLM CPU build, another server) only registers a class with a ``build`` method.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from wispsim.errors import WispsimError
from wispsim.registry import Registry

DTYPES = ("float32", "bfloat16", "float16")
RECORD_HINT = "pip install torch==2.13.0 'wispsim[record]'"


def require_torch(what: str = "this command") -> Any:
    """torch (with transformers importable), or a one-line error saying how to install them."""
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError:
        raise WispsimError(f"{what} needs torch and transformers (the record extra): {RECORD_HINT}") from None
    return torch


@dataclass(frozen=True, slots=True)
class Batch:
    """Token ids of one run: each request's cached prefix and its new tokens."""

    prefixes: list[list[int]]
    news: list[list[int]]

    @property
    def l_new(self) -> list[int]:
        return [len(x) for x in self.news]

    @property
    def l_cached(self) -> list[int]:
        return [len(x) for x in self.prefixes]


def random_batch(
    rng: np.random.Generator, l_new: Sequence[int], l_cached: Sequence[int], vocab: int
) -> Batch:
    """Random token ids of the given lengths (all prefixes are drawn first, then the new tokens)."""
    prefixes = [rng.integers(0, vocab, size=c).tolist() for c in l_cached]
    news = [rng.integers(0, vocab, size=n).tolist() for n in l_new]
    return Batch(prefixes, news)


@dataclass(frozen=True, slots=True)
class BatchTiming:
    """What one run of a batch took and reused.

    ``prefix_s`` is the untimed set-up (putting the prefixes in the KV cache), ``forward_s`` the
    timed pass over the new tokens; ``reused_tokens`` counts the prefix tokens that pass read from
    the cache instead of recomputing them (``None`` where the engine does not say).
    """

    prefix_s: float
    forward_s: float
    reused_tokens: int | None = None
    cached: tuple[int, ...] | None = None  # per request, where the engine reports it


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """What to build an engine from: a checkpoint (``model_path``) or, for random weights, the
    ``config.json`` values of an architecture (``arch_config``); where and at what precision it
    runs; and the largest batch it must take. Options an engine does not use are ignored by it."""

    model_path: str | None = None
    arch_config: dict[str, Any] | None = None
    device: str = "cpu"
    dtype: str = "bfloat16"
    seed: int = 0
    attention: str = "loop"  # hf: how packed attention runs (loop, varlen)
    threads: int | None = None  # hf: torch threads on a CPU
    max_batch_tokens: int = 0  # vllm: the most tokens one batch holds
    max_len: int = 0  # vllm: the longest sequence (prefix + new tokens)
    max_seqs: int = 256  # vllm: the most requests one batch holds
    prefix_caching: bool = True  # vllm: automatic prefix caching on or off
    kv_cache_gib: float = 1.0  # vllm on a CPU: the KV cache's size (VLLM_CPU_KVCACHE_SPACE)
    kv_blocks: int | None = None  # vllm: cap the KV cache at this many blocks (None: what memory allows)


class Engine(ABC):
    """A real inference engine: runs a batch of token ids over cached prefixes.

    Subclasses set ``name`` (their registry name), ``vocab``, ``device`` and ``hf_config`` (the
    transformers config of the model they run) and implement :meth:`run`; the rest has defaults.
    """

    name: ClassVar[str]
    vocab: int
    device: str
    hf_config: Any

    @classmethod
    @abstractmethod
    def build(cls, spec: EngineSpec) -> Engine:
        """An engine of this kind, ready to run batches."""

    @abstractmethod
    def run(self, batch: Batch) -> BatchTiming:
        """Put the batch's prefixes in the cache (untimed), then time one pass over its new tokens."""

    @property
    def parameters(self) -> int | None:
        """The model's parameter count where the engine can count it."""
        return None

    @property
    def block_size(self) -> int | None:
        """Tokens per KV-cache block (prefixes are cached in whole blocks), where known."""
        return None

    @property
    def kv_capacity_tokens(self) -> int | None:
        """How many tokens the KV cache holds, where known."""
        return None

    def is_oom(self, e: BaseException) -> bool:
        """Whether ``e`` says the batch did not fit in memory (a result, not a crash)."""
        return isinstance(e, MemoryError)

    def recover(self) -> None:  # noqa: B027 (optional hook: nothing to free by default)
        """Free what a failed (out-of-memory) run left behind."""


ENGINES: Registry[type[Engine]] = Registry("engine")


def make_engine(name: str, spec: EngineSpec) -> Engine:
    """Build the engine registered as ``name`` (importing its adapter's libraries now)."""
    if name not in ENGINES:
        raise WispsimError(f"--engine: got {name!r}; allowed: {', '.join(ENGINES.names())}")
    return ENGINES.get(name).build(spec)
