"""Record per-position acceptance traces from two real causal LMs (SPEC 1 and 5).

For each prompt the *target* generates a response (with its KV cache, greedy at temperature 0,
sampled otherwise). Then one teacher-forced forward pass of each model over prompt + response
gives the target's p and the draft's q at every response position. Per position the trace keeps:

- ``top1_prob``, ``entropy`` (nats), ``margin`` (top-1 minus top-2 probability), ``logit_std``
  (standard deviation of the draft's logits over the vocabulary), ``top2_prob`` and
  ``committed_q`` (the draft's probability of the token the target committed) -- features of the
  draft distribution q at temperature 1, what a device can compute after its forward pass;
- ``beta``: the probability that the draft's token is accepted. At temperature T > 0 it is
  sum_v min(p_T(v), q_T(v)) = 1 - TV(p_T, q_T) with p_T, q_T the temperature-T distributions; at
  T = 0 (greedy verification) it is 1 if the argmaxes agree, else 0;
- ``greedy_agree``: argmax p == argmax q;
- ``accept``: a realized verdict: at T = 0 the greedy verdict; at T > 0 a token y drawn from q_T
  with a seeded generator is accepted iff u < min(1, p_T(y) / q_T(y)) for a seeded uniform u;
- ``target_top1_prob``: the target's top-1 probability (temperature 1);
- ``context_length``: tokens before the position (prompt + response so far).

Needs the ``record`` extra (torch, transformers; ``gguf`` and ``accelerate`` to read GGUF files).
Recording is resumable: each finished sample is kept in ``OUT.parts/`` and the trace file is
rewritten after every sample, so an interrupted recording keeps what it finished.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from wispsim.engines import require_torch
from wispsim.engines.hf import checkpoint_source, load_causal_lm
from wispsim.errors import WispsimError
from wispsim.provenance import file_sha256, module_versions

RECORDER_VERSION = "1"
META_PREFIX = "wispsim.trace."


@dataclass(frozen=True)
class Prompt:
    id: str
    family: str
    text: str


def read_prompts(path: Path) -> list[Prompt]:
    """JSON lines with ``id``, ``family`` and ``prompt``; or plain text, one prompt per line."""
    if not path.is_file():
        raise WispsimError(f"{path}: prompts file not found")
    out = []
    for i, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            try:
                row = json.loads(line)
                out.append(Prompt(str(row["id"]), str(row.get("family", path.stem)), str(row["prompt"])))
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise WispsimError(f"{path}: line {i + 1}: expected JSON with id and prompt ({e})") from None
        else:
            out.append(Prompt(f"{path.stem}-{i}", path.stem, line))
    if not out:
        raise WispsimError(f"{path}: no prompts")
    return out


HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # org/name, as a model hub names a model


def resolve_model(path: str, download: Callable[..., Any] | None = None) -> str:
    """A local folder or ``.gguf`` file as given, or a model hub id (``Qwen/Qwen2.5-Coder-0.5B-Instruct``)
    fetched into the hub's cache (when the hub is reachable) and returned as that local folder,
    so the recording hashes and records the files it read. Otherwise a one-line error: the
    offline fallback is ``scripts/fetch_models.py`` (README). ``download`` fetches a hub id into a
    local folder (``huggingface_hub.snapshot_download`` unless given: tests pass their own)."""
    if Path(path).exists():
        return path
    if not HUB_ID.match(path):
        raise WispsimError(f"{path}: model not found (a local folder, a .gguf file, or a hub id org/name)")
    try:
        if download is None:
            from huggingface_hub import snapshot_download as download

        return str(download(repo_id=path))
    except Exception as e:  # no network, no such model, no access: say which, in one line
        why = " ".join(str(e).split())[:160] or type(e).__name__
        raise WispsimError(
            f"{path}: not a local folder and the model hub could not give it ({why}); offline, "
            "see scripts/fetch_models.py (README)"
        ) from None


def load_model(path: str, device: str, dtype: str = "float32") -> tuple[Any, Any]:
    """A causal LM and its tokenizer from a folder (HF format) or a ``.gguf`` file."""
    require_torch("trace record")
    if not Path(path).exists():
        raise WispsimError(f"{path}: model not found (see scripts/fetch_models.py)")
    return load_causal_lm(path, device, dtype), load_tokenizer(path)


def load_tokenizer(path: str) -> Any:
    """The tokenizer of a model folder (HF format) or a ``.gguf`` file."""
    from transformers import AutoTokenizer

    folder, kw = checkpoint_source(path)
    tok_cfg = Path(folder) / "tokenizer_config.json"
    generic = (
        tok_cfg.is_file()
        and json.loads(tok_cfg.read_text()).get("tokenizer_class") == "PreTrainedTokenizerFast"
    )
    if generic and not kw:  # honour a plain fast tokenizer (AutoTokenizer would pick the model's class)
        from transformers import PreTrainedTokenizerFast

        tok = PreTrainedTokenizerFast.from_pretrained(folder)
    else:
        tok = AutoTokenizer.from_pretrained(folder, **kw)
    return tok


def encode_prompt(tok: Any, text: str) -> list[int]:
    """Token ids of a prompt, through the chat template when the tokenizer has one."""
    if getattr(tok, "chat_template", None):
        ids = tok.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    return [int(i) for i in tok(text)["input_ids"]]


def position_rows(
    logits_p: Any, logits_q: Any, response: Any, temperature: float, gen: Any
) -> dict[str, np.ndarray]:
    """Per-position trace columns from the two models' logits at the response positions.

    ``logits_p`` / ``logits_q``: (R, V) logits that predict response tokens 0..R-1;
    ``response``: (R,) the committed token ids; ``gen``: a seeded torch.Generator.
    """
    import torch

    v = min(logits_p.shape[-1], logits_q.shape[-1])
    lp = logits_p[:, :v].double()
    lq = logits_q[:, :v].double()
    q1 = torch.softmax(lq, -1)
    p1 = torch.softmax(lp, -1)
    top2 = torch.topk(q1, 2, dim=-1).values
    entropy = -(q1 * torch.log(q1.clamp_min(1e-300))).sum(-1)
    greedy = lp.argmax(-1) == lq.argmax(-1)
    r = response.shape[0]
    if temperature > 0:
        pt = torch.softmax(lp / temperature, -1)
        qt = torch.softmax(lq / temperature, -1)
        beta = torch.minimum(pt, qt).sum(-1)
        y = torch.multinomial(qt.float(), 1, generator=gen).squeeze(-1)
        u = torch.rand(r, generator=gen, dtype=torch.float64)
        idx = torch.arange(r)
        ratio = pt[idx, y] / qt[idx, y]
        accept = u < torch.clamp(ratio, max=1.0)
    else:
        beta = greedy.double()
        accept = greedy
    committed = response.clamp(max=v - 1)
    return {
        "top1_prob": top2[:, 0].numpy(),
        "entropy": entropy.numpy(),
        "margin": (top2[:, 0] - top2[:, 1]).numpy(),
        "logit_std": lq.std(-1).numpy(),
        "top2_prob": top2[:, 1].numpy(),
        "committed_q": q1[torch.arange(r), committed].numpy(),
        "beta": beta.clamp(0.0, 1.0).numpy(),
        "greedy_agree": greedy.numpy(),
        "accept": accept.numpy(),
        "target_top1_prob": p1.max(-1).values.numpy(),
    }


def record_sample(
    draft: Any,
    target: Any,
    prompt_ids: list[int],
    sample_seed: int,
    temperature: float,
    max_new_tokens: int,
    device: str,
    eos_ids: list[int],
    generator_model: Any = None,
) -> pd.DataFrame:
    """Generate with the target, teacher-force both models, return the sample's rows.

    ``generator_model`` (default: ``target``) generates the response; a lower-precision copy of
    the target makes CPU recording faster while p and q are still scored in full precision.
    """
    import torch

    torch.manual_seed(sample_seed)
    ids = torch.tensor([prompt_ids], device=device)
    with torch.no_grad():
        gen_kwargs: dict[str, Any] = {"max_new_tokens": max_new_tokens, "pad_token_id": eos_ids[0]}
        if temperature > 0:
            gen_kwargs |= {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        else:
            gen_kwargs |= {"do_sample": False}
        if eos_ids:
            gen_kwargs["eos_token_id"] = eos_ids
        gen_model = generator_model if generator_model is not None else target
        out = gen_model.generate(ids, attention_mask=torch.ones_like(ids), **gen_kwargs)
        full = out[:, : len(prompt_ids) + max_new_tokens]
        response = full[0, len(prompt_ids) :].cpu()
        n_prompt = len(prompt_ids)
        lp = target(full).logits[0, n_prompt - 1 : -1].float().cpu()
        lq = draft(full).logits[0, n_prompt - 1 : -1].float().cpu()
    gen = torch.Generator().manual_seed(sample_seed + 1)
    cols = position_rows(lp, lq, response, temperature, gen)
    r = len(response)
    df = pd.DataFrame(
        {
            "position": np.arange(r),
            "context_length": n_prompt + np.arange(r),
            **cols,
            "token_id": response.numpy(),
            # False where a lower-precision generator broke a near-tie differently
            "committed_is_target_top1": (lp.argmax(-1) == response).numpy(),
        }
    )
    return df


def _versions() -> dict[str, str]:
    return module_versions(("torch", "transformers", "gguf", "accelerate", "numpy"))


def write_trace(parts: Path, out: Path, meta: dict[str, str]) -> int:
    """Concatenate the finished samples into ``out`` with the provenance in its metadata."""
    files = sorted(parts.glob("sample-*.parquet"))
    if not files:
        return 0
    df = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    table = pa.Table.from_pandas(df, preserve_index=False)
    md = dict(table.schema.metadata or {})
    md.update({f"{META_PREFIX}{k}".encode(): str(v).encode() for k, v in meta.items()})
    md[f"{META_PREFIX}samples".encode()] = str(df.sample_id.nunique()).encode()
    md[f"{META_PREFIX}positions".encode()] = str(len(df)).encode()
    tmp = out.with_suffix(".parquet.tmp")
    pq.write_table(table.replace_schema_metadata(md), tmp)
    tmp.replace(out)
    return len(df)


def stop_ids(tok: Any, generation_eos: Any) -> list[int]:
    """The ids that end a response: the tokenizer's EOS and the model's generation EOS ids."""
    eos = [i for i in {tok.eos_token_id, *_as_list(generation_eos)} if i is not None]
    return sorted(int(i) for i in eos)


def _as_list(x: Any) -> list[Any]:
    return list(x) if isinstance(x, list | tuple) else [x]


def parts_folder(out: Path) -> Path:
    """``OUT.parts/``, where finished samples are kept (split back out of ``out`` if only the
    trace is there, e.g. in a checkout that has the trace but not its parts folder)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    parts = Path(str(out) + ".parts")
    if not parts.is_dir() and out.is_file():
        parts.mkdir()
        for sid, g in pd.read_parquet(out).groupby("sample_id"):
            g.to_parquet(parts / f"sample-{int(str(sid)):05d}.parquet", index=False)
    parts.mkdir(exist_ok=True)
    return parts


def write_sample(parts: Path, i: int, prompt: Prompt, df: pd.DataFrame) -> None:
    """Keep one finished sample in ``parts`` (written whole, then renamed)."""
    df.insert(0, "sample_id", i)
    df["prompt_id"] = prompt.id
    df["family"] = prompt.family
    part = parts / f"sample-{i:05d}.parquet"
    df.to_parquet(part.with_suffix(".tmp"), index=False)
    part.with_suffix(".tmp").replace(part)


def base_meta(
    draft_path: str, target_path: str, prompts_path: Path, prompts: list[Prompt], command: str, notes: str
) -> dict[str, str]:
    """The provenance every trace carries, whichever engine recorded it."""
    return {
        "recorder_version": RECORDER_VERSION,
        "draft_model": str(draft_path),
        "draft_sha256": file_sha256(Path(draft_path)),
        "target_model": str(target_path),
        "target_sha256": file_sha256(Path(target_path)),
        "prompts": str(prompts_path),
        "prompts_sha256": file_sha256(prompts_path),
        "families": ",".join(sorted({p.family for p in prompts})),
        "command": command or " ".join(sys.argv),
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "synthetic": "false",
        "notes": notes,
    }


def record_trace(
    draft_path: str,
    target_path: str,
    prompts_path: Path,
    out: Path,
    *,
    temperature: float = 0.0,
    max_new_tokens: int = 128,
    device: str = "cpu",
    seed: int = 0,
    limit: int | None = None,
    command: str = "",
    notes: str = "",
    progress: Callable[[int, int], None] | None = None,
    generate_dtype: str = "float32",
) -> int:
    """Record a trace; returns the number of positions in ``out``. Resumes from ``OUT.parts``.

    (``wispsim.measure.trace.vllm_record.record_trace_vllm`` records a greedy one with vLLM.)
    """
    if temperature < 0:
        raise WispsimError(f"--temperature: must be >= 0, got {temperature}")
    if max_new_tokens < 1:
        raise WispsimError(f"--max-new-tokens: must be >= 1, got {max_new_tokens}")
    torch = require_torch("trace record")
    prompts = read_prompts(prompts_path)[: limit or None]
    draft_path, target_path = resolve_model(draft_path), resolve_model(target_path)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    target, tok = load_model(target_path, device)
    draft, dtok = load_model(draft_path, device)
    generator = None
    if generate_dtype != "float32":
        generator, _ = load_model(target_path, device, generate_dtype)
    if dtok.get_vocab() != tok.get_vocab():
        raise WispsimError("--draft and --target must share a tokenizer (their vocabularies differ)")
    eos_ids = stop_ids(tok, getattr(target.generation_config, "eos_token_id", None))
    parts = parts_folder(out)
    meta = {
        **base_meta(draft_path, target_path, prompts_path, prompts, command, notes),
        "engine": "hf",
        "dtype": "float32 (p and q are scored in fp32)",
        "generate_dtype": generate_dtype,
        "device": device,
        "temperature": str(temperature),
        "max_new_tokens": str(max_new_tokens),
        "seed": str(seed),
        "versions": json.dumps(_versions()),
    }
    for i, pr in enumerate(prompts):
        part = parts / f"sample-{i:05d}.parquet"
        if not part.exists():
            ids = encode_prompt(tok, pr.text)
            if not ids:
                raise WispsimError(f"{prompts_path}: prompt {pr.id!r} encodes to no tokens")
            df = record_sample(
                draft,
                target,
                ids,
                seed * 100_003 + i,
                temperature,
                max_new_tokens,
                device,
                eos_ids,
                generator,
            )
            write_sample(parts, i, pr, df)
            write_trace(parts, out, meta)
        if progress:
            progress(i + 1, len(prompts))
    return write_trace(parts, out, meta)
