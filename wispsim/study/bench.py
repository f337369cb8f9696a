"""A ``vllm bench serve`` client against the simulated centralized server.

Public measurements of real GPU deployments (``experiments/data/public``) are benchmark runs:
``vllm bench serve`` sends ``num_prompts`` requests to ``vllm serve`` at a Poisson ``request_rate``
(inf: all at once), keeping at most ``concurrency`` in flight (a request's clock starts when it
is sent), and reports per request TTFT, TPOT = (E2E - TTFT) / (output - 1) and the
gaps between streamed tokens (ITL), and the run's output throughput (output tokens / duration).

:func:`bench` runs exactly that against the simulator's :class:`~wispsim.sim.centralized.CentralizedServer`
(vLLM-style continuous batching with chunked prefill, paged KV with recompute preemption), priced
by a profile's estimator, with the run's server settings (``max_num_seqs``, ``max_num_batched_tokens``,
the KV capacity its engine reported), and measures the same figures the same way. There is no
network: the benchmark client runs beside the server. The simulator has no per-token times, so
ITL is pooled from each request's mean gap (identical to TPOT's mean for one token per step).
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass
from itertools import count
from typing import Any

import numpy as np
import simpy

from wispsim.config import ServerConfig
from wispsim.model.latency import LinearLatency
from wispsim.model.profiles import Profile
from wispsim.sim.centralized import CentralizedServer


@dataclass(frozen=True, slots=True)
class BenchRun:
    """One benchmark run as it ran: the workload and the server settings."""

    num_prompts: int
    input_lens: Sequence[int]  # one per prompt (cycled if shorter)
    output_lens: Sequence[int]
    concurrency: int | None = None  # max requests in flight (None: no limit)
    request_rate: float | None = None  # Poisson arrivals per second (None or inf: all at once)
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    kv_tokens: int | None = None  # the engine's KV capacity (tokens); None: from the profile
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    async_scheduling: bool = False  # vLLM's --async-scheduling (the next step formed during this one)
    seed: int = 0
    noise: bool = False


@dataclass(frozen=True, slots=True)
class BenchResult:
    ttft: np.ndarray  # seconds, per request
    e2e: np.ndarray
    output_lens: np.ndarray
    duration: float
    steps: int
    preemptions: int
    mean_batch: float

    def figures(self) -> dict[str, float]:
        """The figures ``vllm bench serve`` reports (ms, tok/s)."""
        ms = 1e3
        multi = self.output_lens > 1
        tpot = (self.e2e[multi] - self.ttft[multi]) / (self.output_lens[multi] - 1)
        return {
            "ttft_mean_ms": float(np.mean(self.ttft) * ms),
            "ttft_median_ms": float(np.median(self.ttft) * ms),
            "ttft_p99_ms": float(np.percentile(self.ttft, 99) * ms),
            "tpot_mean_ms": float(np.mean(tpot) * ms),
            "tpot_median_ms": float(np.median(tpot) * ms),
            "tpot_p99_ms": float(np.percentile(tpot, 99) * ms),
            # one token per step: the gaps' mean, weighted by tokens (the simulator keeps no per-token times)
            "itl_mean_ms": float(np.sum(self.e2e - self.ttft) / max(np.sum(self.output_lens - 1), 1) * ms),
            "e2e_mean_ms": float(np.mean(self.e2e) * ms),
            "e2e_median_ms": float(np.median(self.e2e) * ms),
            "e2e_p99_ms": float(np.percentile(self.e2e, 99) * ms),
            "output_throughput_tok_s": float(np.sum(self.output_lens) / self.duration),
            "request_throughput": float(len(self.e2e) / self.duration),
            "duration_s": self.duration,
            "preemptions": float(self.preemptions),
            "mean_batch": self.mean_batch,
        }


def bench(profile: Profile, run: BenchRun) -> BenchResult:
    """Simulate one benchmark run (module docstring) and measure it."""
    env = simpy.Environment()
    rng = np.random.default_rng(run.seed)
    cfg = ServerConfig(profile=profile.name, noise=run.noise)
    latency = LinearLatency(profile, cfg, rng)
    kv = (
        run.kv_tokens
        if run.kv_tokens is not None
        else profile.kv_capacity_tokens(run.gpu_memory_utilization, 0.0)
    )
    batches: list[Any] = []
    server = CentralizedServer(
        env,
        total_blocks=max(kv // run.block_size, 1),
        block_size=run.block_size,
        max_running=run.max_num_seqs,
        step_tokens=run.max_num_batched_tokens,
        latency=latency,
        batches=batches,
        batch_ids=count(),
        async_scheduling=run.async_scheduling,
    )
    n = run.num_prompts
    ins = [int(run.input_lens[i % len(run.input_lens)]) for i in range(n)]
    outs = [int(run.output_lens[i % len(run.output_lens)]) for i in range(n)]
    ttft = np.zeros(n)
    e2e = np.zeros(n)
    start = np.zeros(n)

    frontend = float(getattr(profile.estimator, "frontend", 0.0))  # API-server latency (not GPU time)

    def request(i: int) -> Generator[Any, Any, None]:
        start[i] = env.now
        if frontend > 0:
            yield env.timeout(frontend)
        done = env.event()
        server.submit(i, ins[i], outs[i], done)
        first = yield done
        ttft[i] = first - start[i]
        e2e[i] = env.now - start[i]

    rate = run.request_rate if run.request_rate is not None and np.isfinite(run.request_rate) else None
    slots = simpy.Resource(env, capacity=min(run.concurrency or n, n))

    def client(i: int) -> Generator[Any, Any, None]:
        with slots.request() as slot:  # vllm bench serve's --max-concurrency semaphore
            yield slot
            yield from request(i)  # its clock starts when the request is sent

    def arrivals() -> Generator[Any, Any, None]:
        for i in range(n):
            env.process(client(i))
            if rate is not None:  # Poisson arrivals; none: every prompt at once
                yield env.timeout(float(rng.exponential(1.0 / rate)))

    env.process(arrivals())
    env.run()
    steps = len(batches)
    mean_batch = float(np.mean([b.size for b in batches])) if batches else 0.0
    return BenchResult(ttft, e2e, np.asarray(outs), float(env.now), steps, server.preemptions, mean_batch)
