"""Tests of wispsim.analysis: records -> tables."""
