"""Tests of wispsim.config: YAML -> frozen dataclasses, --set, the limits."""
