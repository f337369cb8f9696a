"""The network section: the kinds of access link and how the fleet's devices are spread over them
(SPEC 2.2)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from wispsim.config.dist import require
from wispsim.config.limits import MAX_DRAFT


@dataclass(frozen=True, slots=True)
class LinkType:
    """One kind of access link: one-way latency, bandwidths and a log-normal jitter factor."""

    latency_ms: float = 10.0
    up_mbps: float = 20.0
    down_mbps: float = 50.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        require(self.latency_ms >= 0, "latency_ms", f"must be >= 0, got {self.latency_ms}")
        require(self.up_mbps > 0, "up_mbps", f"must be > 0, got {self.up_mbps}")
        require(self.down_mbps > 0, "down_mbps", f"must be > 0, got {self.down_mbps}")
        require(self.jitter >= 0, "jitter", f"must be >= 0, got {self.jitter}")


DEFAULT_LINK_TYPES: dict[str, LinkType] = {
    "wifi": LinkType(latency_ms=10.0, up_mbps=20.0, down_mbps=50.0, jitter=0.15),
    "5g": LinkType(latency_ms=15.0, up_mbps=50.0, down_mbps=200.0, jitter=0.2),
    "4g": LinkType(latency_ms=40.0, up_mbps=10.0, down_mbps=30.0, jitter=0.3),
    "ethernet": LinkType(latency_ms=1.0, up_mbps=1000.0, down_mbps=1000.0, jitter=0.05),
}


@dataclass(frozen=True, slots=True)
class NetworkConfig:
    """Links between devices and the server, and what a round's uplink carries (SPEC 2.2)."""

    payload: Literal["ids", "topk", "full"] = "ids"
    topk: int = 20
    header_bytes: int = 64
    links: dict[str, float] = field(default_factory=lambda: {"wifi": 1.0})
    link_types: dict[str, LinkType] = field(default_factory=lambda: dict(DEFAULT_LINK_TYPES))

    def __post_init__(self) -> None:
        require(1 <= self.topk <= MAX_DRAFT, "topk", f"must be in [1, {MAX_DRAFT}], got {self.topk}")
        require(0 <= self.header_bytes <= 1 << 30, "header_bytes", "must be in [0, 2**30]")
        require(len(self.links) > 0, "links", "needs at least one link type")
        for name, w in self.links.items():
            known = ", ".join(sorted(self.link_types))
            require(name in self.link_types, f"links.{name}", f"unknown link type; known: {known}")
            require(w >= 0, f"links.{name}", f"share must be >= 0, got {w}")
        require(sum(self.links.values()) > 0, "links", "shares must not all be 0")
