"""Tests of wispsim.serve: the real deployment (server, swarm, an OpenAI-compatible real side)."""
