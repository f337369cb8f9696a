"""Rejection predictors: labels, training, evaluation, distribution shift, export and benchmarks."""

from wispsim.measure.predictor.bench import bench, cpu_name
from wispsim.measure.predictor.evaluate import metrics_frame
from wispsim.measure.predictor.shift import shift_matrix
from wispsim.measure.predictor.train import MODEL_KINDS, train

__all__ = ["MODEL_KINDS", "bench", "cpu_name", "metrics_frame", "shift_matrix", "train"]
