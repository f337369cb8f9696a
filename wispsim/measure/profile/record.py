"""Time real verification batches for a profiling plan (``wispsim profile record``, SPEC 4).

For every configuration of a plan (:mod:`wispsim.measure.profile.plan`) the recorder builds the batch's
cached prefixes, then times one forward pass of the batch's new tokens on top of them: ``warmup``
untimed runs, then ``runs`` timed runs, each with fresh random token ids (drawn from a generator
seeded by the plan seed, the configuration and the run), so no prefix or result cache can make a
run cheaper than a real one. The coefficient of variation of the timed runs is recorded; when it
exceeds ``max_cv`` the timed runs are repeated (``retries`` times) and the steadier attempt kept.

Engine ``hf`` (transformers, what this module implements and tests):

- The model is a real HF checkpoint (``--model``) or a random-weight model of a named
  architecture (``--arch``, :mod:`~wispsim.measure.profile.archs`): the work of a forward pass
  does not depend on the weights' values, only on the shapes.
- The batch is *packed*, as vLLM does it: the new tokens of all requests go through the
  projections, MLPs and LM head as one sequence of N_linear tokens (logits for every new token,
  as verification needs), with per-request position ids. Attention is computed per request over
  its own cached prefix and new tokens by an attention function registered with transformers
  (``wispsim_packed``), so the attention work is sum L_total x L_new, not that of a padded
  batch. ``loop`` runs PyTorch SDPA once per request (any device; on a GPU the per-request
  launches add a few microseconds per request and layer); ``varlen`` (CUDA only) runs one
  variable-length flash-attention call per layer, and is checked against ``loop`` before use.
- The cached prefixes really live in the model's KV cache (a transformers ``DynamicCache``): an
  untimed packed forward over all prefixes fills it, then the timed forward appends the new
  tokens' keys and values to it and attends over it.

Engine ``vllm`` (optional extra ``vllm``, imported only when asked for; not exercised by the
test suite): prefixes are cached by vLLM's automatic prefix cache (one untimed request per
prefix), then the batch (prefix + new tokens, one output token each) is timed end to end through
``LLM.generate``. vLLM caches whole blocks only, so up to block_size - 1 tokens of each prefix are
recomputed. ``--arch`` with vLLM uses ``load_format="dummy"`` (random weights).

Rows are appended to the output CSV as they finish; rerunning the same command skips the
configurations already there (to retry a failed one, delete its row). ``OUT.meta.json`` keeps
the command, date, versions, hardware and model facts; a resume with different settings is
refused.
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import os
import platform
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wispsim.errors import WispsimError
from wispsim.measure.profile.archs import Arch, dtype_bytes, load_arch
from wispsim.measure.profile.plan import Configuration, join_ints, read_plan
from wispsim.model.measured import DATA_COLUMNS
from wispsim.provenance import file_sha256, module_versions

RECORDER_VERSION = "1"
ENGINES = ("hf", "vllm")
ATTENTION = ("loop", "varlen")
DTYPES = ("float32", "bfloat16", "float16")
ATTN_NAME = "wispsim_packed"


def _require_torch() -> Any:
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError:
        raise WispsimError(
            "profile record needs torch and transformers (the record extra): pip install torch transformers"
        ) from None
    return torch


# ---------------------------------------------------------------------------------------------
# packed attention: one sequence of new tokens, attention per request
# ---------------------------------------------------------------------------------------------


class PackedLayout:
    """Where each request's queries and keys sit in a packed forward pass.

    The KV cache holds the packed prefixes (``past`` tokens: request 0's prefix, request 1's,
    ...); the forward's new tokens are packed after them in the same order. Request i's queries
    are new tokens [q0, q0 + L_new); its keys are its prefix [c0, c0 + L_cached) followed by its
    new tokens [past + q0, past + q0 + L_new), causal within the new tokens.
    """

    def __init__(self, l_new: Sequence[int], l_cached: Sequence[int], past: int, device: Any) -> None:
        import torch

        self.segments: list[tuple[int, int, int, int, int]] = []
        self.masks: dict[int, Any] = {}
        q0 = c0 = 0
        gather: list[Any] = []
        for i, (n, c) in enumerate(zip(l_new, l_cached, strict=True)):
            self.segments.append((q0, n, c0, c, past + q0))
            if n > 1 and c > 0:  # query j (0-based) sees the prefix and new tokens 0..j
                self.masks[i] = torch.ones(n, c + n, dtype=torch.bool, device=device).tril(diagonal=c)
            gather += [torch.arange(c0, c0 + c), torch.arange(past + q0, past + q0 + n)]
            q0 += n
            c0 += c
        self.n_new = q0
        self._gather = torch.cat(gather).to(device) if gather else None
        totals = [n + c for n, c in zip(l_new, l_cached, strict=True)]
        self.cu_q = torch.tensor([0, *np.cumsum(l_new)], dtype=torch.int32, device=device)
        self.cu_k = torch.tensor([0, *np.cumsum(totals)], dtype=torch.int32, device=device)
        self.max_q = max(l_new, default=0)
        self.max_k = max(totals, default=0)


_LAYOUT: list[PackedLayout | None] = [None]
_METHOD: list[str] = ["loop"]


def packed_attention(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """transformers attention function: query (1, H, N_new, D), key/value (1, KV, past + N_new, D);
    returns (1, N_new, H, D)."""
    import torch
    import torch.nn.functional as F

    layout = _LAYOUT[0]
    if layout is None or query.shape[0] != 1 or query.shape[2] != layout.n_new:
        raise RuntimeError("wispsim_packed attention needs a packed batch (see profile_record.PackedLayout)")
    gqa = query.shape[1] != key.shape[1]
    if _METHOD[0] == "varlen":
        from torch.nn.attention.varlen import varlen_attn

        q = query[0].transpose(0, 1).contiguous()
        k = key[0].transpose(0, 1).index_select(0, layout._gather)
        v = value[0].transpose(0, 1).index_select(0, layout._gather)
        out: Any = varlen_attn(
            q,
            k,
            v,
            layout.cu_q,
            layout.cu_k,
            layout.max_q,
            layout.max_k,
            scale=scaling,
            window_size=(-1, 0),
            enable_gqa=gqa,
        )
        return out.unsqueeze(0), None
    out = query.new_empty(1, query.shape[2], query.shape[1], query.shape[3])
    for i, (q0, n, c0, c, k0) in enumerate(layout.segments):
        q = query[:, :, q0 : q0 + n]
        k = key[:, :, k0 : k0 + n]
        v = value[:, :, k0 : k0 + n]
        if c:
            k = torch.cat([key[:, :, c0 : c0 + c], k], dim=2)
            v = torch.cat([value[:, :, c0 : c0 + c], v], dim=2)
        o = F.scaled_dot_product_attention(
            q, k, v, attn_mask=layout.masks.get(i), is_causal=c == 0 and n > 1, scale=scaling, enable_gqa=gqa
        )
        out[:, q0 : q0 + n] = o.transpose(1, 2)
    return out, None


def register_packed_attention() -> None:
    from transformers import AttentionInterface

    if ATTN_NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(ATTN_NAME, packed_attention)


@dataclass(frozen=True, slots=True)
class Batch:
    """Token ids of one timed run: each request's cached prefix and its new tokens."""

    prefixes: list[list[int]]
    news: list[list[int]]

    @property
    def l_new(self) -> list[int]:
        return [len(x) for x in self.news]

    @property
    def l_cached(self) -> list[int]:
        return [len(x) for x in self.prefixes]


def make_batch(config: Configuration, run: int, attempt: int, vocab: int) -> Batch:
    """Fresh random token ids for one run (unique per plan seed, configuration, attempt and run)."""
    key = zlib.crc32(config.config_id.encode())
    rng = np.random.default_rng(np.random.SeedSequence([config.seed, key, attempt, run]))
    prefixes = [rng.integers(0, vocab, size=c).tolist() for c in config.l_cached]
    news = [rng.integers(0, vocab, size=n).tolist() for n in config.l_new]
    return Batch(prefixes, news)


# ---------------------------------------------------------------------------------------------
# engines
# ---------------------------------------------------------------------------------------------


def build_hf_model(arch: Arch | None, model_path: str | None, device: str, dtype: str, seed: int = 0) -> Any:
    """A causal LM in eval mode: random weights of ``arch``, or loaded from ``model_path``."""
    torch = _require_torch()
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    td = getattr(torch, dtype)
    if arch is not None:
        with torch.device(device):
            model: Any = AutoModelForCausalLM.from_config(arch.hf_config(), dtype=td)
    else:
        assert model_path is not None
        if not Path(model_path).exists():
            raise WispsimError(f"--model: {model_path}: not found")
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=td)
        model = model.to(device)
    return model.eval()


class HFEngine:
    """Times packed forward passes of a transformers model with a real KV cache."""

    name = "hf"

    def __init__(self, model: Any, device: str, attention: str = "loop") -> None:
        import torch

        if attention not in ATTENTION:
            raise WispsimError(f"--attention: got {attention!r}; allowed: {', '.join(ATTENTION)}")
        if attention == "varlen" and not str(device).startswith("cuda"):
            raise WispsimError("--attention varlen needs --device cuda")
        register_packed_attention()
        model.set_attn_implementation(ATTN_NAME)
        self.model = model
        self.device = device
        self.attention = attention
        self.torch = torch
        self.vocab = int(model.config.vocab_size)
        if attention == "varlen":
            check_packed_attention(self, reference="loop")

    def _sync(self) -> None:
        if str(self.device).startswith("cuda"):
            self.torch.cuda.synchronize()

    def _ids(self, seqs: Sequence[Sequence[int]]) -> Any:
        flat = [t for s in seqs for t in s]
        return self.torch.tensor([flat], dtype=self.torch.long, device=self.device)

    def prefill(self, batch: Batch) -> Any:
        """A DynamicCache holding every request's prefix, packed (untimed)."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        pre = [(p, len(p)) for p in batch.prefixes if p]
        if not pre:
            return cache
        pos = self.torch.cat([self.torch.arange(n) for _, n in pre]).unsqueeze(0).to(self.device)
        _METHOD[0] = self.attention
        _LAYOUT[0] = PackedLayout([n for _, n in pre], [0] * len(pre), 0, self.device)
        try:
            self.model(
                input_ids=self._ids([p for p, _ in pre]),
                position_ids=pos,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
        finally:
            _LAYOUT[0] = None
        return cache

    def forward(self, batch: Batch, cache: Any) -> Any:
        """The verification forward: all new tokens, logits for every one of them."""
        torch = self.torch
        pos = torch.cat(
            [torch.arange(c, c + n) for n, c in zip(batch.l_new, batch.l_cached, strict=True)]
        ).unsqueeze(0)
        _METHOD[0] = self.attention
        _LAYOUT[0] = PackedLayout(batch.l_new, batch.l_cached, sum(batch.l_cached), self.device)
        try:
            return self.model(
                input_ids=self._ids(batch.news),
                position_ids=pos.to(self.device),
                past_key_values=cache,
                use_cache=True,
            ).logits
        finally:
            _LAYOUT[0] = None

    def time(self, batch: Batch) -> tuple[float, float]:
        """(seconds to build the prefix cache, seconds of the timed forward pass)."""
        with self.torch.inference_mode():
            t0 = time.perf_counter()
            cache = self.prefill(batch)
            self._sync()
            t1 = time.perf_counter()
            logits = self.forward(batch, cache)
            self._sync()
            t2 = time.perf_counter()
        del logits, cache
        return t1 - t0, t2 - t1

    def is_oom(self, e: BaseException) -> bool:
        return isinstance(e, self.torch.OutOfMemoryError | MemoryError)

    def recover(self) -> None:
        """Free what a failed (out-of-memory) run left behind."""
        import gc

        _LAYOUT[0] = None
        gc.collect()
        if str(self.device).startswith("cuda"):
            self.torch.cuda.empty_cache()

    def facts(self) -> dict[str, Any]:
        return model_facts(self.model.config, int(self.model.num_parameters()))


def check_packed_attention(engine: HFEngine, reference: str = "per-request", tol: float = 2e-2) -> float:
    """Largest relative difference between the packed forward's logits and a reference on a small
    mixed batch: one forward per request with its own cache (``per-request``), or the ``loop``
    attention method. Raises if it exceeds ``tol``."""
    torch = engine.torch
    cfg = Configuration("check", "train", "check", 7, ((3, 5), (1, 9), (4, 0), (2, 2)))
    batch = make_batch(cfg, 0, 0, engine.vocab)
    with torch.inference_mode():
        packed = engine.forward(batch, engine.prefill(batch))[0].float()
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
    err = float(((packed - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item())
    if not err <= tol:
        raise WispsimError(
            f"packed attention ({engine.attention}) differs from the {reference} reference by {err:.3g}"
        )
    return err


class VLLMEngine:
    """Times batches through vLLM with its automatic prefix cache (optional; see module docs)."""

    name = "vllm"

    def __init__(
        self, arch: Arch | None, model_path: str | None, dtype: str, max_tokens: int, max_len: int, seed: int
    ) -> None:
        try:
            from vllm import LLM, SamplingParams
        except ImportError:
            raise WispsimError(
                "--engine vllm needs vLLM on a CUDA machine (wispsim's vllm extra: pip install vllm); "
                "or use --engine hf"
            ) from None
        self._tmp = None
        if arch is not None:
            self._tmp = tempfile.TemporaryDirectory(prefix="wispsim-arch-")
            arch.hf_config().save_pretrained(self._tmp.name)
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

    def _generate(self, seqs: list[list[int]]) -> None:
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=s) for s in seqs]
        self.llm.generate(prompts, self.params, use_tqdm=False)

    def time(self, batch: Batch) -> tuple[float, float]:
        t0 = time.perf_counter()
        pre = [p for p in batch.prefixes if p]
        if pre:
            self._generate(pre)
        t1 = time.perf_counter()
        self._generate([p + n for p, n in zip(batch.prefixes, batch.news, strict=True)])
        t2 = time.perf_counter()
        return t1 - t0, t2 - t1

    def is_oom(self, e: BaseException) -> bool:
        return "out of memory" in str(e).lower()

    def recover(self) -> None:
        pass

    def facts(self) -> dict[str, Any]:
        return model_facts(self.hf_config, _arch_params_from_config(self.hf_config))


def model_facts(cfg: Any, parameters: int) -> dict[str, Any]:
    """The memory-model facts of a transformers config (what a measured profile records)."""
    heads = int(cfg.num_attention_heads)
    return {
        "model_type": str(cfg.model_type),
        "parameters": parameters,
        "layers": int(cfg.num_hidden_layers),
        "attention_heads": heads,
        "kv_heads": int(getattr(cfg, "num_key_value_heads", heads)),
        "head_dim": int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads),
        "hidden_size": int(cfg.hidden_size),
        "intermediate_size": int(cfg.intermediate_size),
        "vocab_size": int(cfg.vocab_size),
    }


def _arch_params_from_config(cfg: Any) -> int:
    from wispsim.measure.profile.archs import arch_from_dict

    return arch_from_dict(cfg.to_dict(), "vllm model config").parameters


# ---------------------------------------------------------------------------------------------
# measuring
# ---------------------------------------------------------------------------------------------


def measure(
    engine: Any, config: Configuration, warmup: int, runs: int, max_cv: float, retries: int
) -> dict[str, Any]:
    """Timing columns of one configuration (warm-up, timed runs, CV, retries)."""
    best: tuple[float, list[float], float] | None = None
    attempts = 0
    for attempt in range(retries + 1):
        attempts += 1
        times, build = [], 0.0
        for r in range(warmup if attempt == 0 else 0):
            engine.time(make_batch(config, r, attempt, engine.vocab))
        for r in range(runs):
            b, t = engine.time(make_batch(config, warmup + r, attempt, engine.vocab))
            times.append(t)
            build = max(build, b)
        arr = np.array(times)
        cv = float(arr.std(ddof=1) / arr.mean()) if len(arr) > 1 else 0.0
        if best is None or cv < best[0]:
            best = (cv, times, build)
        if cv <= max_cv:
            break
    assert best is not None
    cv, times, build = best
    arr = np.array(times)
    return {
        "status": "ok",
        "latency_s": float(arr.mean()),
        "latency_std_s": float(arr.std(ddof=1)) if len(arr) > 1 else 0.0,
        "latency_min_s": float(arr.min()),
        "latency_max_s": float(arr.max()),
        "cv": cv,
        "cv_ok": cv <= max_cv,
        "runs_s": ";".join(f"{t:.6g}" for t in times),
        "warmup": warmup,
        "attempts": attempts,
        "prefix_build_s": build,
    }


def host_facts(device: str) -> dict[str, Any]:
    """What ran the measurement: CPU model and memory, or the GPU's name and memory."""
    info: dict[str, Any] = {"platform": platform.platform(), "cpu_count": os.cpu_count()}
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), cpu)
    except OSError:
        pass
    info["cpu"] = cpu or "unknown CPU"
    try:
        info["memory_gib"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    except (ValueError, OSError, AttributeError):
        info["memory_gib"] = None
    if device.startswith("cuda"):
        import torch

        props = torch.cuda.get_device_properties(torch.device(device))
        info |= {"gpu": props.name, "gpu_memory_gib": props.total_memory / 1024**3}
    else:
        import torch

        info["torch_threads"] = torch.get_num_threads()
    return info


def _versions() -> dict[str, str]:
    return module_versions(("torch", "transformers", "vllm", "numpy"), loaded_only=("vllm",))


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


IDENTITY = ("engine", "model", "device", "dtype", "attention")


def record_profile(
    plan_path: Path,
    out: Path,
    *,
    engine: str = "hf",
    model_path: str | None = None,
    arch_name: str | None = None,
    random_weights: bool = False,
    device: str = "cpu",
    dtype: str = "bfloat16",
    warmup: int = 10,
    runs: int = 3,
    max_cv: float = 0.05,
    retries: int = 1,
    attention: str = "loop",
    threads: int | None = None,
    limit: int | None = None,
    seed: int = 0,
    command: str = "",
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Time every configuration of the plan not yet in ``out``; returns the rows now in ``out``."""
    if engine not in ENGINES:
        raise WispsimError(f"--engine: got {engine!r}; allowed: {', '.join(ENGINES)}")
    if dtype not in DTYPES:
        raise WispsimError(f"--dtype: got {dtype!r}; allowed: {', '.join(DTYPES)}")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise WispsimError(f"--device: got {device!r}; allowed: cpu, cuda")
    if (model_path is None) == (arch_name is None):
        raise WispsimError("give exactly one of --model PATH or --arch NAME (with --random-weights)")
    if arch_name is not None and not random_weights:
        raise WispsimError("--arch builds a model with random weights: add --random-weights to say so")
    if warmup < 0 or runs < 2:
        raise WispsimError(f"--warmup must be >= 0 and --runs >= 2 (for a CV), got {warmup} and {runs}")
    if max_cv <= 0 or retries < 0:
        raise WispsimError("--max-cv must be > 0 and --retries >= 0")
    configs = read_plan(plan_path)
    arch = load_arch(arch_name) if arch_name else None
    model_label = f"{arch.name} (random weights)" if arch else str(model_path)
    identity = {
        "engine": engine,
        "model": model_label,
        "device": device,
        "dtype": dtype,
        "attention": attention if engine == "hf" else "vllm",
    }
    meta_path = Path(str(out) + ".meta.json")
    done: set[str] = set()
    if out.is_file():
        done = set(pd.read_csv(out, usecols=["config_id"], dtype=str).config_id)
        if meta_path.is_file():
            old = json.loads(meta_path.read_text())
            for k in IDENTITY:
                if old.get(k) != identity[k]:
                    raise WispsimError(
                        f"{out}: was recorded with {k} {old.get(k)!r}, not {identity[k]!r}; use another --out"
                    )
    todo = [c for c in configs if c.config_id not in done][: limit or None]
    if not todo:
        if progress:
            progress(len(configs), len(configs))
        return len(done)
    max_tokens = max(c.aggregates[0] + c.aggregates[2] for c in todo)
    max_len = max(n + c for cfg in todo for n, c in cfg.requests)
    if engine == "hf":
        torch = _require_torch()
        if threads:
            torch.set_num_threads(threads)
        eng: Any = HFEngine(build_hf_model(arch, model_path, device, dtype, seed), device, attention)
    else:
        eng = VLLMEngine(arch, model_path, dtype, max_tokens, max_len + 1, seed)
    facts = eng.facts()
    facts |= {
        "name": arch.hf_name if arch else Path(str(model_path)).name,
        "arch": arch.name if arch else None,
        "dtype": dtype,
        "kv_dtype_bytes": dtype_bytes(dtype),
        "weight_bytes": facts["parameters"] * dtype_bytes(dtype),
        "random_weights": bool(arch),
    }
    meta = {
        **identity,
        "recorder_version": RECORDER_VERSION,
        "command": command or " ".join(sys.argv),
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "plan": str(plan_path),
        "plan_sha256": file_sha256(plan_path),
        "plan_meta": _read_json(Path(str(plan_path) + ".meta.json")),
        "warmup": warmup,
        "runs": runs,
        "max_cv": max_cv,
        "retries": retries,
        "model_facts": facts,
        "host": host_facts(device),
        "versions": _versions(),
    }
    if meta_path.is_file():  # keep the first session's command and date; note the resume
        old = json.loads(meta_path.read_text())
        resumes = old.get("resumed", [])
        meta = {**old, "resumed": [*resumes, {"command": meta["command"], "date": meta["date"]}]}
    out.parent.mkdir(parents=True, exist_ok=True)
    meta_path.write_text(json.dumps(meta, indent=1, default=str))
    new_file = not out.is_file()
    finished, total = len(done), len(done) + len(todo)
    if progress:
        progress(finished, total)
    with out.open("a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=DATA_COLUMNS)
        if new_file:
            writer.writeheader()
        for cfg in todo:
            try:
                timing = measure(eng, cfg, warmup, runs, max_cv, retries)
            except Exception as e:  # an OOM is a result (the batch does not fit), not a crash
                if not eng.is_oom(e):
                    raise
                eng.recover()
                timing = {"status": "oom", "latency_s": float("nan")}
            row = {
                **cfg.row(),
                **timing,
                "engine": engine,
                "model": model_label,
                "device": device,
                "dtype": dtype,
                "recorded_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            }
            row["l_new"], row["l_cached"] = join_ints(cfg.l_new), join_ints(cfg.l_cached)
            writer.writerow(row)
            fh.flush()
            finished += 1
            if progress:
                progress(finished, total)
    return len(done) + len(todo)
