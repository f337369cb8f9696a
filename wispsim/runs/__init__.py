"""The entrance hall: one function per command, between the CLI and the rest of the package.

Each function takes plain arguments (paths, ``--set`` strings, an :class:`~wispsim.runs.resolve.Options`),
resolves the scenario once (:func:`~wispsim.runs.resolve.resolve`), does the command's work,
writes its results folder (:class:`~wispsim.results.Results`) and returns a result object; it
prints nothing. ``wispsim/cli/`` parses the command line, calls one of them and prints what it
returns.
"""
