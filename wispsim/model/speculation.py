"""Server-side speculative decoding: what a step drafts, what it costs, what it commits.

Centralized serving with speculation (policy ``centralized-sd``, ``server.speculation``) runs
vLLM's scheme: every engine step, each running response whose prompt is processed verifies the
``k`` tokens drafted for it in the previous step plus one (``k + 1`` new tokens through the target,
its KV read as in any decode), commits the accepted run plus the target's own next token, and the
drafter proposes the next ``k``. The drafter runs on the same GPU, after the target's pass:

- ``draft``: a small model of the target's vocabulary (an architecture in ``wispsim/data/archs``).
  Its first pass runs over every token the target's pass ran over (prefill chunks included: the
  draft keeps its own KV of the whole context), then ``k - 1`` passes of one token per response
  that decoded or finished its prefill in the step. Each is priced by the roofline of the draft's
  architecture on the target's GPUs (same tensor parallelism, same calibrated efficiencies) plus
  what the roofline's bytes and FLOPs miss
  in a pass this small: a fixed cost per pass (``draft_pass_ms``: preparing its inputs, sampling
  the drafts) and one per layer (``draft_layer_us``: a small model's layer is a dozen kernels of
  a few microseconds each, norms, rotary, activation, attention's launch, whose latency floors add
  up where the weights they read take only tens of microseconds). Both are calibrated on public
  speculative runs (``wispsim/data/speculation.yaml``, experiments/public-sd.yaml). The target's
  own passes carry such costs too, inside its fitted per-step overhead and efficiencies.
- ``eagle``: an EAGLE-style head (one decoder layer on the target's hidden states; its shape is an
  architecture too, ``<target>-eagle3`` by default), drafting the same way.
- ``ngram``: prompt lookup on the CPU: no GPU pass is priced (its CPU time overlaps the GPU's).

The draft's weights and its KV per token share the GPU's memory with the target's
(:func:`memory_extra`), so the KV cache holds fewer tokens. Acceptance: by position along the
committed text, from the scenario's acceptance model (the traces WISP replays, so edge and
server-side drafting meet the same text), or, with ``acceptance_length`` given, each drafted
position accepted independently with the rate that makes the mean committed run that length.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from wispsim.errors import ConfigError
from wispsim.model.acceptance import accept_runs
from wispsim.model.archs import Arch, available_archs, load_arch
from wispsim.model.roofline import Roofline
from wispsim.model.weight_only import profile_experts
from wispsim.paths import data_dir

if TYPE_CHECKING:
    from wispsim.config import ServerConfig
    from wispsim.model.profiles import Profile

# a draft model by the target's family (its config's model_type): the public Qwen3-32B sweep's
# draft (experiments/data/public), and the Llama-3.3-70B runs' draft for Llama targets
DEFAULT_DRAFTS = {"qwen3": "qwen3-1.7b", "qwen2": "qwen2.5-0.5b", "llama": "llama-3.2-1b"}
FIELD = "server.speculation"


@functools.cache
def calibration(engine: str = "vllm") -> dict[str, Any]:
    """The engine's calibrated draft-pass cost (``wispsim/data/speculation.yaml``)."""
    table = yaml.safe_load((data_dir() / "speculation.yaml").read_text())
    entry: dict[str, Any] = table[engine]
    return entry


@dataclass(frozen=True, slots=True)
class Speculation:
    """One replica's speculative decoding, resolved against its profile (module docstring)."""

    method: str
    k: int
    draft: Arch | None  # None for ngram
    # the draft's passes: its roofline (no engine step overheads: they are the target's), or its
    # own profile's estimator
    cost: Roofline | _ProfileCost | None
    pass_overhead: float  # seconds per draft pass, besides its bytes and FLOPs
    layer_overhead: float  # seconds per layer of a draft pass (small kernels' latency floors)
    acceptance_length: float | None
    weight_bytes: float  # the draft's weights, over all the replica's GPUs
    kv_bytes_per_token: int  # the draft's KV per token of context

    def draft_time(
        self, n_linear: int, n_interactions: int, n_cached: int, decoding: int, context: int
    ) -> float:
        """Seconds of drafting after a target pass over (``n_linear``, ``n_interactions``,
        ``n_cached``) in which ``decoding`` responses with ``context`` tokens in all decoded."""
        cost = self.cost
        if cost is None:
            return 0.0
        fixed = self.pass_overhead + (self.layer_overhead * self.draft.layers if self.draft else 0.0)
        t = cost.batch(n_linear, n_interactions, n_cached) + fixed
        if self.k > 1 and decoding:
            one = cost.batch(decoding, context + decoding, context) + fixed
            t += (self.k - 1) * one
        return t

    def runs(self, trace_runs: np.ndarray, positions: int, rng: np.random.Generator) -> list[int]:
        """``run[t]``: drafted tokens accepted in a row from position t (capped at k by the
        server), from the acceptance model's stream, or drawn for ``acceptance_length``."""
        if self.acceptance_length is None:
            return [int(r) for r in trace_runs]
        alpha = rate_for_length(self.acceptance_length, self.k)
        accept = rng.random(positions + self.k + 1) < alpha
        return [int(r) for r in accept_runs(accept)]


@functools.cache
def rate_for_length(length: float, k: int) -> float:
    """The per-position acceptance rate a with a + a^2 + ... + a^k = length - 1 (independent
    positions: the mean accepted run of k drafts, plus the target's own token)."""
    target = length - 1.0
    if target <= 0:
        return 0.0
    if target >= k:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        a = (lo + hi) / 2
        s = sum(a**i for i in range(1, k + 1))
        lo, hi = (a, hi) if s < target else (lo, a)
    return (lo + hi) / 2


def _roofline(profile: Profile) -> Roofline | None:
    est = profile.estimator
    if isinstance(est, Roofline):
        return est
    other = profile.forms.get("roofline")
    return other if isinstance(other, Roofline) else None


def resolve(
    server: ServerConfig,
    profile: Profile,
    source: str = "scenario",
    overheads: dict[str, float] | None = None,
) -> Speculation | None:
    """``server.speculation`` against ``profile`` (one-line errors naming the field); None when
    the server does not speculate. ``overheads`` (``draft_pass_ms``, ``draft_layer_us``) replaces
    the calibration's (the calibration study fits them)."""
    spec = server.speculation
    if spec.method == "none" or server.mode != "centralized":
        return None
    length = spec.acceptance_length
    if spec.method == "ngram":
        return Speculation("ngram", spec.k, None, None, 0.0, 0.0, length, 0.0, 0)
    if spec.draft_profile is not None:
        return _from_profile(spec, profile, source)
    target = _roofline(profile)
    if target is None:
        raise ConfigError(
            source,
            f"{FIELD}.method",
            f"pricing a {spec.method} model's passes needs a profile with the roofline form (its "
            f"architecture and GPU); profile '{profile.name}' has: {', '.join(profile.forms) or 'additive'}; "
            "allowed: a physical profile (`wispsim profile list`), or method ngram",
        )
    name = spec.draft or (
        DEFAULT_DRAFTS.get(target.arch.model_type, "")
        if spec.method == "draft"
        else f"{target.arch.name}-eagle3"
    )
    if not name:
        raise ConfigError(
            source,
            f"{FIELD}.draft",
            f"no default draft model for a {target.arch.model_type} target; name one (an architecture "
            "sharing the target's vocabulary: `wispsim profile archs` lists them)",
        )
    try:
        arch = load_arch(name)
    except ConfigError:
        raise ConfigError(
            source, f"{FIELD}.draft", f"unknown architecture {name!r}; known: {', '.join(available_archs())}"
        ) from None
    _check_pair(spec.method, arch, target.arch, source)
    # its experts as the engine stores them on the target's GPUs (mxfp4: padded to the kernel's tiles)
    hardware = {"generation": profile.generation, "gpu_key": profile.gpu_key}
    arch = profile_experts(arch, hardware, target.tp, f"profile '{profile.name}'")
    cost = dataclasses.replace(target, arch=arch, step=0.0, request=0.0, arrival=0.0)
    costs = dict(overheads or calibration())
    for name in ("draft_pass_ms", "draft_layer_us"):  # the scenario's own, where it sets them
        if getattr(spec, name) is not None:
            costs[name] = getattr(spec, name)
    return Speculation(
        spec.method,
        spec.k,
        arch,
        cost,
        float(costs["draft_pass_ms"]) / 1e3,
        float(costs["draft_layer_us"]) / 1e6,
        length,
        float(arch.weight_bytes(target.weight_dtype_bytes)),
        arch.kv_bytes_per_token(target.kv_dtype_bytes),
    )


def _from_profile(spec: Any, profile: Profile, source: str) -> Speculation:
    """A drafter priced by its own latency profile (``server.speculation.draft_profile``): a pass
    costs what that profile's estimator says of it (its own per-pass constant included), and its
    weights and KV per token are the profile's model facts."""
    from wispsim.model.profiles import load_profile

    draft = load_profile(spec.draft_profile, source, f"{FIELD}.draft_profile")
    if spec.method == "draft" and draft.model.vocab_size != profile.model.vocab_size:
        raise ConfigError(
            source,
            f"{FIELD}.draft_profile",
            f"'{draft.name}' has a {draft.model.vocab_size:,}-token vocabulary, the target "
            f"'{profile.name}' {profile.model.vocab_size:,}: a draft model must share it",
        )
    if draft.gpu != profile.gpu or draft.gpu_count != profile.gpu_count:
        raise ConfigError(
            source,
            f"{FIELD}.draft_profile",
            f"'{draft.name}' was measured on {draft.gpu_count} x {draft.gpu}, the target on "
            f"{profile.gpu_count} x {profile.gpu}: the draft runs on the target's hardware",
        )
    return Speculation(
        spec.method,
        spec.k,
        None,
        _ProfileCost(draft.estimator),
        0.0,
        0.0,
        spec.acceptance_length,
        float(draft.model.weight_bytes),
        draft.model.kv_bytes_per_token,
    )


@dataclass(frozen=True, slots=True)
class _ProfileCost:
    """A draft profile's estimator in the roofline's place (no layer count: its passes carry
    their own constant)."""

    estimator: Any

    def batch(self, n_linear: float, n_interactions: float, n_cached: float) -> float:
        return float(self.estimator.batch(n_linear, n_interactions, n_cached, 0, 0))


def _check_pair(method: str, draft: Arch, target: Arch, source: str) -> None:
    if method == "draft" and draft.vocab_size != target.vocab_size:
        same = [
            n for n in available_archs() if n != target.name and load_arch(n).vocab_size == target.vocab_size
        ]
        raise ConfigError(
            source,
            f"{FIELD}.draft",
            f"{draft.name} has a {draft.vocab_size:,}-token vocabulary, the target {target.name} "
            f"{target.vocab_size:,}: a draft model must share it; "
            f"allowed: {', '.join(same) or 'none shipped'}",
        )
    if method == "eagle" and draft.hidden_size != target.hidden_size:
        raise ConfigError(
            source,
            f"{FIELD}.draft",
            f"an EAGLE head reads the target's hidden states: {draft.name} is {draft.hidden_size} wide, "
            f"{target.name} {target.hidden_size}; allowed: a head built for {target.name}",
        )


def memory_extra(server: ServerConfig, profile: Profile, source: str = "scenario") -> tuple[float, int]:
    """(weight bytes, KV bytes per token) the drafter adds to the replica's memory."""
    spec = resolve(server, profile, source)
    return (0.0, 0) if spec is None else (spec.weight_bytes, spec.kv_bytes_per_token)
