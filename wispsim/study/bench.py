"""A ``vllm bench serve`` client against the simulated centralized server.

Public measurements of real GPU deployments (``experiments/data/public``) are benchmark runs:
``vllm bench serve`` sends ``num_prompts`` requests to ``vllm serve`` at a Poisson ``request_rate``
(inf: all at once), keeping at most ``concurrency`` in flight (a request's clock starts when it
is sent), and reports per request TTFT, TPOT = (E2E - TTFT) / (output - 1) and the
gaps between streamed tokens (ITL), and the run's output throughput (output tokens / duration).

:func:`bench` runs exactly that against the simulator's centralized server
(:class:`~wispsim.sim.centralized.CentralizedServer`: vLLM-style continuous batching with chunked
prefill, paged KV with recompute preemption, async scheduling when the run had it), priced by a
profile's estimator, with the run's server settings (``max_num_seqs``, ``max_num_batched_tokens``,
the KV capacity its engine reported) and its prompts' prefix-cache hits, and measures the same
figures the same way (:mod:`wispsim.analysis.token_latency`). There is no network: the benchmark
client runs beside the server, and the API server's latency is the profile's ``frontend``. Where
the profile was calibrated with the host-CPU model (:mod:`wispsim.model.host_cpu`), the engine
core's CPU prices every step beside its GPU work and one API-server process tokenizes every
prompt before the engine sees it.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import simpy

from wispsim.analysis.token_latency import token_latency
from wispsim.config import deep_merge
from wispsim.config.schema import POLICIES
from wispsim.config.server import engine_generation
from wispsim.model.attention import with_attention_backend
from wispsim.model.memory import kv_capacity
from wispsim.model.profiles import Profile
from wispsim.sim.context import RunContext
from wispsim.sim.engine_checks import check_engine_generation
from wispsim.sim.scenarios import Resolved, load_scenario, upgrade
from wispsim.sim.servers import build_servers, server_info
from wispsim.sim.serving import serving_of


@dataclass(frozen=True, slots=True)
class BenchRun:
    """One benchmark run as it ran: the workload and the server settings."""

    num_prompts: int
    input_lens: Sequence[int]  # one per prompt (cycled if shorter)
    output_lens: Sequence[int]
    concurrency: int | None = None  # max requests in flight (None: no limit)
    request_rate: float | None = None  # Poisson arrivals per second (None or inf: all at once)
    burstiness: float = 1.0  # vllm bench serve's --burstiness: gamma-distributed gaps of this shape
    # --ramp-up-strategy (linear | exponential) from a start to an end rate (requests/s)
    ramp_up: tuple[str, float, float] | None = None
    arrival_times: Sequence[float] | None = None  # seconds from the start, one per prompt (replayed)
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    kv_tokens: int | None = None  # the engine's KV capacity (tokens); None: from the profile
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    # prompts repeat (inference-perf's shared_prefix data): ``prompt_groups`` x ``prompts_per_group``
    # fixed prompts, cycled; a group's prompts open with the same ``shared_prefix_tokens``. 0: every
    # prompt is new. With prefix caching on, a repeated prompt or a seen prefix is read from cache.
    prefix_caching: bool = False
    prompt_groups: int = 0
    prompts_per_group: int = 0
    shared_prefix_tokens: int = 0
    # the order the repeated prompts are sent in (indices into them; None: in order), as a shuffled
    # prefix_repetition dataset sends them
    prompt_order: Sequence[int] | None = None
    # vLLM's --async-scheduling (the next step formed during this one); None: on for V1, off for V0
    async_scheduling: bool | None = False
    # vLLM V0's scheduling (server.engine): --enable-chunked-prefill (None: the generation's
    # default), --num-scheduler-steps, and the generation (None: V1 unless multi-step asks for V0)
    enable_chunked_prefill: bool | None = None
    num_scheduler_steps: int = 1
    multi_step_stream_outputs: bool = True  # vLLM's --multi-step-stream-outputs
    use_v1: bool | None = None
    # server-side speculative decoding (wispsim.model.speculation): none | draft | eagle | ngram,
    # the draft's architecture (None: the method's default), k, and the mean acceptance length
    spec_method: str = "none"
    draft_arch: str | None = None
    num_spec_tokens: int = 3
    acceptance_length: float | None = None
    draft_overheads: dict[str, float] | None = None  # None: wispsim/data/speculation.yaml's
    seed: int = 0
    noise: bool = False
    # further scenario fields (a nested mapping, as ``--set`` gives them), over the ones above: every
    # server setting a run honours, a benchmark honours too
    overrides: Mapping[str, Any] | None = None


TTFT_PARTS = ("frontend", "step_wait", "queue", "prefill")


@dataclass(frozen=True, slots=True)
class BenchResult:
    responses: pd.DataFrame  # t_start, t_first, t_end, output_len, rounds (one chunk per token), ...
    duration: float  # from the first request sent to the last token (the benchmark's duration)
    steps: int
    preemptions: int
    mean_batch: float
    # per response (in the rows' order): when each of its chunks left the engine (seconds), and
    # when the client meant to send it (before waiting for a --max-concurrency slot)
    chunk_times: tuple[np.ndarray, ...] = ()
    sent: np.ndarray | None = None
    # the engine's generation as it ran (its flags and --set resolved): async_scheduling,
    # enable_chunked_prefill, use_v1, num_scheduler_steps, multi_step_stream_outputs
    engine: dict[str, Any] = field(default_factory=dict)

    def itls(self) -> list[np.ndarray]:
        """Every gap between a response's consecutive chunks (seconds), per response: vLLM's
        ITL, whose P99 shows the decode steps a prefill chunk stalled."""
        return [np.diff(t) for t in self.chunk_times]

    def figures(self) -> dict[str, float]:
        """The figures ``vllm bench serve`` reports (ms, tok/s): the latencies of every request
        (:func:`~wispsim.analysis.token_latency.token_latency`), and its throughputs over the
        whole benchmark."""
        lat = token_latency(self.responses, (0.0, self.duration))
        lat.pop("output_throughput_tps")  # the benchmark's: all output over its duration
        gaps = np.concatenate(self.itls()) if self.chunk_times else np.zeros(0)
        if len(gaps):  # every gap, not each response's mean gap (the mean is the same)
            lat |= {
                "itl_mean_ms": float(gaps.mean() * 1e3),
                "itl_median_ms": float(np.median(gaps) * 1e3),
                "itl_p99_ms": float(np.percentile(gaps, 99) * 1e3),
            }
        return {
            **lat,
            "output_throughput_tok_s": float(self.responses.output_len.sum() / self.duration),
            "request_throughput": float(len(self.responses) / self.duration),
            "duration_s": self.duration,
            "preemptions": float(self.preemptions),
            "mean_batch": self.mean_batch,
            **self.ttft_parts(),
        }

    def ttft_parts(self) -> dict[str, float]:
        """Mean TTFT by its parts (ms): the API server, the wait for the next step the request
        can join (under async scheduling the one after next), queueing for admission or the
        step's token budget, and its prefill chunks. They add up to the mean TTFT."""
        r = self.responses
        return {f"ttft_{p}_mean_ms": float(r[f"{p}_s"].mean() * 1e3) for p in TTFT_PARTS}


def send_times(run: BenchRun, n: int, rng: np.random.Generator) -> np.ndarray:
    """When each prompt is sent: the replayed times; or ``vllm bench serve``'s ramp-up; or its schedule at
    ``request_rate`` (gaps drawn from a gamma distribution of shape ``burstiness``, exponential at
    1, rescaled so that the last is sent at n / rate as vLLM does); or all at once."""
    if run.arrival_times is not None:
        t = np.asarray(run.arrival_times[:n], dtype=float)
        return t - t.min() if len(t) else t
    if run.ramp_up is not None:  # request i at the rate reached by then, no rescaling (as vLLM)
        strategy, lo, hi = run.ramp_up
        progress = np.arange(n) / max(n - 1, 1)
        rates = lo + (hi - lo) * progress if strategy == "linear" else lo * (hi / lo) ** progress
        gaps = rng.gamma(shape=run.burstiness, scale=1.0 / (rates * run.burstiness))
        return np.concatenate([[0.0], np.cumsum(gaps[:-1])])
    rate = run.request_rate
    if rate is None or not np.isfinite(rate):
        return np.zeros(n)
    if run.burstiness == 1.0:  # the same draws as before burstiness was an option
        gaps = rng.exponential(1.0 / rate, size=n)
        return np.concatenate([[0.0], np.cumsum(gaps[:-1])])
    gaps = rng.gamma(shape=run.burstiness, scale=1.0 / (rate * run.burstiness), size=n)
    t = np.cumsum(gaps)
    t *= (n / rate) / t[-1]
    return np.concatenate([[0.0], t[:-1]])


def bench_scenario(profile: Profile, run: BenchRun) -> Resolved:
    """The server a benchmark run ran against, as a scenario (``vllm serve``'s settings as the
    server's fields: ``max_num_seqs``, ``max_num_batched_tokens``, prefix caching, async
    scheduling, the KV capacity its engine reported), resolved with ``profile``: the one server
    factory builds it, as it builds every run's."""
    bs = run.block_size
    speculation = {
        "method": run.spec_method,
        "k": run.num_spec_tokens,
        "acceptance_length": run.acceptance_length,
    }
    if run.draft_arch is not None:
        speculation["draft"] = run.draft_arch
    if run.draft_overheads is not None:
        speculation |= {k: float(v) for k, v in run.draft_overheads.items()}
    preset = POLICIES["centralized" if run.spec_method == "none" else "centralized-sd"]
    overrides = {
        # the centralized preset, but with prefix caching as the run had it (--no-enable-prefix-caching)
        "policy": "custom",
        "seed": run.seed,
        "drafting": {"controller": preset["controller"]},
        # the client's prompts come from the run: nothing is drawn from an acceptance trace
        "acceptance": {"model": "bernoulli"},
        "server": {
            "mode": preset["mode"],
            "scheduler": preset["scheduler"],
            "profile": profile.name,
            "noise": run.noise,
            "engine": {
                "max_num_seqs": run.max_num_seqs,
                "max_num_batched_tokens": run.max_num_batched_tokens,
                "enable_prefix_caching": run.prefix_caching,
                "async_scheduling": run.async_scheduling,
                "enable_chunked_prefill": run.enable_chunked_prefill,
                "num_scheduler_steps": run.num_scheduler_steps,
                "multi_step_stream_outputs": run.multi_step_stream_outputs,
                "use_v1": run.use_v1,
                "gpu_memory_utilization": run.gpu_memory_utilization,
                "block_size": bs,
                "kv_capacity_tokens": None if run.kv_tokens is None else max(run.kv_tokens // bs, 1) * bs,
            },
            "verifier": {"kv_policy": preset["kv"]},
            # the API server in front of the engine, as the profile was calibrated with it
            "host": {"frontend": True},
            "speculation": speculation,
        },
    }
    if run.overrides:
        overrides = deep_merge(overrides, upgrade(run.overrides, "--set"))
    engine = overrides["server"]["engine"]
    if engine.get("async_scheduling") is None:  # vLLM's default: V1 schedules asynchronously
        v0, _ = engine_generation(engine.get("use_v1"), None, engine.get("num_scheduler_steps"))
        engine["async_scheduling"] = not v0
    sc = load_scenario(overrides=overrides, source="wispsim bench", consistency=False)
    check_engine_generation(sc, "wispsim bench", lengths=False)  # the lengths: at each request
    eng = sc.server.engine
    # the engine's logged capacity, else what its memory leaves after the weights (a draft model's
    # too) and vLLM's start-up profile at the run's max_num_seqs / max_num_batched_tokens
    cap = kv_capacity(sc.server, profile)
    size = eng.block_size or bs
    profile = with_attention_backend(profile, eng.attention_backend, "wispsim bench")
    return Resolved(sc, (profile,), (max(cap // size, 1) * size,), (size,))


class _BenchClients:
    """``vllm bench serve``'s client (a :class:`wispsim.sim.simulation.DeviceSide`): request i is
    sent at its time, waits for one of ``concurrency`` slots, then is served by the run's serving
    component with no network between (the client runs beside the server)."""

    def __init__(self, run: BenchRun, rng: np.random.Generator) -> None:
        n = run.num_prompts
        distinct = run.prompt_groups * run.prompts_per_group
        self.run = run
        self.prompt_of = [i % distinct if distinct else i for i in range(n)]
        if run.prompt_order is not None and distinct:
            order = run.prompt_order
            self.prompt_of = [int(order[p % len(order)]) for p in self.prompt_of]
        self.ins = [int(run.input_lens[p % len(run.input_lens)]) for p in self.prompt_of]
        self.outs = [int(run.output_lens[p % len(run.output_lens)]) for p in self.prompt_of]
        self.sends = send_times(run, n, rng)
        self.accept_rng = np.random.default_rng([run.seed, 1])  # centralized-sd: drafts accepted

    def launch(self, ctx: RunContext, devices: int) -> None:
        env = ctx.env
        n = self.run.num_prompts
        slots = simpy.Resource(env, capacity=min(self.run.concurrency or n, n))

        def client(i: int) -> Generator[Any, Any, None]:
            with slots.request() as slot:  # vllm bench serve's --max-concurrency semaphore
                yield slot
                t0 = env.now  # its clock starts when the request is sent
                prompt, output = self.ins[i], self.outs[i]
                resp = ctx.recorder.open_response(t0, i, 1.0, prompt, output)
                source = _BenchSource(self, ctx, self.prompt_of[i])
                out = yield from ctx.serving.respond(
                    ctx, source, resp, prompt, output, t0, 0.0, 0.0, math.nan
                )
                ctx.recorder.finish_response(
                    resp, i, 1.0, t0, out.t_end, out.t_first, prompt, output, out.rounds, 1
                )

        def arrivals() -> Generator[Any, Any, None]:
            for i in range(n):
                at = float(self.sends[i])  # the clock runs on Python floats, not NumPy's
                if at > env.now:
                    yield env.timeout(at - env.now)
                env.process(client(i))

        env.process(arrivals())
        ctx.devices_started = n


class _BenchSource:
    """A benchmark request as the source of its times (a
    :class:`~wispsim.sim.generation.GenerationSource`): none on a network; its prompt's identity
    for the prefix cache (prompt ``prompt`` of the run's repeated prompts, in its group)."""

    __slots__ = ("clients", "ctx", "prompt")

    def __init__(self, clients: _BenchClients, ctx: RunContext, prompt: int) -> None:
        self.clients = clients
        self.ctx = ctx
        self.prompt = prompt

    def prompt_uplink(self, prompt: int) -> float:
        return 0.0

    def tokens_downlink(self) -> float:
        return 0.0

    def server_runs(self, output: int) -> list[int]:
        spec = self.ctx.speculation
        assert spec is not None
        return spec.runs(_NOTHING, output, self.clients.accept_rng)

    def prompt_key(self) -> tuple[int | None, int | None, int]:
        run = self.clients.run
        group = self.prompt // run.prompts_per_group if run.prompts_per_group else None
        return self.prompt, group, run.shared_prefix_tokens


_NOTHING = np.zeros(0, dtype=int)  # no acceptance trace: a benchmark's drafts are drawn


def bench(profile: Profile, run: BenchRun) -> BenchResult:
    """Simulate one benchmark run (module docstring) and measure it."""
    resolved = bench_scenario(profile, run)
    env = simpy.Environment()
    ctx = RunContext(env, resolved.scenario, run.seed, profile)
    ctx.recorder.window = (0.0, math.inf)  # every request is measured
    ctx.serving = serving_of(resolved.scenario)
    chunk_times: dict[int, list[float]] = {}
    ctx.recorder.chunk_times = chunk_times  # every chunk's time: vLLM's ITL
    ctx.server = build_servers(ctx, resolved)  # the one server factory
    clients = _BenchClients(run, np.random.default_rng(run.seed))
    clients.launch(ctx, run.num_prompts)
    env.run()
    _, batches, r = ctx.recorder.close()
    responses = pd.DataFrame(
        {
            "t_start": r.t_start,
            "t_first": r.t_first,
            "t_end": r.t_end,
            "output_len": r.output_len,
            "prompt_len": r.prompt_len,
            "rounds": r.rounds,  # streamed chunks: one per token, or per step under speculation
            "measured": True,
            "censored": False,
            "frontend_s": r.t_engine - r.t_start,
            "step_wait_s": r.t_eligible - r.t_engine,  # to the first step it could join (async: one more)
            "queue_s": r.t_scheduled - r.t_eligible,  # waiting for admission or the step's token budget
            "prefill_s": r.t_first
            - r.t_scheduled,  # its prefill chunks, to the end of the step that ends them
        }
    )
    duration = float(r.t_end.max()) if len(r) else 0.0
    mean_batch = float(batches["size"].mean()) if len(batches) else 0.0
    rids = r.response.to_numpy()
    chunks = tuple(np.asarray(chunk_times.get(int(i), ()), dtype=float) for i in rids)
    sent = clients.sends[r.device.to_numpy()]
    eng = resolved.scenario.server.engine
    ran = {"async_scheduling": eng.async_scheduling, "enable_chunked_prefill": eng.chunked_prefill,
           "use_v1": not eng.v0, "num_scheduler_steps": eng.num_scheduler_steps,
           "multi_step_stream_outputs": eng.multi_step_stream_outputs,
           "attention_backend": eng.attention_backend}  # fmt: skip
    return BenchResult(
        responses, duration, len(batches), server_info(ctx)["preemptions"], mean_batch, chunks, sent, ran
    )


def vllm_defaults(
    memory_gib: float,
    gpu_name: str,
    v0: bool = False,
    whole_prompts: bool = False,
    max_model_len: int | None = None,
) -> tuple[int, int]:
    """vLLM's defaults of (max_num_batched_tokens, max_num_seqs): V1's API server by the GPU's
    memory (vllm/engine/arg_utils.py ``get_batch_defaults``, vLLM 0.32), V0's 2,048 tokens and 256
    sequences (``v0``); where a step takes prompts whole (no chunked prefill, or V0's multi-step,
    which does not chunk them) max(max_model_len, 2048) tokens where the length is known
    (vLLM's ``SchedulerConfig``)."""
    tokens, seqs = _v1_defaults(memory_gib, gpu_name) if not v0 else (2048, 256)
    if whole_prompts and max_model_len is not None:
        tokens = max(max_model_len, 2048)
    return tokens, seqs


def _v1_defaults(memory_gib: float, gpu_name: str) -> tuple[int, int]:
    if memory_gib >= 160:
        return 16384, 1024
    if memory_gib >= 70 and "a100" not in gpu_name.lower():
        return 8192, 1024
    return 2048, 256
