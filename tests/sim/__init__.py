"""Tests of wispsim.sim: the SimPy processes of one run, its records, scenario loading and checks."""
