"""Recording and inspecting acceptance traces from real model pairs."""
