"""Drafting controllers: how many tokens a device drafts in a round (SPEC 2.1).

A controller turns a response's acceptance stream and the current position into a
:class:`DraftPlan`: tokens sent (k), draft forward passes paid, and predictor calls paid. The
accepted length then follows from the stream (``min(run[pos], k)``).

- ``fixed``: k = K.
- ``predictor``: draft while the rejection predictor says "accept"; stop at the first predicted
  rejection (that forward pass is paid, its token is not sent); never more than K_max; at least
  K_min tokens are sent, and the predictor is not consulted for those.

Either way a device never drafts past the end of its response: k <= max(1, remaining - 1), since
a round commits up to k + 1 tokens.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from wispsim.config import DraftingConfig
from wispsim.model.acceptance import ResponseStream, accept_runs
from wispsim.model.predictor import Predictor, make_predictor
from wispsim.registry import Registry

# (k: tokens sent, forward_passes: draft passes paid, predictor_calls: predictor calls paid);
# a plain tuple because plan() runs once per round.
DraftPlan = tuple[int, int, int]


class Controller(Protocol):
    def prepare(self, stream: ResponseStream) -> object:
        """Per-response precomputation (e.g. predictor decisions at every position)."""
        ...

    def plan(self, state: object, pos: int, remaining: int) -> DraftPlan: ...


CONTROLLERS: Registry[type] = Registry("drafting controller")

# A trace replay's predictor decisions depend only on the predictor and the trace's rows, so they
# are computed once per (predictor settings, trace) in a process: every run of a sweep shares them.
_TRACE_DECISIONS: dict[tuple[object, str], np.ndarray] = {}
_TRACE_DECISIONS_MAX = 16


def _cap(remaining: int) -> int:
    return max(1, remaining - 1)


@CONTROLLERS.register("fixed")
class FixedController:
    def __init__(self, cfg: DraftingConfig) -> None:
        self.k = cfg.k

    def prepare(self, stream: ResponseStream) -> object:
        return None

    def plan(self, state: object, pos: int, remaining: int) -> DraftPlan:
        k = min(self.k, _cap(remaining))
        return k, k, 0


@CONTROLLERS.register("predictor")
class PredictorController:
    def __init__(self, cfg: DraftingConfig, predictor: Predictor | None = None) -> None:
        self.k_min = cfg.k_min
        self.k_max = cfg.k_max
        self.predictor = predictor or make_predictor(cfg.predictor)
        # a predictor handed in may be anything: share decisions across runs only for the configured one
        self._shared_key: object = None if predictor is not None else cfg.predictor
        self._trace_decisions: dict[int, np.ndarray] = {}

    def prepare(self, stream: ResponseStream) -> object:
        # pred_run[t]: how many consecutive positions from t the predictor calls "accept"
        # (a list: read once per round, and list indexing is ~10x cheaper than numpy's).
        if stream.trace is not None and stream.rows is not None:
            # trace replay: the predictor's decisions depend only on the trace row, so they are
            # computed once for the whole trace (plus a "reject" for padding rows, index -1)
            key = id(stream.trace)
            table = self._trace_decisions.get(key)
            if table is None:
                table = self._decisions(stream)
                self._trace_decisions[key] = table
            decisions = table[stream.rows]
        else:
            decisions = self.predictor.predict_accept(stream.features)
        runs: list[int] = accept_runs(decisions).tolist()
        return runs

    def _decisions(self, stream: ResponseStream) -> np.ndarray:
        assert stream.trace is not None
        shared = (self._shared_key, stream.trace.path) if self._shared_key is not None else None
        table = _TRACE_DECISIONS.get(shared) if shared is not None else None
        if table is None:
            table = np.append(self.predictor.predict_accept(stream.trace.features), False)
            if shared is not None:
                if len(_TRACE_DECISIONS) >= _TRACE_DECISIONS_MAX:
                    _TRACE_DECISIONS.pop(next(iter(_TRACE_DECISIONS)))
                _TRACE_DECISIONS[shared] = table
        return table

    def plan(self, state: object, pos: int, remaining: int) -> DraftPlan:
        pred_run: list[int] = state  # type: ignore[assignment]
        # limit = min(k_max, max(1, remaining - 1)), k_min = min(k_min, limit): once per round,
        # so without the builtin calls
        limit = remaining - 1 if remaining > 2 else 1
        if limit > self.k_max:
            limit = self.k_max
        k_min = self.k_min if self.k_min < limit else limit
        j = pos + k_min
        # first predicted rejection at window offset >= k_min
        stop = k_min + pred_run[j] if j < len(pred_run) else limit
        if stop < limit:
            return stop, stop + 1, stop + 1 - k_min
        return limit, limit, limit - k_min


@CONTROLLERS.register("none")
class NoDrafting:
    """Centralized serving: the device drafts nothing."""

    def __init__(self, cfg: DraftingConfig) -> None:
        pass

    def prepare(self, stream: ResponseStream) -> object:
        return None

    def plan(self, state: object, pos: int, remaining: int) -> DraftPlan:
        return 0, 0, 0


def make_controller(cfg: DraftingConfig) -> Controller:
    ctl: Controller = CONTROLLERS.get(cfg.controller, field="drafting.controller")(cfg)
    return ctl
