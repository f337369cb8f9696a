"""What a tensor-parallel all-reduce costs over each interconnect kind
(``wispsim/data/interconnects.yaml``): the engine's own all-reduce for a message up to its size
limit, NCCL beyond, by GPU count (issue 45; the roofline prices them: :mod:`wispsim.model.roofline`).
"""

from __future__ import annotations

from typing import Any

import yaml

from wispsim.errors import ConfigError
from wispsim.paths import data_dir


def allreduce_ms(interconnect: str) -> float:
    """One small all-reduce's latency over an interconnect kind (wispsim/data/interconnects.yaml)."""
    return float(_interconnect(interconnect)["allreduce_us"]) / 1e3


def check_domain(interconnect: str, count: int, flag: str = "--tensor-parallel-size") -> None:
    """Tensor parallelism within one domain of the interconnect (``max_gpus``: one node; across
    nodes an all-reduce crosses the network, which is not modelled), else a one-line refusal."""
    most = int(_interconnect(interconnect).get("max_gpus", count))
    if count > most:
        raise ConfigError(
            flag,
            "tensor_parallel_size",
            f"got {count}: tensor parallelism beyond one {interconnect} domain ({most} GPUs, one node; "
            f"across nodes it runs over the network) is not modelled; allowed: 1 to {most}",
        )


def _interconnect(kind: str) -> dict[str, Any]:
    table: dict[str, Any] = yaml.safe_load((data_dir() / "interconnects.yaml").read_text())
    if kind not in table:
        raise ConfigError("interconnects.yaml", kind, f"unknown; known: {', '.join(table)}")
    return dict(table[kind])


def _by_gpus(table: dict[Any, Any], tp: int) -> Any:
    """The entry for ``tp`` GPUs: the nearest listed count at or below it (else the smallest)."""
    counts = sorted(int(k) for k in table)
    below = [c for c in counts if c <= tp]
    return table[below[-1] if below else counts[0]]


def allreduce_facts(interconnect: str, tp: int) -> dict[str, float]:
    """What a ``tp``-GPU all-reduce over ``interconnect`` costs by message size (interconnects.yaml),
    beside the fast path's latency (:func:`allreduce_ms`): the largest message the fast path takes
    (MB; 0 at a GPU count it does not run at), NCCL's latency beyond it (ms) and the fraction of
    the link bandwidth either reaches. Empty for one GPU or a kind not measured."""
    entry = _interconnect(interconnect)
    nccl = entry.get("nccl") or (_interconnect(entry["nccl_as"]).get("nccl") if "nccl_as" in entry else None)
    if tp <= 1 or not nccl:
        return {}
    fast, at = entry.get("fast_path_mb") or {}, _by_gpus(nccl, tp)
    return {
        "allreduce_nccl": float(at["latency_us"]) / 1e3,
        "link": float(at["efficiency"]),
        # vLLM's own all-reduce runs at the GPU counts its tables list (2, 4, 6, 8); others: NCCL
        "allreduce_fast_mb": float(fast.get(tp, 0.0)),
    }
