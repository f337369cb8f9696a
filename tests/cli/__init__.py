"""Tests of wispsim.cli: the command line, end to end."""
