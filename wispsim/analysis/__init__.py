"""Records -> tables: per-class metrics, time series, attribution, result-folder tables."""
