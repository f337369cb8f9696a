"""Device-server links and payload sizes (SPEC 2.2).

Transfer time = (one-way latency + bytes / bandwidth) x jitter, where the jitter factor is
log-normal with mean 1 (sigma = the link type's ``jitter``). Each device has its own link and its
own random stream for jitter.
"""

from __future__ import annotations

import numpy as np

from wispsim.config import LinkType, NetworkConfig
from wispsim.model.noise import MeanOneLogNormal

TOKEN_ID_BYTES = 4


def draft_token_bytes(cfg: NetworkConfig, vocab_size: int) -> int:
    """Uplink bytes per drafted token for the payload mode.

    ids: token id + its draft probability (int32 + fp32); topk: top-k (id int32, prob fp16) pairs;
    full: the whole draft distribution in fp16.
    """
    if cfg.payload == "ids":
        return 8
    if cfg.payload == "topk":
        return 4 + cfg.topk * 6
    return vocab_size * 2


class Link:
    """One device's access link, with its own stream of jitter factors."""

    __slots__ = ("down_bps", "jitter", "latency", "type", "up_bps")

    def __init__(self, name: str, lt: LinkType, rng: np.random.Generator) -> None:
        self.type = name
        self.latency = lt.latency_ms / 1000.0
        self.up_bps = lt.up_mbps * 1e6 / 8
        self.down_bps = lt.down_mbps * 1e6 / 8
        self.jitter = MeanOneLogNormal(lt.jitter, rng)

    def up(self, nbytes: float) -> float:
        return (self.latency + nbytes / self.up_bps) * self.jitter.next()

    def down(self, nbytes: float) -> float:
        return (self.latency + nbytes / self.down_bps) * self.jitter.next()


def pick_link_type(cfg: NetworkConfig, u: float) -> str:
    """Link type for a device from a uniform draw u, by the configured shares."""
    names = list(cfg.links)
    w = np.array([cfg.links[n] for n in names], dtype=float)
    cum = np.cumsum(w / w.sum())
    i = int(np.searchsorted(cum, u, side="right"))
    return names[min(i, len(names) - 1)]
