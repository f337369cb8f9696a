"""Tests of wispsim.plots: figures."""
