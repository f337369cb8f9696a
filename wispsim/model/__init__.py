"""The parts a run wires, without SimPy: estimator, noise, network, fleet, latency, profiles,
KV memory, acceptance, predictor, drafting controllers and schedulers."""
