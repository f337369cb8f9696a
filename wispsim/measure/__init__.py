"""Measurement tooling the simulator never imports: traces, latency profiles, predictors."""
