"""Tests of wispsim.model: the parts a run wires, without SimPy."""
