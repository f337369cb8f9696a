"""Tests of wispsim.measure: recording traces and profiles, training predictors."""
