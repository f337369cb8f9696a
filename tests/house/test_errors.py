"""Errors a user can act on cross processes intact: a pool worker's point that fails reports its
one line (not a broken pool)."""

from __future__ import annotations

import pickle

import pytest

from wispsim.config.dist import FieldError
from wispsim.engines.vllm_steps import EngineStalled
from wispsim.errors import ConfigError, EngineFailure, TraceError, WispsimError
from wispsim.serve.rounds import ServeError


@pytest.mark.parametrize(
    "error",
    [
        WispsimError("a problem"),
        ConfigError("scenario.yaml", "server.verifier.delta_ms", "must be >= 0, got -1"),
        TraceError("trace.parquet: no column accepted"),
        EngineFailure("vllm: stopped at step 3"),
        ServeError(429, "too many sessions", retry_after=1.0),
        EngineStalled("stalled", {"r1"}, {"r0": 3}),
        FieldError("workload.output_tokens", "must be > 0"),
    ],
)
def test_an_error_survives_pickling_with_its_parts(error: Exception) -> None:
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error) and str(back) == str(error)
    assert vars(back) == vars(error)


def test_every_user_error_class_is_covered() -> None:
    """A new error class with its own constructor needs its own way back (``__reduce__``)."""
    import wispsim.engines.vllm_steps
    import wispsim.serve.client
    import wispsim.serve.rounds  # noqa: F401  (their classes register as subclasses)

    def subclasses(cls: type) -> set[type]:
        return {c for s in cls.__subclasses__() for c in {s, *subclasses(s)}}

    own_init = {c for c in subclasses(WispsimError) if "__init__" in vars(c)}
    assert all("__reduce__" in vars(c) for c in own_init), own_init
