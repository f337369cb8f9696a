"""Rejection predictors: labels, training, evaluation, export and benchmarks."""

from wispsim.measure.predictor.export import bench, cpu_name
from wispsim.measure.predictor.train import MODEL_KINDS, metrics_frame, shift_matrix, train

__all__ = ["MODEL_KINDS", "bench", "cpu_name", "metrics_frame", "shift_matrix", "train"]
