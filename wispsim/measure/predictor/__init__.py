"""Rejection predictors: labels, training, evaluation, export and benchmarks."""
