"""A real deployment: verification server, centralized server, device swarm."""
