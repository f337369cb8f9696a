"""vLLM's attention backends, as far as they change what a pass costs: which members of a batch
the backend runs as prefills (docs/model.md, "Latent attention's two forms").

vLLM splits every batch into decodes and prefills by query length: a member with at most the
backend's ``reorder_batch_threshold`` new tokens decodes (:class:`wispsim.model.batch.Shape`'s
``prefill_above``). Only latent attention (MLA) runs the two in forms of different cost, so only
its backends are a setting here (``server.engine.attention_backend``, vLLM's
``--attention-backend`` / ``VLLM_ATTENTION_BACKEND``); every other backend prices a prefill's
pairs as a decode's, and naming one is refused (their kernels' speeds are not told apart).

:data:`MLA_BACKENDS` gives each MLA backend's threshold and the GPU generations it runs on (vLLM's
backend classes and ``platforms/cuda.py``, ``rocm.py``): FlashAttention-3's MLA (Hopper) takes
prefills of up to 512 tokens through its decode path; FlashMLA (Hopper, Blackwell), FlashInfer's
and CUTLASS's (Blackwell), Triton's (any) and AITER's (ROCm) decode one token. Unset, the backend
is vLLM's default for the GPU (:data:`MLA_DEFAULT`: its priorities' first that runs there). vLLM
0.10 and 0.11 put FlashMLA first on Hopper; ``attention_backend: FLASHMLA`` prices those versions.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, TypeVar

from wispsim.config.server import ATTENTION_BACKENDS
from wispsim.errors import ConfigError
from wispsim.model.archs import Arch
from wispsim.model.weight_only import profile_generation


class _Profile(Protocol):  # wispsim.model.profiles.Profile, which imports this module's users
    name: str
    estimator: Any
    generation: str | None
    gpu_key: str | None


P = TypeVar("P", bound=_Profile)

# backend -> (reorder_batch_threshold, the GPU generations it runs on)
MLA_BACKENDS: dict[str, tuple[int, tuple[str, ...]]] = {
    "FLASH_ATTN_MLA": (512, ("hopper",)),
    "FLASHMLA": (1, ("hopper", "blackwell")),
    "FLASHINFER_MLA": (1, ("blackwell",)),
    "CUTLASS_MLA": (1, ("blackwell",)),
    "TRITON_MLA": (1, ("ampere", "ada", "hopper", "blackwell", "cdna3")),
    "ROCM_AITER_MLA": (1, ("cdna3",)),
}
# vLLM's default MLA backend by generation (the first of its priorities that runs there)
MLA_DEFAULT = {
    "ampere": "TRITON_MLA",
    "ada": "TRITON_MLA",
    "hopper": "FLASH_ATTN_MLA",
    "blackwell": "FLASHINFER_MLA",
    "cdna3": "ROCM_AITER_MLA",
}
assert set(MLA_BACKENDS) == set(ATTENTION_BACKENDS)  # the config's allowed names


def decode_threshold(arch: Arch, generation: str | None, backend: str | None = None) -> int:
    """The ``reorder_batch_threshold`` ``arch`` is priced with on ``generation`` under
    ``backend`` (None: vLLM's default there; a generation not given: 1). Other attention: 1 (its
    threshold changes no price)."""
    if not arch.mla:
        return 1
    name = backend or MLA_DEFAULT.get(generation or "")
    return MLA_BACKENDS[name][0] if name else 1


def with_attention_backend(profile: P, backend: str | None, source: str) -> P:
    """``profile`` with its roofline priced under ``backend`` (None: the profile as it is, vLLM's
    default). Refused by name where vLLM would not run it (a model without latent attention, a GPU
    generation the backend does not support) or where the profile's form cannot price it."""
    if backend is None:
        return profile
    fld = "server.engine.attention_backend"
    arch = getattr(profile.estimator, "arch", None)
    if not isinstance(arch, Arch):
        raise ConfigError(
            source,
            fld,
            f"{backend} changes how the roofline form prices latent attention; profile '{profile.name}' "
            f"prices with the {profile.estimator.form} form; allowed: null",
        )
    if not arch.mla:
        raise ConfigError(
            source,
            fld,
            f"{backend} is a latent-attention (MLA) backend and {arch.name} has none; allowed: null",
        )
    gens = MLA_BACKENDS[backend][1]
    gen = profile_generation({"generation": profile.generation, "gpu_key": profile.gpu_key}, source)
    if gen not in gens:
        ok = [b for b, (_, g) in MLA_BACKENDS.items() if gen in g]
        raise ConfigError(
            source,
            fld,
            f"{backend} runs on {', '.join(gens)} GPUs; profile '{profile.name}' is "
            f"{gen or 'of no stated generation'}; allowed: null{''.join(', ' + b for b in ok)}",
        )
    threshold = MLA_BACKENDS[backend][0]
    est = dataclasses.replace(profile.estimator, reorder_batch_threshold=threshold)  # type: ignore[type-var]
    return dataclasses.replace(profile, estimator=est)
