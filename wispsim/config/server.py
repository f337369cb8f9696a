"""The verification server's section of a scenario (SPEC 2.3 and 3): its profile, scheduler, KV
cache and policy, batch limits, and the memory arithmetic's inputs, each checked against its
bounds (:mod:`wispsim.config.limits`) in ``__post_init__``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

from wispsim.config.dist import require, require_count
from wispsim.config.limits import (
    MAX_BATCH_REQUESTS,
    MAX_BATCH_TOKENS,
    MAX_BLOCK_SIZE,
    MAX_DRAFT,
    MAX_KV_TOKENS,
    MAX_MEMORY_GIB,
    MAX_REPLICAS,
    MAX_SCHEDULER_STEPS,
    MAX_SIM_SECONDS,
)
from wispsim.errors import ConfigError

SPEC_METHODS = ("none", "draft", "eagle", "ngram")
# vLLM's latent-attention backends (--attention-backend), the only ones that change a price here
# (wispsim.model.attention)
AttentionBackend = Literal[
    "FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "CUTLASS_MLA", "TRITON_MLA", "ROCM_AITER_MLA"
]
ATTENTION_BACKENDS: tuple[str, ...] = get_args(AttentionBackend)


@dataclass(frozen=True, slots=True)
class SpeculationConfig:
    """Server-side speculative decoding of centralized serving (policy ``centralized-sd``;
    :mod:`wispsim.model.speculation`): every step drafts ``k`` tokens per running response on the
    server's own GPU and verifies them with the target in the same pass."""

    # none: plain centralized serving; draft: a small model of the target's vocabulary drafts
    # (k passes); eagle: an EAGLE-style head on the target's hidden states (k passes of one
    # layer); ngram: prompt lookup on the CPU (no GPU pass)
    method: Literal["none", "draft", "eagle", "ngram"] = "none"
    # the draft's architecture (wispsim/data/archs); null: by the target's family for ``draft``
    # (qwen3-1.7b, llama-3.2-1b; wispsim.model.speculation.DEFAULT_DRAFTS), ``<target arch>-eagle3``
    # for ``eagle``
    draft: str | None = None
    # a latency profile of the draft model (any form: a CPU or a measured one); null: price the
    # draft's passes by the roofline of ``draft`` on the target's GPUs
    draft_profile: str | None = None
    k: int = 3  # tokens drafted per step (vLLM's num_speculative_tokens)
    # mean tokens a step commits (accepted + 1, vLLM's "mean acceptance length"); null: each
    # position's acceptance from the scenario's acceptance model (the traces WISP replays)
    acceptance_length: float | None = None
    # the drafter's overheads beside its passes' physics (wispsim.model.speculation): per draft pass
    # (ms) and per draft layer (us); null: the calibration's (wispsim/data/speculation.yaml)
    draft_pass_ms: float | None = None
    draft_layer_us: float | None = None

    def __post_init__(self) -> None:
        require(1 <= self.k <= MAX_DRAFT, "k", f"must be in [1, {MAX_DRAFT}], got {self.k}")
        if self.acceptance_length is not None:
            require(
                1.0 <= self.acceptance_length <= self.k + 1,
                "acceptance_length",
                f"must be in [1, k + 1 = {self.k + 1}] tokens per step, got {self.acceptance_length:g}",
            )
        require(
            self.draft is None or self.draft_profile is None,
            "draft",
            "and draft_profile both name the draft; give one (the profile says its architecture)",
        )
        for name in ("draft_pass_ms", "draft_layer_us"):
            v = getattr(self, name)
            require(v is None or 0 <= v <= 1e4, name, f"must be in [0, 10000] or null, got {v}")


def engine_generation(
    use_v1: bool | None, enable_chunked_prefill: bool | None, num_scheduler_steps: int | None
) -> tuple[bool, bool]:
    """(V0, chunked prefill) of an engine section's settings, as :class:`EngineConfig` reads them
    (None: the default): V0 where ``use_v1`` is false, or left to the default with multi-step
    scheduling (vLLM fell back to V0 for it); chunked prefill as given, else the generation's
    default (V1 on, V0 off). Callers that hold the settings before a scenario is built (a
    benchmark's flags) ask the same function."""
    v0 = use_v1 is False or (use_v1 is None and (num_scheduler_steps or 1) > 1)
    return v0, (not v0) if enable_chunked_prefill is None else bool(enable_chunked_prefill)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """The serving engine's limits and features, by vLLM's names where vLLM has the knob
    (``vllm serve --max-num-seqs ...``): what any server built on it, verifying or generating,
    is bound by."""

    max_num_seqs: int = 256  # requests in one batch or engine step (vLLM's --max-num-seqs)
    # tokens one engine step processes (vLLM's --max-num-batched-tokens): centralized serving's
    # step budget, its prefill chunks included
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True  # automatic prefix caching (set by the policy preset)
    # --async-scheduling: the next step is formed while this one runs, so a request arriving
    # mid-step joins the step after next, and the engine core's CPU hides behind the GPU
    async_scheduling: bool = False
    block_size: int | None = None  # tokens per KV block; None: the profile's engine's (16 if it does not say)
    # tokens of KV cache per replica; None: derived from the profile's GPU memory (a real engine's
    # measured capacity goes here, and `wispsim serve` sizes its engine's cache to it)
    kv_capacity_tokens: int | None = None
    gpu_memory_utilization: float = 0.9
    # GiB per GPU the KV cache cannot use beyond the weights; None: what vLLM's start-up memory
    # profile keeps, from the model and max_num_seqs / max_num_batched_tokens (model/startup.py)
    activation_reserve_gib: float | None = None
    # how the prefix cache reuses a prefix: token (SPEC 2.3) or block (vLLM: whole blocks only)
    prefix_reuse: Literal["token", "block"] = "token"
    # how much of an idle prefix is evicted for room: session (SPEC 2.3) or block (vLLM v1)
    eviction: Literal["session", "block"] = "session"
    # how centralized serving batches: continuous (vLLM: a response joins and leaves the running
    # batch at any step) or static (request-level: a batch starts when the last one has ended, and
    # finished responses stay in it as padding, as Hugging Face `generate` runs; simulated only)
    batching: Literal["continuous", "static"] = "continuous"
    # vLLM's engine generation (its VLLM_USE_V1): true V1, false V0 (vLLM 0.10 and before; its
    # scheduler, docs/model.md "vLLM V0's engine loop"); null: V1 unless a V0-only setting asks
    # for V0 (num_scheduler_steps > 1, as vLLM fell back to V0 for it)
    use_v1: bool | None = None
    # --enable-chunked-prefill: a prompt is prefilled in chunks within the step's token budget,
    # beside the decodes. Off, a prompt is prefilled whole: on V1 beside the decodes, on V0 in
    # prefill-only steps that go before any decode. null: the generation's default (V1 on, V0 off)
    enable_chunked_prefill: bool | None = None
    # --num-scheduler-steps (V0): a decode batch runs this many steps per scheduling; requests join
    # and leave only between runs, a request that ends mid-run is computed to the run's end
    num_scheduler_steps: int = 1
    # --multi-step-stream-outputs: a multi-step run streams its tokens step by step (vLLM's default
    # from 0.6.3, pull request #9047); false, at the run's end, one chunk per request (vLLM
    # 0.6.0-0.6.2's default: streaming from multi-step runs came with 0.6.2, off by default)
    multi_step_stream_outputs: bool = True
    # --attention-backend for a model with latent attention (MLA): which members of a batch it runs
    # as prefills, in their own form (docs/model.md, "Latent attention's two forms"); null: vLLM's
    # default for the GPU (FLASH_ATTN_MLA on Hopper; vLLM 0.10-0.11 ran FLASHMLA)
    attention_backend: AttentionBackend | None = None

    @property
    def v0(self) -> bool:
        """Whether the engine is vLLM's V0 (:func:`engine_generation`)."""
        return engine_generation(self.use_v1, self.enable_chunked_prefill, self.num_scheduler_steps)[0]

    @property
    def chunked_prefill(self) -> bool:
        """Whether prompts are prefilled in chunks (:func:`engine_generation`)."""
        return engine_generation(self.use_v1, self.enable_chunked_prefill, self.num_scheduler_steps)[1]

    def __post_init__(self) -> None:
        require_count(self.max_num_seqs, "max_num_seqs", 1, MAX_BATCH_REQUESTS)
        require_count(self.num_scheduler_steps, "num_scheduler_steps", 1, MAX_SCHEDULER_STEPS, "steps")
        require(
            not (self.use_v1 and self.num_scheduler_steps > 1),
            "num_scheduler_steps",
            f"{self.num_scheduler_steps} is multi-step scheduling, vLLM V0's; with use_v1: true allowed: 1 "
            "(or set use_v1: false)",
        )
        require(
            not (self.v0 and self.async_scheduling),
            "async_scheduling",
            "is vLLM V1's; the engine is V0 (use_v1: false or num_scheduler_steps > 1); allowed: false",
        )
        require(
            not (self.num_scheduler_steps > 1 and self.batching == "static"),
            "num_scheduler_steps",
            "is vLLM's continuous batching loop; with batching: static allowed: 1",
        )
        require_count(self.max_num_batched_tokens, "max_num_batched_tokens", 1, MAX_BATCH_TOKENS)
        require(
            0 < self.gpu_memory_utilization <= 1,
            "gpu_memory_utilization",
            f"must be in (0, 1], got {self.gpu_memory_utilization}",
        )
        require(
            self.activation_reserve_gib is None or 0 <= self.activation_reserve_gib <= MAX_MEMORY_GIB,
            "activation_reserve_gib",
            f"must be in [0, {MAX_MEMORY_GIB:g}] GiB per GPU or null (vLLM's start-up profile), "
            f"got {self.activation_reserve_gib}",
        )
        require(
            self.block_size is None or 1 <= self.block_size <= MAX_BLOCK_SIZE,
            "block_size",
            f"must be in [1, {MAX_BLOCK_SIZE}] tokens or null (the profile's), got {self.block_size}",
        )
        require(
            self.kv_capacity_tokens is None or 1 <= self.kv_capacity_tokens <= MAX_KV_TOKENS,
            "kv_capacity_tokens",
            f"must be in [1, {MAX_KV_TOKENS:,}] tokens or null (derived from the profile), "
            f"got {self.kv_capacity_tokens}",
        )


@dataclass(frozen=True, slots=True)
class VerifierConfig:
    """How a speculative server verifies: how a round reaches the engine (its kind), the batch
    the scheduler may form, and its KV policy (SPEC 2.3, 3.1)."""

    # resubmit: every round a new request with its whole prefix (a stock server;
    # wispsim.serve.verify); resident: each session's sequence stays in the engine and a round
    # forwards only its new tokens over its KV (the paper's verification engine; needs kv_policy
    # admission: resident KV stays pinned); wispsim.model.verifier_kinds
    kind: Literal["resubmit", "resident"] = "resubmit"
    max_batch_tokens: int = 16384  # new tokens one verification batch may hold
    delta_ms: float = 5.0  # WISP's guard time against estimator error
    # lru starts every response at once and evicts idle prefixes LRU-first; admission admits a
    # response only when its KV reservation fits and keeps admitted prefixes cached until they end
    # (wispsim.model.admission; set by the policy preset)
    kv_policy: Literal["lru", "admission"] = "lru"
    kv_headroom: float = 0.0  # fraction of the KV cache admission control keeps unreserved
    kv_growth: Literal["mean", "max", "none"] = "mean"  # output tokens reserved per admitted response
    kv_admission_order: Literal["fcfs", "deadline"] = "fcfs"

    def __post_init__(self) -> None:
        require(0 <= self.kv_headroom < 1, "kv_headroom", f"must be in [0, 1), got {self.kv_headroom}")
        require_count(self.max_batch_tokens, "max_batch_tokens", 1, MAX_BATCH_TOKENS)
        require(
            0 <= self.delta_ms <= 1000 * MAX_SIM_SECONDS,
            "delta_ms",
            f"must be >= 0 and <= {1000 * MAX_SIM_SECONDS:g} ms, got {self.delta_ms:g}",
        )


@dataclass(frozen=True, slots=True)
class HostConfig:
    """The serving host around the GPUs (wispsim.model.host_cpu, wispsim.sim.front): its CPU (the
    engine core per step, the API servers per request, measured on vLLM) and the front end."""

    # auto: on where the profile's overheads were calibrated beside it (a profile naming its
    # host's CPU speed), off for measured profiles (their timings include it); on; off
    cpu: Literal["auto", "on", "off"] = "auto"
    # the host CPU's speed over the measuring host's (2: twice as fast); None: the profile's
    # calibrated GPU server's, else 1
    cpu_speed: float | None = None
    api_server_count: int = 1  # API-server processes per replica (vLLM's --api-server-count)
    # the front end before the engine sees a response to generate: the profile's ``frontend``
    # latency (HTTP and tokenization) for each request; off: the engine alone, as before
    frontend: bool = False
    # the endpoint centralized serving's clients call (vLLM's /v1/completions or
    # /v1/chat/completions): chat adds its template per request in the API server
    endpoint: Literal["completions", "chat"] = "completions"
    # how a speculative server's rounds reach its API servers: http (JSON over HTTP: vLLM's
    # OpenAI server re-submitting, or a session API) or grpc (protobuf over gRPC, the paper's
    # devices); each has its measured API-server CPU per round (wispsim/data/host_cpu.yaml)
    transport: Literal["http", "grpc"] = "http"

    def __post_init__(self) -> None:
        require(
            self.cpu_speed is None or 0.01 <= self.cpu_speed <= 100,
            "cpu_speed",
            f"must be in [0.01, 100] (times the measuring host's) or null, got {self.cpu_speed}",
        )
        require_count(self.api_server_count, "api_server_count", 1, 64, "processes")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """The server (SPEC 2.3 and 3), by concern: its cost profile (what a pass costs, and how
    that cost is drawn), the policy preset's mode and scheduler, the engine's limits
    (:class:`EngineConfig`), the verifier (:class:`VerifierConfig`), the host around the GPUs
    (:class:`HostConfig`), its replicas, and server-side speculation. A scenario written with the
    earlier flat names (``server.engine.max_num_seqs``, ``server.host.cpu``, ...) still loads
    (:data:`FLAT_NAMES`)."""

    profile: str = "a100-qwen3-32b"
    # the verifier's build, a preset of verifier.kind, engine.prefix_reuse and host.transport
    # (wispsim.config.builds): stock-vllm, vllm-sessions, wisp-grpc; auto: the policy's own;
    # custom: the fields as given
    build: Literal["auto", "stock-vllm", "vllm-sessions", "wisp-grpc", "custom"] = "auto"
    mode: Literal["speculative", "centralized"] = "speculative"
    scheduler: str = "wisp"
    latency_model: str = "linear"
    estimator_form: str | None = None  # None: the profile's own (``estimator:``; additive if it says none)
    # the profile the scheduler plans with when it is not the engine's true cost (``profile``): a
    # deployment configured with another profile than the one its engine follows; None: ``profile``
    planning_profile: str | None = None
    noise: bool = True
    engine: EngineConfig = EngineConfig()
    verifier: VerifierConfig = VerifierConfig()
    host: HostConfig = HostConfig()
    replicas: int = 1
    router: str = "affinity"
    replica_profiles: tuple[str, ...] = ()
    speculation: SpeculationConfig = SpeculationConfig()

    def __post_init__(self) -> None:
        require_count(self.replicas, "replicas", 1, MAX_REPLICAS)
        require(
            not self.replica_profiles or len(self.replica_profiles) == self.replicas,
            "replica_profiles",
            f"gives {len(self.replica_profiles)} profiles for {self.replicas} replicas; "
            "give one per replica, or none to use server.profile for all",
        )


# the earlier flat names of the server section, and where each now lives (a stored scenario, a
# replay log's sidecar, ``--set server.max_batch_requests=...`` keep working)
FLAT_NAMES: dict[str, tuple[str, str]] = {
    "max_batch_requests": ("engine", "max_num_seqs"),
    "prefill_chunk_tokens": ("engine", "max_num_batched_tokens"),
    "prefix_cache": ("engine", "enable_prefix_caching"),
    "async_scheduling": ("engine", "async_scheduling"),
    "block_size": ("engine", "block_size"),
    "kv_capacity_tokens": ("engine", "kv_capacity_tokens"),
    "gpu_memory_utilization": ("engine", "gpu_memory_utilization"),
    "activation_reserve_gib": ("engine", "activation_reserve_gib"),
    "prefix_reuse": ("engine", "prefix_reuse"),
    "eviction": ("engine", "eviction"),
    "max_batch_tokens": ("verifier", "max_batch_tokens"),
    "delta_ms": ("verifier", "delta_ms"),
    "kv_policy": ("verifier", "kv_policy"),
    "kv_headroom": ("verifier", "kv_headroom"),
    "kv_growth": ("verifier", "kv_growth"),
    "kv_admission_order": ("verifier", "kv_admission_order"),
    "host_cpu": ("host", "cpu"),
    "host_cpu_speed": ("host", "cpu_speed"),
    "api_server_count": ("host", "api_server_count"),
    "frontend": ("host", "frontend"),
}


def upgrade_server(section: Any, source: str) -> Any:
    """A server section with the earlier flat names moved to where they live now (unchanged
    otherwise); ``verifier: resident`` (a kind, the earlier form) becomes ``verifier: {kind:
    resident}``. A name given both ways is an error naming both."""
    if not isinstance(section, dict):
        return section
    out = dict(section)
    if isinstance(out.get("verifier"), str):
        out["verifier"] = {"kind": out["verifier"]}
    for old, (group, new) in FLAT_NAMES.items():
        if old not in out:
            continue
        value = out.pop(old)
        sub = out.get(group)
        sub = dict(sub) if isinstance(sub, dict) else {}
        if new in sub:
            raise ConfigError(
                source,
                f"server.{old}",
                f"is server.{group}.{new}, also given; give it once, as server.{group}.{new}",
            )
        sub[new] = value
        out[group] = sub
    return out
