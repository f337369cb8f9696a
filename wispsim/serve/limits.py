"""What a real server holds at most, and the bounded batch log.

vLLM's promise is the anchor: a bad request gets a 4xx, the server never hangs, memory stays
bounded. :class:`Limits` are the bounds ``wispsim serve`` enforces (its options of the same names,
docs/serve.md): open sessions (or, centralized, live responses), how long a session may sit idle,
a request body's size, rounds waiting, and the rows the batch log keeps. :class:`BatchLog` keeps
the log as two rings: the newest ``rows`` batches and members, the count of older ones dropped.
"""

from __future__ import annotations

import secrets
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from wispsim.errors import ConfigError

ADMIN_TOKEN_ENV = "WISPSIM_ADMIN_TOKEN"  # the admin token a server takes and a swarm sends


@dataclass(frozen=True)
class Limits:
    """The bounds of one server. ``admin_token`` guards ``/reset`` and ``/log`` (a random one is
    made when none is given); ``max_sessions`` caps open sessions (speculative) or live responses
    (centralized); a session with no round for ``session_idle_s`` is closed; a body over
    ``max_body_bytes`` is refused unread; at most ``max_waiting`` rounds wait (queued, or for
    admission); the log keeps the newest ``log_rows`` rows of each table."""

    admin_token: str | None = None
    max_sessions: int = 4096
    session_idle_s: float = 300.0
    max_body_bytes: int = 1 << 20
    max_waiting: int = 4096
    log_rows: int = 200_000

    def __post_init__(self) -> None:
        checks = (
            ("--max-sessions", self.max_sessions, 1, "sessions"),
            ("--max-body-bytes", self.max_body_bytes, 1024, "bytes"),
            ("--max-waiting", self.max_waiting, 1, "rounds"),
            ("--log-rows", self.log_rows, 1, "rows"),
        )
        for name, value, low, unit in checks:
            if not low <= value <= 10**9:
                raise ConfigError(name, str(value), f"must be in [{low:,}, 1,000,000,000] {unit}")
        if not 1.0 <= self.session_idle_s <= 86400 * 7:
            raise ConfigError(
                "--session-idle-s", f"{self.session_idle_s:g}", "must be in [1, 604800] seconds"
            )
        if self.admin_token is not None and len(self.admin_token) < 16:
            raise ConfigError("--admin-token", "(hidden)", "must be at least 16 characters")

    def token(self) -> str:
        """The admin token: the one given, else a new random one (128 bits)."""
        return self.admin_token if self.admin_token is not None else secrets.token_urlsafe(16)


def new_session_id() -> str:
    """A session's id: 128 random bits, the capability to use the session."""
    return secrets.token_urlsafe(16)


@dataclass
class Ring:
    """The newest ``rows`` rows of one table (each a dict with the same keys), stored as tuples;
    ``dropped`` counts the older rows let go."""

    rows: int
    columns: tuple[str, ...] = ()
    data: deque[tuple[Any, ...]] = field(default_factory=deque)
    dropped: int = 0

    def append(self, row: dict[str, Any]) -> None:
        if not self.columns:
            self.columns = tuple(row)
        if len(self.data) >= self.rows:
            self.data.popleft()
            self.dropped += 1
        self.data.append(tuple(row[c] for c in self.columns))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for values in self.data:
            yield dict(zip(self.columns, values, strict=True))

    def __len__(self) -> int:
        return len(self.data)


class BatchLog:
    """What the server did: one row per batch (or engine step) and one per member of a batch,
    the newest ``rows`` of each."""

    def __init__(self, rows: int = Limits.log_rows) -> None:
        self.batches = Ring(rows)
        self.members = Ring(rows)

    def document(self) -> dict[str, Any]:
        """``GET /log``'s answer: both tables and how many rows of each were dropped."""
        return {
            "batches": list(self.batches),
            "members": list(self.members),
            "dropped_batches": self.batches.dropped,
            "dropped_members": self.members.dropped,
        }
