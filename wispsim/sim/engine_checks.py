"""Checks of the engine generation's settings on a whole scenario (vLLM V0's scheduling:
``server.engine.use_v1``, ``enable_chunked_prefill``, ``num_scheduler_steps``;
:mod:`wispsim.model.continuous` runs them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from wispsim.errors import ConfigError

if TYPE_CHECKING:
    from wispsim.config import Scenario


def check_engine_generation(scenario: Scenario, source: str, lengths: bool = True) -> None:
    """V0's scheduling (no chunked prefill, multi-step) is centralized serving's engine loop:
    a verifier's batches are priced on V1's measured costs, vLLM refused speculative decoding
    with multi-step scheduling, and without chunked prefill the longest request must fit one
    step's token budget (vLLM: ``max_num_batched_tokens >= max_model_len``; ``lengths`` False:
    the caller checks each request's, as a benchmark's come from its data)."""
    sv, wl = scenario.server, scenario.workload
    eng = sv.engine
    if sv.mode == "speculative":
        for name, asked, why in (
            ("use_v1", eng.use_v1 is False, "false"),
            ("num_scheduler_steps", eng.num_scheduler_steps > 1, str(eng.num_scheduler_steps)),
            ("enable_chunked_prefill", eng.enable_chunked_prefill is False, "false"),
        ):
            if asked:
                raise ConfigError(
                    source,
                    f"server.engine.{name}",
                    f"{why} sets vLLM V0's scheduling, which centralized serving's engine loop runs; a "
                    f"verifier's batches are priced as V1 verifies them; allowed with policy "
                    f"{scenario.policy}: the default",
                )
        return
    if eng.num_scheduler_steps > 1 and sv.speculation.method != "none":
        raise ConfigError(
            source,
            "server.engine.num_scheduler_steps",
            f"{eng.num_scheduler_steps}: vLLM runs speculative decoding without multi-step scheduling; "
            "allowed with server.speculation: 1",
        )
    if lengths and not eng.chunked_prefill:
        longest = int(wl.prompt_tokens.support()[1] + wl.output_tokens.support()[1])
        if longest > eng.max_num_batched_tokens:
            raise ConfigError(
                source,
                "server.engine.max_num_batched_tokens",
                f"{eng.max_num_batched_tokens:,} cannot hold the longest request ({longest:,} tokens: "
                "prompt + output) without chunked prefill (vLLM needs it >= max_model_len); allowed: "
                f">= {longest:,}, or enable_chunked_prefill: true",
            )
