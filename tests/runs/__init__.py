"""Tests of wispsim.runs: one function per command, called directly (resolve, run, write the folder)."""
