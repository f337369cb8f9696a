"""Tests of the root modules, wispsim/*.py (errors, paths, tabular, results, host, ...)."""
