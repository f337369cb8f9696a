"""Upper bounds on what one simulation may ask for, so every run is known to end.

A scenario, option or input file that goes past one of these is refused up front with the limit
in the message (``docs/inputs.md`` lists them with the reasons). They are far above anything
a capacity planner needs (issue 16's fleet is 100,000 devices; a day of simulated time is
86,400 s) and far below what would exhaust memory or never finish.
"""

from __future__ import annotations

import math
from typing import Any

#: Devices in one run (closed-loop count, a fleet's groups, an arrival trace's concurrency).
MAX_DEVICES = 1_000_000
#: Simulated seconds: warm-up + measurement window + drain limit, or an arrival trace's span.
MAX_SIM_SECONDS = 1_000_000.0  # 11.6 days
#: New responses per second of an open (Poisson or rate-trace) arrival process.
MAX_ARRIVAL_RATE = 100_000.0
#: Expected responses started in one run (rate x window), bounding an open run's work.
MAX_RESPONSES = 100_000_000
#: Verifier replicas (GPUs) in one run.
MAX_REPLICAS = 4096
#: Tokens in one prompt or response (any real model's context is far smaller).
MAX_TOKENS = 10_000_000
#: KV block size in tokens.
MAX_BLOCK_SIZE = 1 << 16
#: GiB of memory per GPU: a profile's ``hardware.memory_gib`` (a CPU profile's: the host's) and a
#: scenario's ``server.engine.activation_reserve_gib`` (the largest GPU today has 288 GiB). With at most
#: 1,024 GPUs per model it keeps the KV-cache arithmetic finite and its token count within int64.
MAX_MEMORY_GIB = 4096.0
#: Tokens of KV cache per replica (``server.engine.kv_capacity_tokens``): 2**53, exact as a float.
MAX_KV_TOKENS = 1 << 53
#: Requests in one batch (``server.engine.max_num_seqs``).
MAX_BATCH_REQUESTS = 1_000_000
#: Tokens in one batch or prefill chunk (``server.verifier.max_batch_tokens``, ``prefill_chunk_tokens``).
MAX_BATCH_TOKENS = 1_000_000_000
#: Draft tokens per round (k, k_max) and top-k width.
MAX_DRAFT = 1024
#: vLLM V0's --num-scheduler-steps (multi-step scheduling; deployments used 8-20)
MAX_SCHEDULER_STEPS = 1024
#: Seeds: NumPy accepts 0 .. 2**63 - 1 and the replay log stores them as int64.
MAX_SEED = (1 << 63) - 1
#: Any other integer field (batch limits, header bytes, ...): int64 range.
MAX_INT = (1 << 63) - 1


def finite(value: Any) -> bool:
    """True for a real number that is neither NaN nor infinite."""
    try:
        return math.isfinite(value)
    except (TypeError, OverflowError):
        return False
