"""Rejection predictors: would the target accept the token just drafted? (SPEC 6)

A predictor maps draft-distribution features (columns :data:`wispsim.acceptance.FEATURES`) to a
decision "accept" (True) or "reject" (False). Predictors evaluate a whole response's positions at
once, so a device computes its decisions once per response instead of once per token.

The first implementation is a confidence threshold on the draft's top-1 probability; trained
models (MLP, trees) exported as arrays plug in under the same registry.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from wispsim.config import PredictorConfig
from wispsim.registry import Registry


class Predictor(Protocol):
    def predict_accept(self, features: np.ndarray) -> np.ndarray:
        """Boolean array: True where the token is predicted to be accepted."""
        ...


PREDICTORS: Registry[type] = Registry("predictor")


@PREDICTORS.register("confidence")
class ConfidencePredictor:
    """Predict "accept" when the draft's top-1 probability is at least ``threshold``."""

    def __init__(self, cfg: PredictorConfig) -> None:
        self.threshold = cfg.threshold

    def predict_accept(self, features: np.ndarray) -> np.ndarray:
        return np.asarray(features[:, 0] >= self.threshold)


def make_predictor(cfg: PredictorConfig) -> Predictor:
    predictor: Predictor = PREDICTORS.get(cfg.name, field="drafting.predictor.name")(cfg)
    return predictor
