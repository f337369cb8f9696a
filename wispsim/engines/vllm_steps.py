"""Driving vLLM's engine step by step, never forever.

``LLM.generate`` and a bare ``while ...: engine.step()`` both trust the engine to finish what it
was given. A server cannot: vLLM skips a request it cannot schedule (no free KV block, no free
request slot: a paused resident session holds one) and waits for room that, with every other
request paused, never comes. The loop here watches for progress -- an output, a change in any
request's computed tokens, a request added or gone -- and after ``patience`` steps without any it
first asks ``make_room`` (a resident verifier ends an idle session), then gives up with
:class:`EngineStalled`, naming the requests that were not served. A ``stop`` event (the server
shutting down) ends it between steps with :class:`EngineStopped`.

Progress is read from the engine core's scheduler where it runs in this process (the server's
layout); otherwise only outputs count, with a longer patience.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from wispsim.errors import WispsimError

PATIENCE = 3  # steps with no progress at all before the engine counts as stalled
PATIENCE_BLIND = 1000  # the same where the scheduler is in another process (outputs only)


class EngineStalled(WispsimError):
    """The engine cannot make progress on ``missing`` (request ids); ``got`` holds what it did
    answer before it stalled."""

    def __init__(self, message: str, missing: set[str], got: dict[str, Any]) -> None:
        super().__init__(message)
        self.missing = missing
        self.got = got

    def __reduce__(self) -> tuple[type[EngineStalled], tuple[str, set[str], dict[str, Any]]]:
        return type(self), (str(self), self.missing, self.got)


class EngineStopped(WispsimError):
    """The server is shutting down: the loop stopped between steps."""


def in_process_core(engine: Any) -> Any:
    """The engine core of a ``LLMEngine`` when it runs in this process, else None."""
    return getattr(getattr(engine, "engine_core", None), "engine_core", None)


def progress_state(core: Any) -> tuple[int, int] | None:
    """What changes whenever the scheduler makes progress: its requests and their computed tokens."""
    if core is None:
        return None
    reqs = core.scheduler.requests
    return len(reqs), sum(r.num_computed_tokens for r in reqs.values())


def drive(
    engine: Any,
    want: Iterable[str],
    done: Callable[[Any], bool],
    *,
    stop: threading.Event | None = None,
    make_room: Callable[[], bool] | None = None,
    patience: int | None = None,
) -> dict[str, Any]:
    """Step ``engine`` (a vLLM ``LLMEngine``) until every request id in ``want`` has an output
    for which ``done(output)`` holds; returns those outputs by id.

    Raises :class:`EngineStalled` after ``patience`` steps without progress when ``make_room``
    (called then; True if it freed something) cannot help, :class:`EngineStopped` when ``stop``
    is set."""
    pending = set(want)
    core = in_process_core(engine)
    limit = patience if patience is not None else PATIENCE if core is not None else PATIENCE_BLIND
    got: dict[str, Any] = {}
    quiet = 0
    while pending:
        if stop is not None and stop.is_set():
            raise EngineStopped("the server is shutting down")
        before = progress_state(core)
        moved = False
        for o in engine.step():
            moved = True
            if o.request_id in pending and done(o):
                got[o.request_id] = o
                pending.discard(o.request_id)
        if moved or progress_state(core) != before:
            quiet = 0
            continue
        quiet += 1
        if quiet < limit:
            continue
        if make_room is not None and make_room():
            quiet = 0
            continue
        raise EngineStalled(
            f"the engine cannot schedule {len(pending)} of its requests (no free KV block or request "
            "slot, and nothing left to free)",
            pending,
            got,
        )
    return got
