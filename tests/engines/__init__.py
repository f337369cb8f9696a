"""Tests of wispsim.engines: real inference engines behind one interface."""
