"""Many runs: stored points, local/Ray runners, capacity search and sweeps, replica planning,
ablation, replay of recorded logs, and the declarative experiments."""
