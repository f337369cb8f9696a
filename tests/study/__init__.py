"""Tests of wispsim.study: many runs (points, runners, capacity, plans, replay, experiments)."""
