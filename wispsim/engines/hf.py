"""The HF transformers engine: packed forward passes over a real KV cache.

The model is a checkpoint (a folder in HF format, or a ``.gguf`` file) or a random-weight model
of an architecture (its ``config.json`` values): the work of a forward pass does not depend on the weights'
values, only on the shapes. A batch runs as vLLM runs it: the new tokens of all requests are one
packed sequence with per-request position ids (logits for every new token, as verification
needs), and attention is computed per request over its own cached prefix and new tokens
(:mod:`~wispsim.engines.packed_attention`). The cached prefixes really live in the model's KV
cache (a transformers ``DynamicCache``): an untimed packed forward over all prefixes fills it,
then the timed forward appends the new tokens' keys and values to it and attends over it.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from wispsim.engines import packed_attention as packed
from wispsim.engines.base import (
    ENGINES,
    Batch,
    BatchTiming,
    Engine,
    EngineSpec,
    random_batch,
    require_torch,
)
from wispsim.errors import WispsimError

ATTENTION = ("loop", "varlen")


def checkpoint_source(path: str) -> tuple[str, dict[str, Any]]:
    """The folder ``from_pretrained`` reads and its extra arguments: a ``.gguf`` file is read
    through its folder (``gguf_file``), a folder as it is."""
    p = Path(path)
    if p.suffix == ".gguf":
        return str(p.parent), {"gguf_file": p.name}
    return str(p), {}


def load_causal_lm(path: str, device: str, dtype: str = "float32") -> Any:
    """A causal LM in eval mode, loaded from a checkpoint folder or ``.gguf`` file at ``dtype``."""
    torch = require_torch()
    from transformers import AutoModelForCausalLM

    folder, kw = checkpoint_source(path)
    model: Any = AutoModelForCausalLM.from_pretrained(folder, **kw, dtype=getattr(torch, dtype))
    return model.to(device).eval()


def build_hf_model(
    arch_config: dict[str, Any] | None, model_path: str | None, device: str, dtype: str, seed: int = 0
) -> Any:
    """A causal LM in eval mode: random weights of the architecture whose ``config.json`` values
    are ``arch_config``, or loaded from ``model_path`` when no architecture is given."""
    torch = require_torch("the hf engine")
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    if arch_config is not None:
        with torch.device(device):
            model: Any = AutoModelForCausalLM.from_config(
                AutoConfig.for_model(**arch_config), dtype=getattr(torch, dtype)
            )
        return model.eval()
    assert model_path is not None
    if not Path(model_path).exists():
        raise WispsimError(f"--model: {model_path}: not found")
    return load_causal_lm(model_path, device, dtype)


@ENGINES.register("hf")
class HFEngine(Engine):
    """Times packed forward passes of a transformers model with a real KV cache."""

    name = "hf"

    def __init__(self, model: Any, device: str, attention: str = "loop") -> None:
        import torch

        if attention not in ATTENTION:
            raise WispsimError(f"--attention: got {attention!r}; allowed: {', '.join(ATTENTION)}")
        if attention == "varlen" and not str(device).startswith("cuda"):
            raise WispsimError("--attention varlen needs --device cuda")
        packed.register_packed_attention()
        model.set_attn_implementation(packed.ATTN_NAME)
        self.model = model
        self.device = device
        self.attention = attention
        self.torch = torch
        self.hf_config = model.config
        self.vocab = int(model.config.vocab_size)
        if attention == "varlen":
            check_packed_attention(self, reference="loop")

    @classmethod
    def build(cls, spec: EngineSpec) -> HFEngine:
        torch = require_torch("the hf engine")
        if spec.threads:
            torch.set_num_threads(spec.threads)
        model = build_hf_model(spec.arch_config, spec.model_path, spec.device, spec.dtype, spec.seed)
        return cls(model, spec.device, spec.attention)

    @property
    def parameters(self) -> int:
        return int(self.model.num_parameters())

    def _sync(self) -> None:
        if str(self.device).startswith("cuda"):
            self.torch.cuda.synchronize()

    def _ids(self, seqs: Sequence[Sequence[int]]) -> Any:
        flat = [t for s in seqs for t in s]
        return self.torch.tensor([flat], dtype=self.torch.long, device=self.device)

    def prefill(self, batch: Batch) -> Any:
        """A DynamicCache holding every request's prefix, packed (untimed)."""
        from transformers import DynamicCache

        # full layers only: a sliding-window layer's cache would keep the packed sequence's last
        # window of tokens across requests (the window is applied per request by the attention)
        cache = DynamicCache()
        pre = [(p, len(p)) for p in batch.prefixes if p]
        if not pre:
            return cache
        pos = self.torch.cat([self.torch.arange(n) for _, n in pre]).unsqueeze(0).to(self.device)
        packed._METHOD[0] = self.attention
        packed._LAYOUT[0] = packed.PackedLayout([n for _, n in pre], [0] * len(pre), 0, self.device)
        try:
            self.model(
                input_ids=self._ids([p for p, _ in pre]),
                position_ids=pos,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
        finally:
            packed._LAYOUT[0] = None
        return cache

    def forward(self, batch: Batch, cache: Any) -> Any:
        """The verification forward: all new tokens, logits for every one of them."""
        torch = self.torch
        pos = torch.cat(
            [torch.arange(c, c + n) for n, c in zip(batch.l_new, batch.l_cached, strict=True)]
        ).unsqueeze(0)
        packed._METHOD[0] = self.attention
        packed._LAYOUT[0] = packed.PackedLayout(batch.l_new, batch.l_cached, sum(batch.l_cached), self.device)
        try:
            return self.model(
                input_ids=self._ids(batch.news),
                position_ids=pos.to(self.device),
                past_key_values=cache,
                use_cache=True,
            ).logits
        finally:
            packed._LAYOUT[0] = None

    def run(self, batch: Batch) -> BatchTiming:
        """Build the prefix cache, then time the forward pass; every prefix token is reused."""
        with self.torch.inference_mode():
            t0 = time.perf_counter()
            cache = self.prefill(batch)
            self._sync()
            t1 = time.perf_counter()
            logits = self.forward(batch, cache)
            self._sync()
            t2 = time.perf_counter()
        del logits, cache
        return BatchTiming(t1 - t0, t2 - t1, sum(batch.l_cached), tuple(batch.l_cached))

    def is_oom(self, e: BaseException) -> bool:
        return isinstance(e, self.torch.OutOfMemoryError | MemoryError)

    def recover(self) -> None:
        import gc

        packed._LAYOUT[0] = None
        gc.collect()
        if str(self.device).startswith("cuda"):
            self.torch.cuda.empty_cache()


def check_packed_attention(engine: HFEngine, reference: str = "per-request", tol: float = 0.1) -> float:
    """Largest relative difference between the packed forward's logits and a reference on a small
    mixed batch: one forward per request with its own cache (``per-request``), or the ``loop``
    attention method. Raises if it exceeds ``tol``. On an H200 at bf16 (benchmarks/gpu/
    check_varlen.py, 2026-11-26) the causal varlen pass differs from the SDPA loop by 0.036
    (Llama-2-7B) and 0.022 (Qwen3-14B, GQA) through their random-weight layers, a non-causal
    (wrong) mask by 1.5 and 1.2: ``tol`` sits between the two."""
    torch = engine.torch
    rng = np.random.default_rng(np.random.SeedSequence([7, zlib.crc32(b"check"), 0, 0]))
    batch = random_batch(rng, (3, 1, 4, 2), (5, 9, 0, 2), engine.vocab)
    with torch.inference_mode():
        out = engine.forward(batch, engine.prefill(batch))[0].float()
        if reference == "loop":
            method, engine.attention = engine.attention, "loop"
            try:
                ref = engine.forward(batch, engine.prefill(batch))[0].float()
            finally:
                engine.attention = method
        else:
            parts = []
            for p, n in zip(batch.prefixes, batch.news, strict=True):
                one = Batch([p], [n])
                parts.append(engine.forward(one, engine.prefill(one))[0].float())
            ref = torch.cat(parts)
    err = float(((out - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item())
    if not err <= tol:
        raise WispsimError(
            f"packed attention ({engine.attention}) differs from the {reference} reference by {err:.3g}"
        )
    return err
